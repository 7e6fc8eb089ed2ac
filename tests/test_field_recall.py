"""benchmarks/field_recall.py's rehearsal column: what `--only` writes into the docs page, and which stack a report
is rehearsed in. Nothing here rehearses or builds a venv (the reports used are decided "not here" before any run)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))

import field_recall  # noqa: E402  (benchmarks/ is not a package)

REPORTS = {r["id"]: r for r in json.loads(field_recall.CORPUS.read_text())["reports"]}


def test_only_rewrites_its_own_rows_and_keeps_every_other_measured_row(tmp_path):
    # A report decided "not here" from its inputs runs nothing: --only on it rewrites that one row of the block.
    page = tmp_path / "rehearsal.md"
    page.write_text((ROOT / "docs" / "rehearsal.md").read_text())
    before = field_recall.measured_rows(page)
    ran = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "field_recall.py"), "--rehearse", "--only",
                          "hiyouga/LlamaFactory#7755", "--rehearsal-docs", str(page)],
                         capture_output=True, text=True, timeout=300)
    assert ran.returncode == 0, ran.stderr[-2000:]
    after = field_recall.measured_rows(page)
    assert set(after) == set(before) == set(REPORTS)
    assert after["hiyouga/LlamaFactory#7755"]["rehearsal_why"] == REPORTS["hiyouga/LlamaFactory#7755"]["rehearsal"]["not_here"]
    assert {k: v for k, v in after.items() if k != "hiyouga/LlamaFactory#7755"} == \
        {k: v for k, v in before.items() if k != "hiyouga/LlamaFactory#7755"}
    assert f"| **all** | {len(REPORTS)} |" in page.read_text()


def test_a_nearest_release_stands_in_only_for_the_name_its_stack_says():
    found = field_recall.stacks()
    lf = next(f for f in found if f[0] == "LLAMAFACTORY_0_9_3")
    # The report's llamafactory 0.9.3.dev0 is not on PyPI: the stack's 0.9.3 stands in for it, said in its row ...
    assert field_recall.stack_provides(lf, ["transformers==4.50.0", "llamafactory==0.9.3.dev0"])
    # ... but the stack's other pins are still compared exactly.
    assert not field_recall.stack_provides(lf, ["transformers==4.50.3", "llamafactory==0.9.3.dev0"])
    assert field_recall.not_here(REPORTS["hiyouga/LlamaFactory#7427"], found) is None
    assert not field_recall.stack_provides(next(f for f in found if f[0] == "LLAMAFACTORY_STACK"),
                                           ["llamafactory==0.9.3.dev0"])


def test_each_field_stack_is_locked_and_its_lock_satisfies_its_pins():
    # A locked venv is installed without resolving: its lock must hold every pin and the project's light dependencies.
    from tests import venvs

    for label, packages, *_ in field_recall.FIELD_STACKS:
        lock = venvs.lock_file(packages)
        assert lock.exists(), label
        pins = [line for line in lock.read_text().splitlines() if line and not line.startswith("#")]
        venvs._lock_covers(pins, (*packages, *venvs.LIGHT), lock)
