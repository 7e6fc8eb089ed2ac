"""The views of `gemma-doctor list`: a plain column table (no box art), JSON, or one id per line."""

from __future__ import annotations

from gemma_doctor.listing import Row, RowStatus
from gemma_doctor.units import human_size

_STATUS_STYLE = {RowStatus.OK: "green", RowStatus.FIXED: "green", RowStatus.NEEDS_FIX: "yellow", RowStatus.ERROR: "bold red",
                 RowStatus.BROKEN: "bold red"}
HEADERS = ("REPO", "REVISION", "FAMILY", "DTYPE", "SIZE", "STATUS")


def render_text(rows: list[Row], color: bool) -> str:
    """Aligned columns separated by two spaces; colour only on the status, only when asked."""
    from gemma_doctor.render.style import escape

    from gemma_doctor.render.style import to_string

    cells = [(r.repo_id or r.path, r.revision or (r.commit or "")[:12], r.family or "-", r.dtype or "-", human_size(r.size),
              r.status.value) for r in rows]
    widths = [max([len(h)] + [len(c[i]) for c in cells]) for i, h in enumerate(HEADERS)]
    lines = ["  ".join(h.ljust(w) for h, w in zip(HEADERS, widths)).rstrip()]
    for r, c in zip(rows, cells):
        head = escape("  ".join(v.ljust(w) for v, w in zip(c[:-1], widths[:-1])))
        lines.append(f"{head}  [{_STATUS_STYLE[r.status]}]{escape(c[-1])}[/]")
    # rich wraps at the console width; a table line must never wrap
    return to_string(lines, color, width=max(100, sum(widths) + 2 * len(widths) + 10))


def render_json(rows: list[Row], skipped: int) -> str:
    """`list --format json`."""
    from gemma_doctor.render.jsonout import dumps

    return dumps({"schema_version": 1, "models": [r.to_json() for r in rows], "skipped": skipped})


def render_quiet(rows: list[Row]) -> str:
    """One repo id (or folder) per line, like `hf cache ls -q`; a revision other than main is appended as @rev."""
    from gemma_doctor.render.style import printable

    out = []
    for r in rows:
        name = r.repo_id or r.path
        out.append(printable(name if r.revision in (None, "main") else f"{name}@{r.revision}"))
    return "".join(line + "\n" for line in out)
