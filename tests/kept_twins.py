"""A module's kept twin, built in the test process by the rehearsal's own build steps: the stack record, child.build,
then kept.keep under the key run_script looks it up by (gemma_doctor/rehearse/kept.py). The slow rehearsal modules
that launch scripts (tests/test_rehearse_launch.py, tests/test_rehearse_ranks.py) set GEMMA_DOCTOR_TWIN_CACHE to the
folder it returns, so each launched run copies the twin instead of a build child importing the stack again."""

from __future__ import annotations

import json
from pathlib import Path

import pytest


def kept_twin(tmp_path_factory: pytest.TempPathFactory, target: Path, steps: int) -> Path:
    """A twin folder holding the twin of the model folder ``target`` (planned for ``steps`` steps), and nothing else."""
    from gemma_doctor.rehearse import child, kept
    from gemma_doctor.rehearse.driver import Events, stack
    from gemma_doctor.rehearse.runner import plan_for

    folder, root = tmp_path_factory.mktemp("twins"), tmp_path_factory.mktemp("build")
    plan, _, _, _ = plan_for(str(target), None, "main", None, steps, "script")
    # The build child's own steps, here: its Hub cache is the build folder's (HF_HUB_CACHE), never the user's.
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("HF_HUB_CACHE", str(root / "hub"))
        events = Events(root / "events.jsonl")
        stack(events, "cpu")
        assert child.build(plan, events)
    records = [json.loads(line) for line in (root / "events.jsonl").read_text().splitlines()]
    kept.keep(folder, kept.key(plan), root / "hub", records)
    assert len(list(folder.iterdir())) == 1, records
    return folder
