"""`gemma-doctor rehearse`: the training run on a tiny twin of the model, in a child process (gemma_doctor/rehearse)."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import click

from gemma_doctor.cli import common
from gemma_doctor.render.formats import REHEARSE, Rehearsals, renderer


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
                   "LLaMA-Factory's own train on the twin; `python train.py ...` (or accelerate launch / torchrun of "
                   "a script) runs the script unedited against the twin, its Trainer probed.")
@click.option("--accelerate-config", type=common.FILE, default=None,
              help="The run's accelerate config (FSDP1/FSDP2; DeepSpeed named when not installed): the twin is "
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
    from gemma_doctor.rehearse import rehearse_cli

    view = renderer(REHEARSE, fmt)
    return rehearse_cli(target, cache_dir, revision, training_config, launch, steps, timeout, real_weights,
                        lambda rehearsal: view.render(Rehearsals([rehearsal]), False), common.out, common.hint, device,
                        accelerate_config)
