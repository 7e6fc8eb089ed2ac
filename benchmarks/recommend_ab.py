"""CPU of `recommend` on the bundled examples (the prescription search, each in a fresh process), this tree against
another checkout, alternated in one run, and whether their JSON is byte-equal.

    git archive main | tar -x -C /tmp/gd-base
    .venv/bin/python benchmarks/recommend_ab.py /tmp/gd-base [RUNS]

The points are the prescription grid's slowest (tests/test_prescription.py: Gemma 4 E2B on small GPUs, where every
candidate is judged and the way out searched), and one quick point of each model.
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
POINTS = (
    ("google/gemma-4-E2B-it", "RTX 3060", "4.50.3", "sft"),
    ("google/gemma-4-E2B-it", "T4", "5.23.0", "full"),
    ("google/gemma-4-E2B-it", "V100", "5.5.1", "lora"),
    ("google/gemma-3-12b-it", "A100", "5.23.0", "sft"),
)


def _cpu(tree: str, argv: list[str], cwd: str) -> tuple[float, str]:
    """CPU seconds (user + system) of one run of ``argv`` with ``tree``'s gemma_doctor first on the path; its stdout.
    ``cwd`` is neither tree: ``python -m`` puts the current folder first on the path."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    done = subprocess.run(argv, capture_output=True, text=True, cwd=cwd,
                          env={**os.environ, "PYTHONPATH": tree, "HF_HUB_OFFLINE": "1"})
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime, done.stdout


def main() -> int:
    """Time both trees at every point, RUNS runs each alternated; print medians, the ratio and byte-equality."""
    base, runs = str(Path(sys.argv[1]).resolve()), int(sys.argv[2]) if len(sys.argv) > 2 else 5
    trees = {"this": str(ROOT), "base": base}
    for tree in trees.values():  # both trees byte-compiled alike (PYTHONDONTWRITEBYTECODE would leave one compiling)
        subprocess.run([sys.executable, "-m", "compileall", "-q", f"{tree}/gemma_doctor"], check=True,
                       capture_output=True)
    with tempfile.TemporaryDirectory() as tmp:
        cache = Path(tmp) / "hub"
        subprocess.run([sys.executable, str(ROOT / "examples" / "build_example_cache.py"), str(cache)], check=True,
                       capture_output=True)
        total = {label: 0.0 for label in trees}
        equal = True
        for model, gpu, version, task in POINTS:
            argv = [sys.executable, "-m", "gemma_doctor", "recommend", model, "--cache-dir", str(cache), "--gpu", gpu,
                    "--with", f"transformers=={version}", "--task", task, "--format", "json"]
            cpu: dict[str, list[float]] = {label: [] for label in trees}
            out: dict[str, str] = {}
            for _ in range(runs):
                for label, tree in trees.items():
                    seconds, out[label] = _cpu(tree, argv, tmp)
                    cpu[label].append(seconds)
            med = {label: statistics.median(v) for label, v in cpu.items()}
            for label in trees:
                total[label] += med[label]
            equal &= out["this"] == out["base"]
            print(f"{model} {gpu} transformers {version} {task}: this {med['this']:.3f} s, base {med['base']:.3f} s, "
                  f"ratio {med['this'] / med['base']:.3f}, JSON {'equal' if out['this'] == out['base'] else 'DIFFERS'}")
        print(f"all points: this {total['this']:.3f} s, base {total['base']:.3f} s, ratio "
              f"{total['this'] / total['base']:.3f}; load average {os.getloadavg()[0]:.1f}")
    return 0 if equal else 1


if __name__ == "__main__":
    sys.exit(main())
