"""`restore` tells the truth and always has a way out: --force for edited files (the edit kept where the user can
find it), --dry-run that changes nothing, messages from what was done (not from the plan), modes and bytes kept,
and a fully restored folder exactly as it was (no lock or state folder left for an upload to push)."""

from __future__ import annotations

import json
import os
import stat

import pytest

from gemma_doctor import undo
from gemma_doctor.locate import resolve
from tests.builders import HubCache, gemma2_config, gemma3_12b_config, generation_config, tree_state

pytestmark = pytest.mark.usefixtures("plan_450")

REPO = "org/m"


def _plain(tmp_path, mode: int = 0o644):  # noqa: ANN001, ANN202
    folder = tmp_path / "finetune"
    folder.mkdir()
    (folder / "config.json").write_bytes((json.dumps(gemma3_12b_config(), indent=2) + "\n").encode())
    (folder / "generation_config.json").write_bytes((json.dumps(generation_config(), indent=2) + "\n").encode())
    for name in ("config.json", "generation_config.json"):
        os.chmod(folder / name, mode)
    return folder


def _mode(path) -> int:  # noqa: ANN001
    return stat.S_IMODE(os.lstat(path).st_mode)


@pytest.mark.parametrize("mode", [0o600, 0o664, 0o640])
@pytest.mark.parametrize("layout", ["plain folder", "cache without symlinks"])
def test_fix_and_restore_keep_bytes_and_a_mode_the_umask_would_change(tmp_path, cli, mode, layout):
    """0o664 and 0o600 differ from what umask 022 gives a new file: dropping the explicit chmod loses them."""
    if layout == "plain folder":
        folder = _plain(tmp_path, mode)
        target = [folder]
    else:
        hub = HubCache(tmp_path / "hub", symlinks=False)
        folder = hub.add(REPO, {"config.json": gemma3_12b_config(), "generation_config.json": generation_config()})
        for name in ("config.json", "generation_config.json"):
            os.chmod(folder / name, mode)
        target = [REPO, "--cache-dir", hub.root]
    before = tree_state(folder)
    old = os.umask(0o022)
    try:
        assert cli("fix", *target, "--inplace").code == 0
        assert [_mode(folder / n) for n in ("config.json", "generation_config.json")] == [mode, mode]
        assert json.loads((folder / "config.json").read_text())["text_config"]["use_cache"] is False
        assert cli("restore", *target).code == 0
    finally:
        os.umask(old)
    assert [_mode(folder / n) for n in ("config.json", "generation_config.json")] == [mode, mode]
    assert tree_state(folder) == before


def test_a_full_restore_of_a_plain_folder_leaves_nothing_behind(tmp_path, cli):
    """huggingface_hub's upload_folder would push a leftover .gemma-doctor/lock."""
    folder = _plain(tmp_path)
    before = tree_state(folder)
    assert cli("fix", folder, "--inplace").code == 0
    assert (folder / ".gemma-doctor" / "lock").exists()
    assert cli("restore", folder).code == 0
    assert not (folder / ".gemma-doctor").exists() and tree_state(folder) == before


def test_a_fix_with_nothing_to_change_still_sweeps_what_a_killed_run_left(tmp_path, cli):
    """What a killed run left (a temp file, an orphan backup) is swept even by a fix with nothing to change."""
    folder = _plain(tmp_path)
    assert cli("fix", folder, "--inplace").code == 0
    (folder / ".gemma-doctor" / ".config.json.gemma-doctor-1-0123abcd.tmp").write_text("left by a kill")
    (folder / ".gemma-doctor" / "backups" / ("ab" * 32)).write_text("an orphan")
    r = cli("fix", folder, "--inplace")
    assert r.code == 0 and "nothing to change" in r.err, r
    assert sorted(p.name for p in (folder / ".gemma-doctor" / "backups").iterdir()) == sorted(
        e["original_sha256"] for e in undo.load(resolve([str(folder)])[0]).values())
    assert not list((folder / ".gemma-doctor").glob("*.tmp"))
    assert cli("restore", folder).code == 0
    assert not (folder / ".gemma-doctor").exists()


def test_restore_brings_back_a_users_edit_made_between_two_fixes(hub, cli):
    """fix, the user edits (and turns use_cache back on), fix again: restore brings back the edit, not the download."""
    snap = hub.add(REPO, {"config.json": gemma2_config()})
    assert cli("fix", REPO, "--inplace", "--cache-dir", hub.root).code == 0
    cfg = json.loads((snap / "config.json").read_text())
    cfg.update(use_cache=True, hidden_size=4096)
    edit = (json.dumps(cfg, indent=2) + "\n").encode()
    (snap / "config.json").write_bytes(edit)
    assert cli("fix", REPO, "--inplace", "--cache-dir", hub.root).code == 0
    assert json.loads((snap / "config.json").read_text())["use_cache"] is False
    assert cli("restore", REPO, "--cache-dir", hub.root).code == 0
    assert not (snap / "config.json").is_symlink() and (snap / "config.json").read_bytes() == edit


def test_a_corrupted_backup_is_never_restored(tmp_path, cli):
    hub = HubCache(tmp_path / "hub", symlinks=False)
    snap = hub.add(REPO, {"config.json": gemma2_config()})
    assert cli("fix", REPO, "--inplace", "--cache-dir", hub.root).code == 0
    fixed = (snap / "config.json").read_bytes()
    (entry,) = undo.load(resolve([REPO], hub.root)[0]).values()
    backup = hub.repo_dir(REPO) / ".gemma-doctor" / "backups" / entry["original_sha256"]
    backup.write_bytes(backup.read_bytes().replace(b"2304", b"9999"))
    r = cli("restore", REPO, "--cache-dir", hub.root, "--format", "json")
    assert r.code == 3, r
    (model,) = r.json()["models"]
    assert model["status"] == "failed" and model["messages"] == [
        f"the backup {backup} does not match its checksum; nothing restored"], model
    assert (snap / "config.json").read_bytes() == fixed


def test_a_missing_backup_is_named_as_missing_and_nothing_is_restored(tmp_path, cli):
    hub = HubCache(tmp_path / "hub", symlinks=False)
    snap = hub.add(REPO, {"config.json": gemma2_config()})
    assert cli("fix", REPO, "--inplace", "--cache-dir", hub.root).code == 0
    fixed = (snap / "config.json").read_bytes()
    (entry,) = undo.load(resolve([REPO], hub.root)[0]).values()
    backup = hub.repo_dir(REPO) / ".gemma-doctor" / "backups" / entry["original_sha256"]
    backup.unlink()
    r = cli("restore", REPO, "--cache-dir", hub.root, "--format", "json")
    assert r.code == 3, r
    (model,) = r.json()["models"]
    assert model["messages"] == [f"the backup {backup} is unusable (missing); nothing restored"], model
    assert (snap / "config.json").read_bytes() == fixed


def test_a_temp_file_a_killed_run_left_in_a_plain_folder_is_swept_by_the_next_run(tmp_path, cli):
    """The name is one only gemma-doctor writes (tests/test_crash_safety.py kills real runs; this plants the file)."""
    folder = _plain(tmp_path)
    before = tree_state(folder)
    assert cli("fix", folder, "--inplace").code == 0
    leftover = folder / ".config.json.gemma-doctor-12345-0badf00d.tmp"
    leftover.write_bytes(b'{"half": ')
    assert cli("restore", folder).code == 0
    assert not leftover.exists() and tree_state(folder) == before


def test_a_backup_replaced_by_a_link_is_never_read_even_to_the_right_bytes(tmp_path, cli):
    """The backup must be our own file: a link planted in its place is refused, even one leading to a file inside
    the repo folder with exactly the original bytes."""
    hub = HubCache(tmp_path / "hub", symlinks=False)
    snap = hub.add(REPO, {"config.json": gemma2_config()})
    assert cli("fix", REPO, "--inplace", "--cache-dir", hub.root).code == 0
    fixed = (snap / "config.json").read_bytes()
    (entry,) = undo.load(resolve([REPO], hub.root)[0]).values()
    backup = hub.repo_dir(REPO) / ".gemma-doctor" / "backups" / entry["original_sha256"]
    planted = hub.repo_dir(REPO) / ".gemma-doctor" / "planted"
    planted.write_bytes(backup.read_bytes())
    backup.unlink()
    os.symlink("../planted", backup)
    r = cli("restore", REPO, "--cache-dir", hub.root, "--format", "json")
    assert r.code == 3, r
    (model,) = r.json()["models"]
    assert len(model["messages"]) == 1 and model["messages"][0].startswith(f"the backup {backup} is unusable ("), model
    assert (snap / "config.json").read_bytes() == fixed


def test_restore_dry_run_changes_nothing(hub, cli):
    snap = hub.add(REPO, {"config.json": gemma2_config(), "generation_config.json": generation_config()})
    assert cli("fix", REPO, "--inplace", "--cache-dir", hub.root).code == 0
    fixed = tree_state(hub.root)
    r = cli("restore", REPO, "--dry-run", "--cache-dir", hub.root, "--format", "json")
    assert r.code == 0 and r.json()["dry_run"] is True
    (model,) = r.json()["models"]
    assert model["status"] == "would-change"
    assert model["messages"] == ["would restore config.json", "would restore generation_config.json"]
    assert tree_state(hub.root) == fixed and not (snap / "config.json").is_symlink()


def test_an_edited_file_is_reported_with_the_way_out_and_force_keeps_the_edit(hub, cli):
    snap = hub.add(REPO, {"config.json": gemma2_config(), "generation_config.json": generation_config()})
    original_link = os.readlink(snap / "config.json")
    assert cli("fix", REPO, "--inplace", "--cache-dir", hub.root).code == 0
    edited = (snap / "config.json").read_text().replace('"hidden_size": 2304', '"hidden_size": 4096')
    (snap / "config.json").write_text(edited)

    r = cli("restore", REPO, "--cache-dir", hub.root, "--format", "json")
    (model,) = r.json()["models"]
    assert r.code == 1 and model["status"] == "restored", r
    assert model["messages"][0].startswith("config.json changed since gemma-doctor fixed it; left as it is")
    assert f"gemma-doctor restore {REPO} --cache-dir {hub.root} --force" in model["messages"][0]
    assert model["messages"][1:] == ["restored generation_config.json"]  # only what really was restored
    assert (snap / "config.json").read_text() == edited

    dry = cli("restore", REPO, "--force", "--dry-run", "--cache-dir", hub.root, "--format", "json")
    assert dry.code == 0 and dry.json()["models"][0]["messages"] == [
        "would restore config.json (your edited version would be kept aside)"]
    assert (snap / "config.json").read_text() == edited

    forced = cli("restore", REPO, "--force", "--cache-dir", hub.root, "--format", "json")
    assert forced.code == 0, forced
    (msg,) = forced.json()["models"][0]["messages"]
    kept = hub.repo_dir(REPO) / ".gemma-doctor" / "kept" / f"{snap.name[:12]}-config.json-{undo.sha256(edited.encode())[:12]}"
    assert msg == f"restored config.json; your edited version is kept in {kept}"
    assert kept.read_text() == edited
    assert os.readlink(snap / "config.json") == original_link
    # the record and backups are gone; the kept edit (and its folder) stays for the user
    assert sorted(p.name for p in (hub.repo_dir(REPO) / ".gemma-doctor").iterdir()) == ["kept", "lock"]
    assert cli("check", REPO, "--cache-dir", hub.root, "--format", "json").code == 1  # back to the original: GD101


def test_a_fixed_file_replaced_by_a_link_is_restored_by_force(hub, cli):
    snap = hub.add(REPO, {"config.json": gemma2_config()})
    original_link = os.readlink(snap / "config.json")
    assert cli("fix", REPO, "--inplace", "--cache-dir", hub.root).code == 0
    (snap / "config.json").unlink()
    os.symlink("/etc/hostname", snap / "config.json")
    r = cli("restore", REPO, "--force", "--cache-dir", hub.root, "--format", "json")
    assert r.code == 0 and r.json()["models"][0]["messages"] == [
        "restored config.json; it was a link to /etc/hostname (nothing to keep: links hold no data)"], r
    assert os.readlink(snap / "config.json") == original_link


def test_a_restore_that_times_out_on_the_lock_does_not_say_restored(hub, cli):
    hub.add(REPO, {"config.json": gemma2_config()})
    assert cli("fix", REPO, "--inplace", "--cache-dir", hub.root).code == 0
    with undo.locked(resolve([REPO], hub.root)[0]):
        r = cli("restore", REPO, "--cache-dir", hub.root, "--lock-timeout", "0.1", "--format", "json")
    assert r.code == 3, r
    (model,) = r.json()["models"]
    assert model["status"] == "failed"
    assert not any(m.startswith("restored") for m in model["messages"]), model
    assert "another gemma-doctor has held" in model["messages"][-1] and model["messages"][-1].endswith("nothing was restored")


@pytest.mark.parametrize("dry", [True, False])
def test_restore_of_a_model_never_fixed_says_nothing_to_restore(hub, cli, dry):
    hub.add(REPO, {"config.json": gemma2_config()})
    before = tree_state(hub.root)
    r = cli("restore", REPO, "--cache-dir", hub.root, "--format", "json", *(["--dry-run"] if dry else []))
    assert r.code == 0, r
    (model,) = r.json()["models"]
    assert model["status"] == "nothing-to-restore" and tree_state(hub.root) == before


def test_a_fixed_file_that_became_a_folder_is_left_as_it_is_and_named(tmp_path, cli):
    folder = _plain(tmp_path)
    assert cli("fix", folder, "--inplace").code == 0
    (folder / "config.json").unlink()
    (folder / "config.json").mkdir()
    r = cli("restore", folder, "--format", "json")
    assert r.code == 1, r
    (model,) = r.json()["models"]
    assert any(m.startswith("config.json is now a folder; left as it is (its original is kept in ") for m in model["messages"])
    assert (folder / "config.json").is_dir()


@pytest.mark.parametrize("layout", ["cache links", "plain folder"])
def test_a_file_already_back_to_its_original_is_not_written_again(tmp_path, cli, layout):
    """The user (or a restore killed before it dropped the record) already put the original back: restore only
    forgets the record, and says it restored nothing."""
    if layout == "plain folder":
        folder = _plain(tmp_path)
        target = [folder]
        original = (folder / "config.json").read_bytes()
    else:
        hub = HubCache(tmp_path / "hub")
        folder = hub.add(REPO, {"config.json": gemma3_12b_config()})
        target = [REPO, "--cache-dir", hub.root]
        link = os.readlink(folder / "config.json")
    assert cli("fix", *target, "--inplace").code == 0
    if layout == "plain folder":
        (folder / "config.json").write_bytes(original)
    else:
        (folder / "config.json").unlink()
        os.symlink(link, folder / "config.json")
    r = cli("restore", *target, "--format", "json")
    assert r.code == 0, r
    (model,) = r.json()["models"]
    assert not any(m.startswith("restored config.json") for m in model["messages"]), model
    assert undo.load(resolve([str(target[0])], target[2] if len(target) > 1 else None)[0]) == {}


@pytest.mark.parametrize("layout", ["plain folder", "cache without symlinks", "cache with links"])
def test_restore_brings_back_the_modification_time_too(tmp_path, cli, layout):
    """Issue 33: restore put back bytes, mode and link text, not the file's mtime (a link's own, for a link)."""
    if layout == "plain folder":
        folder = _plain(tmp_path)
        target = [folder]
    else:
        hub = HubCache(tmp_path / "hub", symlinks=layout == "cache with links")
        folder = hub.add(REPO, {"config.json": gemma3_12b_config(), "generation_config.json": generation_config()})
        target = [REPO, "--cache-dir", hub.root]
    then = 1_500_000_000_123_456_789  # 2017, to the nanosecond
    for name in ("config.json", "generation_config.json"):
        os.utime(folder / name, ns=(then, then), follow_symlinks=False)
    assert cli("fix", *target, "--inplace").code == 0
    assert os.lstat(folder / "config.json").st_mtime_ns != then  # rewritten
    assert cli("restore", *target).code == 0
    assert [os.lstat(folder / n).st_mtime_ns for n in ("config.json", "generation_config.json")] == [then, then]
