#!/usr/bin/env bash
# The GPU checks, as one prepared run on a machine with an NVIDIA GPU (docs/rehearsal.md, "On a GPU"); run from the
# repository root with the machine's own Python (torch with CUDA, transformers, PEFT, accelerate). TRL and datasets,
# where missing, can be unpacked from wheels in .whl/ (never installed by gemma-doctor itself).
#   OUT=/tmp/gd-gpu bash benchmarks/gpu_rehearsal.sh
# Writes into $OUT: probe.json (gemma-doctor's GPU probe against torch), versions.json, gpu-session.json (the twin
# rehearsed on the GPU, `rehearse --real-weights`, measured steps of random-weight checkpoints of real Gemma shapes
# against the memory plan of the same run: benchmarks/gpu_session.py), and log.txt.
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
    && SITE=/tmp/site
fi
PYTHONPATH="$PWD:${SITE:-}" python3 - > "$OUT/versions.json" <<'PY'
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
echo "== the rehearsal on the GPU (benchmarks/gpu_session.py)"
# TRL and datasets only for the TRL rehearsal: the memory cases plan a plain Trainer's run (no chunked log-probs).
PYTHONPATH="$PWD" timeout "${SESSION_TIMEOUT:-420}" python3 benchmarks/gpu_session.py --out "$OUT" \
  --site "${SITE:-}" ${SESSION_ARGS:-}
echo "exit $?"
