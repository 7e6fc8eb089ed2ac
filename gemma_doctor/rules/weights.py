"""Findings of the weights scan (`check --weights`): NaN/Inf, values beyond fp16, zero embedding rows."""

from __future__ import annotations

from typing import Any, Iterator

from gemma_doctor.codes import emits
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


def pad_token_id(model: ModelFacts) -> int | None:
    """The pad id the embedding zeroes (config.json pad_token_id, text config first), else the tokenizer's <pad>."""
    if model.config.ok:
        text = model.config.data.get("text_config")
        for scope in (text if isinstance(text, dict) else {}, model.config.data):
            v = scope.get("pad_token_id")
            if isinstance(v, int) and not isinstance(v, bool):
                return v
    tok = model.tokenizer
    return tok.id_of(tok.pad_token) if tok is not None and tok.ok else None


def _count(ranges: tuple[tuple[int, int], ...]) -> int:
    return sum(b - a + 1 for a, b in ranges)


def _without(ranges: tuple[tuple[int, int], ...], row: int | None) -> tuple[tuple[int, int], ...]:
    """``ranges`` (inclusive) with ``row`` taken out."""
    if row is None:
        return ranges
    out: list[tuple[int, int]] = []
    for a, b in ranges:
        if a <= row <= b:
            out += [r for r in ((a, row - 1), (row + 1, b)) if r[0] <= r[1]]
        else:
            out.append((a, b))
    return tuple(out)


@emits("GD501", "GD502", "GD503", "GD504")
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
        planned = model.run is not None and model.run.precision.value == "fp16"
        saved_fp16 = model.census is not None and model.census.dominant == "F16"
        sev = Severity.WARNING if planned or saved_fp16 else Severity.INFO
        why = "fp16 is planned" if planned else ("the weights are saved in fp16" if saved_fp16 else "only if cast to fp16")
        count = sum(t.beyond_fp16 for t in over)
        yield Finding("GD502", sev, f"{count} value(s) beyond fp16's range (|x| > 65504) in {len(over)} tensor(s) ({why}): "
                      f"{_names(over)}", file=over[0].file, key=over[0].name,
                      fix="keep these weights out of fp16: load and train in bf16 (fp32 on GPUs without native bf16)",
                      details={"tensors": {t.name: t.beyond_fp16 for t in over}})
    zero = [t for t in scan.tensors if t.zero_rows]
    pad = pad_token_id(model)
    added = {i: tok for tok, i in model.tokenizer.added.items()} if model.tokenizer is not None else {}
    for t in zero:
        # The pad row is zero by design (nn.Embedding(padding_idx=pad) zeroes it and never trains it): not a finding.
        ranges = _without(t.zero_row_ranges, pad)
        pad_zero = _count(t.zero_row_ranges) != _count(ranges)
        rows, total = t.zero_rows - int(pad_zero), t.shape[0]
        if not ranges:
            continue
        named = [f"{added[i]} ({i})" for a, b in ranges for i in range(a, min(b, a + 1000) + 1) if i in added][:5]
        yield Finding("GD503", Severity.WARNING,
                      f"{t.name} has {rows} all-zero row(s) of {total}: {_row_ranges(ranges)} "
                      + (f"(added tokens left zero: {', '.join(named)}; " if named else "(")
                      + "zero-initialised new tokens are a NaN risk when fine-tuning"
                      + (f"; the pad row {pad} is zero by design and not counted)" if pad_zero else ")"),
                      file=t.file, key=t.name,
                      fix="initialise the rows from the mean of the existing rows (or small random values, std 0.02) "
                          "and save again: w = model.get_input_embeddings().weight; "
                          "w.data[new] = w.data[old].mean(0, keepdim=True) (+ small noise)",
                      details={"ranges": [list(r) for r in ranges], "added_tokens": named})
    if scan.skipped or scan.unreadable:
        parts = [f"{c} {d} tensor(s)" for d, c in scan.skipped.items()]
        parts += [f"{f} ({e})" for f, e in scan.unreadable]
        yield Finding("GD504", Severity.INFO, "not scanned: " + ", ".join(parts) +
                      (" (only F32, F16 and BF16 values are tested)" if scan.skipped else ""),
                      file=scan.unreadable[0][0] if scan.unreadable else None)
