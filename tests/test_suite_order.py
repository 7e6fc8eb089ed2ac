"""The suite's own order (tests/conftest.py): the known-long modules start first, every module stays whole."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from tests.conftest import LONGEST_FIRST, pytest_collection_modifyitems

ROOT = Path(__file__).resolve().parent.parent


@dataclass
class Item:
    """What the hook reads of a collected test."""

    nodeid: str
    slow: bool = False

    def get_closest_marker(self, name: str) -> object | None:
        return object() if name == "slow" and self.slow else None


def test_every_module_named_longest_first_exists_once():
    # A module renamed or split would silently fall back to the short modules' place, at the end of the run.
    assert len(set(LONGEST_FIRST)) == len(LONGEST_FIRST)
    assert [m for m in LONGEST_FIRST if not (ROOT / m).is_file()] == []


def test_long_modules_come_first_in_their_order_then_the_rest_by_number_of_tests_each_whole():
    first, second = LONGEST_FIRST[0], LONGEST_FIRST[1]
    ids = ["tests/test_a.py::x", "tests/test_b.py::x", "tests/test_b.py::y[1]", f"{second}::p", f"{first}::q",
           "tests/test_b.py::y[0]", f"{second}::o", "tests/test_c.py::x"]
    items = [Item(i) for i in ids]
    pytest_collection_modifyitems(None, items)
    assert [i.nodeid for i in items] == [
        f"{first}::q", f"{second}::p", f"{second}::o",
        "tests/test_b.py::x", "tests/test_b.py::y[1]", "tests/test_b.py::y[0]",
        "tests/test_a.py::x", "tests/test_c.py::x"]


def test_a_module_with_a_slow_test_starts_before_the_short_modules_though_it_has_fewer_tests():
    # A module not ranked yet (one added this round) that builds a venv or trains: by number of tests it would start
    # last, and the run would end with one worker in it and the other idle.
    ids = ["tests/test_many.py::a", "tests/test_many.py::b", "tests/test_many.py::c", "tests/test_new_ranks.py::r",
           "tests/test_few.py::x", f"{LONGEST_FIRST[0]}::q"]
    items = [Item(i, slow=i.endswith("::r")) for i in ids]
    pytest_collection_modifyitems(None, items)
    assert [i.nodeid for i in items] == [
        f"{LONGEST_FIRST[0]}::q", "tests/test_new_ranks.py::r",
        "tests/test_many.py::a", "tests/test_many.py::b", "tests/test_many.py::c", "tests/test_few.py::x"]


def test_the_few_test_minute_long_modules_are_ranked_not_left_to_the_end():
    # Each ran among the last modules by number of tests (2-rank rehearsals 100-230 s, the LEGACY evaluation 80-130 s).
    for module in ("tests/test_rehearse_ranks.py", "tests/test_e2e_transformers450.py", "tests/test_rehearse_venvs.py"):
        assert module in LONGEST_FIRST


def test_the_suites_children_compute_with_one_thread_each(tmp_path):
    # One xdist worker per core already (pyproject addopts): a rehearsal child or a venv reproduction that took
    # min(4, cores) OpenMP threads put its threads on the other worker's core (tests/conftest.py says why).
    from gemma_doctor.rehearse.process import _environment
    from tests.venvs import subprocess_env

    assert _environment(tmp_path)["OMP_NUM_THREADS"] == "1"
    assert _environment(tmp_path, "auto")["OMP_NUM_THREADS"] == "1"
    assert subprocess_env()["OMP_NUM_THREADS"] == "1"


def test_the_timeline_records_each_test_and_says_which_worker_ran_alone_at_the_end(tmp_path, monkeypatch):
    """GEMMA_DOCTOR_TIMELINE (tests/conftest.py) and benchmarks/ci_timeline.py: what a clean-clone run needs to see
    the xdist tail. Off, nothing is written; on, one line per test with its worker and times."""
    import json

    from benchmarks.ci_timeline import read, summary
    from tests import conftest

    path = tmp_path / "timeline.jsonl"

    def protocol(nodeid: str) -> None:
        run = conftest.pytest_runtest_protocol(Item(nodeid), None)  # the hook wrapper, driven as pytest drives it
        next(run)
        try:
            run.send(None)
        except StopIteration:
            pass

    monkeypatch.delenv(conftest.TIMELINE, raising=False)
    protocol("tests/test_a.py::x")
    assert not path.exists()
    monkeypatch.setenv(conftest.TIMELINE, str(path))
    monkeypatch.setenv("PYTEST_XDIST_WORKER", "gw1")
    conftest.pytest_collection_finish(None)
    protocol("tests/test_a.py::y")
    [collected, test] = [json.loads(line) for line in path.read_text().splitlines()]
    assert (collected["worker"], collected["event"]) == ("gw1", "collected")
    assert (test["worker"], test["event"], test["id"]) == ("gw1", "test", "tests/test_a.py::y")
    assert test["start"] <= test["end"]

    # Two workers: gw0 runs a then b, waits 5 s, runs c; gw1 runs d and ends 30 s before gw0.
    lines = [{"worker": "gw0", "event": "collected", "t": 100.0}, {"worker": "gw1", "event": "collected", "t": 101.0},
             *({"worker": w, "event": "test", "id": i, "start": s, "end": e} for w, i, s, e in [
                 ("gw0", "tests/test_a.py::1", 102.0, 110.0), ("gw0", "tests/test_b.py::1", 110.0, 120.0),
                 ("gw0", "tests/test_c.py::1", 125.0, 160.0), ("gw1", "tests/test_d.py::1", 103.0, 130.0)])]
    path.write_text("".join(json.dumps(r) + "\n" for r in lines) + '{"cut sho')
    s = summary(read(path))
    gw0, gw1 = s["workers"]["gw0"], s["workers"]["gw1"]
    assert (gw0["tests"], gw0["busy"], gw0["idle"], gw0["collected"], gw0["first"], gw0["last"]) == \
        (3, 53.0, 5.0, 0.0, 2.0, 60.0)
    assert [m["module"] for m in gw0["modules"]] == ["tests/test_a.py", "tests/test_b.py", "tests/test_c.py"]
    assert (gw1["busy"], gw1["last"]) == (27.0, 30.0)
    assert (s["end"], s["tail"]) == (60.0, 30.0)
