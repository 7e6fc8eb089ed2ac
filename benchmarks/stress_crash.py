"""Stress gemma-doctor's crash and concurrency promises: hundreds of random kills, rounds of parallel runs.

    python benchmarks/stress_crash.py --kills 300 --concurrent-rounds 10 --seed 1

Prints one JSON document of figures (recorded in docs/reliability.md); exits 1 on the first violation.
Baseline: the same cache fixed and restored by uninterrupted runs, measured in the same process.
"""

from __future__ import annotations

import argparse
import json
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests import crash_harness as harness  # noqa: E402


def _together(root: Path, commands: list[tuple[str, ...]]) -> list[str]:
    """Run ``commands`` at once; the stderr of every one that did not exit 0 (a spurious failure: each of them,
    run alone, exits 0 from any state these rounds leave)."""
    procs = [subprocess.Popen(harness._argv(root, *c), env=harness._env(root), stdout=subprocess.DEVNULL,
                              stderr=subprocess.PIPE, text=True) for c in commands]
    failures = []
    for c, p in zip(commands, procs):
        _, err = p.communicate(timeout=600)
        if p.returncode != 0:
            failures.append(f"{' '.join(c)} exited {p.returncode}: {err.strip()}")
    return failures


def concurrency_rounds(root: Path, exp: harness.Expected, rounds: int, width: int, seed: int) -> dict:
    """Rounds of ``width`` processes at once: all fix, all restore, or a random mix; check after each.

    Stops at the first spurious failure (a run that exits non-zero), reporting it."""
    rng = random.Random(seed)
    runs = 0
    by_kind = {"fix": 0, "restore": 0}
    for i in range(rounds):
        kind = ("fix", "restore", "mix")[i % 3]
        if kind == "mix":
            commands = [rng.choice([("fix", "--inplace"), ("restore",)]) for _ in range(width)]
        else:
            commands = [("fix", "--inplace") if kind == "fix" else ("restore",)] * width
        failures = _together(root, commands)
        runs += width
        for c in commands:
            by_kind[c[0]] += 1
        if failures:
            return {"rounds": i + 1, "processes_per_round": width, "runs": runs, "by_command": by_kind,
                    "spurious_failures": len(failures), "first_failure": failures[0]}
        if kind == "mix":
            harness.check_after_kill(root, exp)
            assert harness.cli(root, "restore").returncode == 0
            runs += 1
            harness.check_complete(root, exp, "restore")
        else:
            harness.check_complete(root, exp, kind)
    return {"rounds": rounds, "processes_per_round": width, "runs": runs, "by_command": by_kind, "spurious_failures": 0}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--kills", type=int, default=300, help="random SIGKILL/SIGINT interruptions")
    ap.add_argument("--concurrent-rounds", type=int, default=9, help="rounds on the cache with links")
    ap.add_argument("--no-symlinks-rounds", type=int, default=3, help="rounds on the cache without symlinks")
    ap.add_argument("--width", type=int, default=6, help="processes started at once per round")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--extra-repos", type=int, default=12, help="more repos widen the writing window")
    ap.add_argument("--no-symlinks-share", type=float, default=0.2,
                    help="share of kills run on a cache without symlinks (HF_HUB_DISABLE_SYMLINKS layout)")
    args = ap.parse_args()

    figures: dict = {"command": " ".join(["python", "benchmarks/stress_crash.py", *sys.argv[1:]]), "python": sys.version.split()[0]}
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="gd-stress-") as tmp:
        for layout, share in (("links", 1 - args.no_symlinks_share), ("no-symlinks", args.no_symlinks_share)):
            kills = round(args.kills * share)
            print(f"{layout}: {kills} kills, then concurrent rounds", file=sys.stderr)
            root = Path(tmp) / layout / "hub"
            harness.build_cache(root, symlinks=layout == "links", extra_repos=args.extra_repos)
            exp = harness.expected_states(root, Path(tmp) / layout / "scratch")
            n_files = sum(1 for k in exp.original if exp.original[k] != exp.fixed[k])
            stats = harness.kill_loop(root, exp, kills, seed=args.seed, log=lambda m: print(m, file=sys.stderr))
            block = {"repos": len({k.split('/')[0] for k in exp.original}), "files_rewritten_per_fix": n_files,
                     "uninterrupted_seconds": {"fix": round(exp.fix_seconds, 3), "dry_run": round(exp.dry_run_seconds, 3),
                                               "restore": round(exp.restore_seconds, 3)},
                     **stats.summary()}
            if stats.violations:
                block["first_violation"] = stats.violations[0]
                figures[layout] = block
                print(json.dumps(figures, indent=2))
                return 1
            if args.concurrent_rounds:
                block["concurrency"] = concurrency_rounds(
                    root, exp, args.concurrent_rounds if layout == "links" else args.no_symlinks_rounds, args.width, args.seed)
            figures[layout] = block
            if block.get("concurrency", {}).get("spurious_failures"):
                print(json.dumps(figures, indent=2))
                return 1
    figures["seconds"] = round(time.perf_counter() - started, 1)
    print(json.dumps(figures, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
