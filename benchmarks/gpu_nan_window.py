"""The version window and the kernel of the bf16 SDPA NaN gradient with left padding (docs/rehearsal.md, "On a GPU").

    python benchmarks/gpu_nan_window.py --wheels DIR [--device cuda] [--target examples/google--gemma-3-12b-it]

benchmarks/gpu_nan.py showed, on an H200 with transformers 5.17, that only sdpa + left padding + bf16 gives a NaN
gradient (finite loss) on a Gemma 3 twin. This asks the two questions left open: which SDPA backend does it (each
backend forced with ``torch.nn.attention.sdpa_kernel``), and which transformers releases build the mask that meets it.

The parent builds the twin and tokenizes the padded pairs once, with the environment's own transformers. Each
transformers wheel in ``--wheels`` (with the huggingface_hub / tokenizers wheels its release needs, picked by its
requirements) is unpacked into a folder of its own and a child process, with that folder first on its path, loads the
twin in bf16 with sdpa and steps each pair once per backend; ``--child`` is that child. One JSON line per release.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BACKENDS = ("default", "MATH", "EFFICIENT_ATTENTION", "CUDNN_ATTENTION", "FLASH_ATTENTION")


def child(snapshot: Path, batches: Path, device: str) -> dict:
    """Load the twin with this process's transformers and step every pair under every SDPA backend."""
    import contextlib

    import torch
    import transformers
    from torch.nn.attention import SDPBackend, sdpa_kernel

    transformers.logging.set_verbosity_error()
    config = json.loads((snapshot / "config.json").read_text())
    cls = getattr(transformers, config["architectures"][0])
    major = int(transformers.__version__.split(".")[0])
    minor = int(transformers.__version__.split(".")[1])
    dtype_key = "dtype" if (major, minor) >= (4, 56) else "torch_dtype"
    model = cls.from_pretrained(snapshot, attn_implementation="sdpa", **{dtype_key: torch.bfloat16}).to(device)
    model.train()
    pairs = torch.load(batches)
    out = {"transformers": transformers.__version__, "torch": torch.__version__, "backends": {}}
    for name in BACKENDS:
        ctx = contextlib.nullcontext() if name == "default" else sdpa_kernel(getattr(SDPBackend, name))
        bad, error = [], None
        try:
            with ctx:
                for i, pair in enumerate(pairs):
                    batch = {k: v.to(device) for k, v in pair.items()}
                    labels = batch["input_ids"].masked_fill(batch["attention_mask"] == 0, -100)
                    model.zero_grad(set_to_none=True)
                    loss = model(**batch, labels=labels, use_cache=False).loss
                    loss.backward()
                    sq = sum(float(p.grad.float().pow(2).sum()) for p in model.parameters() if p.grad is not None)
                    if not (torch.isfinite(loss).item() and sq == sq and sq != float("inf")):
                        bad.append({"pair": i, "pads": int((batch["attention_mask"] == 0).sum()),
                                    "loss": float(loss.detach()), "grad_sq": sq})
        except Exception as e:  # a backend that cannot take this mask/dtype: its one line is the result
            error = f"{type(e).__name__}: {str(e).strip().splitlines()[0][:200] if str(e).strip() else ''}"
        out["backends"][name] = {"error": error} if error else {"nonfinite": bad}
    return out


def _requirement(wheel: Path, name: str) -> str | None:
    """The version specifier a wheel's METADATA gives for ``name`` (no extras)."""
    with zipfile.ZipFile(wheel) as z:
        meta = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
        for line in z.read(meta).decode().splitlines():
            m = re.match(rf"Requires-Dist: {name}\s*([^;]*)$", line, re.I)
            if m:
                return m.group(1).strip()
    return None


def _installed(dist: str) -> bool:
    import importlib.metadata as md

    try:
        md.version(dist)
    except md.PackageNotFoundError:
        return False
    return True


def _version(wheel: Path) -> str:
    return wheel.name.split("-")[1]


def _fits(version: str, spec: str | None) -> bool:
    from packaging.specifiers import SpecifierSet

    return spec is None or SpecifierSet(spec).contains(version)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--wheels", type=Path, help="transformers wheels (and the hub/tokenizers wheels older ones need)")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--target", type=Path, default=ROOT / "examples" / "google--gemma-3-12b-it")
    ap.add_argument("--pairs", type=int, default=7, help="padded pairs stepped (7: every pair of the rows)")
    ap.add_argument("--only", default=None, help="transformers wheels whose version starts with this (a dry run)")
    ap.add_argument("--child", nargs=2, metavar=("SNAPSHOT", "BATCHES"), help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child:
        print(json.dumps(child(Path(a.child[0]), Path(a.child[1]), a.device)), flush=True)
        return 0
    sys.path.insert(0, str(ROOT))
    import importlib.metadata as md

    import torch
    import transformers

    from gemma_doctor.rehearse.rows import ROWS
    from gemma_doctor.rehearse.twin import build_twin

    transformers.logging.set_verbosity_error()
    work = Path(tempfile.mkdtemp(prefix="gd-nanwin-"))
    twin = build_twin(a.target, "google/gemma-3-12b-it", work / "cache", seed=0)
    tok = transformers.AutoTokenizer.from_pretrained(twin.snapshot)
    tok.padding_side = "left"
    texts = [tok.apply_chat_template([{"role": "user", "content": q}, {"role": "assistant", "content": r}],
                                     tokenize=False) for q, r in ROWS]
    pairs = [dict(tok([texts[i], texts[(i + 3) % len(texts)]], padding=True, return_tensors="pt",
                      add_special_tokens=False)) for i in range(min(a.pairs, len(texts) - 1))]
    batches = work / "pairs.pt"
    torch.save(pairs, batches)
    print(json.dumps({"rows": len(pairs), "pads": [int((p["attention_mask"] == 0).sum()) for p in pairs],
                      "keys": sorted(pairs[0])}), flush=True)
    runs: list[tuple[str, dict[str, str]]] = [("installed", dict(os.environ))]
    wheels = sorted(a.wheels.glob("*.whl")) if a.wheels else []
    helpers = [w for w in wheels if not w.name.startswith("transformers-")]
    installed = {n: md.version(n) for n in ("huggingface_hub", "tokenizers")}
    for wheel in (w for w in wheels if w.name.startswith("transformers-") and _version(w).startswith(a.only or "")):
        site = work / f"site-{_version(wheel)}"
        site.mkdir()
        zipfile.ZipFile(wheel).extractall(site)
        for dep, dist in (("huggingface-hub", "huggingface_hub"), ("tokenizers", "tokenizers")):
            spec = _requirement(wheel, dep)
            if not _fits(installed[dist], spec):
                pick = [h for h in helpers if h.name.startswith(dist + "-") and _fits(_version(h), spec)]
                if pick:
                    zipfile.ZipFile(pick[-1]).extractall(site)
        for h in helpers:  # what an older release imports and this environment lacks (requests for the 0.x hub)
            dist = h.name.split("-")[0]
            if dist not in ("huggingface_hub", "tokenizers") and not _installed(dist):
                zipfile.ZipFile(h).extractall(site)
        env = dict(os.environ, PYTHONPATH=str(site))
        runs.append((_version(wheel), env))
    for label, env in runs:
        p = subprocess.run([sys.executable, __file__, "--device", a.device, "--child", str(twin.snapshot),
                            str(batches)], env=env, capture_output=True, text=True, timeout=600)
        line = next((ln for ln in reversed(p.stdout.splitlines()) if ln.startswith("{")), None)
        result = json.loads(line) if line else {"error": (p.stderr.strip().splitlines() or ["no output"])[-1][:300]}
        result["run"] = label
        print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
