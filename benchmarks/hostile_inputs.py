"""Peak memory of one gemma-doctor process on hostile input, against the same command on a benign repo.

    python benchmarks/hostile_inputs.py                  # this checkout
    python benchmarks/hostile_inputs.py --code /tmp/old  # another checkout (e.g. `git worktree add /tmp/old <rev>`)

Cases (the issue-11 list; tests/test_attacker.py asserts bounds on each): a 700-byte YAML alias bomb in a
training config; `check --weights` on a [3e7, 1] zero embedding and on a single row of 3e8 elements (sparse
files: no disk used); 40 index entries linked to one blob whose safetensors header is 99 MB. Peak RSS is read
from /proc/self/status (VmHWM) at exit; each process runs under RLIMIT_AS (--cap-gib) so a run of old code
that would eat the machine fails instead. Prints one JSON document: baseline MiB and, per case, peak MiB,
peak minus baseline, exit code and seconds.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.test_attacker import REPO, World, _sparse_safetensors  # noqa: E402
from tests.builders import HubCache, gemma2_config  # noqa: E402

_RUN = """
import atexit, os, resource, sys
cap = int(os.environ['GD_CAP'])
resource.setrlimit(resource.RLIMIT_AS, (cap, cap))
def _peak():
    for line in open('/proc/self/status'):
        if line.startswith('VmHWM:'):
            open(os.environ['GD_PEAK_FILE'], 'w').write(line.split()[1])
atexit.register(_peak)
import gemma_doctor
assert gemma_doctor.__file__.startswith(os.environ['PYTHONPATH']), gemma_doctor.__file__
from gemma_doctor.cli import main
main(sys.argv[1:])
"""


def run(code: Path, cache: Path, cap: int, *args: str) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        env = dict(os.environ, PYTHONPATH=str(code), HF_HUB_OFFLINE="1", NO_COLOR="1", GD_CAP=str(cap),
                   GD_PEAK_FILE=os.path.join(tmp, "peak"), GEMMA_DOCTOR_WITH="transformers==4.50.3")
        t0 = time.perf_counter()
        # cwd elsewhere: `python -c` puts the working folder first on sys.path, before PYTHONPATH.
        r = subprocess.run([sys.executable, "-c", _RUN, *args, "--cache-dir", str(cache)], env=env, cwd=tmp,
                           capture_output=True, text=True, timeout=1800)
        seconds = time.perf_counter() - t0
        peak = Path(env["GD_PEAK_FILE"])
        return {"exit": r.returncode, "peak_mib": round(int(peak.read_text()) / 1024, 1) if peak.exists() else None,
                "seconds": round(seconds, 2), "stderr_tail": r.stderr.strip().splitlines()[-1:] if r.returncode > 3 else []}


def weights_repo(root: Path, shape: list[int]) -> HubCache:
    hub = HubCache(root)
    snap = hub.add(REPO, {"config.json": gemma2_config()})
    _sparse_safetensors(hub.repo_dir(REPO) / "blobs" / "w", {"model.embed_tokens.weight": ("BF16", shape)})
    os.symlink("../../blobs/w", snap / "model.safetensors")
    return hub


def shared_header_repo(root: Path, links: int) -> HubCache:
    hub = HubCache(root)
    snap = hub.add(REPO, {"config.json": gemma2_config()})
    _sparse_safetensors(hub.repo_dir(REPO) / "blobs" / "big", {"model.norm.weight": ("BF16", [4])}, {"pad": "x" * 99_000_000})
    names = [f"model-{i:05d}-of-{links:05d}.safetensors" for i in range(links)]
    for n in names:
        os.symlink("../../blobs/big", snap / n)
    (snap / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {f"t{i}": n for i, n in enumerate(names)}}))
    return hub


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--code", type=Path, default=ROOT, help="checkout whose gemma_doctor runs")
    ap.add_argument("--cap-gib", type=float, default=6.0, help="address-space limit per process")
    args = ap.parse_args()
    cap = int(args.cap_gib * 2**30)
    out: dict = {"code": str(args.code), "cap_gib": args.cap_gib}
    with tempfile.TemporaryDirectory(prefix="gd-hostile-") as tmp:
        base = World(Path(tmp) / "base")
        out["baseline"] = run(args.code, base.hub.root, cap, "check", REPO, "--weights", "--format", "json")
        bomb = Path(tmp) / "bomb.yaml"
        bomb.write_text("a: &a [x, x, x, x, x, x, x, x, x]\n" + "".join(
            f"{chr(98 + i)}: &{chr(98 + i)} [" + ", ".join([f"*{chr(97 + i)}"] * 9) + "]\n" for i in range(8)) + "fp16: *i\n")
        cases = {
            "yaml alias bomb (700 bytes) as --training-config": (base.hub.root, ("check", REPO, "--training-config", str(bomb), "--format", "json")),
            "--weights, [3e7, 1] zero embedding": (weights_repo(Path(tmp) / "rows", [30_000_000, 1]).root, ("check", REPO, "--weights", "--format", "json")),
            "--weights, one row of 3e8 elements": (weights_repo(Path(tmp) / "row", [1, 300_000_000]).root, ("check", REPO, "--weights", "--format", "json")),
            "40 shard links sharing one 99 MB header": (shared_header_repo(Path(tmp) / "shared", 40).root, ("check", REPO, "--format", "json")),
        }
        base_mib = out["baseline"]["peak_mib"] or 0.0
        for name, (cache, argv) in cases.items():
            res = run(args.code, cache, cap, *argv)
            res["above_baseline_mib"] = round(res["peak_mib"] - base_mib, 1) if res["peak_mib"] is not None else None
            out[name] = res
            print(f"{name}: {res}", file=sys.stderr)
    print(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
