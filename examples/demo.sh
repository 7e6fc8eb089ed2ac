#!/usr/bin/env bash
# The main job on the bundled example: realistic google/gemma-3-12b-it and google/gemma-4-E2B-it snapshots in a
# fresh hub cache (configs as published, real safetensors headers, sparse shards: no download, no disk use).
# gemma-3: check -> recommend -> fix (diff only) -> fix --inplace -> check -> restore -> a prescription that passes its
# own check; gemma-4: its training traps on a T4.
# Every step states the exit code it must give (0 passes, 1 findings or no prescription); a step that gives another
# stops the demo with exit 1, so `bash examples/demo.sh` passes only when every step did what it claims.
# Run from the repository root.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
cache="${GEMMA_DOCTOR_EXAMPLE_CACHE:-$(dirname "$here")/.example-cache}"
rm -rf "$cache"
python "$here/build_example_cache.py" "$cache" || exit 2
export HF_HUB_OFFLINE=1
# expect CODE COMMAND...: run COMMAND, show its exit code, and stop the demo when it is not CODE.
expect() {
    local want="$1" got=0
    shift
    printf '\n$ %s\n' "$*"
    "$@" || got=$?
    printf '(exit code %s)\n' "$got"
    if [ "$got" != "$want" ]; then
        printf 'demo.sh: expected exit code %s from: %s\n' "$want" "$*" >&2
        exit 1
    fi
}
expect 0 gemma-doctor check google/gemma-3-12b-it --cache-dir "$cache"
# A T4 has no prescription for a 12B model at 1024 tokens: the answer is the way out (exit 1).
expect 1 gemma-doctor recommend google/gemma-3-12b-it --cache-dir "$cache" --gpu T4
expect 0 gemma-doctor fix google/gemma-3-12b-it --cache-dir "$cache"
expect 0 gemma-doctor fix google/gemma-3-12b-it --cache-dir "$cache" --inplace
expect 0 gemma-doctor check google/gemma-3-12b-it --cache-dir "$cache"
expect 0 gemma-doctor restore google/gemma-3-12b-it --cache-dir "$cache"
# The prescription for an L4 passes its own check: recommend's YAML handed back to check --training-config.
plan="$(mktemp -d)/prescription.yaml"
printf '\n$ gemma-doctor recommend google/gemma-3-12b-it --gpu L4 --format yaml > %s\n' "$plan"
got=0
gemma-doctor recommend google/gemma-3-12b-it --cache-dir "$cache" --gpu L4 --format yaml > "$plan" || got=$?
printf '(exit code %s)\n' "$got"
cat "$plan"
if [ "$got" != 0 ] || ! grep -q '^base_model:' "$plan"; then
    echo "demo.sh: recommend --gpu L4 --format yaml gave no prescription" >&2
    exit 1
fi
# The version ranges the prescription needs (its "# needs" lines) go with it to check, as the machine will have them.
pins=()
while IFS= read -r req; do pins+=(--with "$req"); done < <(sed -n 's/^# needs \([^:]*\): .*/\1/p' "$plan")
expect 0 gemma-doctor check google/gemma-3-12b-it --cache-dir "$cache" --gpu L4 --training-config "$plan" ${pins[@]+"${pins[@]}"}
# gemma-4's traps on a T4: check fails (exit 1) on the errors it names.
expect 1 gemma-doctor check google/gemma-4-E2B-it --cache-dir "$cache" --gpu T4 --training-config "$here/gemma-4-E2B-it.train.yaml"
expect 0 gemma-doctor fix google/gemma-4-E2B-it --cache-dir "$cache"
printf '\ndemo.sh: every step gave the exit code it claims\n'
