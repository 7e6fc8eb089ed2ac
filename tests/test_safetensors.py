"""The dtype census: safetensors headers read and validated like the reference reader, findings GD201-GD206."""

from __future__ import annotations

import json
import os
import struct
from collections import Counter
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gemma_doctor.readers.dtypes import census, declared_dtype
from gemma_doctor.source import local
from gemma_doctor.readers.safetensors_header import DTYPE_BITS, parse_header, read_header
from tests.builders import HubCache, gemma2_config, gemma3_1b_config, gemma3_12b_config, variant
from tests.safetensors_gen import CORRUPTIONS, corrupted_headers

TINY_GEMMA3 = dict(vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
                   num_key_value_heads=1, head_dim=16)


def st_file(tensors: dict[str, tuple[str, list[int]]], metadata: dict | None = None) -> bytes:
    """A valid safetensors file with zero-filled tensors, built by hand (no library in the way)."""
    sizes = {"F32": 4, "F16": 2, "BF16": 2, "U8": 1, "I32": 4}
    header: dict = {"__metadata__": metadata} if metadata else {}
    off = 0
    for name, (dtype, shape) in tensors.items():
        n = sizes[dtype]
        for d in shape:
            n *= d
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [off, off + n]}
        off += n
    raw = json.dumps(header).encode()
    return struct.pack("<Q", len(raw)) + raw + bytes(off)


def raw_file(header: dict | bytes, data_len: int, length: int | None = None) -> bytes:
    """A safetensors-like file with an arbitrary header (possibly invalid) and ``data_len`` data bytes."""
    raw = header if isinstance(header, bytes) else json.dumps(header).encode()
    return struct.pack("<Q", len(raw) if length is None else length) + raw + bytes(data_len)


def reference_counts(folder: Path) -> dict[str, int]:
    """Parameters per dtype as safetensors.safe_open itself reports them."""
    out: dict[str, int] = {}
    for f in sorted(folder.glob("*.safetensors")):
        for dtype, n in reference_counts_file(f).items():
            out[dtype] = out.get(dtype, 0) + n
    return out


def reference_accepts(path: Path) -> bool:
    """True when safetensors' own reader opens the file."""
    from safetensors import safe_open

    try:
        with safe_open(str(path), "np"):
            return True
    except Exception:  # noqa: BLE001 - any refusal counts
        return False


@pytest.fixture(scope="module")
def saved(tmp_path_factory) -> dict[str, Path]:
    """Tiny Gemma 3 (bf16, single and sharded) and Gemma 2 (fp16) checkpoints saved by transformers."""
    import torch
    from transformers import Gemma2Config, Gemma2ForCausalLM, Gemma3ForCausalLM, Gemma3TextConfig

    root = tmp_path_factory.mktemp("saved")
    torch.manual_seed(0)
    g3 = Gemma3ForCausalLM(Gemma3TextConfig(**TINY_GEMMA3)).to(torch.bfloat16)
    g3.save_pretrained(root / "g3")
    g3.save_pretrained(root / "g3-sharded", max_shard_size="20KB")
    g2 = Gemma2ForCausalLM(Gemma2Config(**TINY_GEMMA3)).to(torch.float16)
    g2.save_pretrained(root / "g2-fp16")
    g3.float().save_pretrained(root / "g3-fp32")
    return {p.name: p for p in root.iterdir()}


def files_of(folder: Path) -> dict[str, bytes]:
    """Every file of a saved folder, for HubCache.add."""
    return {p.name: p.read_bytes() for p in folder.iterdir() if p.is_file()}


def check_json(cli, hub: HubCache, repo: str, *extra: str) -> dict:
    r = cli("check", repo, "--cache-dir", hub.root, "--format", "json", "--fail-on", "never", *extra)
    assert r.code == 0, r
    doc = r.json()
    assert len(doc["models"]) == 1
    return doc["models"][0]


def codes(model: dict) -> list[str]:
    return [f["code"] for f in model["findings"]]


# --- census of real checkpoints -------------------------------------------------------------------

@pytest.mark.parametrize("name", ["g3", "g3-sharded", "g2-fp16", "g3-fp32"])
def test_census_matches_safe_open(saved, name):
    folder = saved[name]
    c = census(local(folder, None), json.loads((folder / "config.json").read_text()))
    ref = reference_counts(folder)
    assert c.weights == ref
    assert c.total_params == sum(ref.values())
    assert sum(s.tensors for s in c.shards) == sum(len(read_header(f).tensors) for f in folder.glob("*.safetensors"))
    assert c.dominant == max(ref, key=ref.get)
    assert not c.index_error and not c.index_problems and all(s.error is None for s in c.shards)


def test_sharded_census_follows_index(saved):
    folder = saved["g3-sharded"]
    index = json.loads((folder / "model.safetensors.index.json").read_text())
    c = census(local(folder, None), json.loads((folder / "config.json").read_text()))
    assert c.source == "model.safetensors.index.json"
    assert [s.file for s in c.shards] == sorted(set(index["weight_map"].values()))
    assert len(c.shards) > 1
    per_shard = [reference_counts_file(folder / s.file) for s in c.shards]
    assert [s.params for s in c.shards] == per_shard
    assert c.bytes == {"BF16": 2 * c.weights["BF16"]}


def reference_counts_file(path: Path) -> dict[str, int]:
    from safetensors import safe_open

    out: dict[str, int] = {}
    with safe_open(str(path), "np") as f:
        for name in f.keys():
            sl = f.get_slice(name)
            n = 1
            for d in sl.get_shape():
                n *= d
            out[sl.get_dtype()] = out.get(sl.get_dtype(), 0) + n
    return out


def test_cli_json_carries_census(cli, hub, saved):
    hub.add("me/tiny-gemma3", files_of(saved["g3-sharded"]))
    m = check_json(cli, hub, "me/tiny-gemma3")
    ref = reference_counts(saved["g3-sharded"])
    assert m["dtypes"]["declared"] == "bfloat16"
    assert m["dtypes"]["declared_key"] == "dtype"
    assert m["dtypes"]["weights"] == ref
    assert m["dtypes"]["dominant"] == "BF16"
    assert m["dtypes"]["quantization"] is None
    assert [s["error"] for s in m["dtypes"]["shards"]] == [None] * len(m["dtypes"]["shards"])
    assert not [c for c in codes(m) if c.startswith("GD2")]
    text = cli("check", "me/tiny-gemma3", "--cache-dir", hub.root, "--fail-on", "never")
    assert "dtypes: declared bfloat16; weights BF16" in text.out


def test_fp16_gemma2_weights_warn(cli, hub, saved):
    hub.add("me/g2", files_of(saved["g2-fp16"]))
    m = check_json(cli, hub, "me/g2")
    assert m["dtypes"]["dominant"] == "F16" and m["dtypes"]["declared"] == "float16"
    gd2 = [f for f in m["findings"] if f["code"].startswith("GD2")]
    assert [f["code"] for f in gd2] == ["GD202"]
    assert gd2[0]["severity"] == "warning" and "bf" in gd2[0]["fix"]


def test_declared_differs_from_weights(cli, hub, saved):
    files = files_of(saved["g3-fp32"])
    cfg = json.loads(files["config.json"])
    cfg["dtype"] = "bfloat16"
    files["config.json"] = cfg
    hub.add("me/mismatch", files)
    m = check_json(cli, hub, "me/mismatch")
    f = [f for f in m["findings"] if f["code"] == "GD201"]
    assert len(f) == 1
    assert f[0]["key"] == "dtype" and "F32" in f[0]["message"] and f[0]["file"] == "config.json"


@pytest.mark.parametrize("config, expected", [
    ({"torch_dtype": "bfloat16"}, ("bfloat16", "torch_dtype")),
    ({"dtype": "torch.float16", "torch_dtype": "bfloat16"}, ("float16", "dtype")),
    ({"text_config": {"dtype": "bfloat16"}}, ("bfloat16", "text_config.dtype")),
    ({"torch_dtype": "float", "text_config": {"dtype": "bfloat16"}}, ("float32", "torch_dtype")),
    ({"model_type": "gemma3"}, (None, None)),
    ({"torch_dtype": 3}, (None, None)),
])
def test_declared_dtype_keys(config, expected):
    assert declared_dtype(config) == expected


# --- malformed files: findings, never tracebacks --------------------------------------------------

GOOD_HEADER = {"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
               "b": {"dtype": "BF16", "shape": [2, 2], "data_offsets": [8, 16]}}

MALFORMED = {
    "truncated-data": raw_file(GOOD_HEADER, 10),
    "trailing-data": raw_file(GOOD_HEADER, 20),
    "shorter-than-8": b"\x10\x00\x00",
    "length-2^63": raw_file(GOOD_HEADER, 16, length=2**63),
    "length-over-limit": raw_file(GOOD_HEADER, 16, length=100_000_001),
    "length-past-eof": raw_file(GOOD_HEADER, 16, length=10_000),
    "bad-json": raw_file(b'{"a": {"dtype": "F32",', 16),
    "not-utf8": raw_file(b'{"a\xff": 1}', 0),
    "not-object": raw_file(b"[1, 2]", 0),
    "unknown-dtype": raw_file({"a": {"dtype": "F17", "shape": [2], "data_offsets": [0, 8]}}, 8),
    "overlap": raw_file({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
                         "b": {"dtype": "F32", "shape": [2], "data_offsets": [4, 12]}}, 12),
    "gap": raw_file({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
                     "b": {"dtype": "F32", "shape": [2], "data_offsets": [12, 20]}}, 20),
    "end-before-begin": raw_file({"a": {"dtype": "F32", "shape": [0], "data_offsets": [0, 0]},
                                  "b": {"dtype": "F32", "shape": [2], "data_offsets": [8, 0]}}, 8),
    "out-of-file-offsets": raw_file({"a": {"dtype": "F32", "shape": [2**40], "data_offsets": [0, 2**42]}}, 8),
    "size-mismatch": raw_file({"a": {"dtype": "F32", "shape": [3], "data_offsets": [0, 8]}}, 8),
    "shape-overflow": raw_file({"a": {"dtype": "F32", "shape": [2**32, 2**32, 2], "data_offsets": [0, 8]}}, 8),
    "negative-shape": raw_file({"a": {"dtype": "F32", "shape": [-2], "data_offsets": [0, 8]}}, 8),
    "bad-metadata": raw_file({"__metadata__": {"format": 1}, **GOOD_HEADER}, 16),
}


@pytest.mark.parametrize("name", sorted(MALFORMED))
def test_malformed_headers_refused_like_reference(tmp_path, name):
    path = tmp_path / "model.safetensors"
    path.write_bytes(MALFORMED[name])
    h = read_header(path)
    assert not h.ok and h.error
    assert not reference_accepts(path), "the reference reader accepts what we refuse"


@pytest.mark.parametrize("name", ["truncated-data", "length-2^63", "overlap", "unknown-dtype", "bad-json",
                                  "shape-overflow", "out-of-file-offsets"])
def test_malformed_shard_is_a_finding(cli, hub, name):
    hub.add("me/broken", {"config.json": gemma3_1b_config(), "model.safetensors": MALFORMED[name]})
    m = check_json(cli, hub, "me/broken")
    bad = [f for f in m["findings"] if f["code"] == "GD204"]
    assert len(bad) == 1 and bad[0]["severity"] == "error" and bad[0]["file"] == "model.safetensors"
    assert m["dtypes"]["shards"][0]["error"]


@pytest.mark.parametrize("kind", ["fifo", "folder"])
def test_shard_that_is_not_a_file(cli, hub, kind):
    """A FIFO would block a naive open(); a folder cannot be read: both are findings."""
    snap = hub.add("me/odd", {"config.json": gemma3_1b_config()})
    target = snap / "model.safetensors"
    os.mkfifo(target) if kind == "fifo" else target.mkdir()
    m = check_json(cli, hub, "me/odd")
    assert [f["code"] for f in m["findings"] if f["code"].startswith("GD2")] == ["GD204"]


def reference_error(path: Path) -> str | None:
    """safetensors' own reason for refusing the file, or None when it opens it."""
    from safetensors import safe_open

    try:
        with safe_open(str(path), "np"):
            return None
    except Exception as e:  # noqa: BLE001 - any refusal counts
        return str(e)


def _sparse_header_file(path: Path, length: int) -> None:
    """A file whose length field says ``length`` and that is long enough to hold such a header: a real tensor
    entry at the start of the header, the rest a hole (sparse, so no disk is used)."""
    raw = json.dumps({"a": {"dtype": "U8", "shape": [4], "data_offsets": [0, 4]}}).encode()
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", length) + raw)
        f.truncate(8 + length + 4)


def test_header_over_100_million_bytes_is_refused_for_its_size_like_safetensors(tmp_path):
    """The header fits in the file, so only the size limit can refuse it (not the past-the-end check)."""
    path = tmp_path / "huge-header.safetensors"
    _sparse_header_file(path, 100_000_001)
    assert path.stat().st_size > 100_000_000
    h = read_header(path)
    assert not h.ok and h.error == "header length 100000001 exceeds the 100000000-byte limit"
    assert "header too large" in (reference_error(path) or "")


def test_header_of_exactly_100_million_bytes_is_not_refused_for_its_size(tmp_path):
    """The limit is inclusive in safetensors (n > 100,000,000 is too large): this one is refused for its content."""
    path = tmp_path / "limit-header.safetensors"
    _sparse_header_file(path, 100_000_000)
    h = read_header(path)
    assert not h.ok and h.error.startswith("header is not valid JSON"), h.error
    ref = reference_error(path)
    assert ref is not None and "header too large" not in ref and "invalid JSON" in ref


@pytest.mark.parametrize("dtype, count, nbytes, whole", [
    ("F4", 3, 1, False),  # 12 bits: safetensors refuses a slice that does not end on a byte boundary
    ("F4", 3, 2, False),
    ("F4", 4, 2, True),
    ("F6_E2M3", 3, 2, False),  # 18 bits
    ("F6_E3M2", 4, 3, True),  # 24 bits
    ("F4", 0, 0, True),
])
def test_sub_byte_dtypes_must_fill_whole_bytes_like_safetensors(tmp_path, dtype, count, nbytes, whole):
    path = tmp_path / "subbyte.safetensors"
    path.write_bytes(raw_file({"w": {"dtype": dtype, "shape": [count], "data_offsets": [0, nbytes]}}, nbytes))
    h = read_header(path)
    ref = reference_error(path)
    assert h.ok is whole and (ref is None) is whole, (h.error, ref)
    if not whole:  # both check the byte boundary before the byte count
        assert h.error == f"tensor 'w': {count} x {dtype} is not a whole number of bytes"
        assert "byte boundary" in ref


def test_valid_hand_built_file_accepted_like_reference(tmp_path):
    path = tmp_path / "x.safetensors"
    path.write_bytes(raw_file(GOOD_HEADER, 16))
    assert read_header(path).ok and reference_accepts(path)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(data=st.data())
def test_mutated_headers_agree_with_reference(tmp_path, data):
    """Flip bytes of a valid file: we never raise, and we accept exactly what the reference accepts."""
    raw = bytearray(raw_file(GOOD_HEADER, 16))
    for _ in range(data.draw(st.integers(1, 3))):
        i = data.draw(st.integers(0, len(raw) - 1))
        raw[i] = data.draw(st.integers(0, 255))
    path = tmp_path / "m.safetensors"
    path.write_bytes(bytes(raw))
    assert read_header(path).ok == reference_accepts(path)


def reference_view(path: Path) -> dict[str, tuple[str, list[int]]] | None:
    """{name: (dtype, shape)} as safetensors' own reader sees the file, or None when it refuses it."""
    from safetensors import safe_open

    try:
        with safe_open(str(path), "np") as f:
            return {name: (f.get_slice(name).get_dtype(), list(f.get_slice(name).get_shape())) for name in f.keys()}
    except Exception:  # noqa: BLE001 - any refusal counts
        return None


# Corruptions that always break a header, and those that never do; each other kind breaks some headers (an
# offset moved on a zero-sized tensor, a dtype of the same width, a valid surrogate pair...).
ALWAYS_REFUSED = {"drop-field", "repeat-field", "repeat-metadata", "nan", "offsets-length"}
NEVER_REFUSED = {"none", "extra-field"}


@pytest.mark.parametrize("corruption", CORRUPTIONS)
def test_generated_headers_are_accepted_exactly_when_safetensors_accepts_them(tmp_path, corruption):
    """Valid multi-tensor headers (sizes from dtype x shape, data tiled in a shuffled order, sub-byte dtypes in
    whole bytes) and one kind of targeted corruption of them: we accept exactly what safetensors accepts, and
    what we accept tiles the data section as safetensors sees it."""
    seen: Counter[str] = Counter()

    @settings(max_examples=25, deadline=None)
    @given(spec=corrupted_headers(corruption))
    def agree(spec):  # noqa: ANN001, ANN202
        path = tmp_path / "generated.safetensors"
        path.write_bytes(spec.file_bytes())
        h = read_header(path)
        ref = reference_view(path)
        assert h.ok == (ref is not None), (h.error, spec.header_bytes()[:400])
        seen["examples"] += 1
        if not h.ok:
            seen["refused"] += 1
            return
        # The tiling the reference requires, checked on what we return (not on what we were given).
        start = 0
        for t in sorted(h.tensors, key=lambda t: (t.begin, t.end)):
            assert t.begin == start and t.nbytes * 8 == t.numel * DTYPE_BITS[t.dtype]
            start = t.end
        assert start == h.file_size - h.data_start
        assert {t.name: (t.dtype, list(t.shape)) for t in h.tensors} == ref
        seen["accepted with 2+ tensors" if len(h.tensors) >= 2 else "accepted with 0-1 tensors"] += 1

    agree()
    assert seen["examples"] >= 25, seen
    if corruption in NEVER_REFUSED:  # the assertions above ran on real multi-tensor headers, not only on empty ones
        assert seen["refused"] == 0 and seen["accepted with 2+ tensors"] >= 0.6 * seen["examples"], seen
    elif corruption in ALWAYS_REFUSED:
        assert seen["refused"] == seen["examples"], seen
    else:
        assert 0 < seen["refused"], seen


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(spec=st.sampled_from(CORRUPTIONS).flatmap(corrupted_headers))
def test_check_on_a_generated_shard_gives_a_finding_never_an_internal_error(cli, tmp_path_factory, spec):
    hub = HubCache(tmp_path_factory.mktemp("hostile") / "hub")
    hub.add("me/m", {"config.json": gemma3_1b_config(), "model.safetensors": spec.file_bytes()})
    r = cli("check", "me/m", "--cache-dir", hub.root, "--format", "json", "--fail-on", "never")
    assert r.code == 0 and r.code != 70, r
    refused = reference_view(hub.repo_dir("me/m") / "blobs" / next(p.name for p in (hub.repo_dir("me/m") / "blobs").iterdir()
                                                                     if p.read_bytes() == spec.file_bytes())) is None
    assert ("GD204" in codes(r.json()["models"][0])) is refused, spec.corruption


# --- shards and index -----------------------------------------------------------------------------

def sharded_files(weight_map: dict[str, str], shards: dict[str, bytes]) -> dict[str, bytes | dict]:
    files: dict[str, bytes | dict] = {"config.json": gemma3_12b_config(),
                                      "model.safetensors.index.json": {"metadata": {}, "weight_map": weight_map}}
    files.update(shards)
    return files


def test_missing_shard_is_a_finding(cli, hub):
    s1 = st_file({"a": ("BF16", [4, 4])})
    hub.add("me/missing", sharded_files({"a": "model-00001-of-00002.safetensors", "b": "model-00002-of-00002.safetensors"},
                                        {"model-00001-of-00002.safetensors": s1}))
    m = check_json(cli, hub, "me/missing")
    f = [f for f in m["findings"] if f["code"] == "GD203"]
    assert [x["file"] for x in f] == ["model-00002-of-00002.safetensors"]
    assert m["dtypes"]["weights"] == {"BF16": 16}


def test_dangling_blob_is_missing(cli, hub):
    snap = hub.add("me/dangling", {"config.json": gemma3_1b_config(), "model.safetensors": st_file({"a": ("BF16", [2])})})
    (snap / "model.safetensors").resolve().unlink()
    m = check_json(cli, hub, "me/dangling")
    assert [f["code"] for f in m["findings"] if f["code"].startswith("GD2")] == ["GD203"]


def test_index_problems(cli, hub):
    s1 = st_file({"a": ("BF16", [4])})
    hub.add("me/idx", sharded_files({"a": "model-00001-of-00001.safetensors", "zzz": "model-00001-of-00001.safetensors",
                                     "evil": "../../../etc/passwd"},
                                    {"model-00001-of-00001.safetensors": s1}))
    m = check_json(cli, hub, "me/idx")
    f = [x for x in m["findings"] if x["code"] == "GD206"]
    assert len(f) == 2
    assert any("outside" in x["message"] for x in f) and any("zzz" in x["message"] for x in f)


def test_unreadable_index(cli, hub):
    hub.add("me/idx2", {"config.json": gemma3_1b_config(), "model.safetensors.index.json": b"{not json"})
    m = check_json(cli, hub, "me/idx2")
    assert [x["code"] for x in m["findings"] if x["code"].startswith("GD2")] == ["GD206"]


def test_no_weights_no_findings(cli, hub):
    hub.add("me/configs-only", {"config.json": gemma3_1b_config()})
    m = check_json(cli, hub, "me/configs-only")
    assert m["dtypes"]["source"] is None and m["dtypes"]["weights"] == {}
    assert not [c for c in codes(m) if c.startswith("GD2")]


# --- quantization ---------------------------------------------------------------------------------

BNB4 = {"quant_method": "bitsandbytes", "load_in_4bit": True, "bnb_4bit_quant_type": "nf4",
        "bnb_4bit_compute_dtype": "bfloat16", "bnb_4bit_use_double_quant": True}


@pytest.mark.parametrize("qc, expected", [
    (BNB4, {"method": "bitsandbytes", "bits": 4, "compute_dtype": "bfloat16"}),
    ({**BNB4, "bnb_4bit_compute_dtype": None}, {"method": "bitsandbytes", "bits": 4, "compute_dtype": "float32"}),
    ({"quant_method": "bitsandbytes", "load_in_8bit": True}, {"method": "bitsandbytes", "bits": 8, "compute_dtype": "bfloat16"}),
    ({"quant_method": "gptq", "bits": 4, "group_size": 128}, {"method": "gptq", "bits": 4, "compute_dtype": "bfloat16"}),
    ({"quant_method": "awq", "bits": 4, "version": "gemm"}, {"method": "awq", "bits": 4, "compute_dtype": "bfloat16"}),
])
def test_quantization_config(cli, hub, qc, expected):
    weights = st_file({"model.layers.0.mlp.down_proj.weight": ("U8", [64, 1]),
                       "model.layers.0.mlp.down_proj.weight.absmax": ("F32", [4]),
                       "model.layers.0.mlp.down_proj.weight.quant_map": ("F32", [16]),
                       "model.norm.weight": ("BF16", [32])})
    hub.add("me/q", {"config.json": variant(gemma3_1b_config(), quantization_config=qc), "model.safetensors": weights})
    m = check_json(cli, hub, "me/q")
    q = m["dtypes"]["quantization"]
    assert {k: q[k] for k in expected} == expected
    assert m["dtypes"]["weights"] == {"U8": 64, "F32": 20, "BF16": 32}
    gd = [f for f in m["findings"] if f["code"].startswith("GD2")]
    assert [f["code"] for f in gd] == ["GD205"] and gd[0]["severity"] == "info"
    assert expected["compute_dtype"] in gd[0]["message"]


def test_quantized_fp16_compute_on_gemma3_warns(cli, hub):
    hub.add("me/q16", {"config.json": variant(gemma3_1b_config(), quantization_config={**BNB4, "bnb_4bit_compute_dtype": "float16"}),
                       "model.safetensors": st_file({"w": ("U8", [8])})})
    m = check_json(cli, hub, "me/q16")
    assert [f["code"] for f in m["findings"] if f["code"].startswith("GD2")] == ["GD205", "GD202"]


@pytest.mark.parametrize("names, method", [
    (["l.weight", "l.weight.absmax", "l.weight.quant_map"], "bitsandbytes"),
    (["l.qweight", "l.qzeros", "l.scales", "l.g_idx"], "gptq"),
    (["l.qweight", "l.qzeros", "l.scales"], "gptq/awq"),
])
def test_quantized_layout_without_config(cli, hub, names, method):
    hub.add("me/layout", {"config.json": gemma2_config(),
                          "model.safetensors": st_file({n: ("I32", [4]) for n in names})})
    m = check_json(cli, hub, "me/layout")
    assert m["dtypes"]["quantization"]["method"] == method
    assert "GD205" in codes(m)


# --- how the findings state sizes and quantization ----------------------------------------------------

def _fp16_model_folder(folder: Path, params: int) -> Path:
    """A plain model folder: Gemma 2 config and one float16 tensor of ``params`` values (the data a sparse hole)."""
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(variant(gemma2_config(), torch_dtype="float16")))
    header = json.dumps({"w": {"dtype": "F16", "shape": [params], "data_offsets": [0, 2 * params]}}).encode()
    header += b" " * (-len(header) % 8)
    with open(folder / "model.safetensors", "wb") as f:
        f.write(struct.pack("<Q", len(header)) + header)
        f.truncate(8 + len(header) + 2 * params)
    return folder


@pytest.mark.parametrize("params, shown", [(999, "999"), (1000, "1.0K"), (1_500_000, "1.5M"), (10**9, "1.0B")])
def test_parameter_counts_are_stated_in_thousands_millions_and_billions(cli, tmp_path, params, shown):
    folder = _fp16_model_folder(tmp_path / "model", params)
    r = cli("check", str(folder), "--format", "json", "--fail-on", "never")
    gd202 = [f for f in r.json()["models"][0]["findings"] if f["code"] == "GD202"]
    assert len(gd202) == 1, r
    assert f"weights are saved in float16 ({shown} parameters)" in gd202[0]["message"]


@pytest.mark.parametrize("names, says", [
    (["l.weight", "l.weight.absmax", "l.weight.quant_map"],
     "quantized checkpoint (bitsandbytes 4-bit, from tensor layout (.absmax/.quant_map)); compute dtype unknown"),
    (["l.qweight", "l.qzeros", "l.scales", "l.g_idx"],
     "quantized checkpoint (gptq, from tensor layout (qweight/qzeros/scales)); compute dtype bfloat16"),
])
def test_quantization_finding_says_bits_and_compute_dtype_only_when_known(cli, hub, names, says):
    hub.add("me/layout", {"config.json": gemma2_config(), "model.safetensors": st_file({n: ("I32", [4]) for n in names})})
    m = check_json(cli, hub, "me/layout")
    assert [f["message"] for f in m["findings"] if f["code"] == "GD205"] == [says]


def test_a_header_with_more_tensor_entries_than_any_checkpoint_is_refused_before_parsing():
    raw = b'{"t": ' + b'{"a": ' * 100_003 + b"1" + b"}" * 100_003 + b"}"
    h = parse_header(raw, 8 + len(raw), Path("big.safetensors"))
    assert not h.ok and h.error == ("header describes more than 100000 tensors, more than any real checkpoint file; "
                                    "not parsed")


@pytest.mark.parametrize("entry", ["5", '"F32"', "[1, 2]", "null"])
def test_a_tensor_entry_that_is_not_an_object_is_named(entry):
    raw = b'{"w": ' + entry.encode() + b"}"
    h = parse_header(raw, 8 + len(raw), Path("x.safetensors"))
    assert not h.ok and h.error == "tensor 'w': entry is not an object"


@pytest.mark.parametrize("shape, shown", [(b"[-0]", "[-0.0]"), (b"[1.5]", "[1.5]"), (b"[2, 1e0]", "[2, 1.0]")])
def test_a_shape_of_non_integers_is_refused_naming_the_numbers_read(shape, shown):
    """JSON -0 and fractions are numbers safetensors refuses as sizes; the message shows what was read."""
    raw = b'{"w": {"dtype": "F32", "shape": ' + shape + b', "data_offsets": [0, 4]}}'
    h = parse_header(raw, 8 + len(raw) + 4, Path("x.safetensors"))
    assert not h.ok and h.error == f"tensor 'w': shape {shown} is not a list of non-negative integers"


@pytest.mark.parametrize("in_cache", [False, True])
def test_a_missing_shard_says_whether_a_link_dangles(tmp_path, in_cache):
    """A cache snapshot's files are links to blobs: 'dangling link' tells a deleted blob from a file never there."""
    root = tmp_path / "repo"
    root.mkdir()
    os.symlink("blobs/gone", root / "linked.safetensors")
    area = root if in_cache else None
    assert read_header(root / "linked.safetensors", area).error == "missing (dangling link)"
    assert read_header(root / "absent.safetensors", area).error == "missing"
    assert not read_header(root / "absent.safetensors", area).exists


@pytest.mark.parametrize("size", [0, 5, 7])
def test_a_file_too_short_for_the_length_field_claims_no_header(tmp_path, size):
    path = tmp_path / "short.safetensors"
    path.write_bytes(b"\x01" * size)
    h = read_header(path)
    assert not h.ok and h.header_len == 0 and h.file_size == size
    assert h.error == f"file is {size} bytes, shorter than the 8-byte header length"
