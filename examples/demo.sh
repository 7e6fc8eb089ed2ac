#!/usr/bin/env bash
# The main job on the bundled example: a realistic google/gemma-3-12b-it snapshot in a fresh hub cache
# (configs as on the Hub, real safetensors headers, sparse shards: no download, no disk use).
# check -> fix (diff only) -> fix --inplace -> check -> restore. Run from the repository root.
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
exit 0
