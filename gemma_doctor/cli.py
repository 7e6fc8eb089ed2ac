"""The command line: parse options, call one function per command, map errors to exit codes.

Heavy modules (rich, torch, transformers) are imported inside the commands that need them.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import List, Optional

import typer

from gemma_doctor import __version__
from gemma_doctor.errors import DoctorError, LockTimeout, UsageError, WriteError
from gemma_doctor.render import OutputFormat
from gemma_doctor.listing import ListFormat
from gemma_doctor.render.recommend import RecommendFormat
from gemma_doctor.report import ExitCode, FailOn

app = typer.Typer(
    name="gemma-doctor",
    help="Find Gemma-family checkpoints in the Hugging Face cache, diagnose them before mixed-precision "
         "training, and fix them safely and reversibly.",
    add_completion=True,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
)

TargetsArg = typer.Argument(None, metavar="[TARGET]...",
                            help="Repo ids in the cache (google/gemma-3-12b-it) or model folders; none = every Gemma repo in the cache.")
CacheDirOpt = typer.Option(None, "--cache-dir", help="Hugging Face hub cache (default: HF_HUB_CACHE, HF_HOME/hub, ~/.cache/huggingface/hub).",
                           file_okay=False)
RevisionOpt = typer.Option("main", "--revision", help="Branch, tag or commit of cached repos.")
AllRevisionsOpt = typer.Option(False, "--all-revisions", help="Every cached snapshot of each repo.")
FormatOpt = typer.Option(OutputFormat.TEXT, "--format", "-f", help="Output format.", case_sensitive=False)
LockTimeoutOpt = typer.Option(60.0, "--lock-timeout", min=0.0, help="Seconds to wait for another gemma-doctor writing the same repo.")


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
    sys.stderr.write(f"gemma-doctor: {text}\n")


def _version_callback(value: bool) -> None:
    if value:
        _out(f"gemma-doctor {__version__}\n")
        raise typer.Exit(0)


@app.callback()
def _root(
    version: bool = typer.Option(False, "--version", callback=_version_callback, is_eager=True, help="Print the version and exit."),
) -> None:
    """gemma-doctor: a pre-flight check for Gemma fine-tuning."""


@app.command()
def check(
    targets: Optional[List[str]] = TargetsArg,
    cache_dir: Optional[Path] = CacheDirOpt,
    revision: str = RevisionOpt,
    all_revisions: bool = AllRevisionsOpt,
    fmt: OutputFormat = FormatOpt,
    fail_on: FailOn = typer.Option(FailOn.ERROR, "--fail-on", case_sensitive=False,
                                   help="Exit 1 when a finding is at or above this severity."),
    weights: bool = typer.Option(False, "--weights", help="Also read every tensor: NaN/Inf, fp16 overflow, zero embedding rows."),
    jobs: int = typer.Option(1, "--jobs", "-j", min=1, help="Shards scanned in parallel by --weights."),
    gpu: Optional[str] = typer.Option(None, "--gpu", help="Plan for this GPU instead of probing: a compute capability (8.0, sm_75), a name (T4, A100, H100) or none."),
    task: Optional[str] = typer.Option(None, "--task", help="Training task for the precision advice: sft, dpo, grpo, ppo, qlora..."),
    training_config: Optional[Path] = typer.Option(None, "--training-config", exists=False, dir_okay=False,
                                                   help="A TrainingArguments/TRL JSON or YAML, axolotl YAML or accelerate config to lint."),
) -> None:
    """Diagnose models: use_cache, generation config, saved dtypes, GPU and library versions. Writes nothing."""
    from gemma_doctor.diagnose import diagnose
    from gemma_doctor.facts import CheckOptions

    options = CheckOptions(fail_on=fail_on, weights=weights, gpu=gpu, task=task,
                           training_config=str(training_config) if training_config else None, jobs=jobs)
    report = diagnose(targets or [], cache_dir, revision, all_revisions, options)
    if fmt is OutputFormat.JSON:
        from gemma_doctor.render.jsonout import render_report as render_json

        _out(render_json(report, fail_on))
    elif fmt is OutputFormat.GITHUB:
        from gemma_doctor.render.github import render_report as render_github

        _out(render_github(report, fail_on))
    else:
        from gemma_doctor.render.text import render_report as render_text

        _out(render_text(report, fail_on, _color()))
    if not report.models:
        _hint(f"no Gemma-family model found in {report.cache_dir}; download one with: hf download google/gemma-3-1b-it")
    raise typer.Exit(ExitCode.FINDINGS if report.failed(fail_on) else ExitCode.OK)


def _models(targets: list[str], cache_dir: Optional[Path], revision: str, all_revisions: bool):  # noqa: ANN202
    from gemma_doctor import locate
    from gemma_doctor.diagnose import select

    snapshots = locate.resolve(targets, cache_dir, revision, all_revisions)
    models, _skipped = select(snapshots, explicit=bool(targets))
    return models


def _print_outcomes(command: str, outcomes: list, fmt: OutputFormat, dry_run: bool, ok: bool) -> None:
    if fmt is OutputFormat.JSON:
        from gemma_doctor.render.jsonout import dumps, outcomes_doc

        _out(dumps(outcomes_doc(command, outcomes, dry_run, ok)))
    else:
        from gemma_doctor.render.text import render_outcomes

        _out(render_outcomes(outcomes, _color()))


@app.command()
def fix(
    targets: Optional[List[str]] = TargetsArg,
    inplace: bool = typer.Option(False, "--inplace", help="Apply the changes (default: print the diff only)."),
    cache_dir: Optional[Path] = CacheDirOpt,
    revision: str = RevisionOpt,
    all_revisions: bool = AllRevisionsOpt,
    fmt: OutputFormat = FormatOpt,
    lock_timeout: float = LockTimeoutOpt,
) -> None:
    """Set use_cache=false where the text model reads it; prints the diff, writes only with --inplace."""
    from gemma_doctor.fixes import Outcome, Status, apply_plan, needs_tidy, plan_model

    outcomes: list[Outcome] = []
    failed = refused = False
    for facts in _models(targets or [], cache_dir, revision, all_revisions):
        plan = plan_model(facts)
        outcome = Outcome(facts, plan.status, list(plan.changes), list(plan.refused) + ([plan.note] if plan.note else []))
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
                    outcome.messages.append(f"undo with: gemma-doctor restore {facts.snapshot.target}")
            except WriteError as e:
                outcome.status = Status.FAILED
                outcome.messages.append(str(e))
                failed = True
        outcomes.append(outcome)
    _print_outcomes("fix", outcomes, fmt, not inplace, not (failed or refused))
    pending = sum(len(o.changes) for o in outcomes if o.status is Status.WOULD_CHANGE)
    if not inplace and pending:
        _hint(f"{pending} file(s) would change; run again with --inplace to apply")
    elif not any(o.changes for o in outcomes) and not refused:
        _hint("nothing to change")
    raise typer.Exit(ExitCode.WRITE_FAILED if failed else ExitCode.FINDINGS if refused else ExitCode.OK)


@app.command()
def restore(
    targets: Optional[List[str]] = TargetsArg,
    dry_run: bool = typer.Option(False, "--dry-run", help="Say what would be restored, change nothing."),
    cache_dir: Optional[Path] = CacheDirOpt,
    revision: str = RevisionOpt,
    all_revisions: bool = AllRevisionsOpt,
    fmt: OutputFormat = FormatOpt,
    lock_timeout: float = LockTimeoutOpt,
) -> None:
    """Undo `fix --inplace`: snapshot files become the original links (or bytes), byte-identical."""
    from gemma_doctor.fixes import Outcome, Status, apply_restore, plan_restore

    outcomes: list[Outcome] = []
    failed = conflicted = False
    for facts in _models(targets or [], cache_dir, revision, all_revisions):
        actions, conflicts = plan_restore(facts)
        conflicted |= bool(conflicts)
        status = Status.NOTHING_TO_RESTORE
        messages = list(conflicts)
        if facts.undo.error:
            messages.append(f"undo record unreadable: {facts.undo.error}")
            conflicted = True
        to_restore = [a for a in actions if not a.drop_only]
        if to_restore:
            status = Status.WOULD_CHANGE if dry_run else Status.RESTORED
            messages.extend(f"{'would restore' if dry_run else 'restored'} {a.name}" for a in to_restore)
        if actions and not dry_run:
            try:
                apply_restore(facts, actions, lock_timeout)
            except WriteError as e:
                status = Status.FAILED
                messages.append(str(e))
                failed = True
        outcomes.append(Outcome(facts, status, [], messages))
    _print_outcomes("restore", outcomes, fmt, dry_run, not (failed or conflicted))
    raise typer.Exit(ExitCode.WRITE_FAILED if failed else ExitCode.FINDINGS if conflicted else ExitCode.OK)


@app.command()
def recommend(
    targets: Optional[List[str]] = TargetsArg,
    family: Optional[str] = typer.Option(None, "--family", help="Plan for a family without a downloaded model (CI before download): "
                                                                 "gemma, gemma2, gemma3, gemma3n, paligemma, paligemma2."),
    gpu: Optional[str] = typer.Option(None, "--gpu", help="Plan for this GPU instead of probing: a compute capability (8.0, sm_75), a name (T4, A100, H100) or none."),
    task: Optional[str] = typer.Option(None, "--task", help="sft (default), full, lora, qlora, dpo, orpo, kto, grpo, ppo."),
    quantization: Optional[str] = typer.Option(None, "--quantization", help="4bit, 8bit or none (default: from the checkpoint's quantization_config)."),
    qlora: bool = typer.Option(False, "--qlora", help="Shorthand for --quantization 4bit."),
    cache_dir: Optional[Path] = CacheDirOpt,
    revision: str = RevisionOpt,
    fmt: RecommendFormat = typer.Option(RecommendFormat.TEXT, "--format", "-f", case_sensitive=False,
                                        help="text (reasons + Python), python, yaml (axolotl + accelerate) or json."),
) -> None:
    """Recommend a training precision (bf16, fp16 or fp32) with its reasons and ready-to-paste settings."""
    from gemma_doctor.advice import recommend_items
    from gemma_doctor.render import recommend as view

    if qlora:
        if quantization not in (None, "4bit"):
            raise UsageError("--qlora means --quantization 4bit; drop one of them")
        quantization = "4bit"
    gpu_facts, items, skipped = recommend_items(targets or [], cache_dir, revision, family, gpu, task, quantization)
    for line in skipped:
        _hint(line)
    if fmt is RecommendFormat.JSON:
        _out(view.render_json(items, gpu_facts, items[0].recommendation.inputs["task"]))
    elif fmt is RecommendFormat.PYTHON:
        _out(view.render_python(items, gpu_facts))
    elif fmt is RecommendFormat.YAML:
        _out(view.render_yaml(items, gpu_facts))
    else:
        _out(view.render_text(items, gpu_facts, _color()))
    if gpu_facts.source == "probe" and gpu_facts.backend == "none":
        _hint(f"{gpu_facts.reason}; planning for CPU training")
    raise typer.Exit(ExitCode.OK)


@app.command("list")
def list_models(
    cache_dir: Optional[Path] = CacheDirOpt,
    revision: str = RevisionOpt,
    all_revisions: bool = AllRevisionsOpt,
    filters: Optional[List[str]] = typer.Option(None, "--filter", metavar="EXPR",
                                                help="Keep rows matching EXPR, like hf cache ls: size>1GB, family=gemma3, status=needs-fix, "
                                                     "dtype=bfloat16, name=google/*. Repeatable (all must hold)."),
    sort: Optional[str] = typer.Option(None, "--sort", help="name, size, family or status, optionally :asc or :desc (size defaults to desc)."),
    limit: Optional[int] = typer.Option(None, "--limit", min=0, help="Show only the first N rows after sorting."),
    fmt: ListFormat = typer.Option(ListFormat.TEXT, "--format", "-f", case_sensitive=False, help="Output format."),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="One repo id per line (same as --format quiet)."),
) -> None:
    """List cached Gemma-family models: family, revision, size, declared dtype, status (ok, needs-fix, fixed, error)."""
    from gemma_doctor import listing
    from gemma_doctor.locate import default_cache_dir

    cache = cache_dir if cache_dir is not None else default_cache_dir()
    rows, skipped = listing.collect(cache, revision, all_revisions)
    shown = listing.select_rows(rows, filters or [], sort, limit)
    from gemma_doctor.render import listing as view

    if quiet or fmt is ListFormat.QUIET:
        _out(view.render_quiet(shown))
    elif fmt is ListFormat.JSON:
        _out(view.render_json(shown, skipped))
    else:
        _out(view.render_text(shown, _color()))
    if not rows:
        _hint(f"no Gemma-family model in {cache}; download one with: hf download google/gemma-3-1b-it")
    pending = [r for r in shown if r.status is listing.RowStatus.NEEDS_FIX]
    if pending and fmt is ListFormat.TEXT and not quiet:
        _hint(f"{len(pending)} model(s) need a fix; see why with: gemma-doctor check {pending[0].repo_id or pending[0].path}, "
              f"then: {pending[0].next_command}")
    raise typer.Exit(ExitCode.OK)


def _click_error(e: BaseException) -> tuple[str, int] | None:
    """(message, exit code) for click's own exceptions, whichever click (typer may vendor one) raised them."""
    names = {c.__name__ for c in type(e).__mro__}
    if "Abort" in names:
        return "interrupted", int(ExitCode.INTERRUPTED)
    if "NoArgsIsHelpError" in names:
        return e.format_message(), 2  # type: ignore[attr-defined]
    if "ClickException" in names and hasattr(e, "format_message"):
        ctx = getattr(e, "ctx", None)
        cmd = f" {ctx.info_name}" if ctx is not None and getattr(ctx, "parent", None) is not None else ""
        return f"error: {e.format_message()} (see: gemma-doctor{cmd} --help)", int(getattr(e, "exit_code", 2))
    return None


def main(argv: list[str] | None = None) -> None:
    """Console-script entry point: run the app, turning every expected error into one line and an exit code."""
    try:
        # Outside standalone mode click returns typer.Exit's code instead of raising it.
        rv = app(args=argv, prog_name="gemma-doctor", standalone_mode=False)
        code = rv if isinstance(rv, int) else 0
        if code == ExitCode.INTERRUPTED:
            # typer turns Ctrl-C inside a command into a silent exit 130; say what state things are in.
            raise KeyboardInterrupt
    except UsageError as e:
        _hint(f"error: {e}")
        code = ExitCode.USAGE
    except DoctorError as e:
        _hint(f"error: {e}")
        code = ExitCode.WRITE_FAILED if isinstance(e, (WriteError, LockTimeout)) else ExitCode.USAGE
    except KeyboardInterrupt:
        _hint("interrupted; every file is either as it was or completely rewritten (run the command again to finish)")
        code = ExitCode.INTERRUPTED
    except BrokenPipeError:
        code = 0
    except Exception as e:  # noqa: BLE001 - the last line of defence: one line, traceback on request
        known = _click_error(e)
        if known is not None:
            sys.stderr.write(known[0] + "\n") if known[0].startswith("Usage:") else _hint(known[0])
            code = known[1]
        else:
            if os.environ.get("GEMMA_DOCTOR_DEBUG"):
                raise
            _hint(f"internal error: {type(e).__name__}: {e} (set GEMMA_DOCTOR_DEBUG=1 for a traceback, and please report it)")
            code = 70
    if argv is None:
        # A real process whose result is printed: a late Ctrl-C (while exiting) must not turn a finished
        # run into a silent exit 130. (Not when called in-process with argv, e.g. by tests.)
        import signal

        signal.signal(signal.SIGINT, signal.SIG_IGN)
    sys.exit(int(code))
