"""Run every property test (hypothesis) many times, each in a fresh copy of the work tree, and count failures.

Each run copies the tracked files (and untracked ones git does not ignore) to a new temporary folder, so no
``.hypothesis/`` folder, example database or constants cache survives from an earlier run, and runs
``pytest`` there on the tests whose source uses ``@given`` (tests/test_render_plain.py among them), with
Hypothesis's storage in the run's own folder. For every test it also records a digest of the examples
Hypothesis generated (the choice sequence of each test case, through Hypothesis's observability callback),
so the report shows whether a profile really produces the same examples on every run and in every order.

    .venv/bin/python benchmarks/hypothesis_runs.py --runs 50                       # CI profile, 50 fresh runs
    .venv/bin/python benchmarks/hypothesis_runs.py --profile explore --runs 10     # seeds 0..9
    .venv/bin/python benchmarks/hypothesis_runs.py --orders                        # same examples in any order?

``--orders`` runs the CI profile with the test files in their order, in reverse order, and each file alone,
and reports every test whose examples differ between those runs (none, since tests/conftest.py pins the pool
of constants Hypothesis mixes into its examples: docs/mutation.md).

This module is also the pytest plugin each run loads (``-p hypothesis_runs``): it deselects the tests that
use no ``@given`` and writes the digests.
"""

from __future__ import annotations

import argparse
import hashlib
import inspect
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DIGESTS_ENV = "GD_HYPOTHESIS_RUNS_DIGESTS"


# --- the plugin (runs inside each pytest) -------------------------------------------------------------

def _uses_given(item) -> bool:  # noqa: ANN001
    fn = getattr(item, "function", None)
    if fn is None:
        return False
    if getattr(fn, "is_hypothesis_test", False):
        return True
    try:
        return "@given" in inspect.getsource(fn)  # an inner @given (a property run per parametrised case)
    except (OSError, TypeError):
        return False


def pytest_collection_modifyitems(config, items) -> None:  # noqa: ANN001
    """Keep only the property tests."""
    keep = [i for i in items if _uses_given(i)]
    drop = [i for i in items if not _uses_given(i)]
    if drop:
        config.hook.pytest_deselected(items=drop)
    items[:] = keep


_digests: dict[str, hashlib._Hash] = {}
_counts: dict[str, int] = {}


def _observe(observation) -> None:  # noqa: ANN001
    if getattr(observation, "type", None) != "test_case":
        return
    node = os.environ.get("PYTEST_CURRENT_TEST", "?").rsplit(" (", 1)[0]
    nodes = observation.metadata.choice_nodes
    from hypothesis.internal.observability import nodes_to_json

    choices = json.dumps(nodes_to_json(nodes) if nodes is not None else None, sort_keys=True, default=repr)
    _digests.setdefault(node, hashlib.sha256()).update(choices.encode() + b"\n")
    _counts[node] = _counts.get(node, 0) + 1


def pytest_configure(config) -> None:  # noqa: ANN001
    """Record the examples of every property test when the runner asked for it."""
    if os.environ.get(DIGESTS_ENV):
        from hypothesis.internal.observability import add_observability_callback

        add_observability_callback(_observe)


def pytest_unconfigure(config) -> None:  # noqa: ANN001
    """Write the digests (and where gemma_doctor was imported from, to show the copy was tested)."""
    out = os.environ.get(DIGESTS_ENV)
    if out:
        import gemma_doctor

        Path(out).write_text(json.dumps({"gemma_doctor": gemma_doctor.__file__,
                                         "tests": {k: {"digest": v.hexdigest()[:16], "cases": _counts[k]}
                                                   for k, v in sorted(_digests.items())}}))


# --- the runner -----------------------------------------------------------------------------------------

def property_test_files() -> list[str]:
    """Test files that use @given, in name order."""
    return sorted(str(p.relative_to(ROOT)) for p in (ROOT / "tests").glob("test_*.py") if "@given" in p.read_text())


def fresh_copy(dst: Path) -> None:
    """The work tree as git sees it (tracked + untracked not ignored) without any cache: no .hypothesis/."""
    listed = subprocess.run(["git", "ls-files", "-z", "-co", "--exclude-standard"], cwd=ROOT, check=True,
                            capture_output=True).stdout.decode().split("\0")
    for rel in filter(None, listed):
        src = ROOT / rel
        if not src.exists() and not src.is_symlink():
            continue  # deleted in the work tree, not yet in git
        target = dst / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(src, target, follow_symlinks=False)
    assert not (dst / ".hypothesis").exists()


def run_once(files: list[str], profile: str, seed: int | None, keep_going: bool = True) -> dict:
    """One fresh run: returns rc, failed test ids, digests per test, seconds."""
    with tempfile.TemporaryDirectory(prefix="gd-hypothesis-") as tmp:
        work = Path(tmp) / "repo"
        fresh_copy(work)
        digests = Path(tmp) / "digests.json"
        env = {**os.environ, "GEMMA_DOCTOR_HYPOTHESIS": profile,
               "HYPOTHESIS_STORAGE_DIRECTORY": str(Path(tmp) / "hypothesis-home"),
               "HYPOTHESIS_EXPERIMENTAL_OBSERVABILITY_CHOICES": "1",
               "HYPOTHESIS_EXPERIMENTAL_OBSERVABILITY_NOCOVER": "1",
               DIGESTS_ENV: str(digests),
               "PYTHONPATH": os.pathsep.join([str(work), str(work / "benchmarks")])}
        cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-o", "addopts=", "-p", "no:xdist", "-p", "hypothesis_runs",
               "-m", "not slow", "-rf", *files]
        if seed is not None:
            cmd.append(f"--hypothesis-seed={seed}")
        started = time.monotonic()
        done = subprocess.run(cmd, cwd=work, env=env, capture_output=True, text=True)
        seconds = time.monotonic() - started
        failed = [line.split(" ", 2)[1] for line in done.stdout.splitlines() if line.startswith("FAILED ")]
        got = json.loads(digests.read_text()) if digests.exists() else {"gemma_doctor": None, "tests": {}}
        if got["gemma_doctor"] and not got["gemma_doctor"].startswith(str(work)):
            sys.exit(f"the run imported gemma_doctor from {got['gemma_doctor']}, not from the fresh copy")
        if done.returncode not in (0, 1):
            sys.exit(f"pytest could not run (exit {done.returncode}):\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
        return {"rc": done.returncode, "failed": failed, "tests": got["tests"], "seconds": round(seconds, 1),
                "summary": done.stdout.strip().splitlines()[-1] if done.stdout.strip() else ""}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runs", type=int, default=50, help="fresh runs (default 50)")
    p.add_argument("--profile", choices=("deterministic", "explore"), default="deterministic",
                   help="tests/conftest.py profile: deterministic (CI, the default) or explore (random, seeded per run)")
    p.add_argument("--first-seed", type=int, default=0, help="explore: run i uses --hypothesis-seed=FIRST_SEED+i")
    p.add_argument("--orders", action="store_true",
                   help="instead: the CI profile with the files in order, reversed and one by one; compare examples")
    p.add_argument("--file", action="append", help="a test file (repeatable); default: every file using @given")
    p.add_argument("--out", type=Path, help="write the JSON report here too (after every run: partial until the end)")
    p.add_argument("--jobs", type=int, default=1, help="runs at once (default 1)")
    args = p.parse_args(argv)
    files = args.file or property_test_files()
    runs: list[dict] = []
    if args.orders:
        plans = [("in order", files), ("reversed", files[::-1])] + [(f"{f} alone", [f]) for f in files]
        for label, these in plans:
            r = run_once(these, "deterministic", None)
            r["label"] = label
            runs.append(r)
            print(f"{label:40} {r['summary']}  ({r['seconds']} s)", file=sys.stderr, flush=True)
    else:
        import threading
        from concurrent.futures import ThreadPoolExecutor

        lock = threading.Lock()

        def one(i: int) -> dict:
            seed = args.first_seed + i if args.profile == "explore" else None
            r = {**run_once(files, args.profile, seed), "seed": seed}
            with lock:
                runs.append(r)
                print(f"run {len(runs)}/{args.runs}{'' if seed is None else f' seed {seed}'}: {r['summary']} "
                      f"({r['seconds']} s)" + (f" FAILED {r['failed']}" if r["failed"] else ""), file=sys.stderr, flush=True)
                if args.out:  # a partial report after every run, so a stopped series still counts
                    _write(args.out, _report(args, files, runs, partial=len(runs) < args.runs))
            return r

        with ThreadPoolExecutor(max(1, args.jobs)) as pool:
            list(pool.map(one, range(args.runs)))
    report = _report(args, files, runs)
    text = json.dumps(report, indent=1)
    print(text)
    if args.out:
        _write(args.out, report)
    return 0 if report["failed_runs"] == 0 and (args.profile == "explore" or not report["tests_with_differing_examples"]) else 1


def _report(args: argparse.Namespace, files: list[str], runs: list[dict], partial: bool = False) -> dict:
    """Failures, and per test how many different example sequences the runs produced."""
    variants: dict[str, set[str]] = {}
    for r in runs:
        for test, v in r["tests"].items():
            variants.setdefault(test, set()).add(v["digest"])
    return {"profile": "deterministic" if args.orders else args.profile, "orders": args.orders, "files": files,
            "partial": partial, "runs": len(runs), "failed_runs": sum(r["rc"] != 0 for r in runs),
            "failures": [{"seed": r.get("seed"), "label": r.get("label"), "failed": r["failed"]} for r in runs if r["rc"] != 0],
            "seeds": sorted(r["seed"] for r in runs if r.get("seed") is not None),
            "property_tests": len(variants),
            "tests_with_differing_examples": sorted(t for t, v in variants.items() if len(v) > 1),
            "seconds_per_run": round(sum(r["seconds"] for r in runs) / max(1, len(runs)), 1),
            # One digest of every test's examples per run: equal digests, equal examples (for the same tree).
            "examples_per_run": [hashlib.sha256(json.dumps(r["tests"], sort_keys=True).encode()).hexdigest()[:16]
                                 for r in runs],
            "python": sys.version.split()[0], "hypothesis": _version("hypothesis")}


def _write(path: Path, report: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(report, indent=1) + "\n")
    os.replace(tmp, path)


def _version(name: str) -> str:
    from importlib.metadata import version

    return version(name)


if __name__ == "__main__":
    sys.exit(main())
