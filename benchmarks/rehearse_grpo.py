"""Cost of a GRPO rehearsal: wall time (imports included) and peak memory of a twin LoRA GRPO rehearsal of the bundled
gemma-3-12b-it example (262,144-token vocabulary) through the installed TRL's GRPOTrainer, against the same baseline
as benchmarks/rehearse.py (a bare child importing torch, transformers, PEFT, TRL and datasets), in the same run.

    python benchmarks/rehearse_grpo.py       # prints a line, writes benchmarks/results/rehearse-grpo.json

The config is a common GRPO shape: 8 completions of each prompt, one prompt a step, `beta` 0.04 (so a reference
forward too), `loss_type: dapo`, vLLM on (replaced by generate() on the twin), `think_format_reward`.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from rehearse import EXAMPLE, ROOT, _peak_of, _timed  # noqa: E402 - the SFT benchmark's own measuring

CONFIG = """model_name_or_path: google/gemma-3-12b-it
bf16: true
learning_rate: 1.0e-5
per_device_train_batch_size: 8
num_generations: 8
max_completion_length: 256
beta: 0.04
loss_type: dapo
scale_rewards: group
use_vllm: true
use_peft: true
lora_r: 16
lora_target_modules: [q_proj, k_proj, v_proj, o_proj]
reward_funcs: [think_format_reward]
"""


def main() -> int:
    """The baseline, then one GRPO rehearsal with a deadline long enough to finish; print and save the figures."""
    imports, _ = _timed([sys.executable, "-c", "import torch, transformers, peft, trl, datasets"])
    with tempfile.TemporaryDirectory() as tmp:
        config = Path(tmp) / "grpo.yaml"
        config.write_text(CONFIG)
        load = os.getloadavg()
        wall, peak, done = _peak_of([sys.executable, "-m", "gemma_doctor", "rehearse", str(EXAMPLE),
                                     "--training-config", str(config), "--timeout", "1200", "--format", "json"], ROOT)
    doc = json.loads(done.stdout)["rehearsals"][0] if done.stdout.strip() else {}
    result = {"wall_s": round(wall, 1), "peak_rss_bytes": peak, "imports_only_s": round(imports, 1),
              "wall_over_imports": round(wall / imports, 2), "status": doc.get("status"),
              "findings": [f"{f['code']} {f['severity']}" for f in doc.get("findings", [])],
              "stage_elapsed_s": {s["stage"]: s.get("elapsed") for s in doc.get("stages", [])},
              "stack": doc.get("stack"), "cpus": os.cpu_count(), "load_average_before": load,
              "load_average_after": os.getloadavg(), "returncode": done.returncode,
              "stderr": done.stderr[-500:] if done.returncode not in (0, 1) else ""}
    (ROOT / "benchmarks" / "results" / "rehearse-grpo.json").write_text(json.dumps(result, indent=2) + "\n")
    print(f"baseline, importing the stack alone: {imports:.1f} s")
    print(f"GRPO rehearsal of gemma-3-12b-it ({result['status']}, {', '.join(result['findings']) or 'no finding'}): "
          f"{wall:.1f} s wall, peak RSS {peak / 1024**3:.2f} GiB; rehearsal / imports = {result['wall_over_imports']}; "
          f"load average {load[0]:.1f} -> {result['load_average_after'][0]:.1f}")
    print("  seconds since the child started, per stage: "
          + ", ".join(f"{k} {v}" for k, v in result["stage_elapsed_s"].items()))
    return 0 if done.returncode in (0, 1) else 1


if __name__ == "__main__":
    sys.exit(main())
