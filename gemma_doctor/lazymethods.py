"""gemma-doctor's dataclasses make their rarely used methods on first use, not at import.

Python 3.10-3.12 compile six methods per frozen dataclass when the class is made (``__init__``, ``__repr__``,
``__eq__``, ``__hash__``, ``__setattr__``, ``__delattr__``): for gemma-doctor's ~60 classes that was 26 of a one-repo
check's 84 ms (benchmarks/startup.py; docs/benchmarks.md). Here ``dataclasses._create_fn`` makes every method but
``__init__`` of a class in a ``gemma_doctor`` module a stub that, on its first call, makes the method exactly as
``_create_fn`` would have (the same call, with the same arguments, only later), puts it in the class in its own place
and calls it. Nothing else changes: classes of every other module are made by ``_create_fn`` itself, and on Python
versions whose dataclasses have no such function (3.13 makes all methods of a class in one compilation), or one of
another shape, nothing is installed (``GEMMA_DOCTOR_EAGER_METHODS=1`` also leaves dataclasses alone: tests compare).
"""

from __future__ import annotations

import dataclasses
import os
import sys
from typing import Any, Callable

# __init__ stays eager: dataclasses reads its signature for a class's __doc__, and it is called for every object.
LAZY = frozenset({"__repr__", "__eq__", "__hash__", "__setattr__", "__delattr__"})


def install() -> bool:
    """Install the lazy methods (once); False when this Python's dataclasses are not the shape this knows."""
    original = getattr(dataclasses, "_create_fn", None)
    if original is None or getattr(original, "_gemma_doctor_lazy", False):
        return original is not None
    if os.environ.get("GEMMA_DOCTOR_EAGER_METHODS") or not (3, 10) <= sys.version_info[:2] <= (3, 12):
        return False
    code = getattr(original, "__code__", None)
    if code is None or code.co_varnames[:3] != ("name", "args", "body") or code.co_kwonlyargcount != 3:
        return False

    def create_fn(name: str, args: Any, body: Any, **kwargs: Any) -> Callable[..., Any]:
        where = kwargs.get("globals")
        if name in LAZY and isinstance(where, dict) and str(where.get("__name__", "")).startswith("gemma_doctor."):
            return _stub(original, name, args, body, kwargs)
        return original(name, args, body, **kwargs)

    create_fn._gemma_doctor_lazy = True  # type: ignore[attr-defined]
    dataclasses._create_fn = create_fn  # type: ignore[attr-defined]
    return True


def _stub(original: Callable[..., Any], name: str, args: Any, body: Any, kwargs: dict[str, Any]) -> Callable[..., Any]:
    args, body = tuple(args), list(body)
    kwargs = dict(kwargs)
    if kwargs.get("locals") is not None:
        kwargs["locals"] = dict(kwargs["locals"])  # _create_fn may write into it
    made: list[Callable[..., Any]] = []

    def make() -> Callable[..., Any]:
        """The method itself, as _create_fn makes it (made once)."""
        if not made:
            real = original(name, args, body, **kwargs)
            real.__qualname__ = stub.__qualname__
            made.append(real)
        return made[0]

    def stub(*a: Any, **k: Any) -> Any:
        first = not made
        real = make()
        if first:
            for klass in type(a[0]).__mro__:  # the class that holds this stub gets the method itself
                if klass.__dict__.get(name) is stub:
                    type.__setattr__(klass, name, real)
                    break
        return real(*a, **k)

    stub.__name__ = name
    stub.make = make  # type: ignore[attr-defined]
    # the name dataclasses gives a method it made (_set_qualname turns it into Class.method)
    stub.__qualname__ = f"__create_fn__.<locals>.{name}"
    return stub
