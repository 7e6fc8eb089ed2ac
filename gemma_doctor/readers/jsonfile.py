"""Bounded, strict reading of a model folder's JSON files (config.json, generation_config.json)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gemma_doctor import fsafe
from gemma_doctor.readers import parsed

# Real configs are a few KiB; anything past this is not a config and is not read whole.
MAX_JSON_BYTES = 16 * 1024 * 1024


@dataclass(frozen=True)
class JsonFile:
    """A JSON file of a model folder as found on disk, parsed or with the reason it could not be."""

    path: Path
    exists: bool
    is_link: bool = False
    link_target: str | None = None
    raw: bytes | None = None
    data: Any = None
    error: str | None = None
    # True when the file parsed as JSON but its shape is wrong (not an object, duplicate keys, NaN...).
    shape_error: bool = False
    escapes: bool = False
    too_large: bool = False  # past MAX_JSON_BYTES by its size, so not read (GD080 for config.json)
    # True when ``data`` is parse_json_object(``raw``) as read (set by the readers only): whatever ``data`` holds is
    # then a function of ``raw``, which gemma_doctor/memo.py uses to key the file by its text without walking it.
    parsed: bool = field(default=False, compare=False, repr=False)

    @property
    def ok(self) -> bool:
        """True when the file exists and parsed to a JSON object."""
        return self.exists and self.error is None and isinstance(self.data, dict)


class _Duplicate(ValueError):
    pass


class _BadConstant(ValueError):
    pass


class _BadNumber(ValueError):
    pass


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise _Duplicate(key)
        out[key] = value
    return out


def _reject_constant(name: str) -> Any:
    raise _BadConstant(name)


def _finite_float(text: str) -> float:
    # 1e400 parses to inf: as unusable as a literal Infinity, and it would make the JSON report invalid.
    value = float(text)
    if value != value or value in (float("inf"), float("-inf")):
        raise _BadNumber(text if len(text) <= 40 else text[:40] + "...")
    return value


# Real configs nest 3-4 levels; much deeper structures only serve to exhaust recursion in whoever walks them.
MAX_DEPTH = 64


def _depth_over(data: Any, limit: int) -> bool:
    """True when ``data`` nests deeper than ``limit`` containers (an iterative walk: no recursion to exhaust)."""
    stack: list[tuple[Any, int]] = [(data, 1)]
    while stack:
        node, depth = stack.pop()
        if depth > limit:
            return True
        if isinstance(node, dict):
            stack.extend((v, depth + 1) for v in node.values() if isinstance(v, (dict, list)))
        elif isinstance(node, list):
            stack.extend((v, depth + 1) for v in node if isinstance(v, (dict, list)))
    return False


def parse_json_object(raw: bytes) -> tuple[Any, str | None, bool]:
    """Parse bytes strictly; return (data, error, shape_error). Never raises."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        return None, f"not UTF-8 text (byte 0x{raw[e.start]:02x} at offset {e.start})", False
    if text.startswith("\ufeff"):
        return None, "starts with a byte-order mark, which transformers cannot parse", False
    if not text.strip():
        return None, "empty file", False
    try:
        data = json.loads(text, object_pairs_hook=_no_duplicates, parse_constant=_reject_constant,
                          parse_float=_finite_float)
    except _Duplicate as e:
        return None, f"duplicate key {str(e)!r} (which value counts is ambiguous)", True
    except _BadConstant as e:
        return None, f"non-standard JSON literal {e} (not valid JSON)", True
    except _BadNumber as e:
        return None, f"number {e} is out of range (it reads as infinity)", True
    except json.JSONDecodeError as e:
        return None, f"not valid JSON: {e.msg} at line {e.lineno} column {e.colno}", False
    except RecursionError:
        return None, "nested too deeply to be a config", True
    except ValueError as e:
        # Python refuses integers longer than sys.get_int_max_str_digits() (4300) with a plain ValueError.
        return None, f"not a config: {e}", True
    if not isinstance(data, dict):
        return None, f"top level is a JSON {_json_type(data)}, not an object", True
    # Containers are at most the number of brackets: only a file with many of them needs the walk.
    if raw.count(b"{") + raw.count(b"[") > MAX_DEPTH and _depth_over(data, MAX_DEPTH):
        return None, f"nested deeper than {MAX_DEPTH} levels, too deep to be a config", True
    return data, None, False


def _json_type(value: Any) -> str:
    if isinstance(value, list):
        return "array"
    if isinstance(value, str):
        return "string"
    if isinstance(value, bool):
        return "boolean"
    if value is None:
        return "null"
    return "number"


def read_json_file(path: Path, root: Path | None = None, area: fsafe.Area | None = None,
                   parts: list[str] | None = None) -> JsonFile:
    """Read and parse ``path`` at the moment of use (fsafe.read_file); with ``root`` (a cache repo folder), links are
    followed only while they stay inside it, and one leading out is refused unread (``area``: that folder's Area,
    ``parts``: the path's components below it, when the caller has them)."""
    if area is None and root is not None:
        area = fsafe.Area(root)
    got = fsafe.read_file(path, MAX_JSON_BYTES, area, unread_over=True, parts=parts if area is not None else None)
    if not got.exists:
        return JsonFile(path, exists=False)
    if got.too_large:  # by its size: not a byte read (300 of them held by a scan took it to 4.66 GB; issue 33)
        return JsonFile(path, exists=True, is_link=got.is_link, link_target=got.link_target, too_large=True,
                        error=f"larger than {MAX_JSON_BYTES // (1024 * 1024)} MiB, not a config (not read whole)")
    if got.error or got.data is None:
        return JsonFile(path, exists=True, is_link=got.is_link, link_target=got.link_target, escapes=got.escapes,
                        error=got.error or "cannot read")
    raw = got.data
    if len(raw) > MAX_JSON_BYTES:
        return JsonFile(path, exists=True, is_link=got.is_link, link_target=got.link_target,
                        error=f"larger than {MAX_JSON_BYTES // (1024 * 1024)} MiB, not a config (not read whole)")
    data, error, shape_error = _parsed(raw)
    return JsonFile(path, exists=True, is_link=got.is_link, link_target=got.link_target, raw=raw, data=data,
                    error=error, shape_error=shape_error, parsed=True)


# parse_json_object is a function of the bytes: within a whole-cache scan, a text met again (the generation config of
# every fine-tune of a base) is parsed once (gemma_doctor/readers/parsed.py says why sharing its data is safe there).
_PARSED = parsed.Cache(16 * 1024 * 1024)


def _parsed(raw: bytes) -> tuple[Any, str | None, bool]:
    return _PARSED.get(raw, len(raw), lambda: parse_json_object(raw))[0]


def parsed_text(raw: bytes) -> Any:
    """The ``data`` read_json_file gives for a file of the bytes ``raw`` (None where they do not parse to an object);
    parsed once per whole-cache scan, as the reader's own."""
    return _parsed(raw)[0]
