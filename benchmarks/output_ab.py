"""Every view of check, list and recommend on the bundled example cache, this tree against another checkout, compared
byte for byte (stdout, stderr and exit code): the proof that a change of where names or judgements are made changed
no output (issue 32). Each command runs with the scan's shared judgements on and off (GEMMA_DOCTOR_NO_MEMO=1), on the
example cache and on an alike one (each example repo and two copies of it under other names, whose judgements a scan
shares); within this tree, on and off must agree too. Prints each command that differs; exits 1 when one does.

    .venv/bin/python benchmarks/output_ab.py BASELINE_TREE
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TRAIN = str(ROOT / "examples" / "gemma-4-E2B-it.train.yaml")
OLD = ("--with", "transformers==4.50.3")  # the HybridCache window: the use_cache fix names the model
# A file of TrainingArguments keys alone (written in the neutral folder the commands run in): the trainer decision
# (gemma_doctor/trainers.py) plans it as a plain Trainer alone and as TRL's SFTTrainer under `trl sft`.
ARGS_ONLY = ("args-only.yaml", "per_device_train_batch_size: 8\nbf16: true\ngradient_checkpointing: true\n")
# Each command with the cache appended; together they show every text that names a model (fix, restore and recommend
# commands, the way out, snippets and the YAML's base_model) in text, JSON, github and YAML.
COMMANDS: list[tuple[str, ...]] = [
    ("check", "--fail-on", "never"),
    ("check", "--fail-on", "never", "--format", "json"),
    ("check", "--fail-on", "never", "--gpu", "T4"),
    ("check", "--fail-on", "never", "--gpu", "T4", "--format", "json"),
    ("check", "--fail-on", "never", "--gpu", "T4", "--format", "github"),
    ("check", "google/gemma-3-12b-it", "--fail-on", "never", "--gpu", "V100", "--format", "json"),
    ("check", "google/gemma-4-E2B-it", "--fail-on", "never", "--gpu", "T4", "--training-config", TRAIN),
    ("check", "google/gemma-4-E2B-it", "--fail-on", "never", "--gpu", "T4", "--training-config", TRAIN, "--format", "json"),
    ("check", "--fail-on", "never", "--gpu", "A100", *OLD, "--format", "json"),
    ("check", "--fail-on", "never", "--gpu", "T4", *OLD),
    ("list",),
    ("list", "--format", "json", *OLD),
    ("recommend", "google/gemma-3-12b-it", "--gpu", "T4"),
    ("recommend", "google/gemma-3-12b-it", "--gpu", "T4", "--format", "json"),
    ("recommend", "google/gemma-4-E2B-it", "--gpu", "T4", "--format", "yaml"),
    ("recommend", "google/gemma-3-12b-it", "--gpu", "L4", "--format", "json", *OLD),
    ("recommend", "--family", "gemma3", "--size", "12b", "--gpu", "T4", "--format", "json"),
    ("recommend", "--family", "gemma3", "--size", "27b", "--gpu", "T4"),
    ("check", "google/gemma-3-12b-it", "--fail-on", "never", "--gpu", "A100", "--training-config", ARGS_ONLY[0]),
    ("check", "google/gemma-3-12b-it", "--fail-on", "never", "--gpu", "A100", "--training-config", ARGS_ONLY[0],
     "--launch", f"trl sft --config {ARGS_ONLY[0]}", "--format", "json"),
    # Every other format of every command that runs without a child (fix and restore without writing).
    ("fix", *OLD),
    ("fix", "--format", "json", *OLD),
    ("restore", "--dry-run"),
    ("restore", "--dry-run", "--format", "json"),
    ("list", "--format", "quiet"),
    ("list", "-q", "--format", "json"),
    ("recommend", "google/gemma-3-12b-it", "--gpu", "T4", "--format", "python"),
    ("recommend", "--family", "gemma3", "--size", "27b", "--gpu", "T4", "--format", "yaml"),
    ("check", "--help"),
    # --rehearse of a --family plan: no twin to build (said per model), the verdicts in each view without a child.
    ("recommend", "--family", "gemma3", "--size", "12b", "--gpu", "A100", "--rehearse"),
    ("recommend", "--family", "gemma3", "--size", "12b", "--gpu", "A100", "--rehearse", "--format", "json"),
    ("recommend", "--family", "gemma3", "--size", "12b", "--gpu", "A100", "--rehearse", "--format", "python"),
    ("recommend", "--family", "gemma3", "--size", "12b", "--gpu", "A100", "--rehearse", "--format", "yaml"),
    # Each trainer format recommend writes besides axolotl's (plan/recommend.FORMATS), in YAML, Python and JSON.
    ("recommend", "google/gemma-3-12b-it", "--gpu", "L4", "--trainer", "trl", "--format", "yaml"),
    ("recommend", "google/gemma-3-12b-it", "--gpu", "A100", "--trainer", "trl", "--task", "dpo", "--format", "json"),
    ("recommend", "google/gemma-3-12b-it", "--gpu", "L4", "--trainer", "transformers", "--format", "python"),
    ("recommend", "google/gemma-4-E2B-it", "--gpu", "T4", "--trainer", "llama-factory", "--format", "yaml"),
    # The rehearse view without a child: LLaMA-Factory's CLI is not installed here (GD950). Text only: the JSON holds
    # the seconds the rehearsal took.
    ("rehearse", "google/gemma-4-E2B-it", "--launch", f"llamafactory-cli train {TRAIN}"),
]


def run(tree: str, cache: Path, args: tuple[str, ...], neutral: str, memo: bool = True) -> tuple[int, bytes, bytes]:
    """One command of gemma-doctor from ``tree``: (exit code, stdout, stderr)."""
    full = list(args) if args[0] == "recommend" and "--family" in args else [*args, "--cache-dir", str(cache)]
    env = {**os.environ, "PYTHONPATH": tree, "HF_HUB_OFFLINE": "1"}
    env.pop("GEMMA_DOCTOR_NO_MEMO", None)
    if not memo:
        env["GEMMA_DOCTOR_NO_MEMO"] = "1"
    p = subprocess.run([sys.executable, "-m", "gemma_doctor", *full], capture_output=True, cwd=neutral, env=env)
    return p.returncode, p.stdout, p.stderr


def alike(example: Path, dest: Path) -> Path:
    """The example cache with two copies of each repo under other names (blobs hard-linked: the same bytes, no disk)."""
    shutil.copytree(example, dest, symlinks=True, copy_function=os.link)
    for repo in sorted(example.glob("models--*")):
        for owner in ("org-a", "org-b"):
            shutil.copytree(repo, dest / repo.name.replace("models--google--", f"models--{owner}--"), symlinks=True,
                            copy_function=os.link)
    return dest


def main() -> int:
    """Build the example cache, run every command in both trees, report the differences."""
    base = str(Path(sys.argv[1]).resolve())
    with tempfile.TemporaryDirectory() as tmp:
        cache = Path(tmp) / "hub"
        subprocess.run([sys.executable, str(ROOT / "examples" / "build_example_cache.py"), str(cache)], check=True,
                       capture_output=True)
        caches = {"example": cache, "alike": alike(cache, Path(tmp) / "alike")}
        (Path(tmp) / ARGS_ONLY[0]).write_text(ARGS_ONLY[1])
        differ = runs = 0
        for name, where in caches.items():
            for args in COMMANDS:
                mine = {}
                for memo in (True, False):
                    runs += 1
                    mine[memo] = run(str(ROOT), where, args, tmp, memo)
                    if mine[memo] != run(base, where, args, tmp, memo):
                        differ += 1
                        print(f"differs from the baseline ({name}, memo {'on' if memo else 'off'}): gemma-doctor "
                              + " ".join(args))
                if mine[True] != mine[False]:
                    differ += 1
                    print(f"memo on and off differ ({name}): gemma-doctor " + " ".join(args))
        print(f"{len(COMMANDS)} commands x {len(caches)} caches x memo on/off: {runs} runs, {differ} differ")
        return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main())
