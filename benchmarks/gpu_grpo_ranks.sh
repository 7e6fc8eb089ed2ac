#!/usr/bin/env bash
# The GRPO rehearsal on a GPU and the 2-rank FSDP rehearsal on a many-core machine, as one prepared run (docs/rehearsal.md,
# "On a GPU, third run"); run from the repository root with the machine's own Python (torch with CUDA, transformers,
# PEFT, accelerate). TRL and datasets, where missing, are unpacked from wheels in .whl/ (as gpu_rehearsal.sh does).
#   OUT=/tmp/gd-gpu bash benchmarks/gpu_grpo_ranks.sh
set -u
OUT=${OUT:-/tmp/gd-gpu}
mkdir -p "$OUT"
exec > >(tee -a "$OUT/log.txt") 2>&1
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
if [ -d .whl ] && ! python3 -c "import trl, datasets" 2>/dev/null; then
  extra=""
  python3 -c "import pyarrow, sys; sys.exit(int(pyarrow.__version__.split('.')[0]) < 24)" 2>/dev/null || extra=".whl-pa/*.whl"
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl $extra \
    && SITE=/tmp/site
fi
export PYTHONPATH="$PWD:${SITE:-}"
W=$(mktemp -d)
# The GRPO shape of benchmarks/rehearse_grpo.py: 8 completions a prompt, beta 0.04, dapo, vLLM asked (replaced).
python3 - "$W/grpo.yaml" <<'PY'
import sys
sys.path.insert(0, "benchmarks")
from rehearse_grpo import CONFIG
open(sys.argv[1], "w").write(CONFIG)
PY
printf 'learning_rate: 0.001\nper_device_train_batch_size: 2\nuse_peft: true\nlora_r: 8\nlora_target_modules: [q_proj, v_proj]\n' > "$W/lora.yaml"
printf 'compute_environment: LOCAL_MACHINE\ndistributed_type: FSDP\nmixed_precision: bf16\nnum_machines: 1\nnum_processes: 8\nfsdp_config:\n  fsdp_version: 2\n  fsdp_auto_wrap_policy: TRANSFORMER_BASED_WRAP\n  fsdp_transformer_layer_cls_to_wrap: Gemma3DecoderLayer\n  fsdp_state_dict_type: FULL_STATE_DICT\n  fsdp_offload_params: false\n  fsdp_activation_checkpointing: false\n' > "$W/fsdp.yaml"
run() {  # NAME ARGS...: the JSON, the text view and /usr/bin/time's figures
  name=$1; shift
  /usr/bin/time -v -o "$OUT/$name.time" timeout 170 python3 -m gemma_doctor rehearse examples/google--gemma-3-12b-it \
    "$@" --format json > "$OUT/$name.json" 2> "$OUT/$name.err"
  echo "$name: exit $? $(grep -E 'Elapsed|Maximum resident' "$OUT/$name.time" | tr -s ' \t' ' ' | tr '\n' ';')"
  python3 - "$OUT/$name.json" <<'PY'
import json, sys
d = json.load(open(sys.argv[1])); r = (d.get("rehearsals") or [d])[0]
print(" stack", r.get("stack"), "seconds", r.get("seconds"))
for s in r.get("stages", []):
    print("  ", s.get("stage"), s.get("status"), str({k: s[k] for k in ("losses", "grad_norms", "ranks", "line") if k in s})[:300])
print(" findings", [(f["code"], f["severity"], f["message"][:160]) for f in r.get("findings", [])]); print(" notes", [n[:160] for n in r.get("notes", [])])
PY
}
run grpo-cuda --training-config "$W/grpo.yaml" --device cuda
run ranks-fsdp2-lora --training-config "$W/lora.yaml" --accelerate-config "$W/fsdp.yaml" --steps 2 --device cpu
nproc
