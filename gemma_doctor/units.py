"""How sizes are written, in one place: every command prints file sizes in the same decimal units."""

from __future__ import annotations


GIB = 1024**3


def gib(n: int | float | None) -> str:
    """Bytes as GiB with one decimal ("13.2 GiB")."""
    return "?" if n is None else f"{n / GIB:.1f} GiB"


def human_size(n: float) -> str:
    """Bytes in decimal units, as huggingface_hub and `hf download` write them: 512 B, 217.8 kB, 1.3 MB, 24.4 GB."""
    for unit, div in (("TB", 1e12), ("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= div:
            return f"{n / div:.1f} {unit}"
    return f"{n:.0f} B"
