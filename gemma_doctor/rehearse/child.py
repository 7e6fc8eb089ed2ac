"""The rehearsal's child process: ``python -m gemma_doctor.rehearse.child build|run PLAN.json``.

Started by the parent (gemma_doctor/rehearse/runner.py) with the user's own interpreter, in a temporary folder, with a
private offline hub cache in the environment (HF_HUB_CACHE, HF_HUB_OFFLINE=1), so the libraries it imports read them
at import. ``build`` lays out the twin (and applies a cure's config change to it); ``run`` builds it and then drives
the stages (gemma_doctor/rehearse/driver.py). What happened goes to the plan's events file, line by line.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any


def _build_twin() -> Any:
    """build_twin of gemma_doctor/rehearse/twin.py, or the stand-in until that module is on this branch."""
    try:
        from gemma_doctor.rehearse.twin import build_twin
    except ModuleNotFoundError as e:
        if e.name != "gemma_doctor.rehearse.twin":
            raise
        from gemma_doctor.rehearse.standin import build_twin
    return build_twin


def _patch(config: dict[str, Any], dotted: str, value: Any) -> None:
    node = config
    *parents, last = dotted.split(".")
    for key in parents:
        node = node.setdefault(key, {})
    node[last] = value


def build(plan: dict[str, Any], events: Any) -> bool:
    """Lay out the twin in the private cache; apply the plan's config patch (a cure being rehearsed)."""
    from gemma_doctor.rehearse.driver import _error

    try:
        twin = _build_twin()(Path(plan["target_dir"]), plan["repo_id"], Path(os.environ["HF_HUB_CACHE"]),
                             revision="main", seed=0)
    except Exception as e:  # noqa: BLE001 - reported as the twin stage's failure
        events.write("twin", "error", **_error(e))
        return False
    patch = plan.get("config_patch") or {}
    if patch:
        path = twin.snapshot / "config.json"
        config = json.loads(path.read_text())
        for dotted, value in patch.items():
            _patch(config, dotted, value)
        path.write_text(json.dumps(config, indent=2))
    events.write("twin", "ok", snapshot=str(twin.snapshot), shrunk={k: str(v) for k, v in twin.shrunk.items()},
                 patched=patch)
    return True


def main(argv: list[str]) -> int:
    """Entry point of the child."""
    from gemma_doctor.rehearse.driver import Events, run

    if len(argv) != 2 or argv[0] not in ("build", "run"):
        sys.stderr.write("usage: python -m gemma_doctor.rehearse.child build|run PLAN.json\n")
        return 2
    plan = json.loads(Path(argv[1]).read_text())
    events = Events(Path(plan["events"]))
    if not build(plan, events) or argv[0] == "build":
        return 0
    return run(plan, events)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
