"""CPU of a whole-cache `check` in one process (GEMMA_DOCTOR_WORKERS=1), this tree against another checkout, alternated
in one run, and whether their JSON is byte-equal: the cost of the per-model search without the workers' noise.

    .venv/bin/python benchmarks/search_ab.py SHAPE REPOS RUNS BASELINE_TREE   (SHAPE: same | distinct | checkpoints)
"""

from __future__ import annotations

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


def main() -> None:
    """Time both trees on one cache of SHAPE with REPOS repos, RUNS runs each after one warm-up."""
    shape, n, runs = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    trees = {"this": str(ROOT), "base": str(Path(sys.argv[4]).resolve())}
    with tempfile.TemporaryDirectory() as tmp:
        cache = Path(tmp) / "c"
        startup.build_cache(cache, n, shape)
        env = {**os.environ, "HF_HUB_OFFLINE": "1", "GEMMA_DOCTOR_WORKERS": "1"}
        cpu: dict[str, list[float]] = {k: [] for k in trees}
        outs: dict[str, bytes] = {}
        for i in range(runs + 1):
            for k, t in trees.items():
                cmd = ["env", f"PYTHONPATH={t}", sys.executable, "-m", "gemma_doctor", "check", "--cache-dir", str(cache),
                       "--fail-on", "never", "--format", "json"]
                r0 = resource.getrusage(resource.RUSAGE_CHILDREN)
                p = subprocess.run(cmd, capture_output=True, cwd=startup.NEUTRAL, env=env)
                r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
                outs[k] = p.stdout
                if i:  # the first round warms the page cache and the .pyc files
                    cpu[k].append(r1.ru_utime - r0.ru_utime + r1.ru_stime - r0.ru_stime)
        m = {k: statistics.median(v) for k, v in cpu.items()}
        print(f"{shape} {n} repos, CPU median of {runs}: this tree {m['this']:.3f} s, baseline {m['base']:.3f} s, "
              f"this / baseline {m['this'] / m['base']:.3f}; JSON byte-equal: {outs['this'] == outs['base']}")


if __name__ == "__main__":
    main()
