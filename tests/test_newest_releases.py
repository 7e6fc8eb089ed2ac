"""The newest-release check (benchmarks/newest_releases.py), its fast part: real reproductions on the installed
(pinned) stack, judged against real windows; the full run against the newest releases is in benchmarks/."""

from __future__ import annotations

import dataclasses
import sys

import pytest

from gemma_doctor import horizon
from gemma_doctor.stack import Window
from tests.venvs import pinned

sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parent.parent / "benchmarks"))
import newest_releases as nr  # noqa: E402

sys.path.pop(0)


def _wrong() -> tuple[nr.Probe, nr.Probe]:
    """GD107's and GD640's probes with windows that claim the wrong thing: as if never fixed, as if it stopped at 5.21."""
    kv = next(p for p in nr.PROBES if p.code == "GD107")
    refuses = next(p for p in nr.PROBES if p.what.startswith("SDPA refuses"))
    return (dataclasses.replace(kv, windows=(Window("transformers", ">=5.5.0"),)),
            dataclasses.replace(refuses, windows=(Window("transformers", "<5.21.0"),)))


def _broken() -> nr.Probe:
    """GD107's probe naming a case its script does not have."""
    return dataclasses.replace(next(p for p in nr.PROBES if p.code == "GD107"), case="no-such-case")


@pytest.fixture(scope="module")
def gd107_gd640():
    """GD107 (a closed window: 5.5.0-5.5.1) and GD640 (a window still open from 5.21.0), run once on this venv; the
    same runs judged against the wrong windows (_wrong); and a probe whose case does not exist (_broken). One
    run_probes call runs each script once for all of them (each case once, a broken case beside the others), instead
    of three runs of the same reproductions."""
    versions, rows = nr.run_probes(sys.executable, only={"GD107", "GD640"}, probes=nr.PROBES + _wrong() + (_broken(),))
    return versions, rows[:-3], rows[-3:-1], rows[-1]


def test_the_installed_stack_keeps_every_window_it_was_run_on(gd107_gd640):
    versions, rows, _, _ = gd107_gd640
    assert versions["transformers"] == pinned("transformers")
    by_what = {r["what"]: r for r in rows}
    kv = by_what["Gemma 4 KV sharing skipped without a cache (wrong loss)"]
    assert (kv["expected"], kv["observed"], kv["verdict"]) == (False, False, "still right")  # fixed in 5.5.2, stays
    refuses = by_what["SDPA refuses softcapping (ValueError)"]
    assert (refuses["expected"], refuses["observed"], refuses["verdict"]) == (True, True, "still right")  # still open


def test_a_window_that_no_longer_holds_is_named_for_what_it_is(gd107_gd640):
    """The same real runs against windows that claim the wrong thing: a fix is 'fixed upstream', a regression is
    'new failure' (what a newer release would show if it changed)."""
    _versions, _, rows, _ = gd107_gd640
    assert [(r["what"], r["window"]) for r in rows] == [(p.what, p.windows[0].spec) for p in _wrong()]
    assert [r["verdict"] for r in rows] == ["fixed upstream", "new failure"]
    assert nr.verdict(True, True) == nr.verdict(False, False) == "still right"


def test_a_reproduction_that_cannot_run_says_so_and_is_not_a_verdict(gd107_gd640):
    _versions, _, _, row = gd107_gd640
    assert row["what"] == _broken().what and "expected" not in row
    assert row["verdict"] == "could not run" and row["reason"]


def test_every_windowed_library_has_a_probe_and_a_horizon():
    """Each library a probe depends on has a verified release; every version window of versioning.py that a
    reproduction exists for is probed."""
    probed = {w for p in nr.PROBES for w in p.windows}
    assert {w.package for w in probed} <= set(horizon.VERIFIED)
    assert len({p.code for p in nr.PROBES}) >= 8


def test_the_weekly_job_in_docs_ci_runs_this_script_with_options_it_accepts():
    import re
    import shlex
    from pathlib import Path

    import yaml

    text = (Path(__file__).resolve().parent.parent / "docs" / "ci.md").read_text()
    docs = [yaml.safe_load(b) for b in re.findall(r"^```yaml\n(.*?)^```", text, flags=re.M | re.S)]
    (job,) = [d for d in docs if isinstance(d, dict) and "schedule" in (d.get(True) or d.get("on") or {})]
    runs = [s["run"] for j in job["jobs"].values() for s in j["steps"] if "newest_releases.py" in s.get("run", "")]
    (line,) = runs
    argv = shlex.split(line)
    assert argv[:2] == ["python", "benchmarks/newest_releases.py"]
    assert (Path(__file__).resolve().parent.parent / argv[1]).is_file()
    args = nr.parser().parse_args(argv[2:])  # exits 2 on an option the script does not take
    assert args.json == "newest-releases.json" and args.python is None  # builds the newest venv itself


def test_the_installed_huggingface_hub_lays_out_every_cache_layout_that_check_fix_and_restore_read_alike():
    """The cache-layout half of the newest-release check, on the pinned huggingface_hub: each layout it writes (the
    shared blob store included) checks like the classic one, and fix + restore leave the store as it was."""
    rows = nr.cache_layouts(sys.executable)
    assert [(r["layout"], r["version"], r["verdict"]) for r in rows] == [
        (layout, pinned("huggingface_hub"), "still right") for layout in nr.LAYOUTS], rows
    assert "| shared | 2.4.0 | still right |" in nr.layout_table(rows)
