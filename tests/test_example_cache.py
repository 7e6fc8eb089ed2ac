"""The bundled example cache (examples/build_example_cache.py): realistic gemma-3-12b-it and gemma-4-E2B-it snapshots."""

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
G4 = EXAMPLES / "google--gemma-4-E2B-it"
G4_MANIFEST = builder.load_manifest(G4 / "tensors.json")


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
    repos = {r.repo_id: r for r in info.repos}
    assert set(repos) == {"google/gemma-3-12b-it", "google/gemma-4-E2B-it"}
    (rev,) = repos["google/gemma-3-12b-it"].revisions
    assert rev.refs == frozenset({"main"}) and len(rev.files) == 8
    (rev4,) = repos["google/gemma-4-E2B-it"].revisions
    assert rev4.refs == frozenset({"main"}) and len(rev4.files) == 3 + len(G4_MANIFEST["shards"])


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


def test_gemma4_manifest_is_gemma_4_e2b_it():
    """The per-layer embedding table (2.35B) dwarfs the main one (0.40B); the 20 KV-shared layers have no k/v_proj."""
    shapes = {n: s for sh in G4_MANIFEST["shards"] for n, s in sh["tensors"]}
    assert G4_MANIFEST["repo_id"] == "google/gemma-4-E2B-it" and len(shapes) == 1951
    assert shapes["model.language_model.embed_tokens_per_layer.weight"] == [262144, 35 * 256]
    assert shapes["model.language_model.embed_tokens.weight"] == [262144, 1536]
    assert "model.language_model.layers.14.self_attn.k_proj.weight" in shapes
    assert not any(f"layers.{i}.self_attn.k_proj" in n for n in shapes for i in range(15, 35) if "language_model" in n)
    assert round(sum(__import__("math").prod(s) for s in shapes.values()) / 1e9, 2) == 5.10


def test_check_gemma4_with_the_bundled_training_config_shows_its_traps(cli, example):
    r = cli("check", "google/gemma-4-E2B-it", "--cache-dir", example, "--gpu", "T4", "--training-config",
            EXAMPLES / "gemma-4-E2B-it.train.yaml", "--format", "json")
    (m,) = r.json()["models"]
    assert m["family"] == "gemma4" and m["recommendation"]["precision"] == "fp32"
    codes = {f["code"] for f in m["findings"]}
    assert {"GD130", "GD440", "GD443", "GD302"} <= codes
    assert not [c for c in codes if c.startswith("GD2")]  # the census reads the sparse shards cleanly
    assert m["dtypes"]["declared"] == "bfloat16" and m["dtypes"]["dominant"] == "BF16"
