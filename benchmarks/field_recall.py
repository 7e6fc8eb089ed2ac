"""Recall of `check` on reports from the field scan: caught / partly / missed, per area, for one or two source trees.

Each report of benchmarks/field_corpus.json carries the inputs a user has (config.json, a training config, the
versions with --with, the GPU) and the codes that count: `expect` (caught) and `partly`. The report's inputs are laid
out in a temporary folder and `python -m gemma_doctor check ... --format json` runs on them with PYTHONPATH set to
each tree, so main as it is and this branch are measured the same way:

    git archive main | tar -x -C /tmp/gd-main
    python benchmarks/field_recall.py --tree before=/tmp/gd-main --tree after=. [--json out.json]

A report is *caught* when one of its `expect` codes is reported, *partly* when one of its `partly` codes is, else
*missed*. "held out" are the reports the catalogue (gemma_doctor/catalogue/field.json) does not cite.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from collections import Counter, defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CORPUS = ROOT / "benchmarks" / "field_corpus.json"


def run_check(tree: Path, inputs: dict, work: Path) -> set[str]:
    """The finding codes `check` reports for one report's inputs, with the gemma_doctor of ``tree``."""
    model = work / "model"
    model.mkdir(parents=True)
    (model / "config.json").write_text(json.dumps(inputs["config"]))
    if "tokenizer_config" in inputs:
        (model / "tokenizer_config.json").write_text(json.dumps(inputs["tokenizer_config"]))
    args = [sys.executable, "-m", "gemma_doctor", "check", str(model), "--format", "json"]
    if "training" in inputs:
        (work / "train.json").write_text(json.dumps(inputs["training"]))
        args += ["--training-config", str(work / "train.json")]
    for w in inputs.get("with", []):
        args += ["--with", w]
    args += ["--gpu", inputs.get("gpu", "none")]
    env = dict(os.environ, PYTHONPATH=str(tree), HF_HUB_OFFLINE="1")
    proc = subprocess.run(args, capture_output=True, text=True, env=env, cwd=work, timeout=120)
    try:
        doc = json.loads(proc.stdout)
    except json.JSONDecodeError:
        raise SystemExit(f"check failed on {inputs}: {proc.stderr[-2000:]}") from None
    return {f["code"] for m in doc["models"] for f in m["findings"]}


def verdict(report: dict, codes: set[str]) -> str:
    if codes & set(report["expect"]):
        return "caught"
    if codes & set(report["partly"]):
        return "partly"
    return "missed"


def cited_refs() -> set[str]:
    doc = json.loads((ROOT / "gemma_doctor" / "catalogue" / "field.json").read_text())
    return {s["ref"] for e in doc["entries"] for s in e["sources"]}


def measure(trees: dict[str, Path]) -> list[dict]:
    reports = json.loads(CORPUS.read_text())["reports"]
    cited = cited_refs()
    rows = []
    for report in reports:
        row = {"id": report["id"], "area": report["area"], "detectable": report["detectable"],
               "held_out": report["id"] not in cited}
        for label, tree in trees.items():
            with tempfile.TemporaryDirectory() as tmp:
                codes = run_check(tree, report["inputs"], Path(tmp))
            row[label] = verdict(report, codes)
            row[label + "_codes"] = sorted(codes & set(report["expect"] + report["partly"]))
        rows.append(row)
    return rows


def table(rows: list[dict], labels: list[str]) -> str:
    """Markdown: per area, caught / partly / missed for each tree; then totals, all and held out."""
    out = ["| area | reports | " + " | ".join(f"{t} caught / partly / missed" for t in labels) + " |",
           "| --- | ---: | " + " | ".join("---" for _ in labels) + " |"]
    by_area: dict[str, list[dict]] = defaultdict(list)
    for r in rows:
        by_area[r["area"]].append(r)

    def cell(group: list[dict], label: str) -> str:
        c = Counter(r[label] for r in group)
        return f"{c['caught']} / {c['partly']} / {c['missed']}"

    for area in sorted(by_area):
        out.append(f"| {area} | {len(by_area[area])} | " + " | ".join(cell(by_area[area], t) for t in labels) + " |")
    for name, group in (("**all**", rows), ("**held out** (not cited by the catalogue)", [r for r in rows if r["held_out"]]),
                        ("**detectable** (yes)", [r for r in rows if r["detectable"] == "yes"])):
        out.append(f"| {name} | {len(group)} | " + " | ".join(cell(group, t) for t in labels) + " |")
    return "\n".join(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tree", action="append", default=[], metavar="LABEL=PATH",
                    help="a source tree holding gemma_doctor/ (default: after=this repository)")
    ap.add_argument("--json", metavar="FILE", help="also write the per-report rows as JSON")
    ap.add_argument("--docs", metavar="FILE", help="write the table and the per-report verdicts into FILE between "
                    "the recall markers (docs/field-recall.md)")
    ns = ap.parse_args()
    trees = dict(t.split("=", 1) for t in ns.tree) if ns.tree else {"after": str(ROOT)}
    rows = measure({k: Path(v).resolve() for k, v in trees.items()})
    print(table(rows, list(trees)))
    print()
    for r in rows:
        print(f"{r['id']:48} {r['area']:26} " + "  ".join(f"{t}={r[t]:7}" for t in trees) + ("" if r["held_out"] else "  (cited)"))
    if ns.json:
        Path(ns.json).write_text(json.dumps(rows, indent=1))
    if ns.docs:
        write_docs(Path(ns.docs), rows, list(trees))


BEGIN = "<!-- BEGIN measured recall: written by `python benchmarks/field_recall.py --docs`, do not edit -->"
END = "<!-- END measured recall -->"


def write_docs(page: Path, rows: list[dict], labels: list[str]) -> None:
    """Replace the measured block of ``page`` with this run's table and per-report verdicts."""
    lines = [BEGIN, table(rows, labels), "", "| report | area | detectable | held out | "
             + " | ".join(labels) + " | codes (" + labels[-1] + ") |", "| --- | --- | --- | --- | "
             + " | ".join("---" for _ in labels) + " | --- |"]
    for r in rows:
        repo, num = r["id"].split("#")
        lines.append(f"| [{r['id']}](https://github.com/{repo}/issues/{num}) | {r['area']} | {r['detectable']} | "
                     f"{'yes' if r['held_out'] else 'no'} | " + " | ".join(r[t] for t in labels)
                     + f" | {', '.join(r[labels[-1] + '_codes']) or '-'} |")
    lines.append(END)
    text = page.read_text()
    head, rest = text.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    page.write_text(head + "\n".join(lines) + tail)


if __name__ == "__main__":
    main()
