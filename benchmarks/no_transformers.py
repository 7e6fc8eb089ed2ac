"""`check` on a cache of unalike Gemma repos without transformers installed (the README's own install) against the test
stack, for this tree and (with --baseline TREE) another checkout: CPU seconds (user + system), medians of --runs runs,
alternated so that load affects each alike. The light venv is tests/venvs.ensure_light_venv's (built once, cached).

    .venv/bin/python benchmarks/no_transformers.py [--repos 100] [--runs 3] [--baseline TREE]
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

import startup  # noqa: E402
from tests.venvs import ensure_light_venv  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repos", type=int, default=100)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--baseline", metavar="TREE", help="another checkout, timed the same way in the same run")
    args = ap.parse_args()
    trees = [str(ROOT)] + ([str(Path(args.baseline).resolve())] if args.baseline else [])
    pythons = {"no transformers": str(ensure_light_venv()), "test stack": sys.executable}
    with tempfile.TemporaryDirectory() as tmp:
        cache = Path(tmp) / "cache"
        startup.build_cache(cache, args.repos, "distinct")
        env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
        env["HF_HUB_OFFLINE"] = "1"
        cmds = {(t, name): ["env", f"PYTHONPATH={t}", py, "-m", "gemma_doctor", "check", "--cache-dir", str(cache),
                            "--fail-on", "never"] for t in trees for name, py in pythons.items()}
        cpu: dict[tuple[str, str], list[float]] = {k: [] for k in cmds}
        for cmd in cmds.values():  # warm the page cache and .pyc files
            subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=startup.NEUTRAL, env=env)
        for _ in range(args.runs):
            for k, cmd in cmds.items():
                r0 = resource.getrusage(resource.RUSAGE_CHILDREN)
                subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=startup.NEUTRAL, env=env)
                r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
                cpu[k].append(r1.ru_utime - r0.ru_utime + r1.ru_stime - r0.ru_stime)
    med = {k: statistics.median(v) for k, v in cpu.items()}
    for (tree, name), v in med.items():
        print(f"{tree}  {name:16s} {v:.2f} s CPU")
    for tree in trees:
        print(f"{tree}: no transformers / test stack = {med[(tree, 'no transformers')] / med[(tree, 'test stack')]:.2f}")


if __name__ == "__main__":
    main()
