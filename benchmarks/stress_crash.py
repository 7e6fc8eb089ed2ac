"""Stress gemma-doctor's crash and concurrency promises: hundreds of random kills, rounds of parallel runs.

    python benchmarks/stress_crash.py --kills 300 --concurrent-rounds 10 --seed 1
    python benchmarks/stress_crash.py --kills 0 --concurrent-rounds 105 --no-symlinks-rounds 30 --width 8   # 1,080 racing runs

Prints one JSON document of figures (recorded in docs/reliability.md); exits 1 on the first violation, or when any
concurrent run failed spuriously (all of them are counted first).
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


def _codes(report: dict) -> set[tuple[str, str]]:
    """(repo, code) of every finding in a ``check --format json`` report, skipped targets included."""
    found = {(m.get("repo_id") or m.get("target"), f["code"]) for m in report.get("models", []) for f in m.get("findings", [])}
    return found | {(s.get("target", ""), s.get("code", "skipped")) for s in report.get("skipped", []) if isinstance(s, dict)}


def check_baseline(root: Path) -> set[tuple[str, str]]:
    """The findings ``check`` may give while fixes and restores race: those of the original and the fixed cache."""
    assert harness.cli(root, "restore").returncode == 0
    allowed = _codes(json.loads(harness.cli(root, "check", "--format", "json").stdout))
    assert harness.cli(root, "fix", "--inplace").returncode == 0
    allowed |= _codes(json.loads(harness.cli(root, "check", "--format", "json").stdout))
    assert harness.cli(root, "restore").returncode == 0
    return allowed


def _together(root: Path, commands: list[tuple[str, ...]], allowed: set[tuple[str, str]]) -> list[str]:
    """Run ``commands`` at once; one line per spurious failure.

    A fix or restore is spurious when it does not exit 0 (each of them, run alone, exits 0 from any state these
    rounds leave). A check is spurious when it exits other than 0 or 1 (the fixed and the original cache), writes
    to stderr, prints invalid JSON, or reports a finding neither the original nor the fixed cache gives (a
    file seen half-way, a link a sibling was replacing)."""
    procs = [subprocess.Popen(harness._argv(root, *c), env=harness._env(root), stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for c in commands]
    failures = []
    for c, p in zip(commands, procs):
        out, err = p.communicate(timeout=600)
        what = f"{' '.join(c)} exited {p.returncode}"
        if c[0] != "check":
            if p.returncode != 0:
                failures.append(f"{what}: {err.strip()}")
            continue
        if p.returncode not in (0, 1) or err.strip():
            failures.append(f"{what}: {err.strip()}")
            continue
        try:
            extra = _codes(json.loads(out)) - allowed
        except ValueError as e:
            failures.append(f"{what}: invalid JSON ({e})")
            continue
        if extra:
            failures.append(f"{what}: findings neither state gives: {sorted(extra)}")
    return failures


CHECK = ("check", "--format", "json")


def concurrency_rounds(root: Path, exp: harness.Expected, rounds: int, width: int, seed: int) -> dict:
    """Rounds of ``width`` processes at once: all fix, all restore, or a random mix of fix, restore and check;
    the cache is checked against the exact expected state after each.

    Counts every spurious failure (a run that exits non-zero, a check that sees what no state holds), keeping the
    first few; a violation of the end state stops the run (an AssertionError)."""
    rng = random.Random(seed)
    allowed = check_baseline(root)
    runs = 0
    by_kind = {"fix": 0, "restore": 0, "check": 0}
    failures: list[str] = []
    for i in range(rounds):
        kind = ("fix", "restore", "mix")[i % 3]
        if kind == "mix":
            commands = [rng.choice([("fix", "--inplace"), ("restore",), CHECK]) for _ in range(width)]
        else:
            # One check races every all-fix and all-restore round too.
            commands = [("fix", "--inplace") if kind == "fix" else ("restore",)] * (width - 1) + [CHECK]
        failures += _together(root, commands, allowed)
        if (i + 1) % 15 == 0:
            print(f"  round {i + 1}/{rounds}: {len(failures)} spurious failures", file=sys.stderr)
        runs += width
        for c in commands:
            by_kind[c[0]] += 1
        if kind == "mix":
            harness.check_after_kill(root, exp)
            assert harness.cli(root, "restore").returncode == 0
            harness.check_complete(root, exp, "restore")
        else:
            harness.check_complete(root, exp, kind)
    return {"rounds": rounds, "processes_per_round": width, "runs": runs, "by_command": by_kind,
            "spurious_failures": len(failures), "first_failures": failures[:5]}


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
