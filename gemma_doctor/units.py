"""How sizes are written, in one place: every command prints file sizes in the same decimal units."""

from __future__ import annotations

from typing import Any


GIB = 1024**3


def positive_int(value: Any) -> int | None:
    """A positive whole number as a config writes one (an int, or digits in a string; never a bool), else None: how
    the run's resolver (plan/runplan.py) and the GPU value (readers/gpu.py) read counts such as num_processes."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int) and value > 0:
        return value
    if isinstance(value, str) and value.strip().isascii() and value.strip().isdigit() and int(value) > 0:
        return int(value)
    return None


def gib(n: int | float | None) -> str:
    """Bytes as GiB with one decimal ("13.2 GiB")."""
    return "?" if n is None else f"{n / GIB:.1f} GiB"


def human_size(n: float) -> str:
    """Bytes in decimal units, as huggingface_hub and `hf download` write them: 512 B, 217.8 kB, 1.3 MB, 24.4 GB."""
    for unit, div in (("TB", 1e12), ("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= div:
            return f"{n / div:.1f} {unit}"
    return f"{n:.0f} B"
