"""GD718 on CPU: a tiny Gemma 4 text twin (tests/tiny_family.G4TXT), batch 4 with padding (left or right), 40 AdamW
steps, SDPA vs eager, weights in bf16 / fp32 / fp32 under bf16 autocast: the first step whose loss or grad norm is
not finite. Run: python benchmarks/gemma4_sdpa_nan_cpu.py (the test stack; about 3 minutes on one thread).

Result (2026-11-29, transformers 5.23.0, torch 2.13.0 CPU): no step of any of the 12 runs (sdpa / eager x bf16 weights /
fp32 under bf16 autocast / fp32 x left / right padding) gave a non-finite loss or grad norm: GD718's NaN is not shown
on a CPU (NeMo Automodel #3141 saw it only with Hopper's fused bf16 SDPA kernels), so its condition is left without a
precision clause (catalogue/field.json's evidence)."""
import json, sys
import torch
sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parent.parent))
import transformers as T
from tests.tiny_family import G4TXT
torch.set_num_threads(1)

def run(attn, mode, side, steps=40):
    torch.manual_seed(0)
    cfg = T.Gemma4TextConfig(**G4TXT)
    cfg._attn_implementation = attn
    m = T.Gemma4ForCausalLM(cfg)
    if mode == "bf16":
        m = m.to(torch.bfloat16)
    m.train()
    opt = torch.optim.AdamW(m.parameters(), lr=1e-3)
    b, s = 4, 32
    g = torch.Generator().manual_seed(1)
    first = None
    for step in range(steps):
        ids = torch.randint(5, cfg.vocab_size, (b, s), generator=g)
        mask = torch.ones(b, s, dtype=torch.long)
        for i, n in enumerate((0, 5, 12, 20)):  # padding of each row
            if n:
                if side == "left":
                    mask[i, :n] = 0
                else:
                    mask[i, s - n:] = 0
        labels = ids.masked_fill(mask == 0, -100)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=(mode == "autocast")):
            out = m(input_ids=ids, attention_mask=mask, labels=labels)
        out.loss.backward()
        gn = torch.nn.utils.clip_grad_norm_(m.parameters(), 1e9)
        if first is None and not (torch.isfinite(out.loss) and torch.isfinite(gn)):
            first = step
        opt.step(); opt.zero_grad()
    return first

res = {"transformers": T.__version__, "torch": torch.__version__}
for attn in ("sdpa", "eager"):
    for mode in ("bf16", "autocast", "fp32"):
        for side in ("left", "right"):
            res[f"{attn} {mode} {side}"] = run(attn, mode, side)
            print(attn, mode, side, res[f"{attn} {mode} {side}"], flush=True)
print(json.dumps(res))
