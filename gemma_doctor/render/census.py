"""One-line summaries of the dtype census and the weights scan for the text view (plain strings, no rich)."""

from __future__ import annotations

from typing import Any


def _num(n: float) -> str:
    for unit, div in (("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if n >= div:
            return f"{n / div:.1f}{unit}"
    return f"{n:.0f}"


def _size(n: float) -> str:
    for unit, div in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= div:
            return f"{n / div:.1f} {unit}"
    return f"{n:.0f} B"


def census_lines(extra: dict[str, Any]) -> list[str]:
    """Summary lines of a model's `dtypes` and `weights_scan` JSON blocks; empty when there is nothing to say."""
    lines: list[str] = []
    dt = extra.get("dtypes")
    if isinstance(dt, dict) and dt.get("source"):
        weights = ", ".join(f"{d} {_num(n)}" for d, n in sorted(dt.get("weights", {}).items(), key=lambda kv: -kv[1]))
        shards = dt.get("shards") or []
        q = dt.get("quantization")
        quant = f"; quantized {q.get('method')}" if q else ""
        lines.append(f"dtypes: declared {dt.get('declared') or 'none'}; weights {weights or 'none readable'} "
                     f"({_num(dt.get('total_params', 0))} params, {_size(dt.get('total_bytes', 0))}) in "
                     f"{len(shards)} file(s){quant}")
    ws = extra.get("weights_scan")
    if isinstance(ws, dict) and ws.get("total"):
        t = ws["total"]
        lines.append(f"weights scan: {t.get('tensors', 0)} tensors, {_size(t.get('bytes', 0))}: NaN {t.get('nan', 0)}, "
                     f"Inf {t.get('inf', 0)}, beyond fp16 {t.get('beyond_fp16', 0)}, max |x| {t.get('max_abs')}, "
                     f"zero embedding rows {t.get('zero_rows', 0)}")
    return lines
