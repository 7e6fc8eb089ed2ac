"""`gemma-doctor recommend`: the prescribed run (precision, method, batch, memory) and its ready-to-paste settings."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import click

from gemma_doctor.cli import common
from gemma_doctor.errors import UsageError
from gemma_doctor.render.formats import RECOMMEND, Prescriptions, renderer
from gemma_doctor.report import ExitCode


@click.command(context_settings=common.CONTEXT)
@common.targets
@click.option("--family", default=None, help="Plan for a family without a downloaded model (CI before download): "
                                             "gemma, gemma2, gemma3 or gemma4, whose published configs gemma-doctor "
                                             "holds; another member of docs/families.md is refused, naming the "
                                             "checkpoint to download.")
@click.option("--gpu", default=None, help=common.GPU_HELP)
@click.option("--task", default=None, help="sft (default), full, lora, qlora, dpo, orpo, kto, grpo, ppo.")
@click.option("--quantization", default=None, help="4bit, 8bit or none (default: from the checkpoint's quantization_config).")
@click.option("--qlora", is_flag=True, help="Shorthand for --quantization 4bit.")
@common.cache_options(all_revisions=False)
@common.format_option(RECOMMEND, "text (reasons + Python), python, yaml (the training config check --training-config "
                                 "reads) or json.")
@common.stack_options
@common.remote_option
@common.memory_options
@click.option("--size", default=None, help="A published size for --family (gemma: 2b, 7b; gemma2: 2b, 9b, 27b; gemma3: "
                                           "1b, 4b, 12b, 27b; gemma4: e2b, e4b, 31b, 26b-a4b).")
@click.option("--training-config", type=common.FILE, default=None,
              help="A training config whose batch, sequence length, method and sharding the memory plan uses.")
@click.option("--trainer", default=None,
              help="The trainer the run is written for, searched and judged as: axolotl (its YAML), trl (a `trl sft "
                   "--config` YAML: TRL's SFTTrainer, chunked log-probs; `trl dpo --config` with --task dpo), transformers (a TrainingArguments YAML for "
                   "a plain Trainer script) or llama-factory (LLaMA-Factory's YAML: `llamafactory-cli train`). "
                   "Default: the --training-config's trainer, else axolotl.")
@click.option("--rehearse", "rehearse_run", is_flag=True,
              help="Rehearse each prescription before printing it (its YAML as the training config, on a twin of the "
                   "model, through the installed stack: gemma-doctor rehearse); one that breaks is withdrawn.")
@click.option("--rehearse-timeout", type=click.FloatRange(min=1), default=300.0, show_default=True,
              help="With --rehearse: seconds before a rehearsal is stopped.")
def recommend(targets: tuple[str, ...], family: Optional[str], gpu: Optional[str], task: Optional[str],
              quantization: Optional[str], qlora: bool, cache_dir: Optional[Path], revision: str, fmt: str,
              with_packages: tuple[str, ...], requirements: Optional[str], remote: bool,
              hub_deadline: Optional[float], method: Optional[str], batch_size: Optional[int],
              seq_len: Optional[int], gradient_checkpointing: Optional[bool], gpu_memory: Optional[str],
              num_gpus: Optional[int], size: Optional[str], training_config: Optional[Path],
              trainer: Optional[str] = None, rehearse_run: bool = False, rehearse_timeout: float = 300.0) -> int:
    """Recommend a training precision (bf16, fp16 or fp32) with its reasons and ready-to-paste settings."""
    from gemma_doctor.pipeline import recommend_items

    if qlora:
        if quantization not in (None, "4bit"):
            raise UsageError("--qlora means --quantization 4bit; drop one of them")
        quantization = "4bit"
    view = renderer(RECOMMEND, fmt)
    request = common.memory_request(method, batch_size, seq_len, gradient_checkpointing, gpu_memory, num_gpus, size)
    with common.hub_deadline(hub_deadline):
        gpu_facts, items, skipped = recommend_items(list(targets), cache_dir, revision, family, gpu, task,
                                                    quantization, tuple(with_packages), requirements, remote, request,
                                                    str(training_config) if training_config else None, trainer)
    for line in skipped:
        common.hint(line)
    rehearsed: Optional[list[Optional[tuple[str, str]]]] = None
    if rehearse_run:
        from gemma_doctor.rehearse import rehearse_prescriptions
        from gemma_doctor.rehearse.runner import DEFAULT_STEPS

        items, rehearsed = rehearse_prescriptions(list(items), rehearse_timeout, DEFAULT_STEPS)
    task_name = next((i.recommendation.inputs["task"] for i in items if i.recommendation is not None), task or "sft")
    common.out(view.render(Prescriptions(list(items), gpu_facts, task_name, rehearsed), common.color()))
    if gpu_facts.source == "probe" and gpu_facts.backend == "none":
        common.hint(f"{gpu_facts.reason}; planning for CPU training")
    missing = [i for i in items if not i.prescribed]
    if missing:
        common.hint(f"no run passes check for {len(missing)} of {len(items)} model(s): see the way out")
        return ExitCode.FINDINGS
    return ExitCode.OK
