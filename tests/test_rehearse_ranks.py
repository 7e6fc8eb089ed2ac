"""A launched 2-rank script whose rank hangs, killed with its process group at the deadline.

Marked slow. The twin is built once for the module, in this process, and kept (GEMMA_DOCTOR_TWIN_CACHE): every run copies it.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gemma_doctor.rehearse import kept
from tests.test_rehearse import model_folder

pytestmark = pytest.mark.slow
SCRIPTS = Path(__file__).resolve().parent / "scripts" / "ranks"


@pytest.fixture(scope="module")
def target(tmp_path_factory) -> Path:
    return model_folder(tmp_path_factory.mktemp("target"), "gemma3_text")


@pytest.fixture(scope="module", autouse=True)
def twins(tmp_path_factory, target) -> Path:
    """The module's twin folder with the twin of ``target`` kept in it, built here by the rehearsal's own builder."""
    from gemma_doctor.rehearse import child
    from gemma_doctor.rehearse.driver import Events, stack
    from gemma_doctor.rehearse.runner import plan_for

    folder, root = tmp_path_factory.mktemp("twins"), tmp_path_factory.mktemp("build")
    plan, _, _, _ = plan_for(str(target), None, "main", None, 2, "script")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("HF_HUB_CACHE", str(root / "hub"))
        events = Events(root / "events.jsonl")
        stack(events, "cpu")
        assert child.build(plan, events)
    records = [json.loads(line) for line in (root / "events.jsonl").read_text().splitlines()]
    kept.keep(folder, kept.key(plan), root / "hub", records)
    assert len(list(folder.iterdir())) == 1
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(kept.ENV, str(folder))
        yield folder


def test_a_rank_that_hangs_is_killed_with_its_process_group_at_the_deadline(cli, target, tmp_path, monkeypatch):
    monkeypatch.chdir(SCRIPTS)
    pids = tmp_path / "pids"
    pids.mkdir()
    got = cli("rehearse", target, "--launch", f"torchrun --standalone --nproc_per_node 2 hang.py {pids}",
              "--device", "cpu", "--timeout", "15", "--format", "json")
    doc = got.json()["rehearsals"][0]
    assert got.code == 1 and [f["code"] for f in doc["findings"]] == ["GD952"], doc["findings"]
    ranks = sorted(p.name for p in pids.iterdir())
    assert ranks == ["rank0.pid", "rank1.pid"]
    # torchrun starts each rank in a session of its own: before the child's mark, the hung rank outlived the
    # deadline (an orphan of init, still sleeping)
    assert [p.name for p in pids.iterdir() if running(int(p.read_text()))] == []


def running(pid: int) -> bool:
    """Whether ``pid`` is a live process (a zombie left to init to reap has ended)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in ("Z", "X")
