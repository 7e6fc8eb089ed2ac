"""The machine-readable views: stable JSON documents (schema: docs/json-schema.md)."""

from __future__ import annotations

import json
import re
from typing import TYPE_CHECKING, Any, Iterable

from gemma_doctor.report import FailOn, Report

if TYPE_CHECKING:  # fixes (with difflib and the JSON editor) is imported by fix and restore only: check --format json
    from gemma_doctor.fixes import Outcome  # starts without it (3 ms)


# Characters json.dumps(ensure_ascii=False) leaves raw that a terminal acts on (DEL, C1 controls, bidi overrides,
# line separators), and lone surrogates (a file name that is not UTF-8, as Python holds it), which no UTF-8 text
# can hold. They can only occur inside JSON strings, where \uXXXX is the same character: exact JSON still.
_RAW = re.compile("[\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069\ufeff\ud800-\udfff]")


def dumps(doc: Any) -> str:
    """JSON text as every command prints it (strict: no NaN; nothing a terminal would act on left raw)."""
    try:
        text = json.dumps(doc, indent=2, ensure_ascii=False, allow_nan=False)
    except ValueError:  # a NaN / infinity, or an integer too long to print, from some hostile input
        text = json.dumps(_printable_numbers(doc), indent=2, ensure_ascii=False, allow_nan=False)
    return _RAW.sub(lambda m: f"\\u{ord(m.group()):04x}", text) + "\n"


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
    """`check --format json`."""
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
