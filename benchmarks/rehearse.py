"""Cost of a rehearsal: wall time (imports included) and peak memory of a twin LoRA SFT rehearsal of the bundled
gemma-3-12b-it example (262,144-token vocabulary, so the twin's embedding and logits are real-sized), through the
installed TRL. Targets (issue 34): at most 60 s and 2 GiB on the 2-core CI machine.

The baseline, measured in the same run: a bare child that only imports torch, transformers, PEFT and TRL (what any
rehearsal pays before its first stage), so the ratio separates the rehearsal's own work from the stack's imports on
a machine whose speed varies.

    python benchmarks/rehearse.py                         # prints a table, writes benchmarks/results/rehearse.json
"""

from __future__ import annotations

import json
import os
import resource
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


def _timed(argv: list[str]) -> tuple[float, subprocess.CompletedProcess]:
    started = time.monotonic()
    done = subprocess.run(argv, capture_output=True, text=True, cwd=ROOT,
                          env={**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1"})
    return time.monotonic() - started, done


def main() -> int:
    """Measure the baseline and the rehearsal in fresh processes; print and save the figures."""
    imports, _ = _timed([sys.executable, "-c", "import torch, transformers, peft, trl, datasets"])
    with tempfile.TemporaryDirectory() as tmp:
        config = Path(tmp) / "sft.yaml"
        config.write_text(CONFIG)
        wall, done = _timed([sys.executable, "-m", "gemma_doctor", "rehearse", str(EXAMPLE), "--training-config",
                             str(config), "--format", "json"])
    # Largest resident set of any waited-for descendant: the rehearsal's child (ru_maxrss is in KiB on Linux).
    peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024
    doc = json.loads(done.stdout)["rehearsals"][0] if done.stdout.strip() else {}
    stages = {s["stage"]: s.get("elapsed") for s in doc.get("stages", [])}
    result = {"wall_s": round(wall, 1), "peak_rss_bytes": peak, "imports_only_s": round(imports, 1),
              "wall_over_imports": round(wall / imports, 2), "status": doc.get("status"),
              "findings": [f["code"] for f in doc.get("findings", [])], "stage_elapsed_s": stages,
              "stack": doc.get("stack"), "cpus": os.cpu_count(), "load_average": os.getloadavg()}
    out = ROOT / "benchmarks" / "results" / "rehearse.json"
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"rehearsal of gemma-3-12b-it (twin, LoRA SFT, {doc.get('status')}): {wall:.1f} s wall "
          f"(target {TARGET_SECONDS:.0f} s), peak RSS {peak / 1024**3:.2f} GiB (target {TARGET_BYTES / 1024**3:.0f} GiB)")
    print(f"baseline, importing the stack alone: {imports:.1f} s; rehearsal / imports = {wall / imports:.2f}")
    print("seconds since the child started, per stage: " + ", ".join(f"{k} {v}" for k, v in stages.items()))
    return 0 if done.returncode in (0, 1) else done.returncode


if __name__ == "__main__":
    sys.exit(main())
