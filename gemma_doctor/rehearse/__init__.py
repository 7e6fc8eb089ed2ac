"""The rehearsal (issue 34): the user's run, for a few steps, through the installed stack, on a tiny twin of the model,
in a child process; invariant probes turn what it shows into findings GD950-GD979, GD990-GD994 (2 ranks),
GD995-GD996 (GRPO), GD988-GD989 and GD997 (reward models), GD998-GD999 (a launched script's resume) (docs/rehearsal.md).

Never imported on `check`'s start-up path; imports nothing heavy itself (torch and transformers are imported by the
child only: gemma_doctor/rehearse/child.py, driver.py, and the twin's builder).
"""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Any, Optional

from gemma_doctor.errors import UsageError


def config_of_launch(launch: str) -> Optional[Path]:
    """The training config a launch line runs: `trl sft|dpo|kto|grpo|rloo|reward --config FILE` (also under accelerate launch); None for
    another line (a script of the user's: gemma_doctor/rehearse/launch.py)."""
    found = trl_launch(launch)
    return found[0] if found else None


def trl_launch(launch: str) -> Optional[tuple[Path, str]]:
    """(the config, the trainer: trl-sft / trl-dpo / trl-kto / trl-grpo / trl-rloo / trl-reward) of a `trl
    sft|dpo|kto|grpo|rloo|reward --config FILE` line; None for another line."""
    try:
        words = shlex.split(launch, comments=True)
    except ValueError as e:
        raise UsageError(f"--launch is not a command line: {e}") from None
    command = next((c for c in ("sft", "dpo", "kto", "grpo", "rloo", "reward") if c in words), None)
    if command and any(w == "trl" or w.endswith("/trl") for w in words):
        for i, w in enumerate(words):
            if w == "--config" and i + 1 < len(words):
                return Path(words[i + 1]), f"trl-{command}"
            if w.startswith("--config="):
                return Path(w.split("=", 1)[1]), f"trl-{command}"
        raise UsageError(f"--launch: `trl {command}` without --config FILE; name the config the run reads")
    return None


def with_rehearsals(report: Any, training_config: Optional[Path], real_weights: bool) -> Any:
    """`check --rehearse`: each model of ``report`` rehearsed (its folder, the same training config); the rehearsal's
    findings join the model's, its stages go to the model's JSON entry under "rehearsal"."""
    import dataclasses

    from gemma_doctor.codes import CODES
    from gemma_doctor.rehearse.runner import rehearse

    models = []
    for m in report.models:
        if m.path is None or any(f.code in CODES and CODES[f.code].outside_scope for f in m.findings):
            models.append(m)
            continue
        result = rehearse(m.path, training_config=training_config, real_weights=real_weights)
        view = {k: v for k, v in result.to_json().items() if k != "findings"}
        models.append(dataclasses.replace(m, findings=(*m.findings, *result.findings),
                                          extra={**m.extra, "rehearsal": view}, block=None))
    return dataclasses.replace(report, models=tuple(models))


def _broke(result: Any) -> str:
    """What broke in a failed rehearsal, on one line: each error finding's stage and message."""
    errors = [f for f in result.findings if f.severity.value == "error"]
    return "; ".join(f"{f.code} {f.message}" for f in errors)


def rehearse_prescriptions(items: list[Any], timeout: float,
                           steps: int) -> tuple[list[Any], list[tuple[str, str] | None]]:
    """`recommend --rehearse`: each prescription's YAML run as the training config through its model's twin before it
    is printed. (the items, per item (its name, the verdict: "rehearsed: clean (...)" or what broke), None where
    nothing was prescribed).
    An item whose rehearsal fails is no longer prescribed: its run becomes the nearest one and the failure its way
    out, so it is never shown as passing."""
    import dataclasses
    import tempfile

    from gemma_doctor.rehearse.runner import rehearse

    out, lines = [], []
    for item in items:
        name = item.repo_id or item.target
        decision = item.decision
        if not item.prescribed or decision is None or not decision.training_config:
            out.append(item)
            lines.append(None)
            continue
        if item.planned or not item.path or not Path(item.path, "config.json").is_file():
            # A --family plan has no config.json: there is no model to build a twin of.
            lines.append((name, "not rehearsed: no model folder with a config.json to build a twin from "
                                "(a --family plan); download the model's config and recommend it by path"))
            out.append(item)
            continue
        with tempfile.TemporaryDirectory(prefix="gemma-doctor-prescription-") as tmp:
            config = Path(tmp) / "prescription.yaml"
            config.write_text(decision.training_config, encoding="utf-8")
            result = rehearse(item.path, training_config=config, steps=steps, timeout=timeout)
        # The parts of the run this machine cannot rehearse (a GPU-only kernel...), as the planner named them.
        skipped = [str(f.details["not_here"]) for f in result.findings if (f.details or {}).get("not_here")]
        if not result.failed:
            from gemma_doctor.render.rehearse import NOT_LIBRARIES, where

            stack = ", ".join(f"{k} {v}" for k, v in result.stack.items() if v and k not in NOT_LIBRARIES)
            lines.append((name, f"rehearsed: clean ({len(result.stages)} stages through {stack}{where(result.stack)}, "
                                f"{result.seconds:.0f} s)"
                          + (f"; not rehearsable here: {'; '.join(skipped)}" if skipped else "")))
            out.append(item)
            continue
        broke = _broke(result)
        lines.append((name, f"rehearsed: failed, the prescription is withdrawn: {broke}"))
        way_out = (f"the prescribed run failed its rehearsal ({broke}); fix that first, then recommend again",
                   *decision.way_out)
        failed = dataclasses.replace(decision, recommendation=None, memory=None, nearest=decision.recommendation,
                                     nearest_memory=decision.memory, way_out=way_out,
                                     blocking=(*decision.blocking, *(f for f in result.findings
                                                                     if f.severity.value == "error")))
        out.append(dataclasses.replace(item, decision=failed))
    return out, lines
