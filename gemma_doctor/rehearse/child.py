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


def _patch(config: dict[str, Any], dotted: str, value: Any) -> None:
    node = config
    *parents, last = dotted.split(".")
    for key in parents:
        node = node.setdefault(key, {})
    node[last] = value


def patch_config(path: Path, patch: dict[str, Any]) -> None:
    """Make a cure's change (dotted keys -> values) to the twin's config.json at ``path``; the build and a kept twin's
    copy (kept.find_patched) both make it this way."""
    config = json.loads(path.read_text())
    for dotted, value in patch.items():
        _patch(config, dotted, value)
    path.write_text(json.dumps(config, indent=2))


def build(plan: dict[str, Any], events: Any) -> bool:
    """Lay out the twin in the private cache; apply the plan's config patch (a cure being rehearsed)."""
    from gemma_doctor.rehearse.driver import _error
    from gemma_doctor.rehearse.twin import build_twin

    try:
        twin = build_twin(Path(plan["target_dir"]), plan["repo_id"], Path(os.environ["HF_HUB_CACHE"]),
                          revision="main", seed=0)
    except Exception as e:  # noqa: BLE001 - reported as the twin stage's failure
        events.write("twin", "error", **_error(e))
        return False
    patch = plan.get("config_patch") or {}
    if patch:
        patch_config(twin.snapshot / "config.json", patch)
    events.write("twin", "ok", snapshot=str(twin.snapshot), shrunk={k: str(v) for k, v in twin.shrunk.items()},
                 patched=patch, notes=list(getattr(twin, "notes", ())))
    return True


def real(plan: dict[str, Any], events: Any) -> int:
    """One measured training step of the real checkpoint (gemma_doctor/rehearse/realweights.py)."""
    from gemma_doctor.rehearse.driver import _error
    from gemma_doctor.rehearse.realweights import measure_step

    s = plan["settings"]
    # The memory plan's run where the parent planned one (gemma_doctor/rehearse/runner.py): the step measured is the
    # run planned, so that its peak can be held against the plan; else the training config's own settings.
    run = plan.get("measure") or {}
    lora = run["method"] != "full" if "method" in run else bool(s.get("lora"))
    try:
        got = measure_step(Path(plan["target_dir"]), seq_len=int(run.get("seq_len") or s.get("max_length") or 512),
                           batch=int(run.get("batch_size") or s.get("batch") or 1),
                           dtype=run.get("load_dtype") or s.get("dtype") or "bfloat16", lora=lora,
                           lora_r=int(run.get("lora_r") or 8), lora_targets=run.get("lora_targets"),
                           gradient_checkpointing=bool(run.get("gradient_checkpointing")),
                           optimizer_step=bool(run), device=plan.get("device") or "cpu")
    except Exception as e:  # noqa: BLE001 - reported as the stage's failure
        events.write("real-weights", "error", **_error(e))
        return 0
    modules = sorted(got.pop("modules", []), key=lambda m: -(m.get("grad_absmax") or 0.0))
    events.write("real-weights", "ok", **got, top_gradients=modules[:5], train_dtype=s.get("precision"))
    return 0


def main(argv: list[str]) -> int:
    """Entry point of the child."""
    from gemma_doctor.rehearse.driver import Events, run, stack

    if len(argv) != 2 or argv[0] not in ("build", "run", "real"):
        sys.stderr.write("usage: python -m gemma_doctor.rehearse.child build|run|real PLAN.json\n")
        return 2
    plan = json.loads(Path(argv[1]).read_text())
    events = Events(Path(plan["events"]))
    stack(events, plan.get("device") or "cpu")  # first, so that a twin the installed transformers cannot build still names that transformers
    if argv[0] == "real":
        return real(plan, events)
    if not build(plan, events) or argv[0] == "build":
        return 0
    return run(plan, events)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
