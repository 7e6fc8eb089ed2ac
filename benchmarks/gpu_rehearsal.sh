#!/usr/bin/env bash
# The GPU checks, as one prepared run on a machine with an NVIDIA GPU (docs/rehearsal.md, "On a GPU"); run from the
# repository root with the machine's own Python (torch with CUDA, transformers, PEFT, accelerate). TRL and datasets,
# where missing, can be unpacked from wheels in .whl/ (never installed by gemma-doctor itself).
#   OUT=/tmp/gd-gpu bash benchmarks/gpu_rehearsal.sh
# Writes into $OUT: probe.json (gemma-doctor's GPU probe against torch), versions.json, rehearse-*.json (the bundled
# examples rehearsed), real-*.json (one measured step of a random-weight checkpoint of a real Gemma shape, with the
# memory plan of the same run), and log.txt.
set -u
OUT=${OUT:-/tmp/gd-gpu}
mkdir -p "$OUT"
exec > >(tee -a "$OUT/log.txt") 2>&1
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
export PYTHONPATH="$PWD"
if [ -d .whl ] && ! python3 -c "import trl, datasets" 2>/dev/null; then
  extra=""  # datasets 5.2 needs pyarrow >= 24: its wheel in .whl-pa/ only where the machine's is older
  python3 -c "import pyarrow, sys; sys.exit(int(pyarrow.__version__.split('.')[0]) < 24)" 2>/dev/null || extra=".whl-pa/*.whl"
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl $extra \
    && export PYTHONPATH="$PYTHONPATH:/tmp/site"
fi
python3 - > "$OUT/versions.json" <<'PY'
import importlib.metadata as m, json
out = {}
for p in ("torch", "transformers", "peft", "trl", "accelerate", "datasets", "pyarrow", "huggingface_hub"):
    try:
        out[p] = m.version(p)
    except m.PackageNotFoundError:
        out[p] = None
print(json.dumps(out))
PY
cat "$OUT/versions.json"
nvidia-smi --query-gpu=name,memory.total,compute_cap,driver_version --format=csv,noheader || true
echo "== probe"; timeout 60 python3 benchmarks/gpu_probe.py > "$OUT/probe.json"; cat "$OUT/probe.json"
python3 examples/build_example_cache.py /tmp/ex > /dev/null
for target in google/gemma-3-12b-it google/gemma-4-E2B-it; do
  name=$(basename "$target")
  echo "== rehearse $target"
  SECONDS=0
  timeout 200 python3 -m gemma_doctor rehearse "$target" --cache-dir /tmp/ex --timeout 170 --format json \
    > "$OUT/rehearse-$name.json" 2> "$OUT/rehearse-$name.err"; rc=$?; echo "exit $rc after ${SECONDS} s"
  tail -3 "$OUT/rehearse-$name.err"; head -c 1500 "$OUT/rehearse-$name.json"; echo
done
for shape in gemma-3-1b gemma-3-4b; do
  echo "== real weights: $shape (random values, real shapes)"
  timeout 150 python3 benchmarks/random_checkpoint.py "$shape" "/tmp/$shape" || continue
  for seq in 1024 4096; do
    timeout 120 python3 - "$shape" "$seq" > "$OUT/real-$shape-$seq.json" <<'PY'
import json, subprocess, sys
from pathlib import Path
from gemma_doctor.rehearse.realweights import measure_step
shape, seq = sys.argv[1], int(sys.argv[2])
folder = Path("/tmp") / shape
step = measure_step(folder, seq_len=seq, batch=1, dtype="bfloat16", device="cuda", lora=True)
plan = subprocess.run([sys.executable, "-m", "gemma_doctor", "check", str(folder), "--gpu", "H100", "--method", "lora",
                       "--batch-size", "1", "--seq-len", str(seq), "--no-gradient-checkpointing", "--format", "json"],
                      capture_output=True, text=True)
try:
    memory = json.loads(plan.stdout)["models"][0].get("memory")
except (ValueError, KeyError, IndexError):
    memory = {"error": plan.stderr[-500:]}
slim = {k: v for k, v in step.items() if k != "modules"}
slim["top_modules"] = sorted(step.get("modules", []), key=lambda m: -(m.get("act_absmax") or 0))[:8]
print(json.dumps({"shape": shape, "seq_len": seq, "step": slim, "plan": memory}, default=str))
PY
    echo "exit $?"; head -c 600 "$OUT/real-$shape-$seq.json"; echo
  done
done
