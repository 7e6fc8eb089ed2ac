"""parse_header's fast path (plain json.loads, checks in C loops) against the strict walk it falls back to.

The strict walk (`_parse_strict`) is checked against the safetensors library by tests/test_safetensors.py and
tests/test_hostile_input.py; here every hostile header those tests use, and mutations of real headers aimed at the
points where Python's plain json and serde_json part (repeated keys, escapes, -0, floats, huge numbers, bools,
nesting), must give the same SafetensorsHeader both ways, compared by value and by repr (so 1 against True or 0
against -0.0 differ) — and the fast path must actually be taken on clean headers.
"""

from __future__ import annotations

import importlib.util
import json
import struct
from collections import Counter
from dataclasses import FrozenInstanceError, fields
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gemma_doctor.readers import safetensors_header as sh
from gemma_doctor.readers.safetensors_header import TensorInfo, _parse_fast, _parse_strict, parse_header
from tests.builders import EXAMPLES
from tests.safetensors_gen import CORRUPTIONS, corrupted_headers
from tests.test_hostile_input import safetensors_headers
from tests.test_safetensors import GOOD_HEADER, MALFORMED, TINY_GEMMA3

PATH = Path("x.safetensors")


def _builder():  # noqa: ANN202
    spec = importlib.util.spec_from_file_location("build_example_cache", EXAMPLES / "build_example_cache.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _split(file: bytes) -> tuple[bytes, int]:
    """(header bytes, file size) of a whole safetensors-like file, the header cut where its length field says."""
    n = struct.unpack("<Q", file[:8])[0] if len(file) >= 8 else 0
    return file[8:8 + n], len(file)


def _loop_only(monkeypatch, raw: bytes, size: int):  # noqa: ANN001, ANN202
    """_parse_strict with the tiling checked by its per-tensor loop alone (no quick check in C first)."""
    with monkeypatch.context() as m:
        m.setattr(sh, "_tiles_quickly", lambda *a: False)
        return _parse_strict(raw, size, PATH)


def agree(raw: bytes, size: int, monkeypatch=None) -> bool:  # noqa: ANN001
    """Both paths (and parse_header) give the same header; True when the fast path took it."""
    strict = _parse_strict(raw, size, PATH)
    fast = _parse_fast(raw, size, PATH)
    if fast is not None:
        assert fast == strict and repr(fast) == repr(strict), raw[:300]
        assert all(type(d) is int for t in fast.tensors for d in (*t.shape, t.begin, t.end))
    got = parse_header(raw, size, PATH)
    assert got == strict and repr(got) == repr(strict), raw[:300]
    if monkeypatch is not None:
        loop = _loop_only(monkeypatch, raw, size)
        assert loop == strict and repr(loop) == repr(strict), raw[:300]
    return fast is not None


# --- real headers, and mutations of them ---------------------------------------------------------------------------

@pytest.fixture(scope="module")
def real_headers(tmp_path_factory) -> dict[str, tuple[bytes, int]]:
    """A tiny Gemma 3 saved by transformers, and the bundled gemma-3-12b-it's first shard header (500 tensors)."""
    import torch
    from transformers import Gemma3ForCausalLM, Gemma3TextConfig

    root = tmp_path_factory.mktemp("real")
    torch.manual_seed(0)
    Gemma3ForCausalLM(Gemma3TextConfig(**TINY_GEMMA3)).to(torch.bfloat16).save_pretrained(root)
    out = {"tiny": _split((root / "model.safetensors").read_bytes())}
    builder = _builder()
    header, data_len = builder.shard_header(builder.load_manifest()["shards"][0]["tensors"])
    out["12b"] = (header[8:], len(header) + data_len)
    return out


def _sub(raw: bytes, old: bytes, new: bytes, count: int = 1) -> bytes:
    assert old in raw, old
    return raw.replace(old, new, count)


def _first_entry(raw: bytes) -> tuple[bytes, bytes]:
    """(name, entry) text of the first tensor in a compact header."""
    doc = json.loads(raw)
    name = next(k for k in doc if k != "__metadata__")
    entry = raw[raw.index(json.dumps(name).encode() + b":") + len(json.dumps(name)) + 1:]
    return json.dumps(name).encode(), entry[:entry.index(b"}") + 1]


def mutations(raw: bytes, size: int) -> dict[str, tuple[bytes, int]]:
    """Hostile and harmless edits of a real (compact, metadata-first) header, with the same data section."""
    data_len = size - 8 - len(raw)
    raw = raw.rstrip(b" ")
    name, entry = _first_entry(raw)
    shape = entry[entry.index(b'"shape":') + 8:entry.index(b"]", entry.index(b'"shape":')) + 1]
    first_dim = shape[1:].split(b",")[0].rstrip(b"]")
    doc = json.loads(raw)
    out: dict[str, bytes] = {
        "as is": raw,
        "pretty": json.dumps(doc, indent=2).encode(),
        "keys reversed (data in another order)": json.dumps(dict(reversed(doc.items()))).encode(),
        "padded": raw + b"   \n",
        # repeated keys, at every level
        "tensor twice, same value": _sub(raw, b"{", b"{" + name + b":" + entry + b",", 1),
        "tensor twice, first malformed": _sub(raw, b"{", b"{" + name + b':{"dtype":"BF16"},', 1),
        "tensor twice, first holds an object": _sub(raw, b"{", b"{" + name + b':{"dtype":"BF16","x":{"a":1}},', 1),
        "field twice": _sub(raw, b'"dtype":"BF16"', b'"dtype":"BF16","dtype":"BF16"'),
        "field twice, nothing else lost": _sub(raw, b'"dtype":"BF16",', b'"dtype":"F16","dtype":"BF16",'),
        "metadata twice": _sub(raw, b'{"__metadata__"', b'{"__metadata__":{},"__metadata__"'),
        "metadata key twice": _sub(raw, b'{"format":"pt"}', b'{"format":"np","format":"pt"}'),
        "repeat hidden by a colon in a name": _sub(_sub(raw, b'"dtype":"BF16",', b'"dtype":"F16","dtype":"BF16",'),
                                                    name, name[:-1] + b':"', 1),
        # colons, dashes and escapes in strings
        "colon in a name": _sub(raw, name, name[:-1] + b':x"'),
        "colon in metadata": _sub(raw, b'"pt"', b'"p:t"'),
        "dash in a name": _sub(raw, name, name[:-1] + b'-0"'),
        "dash in metadata": _sub(raw, b'"pt"', b'"2024-01-05"'),
        "escape in a name": _sub(raw, name, name[:-1] + b'\\u0041"'),
        "escaped quote in metadata": _sub(raw, b'"pt"', b'"p\\"t"'),
        "lone surrogate in a name": _sub(raw, name, name[:-1] + b'\\ud800"'),
        "surrogate pair in metadata": _sub(raw, b'"pt"', b'"\\ud83d\\ude00"'),
        "escaped metadata key": _sub(raw, b'"__metadata__"', b'"__metadata\\u005f_"'),
        "non-ASCII name": _sub(raw, name, name[:-1] + 'é✓'.encode() + b'"'),
        # numbers
        "-0 dim": _sub(raw, b"[" + first_dim, b"[-0" + first_dim[1:] if len(first_dim) > 1 else b"[-0"),
        "-0 offset": _sub(raw, b'"data_offsets":[0,', b'"data_offsets":[-0,'),
        "-0 in an extra field": _sub(raw, b'"dtype":"BF16"', b'"dtype":"BF16","x":-0'),
        "negative offset": _sub(raw, b'"data_offsets":[0,', b'"data_offsets":[-1,'),
        "1e3 dim": _sub(raw, b"[" + first_dim, b"[1e3"),
        "1.0 offset": _sub(raw, b'"data_offsets":[0,', b'"data_offsets":[0.0,'),
        "dim 2**64": _sub(raw, b"[" + first_dim, b"[" + str(2**64).encode()),
        "dim 2**64-1": _sub(raw, b"[" + first_dim, b"[" + str(2**64 - 1).encode()),
        "dim of 400 digits": _sub(raw, b"[" + first_dim, b"[1" + b"0" * 400),
        "dim of 5000 digits": _sub(raw, b"[" + first_dim, b"[1" + b"0" * 5000),
        "NaN dim": _sub(raw, b"[" + first_dim, b"[NaN"),
        "Infinity offset": _sub(raw, b'"data_offsets":[0,', b'"data_offsets":[Infinity,'),
        "-Infinity in an extra field": _sub(raw, b'"dtype":"BF16"', b'"dtype":"BF16","x":-Infinity'),
        "true dim": _sub(raw, b"[" + first_dim, b"[true"),
        "false offset": _sub(raw, b'"data_offsets":[0,', b'"data_offsets":[false,'),
        "null dim": _sub(raw, b"[" + first_dim, b"[null"),
        # structure
        "extra field": _sub(raw, b'"dtype":"BF16"', b'"dtype":"BF16","x":1'),
        "extra field at depth 127": _sub(raw, b'"dtype":"BF16"', b'"dtype":"BF16","x":' + b"[" * 125 + b"]" * 125),
        "extra field at depth 128": _sub(raw, b'"dtype":"BF16"', b'"dtype":"BF16","x":' + b"[" * 126 + b"]" * 126),
        "extra object field": _sub(raw, b'"dtype":"BF16"', b'"dtype":"BF16","x":{"y":{}}'),
        "field missing": _sub(raw, b'"dtype":"BF16",', b""),
        "shape as an object": _sub(raw, b'"shape":[', b'"shape":{"a":1},"y":['),
        "shape an empty object": _sub(raw, b'"shape":' + shape, b'"shape":{}'),
        "shape an empty string": _sub(raw, b'"shape":' + shape, b'"shape":""'),
        "offsets an object of two": _sub(raw, b'"data_offsets":[0,', b'"data_offsets":{"0":0,"1":1},"y":[0,'),
        "offsets of three": _sub(raw, b'"data_offsets":[0,', b'"data_offsets":[0,0,'),
        "offsets as a string": _sub(raw, b'"data_offsets":[0,', b'"data_offsets":"[0,",'),
        "metadata null": _sub(raw, b'{"format":"pt"}', b"null"),
        "metadata absent": _sub(raw, b'"__metadata__":{"format":"pt"},', b""),
        "metadata last": json.dumps({**{k: v for k, v in doc.items() if k != "__metadata__"},
                                     "__metadata__": doc["__metadata__"]}, separators=(",", ":")).encode(),
        "metadata value an int": _sub(raw, b'"pt"', b"1"),
        "metadata value null": _sub(raw, b'"pt"', b"null"),
        "metadata value a list": _sub(raw, b'"pt"', b'["pt"]'),
        "metadata a list": _sub(raw, b'{"format":"pt"}', b'["pt"]'),
        "metadata a string": _sub(raw, b'{"format":"pt"}', b'"pt"'),
        "metadata an empty list": _sub(raw, b'{"format":"pt"}', b"[]"),
        "metadata false": _sub(raw, b'{"format":"pt"}', b"false"),
        "metadata empty": _sub(raw, b'{"format":"pt"}', b"{}"),
        "dtype as a map": _sub(raw, b'"dtype":"BF16"', b'"dtype":{"BF16":null}'),
        "dtype as a map with a value": _sub(raw, b'"dtype":"BF16"', b'"dtype":{"BF16":1}'),
        "dtype as a list": _sub(raw, b'"dtype":"BF16"', b'"dtype":["BF16"]'),
        "dtype a number": _sub(raw, b'"dtype":"BF16"', b'"dtype":16'),
        "dtype lower case": _sub(raw, b'"dtype":"BF16"', b'"dtype":"bf16"'),
        "dtype of another width": _sub(raw, b'"dtype":"BF16"', b'"dtype":"F32"'),
        "entry null": _sub(raw, name + b":" + entry, name + b":null"),
        "entry a list": _sub(raw, name + b":" + entry, name + b":[1,2]"),
        "top level a list": b"[" + raw + b"]",
        "BOM": "\ufeff".encode() + raw,
        "trailing junk": raw + b"x",
        "not UTF-8": _sub(raw, name, name[:-1] + b'\xff"'),
        "zero-size tensor added": _sub(raw, b'{"__metadata__"', b'{"z":{"dtype":"F32","shape":[' + str(2**40).encode()
                                       + b',' + str(2**40).encode() + b',0],"data_offsets":[0,0]},"__metadata__"'),
        "zero-size tensor added, no overflow": _sub(raw, b'{"__metadata__"', b'{"z":{"dtype":"F32","shape":[0,'
                                                    + str(2**40).encode() + b'],"data_offsets":[0,0]},"__metadata__"'),
    }
    cases = {k: (v, 8 + len(v) + data_len) for k, v in out.items()}
    cases["data section one byte short"] = (raw, 8 + len(raw) + data_len - 1)
    cases["data section one byte long"] = (raw, 8 + len(raw) + data_len + 1)
    return cases


CLEAN = {"as is", "pretty", "keys reversed (data in another order)", "padded", "colon in a name", "colon in metadata",
         "dash in a name", "dash in metadata", "non-ASCII name", "metadata null", "metadata absent", "metadata last",
         "metadata empty", "data section one byte short", "data section one byte long", "dtype of another width",
         "dim 2**64-1", "zero-size tensor added", "zero-size tensor added, no overflow"}


# Those parse_header accepts, as safetensors does (checked below); the fast path's refusals of the clean ones
# (tiling, sizes) must be the strict walk's too.
ACCEPTED = {"as is", "pretty", "keys reversed (data in another order)", "padded", "colon in a name",
            "colon in metadata", "dash in a name", "dash in metadata", "non-ASCII name", "metadata null",
            "metadata absent", "metadata last", "metadata empty", "zero-size tensor added, no overflow",
            "-0 in an extra field", "extra field", "extra object field", "extra field at depth 127", "dtype as a map",
            "escape in a name", "escaped metadata key", "escaped quote in metadata", "surrogate pair in metadata",
            "metadata key twice", "tensor twice, same value"}


def reference_accepts(raw: bytes, size: int, folder: Path) -> bool:
    from safetensors import safe_open

    path = folder / "m.safetensors"
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(raw)) + raw)
        f.truncate(size)
    try:
        with safe_open(str(path), "np"):
            return True
    except Exception:  # noqa: BLE001 - any refusal counts
        return False


@pytest.mark.parametrize("which", ["tiny", "12b"])
def test_fast_path_agrees_with_the_strict_walk_on_mutations_of_real_headers(real_headers, monkeypatch, tmp_path,
                                                                            which):
    raw, size = real_headers[which]
    cases = mutations(raw, size)
    taken = {name for name, (r, s) in cases.items() if agree(r, s, monkeypatch)}
    accepted = {name for name, (r, s) in cases.items() if parse_header(r, s, PATH).ok}
    assert accepted == ACCEPTED, (accepted - ACCEPTED, ACCEPTED - accepted)
    assert accepted == {name for name, (r, s) in cases.items() if reference_accepts(r, s, tmp_path)}
    # The fast path reads every header real writers make (and these harmless variants), and nothing it must not.
    assert taken == CLEAN, (taken - CLEAN, CLEAN - taken)
    assert parse_header(raw, size, PATH).ok and parse_header(raw, size, PATH).tensors


def test_the_real_headers_are_read_by_the_fast_path(real_headers):
    for raw, size in real_headers.values():
        h = _parse_fast(raw, size, PATH)
        assert h is not None and h.ok and len(h.tensors) >= 28 and h.metadata == {"format": "pt"}


def test_every_bundled_shard_header_is_read_by_the_fast_path_as_by_the_strict_walk():
    builder = _builder()
    g4 = EXAMPLES / "google--gemma-4-E2B-it" / "tensors.json"
    for manifest in (builder.load_manifest(), builder.load_manifest(g4)):
        for shard in manifest["shards"]:
            header, data_len = builder.shard_header(shard["tensors"])
            assert agree(header[8:], len(header) + data_len)


# --- every hostile header of the other tests -----------------------------------------------------------------------

@pytest.mark.parametrize("name", sorted(MALFORMED))
def test_malformed_files_of_test_safetensors(monkeypatch, name):
    raw, size = _split(MALFORMED[name])
    agree(raw, size, monkeypatch)
    agree(MALFORMED[name][8:], len(MALFORMED[name]), monkeypatch)  # the whole rest, whatever the length field says


HAND_BUILT = {
    "good": (json.dumps(GOOD_HEADER).encode(), 16),
    "100k objects": (b'{"t": ' + b'{"a": ' * 100_003 + b"1" + b"}" * 100_003 + b"}", 0),
    **{f"entry {e}": (b'{"w": ' + e.encode() + b"}", 0) for e in ["5", '"F32"', "[1, 2]", "null"]},
    **{f"shape {s}": (b'{"w": {"dtype": "F32", "shape": ' + s + b', "data_offsets": [0, 4]}}', 4)
       for s in [b"[-0]", b"[1.5]", b"[2, 1e0]"]},
    **{f"{d} x {c} in {b}": (json.dumps({"w": {"dtype": d, "shape": [c], "data_offsets": [0, b]}}).encode(), b)
       for d, c, b in [("F4", 3, 1), ("F4", 3, 2), ("F4", 4, 2), ("F6_E2M3", 3, 2), ("F6_E3M2", 4, 3), ("F4", 0, 0)]},
    "empty": (b"{}", 0),
    "empty, with data": (b"{}", 1),
    "starts past 0": (json.dumps({"w": {"dtype": "U8", "shape": [2], "data_offsets": [4, 6]}}).encode(), 6),
    **{f"top level {v}": (v.encode(), 0) for v in ["5", '"x"', "null", "true", "[]"]},
    "only metadata": (b'{"__metadata__": {"a": "b"}}', 0),
    "two zero-size tensors at one offset": (b'{"b": {"dtype": "F32", "shape": [0], "data_offsets": [0, 0]}, '
                                            b'"a": {"dtype": "U8", "shape": [2, 0], "data_offsets": [0, 0]}}', 0),
    "long shape of ones": (json.dumps({"w": {"dtype": "U8", "shape": [1] * 40 + [3],
                                             "data_offsets": [0, 3]}}).encode(), 3),
    "long shape that overflows": (json.dumps({"w": {"dtype": "U8", "shape": [2**63] * 40,
                                                    "data_offsets": [0, 3]}}).encode(), 3),
    "bits past 64 bits": (json.dumps({"w": {"dtype": "U8", "shape": [2**62], "data_offsets": [0, 2**62]}}).encode(),
                          2**62),
}


@pytest.mark.parametrize("name", sorted(HAND_BUILT))
def test_hand_built_headers_of_test_safetensors(monkeypatch, name):
    raw, data_len = HAND_BUILT[name]
    taken = agree(raw, 8 + len(raw) + data_len, monkeypatch)
    # Taken: well-formed JSON of the right shape, whatever the tiling then says (its refusals are _tiled's, shared).
    assert taken is not name.startswith(("100k", "entry", "shape", "top level")), name


def test_long_shapes_are_left_to_the_loop():
    """A shape's product is taken whole only up to 16 dimensions (a hostile shape of thousands of 64-bit dimensions
    would make it slow); longer ones go to the loop, which stops at the first partial product past 64 bits."""
    assert sh._tiles_quickly([[1] * 16], ["U8"], [0], [1], 1)
    assert not sh._tiles_quickly([[1] * 17], ["U8"], [0], [1], 1)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(raw=st.binary(max_size=256), size=st.integers(0, 2**64))
def test_any_bytes(raw, size):
    agree(raw, size)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(spec=safetensors_headers())
def test_hostile_numbers_of_test_hostile_input(spec):
    raw, data_len = spec
    agree(raw, 8 + len(raw) + data_len)


@pytest.mark.parametrize("corruption", CORRUPTIONS)
def test_generated_corruptions_of_test_safetensors(corruption):
    """The generated headers and targeted corruptions of test_safetensors: the same result both ways; the fast path
    reads the valid ones without escapes, and the repeated-key and number corruptions never."""
    seen: Counter[str] = Counter()

    @settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
    @given(spec=corrupted_headers(corruption))
    def check(spec):  # noqa: ANN001, ANN202
        raw = spec.header_bytes()
        taken = agree(raw, 8 + len(raw) + spec.data_len)
        seen["taken" if taken else "strict"] += 1
        if corruption == "none" and b"\\" not in raw:
            assert taken, raw
        if corruption in {"repeat-field", "repeat-name", "repeat-metadata", "nan", "deep", "surrogate", "dtype-map",
                          "drop-field", "extra-field", "offsets-length", "metadata-value"}:
            assert not taken, raw

    check()
    if corruption in {"none", "begin", "end", "data-length", "dtype"}:
        assert seen["taken"] > 0, seen


# --- the TensorInfo objects the fast path makes --------------------------------------------------------------------

def test_tensor_infos_are_the_objects_the_constructor_makes():
    rows = [("a", "BF16", (2, 3), 0, 12), ("b", "F4", (), 12, 13)]
    made = sh._tensor_infos(*map(list, zip(*rows)))
    assert made == tuple(TensorInfo(*r) for r in rows)
    assert [repr(t) for t in made] == [repr(TensorInfo(*r)) for r in rows]
    assert [hash(t) for t in made] == [hash(TensorInfo(*r)) for r in rows]
    assert sh._tensor_infos([], [], [], [], []) == ()
    with pytest.raises(FrozenInstanceError):
        made[0].begin = 1  # type: ignore[misc]
    # What _tensor_infos relies on: the constructor only assigns these fields, in this order.
    assert [f.name for f in fields(TensorInfo)] == list(TensorInfo.__match_args__) == [
        "name", "dtype", "shape", "begin", "end"]
    assert not hasattr(TensorInfo, "__post_init__") and all(f.init for f in fields(TensorInfo))
