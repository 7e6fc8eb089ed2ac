"""Shared fixtures."""

from __future__ import annotations

import json
import os
import time

import pytest
from hypothesis import HealthCheck, settings
from hypothesis.database import DirectoryBasedExampleDatabase

from tests.builders import HubCache, gemma3_12b_config

# No test reaches the internet. huggingface_hub reads these once, when it is imported, so they are set before any
# test module can import it; the tests that talk to the local Hub (tests/hubserver.py) run the CLI in a subprocess
# with HF_ENDPOINT pointing at it.
os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["HF_ENDPOINT"] = "http://127.0.0.1:9"
# One compute thread per process. The suite runs one xdist worker per core, and every worker starts children that
# train tiny models (the rehearsal's twins, the venv reproductions): each child took min(4, cores) OpenMP threads
# (rehearse/process.py keeps a caller's OMP_NUM_THREADS), so two workers' children put 4 spinning threads on 2
# cores, and a twin's products (hidden 32-64) are too small to gain from a second thread anyway. Measured on the
# 2-core machine (docs/ci.md, "The thirteenth round"): one Gemma 3 text rehearsal's stages after the twin 28-33 s
# with 2 threads, 9.7 s with 1 (CPU 21 s -> 13 s). Set here, before any test imports torch, so that in-process
# torch, every subprocess and every launched rank inherit it; the tests that called torch.set_num_threads(1) did the
# same for their own process. Forced, not defaulted: a caller's setting would change the suite's float reductions.
os.environ["OMP_NUM_THREADS"] = "1"

# Property tests are deterministic by default: the same examples on every run and every machine, and no
# example database in the work tree (a failure saved by one run must not replay on every later one).
# GEMMA_DOCTOR_HYPOTHESIS=explore searches randomly, keeping its database outside the work tree.
# Hypothesis keeps other files too (a cache of the constants below, Unicode tables): outside the work tree as
# well, unless HYPOTHESIS_STORAGE_DIRECTORY says where (benchmarks/hypothesis_runs.py gives each run its own).
os.environ.setdefault("HYPOTHESIS_STORAGE_DIRECTORY",
                      os.path.join(os.path.expanduser("~"), ".cache", "gemma-doctor", "hypothesis"))
# too_slow is the one health check that reads the clock (input generation over 30 s of wall time): on a loaded CI
# machine it fails a run whose examples are exactly those of a passing one. Tests that set their own
# suppress_health_check list name it too, since a test's list replaces the profile's.
# deadline=None in both: Hypothesis's per-example deadline (200 ms by default) is a wall-clock assertion, which a
# loaded CI runner fails at random ("Unreliable test timings"); tests here never assert on time.
settings.register_profile("deterministic", derandomize=True, database=None, print_blob=True, deadline=None,
                          suppress_health_check=[HealthCheck.too_slow])
settings.register_profile("explore", derandomize=False, print_blob=True, deadline=None, database=DirectoryBasedExampleDatabase(
    os.path.join(os.environ["HYPOTHESIS_STORAGE_DIRECTORY"], "examples")))
settings.load_profile(os.environ.get("GEMMA_DOCTOR_HYPOTHESIS", "deterministic"))


def _pin_hypothesis_constants() -> None:
    """Show Hypothesis every source file of ours now, so the examples of a test do not depend on which tests ran first.

    derandomize seeds each test from the test alone, but Hypothesis (6.131 and later) also mixes into its
    examples the literal constants of every "local" module (not stdlib, not site-packages, not a test file)
    that is in sys.modules when the test runs. Which of our modules are imported by then depends on the tests
    that ran before (tests/test_attacker.py imports some that tests/test_hostile_input.py does not), so the
    same test got different examples in a different order. A module object naming each file is enough for
    Hypothesis to read the file's constants (nothing is executed); the real imports later add none.
    """
    import sys
    import types
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    files = [*(root / "gemma_doctor").rglob("*.py"), *(root / "benchmarks").glob("*.py"), *(root / "docs").glob("*.py"),
             *(root / "examples").glob("*.py")]
    for path in sorted(files):
        name = "_gemma_doctor_hypothesis_constants." + ".".join(path.relative_to(root).with_suffix("").parts)
        stub = types.ModuleType(name, "Stands for a source file whose constants Hypothesis reads (tests/conftest.py).")
        stub.__file__ = str(path)
        sys.modules[name] = stub


_pin_hypothesis_constants()


# The modules that take longest, longest first. xdist's --dist loadfile hands whole modules to the workers in
# collection order (with --no-loadscope-reorder, pyproject.toml); its default order is by number of tests, which puts
# the few-test, minute-long modules (a 2-rank rehearsal, a venv build and one evaluation in it) last, and the run then
# ends with one worker in such a module and the other idle. Started first, the many short modules fill in behind them.
# Ranked from the worker seconds of round 10's clean-clone run B (docs/ci.md "The eleventh round"), after this round's
# cuts; the modules of 15-40 s there that were not named (they ran among the short ones, by number of tests) are named
# now: a 35-second module left to the end is the tail of the run. A module missing here starts after these if it has a
# test marked slow (it builds a venv or trains), else with the short ones.
LONGEST_FIRST = (
    "tests/test_rehearse_launch.py",  # 45 tests, each slow one a launched script's child importing the stack
    "tests/test_rehearse.py",
    "tests/test_rehearse_ranks.py",  # 8 tests, 5 children of two CPU ranks each
    "tests/test_distributed.py",  # reproductions with accelerate's own code, one venv (V4_LATE)
    "tests/test_rehearse_llamafactory.py",  # its own venv, then LLaMA-Factory runs
    "tests/test_rehearse_axolotl.py",
    "tests/test_rehearse_preference.py",  # six children (KTO x2, ORPO, reward x2, online DPO)
    "tests/test_rehearse_deepspeed.py",  # DeepSpeed installed, 2 children of 2 ranks each
    "tests/test_hub_hostile.py",
    "tests/test_rehearse_grpo.py",
    "tests/test_crashes_venvs.py",
    "tests/test_rehearse_venvs.py",  # 4 tests, each a rehearsal child in a reproduction venv
    "tests/test_prescription.py",
    "tests/test_e2e_transformers450.py",  # 1 test, 40-130 s with the LEGACY venv: it ran last by count
    "tests/test_pitfalls_repro.py",
    "tests/test_help_options.py",
    "tests/test_deepspeed_batch.py",
    "tests/test_co_user_scans.py",
    "tests/test_after_training_repro.py",
    "tests/test_api.py",
    "tests/test_newest_releases.py",
    "tests/test_attacker.py",
    "tests/test_crash_safety.py",
    "tests/test_cache_layouts.py",
    "tests/test_hub.py",
    "tests/test_install.py",
    "tests/test_twin.py",
    "tests/test_catalogue.py",
    "tests/test_scan_speed.py",
    "tests/test_safetensors_fast.py",
)


def pytest_collection_modifyitems(config, items) -> None:
    """Run the known-long modules first, then the other modules with a slow test, then the rest; within each of the
    last two by number of tests (xdist's own default), each module whole."""
    rank = {module: i for i, module in enumerate(LONGEST_FIRST)}
    count: dict[str, int] = {}
    slow: set[str] = set()
    for item in items:
        module = item.nodeid.split("::", 1)[0]
        count[module] = count.get(module, 0) + 1
        if item.get_closest_marker("slow") is not None:
            slow.add(module)

    def key(item) -> tuple[int, int, int, str]:
        module = item.nodeid.split("::", 1)[0]
        return rank.get(module, len(rank)), module not in slow, -count[module], module

    items.sort(key=key)  # stable: a module's own tests keep their order (module-scoped fixtures, parametrize)


# GEMMA_DOCTOR_TIMELINE=FILE: every test's xdist worker, module, start and end (seconds since the epoch, setup and
# teardown included) appended to FILE, one JSON line each, and each worker's end of collection: what
# benchmarks/ci_timeline.py reads to say how busy each worker was, where it waited, and which module ended the run
# (a long module started late is the run's tail). Off unless set; it reads the clock and asserts nothing.
TIMELINE = "GEMMA_DOCTOR_TIMELINE"


def _timeline(**record) -> None:
    path = os.environ.get(TIMELINE)
    if path:
        line = json.dumps({"worker": os.environ.get("PYTEST_XDIST_WORKER", "main"), **record}) + "\n"
        with open(path, "a", encoding="utf-8") as f:  # one short append per line: the workers' lines never interleave
            f.write(line)


def pytest_collection_finish(session) -> None:
    _timeline(event="collected", t=time.time())


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    start = time.time()
    yield
    _timeline(event="test", id=item.nodeid, start=start, end=time.time())


@pytest.fixture
def hub(tmp_path) -> HubCache:
    """An empty hub cache in a temporary folder."""
    return HubCache(tmp_path / "hub")


# A release inside the HybridCache window (transformers 4.50.0-4.50.3): the on-disk fix is planned only where
# the crash can happen with the transformers that will run, and the main test venv has transformers 5.x.
PLANNED_450 = "transformers==4.50.3"


@pytest.fixture(scope="module")
def examples(tmp_path_factory):
    """The bundled example cache (gemma-3-12b-it and gemma-4-E2B-it, real safetensors headers), built once per module
    that reads it (a module defining its own ``examples`` keeps its own)."""
    from tests.builders import build_example_cache

    cache = tmp_path_factory.mktemp("examples") / "hub"
    build_example_cache(cache)
    return cache


@pytest.fixture
def plan_450(monkeypatch):
    """Plan every command for a training machine with transformers 4.50.3 (GEMMA_DOCTOR_WITH, as a CI job would)."""
    monkeypatch.setenv("GEMMA_DOCTOR_WITH", PLANNED_450)
    return PLANNED_450


@pytest.fixture
def model(tmp_path):
    """A local model folder holding Gemma 3 12B's config.json alone (the launch and DeepSpeed readers' tests plan it; a
    module's own ``model`` fixture takes precedence)."""
    folder = tmp_path / "model"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(gemma3_12b_config()))
    return folder


@pytest.fixture(autouse=True)
def _isolated_env(monkeypatch, tmp_path):
    """No test ever sees the developer's real cache, accelerate config or colour settings."""
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "default-hub"))
    # accelerate's default config ($HF_HOME/accelerate/default_config.yaml) is read for an `accelerate launch` line
    # without --config_file (readers/launch.py): a developer's own must not change what a test plans.
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf-home"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.delenv("NO_COLOR", raising=False)
    for name in ("GEMMA_DOCTOR_WITH", "GEMMA_DOCTOR_REQUIREMENTS", "GEMMA_DOCTOR_WORKERS"):
        monkeypatch.delenv(name, raising=False)


@pytest.fixture(scope="module", autouse=True)
def _way_outs_per_module():
    """Each test module starts with no way out remembered (plan/search.py's _WAY_OUTS, a process-wide cache): what a
    module's tests see never depends on the modules an xdist worker ran before it, and a module that changes what a
    search reads (a patched rule or table) cannot meet another module's answer. A module's own tests share it."""
    import sys

    search = sys.modules.get("gemma_doctor.plan.search")  # not imported here: a module that never searches pays nothing
    if search is not None:
        search._WAY_OUTS.clear()
    yield


# cli.py's exit code for an exception nothing else handled (EX_SOFTWARE).
INTERNAL_ERROR = 70


class CliResult:
    """What one in-process CLI run produced."""

    def __init__(self, code: int, out: str, err: str) -> None:
        self.code, self.out, self.err = code, out, err

    def json(self):
        import json

        return json.loads(self.out)

    def __repr__(self) -> str:
        return f"CliResult(code={self.code}, out={self.out[:2000]!r}, err={self.err[:2000]!r})"


@pytest.fixture
def cli(capsys):
    """Run gemma-doctor in-process like the console script: cli(*args) -> CliResult."""
    from gemma_doctor.cli import main

    def run(*args: str) -> CliResult:
        capsys.readouterr()
        try:
            main([str(a) for a in args])
            code = 0
        except SystemExit as e:
            code = int(e.code or 0)
        out, err = capsys.readouterr()
        # Whatever the input (a hostile cache, a broken config), an unexpected exception is a bug: no test may
        # accept cli.py's internal-error exit, even one that only checks that a run "failed".
        assert code != INTERNAL_ERROR, f"internal error (exit 70) from gemma-doctor {' '.join(map(str, args))}: {err[-3000:]}"
        return CliResult(code, out, err)

    return run
