"""The bundled example cache (examples/build_example_cache.py): a realistic gemma-3-12b-it snapshot."""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
from pathlib import Path

import pytest

from gemma_doctor.readers.safetensors_header import read_header
from tests.builders import EXAMPLES, git_blob_sha1


def _load_builder():
    spec = importlib.util.spec_from_file_location("build_example_cache", EXAMPLES / "build_example_cache.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


builder = _load_builder()
MANIFEST = builder.load_manifest()
PARAMS = sum(__import__("math").prod(s) for sh in MANIFEST["shards"] for _, s in sh["tensors"])


@pytest.fixture(scope="module")
def example(tmp_path_factory) -> Path:
    dest = tmp_path_factory.mktemp("example") / "hub"
    builder.main([str(dest)])
    return dest


def test_digest_construction_on_a_small_case(tmp_path):
    """The precomputed digests are sha256 of exactly what write_sparse puts on disk."""
    tensors = [("model.embed_tokens.weight", [37, 5]), ("model.norm.weight", [5]), ("a.b", [3, 1, 2])]
    header, data_len = builder.shard_header(tensors)
    path = tmp_path / "small.safetensors"
    builder.write_sparse(path, header, data_len)
    assert hashlib.sha256(path.read_bytes()).hexdigest() == builder.content_sha256(header, data_len)
    assert read_header(path).ok
    from safetensors import safe_open

    with safe_open(str(path), "np") as f:
        assert sorted(f.keys()) == sorted(n for n, _ in tensors)
        assert f.get_slice("a.b").get_shape() == [3, 1, 2] and f.get_slice("a.b").get_dtype() == "BF16"


def test_manifest_digests_are_current():
    """Each shard's header still hashes to what the stored full-content digest was computed from."""
    for shard in MANIFEST["shards"]:
        header, data_len = builder.shard_header(shard["tensors"])
        assert hashlib.sha256(header).hexdigest() == shard["header_sha256"]
        assert len(header) + data_len == shard["size"]


def test_manifest_is_gemma_3_12b_it():
    names = [n for sh in MANIFEST["shards"] for n, _ in sh["tensors"]]
    shapes = {n: s for sh in MANIFEST["shards"] for n, s in sh["tensors"]}
    assert [s["file"] for s in MANIFEST["shards"]] == [f"model-0000{i}-of-00005.safetensors" for i in range(1, 6)]
    assert len(names) == len(set(names)) == 1065
    assert shapes["language_model.model.embed_tokens.weight"] == [262208, 3840]
    assert shapes["language_model.model.layers.0.self_attn.q_proj.weight"] == [4096, 3840]
    assert shapes["multi_modal_projector.mm_input_projection_weight"] == [1152, 3840]
    assert shapes["vision_tower.vision_model.embeddings.patch_embedding.weight"] == [1152, 3, 14, 14]
    assert "language_model.model.layers.47.mlp.down_proj.weight" in shapes
    assert not any("layers.48." in n for n in names) and not any("lm_head" in n for n in names)
    assert round(PARAMS / 1e9, 1) == 12.2


def test_layout_is_the_hubs(example):
    repo = example / "models--google--gemma-3-12b-it"
    commit = (repo / "refs" / "main").read_text()
    snap = repo / "snapshots" / commit
    files = sorted(p.name for p in snap.iterdir())
    assert files == sorted(["config.json", "generation_config.json", "model.safetensors.index.json"]
                           + [s["file"] for s in MANIFEST["shards"]])
    for p in snap.iterdir():
        target = os.readlink(p)
        assert target.startswith("../../blobs/")
        if not p.name.endswith(".safetensors"):
            assert Path(target).name == git_blob_sha1(p.read_bytes())
    for shard in MANIFEST["shards"]:
        blob = repo / "blobs" / shard["sha256"]
        st = blob.stat()
        assert st.st_size == shard["size"]
        assert st.st_blocks * 512 < 1024 * 1024, "the data section must be a hole"
    index = json.loads((snap / "model.safetensors.index.json").read_text())
    assert index["metadata"]["total_size"] == 2 * PARAMS


def test_scan_cache_dir_has_no_warnings(example):
    from huggingface_hub import scan_cache_dir

    info = scan_cache_dir(example)
    assert list(info.warnings) == []
    (repo,) = info.repos
    assert repo.repo_id == "google/gemma-3-12b-it"
    (rev,) = repo.revisions
    assert rev.refs == frozenset({"main"}) and len(rev.files) == 8


def test_check_shows_census_without_shard_findings(cli, example):
    r = cli("check", "google/gemma-3-12b-it", "--cache-dir", example, "--format", "json", "--fail-on", "never")
    (m,) = r.json()["models"]
    dt = m["dtypes"]
    assert dt["declared"] == "bfloat16" and dt["weights"] == {"BF16": PARAMS} and dt["dominant"] == "BF16"
    assert dt["source"] == "model.safetensors.index.json" and len(dt["shards"]) == 5
    assert all(s["error"] is None for s in dt["shards"])
    assert not [f for f in m["findings"] if f["code"].startswith("GD2")]
    text = cli("check", "google/gemma-3-12b-it", "--cache-dir", example, "--fail-on", "never")
    assert "weights BF16 12.2B (12.2B params, 24.4 GB) in 5 file(s)" in text.out


def test_rebuild_is_idempotent(example):
    before = {p: os.readlink(p) for p in example.rglob("*") if p.is_symlink()}
    builder.build(example)
    assert {p: os.readlink(p) for p in example.rglob("*") if p.is_symlink()} == before
