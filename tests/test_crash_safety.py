"""Crash safety of `fix --inplace` and `restore`: random SIGKILL / SIGINT of real processes, and each
known dangerous moment reproduced exactly in-process.

The random harness lives in tests/crash_harness.py (benchmarks/stress_crash.py runs it hundreds of times).
"""

from __future__ import annotations

import json
import os

import pytest
from huggingface_hub import scan_cache_dir

from gemma_doctor import fsafe, undo
from tests import crash_harness as harness
from tests.builders import HubCache, example_file, gemma3_12b_config, tree_state


# These tests exercise the on-disk fix, planned only where transformers 4.50.x will run (tests/conftest.py).
pytestmark = pytest.mark.usefixtures("plan_450")

REPO = "google/gemma-3-12b-it"


@pytest.mark.parametrize("symlinks,kills", [(True, 30), (False, 8)], ids=["links", "no-symlinks"])
def test_random_kills_of_fix_and_restore_keep_every_promise(tmp_path, symlinks, kills):
    root = tmp_path / "hub"
    harness.build_cache(root, symlinks=symlinks)
    exp = harness.expected_states(root, tmp_path / "scratch", repeats=1)
    stats = harness.kill_loop(root, exp, kills=kills, seed=1234 + kills, sigint_share=0.25)
    assert stats.violations == [], stats.violations
    assert stats.kills == kills and stats.completions >= kills // 3
    # the last completion left one run's end state; a final restore gives the original cache back
    assert harness.cli(root, "restore").returncode == 0
    harness.check_complete(root, exp, "restore")


# --- the dangerous moments, one by one ----------------------------------------------------------------

class Crash(BaseException):
    """Stands for SIGKILL at one exact point: nothing after it runs, no handler cleans up."""


@pytest.fixture
def cache(hub):
    files = {"config.json": example_file("config.json"), "generation_config.json": example_file("generation_config.json")}
    snap = hub.add(REPO, files)
    return hub, snap


def _crash_on(monkeypatch, func_name: str, when) -> None:  # noqa: ANN001
    """Make <func_name> (of fsafe, else undo) raise Crash on the call for which ``when(args)`` is true (before it acts)."""
    module = fsafe if hasattr(fsafe, func_name) else undo
    real = getattr(module, func_name)

    def wrapper(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
        if when(args):
            raise Crash
        return real(*args, **kwargs)

    monkeypatch.setattr(module, func_name, wrapper)


def _run(cli, *args):  # noqa: ANN001, ANN002, ANN202
    try:
        return cli(*args)
    except Crash:
        return None


def _without_state(root) -> dict:  # noqa: ANN001
    return {k: v for k, v in tree_state(root).items() if ".gemma-doctor" not in k and not k.startswith(".locks")}


def test_crash_between_saving_the_record_and_replacing_the_file(cache, cli, monkeypatch):
    """The record names config.json but the file is still the original link: restore and fix both cope."""
    hub, snap = cache
    before = _without_state(hub.root)
    with monkeypatch.context() as m:
        _crash_on(m, "write_file", lambda a: a[0].name == "config.json" and "snapshots" in a[0].parts)
        assert _run(cli, "fix", REPO, "--inplace", "--cache-dir", hub.root) is None
    record = json.loads((hub.repo_dir(REPO) / ".gemma-doctor" / "undo.json").read_text())
    assert f"snapshots/{snap.name}/config.json" in record["entries"] and (snap / "config.json").is_symlink()

    r = cli("restore", REPO, "--cache-dir", hub.root)
    assert r.code == 0, r
    # a full restore leaves no state folder at all: no record, no backup, no lock
    assert _without_state(hub.root) == before and not (hub.repo_dir(REPO) / ".gemma-doctor").exists()

    with monkeypatch.context() as m:
        _crash_on(m, "write_file", lambda a: a[0].name == "config.json" and "snapshots" in a[0].parts)
        _run(cli, "fix", REPO, "--inplace", "--cache-dir", hub.root)
    assert cli("fix", REPO, "--inplace", "--cache-dir", hub.root).code == 0
    assert json.loads((snap / "config.json").read_text())["text_config"]["use_cache"] is False
    assert cli("restore", REPO, "--cache-dir", hub.root).code == 0
    assert _without_state(hub.root) == before


def test_crash_during_restore_between_replacing_the_file_and_dropping_the_entry(cache, cli, monkeypatch):
    hub, snap = cache
    before = _without_state(hub.root)
    assert cli("fix", REPO, "--inplace", "--cache-dir", hub.root).code == 0
    saves = []
    with monkeypatch.context() as m:
        _crash_on(m, "save", lambda a: saves.append(1) or len(saves) == 1)  # the first drop of an entry
        assert _run(cli, "restore", REPO, "--cache-dir", hub.root) is None
    # the first file is back to its link, its entry still recorded; the other file still fixed and covered
    entries = json.loads((hub.repo_dir(REPO) / ".gemma-doctor" / "undo.json").read_text())["entries"]
    assert len(entries) == 2 and (snap / "config.json").is_symlink()
    assert cli("fix", REPO, "--inplace", "--cache-dir", hub.root).code == 0  # fix from here works too
    assert json.loads((snap / "config.json").read_text())["text_config"]["use_cache"] is False
    with monkeypatch.context() as m:
        saves.clear()
        _crash_on(m, "save", lambda a: saves.append(1) or len(saves) == 1)
        _run(cli, "restore", REPO, "--cache-dir", hub.root)
    r = cli("restore", REPO, "--cache-dir", hub.root)
    assert r.code == 0, r
    assert _without_state(hub.root) == before


def test_a_leftover_temp_file_is_harmless_to_the_scanner_and_swept_by_the_next_run(cache, cli):
    """What SIGKILL inside write_file leaves: `.config.json.gemma-doctor-<pid>-<hex>.tmp` in the snapshot."""
    hub, snap = cache
    assert cli("fix", REPO, "--inplace", "--cache-dir", hub.root).code == 0
    tmp = snap / ".config.json.gemma-doctor-4242-0badcafe.tmp"
    tmp.write_bytes(b'{"half": ')
    link_tmp = snap / ".generation_config.json.gemma-doctor-4242-deadbeef.tmp"
    blob = next((hub.repo_dir(REPO) / "blobs").iterdir())
    os.symlink(f"../../blobs/{blob.name}", link_tmp)  # write_link's temp: the original link, not yet renamed
    unrelated = snap / ".config.json.mine.tmp"  # not ours: never touched
    unrelated.write_text("keep")

    info = scan_cache_dir(hub.root)
    # the scanner lists the temp file as one more file of the revision; it warns about nothing
    assert info.warnings == []
    names = {f.file_name for r in info.repos for rev in r.revisions for f in rev.files}
    assert tmp.name in names
    assert ".locks" not in {r.repo_id for r in info.repos} and len(info.repos) == 1

    # nothing to change, yet the run sweeps what a killed run left behind
    r = cli("fix", REPO, "--inplace", "--cache-dir", hub.root, "--format", "json")
    assert r.code == 0 and r.json()["models"][0]["status"] == "up-to-date", r
    assert not tmp.exists() and not os.path.lexists(link_tmp) and unrelated.read_text() == "keep"
    assert scan_cache_dir(hub.root).warnings == []


def test_orphan_backups_of_a_killed_run_are_swept(cache, cli, monkeypatch):
    """Killed after the backup was written but before the record: the next run drops the orphan."""
    hub, snap = cache
    with monkeypatch.context() as m:
        _crash_on(m, "save", lambda a: True)
        _run(cli, "fix", REPO, "--inplace", "--cache-dir", hub.root)
    backups = hub.repo_dir(REPO) / ".gemma-doctor" / "backups"
    assert len(list(backups.iterdir())) == 1 and not (backups.parent / "undo.json").exists()
    assert cli("fix", REPO, "--inplace", "--cache-dir", hub.root).code == 0
    assert cli("restore", REPO, "--cache-dir", hub.root).code == 0
    assert not backups.parent.exists()  # orphans swept, and the emptied state folder removed with its lock


def test_ctrl_c_inside_apply_is_one_line_and_leaves_a_restorable_state(cache, cli, monkeypatch):
    hub, snap = cache
    before = _without_state(hub.root)
    real = fsafe.write_file

    def interrupted(path, data, mode, *rest, **kw):  # noqa: ANN001, ANN002, ANN003, ANN202
        if path.name == "generation_config.json" and "snapshots" in path.parts:
            raise KeyboardInterrupt
        return real(path, data, mode, *rest, **kw)

    monkeypatch.setattr(fsafe, "write_file", interrupted)
    r = cli("fix", REPO, "--inplace", "--cache-dir", hub.root)
    monkeypatch.undo()
    assert r.code == 130 and r.err.count("\n") == 1 and "interrupted" in r.err, r
    assert not list(hub.root.rglob("*.tmp"))
    # config.json is fixed and covered; generation_config.json is its original link
    assert not (snap / "config.json").is_symlink() and (snap / "generation_config.json").is_symlink()
    assert cli("restore", REPO, "--cache-dir", hub.root).code == 0
    assert _without_state(hub.root) == before


def test_ctrl_c_inside_write_file_removes_its_temp_file(tmp_path, monkeypatch):
    target = tmp_path / "config.json"
    target.write_text("{}")

    def interrupted_replace(src, dst, **kw):  # noqa: ANN001, ANN003, ANN202
        raise KeyboardInterrupt

    monkeypatch.setattr(os, "replace", interrupted_replace)
    with pytest.raises(KeyboardInterrupt):
        fsafe.write_file(target, b'{"a": 1}', 0o644)
    assert [p.name for p in tmp_path.iterdir()] == ["config.json"] and target.read_text() == "{}"


def test_windows_style_cache_crash_between_record_and_replace(tmp_path, cli, monkeypatch):
    hub = HubCache(tmp_path / "hub", symlinks=False)
    snap = hub.add(REPO, {"config.json": gemma3_12b_config()})
    before = _without_state(hub.root)
    with monkeypatch.context() as m:
        _crash_on(m, "write_file", lambda a: a[0].name == "config.json" and "snapshots" in a[0].parts)
        _run(cli, "fix", REPO, "--inplace", "--cache-dir", hub.root)
    assert _without_state(hub.root) == before
    assert cli("restore", REPO, "--cache-dir", hub.root).code == 0
    assert _without_state(hub.root) == before
    assert cli("fix", REPO, "--inplace", "--cache-dir", hub.root).code == 0
    assert json.loads((snap / "config.json").read_text())["text_config"]["use_cache"] is False
