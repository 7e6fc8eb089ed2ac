"""A scan's shared judgements belong to the scan (memo.Memo, made with its environment and options and dropped with
it): the memo module keeps no judgement, and no key holds an environment's or options' id() (issue 32)."""

from __future__ import annotations

from typing import Any

from tests.test_scan_speed import _decisions, fine_tunes  # noqa: F401 (fixtures and helper shared with the memo's tests)


def _judgements(value: Any, depth: int = 0) -> bool:
    """Whether ``value`` holds, a few containers deep, a model's facts or a finding."""
    from gemma_doctor.facts import ModelFacts
    from gemma_doctor.report import Finding

    if isinstance(value, (ModelFacts, Finding)):
        return True
    if depth > 4:
        return False
    if isinstance(value, dict):
        return any(_judgements(k, depth + 1) or _judgements(v, depth + 1) for k, v in value.items())
    if isinstance(value, (tuple, list, set, frozenset)):
        return any(_judgements(v, depth + 1) for v in value)
    return False


def test_a_scan_leaves_no_judgement_in_the_memo_module(cli, fine_tunes, monkeypatch):  # noqa: F811
    from gemma_doctor import memo
    from gemma_doctor.report import MODEL_ID

    judged = _decisions(monkeypatch)
    for command in (("check", "--format", "json", "--fail-on", "never"), ("list", "--format", "json")):
        judged.clear()
        got = cli(*command, "--cache-dir", fine_tunes)
        assert got.code == 0, got.err
        assert MODEL_ID in judged  # the memo did share a judgement in this scan
        held = [name for name, v in vars(memo).items() if isinstance(v, (dict, set, list)) and _judgements(v)]
        assert not held, f"judgements kept by the memo module after the scan: {held}"


def test_each_scan_starts_with_its_own_memo(fine_tunes, monkeypatch):  # noqa: F811
    """Two scans in one process judge the same models the same way: the second is served nothing by the first."""
    from gemma_doctor import pipeline
    from gemma_doctor.facts import CheckOptions
    from gemma_doctor.report import FailOn

    judged = _decisions(monkeypatch)
    options = CheckOptions(fail_on=FailOn.NEVER)
    first = pipeline.diagnose([], fine_tunes, options=options)
    seen = list(judged)
    judged.clear()
    second = pipeline.diagnose([], fine_tunes, options=options)
    assert judged == seen and [m.findings for m in first.models] == [m.findings for m in second.models]
