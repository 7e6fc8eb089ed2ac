"""The machine-readable views: stable JSON documents (schema: docs/json-schema.md)."""

from __future__ import annotations

import json
import re
from typing import TYPE_CHECKING, Any, Iterable

from gemma_doctor.report import FailOn, ModelReport, Report

if TYPE_CHECKING:  # fixes (with difflib and the JSON editor) is imported by fix and restore only: check --format json
    from gemma_doctor.fixes import Outcome  # starts without it (3 ms)


# Characters json.dumps(ensure_ascii=False) leaves raw that a terminal acts on (DEL, C1 controls, bidi overrides,
# line separators), and lone surrogates (a file name that is not UTF-8, as Python holds it), which no UTF-8 text
# can hold. They can only occur inside JSON strings, where \uXXXX is the same character: exact JSON still.
_RAW = re.compile("[\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069\ufeff\ud800-\udfff]")


def dumps(doc: Any) -> str:
    """JSON text as every command prints it (strict: no NaN; nothing a terminal would act on left raw)."""
    return _raw_safe(_dumps(doc)) + "\n"


def _dumps(doc: Any) -> str:
    try:
        return json.dumps(doc, indent=2, ensure_ascii=False, allow_nan=False)
    except ValueError:  # a NaN / infinity, or an integer too long to print, from some hostile input
        return json.dumps(_printable_numbers(doc), indent=2, ensure_ascii=False, allow_nan=False)


def _raw_safe(text: str) -> str:
    return _RAW.sub(lambda m: f"\\u{ord(m.group()):04x}", text)


# How json.dumps(indent=2) writes the top-level "models" list when it is empty, and where its entries go: each entry
# is written at depth 2, four spaces in (the same text as dumped alone with each line indented by four: JSON strings
# hold no raw newline), the entries joined by ",\n".
_MODELS_EMPTY = '\n  "models": []'


def with_json(m: ModelReport) -> ModelReport:
    """``m`` with its entry of the JSON document as dumps() writes it there (made in a whole-cache scan's worker,
    pipeline.diagnose's ``finish``): render_report then joins the entries instead of dumping them one by one."""
    from dataclasses import replace

    return replace(m, block=("json", "\n".join("    " + line for line in _dumps(m.to_json()).split("\n"))))


def _printable_numbers(v: Any) -> Any:
    """``v`` with the numbers JSON cannot hold as strings: "nan", "inf", "-inf", "<an integer of N bits>"."""
    if isinstance(v, float) and (v != v or v in (float("inf"), float("-inf"))):
        return "nan" if v != v else ("inf" if v > 0 else "-inf")
    if isinstance(v, int) and not isinstance(v, bool) and v.bit_length() > 4000:
        return f"<an integer of {v.bit_length()} bits>"
    if isinstance(v, dict):
        return {k: _printable_numbers(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_printable_numbers(x) for x in v]
    return v


def render_report(report: Report, fail_on: FailOn) -> str:
    """`check --format json`. Where every model's entry was written by the scan's workers (with_json), the document
    is dumped without them and their text put in its "models" list: the same text as dumping it whole (_dumps
    converts only the numbers JSON cannot hold, wherever they are; _raw_safe works character by character)."""
    entries = [m.block[1] if m.block is not None and m.block[0] == "json" else None for m in report.models]
    if entries and None not in entries:
        head = _dumps(report.to_json(fail_on, models=False))
        if head.count(_MODELS_EMPTY) == 1:
            joined = ",\n".join(entries)  # type: ignore[arg-type]
            return _raw_safe(head.replace(_MODELS_EMPTY, f'\n  "models": [\n{joined}\n  ]')) + "\n"
    return dumps(report.to_json(fail_on))


def outcomes_doc(command: str, outcomes: Iterable[Outcome], dry_run: bool, ok: bool) -> dict[str, Any]:
    """`fix` / `restore --format json` as a dict."""
    models = []
    for o in outcomes:
        s = o.facts.snapshot
        models.append({
            "target": s.target, "repo_id": s.repo_id, "revision": s.revision, "commit": s.commit, "path": str(s.path),
            "family": o.facts.family.label, "status": o.status.value,
            "changes": [{"file": c.name, "path": str(c.path), "keys": list(c.keys), "diff": c.diff()} for c in o.changes],
            "messages": list(o.messages),
        })
    return {"schema_version": 1, "command": command, "dry_run": dry_run, "status": "ok" if ok else "fail", "models": models}
