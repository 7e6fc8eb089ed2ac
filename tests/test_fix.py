"""`fix` and `restore` on real hub-cache layouts and plain folders: atomic, link-safe, reversible, idempotent."""

from __future__ import annotations

import json
import os
import stat

import pytest
from huggingface_hub import scan_cache_dir

from tests.builders import (HubCache, example_file, gemma2_config, gemma3_1b_config, gemma3_12b_config,

                            generation_config, llama_config, tree_state)

# These tests exercise the on-disk fix, planned only where transformers 4.50.x will run (tests/conftest.py).
pytestmark = pytest.mark.usefixtures("plan_450")

REPO = "google/gemma-3-12b-it"


@pytest.fixture
def two_revisions(hub):
    """gemma-3-12b-it with main and an older revision sharing config and weight blobs."""
    files = {"config.json": example_file("config.json"), "generation_config.json": example_file("generation_config.json"),
             "model.safetensors": b"\x08\x00\x00\x00\x00\x00\x00\x00{}      "}
    old = hub.add(REPO, {**files, "README.md": b"old\n"}, refs=("v1",))
    main = hub.add(REPO, files, refs=("main",))
    return hub, main, old


def test_dry_run_prints_the_diff_and_writes_nothing(two_revisions, cli):
    hub, main, _ = two_revisions
    before = tree_state(hub.root)
    r = cli("fix", REPO, "--cache-dir", hub.root)
    assert r.code == 0, r
    assert tree_state(hub.root) == before
    assert '+    "use_cache": false' in r.out and '+  "use_cache": false' in r.out
    assert f"--- {main / 'config.json'}" in r.out
    assert "run again with --inplace" in r.err


def test_inplace_replaces_links_leaves_blobs_and_other_revisions_and_restore_is_byte_identical(two_revisions, cli):
    hub, main, old = two_revisions
    before = tree_state(hub.repo_dir(REPO))
    blobs = hub.blob_digests()
    old_state = tree_state(old)

    r = cli("fix", REPO, "--inplace", "--cache-dir", hub.root)
    assert r.code == 0, r
    for name in ("config.json", "generation_config.json"):
        assert not (main / name).is_symlink() and (main / name).is_file()
    assert (main / "model.safetensors").is_symlink()
    assert json.loads((main / "config.json").read_text())["text_config"]["use_cache"] is False
    assert json.loads((main / "generation_config.json").read_text())["use_cache"] is False
    # only the lines that changed
    assert (main / "config.json").read_text() == example_file("config.json").decode().replace(
        '"sliding_window": 1024\n', '"sliding_window": 1024,\n    "use_cache": false\n')
    assert hub.blob_digests() == blobs
    assert tree_state(old) == old_state
    info = scan_cache_dir(hub.root)
    assert info.warnings == [] and len(info.repos) == 1 and len(next(iter(info.repos)).revisions) == 2

    again = cli("fix", REPO, "--inplace", "--cache-dir", hub.root, "--format", "json")
    assert again.code == 0 and again.json()["models"][0]["status"] == "up-to-date"
    assert "nothing to change" in again.err

    restored = cli("restore", REPO, "--cache-dir", hub.root)
    assert restored.code == 0, restored
    after = {k: v for k, v in tree_state(hub.repo_dir(REPO)).items() if not k.startswith(".gemma-doctor")}
    assert after == before
    assert os.readlink(main / "config.json") == os.readlink(old / "config.json")
    assert not (hub.repo_dir(REPO) / ".gemma-doctor" / "undo.json").exists()
    assert cli("restore", REPO, "--cache-dir", hub.root, "--format", "json").json()["models"][0]["status"] == "nothing-to-restore"


def test_transformers_loads_the_fixed_config_with_use_cache_false(two_revisions, cli):
    transformers = pytest.importorskip("transformers")
    hub, main, _ = two_revisions
    assert cli("fix", REPO, "--inplace", "--cache-dir", hub.root).code == 0
    config = transformers.AutoConfig.from_pretrained(REPO, cache_dir=str(hub.root), local_files_only=True)
    assert config.text_config.use_cache is False
    gen = transformers.GenerationConfig.from_pretrained(REPO, cache_dir=str(hub.root), local_files_only=True)
    assert gen.use_cache is False


@pytest.mark.parametrize("make,key", [(gemma3_1b_config, "use_cache"), (gemma2_config, "use_cache")])
def test_flat_configs_are_fixed_at_the_top_level(hub, cli, make, key):
    snap = hub.add("org/flat", {"config.json": make()})
    assert cli("fix", "org/flat", "--inplace", "--cache-dir", hub.root).code == 0
    assert json.loads((snap / "config.json").read_text())[key] is False
    assert not (snap / "generation_config.json").exists()  # a missing file stays missing


def test_plain_folder_fix_and_restore_keep_bytes_and_mode(tmp_path, cli):
    folder = tmp_path / "finetune"
    folder.mkdir()
    original = (json.dumps(gemma3_12b_config(), indent=2) + "\n").encode()
    (folder / "config.json").write_bytes(original)
    os.chmod(folder / "config.json", 0o640)
    assert cli("fix", folder, "--inplace").code == 0
    assert json.loads((folder / "config.json").read_text())["text_config"]["use_cache"] is False
    assert stat.S_IMODE((folder / "config.json").stat().st_mode) == 0o640
    assert cli("restore", folder).code == 0
    assert (folder / "config.json").read_bytes() == original


def test_windows_style_cache_without_links(tmp_path, cli):
    hub = HubCache(tmp_path / "hub", symlinks=False)
    snap = hub.add(REPO, {"config.json": example_file("config.json")})
    before = tree_state(hub.root)
    assert cli("fix", REPO, "--inplace", "--cache-dir", hub.root).code == 0
    assert json.loads((snap / "config.json").read_text())["text_config"]["use_cache"] is False
    assert cli("restore", REPO, "--cache-dir", hub.root).code == 0
    assert {k: v for k, v in tree_state(hub.root).items() if ".gemma-doctor" not in k and ".locks" not in k} == before


def test_non_gemma_and_malformed_models_are_never_modified(hub, cli):
    hub.add("meta/llama", {"config.json": llama_config()})
    hub.add("org/broken", {"config.json": b'{"model_type": "gemma3", "model_type": "gemma2"}'})
    before = tree_state(hub.root)
    r = cli("fix", "meta/llama", "org/broken", "--inplace", "--cache-dir", hub.root, "--format", "json")
    assert tree_state(hub.root) == before
    statuses = [m["status"] for m in r.json()["models"]]
    assert statuses == ["not-applicable", "refused"] and r.code == 1


def test_restore_leaves_a_file_edited_after_the_fix_alone(hub, cli):
    snap = hub.add("org/m", {"config.json": gemma2_config()})
    assert cli("fix", "org/m", "--inplace", "--cache-dir", hub.root).code == 0
    edited = (snap / "config.json").read_text().replace('"hidden_size": 2304', '"hidden_size": 4096')
    (snap / "config.json").write_text(edited)
    r = cli("restore", "org/m", "--cache-dir", hub.root)
    assert r.code == 1 and "changed since gemma-doctor fixed it" in r.out
    assert (snap / "config.json").read_text() == edited


def test_fix_of_a_whole_cache_fixes_every_gemma_repo(hub, cli):
    a = hub.add("google/gemma-2-2b-it", {"config.json": gemma2_config()})
    b = hub.add("google/gemma-3-12b-it", {"config.json": gemma3_12b_config(), "generation_config.json": generation_config()})
    c = hub.add("meta/llama", {"config.json": llama_config()})
    assert cli("fix", "--inplace", "--cache-dir", hub.root).code == 0
    assert json.loads((a / "config.json").read_text())["use_cache"] is False
    assert json.loads((b / "config.json").read_text())["text_config"]["use_cache"] is False
    assert (c / "config.json").is_symlink()
    assert cli("check", "--cache-dir", hub.root).code == 0


def test_read_only_folder_is_a_clear_error_and_nothing_changes(hub, cli):
    if os.geteuid() == 0:
        pytest.skip("root ignores file permissions")
    snap = hub.add("org/m", {"config.json": gemma2_config()})
    os.chmod(snap, 0o555)
    try:
        r = cli("fix", "org/m", "--inplace", "--cache-dir", hub.root)
    finally:
        os.chmod(snap, 0o755)
    assert r.code == 3 and "cannot write" in r.out


@pytest.mark.parametrize("files, says", [
    ({"config.json": {"model_type": "gemma3n", "text_config": {"model_type": "gemma3n_text", "use_cache": True}}},
     "its gemma3n_text text model builds no HybridCache; nothing to fix"),
    ({"config.json": {**gemma3_12b_config(), "text_config": [1, 2]}},
     "config.json: text_config is not an object; not rewritten"),
])
def test_fix_leaves_alone_what_it_must_not_or_cannot_rewrite_and_says_why(hub, cli, files, says):
    hub.add("org/m", files)
    before = tree_state(hub.root)
    r = cli("fix", "org/m", "--inplace", "--cache-dir", hub.root, "--format", "json")
    (model,) = r.json()["models"]
    assert says in model["messages"], model
    assert tree_state(hub.root) == before


def _merged_weights(head: bytes = b"\x80\x3f", dtype: str = "BF16") -> bytes:
    """A merged model's safetensors: model.embed_tokens.weight (zeros) and lm_head.weight filled with ``head``."""
    from tests.test_safetensors import st_file

    raw = bytearray(st_file({"model.embed_tokens.weight": (dtype, [16, 8]), "lm_head.weight": (dtype, [16, 8])},
                            {"format": "pt"}))
    size = len(head) * 16 * 8
    raw[len(raw) - size:] = head * 16 * 8
    return bytes(raw)


def test_a_cached_merged_model_is_untied_by_replacing_the_link_and_restored_byte_identical(hub, cli):
    """GD750's cure on a hub-cache snapshot: config.json (a link to a blob that another revision shares) is replaced
    by a file with tie_word_embeddings false beside use_cache false (one change, one diff); every blob keeps its bytes,
    the weights are only read, and restore brings the link back."""
    files = {"config.json": gemma3_1b_config(), "model.safetensors": _merged_weights()}
    old = hub.add(REPO, {**files, "README.md": b"old\n"}, refs=("v1",))
    main = hub.add(REPO, files, refs=("main",))
    before, blobs, old_state = tree_state(hub.repo_dir(REPO)), hub.blob_digests(), tree_state(old)

    dry = cli("fix", REPO, "--cache-dir", hub.root, "--format", "json")
    assert dry.code == 0 and tree_state(hub.repo_dir(REPO)) == before
    (change,) = dry.json()["models"][0]["changes"]
    assert change["keys"] == ["use_cache", "tie_word_embeddings"]
    assert '+  "tie_word_embeddings": false' in change["diff"] and '+  "use_cache": false' in change["diff"]

    assert cli("fix", REPO, "--inplace", "--cache-dir", hub.root).code == 0
    assert not (main / "config.json").is_symlink() and (main / "model.safetensors").is_symlink()
    fixed = json.loads((main / "config.json").read_text())
    assert (fixed["tie_word_embeddings"], fixed["use_cache"]) == (False, False)
    assert hub.blob_digests() == blobs and tree_state(old) == old_state
    check = cli("check", REPO, "--cache-dir", hub.root, "--format", "json", "--fail-on", "never", "--gpu", "none")
    assert "GD750" not in {f["code"] for f in check.json()["models"][0]["findings"]}

    assert cli("restore", REPO, "--cache-dir", hub.root).code == 0
    assert {k: v for k, v in tree_state(hub.repo_dir(REPO)).items() if not k.startswith(".gemma-doctor")} == before
    assert os.readlink(main / "config.json") == os.readlink(old / "config.json")


@pytest.mark.parametrize("weights, status, says", [
    # equal value for value: tying them again loses nothing; the duplicate is not dropped (a safetensors rewrite)
    (_merged_weights(b"\x00\x00"), "not-applicable", "config.json stays tied"),
    # a dtype the comparison does not read: the flag is not written on a guess
    (_merged_weights(b"\x01", "U8"), "refused", "could not be compared"),
])
def test_the_tie_flag_is_written_only_for_a_head_known_to_differ(hub, cli, weights, status, says):
    snap = hub.add(REPO, {"config.json": {**gemma3_1b_config(), "use_cache": False}, "model.safetensors": weights})
    r = cli("fix", REPO, "--inplace", "--cache-dir", hub.root, "--format", "json")
    (model,) = r.json()["models"]
    assert model["status"] == status and any(says in m for m in model["messages"]), model
    assert model["changes"] == [] and r.code == (1 if status == "refused" else 0)
    assert (snap / "config.json").is_symlink()


def test_a_config_edited_between_plan_and_write_is_replanned_with_the_head_verdict_kept(hub):
    """Under the lock, a config.json changed since planning is planned again from its new bytes; the head comparison
    (the weights, which fix never writes) carries over, so the tie flag is still written, on the edited file."""
    from gemma_doctor.fixes import apply_plan, plan_model, weigh_head
    from gemma_doctor.locate import resolve
    from gemma_doctor.model import read_model

    snap = hub.add(REPO, {"config.json": {**gemma3_1b_config(), "use_cache": False},
                          "model.safetensors": _merged_weights()})
    plan = plan_model(weigh_head(read_model(resolve([REPO], hub.root)[0])))
    assert [c.keys for c in plan.changes] == [("tie_word_embeddings",)]
    edited = {**gemma3_1b_config(), "use_cache": False, "max_position_embeddings": 4096}
    (snap / "config.json").unlink()
    (snap / "config.json").write_text(json.dumps(edited))
    (written,) = apply_plan(plan)
    assert json.loads((snap / "config.json").read_text()) == {**edited, "tie_word_embeddings": False}
    assert json.loads(written.before) == edited
