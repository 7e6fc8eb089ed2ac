"""A whole-cache scan spread over processes (gemma_doctor/parallel.py) says exactly what the scan in one process says,
whatever the number of workers, whatever a worker meets: an error, a death, a result it cannot hand back."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from gemma_doctor import parallel
from tests.builders import (HubCache, build_example_cache, gemma2_config, gemma3_12b_config, generation_config,
                            llama_config, variant)

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def mixed_cache(tmp_path_factory) -> Path:
    """The bundled examples, fine-tunes equal but for their names, unalike Gemmas, non-Gemma repos, an adapter, a
    repo folder whose name is not a repo's, a repo whose ref names a missing snapshot, a config that is not JSON."""
    cache = tmp_path_factory.mktemp("mixed") / "hub"
    build_example_cache(cache)
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

# Run in a fresh interpreter: a process with other threads is never forked (parallel.map_runs), and a test process
# may have some left by earlier tests. Each run: (workers, exit code, stdout, stderr, forks made).
_DRIVER = """
import io, json, os, sys, contextlib
from gemma_doctor.cli import main
forks = []
real_fork = os.fork
def fork():
    forks.append(1)
    return real_fork()
os.fork = fork
out = []
for workers in json.loads(sys.argv[1]):
    os.environ["GEMMA_DOCTOR_WORKERS"] = workers
    before = len(forks)
    o, e = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(o), contextlib.redirect_stderr(e):
        try:
            main(json.loads(sys.argv[2]))
            code = 0
        except SystemExit as x:
            code = int(x.code or 0)
    out.append([workers, code, o.getvalue(), e.getvalue(), len(forks) - before])
print(json.dumps(out))
"""


def _fresh(args: list[str], workers: list[str]) -> list[list]:
    env = {k: v for k, v in os.environ.items() if k != "GEMMA_DOCTOR_WORKERS"}
    got = subprocess.run([sys.executable, "-c", _DRIVER, json.dumps(workers), json.dumps(args)], capture_output=True,
                         text=True, cwd=ROOT, env=env, timeout=300)
    assert got.returncode == 0, got.stderr[-3000:]
    return json.loads(got.stdout)


@pytest.mark.parametrize("args", SCANS, ids=" ".join)
def test_any_number_of_workers_says_what_one_process_says(mixed_cache, args):
    extra = ["--fail-on", "never"] if args[0] == "check" else []
    runs = _fresh([*args, "--cache-dir", str(mixed_cache), *extra], ["1", "2", "3", "7"])
    assert [r[4] for r in runs] == [0, 1, 2, 6]  # the scans compared were really spread over processes
    one = runs[0][1:4]
    assert one[1], "the scan printed nothing"
    assert one[0] != 70
    for r in runs[1:]:
        assert r[1:4] == one, r[0]


_MAP = """
import json, os, sys, signal
import time
from gemma_doctor import parallel
from gemma_doctor.errors import UsageError
parent = os.getpid()
case = sys.argv[1]
def dies(part):
    if os.getpid() != parent:
        os.kill(os.getpid(), signal.SIGKILL)
    return [x * 2 for x in part]
def unpicklable(part):
    if os.getpid() != parent:
        return [lambda: x for x in part]
    return [x * 2 for x in part]
def raises(part):
    if 7 in part:
        raise UsageError("seven")
    if 2 in part:
        raise UsageError("two")
    return list(part)
def pids(part):
    return [os.getpid(), list(part)]
MESSAGES = {"late": "the run came late"}
class Looked(Exception):  # pickled as its message: unpickling looks the message up as a key (KeyError)
    def __init__(self, key):
        super().__init__(MESSAGES[key])
def looked(part):
    if 5 in part:
        raise Looked("late")
    return list(part)
def slow(part):
    if os.getpid() != parent:
        time.sleep(20)
    return list(part)
def interrupt(signum, frame):
    raise KeyboardInterrupt
out = {}
try:
    if case == "dies":
        out["got"] = parallel.map_runs(dies, list(range(10)), 3)
    elif case == "unpicklable":
        out["got"] = parallel.map_runs(unpicklable, list(range(10)), 3)
    elif case == "raises":
        for items in (list(range(9)), [0, 1, 3, 4, 5, 6, 7, 8]):
            try:
                parallel.map_runs(raises, items, 3 if len(items) == 9 else 2)
            except UsageError as e:
                out.setdefault("raised", []).append(str(e))
    elif case == "looked":
        try:
            parallel.map_runs(looked, list(range(10)), 3)
        except Exception as e:
            out["raised"] = [type(e).__name__, str(e)]
    elif case == "interrupted":
        signal.signal(signal.SIGALRM, interrupt)
        signal.setitimer(signal.ITIMER_REAL, 1.0)
        try:
            parallel.map_runs(slow, list(range(10)), 2)
        except KeyboardInterrupt:
            out["raised"] = ["KeyboardInterrupt"]
    elif case == "pids":
        got = parallel.map_runs(pids, list(range(9)), 3)
        out["parent"] = parent
        out["got"] = got
finally:
    try:
        os.waitpid(-1, os.WNOHANG)
        out["children_left"] = True
    except ChildProcessError:
        out["children_left"] = False
print(json.dumps(out))
"""


def _map(case: str) -> dict:
    got = subprocess.run([sys.executable, "-c", _MAP, case], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert got.returncode == 0, got.stderr[-3000:]
    return json.loads(got.stdout)


def test_the_runs_after_the_first_are_worked_in_other_processes():
    got = _map("pids")
    assert got["got"][0][0] == got["parent"] and len({p for p, _ in got["got"]}) == 3
    assert [x for _, part in got["got"] for x in part] == list(range(9))
    assert got["children_left"] is False


@pytest.mark.parametrize("case", ["dies", "unpicklable"])
def test_a_worker_that_delivers_nothing_costs_time_not_a_result(case):
    """A worker killed, or one whose result pickle refuses, has its run done again in the parent."""
    got = _map(case)
    assert [x for part in got["got"] for x in part] == [x * 2 for x in range(10)]
    assert got["children_left"] is False


def test_an_error_is_raised_in_order_and_every_worker_is_waited_for():
    """The first run's error wins, as in the sequential scan, whichever worker met its error first; no worker is left
    behind (no zombie) after an error."""
    got = _map("raises")
    assert got["raised"] == ["two", "seven"]
    assert got["children_left"] is False


def test_an_error_that_does_not_unpickle_is_the_error_the_run_raises_here():
    """A worker's error whose type cannot be rebuilt from its pickle (an __init__ that looks its argument up: KeyError,
    not only the TypeError of a changed signature) is not raised as that failure: its run is done again here."""
    got = _map("looked")
    assert got["raised"] == ["Looked", "the run came late"]
    assert got["children_left"] is False


def test_an_interrupt_while_waiting_for_a_worker_leaves_no_worker_behind():
    """Ctrl-C (here an alarm raising KeyboardInterrupt) while the parent waits for a worker: the interrupt is raised,
    and that worker too is stopped and waited for (not left running on, nor a zombie)."""
    got = _map("interrupted")
    assert got["raised"] == ["KeyboardInterrupt"]
    assert got["children_left"] is False


def test_a_process_with_other_threads_is_not_forked(monkeypatch):
    import threading

    stop = threading.Event()
    t = threading.Thread(target=stop.wait, daemon=True)
    t.start()
    try:
        forks = []
        monkeypatch.setattr(os, "fork", lambda: forks.append(1) or 0)
        assert parallel.map_runs(lambda part: [os.getpid()] * len(part), list(range(6)), 3) == [[os.getpid()] * 6]
        assert forks == []
    finally:
        stop.set()
        t.join()


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


def test_lines_made_in_the_workers_are_the_lines_the_view_makes(mixed_cache, monkeypatch):
    """render/text.with_block (each model's colourless lines, made where it was judged) prints exactly what the text
    view prints from the bare reports, and the colour view ignores the blocks."""
    from gemma_doctor import pipeline
    from gemma_doctor.render import text
    from gemma_doctor.report import FailOn

    from gemma_doctor.render import jsonout

    monkeypatch.setenv("GEMMA_DOCTOR_WORKERS", "1")
    bare = pipeline.diagnose([], mixed_cache)
    made = pipeline.diagnose([], mixed_cache, finish=text.with_block)
    dumped = pipeline.diagnose([], mixed_cache, finish=jsonout.with_json)
    assert all(m.block for m in made.models) and all(m.block is None for m in bare.models)
    for fail_on in FailOn:
        assert text.render_report(made, fail_on, False) == text.render_report(bare, fail_on, False)
        assert text.render_report(made, fail_on, True) == text.render_report(bare, fail_on, True)
        assert jsonout.render_report(dumped, fail_on) == jsonout.render_report(bare, fail_on)
        # a block of another view is never taken for this one's
        assert jsonout.render_report(made, fail_on) == jsonout.render_report(bare, fail_on)
        assert text.render_report(dumped, fail_on, False) == text.render_report(bare, fail_on, False)
    assert made == bare == dumped  # the block is no part of a report's value


def test_json_entries_written_apart_are_the_document_dumped_whole():
    """jsonout.with_json + render_report's splice against one dumps() of the whole document, where JSON cannot hold
    a number (NaN, infinity, a 5,000-digit integer: converted wherever they are), with characters a terminal acts
    on, with no model, and with a value that spells the "models" key itself."""
    from dataclasses import replace

    from gemma_doctor.render import jsonout
    from gemma_doctor.report import FailOn, Finding, ModelReport, Report, Severity

    finding = Finding("GD101", Severity.ERROR, "use_cache is on\u2028 [x]", file="config.json")
    models = [ModelReport("a/b", "/p/a", "a/b", "main", "0" * 40, "gemma3", (finding,),
                          extra={"x": float("nan"), "y": [1.5, float("inf")], "big": 10 ** 5000, "s": "\x1b[31m"}),
              ModelReport("c/d", "/p/c", "c/d", "main", "1" * 40, "gemma3", (),
                          extra={"note": '\n  "models": []', "nested": {"models": []}})]
    for env in ({"python": "3.11"}, {"bad": float("nan")}):
        for chosen in (models, models[:1], []):
            report = Report(models=tuple(chosen), environment=env, skipped=({"target": "x/y", "path": "/p",
                                                                             "reason": "r"},), cache_dir="/c")
            written = replace(report, models=tuple(jsonout.with_json(m) for m in chosen))
            for fail_on in FailOn:
                assert jsonout.render_report(written, fail_on) == jsonout.dumps(report.to_json(fail_on))


@pytest.mark.parametrize("deadline", ["1e300", "inf", "-1", "nan", "soon"])
def test_any_worker_deadline_from_the_environment_keeps_the_workers_results(monkeypatch, deadline):
    """GEMMA_DOCTOR_WORKER_DEADLINE is read as seconds, nonsense as the default. A huge one overflowed select's
    timeout (found in the attacker's pass over issue 33's change): every worker was killed and its run done again
    here. Each run is done once, in its worker."""
    monkeypatch.setenv("GEMMA_DOCTOR_WORKER_DEADLINE", deadline)
    code = ("import os, time; from gemma_doctor import parallel; me = os.getpid(); here = []\n"
            "def run(r):\n"
            "    if os.getpid() != me:\n"
            "        time.sleep(0.3)  # the parent waits on a worker still running\n"
            "    else:\n"
            "        here.append(r[0])\n"
            "    return [x * 2 for x in r]\n"
            "print(parallel.map_runs(run, list(range(10)), 3), here)")
    got = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert got.stdout.strip() == "[[0, 2, 4, 6], [8, 10, 12], [14, 16, 18]] [0]", got.stderr[-2000:]
