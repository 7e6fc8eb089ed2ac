"""`gemma-doctor rehearse`: the training run on a tiny twin of the model, in a child process (gemma_doctor/rehearse)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, Optional

import click

from gemma_doctor.cli import common
from gemma_doctor.errors import UsageError
from gemma_doctor.rehearse import trl_launch
from gemma_doctor.render.formats import REHEARSE, Rehearsals, renderer
from gemma_doctor.report import ExitCode


@click.command(context_settings=common.CONTEXT)
@click.argument("target")
@common.cache_options(all_revisions=False)
@click.option("--training-config", type=common.FILE, default=None,
              help="The run's TRL SFT config (SFTConfig keys, as `trl sft --config` reads; a DPO, KTO, ORPO or GRPO "
                   "config is rehearsed as itself), an axolotl or LLaMA-Factory config, or TrainingArguments "
                   "JSON/YAML; LoRA from use_peft / lora_r / lora_target_modules.")
@click.option("--launch", default=None, metavar="COMMAND",
              help="The command that launches the run, quoted: `trl sft|dpo|kto|grpo|rloo --config FILE` and "
                   "`axolotl train FILE` are rehearsed as that config; `llamafactory-cli train FILE` runs "
                   "LLaMA-Factory's own train on the twin; `python train.py ...` (or accelerate launch / torchrun / "
                   "deepspeed of a script) runs the script unedited against the twin, its Trainer probed.")
@click.option("--accelerate-config", type=common.FILE, default=None,
              help="The run's accelerate config (FSDP1/FSDP2; a DeepSpeed run is rehearsed with --launch): the twin is "
                   "trained on 2 CPU (gloo) ranks with its sharding, what a CPU cannot do replaced and said.")
@click.option("--steps", type=click.IntRange(min=1, max=50), default=3, show_default=True,
              help="Optimizer steps to rehearse.")
@click.option("--timeout", type=float, callback=common.seconds, default=300.0, show_default=True, metavar="SECONDS",
              help="Deadline of each rehearsal child; past it the child and its processes are killed.")
@click.option("--real-weights", is_flag=True,
              help="Also one measured training step of the real checkpoint (peak memory, activation and gradient "
                   "maxima against fp16's range).")
@click.option("--device", type=click.Choice(["auto", "cpu", "cuda"]), default="auto", show_default=True,
              help="Where the twin trains and the real step is measured: auto takes the GPU where torch sees one "
                   "(the real kernels, cuda.max_memory_allocated), cpu keeps the child off every GPU.")
@common.format_option(REHEARSE)
def rehearse(target: str, cache_dir: Optional[Path], revision: str, training_config: Optional[Path],
             launch: Optional[str], accelerate_config: Optional[Path], steps: int, timeout: float, real_weights: bool,
             device: str, fmt: str) -> int:
    """Rehearse the training run on a tiny twin of the model, through the libraries installed here, in a child
    process: load, a few train steps, evaluation, generation, save and reload, adapter merge. Writes only to a
    temporary folder."""
    view = renderer(REHEARSE, fmt)
    return rehearse_cli(target, cache_dir, revision, training_config, launch, steps, timeout, real_weights,
                        lambda rehearsal: view.render(Rehearsals([rehearsal]), False), common.out, common.hint, device,
                        accelerate_config)


def rehearse_cli(target: str, cache_dir: Optional[Path], revision: str, training_config: Optional[Path],
                 launch: Optional[str], steps: int, timeout: float, real_weights: bool,
                 render: Callable[[Any], str], out: Callable[[str], None], hint: Callable[[str], None],
                 device: str = "auto", accelerate_config: Optional[Path] = None) -> int:
    """The `rehearse` command's work: the options read into one rehearsal (a launch line's config, script or
    LLaMA-Factory run), rehearsed; prints the view ``render`` draws of it (the --format's renderer, render/formats.py)
    and returns the exit code."""
    import tempfile

    from gemma_doctor.readers.gpu import nvidia_driver_present
    from gemma_doctor.rehearse.runner import rehearse

    if training_config is not None and launch is not None:
        raise UsageError("give --training-config or --launch, not both")
    if launch is not None:
        from gemma_doctor.rehearse.axolotl import axolotl_launch

        # `axolotl train CFG`: that config (axolotl's by its keys), its rows through axolotl's data path.
        axolotl_config = axolotl_launch(launch)
        if axolotl_config is not None:
            training_config, launch = axolotl_config, None
    if accelerate_config is not None and (real_weights or (launch is not None and trl_launch(launch) is None)):
        raise UsageError("--accelerate-config rehearses the training config on 2 CPU ranks: not with --real-weights "
                         "or a launched script (`accelerate launch --config_file` names it there)")
    trainer = script = factory = None
    if launch is not None:
        from gemma_doctor.rehearse import llamafactory

        found = trl_launch(launch)
        factory = llamafactory.config_of(launch)
        if found is not None:
            training_config, trainer = found
        elif factory is not None:
            # LLaMA-Factory's own CLI on the twin; its YAML is also what the rehearsal reads (the repo id, LoRA, the
            # GPU-only parts), as check reads it.
            training_config = factory[0]
        else:
            from gemma_doctor.rehearse.launch import argv_of

            script = argv_of(launch, Path.cwd())[0]
    with tempfile.TemporaryDirectory(prefix="gemma-doctor-launch-") as tmp:
        notes: list[str] = []
        result = None
        if factory is not None:
            from gemma_doctor.rehearse.runner import Rehearsal, plan_for

            _, found_first, _, repo_id = plan_for(target, cache_dir, revision, training_config, steps, "script",
                                                  device)
            if llamafactory.command() is None:
                # Named like any library the run needs and this interpreter lacks (GD950), not silently skipped.
                result = Rehearsal(target, repo_id, "script", findings=[*found_first, llamafactory.not_installed()])
            else:
                script, notes = llamafactory.prepare(factory[0], factory[1], Path(tmp), steps, repo_id, Path.cwd())
        if script is not None and result is None:
            from gemma_doctor.rehearse.ranks import deepspeed_missing

            missing = deepspeed_missing(script)
            if missing is not None:
                # Named like any library the run needs and this interpreter lacks (GD950), not silently skipped.
                from gemma_doctor.rehearse.runner import Rehearsal, plan_for

                _, found_first, _, repo_id = plan_for(target, cache_dir, revision, training_config, steps, "script",
                                                      device)
                result = Rehearsal(target, repo_id, "script", findings=[*found_first, missing])
        if script is not None and result is None and (device == "cpu" or not nvidia_driver_present()):
            from gemma_doctor.rehearse.ranks import cpu_launch

            # An FSDP config launched on CPU ranks: what stops accelerate before the script on a CPU is replaced
            script, more = cpu_launch(script, Path(tmp))
            notes += more
        if result is None:
            result = rehearse(target, cache_dir=cache_dir, revision=revision, training_config=training_config,
                              steps=steps, timeout=timeout, real_weights=real_weights, trainer=trainer, script=script,
                              device=device, accelerate_config=accelerate_config)
    result.notes += notes
    out(render(result))
    if result.failed:
        hint(f"the rehearsal found {sum(1 for f in result.findings if f.severity.value == 'error')} error(s) "
             "before the GPU hour; see docs/rehearsal.md")
    return ExitCode.FINDINGS if result.failed else ExitCode.OK
