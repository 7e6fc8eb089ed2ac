"""`gemma-doctor check`: diagnose models and print the report in the chosen format; writes nothing."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Optional

import click

from gemma_doctor.cli import common
from gemma_doctor.errors import UsageError
from gemma_doctor.render.formats import CHECK, Checked, renderer
from gemma_doctor.report import ExitCode, FailOn


def _import_numpy_without_blas_threads() -> None:
    """Import numpy (for the weights scan) with one OpenBLAS thread. numpy's OpenBLAS starts a thread per core when it
    is loaded, and they spin for a while after: on a small machine they take the cores the scan's own threads need
    (measured: 0.78 s against 0.53 s for check --weights on a 2 GiB shard, 2 cores; benchmarks/weights_scan.py). The
    scan never calls BLAS. The environment is as it was afterwards; a value the user set is used; nothing is done
    where numpy is already loaded."""
    if "numpy" in sys.modules or "OPENBLAS_NUM_THREADS" in os.environ:
        return
    os.environ["OPENBLAS_NUM_THREADS"] = "1"
    try:
        import numpy  # noqa: F401
    except ImportError:  # reported by the scan itself
        pass
    finally:
        del os.environ["OPENBLAS_NUM_THREADS"]


@click.command(context_settings=common.CONTEXT)
@common.targets
@common.cache_options()
@common.format_option(CHECK, "Output format (github: GitHub Actions annotations).")
@click.option("--fail-on", type=common.choice(FailOn), default="error", show_default=True,
              help="Exit 1 when a finding is at or above this severity.")
@click.option("--weights", is_flag=True, help="Also read every tensor: NaN/Inf, fp16 overflow, zero embedding rows.")
@click.option("--jobs", "-j", type=click.IntRange(min=1), default=1, show_default=True, help="Shards scanned in parallel by --weights.")
@click.option("--gpu", default=None, help=common.GPU_HELP)
@click.option("--task", default=None, help="Training task for the precision advice: sft, dpo, grpo, ppo, qlora...")
@click.option("--training-config", type=common.FILE, default=None,
              help="A TrainingArguments/TRL JSON or YAML, axolotl YAML or accelerate config to lint.")
@click.option("--launch", default=None, metavar="COMMAND",
              help="The command line that launches the run (accelerate launch / torchrun / deepspeed / python ...), "
                   "quoted: its processes, machines, sharding, config files and script arguments are read, never run.")
@common.stack_options
@common.remote_option
@common.memory_options
@click.option("--rehearse", "rehearse_run", is_flag=True,
              help="Also rehearse the training config on a twin of each named model (gemma-doctor rehearse): its "
                   "findings join the model's.")
@click.option("--real-weights", is_flag=True, help="With --rehearse: also one measured step of the real checkpoint.")
def check(targets: tuple[str, ...], cache_dir: Optional[Path], revision: str, all_revisions: bool, fmt: str, fail_on: str,
          weights: bool, jobs: int, gpu: Optional[str], task: Optional[str], training_config: Optional[Path],
          launch: Optional[str],
          with_packages: tuple[str, ...], requirements: Optional[str], remote: bool, hub_deadline: Optional[float],
          method: Optional[str], batch_size: Optional[int], seq_len: Optional[int],
          gradient_checkpointing: Optional[bool], gpu_memory: Optional[str], num_gpus: Optional[int],
          rehearse_run: bool = False, real_weights: bool = False) -> int:
    """Diagnose models, cached or on the Hub before download: use_cache, generation config, saved dtypes, GPU,
    library versions and whether the run fits in memory. Writes nothing."""
    from gemma_doctor.pipeline import diagnose
    from gemma_doctor.facts import CheckOptions

    if weights:
        _import_numpy_without_blas_threads()
    view, fail_on_ = renderer(CHECK, fmt), FailOn(fail_on.lower())
    options = CheckOptions(fail_on=fail_on_, weights=weights, gpu=gpu, task=task,
                           training_config=str(training_config) if training_config else None, launch=launch,
                           jobs=jobs, with_packages=tuple(with_packages), requirements=requirements, remote=remote,
                           memory=common.memory_request(method, batch_size, seq_len, gradient_checkpointing,
                                                        gpu_memory, num_gpus))
    finish = view.streaming(common.color())  # a whole-cache scan's workers write their models as the view prints them

    if (rehearse_run or real_weights) and not targets:
        raise UsageError("--rehearse needs the model(s) to rehearse named: a whole-cache rehearsal would train every "
                         "cached model")
    if real_weights and not rehearse_run:
        raise UsageError("--real-weights goes with --rehearse")
    with common.hub_deadline(hub_deadline):
        report = diagnose(list(targets), cache_dir, revision, all_revisions, options, finish,
                          prescription=view.shows_prescription)
    if rehearse_run and report.models:
        from gemma_doctor.rehearse import with_rehearsals

        report = with_rehearsals(report, training_config, real_weights)
    if not report.models:
        # A gate that checked nothing must not pass: a CI step pointed at the wrong or an empty cache would
        # otherwise stay green for ever (pytest's "no tests ran" is a failure for the same reason).
        others = f" ({len(report.skipped)} other repo(s) skipped)" if report.skipped else ""
        raise UsageError(f"nothing to check: no Gemma-family model in {report.cache_dir}{others}; name one "
                         f"(gemma-doctor check google/gemma-3-1b-it reads it from the Hub if it is not cached), "
                         f"pass --cache-dir, or download one with: hf download google/gemma-3-1b-it")
    from gemma_doctor.codes import CODES
    from gemma_doctor.report import Finding

    def outside(f: Finding) -> bool:  # what a finding is, read from its code's entry (codes.py), never its number
        return f.code in CODES and CODES[f.code].outside_scope

    not_gemma = [m for m in report.models if any(outside(f) for f in m.findings)]
    if len(not_gemma) == len(report.models):
        # Named explicitly, a non-Gemma model is reported (GD003) beside the Gemma ones; alone, nothing was checked.
        # Each finding's message is said as the rule wrote it, never cut by its wording.
        said = "; ".join(f"{m.target}: {f.message}" for m in not_gemma for f in m.findings if outside(f))
        raise UsageError(f"nothing to check: gemma-doctor checks Gemma-family models only; {said}")
    common.out(view.render(Checked(report, fail_on_), common.color()))
    for note in report.notes:
        common.hint(note)
    return ExitCode.FINDINGS if report.failed(fail_on_) else ExitCode.OK
