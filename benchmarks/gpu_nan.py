"""Where a twin's non-finite gradient on a GPU comes from: one forward + backward of a Gemma 3 twin per padded pair of
chat rows, across attention kernel x padding side x dtype (docs/rehearsal.md, "On a GPU").

    python benchmarks/gpu_nan.py [--device cuda] [--target examples/google--gemma-3-12b-it]

The rehearsal's plain-Trainer run of the bundled Gemma 3 twin on an H200 (bf16, LoRA, batch 2) met a NaN gradient
norm at its third step while the same twin under TRL's SFTTrainer, and every run on the CPU, stayed finite. This
takes the Trainer out: the same twin, the same rows, padded as DataCollatorForLanguageModeling pads them, each pair
stepped once per variant; it prints which variants give a non-finite loss or gradient, for which pair.
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--target", type=Path, default=ROOT / "examples" / "google--gemma-3-12b-it")
    ap.add_argument("--only", default=None, help="one variant, e.g. sdpa/right/float32 (a CPU dry run)")
    ap.add_argument("--pairs", type=int, default=7)
    a = ap.parse_args()
    import torch
    import transformers

    from gemma_doctor.rehearse.rows import ROWS
    from gemma_doctor.rehearse.twin import build_twin

    transformers.logging.set_verbosity_error()
    cache = Path(tempfile.mkdtemp(prefix="gd-nan-"))
    twin = build_twin(a.target, "google/gemma-3-12b-it", cache, seed=0)
    config = json.loads((twin.snapshot / "config.json").read_text())
    cls = getattr(transformers, config["architectures"][0])
    tok = transformers.AutoTokenizer.from_pretrained(twin.snapshot)
    texts = [tok.apply_chat_template([{"role": "user", "content": q}, {"role": "assistant", "content": r}],
                                     tokenize=False) for q, r in ROWS]
    out = {"padding_side_of_tokenizer": tok.padding_side, "pad_token_id": tok.pad_token_id, "variants": {}}
    print(f"tokenizer padding side {tok.padding_side}, pad id {tok.pad_token_id}, {len(texts)} rows", flush=True)
    variants = itertools.product(("sdpa", "eager"), ("right", "left"), ("bfloat16", "float32"))
    for attn, side, dtype in [tuple(a.only.split("/"))] if a.only else variants:
        torch.manual_seed(0)
        model = cls.from_pretrained(twin.snapshot, dtype=getattr(torch, dtype), attn_implementation=attn).to(a.device)
        model.train()
        tok.padding_side = side
        bad = []
        for i in range(min(a.pairs, len(texts) - 1)):
            pair = [texts[i], texts[(i + 3) % len(texts)]]  # rows of different lengths: one of them is padded
            batch = tok(pair, padding=True, return_tensors="pt", add_special_tokens=False).to(a.device)
            labels = batch["input_ids"].masked_fill(batch["attention_mask"] == 0, -100)
            model.zero_grad(set_to_none=True)
            loss = model(**batch, labels=labels, use_cache=False).loss
            loss.backward()
            sq = sum(float(p.grad.float().pow(2).sum()) for p in model.parameters() if p.grad is not None)
            pads = int((batch["attention_mask"] == 0).sum())
            if not (torch.isfinite(loss).item() and sq == sq and sq != float("inf")):
                bad.append({"pair": i, "pads": pads, "loss": float(loss), "grad_sq": sq})
        key = f"{attn}/{side}/{dtype}"
        out["variants"][key] = bad
        print(f"{key}: {'finite' if not bad else bad}", flush=True)
        del model
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
