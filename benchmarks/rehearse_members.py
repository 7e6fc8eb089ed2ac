"""No false alarm, member by member: a healthy LoRA SFT rehearsal of every family member's tiny real checkpoint
(tests/tiny_family.py: its own class, real safetensors, saved by transformers) through the installed stack, each in
its own `gemma-doctor rehearse` process. A healthy run must end with every stage ok and no finding; what a member
cannot rehearse is said by the rehearsal itself (a finding or a refused twin), and recorded here as it is.

    .venv/bin/python benchmarks/rehearse_members.py [--only gemma2 t5gemma ...] [--trainer sft|dpo] [--out FILE]

Writes benchmarks/results/rehearse-members.json: per member, the exit code, the wall time, each stage's status and
every finding's code and message.
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
sys.path.insert(0, str(ROOT / "tests"))

# What each trainer's healthy config is: LoRA on the attention projections, bf16 as written for a GPU. The members
# whose towers hold Gemma4ClippableLinear projections get GD440's cure, the language model's projections as a regex
# (a plain name list or '.*(q|k|v|o)_proj' also wraps the towers' and PEFT refuses: that is GD440, not a false alarm).
CONFIGS = {
    "sft": "bf16: true\nper_device_train_batch_size: 2\nlearning_rate: 0.001\nmax_length: 256\nuse_peft: true\n"
           "lora_r: 8\nlora_target_modules: {targets}\n",
    "dpo": "bf16: true\nper_device_train_batch_size: 2\nlearning_rate: 0.001\nmax_length: 256\nuse_peft: true\n"
           "lora_r: 8\nlora_target_modules: {targets}\nbeta: 0.1\n",
}
CLIPPABLE_TOWERS = ("gemma4", "diffusion_gemma", "embedding_gemma2")  # gemma4_unified's towers are nn.Linear


def _targets(member: str) -> str:
    """The LoRA targets of a healthy run of ``member``."""
    from gemma_doctor.family import LANGUAGE_MODEL_REGEX

    if member in CLIPPABLE_TOWERS:
        return "'" + LANGUAGE_MODEL_REGEX.replace("|gate_proj|up_proj|down_proj", "") + "'"
    return "[q_proj, k_proj, v_proj, o_proj]"


def main() -> int:
    """Rehearse every member in turn; print one line each and save the records."""
    import tiny_family

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", nargs="*", default=None)
    ap.add_argument("--trainer", choices=sorted(CONFIGS), default="sft")
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "rehearse-members.json")
    args = ap.parse_args()
    members = [m for m in sorted(tiny_family.SPECS) if not args.only or m in args.only]
    records = []
    with tempfile.TemporaryDirectory(prefix="gd-members-") as tmp:
        for member in members:
            config = Path(tmp) / f"{args.trainer}-{member}.yaml"
            config.write_text(CONFIGS[args.trainer].format(targets=_targets(member)))
            launch = ["--launch", f"trl {args.trainer} --config {config}"] if args.trainer != "sft" else \
                ["--training-config", str(config)]
            folder = tiny_family.save(member, Path(tmp) / "google" / f"tiny-{member}")
            started = time.monotonic()
            done = subprocess.run([sys.executable, "-m", "gemma_doctor", "rehearse", str(folder), *launch, "--format",
                                   "json"], capture_output=True, text=True, cwd=tmp,
                                  env={**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1"})
            wall = time.monotonic() - started
            try:
                doc = json.loads(done.stdout)["rehearsals"][0]
            except (ValueError, KeyError, IndexError):
                doc = {}
            record = {"member": member, "targets": _targets(member), "code": done.returncode, "wall_s": round(wall, 1),
                      "status": doc.get("status"), "class": next((s.get("cls") for s in doc.get("stages", [])
                                                                  if s.get("stage") == "load"), None),
                      "stages": {s["stage"]: s["status"] for s in doc.get("stages", [])},
                      "findings": [{"code": f["code"], "severity": f["severity"], "message": f["message"][:300]}
                                   for f in doc.get("findings", [])],
                      "notes": doc.get("notes", []),
                      "stderr": done.stderr[-600:] if done.returncode not in (0, 1) else ""}
            records.append(record)
            print(f"{member:28} exit {done.returncode} {wall:6.1f} s  {record['status']}  "
                  f"{' '.join(f['code'] for f in record['findings']) or 'no finding'}", flush=True)
    args.out.write_text(json.dumps({"trainer": args.trainer, "load_average": os.getloadavg(), "members": records},
                                   indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
