"""modules_to_save=["embed_tokens", "lm_head"] on a tied Gemma: does the merged, saved model reload as it was trained?

Usage: python tied_modules_to_save.py [--ensure-weight-tying] [--embed-only]   (--embed-only: modules_to_save=["embed_tokens"])
Trains a tiny Gemma3ForCausalLM (tied embeddings) 5 steps with LoRA + modules_to_save, merges, saves, reloads, and
prints one JSON line: {"peft": ..., "transformers": ..., "ensure_weight_tying": bool, "reload_max_diff": float,
"merge_max_diff": float, "tied_after_merge": bool}. reload_max_diff > 0 is the trap (facts.md section 13).
"""

from __future__ import annotations

import json
import sys
import tempfile


def main(ensure: bool, embed_only: bool = False) -> dict:
    import peft
    import torch
    import transformers
    from peft import LoraConfig, get_peft_model
    from transformers import Gemma3ForCausalLM, Gemma3TextConfig

    torch.manual_seed(0)
    cfg = Gemma3TextConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
                           num_key_value_heads=1, head_dim=16, vocab_size=300, sliding_window=8,
                           max_position_embeddings=128, tie_word_embeddings=True)
    model = Gemma3ForCausalLM(cfg).float()
    saved = ["embed_tokens"] if embed_only else ["embed_tokens", "lm_head"]
    kwargs = dict(r=4, target_modules=["q_proj", "v_proj"], modules_to_save=list(saved))  # PEFT extends its copy
    if ensure:
        kwargs["ensure_weight_tying"] = True  # a TypeError before PEFT 0.18.0
    pm = get_peft_model(model, LoraConfig(**kwargs))
    opt = torch.optim.AdamW([p for p in pm.parameters() if p.requires_grad], lr=1e-2)
    ids = torch.randint(0, 290, (2, 16))
    pm.train()
    for _ in range(5):
        loss = pm(input_ids=ids, labels=ids).loss
        loss.backward()
        opt.step()
        opt.zero_grad()
    pm.eval()
    with torch.no_grad():
        trained = pm(input_ids=ids).logits
        merged = pm.merge_and_unload()
        after_merge = merged(input_ids=ids).logits
        tied = merged.lm_head.weight.data_ptr() == merged.get_input_embeddings().weight.data_ptr()
        with tempfile.TemporaryDirectory() as tmp:
            merged.save_pretrained(tmp)
            reloaded = Gemma3ForCausalLM.from_pretrained(tmp).float().eval()
            after_reload = reloaded(input_ids=ids).logits
    return {"peft": peft.__version__, "transformers": transformers.__version__, "ensure_weight_tying": ensure,
            "modules_to_save": saved,
            "merge_max_diff": float((after_merge - trained).abs().max()),
            "reload_max_diff": float((after_reload - after_merge).abs().max()), "tied_after_merge": bool(tied)}


if __name__ == "__main__":
    print(json.dumps(main("--ensure-weight-tying" in sys.argv[1:], "--embed-only" in sys.argv[1:])))
