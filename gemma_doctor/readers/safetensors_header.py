"""Strict reading of safetensors headers (never tensor data), validated as the reference reader does.

No numpy and no safetensors import here: the census runs on every `check` and must start fast.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import re
import struct
from dataclasses import dataclass, field
from itertools import chain, repeat
from operator import attrgetter, itemgetter, mul, sub
from pathlib import Path
from typing import Iterable, Sequence

from gemma_doctor import fsafe
from gemma_doctor.readers import parsed

# The reference reader (safetensors' Rust crate) refuses headers larger than this.
MAX_HEADER_BYTES = 100_000_000

# Size in bits of every dtype the format defines (facts.md section 5).
DTYPE_BITS: dict[str, int] = {
    "BOOL": 8, "U8": 8, "I8": 8, "F8_E5M2": 8, "F8_E4M3": 8, "F8_E8M0": 8, "F8_E4M3FNUZ": 8, "F8_E5M2FNUZ": 8,
    "I16": 16, "U16": 16, "F16": 16, "BF16": 16,
    "I32": 32, "U32": 32, "F32": 32,
    "F64": 64, "I64": 64, "U64": 64, "C64": 64,
    "F6_E2M3": 6, "F6_E3M2": 6, "F4": 4,
}

FLOAT_DTYPES = frozenset({"F16", "BF16", "F32", "F64", "F8_E5M2", "F8_E4M3", "F8_E8M0", "F8_E4M3FNUZ",
                          "F8_E5M2FNUZ", "F6_E2M3", "F6_E3M2", "F4"})

# More tensors than any real checkpoint file holds (the largest MoE shards hold a few thousand). Parsing a header
# costs ~1 KB of memory and ~30 us per tensor, so this bounds one header to ~100 MB and a few seconds; the
# reference reader's 100 MB limit alone allows ~1.4 million tiny tensors (~1.2 GB, ~45 s measured).
MAX_TENSORS = 100_000

# Products of shapes beyond this overflow the reference reader's usize arithmetic.
_USIZE_MAX = 2**64 - 1


@dataclass(frozen=True, slots=True)
class TensorInfo:
    """One tensor's entry in a safetensors header; offsets are relative to the data section."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    begin: int
    end: int

    @property
    def numel(self) -> int:
        """Number of elements (1 for a scalar)."""
        n = 1
        for d in self.shape:
            n *= d
        return n

    @property
    def nbytes(self) -> int:
        """Bytes in the data section."""
        return self.end - self.begin


@dataclass(frozen=True)
class SafetensorsHeader:
    """A safetensors file's header as read, or the reason it is not a valid safetensors file."""

    path: Path
    exists: bool
    file_size: int = 0
    header_len: int = 0
    tensors: tuple[TensorInfo, ...] = ()
    metadata: dict[str, str] = field(default_factory=dict)
    error: str | None = None
    # (device, inode) of the file read, and the repo folder it was confined to: the weights scan opens the
    # same file again the same way and checks it is the same one (not a link swapped in meanwhile).
    ident: tuple[int, int] | None = field(default=None, compare=False)
    root: Path | None = field(default=None, compare=False)
    # A digest of the header's bytes, of which (with the file's size) ``tensors`` and ``metadata`` are a function: a
    # scan keys the shared judgements by it instead of by every tensor (gemma_doctor/memo.py). None where not parsed.
    digest: bytes | None = field(default=None, compare=False, repr=False)

    @property
    def ok(self) -> bool:
        """True when the file exists and its header passed every check."""
        return self.exists and self.error is None

    @property
    def data_start(self) -> int:
        """Absolute file offset of the data section."""
        return 8 + self.header_len


def _bad(path: Path, size: int, error: str, header_len: int = 0) -> SafetensorsHeader:
    return SafetensorsHeader(path, exists=True, file_size=size, header_len=header_len, error=error)


def _is_uint(v: object) -> bool:
    """A JSON number the reference reads as a usize: an integer in 0 .. 2**64 - 1 (never a bool or a float)."""
    return isinstance(v, int) and not isinstance(v, bool) and 0 <= v <= _USIZE_MAX


# The reference parses the header with serde_json, whose rules differ from Python's json module in ways an
# attacker can aim at (each checked against the safetensors library in tests/test_safetensors.py):
# containers nest at most 127 deep; NaN/Infinity are not JSON; a number beyond 64 bits is read as a float
# (so not a shape), and one beyond a float's range is refused; "-0" is a float; a lone UTF-16 surrogate
# escape is refused; a struct field (dtype, shape, data_offsets, __metadata__) may not repeat, while a
# repeated tensor name or metadata key keeps the last value (every value must still be well formed).
_MAX_DEPTH = 127
_TENSOR_FIELDS = ("dtype", "shape", "data_offsets")
_SURROGATE = re.compile("[\ud800-\udfff]")


class _Object(list):
    """A JSON object as its (key, value) pairs in file order, so repeated keys stay visible."""


def _json_int(text: str) -> int | float:
    if text == "-0":
        return -0.0
    v = int(text)
    if -(2**63) <= v <= _USIZE_MAX:
        return v
    try:
        return float(v)
    except OverflowError:
        raise ValueError("number out of range") from None


def _json_float(text: str) -> float:
    v = float(text)
    if math.isinf(v):
        raise ValueError("number out of range")
    return v


def _no_constant(name: str) -> None:
    raise ValueError(f"{name} is not JSON")


def _serde_problem(value: object, escapes: bool = True) -> str | None:
    """Why serde_json would refuse this parsed document regardless of its shape (nesting, lone surrogates).

    ``escapes`` False: the header text has no ``\\u`` escape, the only way a lone surrogate gets into a string
    decoded strictly from UTF-8, so only containers are walked (most of a real header's values are strings and
    numbers: this makes the walk several times faster)."""
    stack: list[tuple[object, int]] = [(value, 1)]
    while stack:
        v, depth = stack.pop()
        if isinstance(v, list):
            if depth > _MAX_DEPTH:
                return f"nested more than {_MAX_DEPTH} deep"
            items = v if not isinstance(v, _Object) else [x for pair in v for x in pair]
            stack.extend((x, depth + 1) for x in items if escapes or isinstance(x, list))
        elif isinstance(v, str) and _SURROGATE.search(v):
            return "a string holds a lone UTF-16 surrogate"
    return None


def _dtype(v: object) -> str | None:
    """``"BF16"``, or serde's other spelling of a unit variant, ``{"BF16": null}``."""
    if isinstance(v, str):
        return v if v in DTYPE_BITS else None
    if isinstance(v, _Object) and len(v) == 1 and v[0][0] in DTYPE_BITS and v[0][1] is None:
        return v[0][0]
    return None


def parse_header(raw: bytes, file_size: int, path: Path) -> SafetensorsHeader:
    """Validate header bytes (without the 8-byte length) against a file of ``file_size`` bytes. Never raises."""
    h = _parse_fast(raw, file_size, path)
    return h if h is not None else _parse_strict(raw, file_size, path)


# The fast path: a header as real writers make it, read by the C json parser with no hooks and checked in C loops
# (map, set, zip), accepted only where the result provably equals _parse_strict's. Anything else (every malformed or
# unusual header, and any doubt) returns None and goes to _parse_strict, whose results are the reference's.
#
# What it accepts: UTF-8 text with no backslash; a JSON object whose "__metadata__" (if any) is null or an object of
# strings, and every other value an object with exactly the fields dtype (a string naming a dtype), shape (a list)
# and data_offsets (a list of two), every number in those lists an int (never a bool, never a float) in 0 .. 2**64-1;
# no ':' and no '-' in the text but in the structure and strings counted below. Why that equals the strict parse:
# - No backslash, so no escape: every string is its UTF-8 text as written (decoded strictly, it holds no lone
#   surrogate), two keys are equal exactly when written alike, and a string's ':' and '-' are in the raw bytes.
# - Nothing is lost to a repeated key. In JSON text a ':' byte is either the separator of one (key, value) pair of
#   some object, at any depth, or inside a string (whitespace, numbers and literals hold none). Every pair the
#   parsed objects hold is a distinct pair of the text, and every string they hold a distinct string of the text, so
#       raw ':' count = pairs in the text + ':' in all strings of the text
#                     >= pairs the parsed objects hold + ':' in the strings they hold,
#   with equality only if no pair was dropped (a repeated key at any level: a tensor name, a struct field,
#   "__metadata__", a metadata key, whatever its first value held). The objects held are all counted: the checks
#   leave no object anywhere but the top level, the entries and the metadata, and no string with a ':' but the tensor
#   names and the metadata's keys and values (field names are fixed, dtypes are names from DTYPE_BITS). So the parse
#   equals the strict _Object pairs with dict() applied, in the same order, and no repeated-key refusal can arise.
# - No "-0": json reads it as int 0 where serde (and _json_int) read a float. A '-' in valid JSON is in a string, in a
#   number or in -Infinity; the same count, raw '-' count = '-' in the strings held, leaves none outside strings
#   (so no negative number either).
# - Every other number the hooks read differently is refused by the type checks: a float (fractions, exponents, NaN,
#   Infinity, ints past 64 bits that _json_int turns into floats or refuses) is not an int, an int past 2**64-1 is out
#   of range, an int longer than Python's digit limit raises ValueError here as there.
# - Nesting is at most 3 deep (object, entry, list), far below serde's 127; no escape, so no lone surrogate:
#   _serde_problem has nothing to find.
# - The strict walk then finds nothing to refuse (each check it makes is made here), and builds the same tensors in
#   the same order (the object's, metadata left out) and the same metadata dict; the tiling is _tiled's for both
#   (done here directly on the lists when they tile in the header's order, which is then also the sorted order).
_FIELDS_OF = itemgetter(*_TENSOR_FIELDS)
_SETTERS = tuple(getattr(TensorInfo, name).__set__ for name in TensorInfo.__match_args__)  # field order


def _only(kind: type, values: Iterable[object]) -> bool:
    """Every value is exactly of ``kind`` (a bool is not an int), checked in C."""
    return set(map(type, values)) <= {kind}


def _strings_count(char: str, names: list[str], metadata: dict[str, str]) -> int:
    """How often ``char`` occurs in the tensor names and the metadata's keys and values."""
    return sum(map(str.count, chain(names, metadata, metadata.values()), repeat(char)))


def _tensor_infos(*columns: Sequence[object]) -> tuple[TensorInfo, ...]:
    """TensorInfo(name, dtype, shape, begin, end) for each row of the columns, its slots filled in C loops: the same
    objects as the constructor makes (its dataclass __init__ only assigns the fields; tests check it), in half the
    time."""
    infos = list(map(object.__new__, repeat(TensorInfo, len(columns[0]))))
    for set_field, column in zip(_SETTERS, columns, strict=True):
        any(map(set_field, infos, column))  # each call returns None: any() runs them all
    return tuple(infos)


def _parse_fast(raw: bytes, file_size: int, path: Path) -> SafetensorsHeader | None:
    """parse_header's result for a header as real writers make it, or None where _parse_strict must decide."""
    n = len(raw)
    # _parse_strict's '{' bound (only a header longer than it can hold that many '{'), refused there.
    if b"\\" in raw or (n > MAX_TENSORS + 2 and raw.count(b"{") > MAX_TENSORS + 2):
        return None
    try:
        doc = json.loads(raw.decode("utf-8"))
        if type(doc) is not dict:
            return None
        pairs = len(doc)
        metadata = doc.pop("__metadata__", None)
        if metadata is None:  # absent, or null: an absent map for the reference
            metadata = {}
        elif type(metadata) is not dict or not _only(str, metadata.values()):
            return None
        entries = list(doc.values())
        rows = list(map(_FIELDS_OF, entries))  # KeyError, or TypeError where an entry is not an object
        fields_held = sum(map(len, entries))
        if fields_held != 3 * len(entries):  # each has the three fields, so one with more has others
            return None
        names = list(doc)
        pairs += len(metadata) + fields_held
        colons = raw.count(b":")
        if colons != pairs and colons != pairs + _strings_count(":", names, metadata):
            return None
        if b"-" in raw and raw.count(b"-") != _strings_count("-", names, metadata):
            return None
        dtypes, shapes, offsets = zip(*rows) if rows else ((), (), ())
        # A dtype that is not a string is not a key (a list or an object raises TypeError: unhashable).
        if not all(map(DTYPE_BITS.__contains__, dtypes)):
            return None
        if not (_only(list, chain(shapes, offsets)) and set(map(len, offsets)) <= {2}):
            return None
        # Walked twice rather than copied: a hostile header's numbers can take hundreds of MB.
        if (not _only(int, chain.from_iterable(chain(shapes, offsets)))
                or max(chain.from_iterable(chain(shapes, offsets)), default=0) > _USIZE_MAX):  # no '-': none < 0
            return None
    except (ValueError, RecursionError, KeyError, TypeError):  # UnicodeDecodeError, JSONDecodeError are ValueErrors
        return None
    begins, ends = zip(*offsets) if offsets else ((), ())
    if _tiles_quickly(shapes, dtypes, begins, ends, file_size - 8 - n):
        return SafetensorsHeader(path, exists=True, file_size=file_size, header_len=n, metadata=metadata,
                                 tensors=_tensor_infos(names, dtypes, list(map(tuple, shapes)), begins, ends))
    return _tiled(path, file_size, n, list(_tensor_infos(names, dtypes, list(map(tuple, shapes)), begins, ends)),
                  metadata)


def _parse_strict(raw: bytes, file_size: int, path: Path) -> SafetensorsHeader:
    """parse_header for any bytes: every pair walked as serde_json reads it (repeated keys, numbers, nesting)."""
    n = len(raw)
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        return _bad(path, file_size, f"header is not UTF-8 (byte offset {8 + e.start})", n)
    # Each tensor entry is an object, so it costs a '{': counting them bounds the parse before it starts.
    if raw.count(b"{") > MAX_TENSORS + 2:
        return _bad(path, file_size, f"header describes more than {MAX_TENSORS} tensors, more than any real "
                                     f"checkpoint file; not parsed", n)
    try:
        doc = json.loads(text, object_pairs_hook=_Object, parse_int=_json_int, parse_float=_json_float,
                         parse_constant=_no_constant)
    except (ValueError, RecursionError) as e:
        # ValueError beyond JSONDecodeError: integers longer than Python's 4300-digit conversion limit, numbers
        # out of range, NaN / Infinity.
        msg = (f"{e.msg} at column {e.colno}" if isinstance(e, json.JSONDecodeError)
               else "nested too deeply" if isinstance(e, RecursionError) else str(e))
        return _bad(path, file_size, f"header is not valid JSON: {msg}", n)
    problem = _serde_problem(doc, escapes="\\u" in text)
    if problem is not None:
        return _bad(path, file_size, f"header is not valid JSON: {problem}", n)
    if not isinstance(doc, _Object):
        return _bad(path, file_size, "header is not a JSON object", n)
    metadata: dict[str, str] = {}
    seen_metadata = False
    by_name: dict[str, TensorInfo] = {}
    for name, entry in doc:
        if name == "__metadata__":
            if seen_metadata:
                return _bad(path, file_size, "__metadata__ appears twice", n)
            seen_metadata = True
            if entry is None:  # an absent map, for the reference
                continue
            if not isinstance(entry, _Object) or not all(isinstance(v, str) for _, v in entry):
                return _bad(path, file_size, "__metadata__ is not a map of strings to strings", n)
            metadata = dict(entry)
            continue
        if not isinstance(entry, _Object):
            return _bad(path, file_size, f"tensor {name!r}: entry is not an object", n)
        keys = [k for k, _ in entry if k in _TENSOR_FIELDS]
        if len(keys) != len(set(keys)):
            return _bad(path, file_size, f"tensor {name!r}: a field appears twice", n)
        fields = dict(entry)
        dtype, shape, offsets = _dtype(fields.get("dtype")), fields.get("shape"), fields.get("data_offsets")
        if dtype is None:
            return _bad(path, file_size, f"tensor {name!r}: unknown dtype {fields.get('dtype')!r}", n)
        if not isinstance(shape, list) or isinstance(shape, _Object) or not all(_is_uint(d) for d in shape):
            return _bad(path, file_size, f"tensor {name!r}: shape {shape!r} is not a list of non-negative integers", n)
        if (not isinstance(offsets, list) or isinstance(offsets, _Object) or len(offsets) != 2
                or not all(_is_uint(o) for o in offsets)):
            return _bad(path, file_size, f"tensor {name!r}: data_offsets {offsets!r} is not [begin, end]", n)
        by_name[name] = TensorInfo(name, dtype, tuple(shape), offsets[0], offsets[1])  # a repeated name: the last counts
    return _tiled(path, file_size, n, list(by_name.values()), metadata)


_OFFSETS = attrgetter("begin", "end")
_COLUMNS = attrgetter("shape", "dtype", "begin", "end")
# Shapes up to this many dimensions have their product taken whole by _tiles_quickly: each dimension is below 2**64,
# so the product stays below 2**1024 (a hostile shape of thousands of huge dimensions would make it slow).
_QUICK_DIMS = 16


def _tiles_quickly(shapes: Sequence[Sequence[int]], dtypes: Sequence[str], begins: Sequence[int],
                   ends: Sequence[int], data_len: int) -> bool:
    """True only when _tiled's loop would pass every tensor of these columns, in this order, and the data length.

    Every numel > 0 means every dimension >= 1, so no partial product exceeds the whole, which is at most the bits
    (a dtype has 4 bits or more); bits == 8 * (end - begin) is the loop's whole-bytes and size checks, and gives
    end > begin; begins equal to the previous ends, the first 0 and the last end the data length, is its tiling, and
    makes the offsets strictly increasing: this order is the sorted one. False (zero-size tensors, long shapes, any
    fault) leaves it to the loop, which finds the same or says what is wrong."""
    if not begins:
        return data_len == 0
    if max(map(len, shapes)) > _QUICK_DIMS:
        return False
    numels = list(map(math.prod, shapes))
    bits = list(map(mul, numels, map(DTYPE_BITS.__getitem__, dtypes)))
    return (begins[0] == 0 and ends[-1] == data_len and begins[1:] == ends[:-1] and min(numels) > 0
            and max(bits) <= _USIZE_MAX and bits == list(map(mul, map(sub, ends, begins), repeat(8))))


def _tiled(path: Path, file_size: int, n: int, tensors: list[TensorInfo],
           metadata: dict[str, str]) -> SafetensorsHeader:
    """The header, or why its tensors do not tile the data section as the reference reader requires."""
    # The reference reader sorts by offsets and requires them to tile the data section from 0.
    tensors.sort(key=_OFFSETS)  # stable: tensors at equal offsets keep the header's order
    if _tiles_quickly(*(zip(*map(_COLUMNS, tensors)) if tensors else ((), (), (), ())), file_size - 8 - n):
        return SafetensorsHeader(path, exists=True, file_size=file_size, header_len=n, tensors=tuple(tensors),
                                 metadata=metadata)
    start = 0
    for t in tensors:
        if t.begin != start or t.end < t.begin:
            why = "gap before it" if t.begin > start else ("overlaps the previous tensor" if t.begin < start else "end < begin")
            return _bad(path, file_size, f"tensor {t.name!r}: data_offsets [{t.begin}, {t.end}] not contiguous ({why})", n)
        numel = 1
        for d in t.shape:
            numel *= d
            if numel > _USIZE_MAX:
                return _bad(path, file_size, f"tensor {t.name!r}: shape {list(t.shape)} overflows", n)
        bits = numel * DTYPE_BITS[t.dtype]
        if bits > _USIZE_MAX:
            return _bad(path, file_size, f"tensor {t.name!r}: shape {list(t.shape)} overflows", n)
        if bits % 8:
            return _bad(path, file_size, f"tensor {t.name!r}: {numel} x {t.dtype} is not a whole number of bytes", n)
        if bits // 8 != t.end - t.begin:
            return _bad(path, file_size, f"tensor {t.name!r}: {list(t.shape)} x {t.dtype} is {bits // 8} bytes "
                                         f"but data_offsets span {t.end - t.begin}", n)
        start = t.end
    data_len = file_size - 8 - n
    if data_len != start:
        kind = "truncated" if data_len < start else "has trailing bytes"
        return _bad(path, file_size, f"data section is {data_len} bytes but the header describes {start} ({kind})", n)
    return SafetensorsHeader(path, exists=True, file_size=file_size, header_len=n, tensors=tuple(tensors),
                             metadata=metadata)


def header_length(head: bytes, file_size: int) -> tuple[int, str | None]:
    """(header length, error) from a file's first 8 bytes, checked against its size as the reference reader does."""
    if len(head) < 8:
        return 0, f"file is {file_size} bytes, shorter than the 8-byte header length"
    (n,) = struct.unpack("<Q", head[:8])
    if n > MAX_HEADER_BYTES:
        return n, f"header length {n} exceeds the {MAX_HEADER_BYTES}-byte limit"
    if n + 8 > file_size:
        return n, f"header length {n} runs past the end of the {file_size}-byte file"
    return n, None


def read_header(path: Path, root: Path | None = None, area: fsafe.Area | None = None) -> SafetensorsHeader:
    """Read and validate the header of ``path``; a missing or invalid file gives a header with ``error``.

    With ``root`` (a cache repo folder) links are followed only inside it; a FIFO or device is refused unopened.
    ``area``: that folder's Area, when the caller has one.
    """
    if area is None and root is not None:
        area = fsafe.Area(root)
    try:
        opened = fsafe.open_file(path, area)
    except fsafe.Refused as e:
        if e.escapes:
            why = f" ({e.why})" if e.why else ""
            return SafetensorsHeader(path, exists=True, error=f"link points outside the repo folder{why}; not read")
        return SafetensorsHeader(path, exists=True, error=str(e))
    except FileNotFoundError:
        dangling = os.path.islink(path) if area is None else fsafe.read_file(path, 0, area).is_link
        return SafetensorsHeader(path, exists=False, error="missing" + (" (dangling link)" if dangling else ""))
    except (OSError, ValueError) as e:
        return SafetensorsHeader(path, exists=_lexists(path), error=f"cannot open: {getattr(e, 'strerror', None) or e}")
    fd = opened.fd
    try:
        size = opened.st.st_size
        n, error = header_length(fsafe.read_fd(fd, 8), size)
        if error:
            return _bad(path, size, error)
        raw = fsafe.read_fd(fd, n)
    except OSError as e:
        return _bad(path, 0, f"cannot read: {e.strerror or e}")
    finally:
        os.close(fd)
    if len(raw) != n:
        return _bad(path, size, "file shrank while being read")
    h = _parsed(raw, size, path)
    return SafetensorsHeader(h.path, h.exists, h.file_size, h.header_len, h.tensors, h.metadata, h.error,
                             ident=opened.ident, root=root, digest=h.digest)


# parse_header is a function of the header's bytes and the file's size (the path only names the file): within a
# whole-cache scan, fine-tunes of one base hold the same header in every repo, parsed once (the digest of its bytes,
# taken with the parse, then keys it in memo.py without a walk of its tensors); gemma_doctor/readers/parsed.py.
_PARSED = parsed.Cache(64 * 1024 * 1024)


def _digested(raw: bytes, size: int, path: Path) -> SafetensorsHeader:
    h = parse_header(raw, size, path)
    if not parsed.active():
        return h  # no scan, no judgement shared: the digest is a scan's key only (and hashlib stays off check's path)
    import hashlib

    # 16 bytes of BLAKE2b: a key never holds a header's text, and its size is in the key beside it (file_size).
    return dataclasses.replace(h, digest=hashlib.blake2b(raw, digest_size=16).digest())


def _parsed(raw: bytes, size: int, path: Path) -> SafetensorsHeader:
    hit, kept = _PARSED.get((raw, size), len(raw), lambda: _digested(raw, size, path))
    if not kept:
        return hit
    # the tensors (an immutable tuple) are shared; the metadata dict is the caller's own copy
    return SafetensorsHeader(path, hit.exists, hit.file_size, hit.header_len, hit.tensors, dict(hit.metadata),
                             hit.error, digest=hit.digest)


def _lexists(path: Path) -> bool:
    try:
        return os.path.lexists(path)
    except (OSError, ValueError):
        return False
