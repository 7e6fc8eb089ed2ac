#!/usr/bin/env bash
# The main job on the bundled example: realistic google/gemma-3-12b-it and google/gemma-4-E2B-it snapshots in a
# fresh hub cache (configs as published, real safetensors headers, sparse shards: no download, no disk use).
# gemma-3: check -> recommend -> fix (diff only) -> fix --inplace -> check -> restore -> a prescription that passes its
# own check; gemma-4: its training traps on a T4.
# Run from the repository root.
set -u
here="$(cd "$(dirname "$0")" && pwd)"
cache="${GEMMA_DOCTOR_EXAMPLE_CACHE:-$(dirname "$here")/.example-cache}"
rm -rf "$cache"
python "$here/build_example_cache.py" "$cache" || exit 2
export HF_HUB_OFFLINE=1
step() { printf '\n$ %s\n' "$*"; "$@"; printf '(exit code %s)\n' "$?"; }
step gemma-doctor check google/gemma-3-12b-it --cache-dir "$cache"
step gemma-doctor recommend google/gemma-3-12b-it --cache-dir "$cache" --gpu T4
step gemma-doctor fix google/gemma-3-12b-it --cache-dir "$cache"
step gemma-doctor fix google/gemma-3-12b-it --cache-dir "$cache" --inplace
step gemma-doctor check google/gemma-3-12b-it --cache-dir "$cache"
step gemma-doctor restore google/gemma-3-12b-it --cache-dir "$cache"
# The prescription for an L4 passes its own check: recommend's YAML handed back to check --training-config.
plan="$(mktemp -d)/prescription.yaml"
printf '\n$ gemma-doctor recommend google/gemma-3-12b-it --gpu L4 --format yaml > %s\n' "$plan"
gemma-doctor recommend google/gemma-3-12b-it --cache-dir "$cache" --gpu L4 --format yaml > "$plan"
printf '(exit code %s)\n' "$?"
cat "$plan"
step gemma-doctor check google/gemma-3-12b-it --cache-dir "$cache" --gpu L4 --training-config "$plan"
step gemma-doctor check google/gemma-4-E2B-it --cache-dir "$cache" --gpu T4 --training-config "$here/gemma-4-E2B-it.train.yaml"
step gemma-doctor fix google/gemma-4-E2B-it --cache-dir "$cache"
exit 0
