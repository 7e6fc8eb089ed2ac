"""Hypothesis strategies for safetensors files: valid multi-tensor headers, and targeted corruptions of them.

A header is kept as (key, value) pairs, not a dict, so a corruption can repeat a key, and is serialised by
hand so a corruption can also spell a number or a string the way an attacker would (``-0``, ``1e999``, a lone
surrogate escape, nesting 128 deep). Every file's verdict is decided by the real safetensors library in the
tests, never by this module.
"""

from __future__ import annotations

import json
import math
import struct
from dataclasses import dataclass, field
from typing import Any

from hypothesis import strategies as st

from gemma_doctor.readers.safetensors_header import DTYPE_BITS


class Raw(str):
    """JSON text written as is (a number or literal that json.dumps would not produce)."""


class Obj(list):
    """A JSON object as its (key, value) pairs; keys may repeat."""


def dumps(value: Any, sep: str = ", ", colon: str = ": ") -> str:
    """JSON text for nested pairs lists, lists, strings, numbers, None and Raw pieces."""
    if isinstance(value, Raw):
        return str(value)
    if isinstance(value, Obj):
        return "{" + sep.join(f"{json.dumps(k)}{colon}{dumps(v, sep, colon)}" for k, v in value) + "}"
    if isinstance(value, list):
        return "[" + sep.join(dumps(v, sep, colon) for v in value) + "]"
    return json.dumps(value)


@dataclass
class SafetensorsSpec:
    """A generated file: its header pairs, the data length, how it was made, and the serialised bytes."""

    header: Obj
    data_len: int
    corruption: str
    tensors: int  # tensor entries before the corruption
    leading: str = ""
    trailing: str = ""
    sep: tuple[str, str] = (", ", ": ")
    raw: bytes | None = field(default=None)  # set when a corruption edits the bytes themselves

    def header_bytes(self) -> bytes:
        """The header exactly as written in the file."""
        if self.raw is not None:
            return self.raw
        return (self.leading + dumps(self.header, *self.sep) + self.trailing).encode()

    def file_bytes(self) -> bytes:
        """The whole file: length, header, zero-filled data."""
        raw = self.header_bytes()
        return struct.pack("<Q", len(raw)) + raw + bytes(self.data_len)


_NAMES = st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), min_size=1, max_size=6).filter(
    lambda s: s != "__metadata__")
_SUB_BYTE = [d for d, b in DTYPE_BITS.items() if b % 8]


@st.composite
def valid_headers(draw, min_tensors: int = 2, max_tensors: int = 6) -> SafetensorsSpec:  # noqa: ANN001
    """A header safetensors accepts: distinct names, dtype x shape sizes, data tiled from 0 in a shuffled order,
    sub-byte dtypes in whole bytes, optional string metadata, optional JSON whitespace around it."""
    n = draw(st.integers(min_tensors, max_tensors))
    names = draw(st.lists(_NAMES, min_size=n, max_size=n, unique=True))
    specs = []
    for name in names:
        dtype = draw(st.sampled_from(sorted(DTYPE_BITS)) | st.sampled_from(_SUB_BYTE))
        shape = draw(st.lists(st.integers(0, 5), max_size=3))
        numel = math.prod(shape)
        whole = 8 // math.gcd(DTYPE_BITS[dtype], 8)  # elements per whole number of bytes
        if numel % whole:
            shape.append(whole)
        specs.append((name, dtype, shape, math.prod(shape) * DTYPE_BITS[dtype] // 8))
    order = draw(st.permutations(range(n)))  # the data follows another order than the keys
    offsets: dict[int, tuple[int, int]] = {}
    at = 0
    for i in order:
        offsets[i] = (at, at + specs[i][3])
        at += specs[i][3]
    header = Obj()
    meta = draw(st.none() | st.just("null") | st.dictionaries(st.text(max_size=5), st.text(max_size=5), max_size=3))
    if meta is not None:
        header.append(("__metadata__", None if meta == "null" else Obj(meta.items())))
    for i, (name, dtype, shape, _) in enumerate(specs):
        header.append((name, Obj([("dtype", dtype), ("shape", shape), ("data_offsets", list(offsets[i]))])))
    if meta is not None and draw(st.booleans()):
        header.append(header.pop(0))  # __metadata__ last
    spec = SafetensorsSpec(header, at, "none", n, sep=draw(st.sampled_from([(", ", ": "), (",", ":")])))
    pad = draw(st.sampled_from(["", "", " ", "  \n", "\t"]))
    if draw(st.booleans()):
        spec.trailing = pad  # safetensors itself pads headers with spaces to 8 bytes
    else:
        spec.leading = pad
    return spec


def _tensor_items(spec: SafetensorsSpec) -> list[int]:
    return [i for i, (k, v) in enumerate(spec.header) if k != "__metadata__"]


def _entry(spec: SafetensorsSpec, i: int) -> Obj:
    return spec.header[i][1]


def _set(entry: Obj, key: str, value: Any) -> None:
    for j, (k, _) in enumerate(entry):
        if k == key:
            entry[j] = (k, value)
            return
    entry.append((key, value))


def _get(entry: Obj, key: str) -> Any:
    return next(v for k, v in entry if k == key)


CORRUPTIONS = ("none", "begin", "end", "swap-offsets", "same-offsets", "dtype", "shape-dim", "shape-extra",
               "shape-drop", "sub-byte", "data-length", "drop-field", "repeat-field", "repeat-name",
               "repeat-metadata", "metadata-value", "odd-number", "extra-field", "nan", "deep", "surrogate",
               "dtype-map", "flip-byte", "offsets-length")


@st.composite
def corrupted_headers(draw, how: str) -> SafetensorsSpec:  # noqa: ANN001
    """A valid header with one targeted corruption ``how`` (one of CORRUPTIONS; "none" leaves it valid): wrong
    offsets, sizes or dtypes, repeated keys, numbers and strings spelled the ways serde_json and Python's json
    disagree on."""
    spec = draw(valid_headers(min_tensors=1))
    spec.corruption = how
    items = _tensor_items(spec)
    i = draw(st.sampled_from(items))
    entry = _entry(spec, i)
    begin, end = _get(entry, "data_offsets")
    k = draw(st.integers(1, 3))
    if how == "begin":
        _set(entry, "data_offsets", [max(0, begin + draw(st.sampled_from([-k, k]))), end])
    elif how == "end":
        _set(entry, "data_offsets", [begin, max(0, end + draw(st.sampled_from([-k, k])))])
    elif how == "swap-offsets":
        _set(entry, "data_offsets", [end, begin])
    elif how == "same-offsets":
        j = draw(st.sampled_from(items))
        _set(entry, "data_offsets", list(_get(_entry(spec, j), "data_offsets")))
    elif how == "dtype":  # sometimes the same size in bits (still valid), mostly not
        _set(entry, "dtype", draw(st.sampled_from(sorted(DTYPE_BITS))))
    elif how == "shape-dim":
        shape = list(_get(entry, "shape")) or [1]
        at = draw(st.integers(0, len(shape) - 1))
        shape[at] = max(0, shape[at] + draw(st.sampled_from([-1, 1, 2])))
        _set(entry, "shape", shape)
    elif how == "shape-extra":
        _set(entry, "shape", [*_get(entry, "shape"), draw(st.integers(0, 3))])
    elif how == "shape-drop":
        _set(entry, "shape", list(_get(entry, "shape"))[1:])
    elif how == "sub-byte":  # an odd count of a sub-byte dtype, sized to the bytes it floors to
        dtype = draw(st.sampled_from(_SUB_BYTE))
        count = draw(st.integers(1, 9))
        _set(entry, "dtype", dtype)
        _set(entry, "shape", [count])
        _set(entry, "data_offsets", [begin, begin + count * DTYPE_BITS[dtype] // 8])
        spec.data_len += count * DTYPE_BITS[dtype] // 8 - (end - begin)
        for j in items:  # keep the tensors after it tiled, so only the sub-byte size can be wrong
            if j != i:
                b, e = _get(_entry(spec, j), "data_offsets")
                if b >= end and (b, e) != (begin, end):
                    shift = count * DTYPE_BITS[dtype] // 8 - (end - begin)
                    _set(_entry(spec, j), "data_offsets", [b + shift, e + shift])
    elif how == "data-length":
        spec.data_len = max(0, spec.data_len + draw(st.sampled_from([-k, k])))
    elif how == "drop-field":
        key = draw(st.sampled_from(["dtype", "shape", "data_offsets"]))
        entry[:] = [(kk, v) for kk, v in entry if kk != key]
    elif how == "repeat-field":  # a struct field twice: serde refuses even with equal values
        key = draw(st.sampled_from(["dtype", "shape", "data_offsets"]))
        entry.append((key, _get(entry, key)))
    elif how == "repeat-name":  # a tensor name twice: the last one counts, but both must be well formed
        other = Obj(entry) if draw(st.booleans()) else Obj([("dtype", "U8")])
        at = draw(st.sampled_from([i, i + 1]))
        spec.header.insert(at, (spec.header[i][0], other))
    elif how == "repeat-metadata":
        spec.header.append(("__metadata__", Obj()))
        spec.header.insert(0, ("__metadata__", Obj([("k", "v")])))
    elif how == "metadata-value":
        spec.header.insert(0, ("__metadata__", draw(st.sampled_from([Obj([("k", 1)]), Obj([("k", None)]), [], "x",
                                                                     Obj([("k", ["v"])])]))))
        spec.header[:] = [p for j, p in enumerate(spec.header) if not (j > 0 and p[0] == "__metadata__")]
    elif how == "odd-number":  # spellings Python reads as integers or floats that serde reads otherwise
        at = draw(st.sampled_from(["shape", "data_offsets"]))
        values = list(_get(entry, at)) or [0]
        values[draw(st.integers(0, len(values) - 1))] = Raw(draw(st.sampled_from(
            ["-0", "0.0", "1e0", "18446744073709551615", "18446744073709551616", "1" + "0" * 400, "true", "-1"])))
        _set(entry, at, values)
    elif how == "extra-field":  # unknown fields are ignored, whatever they hold (but see the next three)
        entry.append((draw(st.sampled_from(["x", "offsets", "Dtype"])), draw(
            st.sampled_from([1, "s", None, [1, [2]], Obj([("a", 1)]), Raw("-0"), Raw("1e308"), Raw("123" * 40)]))))
    elif how == "nan":
        entry.append(("x", Raw(draw(st.sampled_from(["NaN", "Infinity", "-Infinity", "1e999", "-1e400"])))))
    elif how == "deep":  # serde_json refuses containers nested deeper than 127; Python goes further
        depth = draw(st.sampled_from([124, 125, 126, 127]))
        entry.append(("x", Raw("[" * depth + "]" * depth)))
    elif how == "surrogate":  # a lone UTF-16 surrogate escape: Python decodes it, serde refuses it
        escape = draw(st.sampled_from(["\\ud800", "\\udfff", "\\ud83d\\ude00"]))  # the last is a valid pair
        where = draw(st.sampled_from(["name", "metadata", "extra"]))
        if where == "name":
            spec.header[i] = (spec.header[i][0] + "\0" + escape, entry)
        elif where == "metadata":
            spec.header.insert(0, ("__metadata__", Obj([("k", "\0" + escape)])))
            spec.header[:] = [p for j, p in enumerate(spec.header) if not (j > 0 and p[0] == "__metadata__")]
        else:
            entry.append(("x", "\0" + escape))
        # json.dumps escapes the marker NUL and the backslash: leave a bare \\uXXXX escape in the text
        spec.raw = spec.header_bytes().replace(b"\\u0000\\\\", b"\\")
    elif how == "dtype-map":  # serde's other spelling of an enum variant: {"F16": null}
        value = draw(st.sampled_from([Obj([(_get(entry, "dtype"), None)]), Obj([(_get(entry, "dtype"), 1)]),
                                      Obj([(_get(entry, "dtype"), None), ("U8", None)])]))
        _set(entry, "dtype", value)
    elif how == "flip-byte":
        raw = bytearray(spec.header_bytes())
        at = draw(st.integers(0, len(raw) - 1))
        raw[at] = draw(st.integers(0, 255))
        spec.raw = bytes(raw)
    elif how == "offsets-length":
        _set(entry, "data_offsets", [begin, end, end] if draw(st.booleans()) else [begin])
    return spec
