"""The runtime crashes of GD105-GD107 and the version skew of GD109, shown by the installed transformers on tiny
models built here; one process runs every case asked for and prints one JSON object (tests/test_crashes_venvs.py).

Usage: python crash_cases.py OUT_DIR CASE [CASE ...]
  token-type-ids         Gemma 3 and PaliGemma (ConditionalGeneration), text-only batches: a 1-step Trainer
                         unguarded, and with DoctorCallback; PaliGemma's causality under the supplied ids
  mm-token-type-ids      Gemma 4 with use_bidirectional_attention="vision": forward+backward in train mode,
                         unguarded and after gemma_doctor.prepare()
  kv-sharing-save        Gemma 4 with 2 KV-shared layers: train-mode loss with and without a cache, what the old
                         guard (use_cache off) and prepare() do to it; saves the model to OUT_DIR/kv for a later load
  kv-sharing-load        load OUT_DIR/kv with this transformers and give its train-mode loss on the same batch
  rope-save              save a tiny gemma3_text with linear x8 RoPE scaling to OUT_DIR/rope (+ reference logits)
  rope-load              load OUT_DIR/rope with this transformers: rope_scaling, inv_freq ratio, logits vs the saver
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import warnings

import torch
import transformers

SEQ, BATCH, VOCAB = 12, 4, 300


def text_batch() -> dict:
    """The text-only batch every case uses: input_ids, attention_mask, labels; no images, no type ids."""
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(3, 290, (BATCH, SEQ), generator=g)
    return {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": ids.clone()}


class Rows(torch.utils.data.Dataset):
    """The rows of text_batch() for a Trainer: one step of batch size BATCH sees exactly that batch (in some order,
    which leaves the mean loss over equal-length rows unchanged)."""

    def __init__(self) -> None:
        b = text_batch()
        self.rows = [{k: v[i] for k, v in b.items()} for i in range(BATCH)]

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, i: int) -> dict:
        return self.rows[i]


def gemma3():
    from transformers import Gemma3Config, Gemma3ForConditionalGeneration

    cfg = Gemma3Config(
        text_config=dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
                         num_key_value_heads=1, head_dim=16, vocab_size=VOCAB, sliding_window=8,
                         max_position_embeddings=128),
        vision_config=dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                           image_size=28, patch_size=14),
        mm_tokens_per_image=4, image_token_index=299, boi_token_index=297, eoi_token_index=298)
    torch.manual_seed(0)
    return Gemma3ForConditionalGeneration(cfg)


def paligemma():
    from transformers import PaliGemmaConfig, PaliGemmaForConditionalGeneration

    text = dict(model_type="gemma2", hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
                num_key_value_heads=1, head_dim=16, vocab_size=VOCAB, sliding_window=8, max_position_embeddings=128)
    vision = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2, image_size=28,
                  patch_size=14, projection_dim=32)
    cfg = PaliGemmaConfig(text_config=text, vision_config=vision, image_token_index=299, vocab_size=VOCAB,
                          projection_dim=32, hidden_size=32)
    torch.manual_seed(0)
    return PaliGemmaForConditionalGeneration(cfg)


def gemma4(kv_shared: int = 0, bidirectional: str | None = None):
    """Tiny Gemma 4 (research/gemma4/tiny.py): 6 layers [sliding, full] x 3, text tower only plus a vision tower."""
    from transformers import Gemma4Config, Gemma4ForConditionalGeneration

    text = dict(vocab_size=512, vocab_size_per_layer_input=512, hidden_size_per_layer_input=8, hidden_size=64,
                intermediate_size=128, num_hidden_layers=6, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                global_head_dim=32, layer_types=["sliding_attention", "full_attention"] * 3, sliding_window=8,
                max_position_embeddings=256, num_kv_shared_layers=kv_shared, use_bidirectional_attention=bidirectional,
                pad_token_id=0, eos_token_id=1, bos_token_id=2)
    vision = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                  num_key_value_heads=2, head_dim=16, patch_size=4, pooling_kernel_size=2, position_embedding_size=64)
    cfg = Gemma4Config(text_config=text, vision_config=vision, boi_token_id=500, eoi_token_id=501, image_token_id=502,
                       video_token_id=503, boa_token_id=504, eoa_token_index=505, audio_token_id=506)
    cfg._attn_implementation = "eager"
    torch.manual_seed(0)
    return Gemma4ForConditionalGeneration(cfg)


def error_of(exc: BaseException) -> str:
    lines = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {lines[0] if lines else ''}"


def train_one_step(model, guarded: bool) -> dict:
    """Trainer.train() for one step on text-only rows; the loss, or the error it raised."""
    import gemma_doctor
    from transformers import Trainer, TrainingArguments

    with tempfile.TemporaryDirectory() as out:
        args = TrainingArguments(output_dir=out, max_steps=1, per_device_train_batch_size=BATCH, use_cpu=True,
                                 report_to=[], save_strategy="no", logging_strategy="no")
        trainer = Trainer(model=model, args=args, train_dataset=Rows(),
                          callbacks=[gemma_doctor.DoctorCallback()] if guarded else None)
        try:
            return {"train_loss": trainer.train().training_loss}
        except Exception as e:  # noqa: BLE001 - the crash under test is reported, not raised
            return {"error": error_of(e)}


def future_leak(model) -> bool:
    """Train mode, no grad: change only the last token; True when earlier positions' logits move (they see it)."""
    b1 = {k: v for k, v in text_batch().items() if k != "labels"}
    b2 = {k: v.clone() for k, v in b1.items()}
    b2["input_ids"][:, -1] = (b2["input_ids"][:, -1] + 7) % 290 + 3
    model.train()
    with torch.no_grad():
        return not torch.allclose(model(**b1).logits[:, :-1], model(**b2).logits[:, :-1], atol=1e-6)


def case_token_type_ids(out: str) -> dict:
    import gemma_doctor

    res: dict = {}
    for name, build, value in (("gemma3", gemma3, 0), ("paligemma", paligemma, 1)):
        r = {"unguarded": train_one_step(build(), guarded=False), "guarded": train_one_step(build(), guarded=True),
             "explicit_ids_loss": train_loss(build(), token_type_ids=torch.full((BATCH, SEQ), value))}
        model = build()
        r["supplied"] = list(gemma_doctor.prepare(model).supplied)
        r["hooked_loss"] = train_loss(model)
        r["future_leak_guarded"] = future_leak(model)
        res[name] = r
    # PEFT calls the wrapped model's forward() directly (no hooks run there): the inner model's hook must do it.
    from peft import LoraConfig, get_peft_model

    lora = LoraConfig(r=4, lora_alpha=8, target_modules=r".*language_model.*\.(q_proj|v_proj)", task_type="CAUSAL_LM")
    res["gemma3_peft"] = {"unguarded": train_one_step(get_peft_model(gemma3(), lora), guarded=False),
                          "guarded": train_one_step(get_peft_model(gemma3(), lora), guarded=True)}
    return res


def forward_backward(model, **extra) -> dict:
    model.train()
    try:
        loss = model(**text_batch(), **extra).loss
        loss.backward()
        return {"loss": float(loss)}
    except Exception as e:  # noqa: BLE001
        return {"error": error_of(e)}


def case_mm_token_type_ids(out: str) -> dict:
    import gemma_doctor

    model = gemma4(bidirectional="vision")
    res = {"unguarded": forward_backward(model),
           "token_type_ids_zeros": forward_backward(model, token_type_ids=torch.zeros(BATCH, SEQ, dtype=torch.long))}  # the key 5.5 does not read
    res["supplied"] = list(gemma_doctor.prepare(model).supplied)
    res["guarded"] = forward_backward(model)
    return res


def train_loss(model, **extra) -> float:
    model.train()
    with torch.no_grad():
        return float(model(**text_batch(), **extra).loss)


def case_kv_sharing_save(out: str) -> dict:
    from gemma_doctor.api import disable_use_cache

    import gemma_doctor

    model = gemma4(kv_shared=2)
    res = {"with_cache": train_loss(model, use_cache=True), "without_cache": train_loss(model, use_cache=False),
           "unshared_weights_same_seed": train_loss(gemma4(kv_shared=0), use_cache=False)}
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    res["checkpointing_with_cache"] = train_loss(model, use_cache=True)
    model.gradient_checkpointing_disable()
    model.save_pretrained(os.path.join(out, "kv"))
    disable_use_cache(model)  # what the guard did before it knew KV sharing (and what QLoRA recipes write)
    res["old_guard"] = train_loss(model)
    prepared = gemma_doctor.prepare(model)
    res["prepared"] = train_loss(model)
    res["enabled"], res["disabled"] = list(prepared.enabled), list(prepared.disabled)
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        gemma_doctor.prepare(model)
    res["checkpointing_warnings"] = sorted({type(w.message).__name__ for w in caught if "GD107" in str(w.message)})
    res["unguarded_trainer"] = train_one_step(gemma4(kv_shared=2), guarded=False)
    res["guarded_trainer"] = train_one_step(gemma4(kv_shared=2), guarded=True)
    return res


def case_kv_sharing_load(out: str) -> dict:
    from transformers import Gemma4ForConditionalGeneration

    model = Gemma4ForConditionalGeneration.from_pretrained(os.path.join(out, "kv"), attn_implementation="eager")
    return {"with_cache": train_loss(model, use_cache=True), "without_cache": train_loss(model, use_cache=False)}


ROPE_IDS = torch.arange(2, 66).unsqueeze(0)


def global_inv_freq_ratio(model) -> float:
    """Default inv_freq / the model's, on the global (full-attention) rotary embedding: 8.0 for linear x8."""
    head_dim = model.config.head_dim
    default = 1.0 / (1e6 ** (torch.arange(0, head_dim, 2, dtype=torch.float) / head_dim))
    for name, buf in model.named_buffers():
        if name.endswith("inv_freq") and "local" not in name and "sliding" not in name and "original" not in name:
            return round(float(default[1] / buf.float()[1]), 4)
    raise AssertionError("no global rotary embedding")


def case_rope_save(out: str) -> dict:
    from transformers import Gemma3ForCausalLM, Gemma3TextConfig

    cfg = Gemma3TextConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=6, num_attention_heads=2,
                           num_key_value_heads=1, head_dim=16, vocab_size=VOCAB, sliding_window=8,
                           max_position_embeddings=128, rope_scaling={"rope_type": "linear", "factor": 8.0})
    torch.manual_seed(0)
    model = Gemma3ForCausalLM(cfg).eval()
    path = os.path.join(out, "rope")
    model.save_pretrained(path)
    with torch.no_grad():
        torch.save(model(input_ids=ROPE_IDS).logits, os.path.join(path, "ref_logits.pt"))
    with open(os.path.join(path, "config.json")) as f:
        saved = json.load(f)
    return {"ratio": global_inv_freq_ratio(model), "saved_keys": sorted(k for k in saved if k.startswith("rope"))}


def case_rope_load(out: str) -> dict:
    from transformers import Gemma3ForCausalLM

    path = os.path.join(out, "rope")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model = Gemma3ForCausalLM.from_pretrained(path).eval()
    with torch.no_grad():
        diff = float((model(input_ids=ROPE_IDS).logits - torch.load(os.path.join(path, "ref_logits.pt"))).abs().max())
    return {"rope_scaling": getattr(model.config, "rope_scaling", None), "ratio": global_inv_freq_ratio(model),
            "max_logit_diff": diff, "warnings": [str(w.message)[:200] for w in caught]}


CASES = {"token-type-ids": case_token_type_ids, "mm-token-type-ids": case_mm_token_type_ids,
         "kv-sharing-save": case_kv_sharing_save, "kv-sharing-load": case_kv_sharing_load,
         "rope-save": case_rope_save, "rope-load": case_rope_load}


def main(argv: list[str]) -> None:
    """Run the named cases; print one JSON object. (Imported in-process by a test, the module changes nothing.)"""
    warnings.filterwarnings("ignore")
    transformers.logging.set_verbosity_error()
    torch.set_num_threads(1)
    out, names = argv[0], argv[1:]
    result: dict = {"transformers": transformers.__version__}
    for name in names:
        try:
            result[name] = CASES[name](out)
        except Exception as e:  # noqa: BLE001 - one broken case must not hide the others' results
            result[name] = {"case_error": error_of(e)}
    print(json.dumps(result, default=str))


if __name__ == "__main__":
    main(sys.argv[1:])
