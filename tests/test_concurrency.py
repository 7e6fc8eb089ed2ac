"""Several gemma-doctor processes on one cache: they serialise on the repo lock, re-plan under it, and end
in the state one run gives; the undo record is never lost or torn."""

from __future__ import annotations

import json
import subprocess

import pytest

from gemma_doctor import fsafe, undo
from gemma_doctor.model import read_model
from gemma_doctor.fixes import apply_plan, apply_restore, plan_model, plan_restore
from gemma_doctor.locate import resolve
from tests import crash_harness as harness
from tests.builders import example_file, tree_state


# These tests exercise the on-disk fix, planned only where transformers 4.50.x will run (tests/conftest.py).
pytestmark = pytest.mark.usefixtures("plan_450")

REPO = "google/gemma-3-12b-it"


def _together(root, commands: list[tuple[str, ...]]) -> list[subprocess.CompletedProcess]:  # noqa: ANN001
    """Start every command at once, wait for all."""
    procs = [subprocess.Popen(harness._argv(root, *c), env=harness._env(root), stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for c in commands]
    out = []
    for c, p in zip(commands, procs):
        o, e = p.communicate(timeout=300)
        out.append(subprocess.CompletedProcess(c, p.returncode, o, e))
    return out


def _findings(r: subprocess.CompletedProcess) -> set[tuple[str, str]]:
    """(repo, code) of every finding in a `check --format json` run's report."""
    return {(m["repo_id"], f["code"]) for m in json.loads(r.stdout)["models"] for f in m["findings"]}


@pytest.mark.parametrize("symlinks", [True, False], ids=["links", "no-symlinks"])
def test_concurrent_fixes_then_restores_then_a_mix_end_as_one_run(tmp_path, symlinks):
    root = tmp_path / "hub"
    harness.build_cache(root, symlinks=symlinks, extra_repos=3)
    exp = harness.expected_states(root, tmp_path / "scratch", repeats=1)

    runs = _together(root, [("fix", "--inplace")] * 5)
    assert [r.returncode for r in runs] == [0] * 5, [r.stderr for r in runs]
    harness.check_complete(root, exp, "fix")

    runs = _together(root, [("restore",)] * 5)
    assert [r.returncode for r in runs] == [0] * 5, [r.stderr for r in runs]
    harness.check_complete(root, exp, "restore")

    # What a check may report while fixes and restores race: the findings of the original or the fixed cache, never
    # one of a file seen half-way (a temp file, a link being replaced, a record being rewritten).
    allowed = _findings(harness.cli(root, "check", "--format", "json"))
    assert harness.cli(root, "fix", "--inplace").returncode == 0
    allowed |= _findings(harness.cli(root, "check", "--format", "json"))
    assert harness.cli(root, "restore").returncode == 0
    check = ("check", "--format", "json")
    runs = _together(root, [("fix", "--inplace"), ("restore",), check] * 3)
    assert [r.returncode for r in runs if r.args != check] == [0] * 6, [r.stderr for r in runs]
    for r in runs:
        if r.args == check:
            assert r.returncode in (0, 1) and r.stderr == "", r
            assert _findings(r) <= allowed, _findings(r) - allowed
    harness.check_after_kill(root, exp)  # each file original or fixed, every fixed one covered
    assert harness.cli(root, "restore").returncode == 0
    harness.check_complete(root, exp, "restore")


def test_a_held_lock_times_out_with_a_clear_message_and_nothing_changes(hub, cli):
    hub.add(REPO, {"config.json": example_file("config.json")})
    snapshot = resolve([REPO], hub.root)[0]
    before = tree_state(hub.repo_dir(REPO))
    with undo.locked(snapshot):
        r = cli("fix", REPO, "--inplace", "--cache-dir", hub.root, "--lock-timeout", "0.2")
        restore = cli("restore", REPO, "--cache-dir", hub.root, "--lock-timeout", "0")
    assert r.code == 3, r
    assert "another gemma-doctor has held" in r.out and "for over 0.2s" in r.out and "--lock-timeout" in r.out
    assert {k: v for k, v in tree_state(hub.repo_dir(REPO)).items() if k != ".gemma-doctor/lock"} == before
    assert restore.code == 0  # nothing to restore: no lock needed
    assert cli("fix", REPO, "--inplace", "--cache-dir", hub.root, "--lock-timeout", "0.2").code == 0


def test_two_plans_from_the_same_original_apply_once(hub):
    """Process B planned before A wrote: under the lock B sees the change, re-plans, and writes nothing."""
    snap = hub.add(REPO, {"config.json": example_file("config.json"),
                          "generation_config.json": example_file("generation_config.json")})
    snapshot = resolve([REPO], hub.root)[0]
    plan_a, plan_b = plan_model(read_model(snapshot)), plan_model(read_model(snapshot))
    assert len(plan_a.changes) == len(plan_b.changes) == 2
    assert len(apply_plan(plan_a)) == 2
    once = tree_state(hub.root)
    assert apply_plan(plan_b) == []
    assert tree_state(hub.root) == once
    entries = undo.load(snapshot)
    assert {e["original_sha256"] for e in entries.values()} == {
        undo.sha256(example_file("config.json")), undo.sha256(example_file("generation_config.json"))}
    assert json.loads((snap / "config.json").read_text())["text_config"]["use_cache"] is False


def test_a_fix_between_restore_planning_and_applying_keeps_its_undo_entry(hub, cli, monkeypatch):
    """restore planned 'drop the stale entry' (file still original); a fix then rewrote the file. The
    restore must judge again under the lock, never leave a fixed file without its entry."""
    snap = hub.add(REPO, {"config.json": example_file("config.json")})
    original = tree_state(hub.repo_dir(REPO) / "snapshots")
    snapshot = resolve([REPO], hub.root)[0]
    # a stale entry: the record says fixed, the file is still the original link (killed between the two)
    real = fsafe.write_file
    monkeypatch.setattr(fsafe, "write_file", lambda p, d, m, *a, **k: (_ for _ in ()).throw(KeyboardInterrupt)
                        if p.name == "config.json" and "snapshots" in p.parts else real(p, d, m, *a, **k))
    assert cli("fix", REPO, "--inplace", "--cache-dir", hub.root).code == 130
    monkeypatch.undo()
    facts = read_model(snapshot)
    actions, conflicts = plan_restore(facts)
    assert [a.drop_only for a in actions] == [True] and conflicts == []

    assert cli("fix", REPO, "--inplace", "--cache-dir", hub.root).code == 0  # the concurrent fix
    apply_restore(facts, actions)  # the restore that planned before it
    # judged again under the lock: the file is fixed now, so restore puts the original back (the old code
    # dropped the entry and left a fixed file with no way to undo it)
    assert tree_state(hub.repo_dir(REPO) / "snapshots") == original
    assert undo.load(snapshot) == {}
