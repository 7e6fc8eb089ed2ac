"""Set one member of a JSON document by splicing its text, so key order, indentation and the
trailing newline survive and the diff is only the line(s) that changed (pre-commit's habit).

Only called on text that already parsed as strict JSON; every edit is checked by re-parsing.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

_WS = re.compile(r"[ \t\n\r]*")
_NUMBER = re.compile(r"-?(?:0|[1-9]\d*)(?:\.\d+)?(?:[eE][+-]?\d+)?")


class EditError(ValueError):
    """The document could not be edited safely (an internal check failed)."""


@dataclass(frozen=True)
class Member:
    """One ``"key": value`` of an object, by character offsets into the text."""

    key: str
    key_start: int
    value_start: int
    value_end: int


@dataclass(frozen=True)
class ObjectSpan:
    """An object's braces and members."""

    start: int
    end: int  # one past the closing brace
    members: tuple[Member, ...]


def _skip_ws(text: str, i: int) -> int:
    return _WS.match(text, i).end()  # type: ignore[union-attr]


def _scan_string(text: str, i: int) -> int:
    """``text[i]`` is the opening quote; return one past the closing quote."""
    i += 1
    n = len(text)
    while i < n:
        c = text[i]
        if c == "\\":
            i += 2
            continue
        if c == '"':
            return i + 1
        i += 1
    raise EditError("unterminated string")


def _scan_value(text: str, i: int) -> int:
    """Return one past the end of the JSON value starting at ``i``."""
    c = text[i]
    if c == '"':
        return _scan_string(text, i)
    if c == "{":
        return _scan_object(text, i).end
    if c == "[":
        i = _skip_ws(text, i + 1)
        if text[i] == "]":
            return i + 1
        while True:
            i = _skip_ws(text, _scan_value(text, i))
            if text[i] == ",":
                i = _skip_ws(text, i + 1)
                continue
            if text[i] == "]":
                return i + 1
            raise EditError(f"bad array at offset {i}")
    for lit in ("true", "false", "null"):
        if text.startswith(lit, i):
            return i + len(lit)
    m = _NUMBER.match(text, i)
    if m and m.end() > i:
        return m.end()
    raise EditError(f"unexpected character at offset {i}")


def _scan_object(text: str, i: int) -> ObjectSpan:
    start = i
    members: list[Member] = []
    i = _skip_ws(text, i + 1)
    if text[i] == "}":
        return ObjectSpan(start, i + 1, ())
    while True:
        key_start = i
        key_end = _scan_string(text, i)
        key = json.loads(text[key_start:key_end])
        i = _skip_ws(text, key_end)
        if text[i] != ":":
            raise EditError(f"expected ':' at offset {i}")
        value_start = _skip_ws(text, i + 1)
        value_end = _scan_value(text, value_start)
        members.append(Member(key, key_start, value_start, value_end))
        i = _skip_ws(text, value_end)
        if text[i] == ",":
            i = _skip_ws(text, i + 1)
            continue
        if text[i] == "}":
            return ObjectSpan(start, i + 1, tuple(members))
        raise EditError(f"expected ',' or '}}' at offset {i}")


def _line_indent(text: str, pos: int) -> str:
    line_start = text.rfind("\n", 0, pos) + 1
    return re.match(r"[ \t]*", text[line_start:]).group(0)  # type: ignore[union-attr]


def _indent_unit(text: str, root: ObjectSpan) -> str:
    """The document's indentation step, read from the top-level members (default two spaces)."""
    for m in root.members:
        if "\n" in text[root.start:m.key_start]:
            return _line_indent(text, m.key_start) or "  "
    return "  "


def _render(value: Any, indent: str, unit: str, multiline: bool) -> str:
    """A new value, laid out like its neighbours."""
    if isinstance(value, dict) and value and multiline:
        inner = indent + unit
        parts = [f"{inner}{json.dumps(k)}: {_render(v, inner, unit, True)}" for k, v in value.items()]
        return "{\n" + ",\n".join(parts) + "\n" + indent + "}"
    return json.dumps(value, separators=(", ", ": ") if not multiline else (",", ": "))


def set_member(text: str, path: tuple[str, ...], value: Any) -> str:
    """Return ``text`` with the member at ``path`` set to ``value`` (created where missing)."""
    root_start = _skip_ws(text, 0)
    if root_start >= len(text) or text[root_start] != "{":
        raise EditError("top level is not an object")
    root = _scan_object(text, root_start)
    unit = _indent_unit(text, root)
    expected = json.loads(text)
    _assign(expected, path, value)
    new = _set(text, root, path, value, unit)
    if json.loads(new) != expected:
        raise EditError("edit check failed: the result does not parse to the intended document")
    return new


def _assign(doc: dict[str, Any], path: tuple[str, ...], value: Any) -> None:
    for key in path[:-1]:
        if not isinstance(doc.get(key), dict):
            doc[key] = {}
        doc = doc[key]
    doc[path[-1]] = value


def _set(text: str, obj: ObjectSpan, path: tuple[str, ...], value: Any, unit: str) -> str:
    key, rest = path[0], path[1:]
    multiline = "\n" in text[obj.start:obj.end] or not obj.members
    member = next((m for m in reversed(obj.members) if m.key == key), None)
    if member is not None:
        if rest and text[member.value_start] == "{":
            return _set(text, _scan_object(text, member.value_start), rest, value, unit)
        new_value = _nest(rest, value)
        indent = _line_indent(text, member.key_start)
        rendered = _render(new_value, indent, unit, multiline)
        return text[:member.value_start] + rendered + text[member.value_end:]
    return _insert(text, obj, key, _nest(rest, value), unit, multiline)


def _nest(path: tuple[str, ...], value: Any) -> Any:
    for key in reversed(path):
        value = {key: value}
    return value


def _insert(text: str, obj: ObjectSpan, key: str, value: Any, unit: str, multiline: bool) -> str:
    members = obj.members
    if not members:
        indent = _line_indent(text, obj.start)
        inner = indent + unit
        body = f"{json.dumps(key)}: {_render(value, inner, unit, True)}"
        return text[:obj.start] + "{\n" + inner + body + "\n" + indent + "}" + text[obj.end:]
    first = members[0]
    if multiline:
        indent = _line_indent(text, first.key_start)
        sep = "," + text[_skip_back_ws(text, first.key_start):first.key_start]
        if "\n" not in sep:
            sep = ",\n" + indent
    else:
        indent = ""
        sep = ", "
    body = f"{json.dumps(key)}: {_render(value, indent, unit, multiline)}"
    keys = [m.key for m in members]
    if keys == sorted(keys):
        # Files written by transformers have sorted keys: keep them sorted.
        for m in members:
            if m.key > key:
                return text[:m.key_start] + body + sep + text[m.key_start:]
    last = members[-1]
    return text[:last.value_end] + sep + body + text[last.value_end:]


def _skip_back_ws(text: str, i: int) -> int:
    while i > 0 and text[i - 1] in " \t\r\n":
        i -= 1
    return i
