"""A whole-cache scan spread over processes (gemma_doctor/parallel.py) says exactly what the scan in one process says,
whatever the number of workers, whatever a worker meets: an error, a death, a result it cannot hand back."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from gemma_doctor import parallel
from gemma_doctor.errors import UsageError
from tests.builders import HubCache, gemma2_config, gemma3_12b_config, generation_config, llama_config, variant

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def mixed_cache(tmp_path_factory) -> Path:
    """The bundled examples, fine-tunes equal but for their names, unalike Gemmas, non-Gemma repos, an adapter, a
    repo folder whose name is not a repo's, a repo whose ref names a missing snapshot, a config that is not JSON."""
    cache = tmp_path_factory.mktemp("mixed") / "hub"
    subprocess.run([sys.executable, str(ROOT / "examples" / "build_example_cache.py"), str(cache)], check=True,
                   capture_output=True)
    hub = HubCache(cache)
    gem, gen = gemma3_12b_config(), generation_config()
    for i in range(12):
        text = dict(gem["text_config"], num_hidden_layers=8 + i % 3)
        hub.add(f"team/tune-{i:02d}", {"config.json": variant(gem, text_config=text, _name_or_path=f"/runs/{i}"),
                                       "generation_config.json": gen})
        hub.add(f"other/llama-{i:02d}", {"config.json": llama_config()})
    hub.add("team/gemma2", {"config.json": gemma2_config()})
    hub.add("team/adapter", {"adapter_config.json": {"base_model_name_or_path": "team/tune-00", "peft_type": "LORA",
                                                     "r": 8, "target_modules": ["q_proj"]}})
    hub.add("team/not-json", {"config.json": b"{not json"})
    (cache / "models--bad name--x" / "snapshots").mkdir(parents=True)
    missing = cache / "models--team--gone" / "refs"
    missing.mkdir(parents=True)
    (missing / "main").write_text("0" * 40)
    return cache


SCANS = [("check", "--format", "json"), ("check", "--format", "text"), ("check", "--format", "github"),
         ("check", "--all-revisions", "--format", "json"), ("check", "--gpu", "T4", "--format", "text"),
         ("list", "--format", "json"), ("list", "--format", "text"), ("list", "--all-revisions", "--format", "json")]


@pytest.mark.parametrize("args", SCANS, ids=" ".join)
def test_any_number_of_workers_says_what_one_process_says(cli, mixed_cache, monkeypatch, args):
    forks = []
    real_fork = os.fork

    def fork():
        forks.append(1)
        return real_fork()

    monkeypatch.setattr(os, "fork", fork)
    runs = {}
    for workers in ("1", "2", "3", "7"):
        monkeypatch.setenv("GEMMA_DOCTOR_WORKERS", workers)
        extra = ("--fail-on", "never") if args[0] == "check" else ()
        got = cli(*args, "--cache-dir", mixed_cache, *extra)
        runs[workers] = (got.code, got.out, got.err)
    assert runs["1"][1], "the scan printed nothing"
    assert len(forks) == 1 + 2 + 6  # the scans compared were really spread over processes
    assert runs["2"] == runs["1"] == runs["3"] == runs["7"]


def test_a_scan_forks_the_workers_it_says(mixed_cache, monkeypatch):
    """The workers really run the repos after the first run (their process ids are not the scan's): the comparison
    above compares two ways of working, not one way twice."""
    from gemma_doctor import pipeline

    pids: set[int] = set()
    real = pipeline.select_sources

    def select_sources(located, explicit):
        located = list(located)
        pids.add(os.getpid())
        return real(located, explicit)

    monkeypatch.setattr(pipeline, "select_sources", select_sources)
    monkeypatch.setenv("GEMMA_DOCTOR_WORKERS", "3")
    # a worker's own pid cannot come back through the monkeypatched function; it comes back in what it read
    seen = parallel.map_runs(lambda part: (os.getpid(), list(part)), list(range(9)))
    assert [p for p, _ in seen][0] == os.getpid() and len({p for p, _ in seen}) == 3
    assert [x for _, part in seen for x in part] == list(range(9))
    pipeline.diagnose([], mixed_cache)
    assert pids == {os.getpid()}  # the parent's run; the workers' calls happened in their own processes


def test_runs_are_contiguous_and_cover_everything():
    for n in range(1, 9):
        for size in range(0, 30):
            runs = parallel.chunks(list(range(size)), n)
            assert len(runs) == n and [x for r in runs for x in r] == list(range(size))
            assert max(map(len, runs)) - min(map(len, runs)) <= 1


def test_worker_count(monkeypatch):
    monkeypatch.setenv("GEMMA_DOCTOR_WORKERS", "4")
    assert parallel.workers(1000) == 4 and parallel.workers(3) == 3
    monkeypatch.setenv("GEMMA_DOCTOR_WORKERS", "not a number")
    assert parallel.workers(1000) == 1
    monkeypatch.delenv("GEMMA_DOCTOR_WORKERS")
    assert parallel.workers(parallel.PER_WORKER - 1) == 1  # a small cache is scanned in one process
    assert 1 <= parallel.workers(100_000) <= parallel.MAX_WORKERS


def _dies_in_a_worker(part):
    if os.getpid() != _PARENT:
        os.kill(os.getpid(), signal.SIGKILL)
    return [x * 2 for x in part]


def _unpicklable_in_a_worker(part):
    if os.getpid() != _PARENT:
        return [lambda: x for x in part]  # a result pickle refuses
    return [x * 2 for x in part]


_PARENT = os.getpid()


@pytest.mark.parametrize("fn", [_dies_in_a_worker, _unpicklable_in_a_worker])
def test_a_worker_that_delivers_nothing_costs_time_not_a_result(fn):
    assert _PARENT == os.getpid()
    got = parallel.map_runs(fn, list(range(10)), 3)
    assert [x for part in got for x in part] == [x * 2 for x in range(10)]


def test_an_error_is_raised_in_order():
    """The first run's error wins, as in the sequential scan, whichever worker met its error first."""

    def fn(part):
        if 7 in part:
            raise UsageError("seven")
        if 2 in part:
            raise UsageError("two")
        return list(part)

    with pytest.raises(UsageError, match="^two$"):
        parallel.map_runs(fn, list(range(9)), 3)
    with pytest.raises(UsageError, match="^seven$"):
        parallel.map_runs(fn, [0, 1, 3, 4, 5, 6, 7, 8], 2)


def test_no_worker_is_left_behind(monkeypatch):
    """Every worker is waited for (no zombie): the parent has no child left after a scan, errors included."""
    def fn(part):
        if 5 in part:
            raise UsageError("five")
        return list(part)

    with pytest.raises(UsageError):
        parallel.map_runs(fn, list(range(10)), 4)
    parallel.map_runs(lambda part: list(part), list(range(10)), 4)
    with pytest.raises(ChildProcessError):
        os.waitpid(-1, os.WNOHANG)
