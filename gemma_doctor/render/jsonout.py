"""The machine-readable views: stable JSON documents (schema: docs/json-schema.md)."""

from __future__ import annotations

import json
from typing import Any, Iterable

from gemma_doctor.fixes import Outcome
from gemma_doctor.report import FailOn, Report


def dumps(doc: Any) -> str:
    """JSON text as every command prints it."""
    return json.dumps(doc, indent=2, ensure_ascii=False) + "\n"


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
