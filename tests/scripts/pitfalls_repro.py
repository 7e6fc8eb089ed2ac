"""Reproduce the pitfall catalogue (docs/findings.md GD42x, GD505, GD64x, GD90x) with the libraries installed in
the running venv, on tiny models built here; print one JSON object: case -> what happened before and after the cure.

Usage: python pitfalls_repro.py CASE [CASE ...]     (run once per venv: the main one, V4_LATE, LEGACY)
Every case catches its own errors, so one JSON object always comes out.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import warnings

os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
warnings.simplefilter("ignore")

import torch  # noqa: E402
import transformers  # noqa: E402
from transformers.utils import logging as hf_logging  # noqa: E402

hf_logging.set_verbosity_error()
TF5 = int(transformers.__version__.split(".")[0]) >= 5
DTYPE_KW = "dtype" if tuple(int(x) for x in transformers.__version__.split(".")[:2]) >= (4, 56) else "torch_dtype"
V = 128
CHAT_TEMPLATE = ("{{ bos_token }}{% for m in messages %}<start_of_turn>{{ 'model' if m['role'] == 'assistant' "
                 "else m['role'] }}\n{{ m['content'] }}<end_of_turn>\n{% endfor %}")


def text_config(**kw):
    from transformers import Gemma3TextConfig
    base = dict(vocab_size=V, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                num_key_value_heads=2, head_dim=16, max_position_embeddings=256, sliding_window=512, pad_token_id=0,
                eos_token_id=1, bos_token_id=2)
    base.update(kw)
    return Gemma3TextConfig(**base)


def gemma3_text(**kw):
    from transformers import Gemma3ForCausalLM
    torch.manual_seed(0)
    return Gemma3ForCausalLM(text_config(**kw))


def err(e: BaseException) -> str:
    return f"{type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}"


def tokenizer():
    """A WordLevel tokenizer with Gemma's special ids whose post-processor adds <bos>, like Gemma's tokenizer.json."""
    from tokenizers import AddedToken, Tokenizer, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast
    vocab = {"<pad>": 0, "<eos>": 1, "<bos>": 2, "<unk>": 3, "<start_of_turn>": 105, "<end_of_turn>": 106}
    for i, w in enumerate(["user", "model", "hello", "world", "what", "is", "two", "plus", "four", "the", "answer"]):
        vocab[w] = 4 + i
    tk = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tk.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tk.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in
                           ("<pad>", "<eos>", "<bos>", "<unk>", "<start_of_turn>", "<end_of_turn>")])
    tk.post_processor = processors.TemplateProcessing(single="<bos> $A", pair="<bos> $A <bos> $B",
                                                      special_tokens=[("<bos>", 2)])
    tok = PreTrainedTokenizerFast(tokenizer_object=tk, bos_token="<bos>", eos_token="<eos>", pad_token="<pad>",
                                  unk_token="<unk>")
    tok.chat_template = CHAT_TEMPLATE
    return tok


# --- GD640: Gemma 2 softcapping under SDPA ---------------------------------------------------------------

def case_gemma2_sdpa() -> dict:
    from transformers import AutoModelForCausalLM, Gemma2Config
    cfg = Gemma2Config(vocab_size=V, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                       num_key_value_heads=2, head_dim=16, query_pre_attn_scalar=16, max_position_embeddings=64,
                       sliding_window=64, attn_logit_softcapping=50.0)
    torch.manual_seed(0)
    base = AutoModelForCausalLM.from_config(cfg, attn_implementation="eager")
    with torch.no_grad():  # raw attention scores far above the cap of 50
        for layer in base.model.layers:
            layer.self_attn.q_proj.weight.mul_(40.0)
            layer.self_attn.k_proj.weight.mul_(40.0)
    ids = torch.randint(4, V, (1, 16), generator=torch.Generator().manual_seed(0))
    out: dict = {}
    with tempfile.TemporaryDirectory() as d:
        base.save_pretrained(d)
        default = AutoModelForCausalLM.from_pretrained(d, **{DTYPE_KW: torch.float32})
        out["default_backend"] = default.config._attn_implementation
        logits = {}
        for impl in ("eager", "sdpa"):
            try:
                m = AutoModelForCausalLM.from_pretrained(d, attn_implementation=impl, **{DTYPE_KW: torch.float32}).eval()
                with torch.no_grad():
                    logits[impl] = m(ids).logits
            except Exception as e:  # noqa: BLE001 - the refusal is the measurement
                out[f"{impl}_error"] = err(e)
        if len(logits) == 2:
            out["eager_vs_sdpa_max_diff"] = (logits["eager"] - logits["sdpa"]).abs().max().item()
            out["eager_max_logit"] = logits["eager"].abs().max().item()
        out["eager_loads"] = "eager" in logits
    return out


# --- GD645: packed sequences under eager/sdpa -------------------------------------------------------------

def case_packing() -> dict:
    model = gemma3_text(attn_implementation="sdpa") if not TF5 else gemma3_text()
    model.config._attn_implementation = "sdpa"
    model.train()  # dropout is 0: train mode only changes the cache and mask paths the Trainer takes
    g = torch.Generator().manual_seed(1)
    a, b = torch.randint(4, V, (1, 9), generator=g), torch.randint(4, V, (1, 7), generator=g)
    packed = torch.cat([a, b], dim=1)
    pos = torch.cat([torch.arange(9), torch.arange(7)]).unsqueeze(0)
    with torch.no_grad():
        alone = model(b, use_cache=False).logits
        no_mask = model(packed, position_ids=pos, use_cache=False).logits[:, 9:]
        ones_mask = model(packed, position_ids=pos, attention_mask=torch.ones_like(packed), use_cache=False).logits[:, 9:]
    return {"reset_position_ids_no_mask_diff": (no_mask - alone).abs().max().item(),
            "reset_position_ids_all_ones_mask_diff": (ones_mask - alone).abs().max().item(),
            "reference_max_logit": alone.abs().max().item()}


# --- GD420/GD421: LoRA targets on a multimodal Gemma 3 ----------------------------------------------------

def tiny_multimodal():
    from transformers import Gemma3Config, Gemma3ForConditionalGeneration
    cfg = Gemma3Config(
        text_config=dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
                         num_key_value_heads=1, head_dim=16, vocab_size=300, sliding_window=8, max_position_embeddings=128),
        vision_config=dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                           image_size=28, patch_size=14, vision_use_head=False),
        mm_tokens_per_image=4, image_token_index=299, boi_token_index=297, eoi_token_index=298)
    torch.manual_seed(0)
    return Gemma3ForConditionalGeneration(cfg)


def tiny_paligemma():
    from transformers import PaliGemmaConfig, PaliGemmaForConditionalGeneration
    cfg = PaliGemmaConfig(
        text_config=dict(model_type="gemma", hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=2, num_key_value_heads=1, head_dim=16, vocab_size=300),
        vision_config=dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                           image_size=28, patch_size=14, projection_dim=32),
        projection_dim=32, image_token_index=299)
    torch.manual_seed(0)
    return PaliGemmaForConditionalGeneration(cfg)


def _lora_counts(model) -> dict:
    from peft.tuners.lora import LoraLayer
    counts = {"vision": 0, "projector": 0, "language": 0}
    for name, module in model.named_modules():
        if isinstance(module, LoraLayer):
            counts["vision" if "vision_tower" in name else "projector" if "multi_modal_projector" in name else "language"] += 1
    return counts


def case_lora_targets() -> dict:
    return _lora_targets(tiny_multimodal)


def case_lora_targets_paligemma() -> dict:
    return _lora_targets(tiny_paligemma)


def _lora_targets(build) -> dict:
    from peft import LoraConfig, get_peft_model
    lm_only = r".*language_model.*\.(q_proj|k_proj|v_proj|o_proj|gate_proj|up_proj|down_proj)"
    out: dict = {}
    for label, kw in (("default", {}), ("all_linear", {"target_modules": "all-linear"}),
                      ("bare_names", {"target_modules": ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj",
                                                         "down_proj"]}),
                      ("lm_only_regex", {"target_modules": lm_only}),
                      ("all_linear_excluding_towers", {"target_modules": "all-linear",
                                                       "exclude_modules": r".*(vision_tower|multi_modal_projector).*"})):
        try:
            out[label] = _lora_counts(get_peft_model(build(), LoraConfig(r=2, **kw)))
        except Exception as e:  # noqa: BLE001
            out[label] = {"error": err(e)}
    return out


# --- GD422: PEFT and Gemma 3's scaled embedding -----------------------------------------------------------

def case_embed_scale() -> dict:
    from peft import LoraConfig, get_peft_model
    model = gemma3_text()
    emb = model.get_input_embeddings()
    scale = float(emb.embed_scale)
    ids = torch.randint(4, V, (1, 6), generator=torch.Generator().manual_seed(2))
    peft_model = get_peft_model(model, LoraConfig(r=2, lora_alpha=2, target_modules=["embed_tokens"]))
    layer = peft_model.base_model.model.model.embed_tokens
    with torch.no_grad():
        # PEFT starts one of A/B at zero for embeddings: set both so the adapter's contribution is visible.
        layer.lora_embedding_A["default"].normal_(0, 1.0)
        layer.lora_embedding_B["default"].normal_(0, 1.0)
        delta = (layer.lora_embedding_B["default"] @ layer.lora_embedding_A["default"]).T * layer.scaling["default"]
        expected = (layer.base_layer.weight + delta)[ids] * scale
        got = layer(ids)
    return {"embed_scale": scale, "max_abs_error": (got - expected).abs().max().item(),
            "scaled": bool(torch.allclose(got, expected, atol=1e-4))}


# --- GD423/GD424: EmbeddingGemma's bidirectional attention and its sliding window -------------------------

def case_bidirectional() -> dict:
    from transformers import Gemma3ForCausalLM
    out: dict = {}
    with tempfile.TemporaryDirectory() as d:
        cfg = text_config(sliding_window=512)
        cfg_dict = cfg.to_dict()
        cfg_dict["use_bidirectional_attention"] = True
        cfg_dict["sliding_window"] = 512
        torch.manual_seed(0)
        Gemma3ForCausalLM(cfg).save_pretrained(d)
        with open(os.path.join(d, "config.json")) as f:
            on_disk = json.load(f)
        on_disk["use_bidirectional_attention"] = True
        on_disk["sliding_window"] = 512
        with open(os.path.join(d, "config.json"), "w") as f:
            json.dump(on_disk, f)
        windows = []
        for _ in range(2):  # load + save twice, as fine-tuning and re-saving a checkpoint does
            m = Gemma3ForCausalLM.from_pretrained(d, attn_implementation="eager")
            m.save_pretrained(d)
            with open(os.path.join(d, "config.json")) as f:
                windows.append(json.load(f).get("sliding_window"))
        out["saved_sliding_window_after_each_round_trip"] = windows
        with open(os.path.join(d, "config.json")) as f:
            on_disk = json.load(f)
        on_disk["sliding_window"] = 512
        with open(os.path.join(d, "config.json"), "w") as f:
            json.dump(on_disk, f)
        m = Gemma3ForCausalLM.from_pretrained(d, attn_implementation="eager").eval()
        a = torch.randint(4, V, (1, 8), generator=torch.Generator().manual_seed(3))
        b = a.clone()
        b[0, -1] = (a[0, -1] + 1) % V
        with torch.no_grad():
            h_a = m.model(a).last_hidden_state[0, 0]
            h_b = m.model(b).last_hidden_state[0, 0]
        out["first_token_changes_with_last"] = (h_a - h_b).abs().max().item()
    return out


# --- GD901, GD902, GD903: EOS, pad, BOS -------------------------------------------------------------------

def case_eos() -> dict:
    model = gemma3_text().eval()
    model.lm_head.register_forward_hook(lambda mod, inp, out: out + 50.0 * torch.nn.functional.one_hot(
        torch.tensor(106), V).to(out.dtype))
    ids = torch.tensor([[2, 4, 5]])
    out = {}
    for label, eos in (("eos_1", 1), ("eos_1_106", [1, 106])):
        gen = model.generate(ids, max_new_tokens=8, do_sample=False, eos_token_id=eos, pad_token_id=0)
        out[label] = gen[0, 3:].tolist()
    return out


def case_pad_eos() -> dict:
    from transformers import DataCollatorForLanguageModeling
    tok = tokenizer()
    rows = [[2, 7, 8, 1], [2, 7, 8, 9, 10, 1]]
    out = {}
    for label, pad in (("pad_is_pad", "<pad>"), ("pad_is_eos", "<eos>")):
        tok.pad_token = pad
        batch = DataCollatorForLanguageModeling(tok, mlm=False)([{"input_ids": r} for r in rows])
        eos_positions = [(i, len(r) - 1) for i, r in enumerate(rows)]
        out[label] = sum(int(batch["labels"][i, j] == 1) for i, j in eos_positions)
    return out


def case_double_bos() -> dict:
    tok = tokenizer()
    messages = [{"role": "user", "content": "what is two plus two"}, {"role": "assistant", "content": "four"}]
    text = tok.apply_chat_template(messages, tokenize=False)

    def leading(ids):
        return next((i for i, t in enumerate(ids) if t != tok.bos_token_id), len(ids))

    return {"rendered_then_tokenized": leading(tok(text)["input_ids"]),
            "rendered_then_tokenized_no_special": leading(tok(text, add_special_tokens=False)["input_ids"])}


# --- GD505: token ids beyond the embedding ----------------------------------------------------------------

def case_vocab_rows() -> dict:
    model = gemma3_text().eval()
    ids = torch.tensor([[2, 5, V + 2]])  # a token added to the tokenizer after the model was saved
    out = {}
    try:
        with torch.no_grad():
            model(ids)
        out["before"] = "ran"
    except Exception as e:  # noqa: BLE001
        out["before"] = err(e)
    model.resize_token_embeddings(V + 3)
    with torch.no_grad():
        out["after_resize"] = list(model(ids).logits.shape)
    return out


def case_recommended_snippets() -> dict:
    """The recommendation's text-only loading and LoRA snippets for a multimodal Gemma 3, run as emitted."""
    from gemma_doctor.plan.recommend import Inputs, decide, python_snippets
    mm = tiny_multimodal().to(torch.bfloat16)
    rec = decide(Inputs(family="gemma3", gpu_native_bf16=True, nested=True, task="lora",
                        versions={"transformers": transformers.__version__}))
    out: dict = {}
    with tempfile.TemporaryDirectory() as d:
        mm.save_pretrained(d)
        snippets = python_snippets(rec, d)
        ns: dict = {}
        exec(compile(snippets["loading_text_only"], "<loading_text_only>", "exec"), ns)
        text = ns["model"]
        ref = mm.model.language_model.state_dict() if hasattr(mm, "model") and hasattr(mm.model, "language_model") \
            else mm.language_model.model.state_dict()
        got = text.model.state_dict()
        out["text_only_class"] = type(text).__name__
        out["text_only_matrices_equal"] = sum(torch.equal(got[k], v) for k, v in ref.items() if v.dim() >= 2 and k in got)
        out["text_only_matrices"] = sum(1 for v in ref.values() if v.dim() >= 2)
        out["text_only_params_vision"] = sum(p.numel() for n, p in text.named_parameters() if "vision" in n)
        ns = {}
        exec(compile(snippets["loading"], "<loading>", "exec"), ns)
        exec(compile(snippets["peft"], "<peft>", "exec"), ns)
        out["peft_on_full_model"] = _lora_counts(ns["model"])
    return out


def case_tied_modules_to_save() -> dict:
    """GD505/GD422's advice: modules_to_save on Gemma's tied embedding, merged, saved, reloaded (tied_modules_to_save.py)."""
    from tied_modules_to_save import main

    out = {"plain": main(False, embed_only=True)}
    for name, ensure, embed_only in (("ensured", True, True), ("ensured_with_lm_head", True, False)):
        try:
            out[name] = main(ensure, embed_only=embed_only)
        except TypeError as e:  # PEFT < 0.18: LoraConfig has no ensure_weight_tying
            out[name] = {"error": err(e)}
    return out


# --- GD739: Gemma 3's multimodal class under gradient accumulation (transformers #37197) ---------------------

def _one_step(build, batch: int, accumulation: int, lora: bool = False) -> dict:
    """One optimizer step of the real Trainer (plain SGD, no clipping) on the same 4 fixed-length rows, every token
    a label: the logged loss, the logged grad norm and the norm of the weight change it made."""
    from transformers import Trainer, TrainingArguments

    model = build()
    if lora:
        from peft import LoraConfig, get_peft_model
        model = get_peft_model(model, LoraConfig(r=2, lora_alpha=2, target_modules=["q_proj", "v_proj"]))
    ids = torch.randint(4, V - 8, (4, 12), generator=torch.Generator().manual_seed(3))
    rows = [{"input_ids": r, "attention_mask": torch.ones_like(r), "token_type_ids": torch.zeros_like(r),
             "labels": r.clone()} for r in ids]
    before = {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad}
    with tempfile.TemporaryDirectory() as d:
        args = TrainingArguments(output_dir=d, per_device_train_batch_size=batch, gradient_accumulation_steps=accumulation,
                                 max_steps=1, learning_rate=0.1, optim="sgd", lr_scheduler_type="constant",
                                 max_grad_norm=1e9, logging_steps=1, report_to=[], save_strategy="no", use_cpu=True,
                                 seed=0, data_seed=0, dataloader_drop_last=False, disable_tqdm=True)
        trainer = Trainer(model=model, args=args, train_dataset=rows)
        trainer.train()
    log = next(h for h in trainer.state.log_history if "loss" in h)
    change = sum(((p.detach() - before[n]) ** 2).sum() for n, p in model.named_parameters() if n in before) ** 0.5
    return {"loss": log["loss"], "grad_norm": float(log["grad_norm"]), "weight_change": float(change),
            "accepts_loss_kwargs": trainer.model_accepts_loss_kwargs}


def _accumulation_ratios(build, lora: bool = False) -> dict:
    """Batch 4 x accumulation 1 against batch 1 x accumulation 4 on the same rows: the ratios are 1 when the
    accumulated step equals the large batch, 4 when every micro-batch's mean loss is summed instead of averaged."""
    whole, accumulated = _one_step(build, 4, 1, lora), _one_step(build, 1, 4, lora)
    out = {"batch4_acc1": whole, "batch1_acc4": accumulated}
    for key in ("loss", "grad_norm", "weight_change"):
        out[f"{key}_ratio"] = accumulated[key] / whole[key]
    return out


def case_grad_accum() -> dict:
    from transformers import Gemma3ForConditionalGeneration

    out = {"multimodal": _accumulation_ratios(tiny_multimodal), "text": _accumulation_ratios(gemma3_text)}
    try:
        out["multimodal_lora"] = _accumulation_ratios(tiny_multimodal, lora=True)
    except Exception as e:  # noqa: BLE001 - a venv without PEFT
        out["multimodal_lora"] = {"error": err(e)}
    # GD739's cure on an affected release: tell the Trainer the class does not normalise by num_items_in_batch.
    had = "accepts_loss_kwargs" in vars(Gemma3ForConditionalGeneration)
    saved = Gemma3ForConditionalGeneration.__dict__.get("accepts_loss_kwargs")
    Gemma3ForConditionalGeneration.accepts_loss_kwargs = False
    try:
        out["multimodal_cured"] = _accumulation_ratios(tiny_multimodal)
    finally:
        if had:
            Gemma3ForConditionalGeneration.accepts_loss_kwargs = saved
        else:
            del Gemma3ForConditionalGeneration.accepts_loss_kwargs
    return out


CASES = {name[5:]: fn for name, fn in globals().items() if name.startswith("case_")}

if __name__ == "__main__":
    import importlib.metadata as md

    result: dict = {"versions": {p: md.version(p) for p in ("transformers", "torch") + (("peft",) if any(
        c in sys.argv for c in ("lora_targets", "embed_scale")) else ())}}
    for name in sys.argv[1:]:
        try:
            result[name] = CASES[name]()
        except Exception as e:  # noqa: BLE001 - one broken case must not hide the others
            result[name] = {"error": err(e)}
    print(json.dumps(result))
