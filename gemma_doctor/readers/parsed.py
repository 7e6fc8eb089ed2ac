"""Parses shared across the models of one whole-cache scan: a file's parse is a function of its bytes, and fine-tunes
of one base hold the same generation_config.json, often the same config.json and the same safetensors headers.

Shared only while a scan runs (``sharing()``, entered by pipeline's and listing's scans): a parsed config's data is
then one object for every file of that text, read-only like every fact; outside a scan (one model, the Python API's
``prepare``) every file is parsed on its own, so data a caller holds and changes is never handed to the next read.
"""

from __future__ import annotations

import contextlib
from typing import Any, Callable, Hashable, Iterator, TypeVar

V = TypeVar("V")


class Cache:
    """Results by key, bounded in entries and in the bytes of the keys kept."""

    def __init__(self, max_bytes: int, max_entries: int = 4096) -> None:
        self.max_bytes, self.max_entries = max_bytes, max_entries
        self.items: dict[Hashable, Any] = {}
        self.size = 0
        _CACHES.append(self)

    def get(self, key: Hashable, size: int, make: Callable[[], V]) -> tuple[V, bool]:
        """(the result for ``key``, whether it was kept from before); ``make()`` when none is (or no scan runs)."""
        if not _SHARING[0]:
            return make(), False
        hit = self.items.get(key, _NONE)
        if hit is not _NONE:
            return hit, True
        value = make()
        if self.size + size > self.max_bytes or len(self.items) >= self.max_entries:
            self.clear()
        self.items[key] = value
        self.size += size
        return value, False

    def clear(self) -> None:
        self.items.clear()
        self.size = 0


_NONE = object()
_SHARING = [False]
_CACHES: list[Cache] = []


def active() -> bool:
    """True while a scan shares its parses (and its judgements: gemma_doctor/memo.py)."""
    return _SHARING[0]


@contextlib.contextmanager
def sharing() -> Iterator[None]:
    """Parses shared for the length of a scan, forgotten at its start and at its end."""
    outer = _SHARING[0]
    for c in _CACHES:
        c.clear()
    _SHARING[0] = True
    try:
        yield
    finally:
        _SHARING[0] = outer
        if not outer:
            for c in _CACHES:
                c.clear()
