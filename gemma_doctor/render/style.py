"""Shared helpers for the human-readable views: a string-returning rich console."""

from __future__ import annotations

import io
from typing import Any


def to_string(renderables: list[Any], color: bool, width: int = 100) -> str:
    """Render rich objects to a string; colour only when asked (the CLI asks for a TTY without NO_COLOR)."""
    from rich.console import Console

    buf = io.StringIO()
    console = Console(file=buf, force_terminal=color, no_color=not color, color_system="standard" if color else None,
                      width=width, highlight=False, emoji=False, soft_wrap=True)
    # Consecutive markup strings are printed as one: rich's per-call overhead dominated whole-cache reports.
    run: list[str] = []
    for r in renderables:
        if isinstance(r, str):
            run.append(r)
            continue
        if run:
            console.print("\n".join(run))
            run = []
        console.print(r)
    if run:
        console.print("\n".join(run))
    return buf.getvalue()


SEVERITY_STYLE = {"error": "bold red", "warning": "yellow", "info": "cyan"}
