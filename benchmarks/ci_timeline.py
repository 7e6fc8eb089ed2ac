"""Read a suite run's timeline (tests/conftest.py: GEMMA_DOCTOR_TIMELINE=FILE) and say how the xdist workers spent it:
each worker's collection, its busy seconds (tests, setup and teardown included), its idle seconds between tests, when
it ended, and the modules it ran in order; then the tail (how long the last worker ran on alone) and the modules that
ran in it. A long module that starts late is the tail; docs/ci.md keeps what was found.

Run: GEMMA_DOCTOR_TIMELINE=/tmp/timeline.jsonl bash .ci/run; python benchmarks/ci_timeline.py /tmp/timeline.jsonl
[--json] [--modules N]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any


def read(path: Path) -> list[dict[str, Any]]:
    """The timeline's records; a line cut short (a killed run) is left out."""
    out = []
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return out


def summary(records: list[dict[str, Any]]) -> dict[str, Any]:
    """Per worker: collection end, first start, last end, busy and idle seconds, its modules in order with their spans;
    and the run's start, end and tail (the seconds the last worker to finish ran after the one before it)."""
    tests = sorted((r for r in records if r.get("event") == "test"), key=lambda r: r["start"])
    collected = {r["worker"]: r["t"] for r in records if r.get("event") == "collected"}
    if not tests:
        return {"workers": {}, "tail": 0.0}
    begin = min([*collected.values(), tests[0]["start"]])
    workers: dict[str, dict[str, Any]] = {}
    for r in tests:
        w = workers.setdefault(r["worker"], {"tests": 0, "busy": 0.0, "idle": 0.0, "first": r["start"],
                                             "last": r["start"], "modules": []})
        if w["tests"]:
            w["idle"] += max(0.0, r["start"] - w["last"])
        w["tests"] += 1
        w["busy"] += r["end"] - r["start"]
        w["last"] = max(w["last"], r["end"])
        module = r["id"].split("::", 1)[0]
        if not w["modules"] or w["modules"][-1]["module"] != module:
            w["modules"].append({"module": module, "start": r["start"], "end": r["end"], "busy": 0.0})
        w["modules"][-1]["end"] = r["end"]
        w["modules"][-1]["busy"] += r["end"] - r["start"]
    for name, w in workers.items():
        w["collected"] = collected.get(name)
        for key in ("first", "last", "collected"):
            if w[key] is not None:
                w[key] -= begin
        for m in w["modules"]:
            m["start"] -= begin
            m["end"] -= begin
    ends = sorted(w["last"] for w in workers.values())
    return {"workers": workers, "end": ends[-1], "tail": ends[-1] - ends[-2] if len(ends) > 1 else 0.0}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("timeline", type=Path)
    parser.add_argument("--json", action="store_true", help="the whole summary as JSON")
    parser.add_argument("--modules", type=int, default=8, help="each worker's last N modules (default 8)")
    args = parser.parse_args(argv)
    s = summary(read(args.timeline))
    if args.json:
        print(json.dumps(s, indent=1))
        return 0
    for name, w in sorted(s["workers"].items()):
        got = f"{w['collected']:.1f}" if w["collected"] is not None else "?"
        print(f"{name}: collected at {got} s, tests {w['first']:.1f}-{w['last']:.1f} s: {w['tests']} tests, busy "
              f"{w['busy']:.1f} s, idle between tests {w['idle']:.1f} s")
        for m in w["modules"][-args.modules:]:
            print(f"    {m['start']:8.1f} {m['end']:8.1f} {m['busy']:7.1f} s  {m['module']}")
    print(f"run end {s.get('end', 0.0):.1f} s; tail (the last worker alone) {s['tail']:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
