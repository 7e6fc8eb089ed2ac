"""Trainer.evaluate() in bf16 on a tiny in-memory Gemma 3 model, unguarded or guarded by gemma_doctor.

Usage: python guarded_trainer.py MODE   (MODE: unguarded | prepare | callback | callback-added-late)
Prints one JSON line: {"outcome": "ok" | "hybridcache-crash", "transformers": ..., "use_cache": {where: value}, ...}.
Also imported in-process by tests/test_api.py (function run()).
"""

from __future__ import annotations

import json
import sys
import tempfile


def tiny_gemma3():
    """The tiny multimodal Gemma 3 of facts.md, in bfloat16 (bf16 weights are what trigger the crash)."""
    import torch
    from transformers import Gemma3Config, Gemma3ForConditionalGeneration

    cfg = Gemma3Config(
        text_config=dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
                         num_key_value_heads=1, head_dim=16, vocab_size=300, sliding_window=8, max_position_embeddings=128),
        vision_config=dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                           image_size=28, patch_size=14),
        mm_tokens_per_image=4, image_token_index=299, boi_token_index=297, eoi_token_index=298,
    )
    torch.manual_seed(0)
    return Gemma3ForConditionalGeneration(cfg).to(torch.bfloat16)


def use_cache_flags(model) -> dict:
    """use_cache of every config a forward pass may read, by where it is."""
    out = {}
    for name, module in model.named_modules():
        for attr in ("config", "generation_config"):
            obj = getattr(module, attr, None)
            if obj is not None and hasattr(obj, "use_cache"):
                out[f"{name or 'model'}.{attr}"] = obj.use_cache
            text = getattr(obj, "text_config", None) if attr == "config" else None
            if text is not None and hasattr(text, "use_cache"):
                out[f"{name or 'model'}.config.text_config"] = text.use_cache
    return out


def run(mode: str) -> dict:
    """Evaluate once in bf16 with the given guard; report the outcome instead of raising on the known crash."""
    import transformers
    from eval_batches import Batches  # sibling script: this folder is on sys.path
    from transformers import Trainer, TrainingArguments

    import gemma_doctor

    model = tiny_gemma3()
    result: dict = {"mode": mode, "transformers": transformers.__version__}
    with tempfile.TemporaryDirectory() as out:
        args = TrainingArguments(output_dir=out, bf16=True, use_cpu=True, per_device_eval_batch_size=2, report_to=[])
        callbacks = [gemma_doctor.DoctorCallback()] if mode == "callback" else None
        if mode == "prepare":
            result["disabled"] = list(gemma_doctor.prepare(model, args).disabled)
        trainer = Trainer(model=model, args=args, eval_dataset=Batches(), callbacks=callbacks)
        if mode == "callback-added-late":
            trainer.add_callback(gemma_doctor.DoctorCallback())
        result["use_cache"] = use_cache_flags(model)
        try:
            result["eval_loss"] = trainer.evaluate()["eval_loss"]
            result["outcome"] = "ok"
        except AttributeError as e:
            if "'HybridCache' object has no attribute 'float'" not in str(e):
                raise
            result["outcome"] = "hybridcache-crash"
    return result


if __name__ == "__main__":
    print(json.dumps(run(sys.argv[1])))
