"""One-line summaries of the dtype census and the weights scan for the text view (plain strings, no rich)."""

from __future__ import annotations

from typing import Any

from gemma_doctor.units import human_size


def _num(n: float) -> str:
    for unit, div in (("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if n >= div:
            return f"{n / div:.1f}{unit}"
    return f"{n:.0f}"


_size = human_size


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


def remote_lines(extra: dict[str, Any]) -> list[str]:
    """Summary lines of a model read from the Hub (its `remote` block): what was read, and what `fix` would do."""
    rb = extra.get("remote")
    if not isinstance(rb, dict):
        return []
    files, headers = rb.get("files_read") or [], rb.get("headers_read") or []
    lines = [f"read from the Hub, not downloaded: {len(files)} small file(s) and {len(headers)} safetensors header(s), "
             f"{_size(rb.get('bytes', 0))} in {rb.get('requests', 0)} request(s)"
             + (f"; gated ({rb['gated']}), access granted" if rb.get("gated") else "")]
    if rb.get("cache_behind"):
        lines.append(f"the cached copy is at {str(rb.get('cached_commit'))[:12]}, behind this commit: "
                     f"hf download updates it")
    elif rb.get("cache_behind") is False:
        lines.append("the cache holds this same commit")
    fad = rb.get("fix_after_download")
    if isinstance(fad, dict):
        changes = fad.get("changes") or []
        if changes:
            what = ", ".join(f"{'/'.join(c.get('keys') or [])} in {c.get('file')}" for c in changes)
            when = "in the cached copy" if rb.get("cache_behind") is False else f"after download ({rb.get('download')})"
            lines.append(f"{when}, {fad.get('command')} would set {what} to false")
        else:
            notes = "; ".join(fad.get("notes") or []) or "nothing to change"
            lines.append(f"after download, fix would change nothing: {notes}")
    return lines


def adapter_lines(extra: dict[str, Any]) -> list[str]:
    """Summary lines of an adapter (its `adapter` and `base` blocks) or a Trainer checkpoint (`kind`)."""
    lines: list[str] = []
    kind = extra.get("kind")
    ad = extra.get("adapter")
    if kind == "checkpoint":
        lines.append("Trainer checkpoint (trainer_state.json)" + (" of a PEFT adapter" if ad else " of a model"))
    if not isinstance(ad, dict) or ad.get("error"):
        return lines
    targets = ad.get("target_modules")
    targets = ", ".join(targets) if isinstance(targets, list) else (targets or "none")
    mts = ", ".join(ad.get("modules_to_save") or []) or "none"
    lines.append(f"adapter: {ad.get('peft_type') or '?'} r={ad.get('rank')} alpha={ad.get('alpha')}; targets {targets}; "
                 f"modules_to_save {mts}; saved by PEFT {ad.get('peft_version') or '(not recorded)'}; "
                 f"{ad.get('lora_tensors', 0)} LoRA + {len(ad.get('full_tensors') or {})} full tensor(s), layers under "
                 f"{ad.get('layout') or '?'}")
    base = extra.get("base")
    if isinstance(base, dict):
        where = {"cache": f"cached, {base.get('path')}", "folder": f"folder {base.get('path')}",
                 "hub": f"config.json from the Hub, {base.get('path')}"}.get(
            str(base.get("found")), str(base.get("found")))
        mt = f", model_type {base['model_type']}" if base.get("model_type") else ""
        lines.append(f"base: {base.get('name') or '(unnamed)'} ({where}{mt})")
    return lines
