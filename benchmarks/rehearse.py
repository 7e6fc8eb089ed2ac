"""Cost of a rehearsal: wall time (imports included) and peak memory of a twin LoRA SFT rehearsal of the bundled
gemma-3-12b-it example (262,144-token vocabulary, so the twin's embedding and logits are real-sized), through the
installed TRL. Targets (issue 34): at most 60 s and 2 GiB on the 2-core CI machine.

The baseline, measured in the same run: a bare child that only imports torch, transformers, PEFT and TRL (what any
rehearsal pays before its first stage), so the ratio separates the rehearsal's own work from the stack's imports on
a machine whose speed varies.

    python benchmarks/rehearse.py                         # prints a table, writes benchmarks/results/rehearse.json
    git archive main | tar -x -C /tmp/gd-main
    python benchmarks/rehearse.py --tree before=/tmp/gd-main --tree after=.   # both trees in the same run

With several trees, each tree's gemma_doctor (PYTHONPATH) rehearses in turn after the one baseline, so a change is
measured against the tree before it on the same machine under the same load; the load average is recorded with each.
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
EXAMPLE = ROOT / "examples" / "google--gemma-3-12b-it"
CONFIG = """model_name_or_path: google/gemma-3-12b-it
bf16: true
per_device_train_batch_size: 2
max_length: 256
use_peft: true
lora_r: 16
lora_target_modules: [q_proj, k_proj, v_proj, o_proj]
"""
TARGET_SECONDS, TARGET_BYTES = 60.0, 2 * 1024**3


def _timed(argv: list[str], tree: Path = ROOT) -> tuple[float, subprocess.CompletedProcess]:
    started = time.monotonic()
    done = subprocess.run(argv, capture_output=True, text=True, cwd=ROOT,
                          env={**os.environ, "PYTHONPATH": str(tree), "HF_HUB_OFFLINE": "1"})
    return time.monotonic() - started, done


def _peak_of(argv: list[str], tree: Path) -> tuple[float, int, subprocess.CompletedProcess]:
    """(wall seconds, largest resident set of its processes, the run) of ``argv`` in a process of its own, so that
    RUSAGE_CHILDREN there counts this rehearsal's child only (it is cumulative per waiting process)."""
    probe = ("import resource, subprocess, sys, time, json; t = time.monotonic(); "
             "d = subprocess.run(sys.argv[1:], capture_output=True, text=True); "
             "print(json.dumps([time.monotonic() - t, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024, "
             "d.returncode, d.stdout, d.stderr[-3000:]]))")
    _, done = _timed([sys.executable, "-c", probe, *argv], tree)
    wall, peak, code, out, err = json.loads(done.stdout)
    return wall, peak, subprocess.CompletedProcess(argv, code, out, err)


def measure(tree: Path, imports: float) -> dict:
    """One rehearsal of the example with ``tree``'s gemma_doctor: wall, peak, stages."""
    with tempfile.TemporaryDirectory() as tmp:
        config = Path(tmp) / "sft.yaml"
        config.write_text(CONFIG)
        load = os.getloadavg()
        wall, peak, done = _peak_of([sys.executable, "-m", "gemma_doctor", "rehearse", str(EXAMPLE),
                                     "--training-config", str(config), "--format", "json"], tree)
    doc = json.loads(done.stdout)["rehearsals"][0] if done.stdout.strip() else {}
    stages = {s["stage"]: s.get("elapsed") for s in doc.get("stages", [])}
    return {"tree": str(tree), "wall_s": round(wall, 1), "peak_rss_bytes": peak, "imports_only_s": round(imports, 1),
            "wall_over_imports": round(wall / imports, 2), "status": doc.get("status"),
            "findings": [f["code"] for f in doc.get("findings", [])], "stage_elapsed_s": stages,
            "stack": doc.get("stack"), "cpus": os.cpu_count(), "load_average_before": load,
            "load_average_after": os.getloadavg(), "returncode": done.returncode,
            "stderr": done.stderr[-500:] if done.returncode not in (0, 1) else ""}


def main() -> int:
    """Measure the baseline and the rehearsal in fresh processes; print and save the figures."""
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tree", action="append", default=[], metavar="LABEL=PATH",
                    help="a source tree holding gemma_doctor/ (default: this repository)")
    ns = ap.parse_args()
    trees = dict(t.split("=", 1) for t in ns.tree) if ns.tree else {"this tree": str(ROOT)}
    imports, _ = _timed([sys.executable, "-c", "import torch, transformers, peft, trl, datasets"])
    results = {label: measure(Path(path).resolve(), imports) for label, path in trees.items()}
    out = ROOT / "benchmarks" / "results" / "rehearse.json"
    out.write_text(json.dumps(results if len(results) > 1 else next(iter(results.values())), indent=2) + "\n")
    print(f"baseline, importing the stack alone: {imports:.1f} s")
    for label, r in results.items():
        print(f"{label}: rehearsal of gemma-3-12b-it (twin, LoRA SFT, {r['status']}): {r['wall_s']:.1f} s wall "
              f"(target {TARGET_SECONDS:.0f} s), peak RSS {r['peak_rss_bytes'] / 1024**3:.2f} GiB (target "
              f"{TARGET_BYTES / 1024**3:.0f} GiB); rehearsal / imports = {r['wall_over_imports']:.2f}; load average "
              f"{r['load_average_before'][0]:.1f} -> {r['load_average_after'][0]:.1f}")
        print("  seconds since the child started, per stage: "
              + ", ".join(f"{k} {v}" for k, v in r["stage_elapsed_s"].items()))
    return 0 if all(r["returncode"] in (0, 1) for r in results.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
