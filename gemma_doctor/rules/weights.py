"""Findings of the weights scan (`check --weights`): NaN/Inf, values beyond fp16, zero embedding rows."""

from __future__ import annotations

from typing import Any, Iterator

from gemma_doctor.facts import CheckOptions, Environment, ModelFacts
from gemma_doctor.report import Finding, Severity

# Per-tensor findings beyond this many are summed up in one more finding, so a broken model stays readable.
MAX_PER_TENSOR = 10


def _names(tensors: list[Any], limit: int = MAX_PER_TENSOR) -> str:
    shown = ", ".join(t.name for t in tensors[:limit])
    return shown + (f" and {len(tensors) - limit} more" if len(tensors) > limit else "")


def _row_ranges(ranges: tuple[tuple[int, int], ...], limit: int = 8) -> str:
    parts = [f"{a}" if a == b else f"{a}-{b}" for a, b in ranges[:limit]]
    return ", ".join(parts) + (f" (+{len(ranges) - limit} more ranges)" if len(ranges) > limit else "")


def pad_rows(config: Any) -> frozenset[int]:
    """The pad token ids config.json declares (top level and text_config): Gemma's embedding has padding_idx there,
    an all-zero row by design, not a token someone forgot to initialise."""
    out: set[int] = set()
    for scope in (config, config.get("text_config") if isinstance(config, dict) else None):
        if isinstance(scope, dict):
            pad = scope.get("pad_token_id")
            if isinstance(pad, int) and not isinstance(pad, bool) and pad >= 0:
                out.add(pad)
    return frozenset(out)


def without_rows(ranges: tuple[tuple[int, int], ...], count: int, drop: frozenset[int]) -> tuple[tuple[tuple[int, int], ...], int]:
    """Zero-row ranges and their count with the rows in ``drop`` taken out (ranges are inclusive; ``count`` may
    exceed what the kept ranges hold when the scan stopped recording ranges)."""
    out: list[tuple[int, int]] = []
    removed = 0
    for a, b in ranges:
        start = a
        for row in sorted(r for r in drop if a <= r <= b):
            if row > start:
                out.append((start, row - 1))
            start = row + 1
            removed += 1
        if start <= b:
            out.append((start, b))
    return tuple(out), count - removed


def check(model: ModelFacts, env: Environment, options: CheckOptions) -> Iterator[Finding]:
    """GD501-GD504 from ModelFacts.weights_scan; nothing without --weights."""
    scan = model.weights_scan
    if scan is None:
        return
    bad = [t for t in scan.tensors if t.nan or t.inf]
    for t in bad[:MAX_PER_TENSOR]:
        yield Finding("GD501", Severity.ERROR, f"{t.name} ({t.dtype} {list(t.shape)}) holds {t.nan} NaN and {t.inf} Inf values",
                      file=t.file, key=t.name,
                      fix="go back to an earlier checkpoint or the original weights; find the step that produced them "
                          "(often fp16 overflow or a too-high learning rate)")
    if len(bad) > MAX_PER_TENSOR:
        rest = bad[MAX_PER_TENSOR:]
        yield Finding("GD501", Severity.ERROR, f"{len(rest)} more tensors hold NaN/Inf: {_names(rest)}",
                      fix="go back to an earlier checkpoint or the original weights",
                      details={"tensors": [t.name for t in rest]})
    over = [t for t in scan.tensors if t.beyond_fp16]
    if over:
        planned = model.recommendation is not None and model.recommendation.precision == "fp16"
        saved_fp16 = model.census is not None and model.census.dominant == "F16"
        sev = Severity.WARNING if planned or saved_fp16 else Severity.INFO
        why = "fp16 is planned" if planned else ("the weights are saved in fp16" if saved_fp16 else "only if cast to fp16")
        count = sum(t.beyond_fp16 for t in over)
        yield Finding("GD502", sev, f"{count} value(s) beyond fp16's range (|x| > 65504) in {len(over)} tensor(s) ({why}): "
                      f"{_names(over)}", file=over[0].file, key=over[0].name,
                      fix="keep these weights out of fp16: load and train in bf16 (fp32 on GPUs without native bf16)",
                      details={"tensors": {t.name: t.beyond_fp16 for t in over}})
    pads = pad_rows(model.config.data if model.config.ok else None)
    for t in scan.tensors:
        if not t.zero_rows:
            continue
        ranges, rows = without_rows(t.zero_row_ranges, t.zero_rows, pads)
        if not rows:
            continue
        total = t.shape[0]
        yield Finding("GD503", Severity.WARNING,
                      f"{t.name} has {rows} all-zero row(s) of {total}: {_row_ranges(ranges)} "
                      "(zero-initialised new tokens are a NaN risk when fine-tuning)",
                      file=t.file, key=t.name,
                      fix="initialise the rows from the mean of the existing rows (or small random values, std 0.02) "
                          "and save again: w = model.get_input_embeddings().weight; "
                          "w.data[new] = w.data[old].mean(0, keepdim=True) (+ small noise)",
                      details={"ranges": [list(r) for r in ranges]})
    if scan.skipped or scan.unreadable:
        parts = [f"{c} {d} tensor(s)" for d, c in scan.skipped.items()]
        parts += [f"{f} ({e})" for f, e in scan.unreadable]
        yield Finding("GD504", Severity.INFO, "not scanned: " + ", ".join(parts) +
                      (" (only F32, F16 and BF16 values are tested)" if scan.skipped else ""),
                      file=scan.unreadable[0][0] if scan.unreadable else None)
