"""Write the field catalogue's parts of docs/findings.md, docs/field-recall.md and gemma_doctor/codes.py from
gemma_doctor/catalogue/field.json, so codes, docs and catalogue cannot drift (tests/test_catalogue.py regenerates and
compares). Usage: python docs/gen_catalogue.py [--check]"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FINDINGS = ROOT / "docs" / "findings.md"
CODES = ROOT / "gemma_doctor" / "codes.py"
RECALL = ROOT / "docs" / "field-recall.md"
# The catalogue's section goes before this heading when findings.md does not hold it yet.
ANCHOR = "## GD8xx:"


def _splice(text: str, begin: str, end: str, block: str, anchor: str) -> str:
    if begin in text:
        head, rest = text.split(begin, 1)
        _, tail = rest.split(end, 1)
        return head + block + tail
    head, tail = text.split(anchor, 1)
    return head + block + "\n\n" + anchor + tail


def render() -> tuple[str, str, str]:
    """(findings.md, codes.py, field-recall.md) with their catalogue parts as the catalogue says."""
    from gemma_doctor import catalogue

    findings = _splice(FINDINGS.read_text(), catalogue.DOCS_BEGIN, catalogue.DOCS_END, catalogue.render_docs(), ANCHOR)
    codes = _splice(CODES.read_text(), catalogue.CODES_BEGIN, catalogue.CODES_END, catalogue.render_codes(),
                    "    # GD8xx:")
    recall = _splice(RECALL.read_text(), catalogue.SUMMARY_BEGIN, catalogue.SUMMARY_END, catalogue.render_summary(),
                     "## How recall is measured")
    return findings, codes, recall


if __name__ == "__main__":
    findings, codes, recall = render()
    if "--check" in sys.argv:
        stale = [p.name for p, t in ((FINDINGS, findings), (CODES, codes), (RECALL, recall)) if p.read_text() != t]
        sys.exit(f"out of date: {', '.join(stale)} (run python docs/gen_catalogue.py)" if stale else 0)
    FINDINGS.write_text(findings)
    CODES.write_text(codes)
    RECALL.write_text(recall)
