"""After-training cases run inside one venv (tests/test_after_training_repro.py); prints one JSON line.

  serve                             reads cases from stdin, one JSON list of the words below a line, and answers each
                                    with one line, {"result": ...} or {"error": traceback}: a test module starts the
                                    venv's interpreter (and imports torch, transformers and PEFT) once for all its
                                    cases instead of once a case; each case still sets its own seeds and reads and
                                    writes only its own folders

  merge OUT [ensure-weight-tying]   tiny Gemma 3 text model, LoRA + modules_to_save=[embed_tokens, lm_head], 5 AdamW
                                    steps; saves OUT/adapter, merges, saves OUT/merged and the merged model's logits
  reload MERGED                     reloads MERGED (as its config's architecture) and compares its logits with the
                                    merged model's (logits.json beside it)
  mm-merged OUT                     a tiny Gemma3ForConditionalGeneration with a head apart from its embedding, saved
                                    to OUT/merged under a config tied at both levels, its logits beside
  mm-train OUT                      LoRA on a tiny Gemma3ForConditionalGeneration (lora_B random), saved to OUT
  mm-load ADAPTER                   loads ADAPTER on the same tiny base: how much it changes the logits, and PEFT's
                                    warnings about missing keys
"""

from __future__ import annotations

import json
import os
import sys
import warnings
from pathlib import Path

os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

import peft  # noqa: E402
import torch  # noqa: E402
import transformers as T  # noqa: E402
from peft import LoraConfig, PeftModel, get_peft_model  # noqa: E402

TXT = dict(vocab_size=256, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
           num_key_value_heads=1, head_dim=16, max_position_embeddings=128, pad_token_id=0, eos_token_id=1,
           bos_token_id=2)
SIGLIP = dict(model_type="siglip_vision_model", hidden_size=32, intermediate_size=64, num_hidden_layers=1,
              num_attention_heads=2, image_size=28, patch_size=14)
IDS = torch.arange(3, 19).unsqueeze(0)


def versions() -> dict:
    return {"transformers": T.__version__, "peft": peft.__version__}


def merge(out: Path, ensure_weight_tying: bool) -> dict:
    torch.manual_seed(0)
    T.Gemma3ForCausalLM(T.Gemma3TextConfig(**TXT)).save_pretrained(out / "base")
    kw: dict = dict(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], modules_to_save=["embed_tokens", "lm_head"])
    if ensure_weight_tying:
        kw["ensure_weight_tying"] = True
    model = get_peft_model(T.Gemma3ForCausalLM.from_pretrained(out / "base"), LoraConfig(**kw))
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2)
    batch = torch.randint(3, 256, (2, 16))
    for _ in range(5):
        model(input_ids=batch, labels=batch).loss.backward()
        opt.step()
        opt.zero_grad()
    model.save_pretrained(out / "adapter")
    merged = model.merge_and_unload().eval()
    with torch.no_grad():
        logits = merged(input_ids=IDS).logits
    tied = merged.lm_head.weight.data_ptr() == merged.model.embed_tokens.weight.data_ptr()
    merged.save_pretrained(out / "merged")
    (out / "logits.json").write_text(json.dumps(logits.tolist()))
    return {**versions(), "tied_after_merge": tied}


def reload(folder: Path) -> dict:
    want = torch.tensor(json.loads((folder.parent / "logits.json").read_text()))
    arch = json.loads((folder / "config.json").read_text())["architectures"][0]
    model = getattr(T, arch).from_pretrained(folder).eval()
    with torch.no_grad():
        got = model(input_ids=IDS).logits
    return {**versions(), "logit_change": (got - want).abs().max().item()}


def mm_base() -> T.Gemma3ForConditionalGeneration:
    torch.manual_seed(0)
    cfg = T.Gemma3Config(text_config=TXT, vision_config=SIGLIP, mm_tokens_per_image=4, image_token_index=255,
                         boi_token_index=253, eoi_token_index=254)
    return T.Gemma3ForConditionalGeneration(cfg).eval()


def mm_merged(out: Path) -> dict:
    """A multimodal model whose head was trained apart (set by hand: the point is the config, not the training),
    saved with the trained head and its config tied at both levels, as a PEFT < 0.19 merge leaves it."""
    model = mm_base()
    model.config.tie_word_embeddings = model.config.text_config.tie_word_embeddings = False
    torch.manual_seed(2)
    model.lm_head.weight = torch.nn.Parameter(model.get_input_embeddings().weight.detach() + torch.randn(256, 32) * 0.5)
    with torch.no_grad():
        logits = model(input_ids=IDS).logits
    model.save_pretrained(out / "merged")
    cfg = json.loads((out / "merged" / "config.json").read_text())
    cfg["tie_word_embeddings"] = cfg["text_config"]["tie_word_embeddings"] = True
    (out / "merged" / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
    (out / "logits.json").write_text(json.dumps(logits.tolist()))
    return versions()


def mm_train(out: Path) -> dict:
    model = get_peft_model(mm_base(), LoraConfig(r=4, target_modules=r".*language_model.*\.(q_proj|v_proj)"))
    torch.manual_seed(1)
    for name, p in model.named_parameters():
        if "lora_B" in name:
            torch.nn.init.normal_(p)
    model.save_pretrained(out)
    return versions()


def mm_load(adapter: Path) -> dict:
    model = mm_base()
    with torch.no_grad():
        before = model(input_ids=IDS).logits
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        loaded = PeftModel.from_pretrained(model, adapter).eval()
    with torch.no_grad():
        after = loaded(input_ids=IDS).logits
    missing = [str(w.message)[:200] for w in caught if "missing adapter keys" in str(w.message).lower()]
    return {**versions(), "adapter_effect": (after - before).abs().max().item(), "missing_keys_warnings": missing}


def run(mode: str, target: str, *rest: str) -> dict:
    """One case's result."""
    path = Path(target)
    if mode == "merge":
        result = merge(path, "ensure-weight-tying" in rest)
    elif mode == "reload":
        result = reload(path)
    elif mode == "mm-train":
        result = mm_train(path)
    elif mode == "mm-merged":
        result = mm_merged(path)
    else:
        result = mm_load(path)
    return result


# Marks the answer lines of `serve`: a library that prints to stdout during a case cannot be taken for an answer.
ANSWER = "@@case "


def serve() -> None:
    """Answer cases from stdin until it closes; a case's exception is its answer, and the next case still runs."""
    import contextlib
    import traceback

    answers = sys.stdout
    for line in sys.stdin:
        if not line.strip():
            continue
        try:
            # Whatever a library prints during the case goes to stderr (the log), never between the answers.
            with contextlib.redirect_stdout(sys.stderr):
                answer = {"result": run(*json.loads(line))}
        except Exception:  # noqa: BLE001 - the test that sent the case asserts on it, with the traceback
            answer = {"error": traceback.format_exc()}
        answers.write(ANSWER + json.dumps(answer) + "\n")
        answers.flush()


def main() -> None:
    if sys.argv[1:] == ["serve"]:
        serve()
    else:
        print(json.dumps(run(*sys.argv[1:])))


if __name__ == "__main__":
    main()
