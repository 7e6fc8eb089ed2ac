"""A faster dataclasses.replace for the frozen dataclasses the decision copies per candidate (runs, plans, facts)."""

from __future__ import annotations

import dataclasses
from typing import Any, TypeVar

T = TypeVar("T")

# Per class: its field names when a copy needs no __init__ (no __post_init__, every field an init field), else None.
_PLAIN: dict[type, tuple[tuple[str, ...], frozenset[str]] | None] = {}


def _only_assigns(cls: type, names: tuple[str, ...]) -> bool:
    """Constructing ``cls`` does nothing but store each field in the instance's __dict__: its __init__ is the one
    @dataclass wrote (compiled from text, so its code's file is "<string>"; a class's own __init__, or a subclass's,
    has a real file), no class of its MRO has a __new__ of its own, and no field name is a data descriptor of the
    class (its __set__ would store the value its own way, or elsewhere)."""
    code = getattr(cls.__init__, "__code__", None)
    if code is None or not code.co_filename.startswith("<") or cls.__new__ is not object.__new__:
        return False
    for name in names:
        held = next((vars(k)[name] for k in cls.__mro__ if name in vars(k)), None)
        if hasattr(type(held), "__set__") or hasattr(type(held), "__delete__"):
            return False
    return True


def _plain(cls: type) -> tuple[tuple[str, ...], frozenset[str]] | None:
    try:
        return _PLAIN[cls]
    except KeyError:
        fs = dataclasses.fields(cls)
        names = tuple(f.name for f in fs)
        ok = (not hasattr(cls, "__post_init__") and not hasattr(cls, "__slots__")
              and all(f.init and f._field_type is dataclasses._FIELD for f in fs)  # type: ignore[attr-defined]
              and _only_assigns(cls, names))
        plain = _PLAIN[cls] = (names, frozenset(names)) if ok else None
        return plain


def replace(obj: T, **changes: Any) -> T:
    """dataclasses.replace(obj, **changes): the same new object (the fields copied, then ``changes``; nothing else of
    the old object's __dict__, so cached properties and marks are not carried over), without calling __init__ where
    __init__ would only assign the fields (_plain: else dataclasses.replace itself)."""
    cls = type(obj)
    plain = _plain(cls)
    if plain is None or not changes.keys() <= plain[1]:
        return dataclasses.replace(obj, **changes)  # type: ignore[type-var]
    new = object.__new__(cls)
    old = obj.__dict__
    d = new.__dict__
    for name in plain[0]:  # in field order, as __init__ assigns them
        d[name] = changes[name] if name in changes else old[name]
    return new
