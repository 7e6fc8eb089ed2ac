"""The rehearsal (issue 34): the user's run, for a few steps, through the installed stack, on a tiny twin of the model,
in a child process; invariant probes turn what it shows into findings GD950-GD979 (docs/rehearsal.md).

Never imported on `check`'s start-up path; imports nothing heavy itself (torch and transformers are imported by the
child only: gemma_doctor/rehearse/child.py, driver.py, and the twin's builder).
"""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Any, Callable, Optional

from gemma_doctor.errors import UsageError
from gemma_doctor.report import ExitCode


def config_of_launch(launch: str) -> Optional[Path]:
    """The training config a launch line runs: `trl sft|dpo --config FILE` (also under accelerate launch); None for
    another line (a script of the user's: gemma_doctor/rehearse/launch.py)."""
    found = trl_launch(launch)
    return found[0] if found else None


def trl_launch(launch: str) -> Optional[tuple[Path, str]]:
    """(the config, the trainer: trl-sft / trl-dpo) of a `trl sft|dpo --config FILE` line; None for another line."""
    try:
        words = shlex.split(launch, comments=True)
    except ValueError as e:
        raise UsageError(f"--launch is not a command line: {e}") from None
    command = next((c for c in ("sft", "dpo") if c in words), None)
    if command and any(w == "trl" or w.endswith("/trl") for w in words):
        for i, w in enumerate(words):
            if w == "--config" and i + 1 < len(words):
                return Path(words[i + 1]), f"trl-{command}"
            if w.startswith("--config="):
                return Path(w.split("=", 1)[1]), f"trl-{command}"
        raise UsageError(f"--launch: `trl {command}` without --config FILE; name the config the run reads")
    return None


def rehearse_cli(target: str, cache_dir: Optional[Path], revision: str, training_config: Optional[Path],
                 launch: Optional[str], steps: int, timeout: float, real_weights: bool, fmt: str,
                 out: Callable[[str], None], hint: Callable[[str], None]) -> int:
    """The `rehearse` command: rehearse, print the view, return the exit code."""
    from gemma_doctor.render import rehearse as view
    from gemma_doctor.rehearse.runner import rehearse

    if training_config is not None and launch is not None:
        raise UsageError("give --training-config or --launch, not both")
    trainer = script = None
    if launch is not None:
        found = trl_launch(launch)
        if found is not None:
            training_config, trainer = found
        else:
            from gemma_doctor.rehearse.launch import argv_of

            script = argv_of(launch, Path.cwd())[0]
    result = rehearse(target, cache_dir=cache_dir, revision=revision, training_config=training_config, steps=steps,
                      timeout=timeout, real_weights=real_weights, trainer=trainer, script=script)
    out(view.render_json([result]) if fmt == "json" else view.render_text(result))
    if result.failed:
        hint(f"the rehearsal found {sum(1 for f in result.findings if f.severity.value == 'error')} error(s) "
             "before the GPU hour; see docs/rehearsal.md")
    return ExitCode.FINDINGS if result.failed else ExitCode.OK


def with_rehearsals(report: Any, training_config: Optional[Path], real_weights: bool) -> Any:
    """`check --rehearse`: each model of ``report`` rehearsed (its folder, the same training config); the rehearsal's
    findings join the model's, its stages go to the model's JSON entry under "rehearsal"."""
    import dataclasses

    from gemma_doctor.rehearse.runner import rehearse

    models = []
    for m in report.models:
        if m.path is None or any(f.code == "GD003" for f in m.findings):
            models.append(m)
            continue
        result = rehearse(m.path, training_config=training_config, real_weights=real_weights)
        view = {k: v for k, v in result.to_json().items() if k != "findings"}
        models.append(dataclasses.replace(m, findings=(*m.findings, *result.findings),
                                          extra={**m.extra, "rehearsal": view}, block=None))
    return dataclasses.replace(report, models=tuple(models))
