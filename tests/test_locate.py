"""Targets -> snapshots: the hub cache resolved as huggingface_hub resolves it, repo ids, revisions, paths."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from gemma_doctor import locate
from gemma_doctor.errors import UsageError
from tests.builders import gemma3_12b_config, llama_config


@pytest.mark.parametrize("env", [
    {},
    {"HF_HOME": "/tmp/hfhome"},
    {"XDG_CACHE_HOME": "/tmp/xdg"},
    {"HF_HUB_CACHE": "/tmp/hubcache", "HF_HOME": "/tmp/ignored"},
    {"HUGGINGFACE_HUB_CACHE": "/tmp/legacy-name"},
    {"HF_HOME": "~/somewhere"},
])
def test_default_cache_dir_matches_huggingface_hub(env):
    keys = ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE", "HF_HOME", "XDG_CACHE_HOME")
    clean = {k: v for k, v in __import__("os").environ.items() if k not in keys}
    clean.update(env)
    code = "import json; from huggingface_hub import constants as c; print(json.dumps(c.HF_HUB_CACHE))"
    theirs = json.loads(subprocess.run([sys.executable, "-c", code], env=clean, capture_output=True, text=True, check=True).stdout)
    assert str(locate.default_cache_dir(clean)) == theirs


def test_repo_id_resolves_to_the_snapshot_main_points_at(hub):
    old = hub.add("google/gemma-3-12b-it", {"config.json": gemma3_12b_config()}, refs=())
    new = hub.add("google/gemma-3-12b-it", {"config.json": {**gemma3_12b_config(), "x": 1}}, refs=("main",))
    [snap] = locate.resolve(["google/gemma-3-12b-it"], hub.root)
    assert (snap.path, snap.repo_id, snap.revision, snap.commit) == (new, "google/gemma-3-12b-it", "main", new.name)
    assert snap.in_cache and snap.repo_dir == hub.repo_dir("google/gemma-3-12b-it")
    [by_commit] = locate.resolve(["google/gemma-3-12b-it"], hub.root, revision=old.name)
    assert by_commit.path == old
    [by_prefix] = locate.resolve(["google/gemma-3-12b-it"], hub.root, revision=old.name[:10])
    assert by_prefix.path == old
    both = locate.resolve(["google/gemma-3-12b-it"], hub.root, all_revisions=True)
    assert sorted(s.path for s in both) == sorted([old, new])
    assert {s.path: s.revision for s in both} == {old: None, new: "main"}


def test_nested_ref_names_resolve(hub):
    snap = hub.add("google/gemma-3-1b-it", {"config.json": gemma3_12b_config()}, refs=("refs/pr/3".split("/", 1)[1],))
    [found] = locate.resolve(["google/gemma-3-1b-it"], hub.root, revision="pr/3")
    assert found.path == snap


def test_uncached_repo_is_a_usage_error_naming_the_cache_and_the_download(hub):
    hub.add("google/gemma-3-1b-it", {"config.json": gemma3_12b_config()})
    with pytest.raises(UsageError) as e:
        locate.resolve(["google/gemma-3-27b-it"], hub.root)
    msg = str(e.value)
    assert str(hub.root) in msg and "models--google--gemma-3-27b-it" in msg and "hf download google/gemma-3-27b-it" in msg


def test_unknown_revision_lists_what_is_cached(hub):
    snap = hub.add("google/gemma-3-1b-it", {"config.json": gemma3_12b_config()})
    with pytest.raises(UsageError) as e:
        locate.resolve(["google/gemma-3-1b-it"], hub.root, revision="v9")
    assert "'v9'" in str(e.value) and f"main={snap.name[:12]}" in str(e.value)


@pytest.mark.parametrize("bad", ["../../no-such-dir-gd", "/etc/passwd/x/y", "a/../b", "org/name/extra", "org--x/name", "a b", "org/..", "../no-such-gd/x"])
def test_hostile_or_malformed_repo_ids_are_refused(hub, bad):
    with pytest.raises(UsageError):
        locate.resolve([bad], hub.root)


@pytest.mark.parametrize("bad", ["../main", "/abs", "a/../../b", ""])
def test_hostile_revisions_are_refused(hub, bad):
    hub.add("google/gemma-3-1b-it", {"config.json": gemma3_12b_config()})
    with pytest.raises(UsageError):
        locate.resolve(["google/gemma-3-1b-it"], hub.root, revision=bad)


def test_paths_plain_folder_snapshot_folder_and_repo_folder(hub, tmp_path):
    plain = tmp_path / "my-finetune"
    plain.mkdir()
    (plain / "config.json").write_text(json.dumps(gemma3_12b_config()))
    [p] = locate.resolve([str(plain)], hub.root)
    assert p.path == plain and not p.in_cache and p.state_dir == plain / ".gemma-doctor"
    [cfg_file] = locate.resolve([str(plain / "config.json")], hub.root)
    assert cfg_file.path == plain

    snap = hub.add("google/gemma-3-12b-it", {"config.json": gemma3_12b_config()})
    [s] = locate.resolve([str(snap)], tmp_path / "elsewhere")
    assert s.in_cache and s.repo_id == "google/gemma-3-12b-it" and s.revision == "main" and s.cache_dir == hub.root
    [r] = locate.resolve([str(hub.repo_dir("google/gemma-3-12b-it"))], tmp_path / "elsewhere")
    assert r.path == snap


def test_whole_cache_lists_model_repos_only(hub):
    hub.add("google/gemma-3-12b-it", {"config.json": gemma3_12b_config()})
    hub.add("meta/llama", {"config.json": llama_config()})
    (hub.root / "datasets--org--data" / "snapshots").mkdir(parents=True)
    (hub.root / ".locks").mkdir()
    detached = hub.add("org/detached", {"config.json": gemma3_12b_config()}, refs=())
    snaps = locate.resolve([], hub.root)
    assert [s.repo_id for s in snaps] == ["google/gemma-3-12b-it", "meta/llama", "org/detached"]
    assert snaps[-1].path == detached  # no main ref: its snapshots are still checked


def test_missing_cache_is_a_usage_error(tmp_path):
    with pytest.raises(UsageError, match="no Hugging Face cache"):
        locate.resolve([], tmp_path / "nope")
