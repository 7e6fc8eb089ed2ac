"""The command line: parse options, call one function per command, map errors to exit codes.

Built on click directly: typer >= 0.29 (which transformers 5.x pulls in unpinned, so gemma-doctor cannot
pin an older one) builds a pydantic TypeAdapter for every option on every start, about 0.2 s of a 0.5 s
`check` (docs/benchmarks.md). Heavy modules (rich, numpy, torch, transformers) are imported inside the
commands that need them.
"""

from __future__ import annotations

import contextlib
import os
import sys
from pathlib import Path
from typing import Any, Callable, Iterator, Optional

import click

from gemma_doctor import __version__
from gemma_doctor.errors import DoctorError, HubAccessError, HubUnreachable, LockTimeout, UsageError, WriteError
from gemma_doctor.render.formats import OUTCOMES, REPORT, ROWS, formats, renderer
from gemma_doctor.report import ExitCode, FailOn

_CONTEXT = {"help_option_names": ["-h", "--help"], "max_content_width": 100}
# Choices as plain strings so that start-up imports no renderer; converted to enums inside the commands.
_RECOMMEND_FORMATS = ("text", "python", "yaml", "json")
# One instance per kind of path option, shared by the commands: click names each new one through gettext (a locale
# file search, ~75 us), eleven of them at every start before.
_FOLDER = click.Path(file_okay=False, path_type=Path)
_FILE = click.Path(dir_okay=False, path_type=Path)
_FILE_NAME = click.Path(dir_okay=False)


def _choice(values: Any) -> click.Choice:
    return click.Choice([getattr(v, "value", v) for v in values], case_sensitive=False)


def _targets(f: Callable) -> Callable:
    return click.argument("targets", nargs=-1, metavar="[TARGET]...")(f)


def _clean_path(_ctx: Any, _param: Any, value: Optional[Path]) -> Optional[Path]:
    """--cache-dir without `..` parts, so that every path printed reads cleanly (examples/../.cache -> .cache)."""
    if value is None:
        return value
    from gemma_doctor.locate import clean_path

    return clean_path(value)


def _cache_options(all_revisions: bool = True) -> Callable[[Callable], Callable]:
    """--cache-dir, --revision (and --all-revisions): shared by every command that reads the cache."""

    def decorate(f: Callable) -> Callable:
        if all_revisions:
            f = click.option("--all-revisions", is_flag=True, help="Every cached snapshot of each repo.")(f)
        f = click.option("--revision", default="main", show_default=True, help="Branch, tag or commit of cached repos.")(f)
        f = click.option("--cache-dir", type=_FOLDER, default=None,
                         callback=_clean_path,
                         help="Hugging Face hub cache (default: HF_HUB_CACHE, HF_HOME/hub, ~/.cache/huggingface/hub).")(f)
        return f

    return decorate


def _format_option(f: Callable) -> Callable:
    return click.option("--format", "-f", "fmt", type=_choice(formats(REPORT)), default="text", show_default=True,
                        help="Output format (github: GitHub Actions annotations).")(f)


def _outcome_format_option(f: Callable) -> Callable:
    """fix/restore report files written, not findings: no annotations to offer, so no github format."""
    return click.option("--format", "-f", "fmt", type=_choice(formats(OUTCOMES)), default="text", show_default=True,
                        help="Output format.")(f)


def _lock_option(f: Callable) -> Callable:
    return click.option("--lock-timeout", type=click.FloatRange(min=0.0), default=60.0, show_default=True,
                        help="Seconds to wait for another gemma-doctor writing the same repo.")(f)


_GPU_HELP = "Plan for this GPU instead of probing: a compute capability (8.0, sm_75), a name (T4, A100, H100) or none."


def _memory_options(f: Callable) -> Callable:
    """The memory plan's options (docs/memory.md): they override the training config."""
    # The bounds of a training config's counts (readers/training_config.RUN_BOUNDS): past them no run is real.
    f = click.option("--num-gpus", type=click.IntRange(min=1, max=1 << 20), default=None,
                     help="GPUs the run shards over (default: the training config's num_processes, else the GPUs visible).")(f)
    f = click.option("--gpu-memory", default=None, metavar="GIB",
                     help="Memory of one GPU in GiB (e.g. 80), where --gpu or the probe does not say it.")(f)
    f = click.option("--gradient-checkpointing/--no-gradient-checkpointing", "gradient_checkpointing", default=None,
                     help="Plan with or without gradient checkpointing (default: the training config's, else chosen).")(f)
    f = click.option("--seq-len", type=click.IntRange(min=1, max=1 << 27), default=None,
                     help="Tokens per sequence (default: the training config's max length, else 1024).")(f)
    f = click.option("--batch-size", type=click.IntRange(min=1, max=1 << 20), default=None,
                     help="Per-device batch size (default: the training config's, else the largest that fits).")(f)
    f = click.option("--method", type=click.Choice(["full", "lora", "qlora"], case_sensitive=False), default=None,
                     help="Fine-tuning method to plan memory for (default: the training config's, else the cheapest that fits).")(f)
    return f


def _memory_request(method: Optional[str], batch_size: Optional[int], seq_len: Optional[int],
                    gradient_checkpointing: Optional[bool], gpu_memory: Optional[str], num_gpus: Optional[int],
                    size: Optional[str] = None):  # noqa: ANN202 - a runplan.MemoryRequest
    from gemma_doctor.gpus import parse_memory
    from gemma_doctor.facts import MemoryRequest

    return MemoryRequest(method=method.lower() if method else None, batch_size=batch_size, seq_len=seq_len,
                         gradient_checkpointing=gradient_checkpointing,
                         gpu_memory=parse_memory(gpu_memory) if gpu_memory is not None else None, num_gpus=num_gpus,
                         size=size)


def _stack_options(f: Callable) -> Callable:
    """--with / --requirements: the libraries of the training machine, when it is not this one."""
    f = click.option("--requirements", "requirements", type=_FILE_NAME, default=None,
                     envvar="GEMMA_DOCTOR_REQUIREMENTS",
                     help="The training machine's packages: a requirements.txt, `pip freeze` output, or a uv/poetry "
                          "lock file (default: what is installed here).")(f)
    f = click.option("--with", "with_packages", multiple=True, metavar="PKG==VERSION", envvar="GEMMA_DOCTOR_WITH",
                     help="A library version of the training machine, e.g. --with transformers==4.50.3 (repeatable; "
                          "overrides the installed or --requirements version).")(f)
    return f


# gemma_doctor/hub.py reads it (DEADLINE_ENV there; hub is not imported here: no huggingface_hub at start-up).
HUB_DEADLINE_ENV = "GEMMA_DOCTOR_HUB_DEADLINE"


def _seconds(_ctx: Any, _param: Any, value: Optional[float]) -> Optional[float]:
    if value is not None and not (0 < value <= 86400):  # FloatRange lets nan through
        raise click.BadParameter(f"{value} is not a number of seconds above 0 and at most 86400")
    return value


def _remote_option(f: Callable) -> Callable:
    f = click.option("--hub-deadline", "hub_deadline", type=float, callback=_seconds,
                     default=None, metavar="SECONDS", envvar=HUB_DEADLINE_ENV,
                     help="Seconds the whole remote read of a repo may take (default: 60); past it, one line and "
                          "exit code 5.")(f)
    return click.option("--remote", is_flag=True,
                        help="Read named repos from the Hub even when cached (config files and safetensors headers "
                             "only, nothing downloaded); a repo that is not cached is read from the Hub anyway.")(f)



@contextlib.contextmanager
def _hub_deadline(seconds: Optional[float]) -> Iterator[None]:
    """--hub-deadline for the Hub reads of this command (through the environment hub.py reads), then as it was."""
    if seconds is None:
        yield
        return
    before = os.environ.get(HUB_DEADLINE_ENV)
    os.environ[HUB_DEADLINE_ENV] = repr(float(seconds))
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(HUB_DEADLINE_ENV, None)
        else:
            os.environ[HUB_DEADLINE_ENV] = before


def _color(stream: object = None) -> bool:
    """Colour only on a terminal, and never with NO_COLOR set (no-color.org)."""
    if os.environ.get("NO_COLOR"):
        return False
    # Looked up at call time: sys.stdout may have been replaced since import (tests, redirection).
    stream = sys.stdout if stream is None else stream
    isatty = getattr(stream, "isatty", None)
    return bool(isatty and isatty())


def _out(text: str) -> None:
    sys.stdout.write(text)
    sys.stdout.flush()


def _hint(text: str) -> None:
    from gemma_doctor.render.style import printable  # small and pure: no rich

    # One line, whatever names it quotes: a control character in a folder name is shown, never acted on.
    sys.stderr.write(f"gemma-doctor: {printable(text)}\n")


@click.group(context_settings=_CONTEXT, no_args_is_help=True)
@click.version_option(__version__, "--version", prog_name="gemma-doctor", message="%(prog)s %(version)s",
                      help="Print the version and exit.")
def app() -> None:
    """Find Gemma-family checkpoints in the Hugging Face cache or on the Hub, diagnose them before mixed-precision
    training, and fix them safely and reversibly."""


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


@app.command(context_settings=_CONTEXT)
@_targets
@_cache_options()
@_format_option
@click.option("--fail-on", type=_choice(FailOn), default="error", show_default=True,
              help="Exit 1 when a finding is at or above this severity.")
@click.option("--weights", is_flag=True, help="Also read every tensor: NaN/Inf, fp16 overflow, zero embedding rows.")
@click.option("--jobs", "-j", type=click.IntRange(min=1), default=1, show_default=True, help="Shards scanned in parallel by --weights.")
@click.option("--gpu", default=None, help=_GPU_HELP)
@click.option("--task", default=None, help="Training task for the precision advice: sft, dpo, grpo, ppo, qlora...")
@click.option("--training-config", type=_FILE, default=None,
              help="A TrainingArguments/TRL JSON or YAML, axolotl YAML or accelerate config to lint.")
@click.option("--launch", default=None, metavar="COMMAND",
              help="The command line that launches the run (accelerate launch / torchrun / deepspeed / python ...), "
                   "quoted: its processes, machines, sharding, config files and script arguments are read, never run.")
@_stack_options
@_remote_option
@_memory_options
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
    view, fail_on_ = renderer(fmt, REPORT), FailOn(fail_on.lower())
    options = CheckOptions(fail_on=fail_on_, weights=weights, gpu=gpu, task=task,
                           training_config=str(training_config) if training_config else None, launch=launch,
                           jobs=jobs, with_packages=tuple(with_packages), requirements=requirements, remote=remote,
                           memory=_memory_request(method, batch_size, seq_len, gradient_checkpointing, gpu_memory, num_gpus))
    finish = view.streaming(_color())  # a whole-cache scan's workers write their models as the view prints them

    if (rehearse_run or real_weights) and not targets:
        raise UsageError("--rehearse needs the model(s) to rehearse named: a whole-cache rehearsal would train every "
                         "cached model")
    if real_weights and not rehearse_run:
        raise UsageError("--real-weights goes with --rehearse")
    with _hub_deadline(hub_deadline):
        report = diagnose(list(targets), cache_dir, revision, all_revisions, options, finish)
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
        said = "; ".join(f"{m.target}: {f.message.removesuffix('; left alone')}"
                         for m in not_gemma for f in m.findings if outside(f))
        raise UsageError(f"nothing to check: {said}; gemma-doctor checks Gemma-family models only")
    _out(view.report(report, fail_on_, _color()))
    for note in report.notes:
        _hint(note)
    return ExitCode.FINDINGS if report.failed(fail_on_) else ExitCode.OK


def _models(targets: list[str], cache_dir: Optional[Path], revision: str, all_revisions: bool):  # noqa: ANN202
    from gemma_doctor import locate
    from gemma_doctor.pipeline import select

    cache = cache_dir if cache_dir is not None else locate.default_cache_dir()
    for target in targets:
        note = locate.shadow_note(target, cache, hub=False)  # fix/restore would work on the folder, not the cache
        if note:
            _hint(note)
    snapshots = locate.resolve(targets, cache_dir, revision, all_revisions)
    models, _skipped = select(snapshots, explicit=bool(targets))
    return models


def _print_outcomes(command: str, outcomes: list, fmt: str, dry_run: bool, ok: bool) -> None:
    _out(renderer(fmt, OUTCOMES).outcomes(command, outcomes, dry_run, ok, _color()))


@app.command(context_settings=_CONTEXT)
@_targets
@click.option("--inplace", is_flag=True, help="Apply the changes (default: print the diff only).")
@_cache_options()
@_outcome_format_option
@_lock_option
@_stack_options
def fix(targets: tuple[str, ...], inplace: bool, cache_dir: Optional[Path], revision: str, all_revisions: bool, fmt: str,
        lock_timeout: float, with_packages: tuple[str, ...], requirements: Optional[str]) -> int:
    """Set use_cache=false where the text model reads it and the transformers that will run crashes without it, and
    tie_word_embeddings=false where a merged model saves a trained lm_head that a tied config discards (GD750);
    prints the diff, writes only with --inplace."""
    from gemma_doctor import stack as stack_mod
    from gemma_doctor.fixes import Outcome, Status, apply_plan, needs_tidy, plan_model, weigh_head
    from gemma_doctor.locate import command_args
    from gemma_doctor.readers.versions import installed

    stack = stack_mod.resolve(installed(), with_packages, requirements)
    outcomes: list[Outcome] = []
    failed = refused = False
    for facts in _models(list(targets), cache_dir, revision, all_revisions):
        facts = weigh_head(facts)  # GD750's cure needs the head compared with the embedding first
        plan = plan_model(facts, stack)
        outcome = Outcome(facts, plan.status, list(plan.changes), plan.messages)
        refused |= bool(plan.refused)
        # needs_tidy: temp files a killed run left behind are removed (under the lock) even with nothing to change.
        if inplace and (plan.changes or needs_tidy(facts.snapshot)):
            try:
                # Re-planned under the lock when a concurrent run got there first: report what was written.
                written = apply_plan(plan, lock_timeout)
                if plan.changes:
                    outcome.changes = written
                    outcome.status = Status.CHANGED if written else Status.UP_TO_DATE
                if written:
                    outcome.messages.append(f"undo with: gemma-doctor restore {command_args(facts.snapshot)}")
            except WriteError as e:
                outcome.status = Status.FAILED
                if isinstance(e, LockTimeout):
                    outcome.changes = []  # nothing was written: a diff here would read as if it had been
                outcome.messages.append(str(e))
                failed = True
        outcomes.append(outcome)
    _print_outcomes("fix", outcomes, fmt, not inplace, not (failed or refused))
    pending = sum(len(o.changes) for o in outcomes if o.status is Status.WOULD_CHANGE)
    if not inplace and pending:
        _hint(f"{pending} file(s) would change; run again with --inplace to apply")
    elif not any(o.changes for o in outcomes) and not refused:
        _hint("nothing to change")
    return ExitCode.WRITE_FAILED if failed else ExitCode.FINDINGS if refused else ExitCode.OK


@app.command(context_settings=_CONTEXT)
@_targets
@click.option("--dry-run", is_flag=True, help="Say what would be restored, change nothing.")
@click.option("--force", is_flag=True, help="Also restore files edited since the fix; your edited version is kept in "
                                            ".gemma-doctor/kept/ (the message says where).")
@_cache_options()
@_outcome_format_option
@_lock_option
def restore(targets: tuple[str, ...], dry_run: bool, force: bool, cache_dir: Optional[Path], revision: str,
            all_revisions: bool, fmt: str, lock_timeout: float) -> int:
    """Undo `fix --inplace`: snapshot files become the original links (or bytes), byte-identical."""
    from gemma_doctor.fixes import Outcome, restore_model

    outcomes: list[Outcome] = []
    failed = conflicted = False
    for facts in _models(list(targets), cache_dir, revision, all_revisions):
        outcome, conflict, fail = restore_model(facts, dry_run, force, lock_timeout)
        conflicted |= conflict
        failed |= fail
        outcomes.append(outcome)
    _print_outcomes("restore", outcomes, fmt, dry_run, not (failed or conflicted))
    return ExitCode.WRITE_FAILED if failed else ExitCode.FINDINGS if conflicted else ExitCode.OK


@app.command(context_settings=_CONTEXT)
@_targets
@click.option("--family", default=None, help="Plan for a family without a downloaded model (CI before download): "
                                             "gemma, gemma2, gemma3, gemma3n, paligemma, paligemma2.")
@click.option("--gpu", default=None, help=_GPU_HELP)
@click.option("--task", default=None, help="sft (default), full, lora, qlora, dpo, orpo, kto, grpo, ppo.")
@click.option("--quantization", default=None, help="4bit, 8bit or none (default: from the checkpoint's quantization_config).")
@click.option("--qlora", is_flag=True, help="Shorthand for --quantization 4bit.")
@_cache_options(all_revisions=False)
@click.option("--format", "-f", "fmt", type=_choice(_RECOMMEND_FORMATS), default="text", show_default=True,
              help="text (reasons + Python), python, yaml (the training config check --training-config reads) or json.")
@_stack_options
@_remote_option
@_memory_options
@click.option("--size", default=None, help="A published size for --family (gemma3: 1b, 4b, 12b, 27b; gemma2: 2b, 9b, 27b).")
@click.option("--training-config", type=_FILE, default=None,
              help="A training config whose batch, sequence length, method and sharding the memory plan uses.")
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
              rehearse_run: bool = False, rehearse_timeout: float = 300.0) -> int:
    """Recommend a training precision (bf16, fp16 or fp32) with its reasons and ready-to-paste settings."""
    from gemma_doctor.pipeline import recommend_items
    from gemma_doctor.render import recommend as view
    from gemma_doctor.render.recommend import RecommendFormat

    if qlora:
        if quantization not in (None, "4bit"):
            raise UsageError("--qlora means --quantization 4bit; drop one of them")
        quantization = "4bit"
    fmt_ = RecommendFormat(fmt.lower())
    request = _memory_request(method, batch_size, seq_len, gradient_checkpointing, gpu_memory, num_gpus, size)
    with _hub_deadline(hub_deadline):
        gpu_facts, items, skipped = recommend_items(list(targets), cache_dir, revision, family, gpu, task,
                                                    quantization, tuple(with_packages), requirements, remote, request,
                                                    str(training_config) if training_config else None)
    for line in skipped:
        _hint(line)
    rehearsed: list[Optional[tuple[str, str]]] = []
    if rehearse_run:
        from gemma_doctor.rehearse import rehearsal_json, rehearse_prescriptions
        from gemma_doctor.rehearse.runner import DEFAULT_STEPS

        items, rehearsed = rehearse_prescriptions(list(items), rehearse_timeout, DEFAULT_STEPS)
    task_name = next((i.recommendation.inputs["task"] for i in items if i.recommendation is not None), task or "sft")
    # Comment lines in the python and yaml views keep them pasteable.
    said = "".join(f"{'' if fmt_ is RecommendFormat.TEXT else '# '}{name}: {verdict}\n"
                   for name, verdict in filter(None, rehearsed))

    def shown(text: str) -> str:
        return text if not said else text.rstrip("\n") + "\n" + said

    if fmt_ is RecommendFormat.JSON:
        text = view.render_json(items, gpu_facts, task_name)
        _out(rehearsal_json(text, rehearsed) if rehearse_run else text)
    elif fmt_ is RecommendFormat.PYTHON:
        _out(shown(view.render_python(items, gpu_facts)))
    elif fmt_ is RecommendFormat.YAML:
        _out(shown(view.render_yaml(items, gpu_facts)))
    else:
        _out(shown(view.render_text(items, gpu_facts, _color())))
    if gpu_facts.source == "probe" and gpu_facts.backend == "none":
        _hint(f"{gpu_facts.reason}; planning for CPU training")
    missing = [i for i in items if not i.prescribed]
    if missing:
        _hint(f"no run passes check for {len(missing)} of {len(items)} model(s): see the way out")
        return ExitCode.FINDINGS
    return ExitCode.OK


@app.command("list", context_settings=_CONTEXT)
@_cache_options()
@click.option("--filter", "filters", multiple=True, metavar="EXPR",
              help="Keep rows matching EXPR, like hf cache ls: size>1GB, family=gemma3, status=needs-fix, "
                   "dtype=bfloat16, name=google/*. Repeatable (all must hold).")
@click.option("--sort", default=None, help="name, size, family or status, optionally :asc or :desc (size defaults to desc).")
@click.option("--limit", type=click.IntRange(min=0), default=None, help="Show only the first N rows after sorting.")
@click.option("--format", "-f", "fmt", type=_choice(formats(ROWS)), default="text", show_default=True, help="Output format.")
@click.option("--quiet", "-q", is_flag=True, help="One repo id per line (same as --format quiet).")
@_stack_options
def list_models(cache_dir: Optional[Path], revision: str, all_revisions: bool, filters: tuple[str, ...], sort: Optional[str],
                limit: Optional[int], fmt: str, quiet: bool, with_packages: tuple[str, ...], requirements: Optional[str]) -> int:
    """List cached Gemma-family models: family, revision, size, declared dtype, status (ok, needs-fix, fixed, broken, error)."""
    from gemma_doctor import listing
    from gemma_doctor.facts import CheckOptions
    from gemma_doctor.locate import default_cache_dir

    view = renderer("quiet" if quiet else fmt, ROWS)  # --quiet is --format quiet

    cache = cache_dir if cache_dir is not None else default_cache_dir()
    rows, skipped = listing.collect(cache, revision, all_revisions,
                                    CheckOptions(with_packages=tuple(with_packages), requirements=requirements))
    shown = listing.select_rows(rows, list(filters), sort, limit)
    _out(view.rows(shown, skipped, _color()))
    if not rows:
        _hint(f"no Gemma-family model in {cache}; download one with: hf download google/gemma-3-1b-it")
    pending = [r for r in shown if r.status is listing.RowStatus.NEEDS_FIX]
    if pending and view.for_people:
        _hint(f"{len(pending)} model(s) need a fix; see why with: {pending[0].check_command}, "
              f"then: {pending[0].next_command}")
    broken = [r for r in shown if r.status is listing.RowStatus.BROKEN]
    if broken and view.for_people:
        _hint(f"{len(broken)} model(s) have missing or corrupt files that no fix repairs; download them again: "
              f"{broken[0].next_command}")
    return ExitCode.OK


@app.command(context_settings=_CONTEXT)
@click.argument("target")
@_cache_options(all_revisions=False)
@click.option("--training-config", type=_FILE, default=None,
              help="The run's TRL SFT config (SFTConfig keys, as `trl sft --config` reads; a DPO, KTO, ORPO or GRPO "
                   "config is rehearsed as itself), an axolotl or LLaMA-Factory config, or TrainingArguments "
                   "JSON/YAML; LoRA from use_peft / lora_r / lora_target_modules.")
@click.option("--launch", default=None, metavar="COMMAND",
              help="The command that launches the run, quoted: `trl sft|dpo|kto|grpo|rloo --config FILE` and "
                   "`axolotl train FILE` are rehearsed as that config; `llamafactory-cli train FILE` runs "
                   "LLaMA-Factory's own train on the twin; `python train.py ...` (or accelerate launch / torchrun of "
                   "a script) runs the script unedited against the twin, its Trainer probed.")
@click.option("--accelerate-config", type=_FILE, default=None,
              help="The run's accelerate config (FSDP1/FSDP2; DeepSpeed named when not installed): the twin is "
                   "trained on 2 CPU (gloo) ranks with its sharding, what a CPU cannot do replaced and said.")
@click.option("--steps", type=click.IntRange(min=1, max=50), default=3, show_default=True,
              help="Optimizer steps to rehearse.")
@click.option("--timeout", type=float, callback=_seconds, default=300.0, show_default=True, metavar="SECONDS",
              help="Deadline of each rehearsal child; past it the child and its processes are killed.")
@click.option("--real-weights", is_flag=True,
              help="Also one measured training step of the real checkpoint (peak memory, activation and gradient "
                   "maxima against fp16's range).")
@click.option("--device", type=click.Choice(["auto", "cpu", "cuda"]), default="auto", show_default=True,
              help="Where the twin trains and the real step is measured: auto takes the GPU where torch sees one "
                   "(the real kernels, cuda.max_memory_allocated), cpu keeps the child off every GPU.")
@_outcome_format_option
def rehearse(target: str, cache_dir: Optional[Path], revision: str, training_config: Optional[Path],
             launch: Optional[str], accelerate_config: Optional[Path], steps: int, timeout: float, real_weights: bool,
             device: str, fmt: str) -> int:
    """Rehearse the training run on a tiny twin of the model, through the libraries installed here, in a child
    process: load, a few train steps, evaluation, generation, save and reload, adapter merge. Writes only to a
    temporary folder."""
    from gemma_doctor.rehearse import rehearse_cli

    return rehearse_cli(target, cache_dir, revision, training_config, launch, steps, timeout, real_weights,
                        fmt.lower(), _out, _hint, device, accelerate_config)


@app.command(context_settings=_CONTEXT)
@click.argument("shell", type=click.Choice(["bash", "zsh", "fish"]))
def completion(shell: str) -> int:
    """Print the shell completion script, e.g. eval "$(gemma-doctor completion bash)" in ~/.bashrc."""
    from click.shell_completion import get_completion_class

    cls = get_completion_class(shell)
    assert cls is not None  # the Choice above only admits shells click supports
    _out(cls(app, {}, "gemma-doctor", "_GEMMA_DOCTOR_COMPLETE").source() + "\n")
    return ExitCode.OK


_INTERRUPTED = "interrupted; every file is either as it was or completely rewritten (run the command again to finish)"


def _click_error(e: BaseException) -> tuple[str, int] | None:
    """(message, exit code) for click's own exceptions (matched by name, robust to click versions)."""
    names = {c.__name__ for c in type(e).__mro__}
    if "Exit" in names:  # --help, --version: click already printed what it had to
        return "", int(getattr(e, "exit_code", 0))
    if "Abort" in names:  # click's wrapper around a Ctrl-C inside a command
        return _INTERRUPTED, int(ExitCode.INTERRUPTED)
    if "NoArgsIsHelpError" in names:
        return e.format_message(), 2  # type: ignore[attr-defined]
    if "ClickException" in names and hasattr(e, "format_message"):
        ctx = getattr(e, "ctx", None)
        cmd = f" {ctx.info_name}" if ctx is not None and getattr(ctx, "parent", None) is not None else ""
        return f"error: {e.format_message()} (see: gemma-doctor{cmd} --help)", int(getattr(e, "exit_code", 2))
    return None


def _error_code(e: DoctorError) -> int:
    """The documented exit code of one of gemma-doctor's own errors."""
    if isinstance(e, (WriteError, LockTimeout)):
        return ExitCode.WRITE_FAILED
    if isinstance(e, HubAccessError):
        return ExitCode.NO_ACCESS
    if isinstance(e, HubUnreachable):
        return ExitCode.HUB_UNREACHABLE
    return ExitCode.USAGE


def _invoke(argv: list[str] | None) -> Any:
    """Run the command and return its exit code. Not click's main(): it prints a blank line before turning
    Ctrl-C into Abort, and this CLI promises one line; main() is used only to answer shell completion."""
    if os.environ.get("_GEMMA_DOCTOR_COMPLETE"):
        return app.main(args=argv, prog_name="gemma-doctor", complete_var="_GEMMA_DOCTOR_COMPLETE")
    args = sys.argv[1:] if argv is None else list(argv)
    with app.make_context("gemma-doctor", args) as ctx:
        return app.invoke(ctx)


def _interrupted_by_signal(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def _interrupt_on_stop() -> None:
    """SIGTERM and SIGHUP (Popen.terminate, docker stop, a CI step's timeout, a closed terminal) stop the run as Ctrl-C
    does: one line, exit 130, a scan's workers stopped and waited for. Without it they end the process at once and
    its workers would run on. Only in a process of its own (main() without argv)."""
    import signal

    for sig in (signal.SIGTERM, signal.SIGHUP):
        try:
            if signal.getsignal(sig) == signal.SIG_DFL:  # one a caller chose (nohup's SIG_IGN) is kept
                signal.signal(sig, _interrupted_by_signal)
        except (ValueError, OSError):  # not the main thread
            pass


def main(argv: list[str] | None = None) -> None:
    """Console-script entry point: run the app, turning every expected error into one line and an exit code."""
    if argv is None:
        _interrupt_on_stop()
    try:
        rv = _invoke(argv)
        code = rv if isinstance(rv, int) else 0
    except UsageError as e:
        _hint(f"error: {e}")
        code = ExitCode.USAGE
    except DoctorError as e:
        _hint(f"error: {e}")
        code = _error_code(e)
    except KeyboardInterrupt:
        _hint(_INTERRUPTED)
        code = ExitCode.INTERRUPTED
    except BrokenPipeError:
        code = 0
    except Exception as e:  # noqa: BLE001 - the last line of defence: one line, traceback on request
        known = _click_error(e)
        if known is None and isinstance(e.__cause__, KeyboardInterrupt):
            # Ctrl-C during an import that creates a dataclass: Python re-raises it from __set_name__ as
            # "RuntimeError: Error calling __set_name__" (seen in tests/test_crash_safety.py's random kills).
            known = _INTERRUPTED, int(ExitCode.INTERRUPTED)
        if known is not None:
            if known[0].startswith("Usage:"):
                sys.stderr.write(known[0] + "\n")
            elif known[0]:
                _hint(known[0])
            code = known[1]
        else:
            if os.environ.get("GEMMA_DOCTOR_DEBUG"):
                raise
            _hint(f"internal error: {type(e).__name__}: {e} (set GEMMA_DOCTOR_DEBUG=1 for a traceback, and please report it)")
            code = ExitCode.INTERNAL
    if argv is None:
        # A real process whose result is printed: a late Ctrl-C (while exiting) must not turn a finished
        # run into a silent exit 130. (Not when called in-process with argv, e.g. by tests.)
        import signal

        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            signal.signal(sig, signal.SIG_IGN)
    sys.exit(int(code))
