"""A faster dataclasses.replace for the frozen dataclasses the decision copies per candidate (runs, plans, facts)."""

from __future__ import annotations

import dataclasses
from typing import Any, TypeVar

T = TypeVar("T")

# Per class: its field names when a copy needs no __init__ (the one @dataclass wrote, no __post_init__, __new__ or field
# behind a data descriptor, every field an init field), else None.
_PLAIN: dict[type, tuple[tuple[str, ...], frozenset[str]] | None] = {}


def _plain(cls: type) -> tuple[tuple[str, ...], frozenset[str]] | None:
    try:
        return _PLAIN[cls]
    except KeyError:
        fs = dataclasses.fields(cls)
        ok = (not hasattr(cls, "__post_init__") and not hasattr(cls, "__slots__") and _made_init(cls)
              and cls.__new__ is object.__new__
              and all(f.init and f._field_type is dataclasses._FIELD  # type: ignore[attr-defined]
                      and not hasattr(type(_in_class(cls, f.name)), "__set__") for f in fs))
        names = tuple(f.name for f in fs)
        plain = _PLAIN[cls] = (names, frozenset(names)) if ok else None
        return plain


def _made_init(cls: type) -> bool:
    """Whether ``cls.__init__`` is the one @dataclass wrote (it only assigns the fields): a class that wrote its own
    (it may check or derive a value) is copied through it, as dataclasses.replace does."""
    code = getattr(cls.__init__, "__code__", None)
    return code is not None and code.co_filename.startswith("<")  # dataclasses makes its methods by exec()


def _in_class(cls: type, name: str) -> Any:
    """The class attribute ``name`` as the class holds it (a descriptor itself, not what its __get__ gives)."""
    return next((vars(k)[name] for k in cls.__mro__ if name in vars(k)), None)


def replace(obj: T, **changes: Any) -> T:
    """dataclasses.replace(obj, **changes): the same new object (the fields copied, then ``changes``; nothing else of
    the old object's __dict__, so cached properties and marks are not carried over), without calling __init__ where
    __init__ would only assign the fields."""
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
