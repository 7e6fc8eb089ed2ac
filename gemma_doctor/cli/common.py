"""What the commands share: their options, where their output goes (stdout, stderr hints, colour) and the mapping of
errors to one line and a documented exit code. Imports click and the small core only: every command's start-up."""

from __future__ import annotations

import contextlib
import os
import sys
from pathlib import Path
from typing import Any, Callable, Iterator, Optional

import click

from gemma_doctor.errors import DoctorError, HubAccessError, HubUnreachable, LockTimeout, WriteError
from gemma_doctor.report import ExitCode

CONTEXT = {"help_option_names": ["-h", "--help"], "max_content_width": 100}
# One instance per kind of path option, shared by the commands: click names each new one through gettext (a locale
# file search, ~75 us), eleven of them at every start before.
FOLDER = click.Path(file_okay=False, path_type=Path)
FILE = click.Path(dir_okay=False, path_type=Path)
FILE_NAME = click.Path(dir_okay=False)


def choice(values: Any) -> click.Choice:
    """A case-insensitive choice of plain strings (an enum's values, or the registry's format names)."""
    return click.Choice([getattr(v, "value", v) for v in values], case_sensitive=False)


def targets(f: Callable) -> Callable:
    """The commands' [TARGET]... argument."""
    return click.argument("targets", nargs=-1, metavar="[TARGET]...")(f)


def _clean_path(_ctx: Any, _param: Any, value: Optional[Path]) -> Optional[Path]:
    """--cache-dir without `..` parts, so that every path printed reads cleanly (examples/../.cache -> .cache)."""
    if value is None:
        return value
    from gemma_doctor.locate import clean_path

    return clean_path(value)


def cache_options(all_revisions: bool = True) -> Callable[[Callable], Callable]:
    """--cache-dir, --revision (and --all-revisions): shared by every command that reads the cache."""

    def decorate(f: Callable) -> Callable:
        if all_revisions:
            f = click.option("--all-revisions", is_flag=True, help="Every cached snapshot of each repo.")(f)
        f = click.option("--revision", default="main", show_default=True, help="Branch, tag or commit of cached repos.")(f)
        f = click.option("--cache-dir", type=FOLDER, default=None,
                         callback=_clean_path,
                         help="Hugging Face hub cache (default: HF_HUB_CACHE, HF_HOME/hub, ~/.cache/huggingface/hub).")(f)
        return f

    return decorate


def format_option(command: str, help: str = "Output format.") -> Callable[[Callable], Callable]:  # noqa: A002
    """--format / -f with ``command``'s formats as its choices, in the registry's order (render/formats.py)."""
    from gemma_doctor.render.formats import formats

    def decorate(f: Callable) -> Callable:
        return click.option("--format", "-f", "fmt", type=choice(formats(command)), default="text", show_default=True,
                            help=help)(f)

    return decorate


def lock_option(f: Callable) -> Callable:
    """--lock-timeout of the commands that write."""
    return click.option("--lock-timeout", type=click.FloatRange(min=0.0), default=60.0, show_default=True,
                        help="Seconds to wait for another gemma-doctor writing the same repo.")(f)


GPU_HELP = "Plan for this GPU instead of probing: a compute capability (8.0, sm_75), a name (T4, A100, H100) or none."


def memory_options(f: Callable) -> Callable:
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


def memory_request(method: Optional[str], batch_size: Optional[int], seq_len: Optional[int],
                   gradient_checkpointing: Optional[bool], gpu_memory: Optional[str], num_gpus: Optional[int],
                   size: Optional[str] = None):  # noqa: ANN201 - a facts.MemoryRequest
    """The memory options as the options' memory request."""
    from gemma_doctor.gpus import parse_memory
    from gemma_doctor.facts import MemoryRequest

    return MemoryRequest(method=method.lower() if method else None, batch_size=batch_size, seq_len=seq_len,
                         gradient_checkpointing=gradient_checkpointing,
                         gpu_memory=parse_memory(gpu_memory) if gpu_memory is not None else None, num_gpus=num_gpus,
                         size=size)


def stack_options(f: Callable) -> Callable:
    """--with / --requirements: the libraries of the training machine, when it is not this one."""
    f = click.option("--requirements", "requirements", type=FILE_NAME, default=None,
                     envvar="GEMMA_DOCTOR_REQUIREMENTS",
                     help="The training machine's packages: a requirements.txt, `pip freeze` output, or a uv/poetry "
                          "lock file (default: what is installed here).")(f)
    f = click.option("--with", "with_packages", multiple=True, metavar="PKG==VERSION", envvar="GEMMA_DOCTOR_WITH",
                     help="A library version of the training machine, e.g. --with transformers==4.50.3 (repeatable; "
                          "overrides the installed or --requirements version).")(f)
    return f


# gemma_doctor/hub.py reads it (DEADLINE_ENV there; hub is not imported here: no huggingface_hub at start-up).
HUB_DEADLINE_ENV = "GEMMA_DOCTOR_HUB_DEADLINE"


def seconds(_ctx: Any, _param: Any, value: Optional[float]) -> Optional[float]:
    """A click callback: a number of seconds above 0 and at most a day."""
    if value is not None and not (0 < value <= 86400):  # FloatRange lets nan through
        raise click.BadParameter(f"{value} is not a number of seconds above 0 and at most 86400")
    return value


def remote_option(f: Callable) -> Callable:
    """--remote and --hub-deadline: reading named repos from the Hub."""
    f = click.option("--hub-deadline", "hub_deadline", type=float, callback=seconds,
                     default=None, metavar="SECONDS", envvar=HUB_DEADLINE_ENV,
                     help="Seconds the whole remote read of a repo may take (default: 60); past it, one line and "
                          "exit code 5.")(f)
    return click.option("--remote", is_flag=True,
                        help="Read named repos from the Hub even when cached (config files and safetensors headers "
                             "only, nothing downloaded); a repo that is not cached is read from the Hub anyway.")(f)


@contextlib.contextmanager
def hub_deadline(seconds: Optional[float]) -> Iterator[None]:
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


def color(stream: object = None) -> bool:
    """Colour only on a terminal, and never with NO_COLOR set (no-color.org)."""
    if os.environ.get("NO_COLOR"):
        return False
    # Looked up at call time: sys.stdout may have been replaced since import (tests, redirection).
    stream = sys.stdout if stream is None else stream
    isatty = getattr(stream, "isatty", None)
    return bool(isatty and isatty())


def out(text: str) -> None:
    """The command's result, on stdout."""
    sys.stdout.write(text)
    sys.stdout.flush()


def hint(text: str) -> None:
    """A hint, warning or error, one line on stderr."""
    from gemma_doctor.render.style import printable  # small and pure: no rich

    # One line, whatever names it quotes: a control character in a folder name is shown, never acted on.
    sys.stderr.write(f"gemma-doctor: {printable(text)}\n")


def models(targets: list[str], cache_dir: Optional[Path], revision: str, all_revisions: bool):  # noqa: ANN201
    """The models fix and restore work on (a folder that shadows a cached repo said first)."""
    from gemma_doctor import locate
    from gemma_doctor.pipeline import select

    cache = cache_dir if cache_dir is not None else locate.default_cache_dir()
    for target in targets:
        note = locate.shadow_note(target, cache, hub=False)  # fix/restore would work on the folder, not the cache
        if note:
            hint(note)
    snapshots = locate.resolve(targets, cache_dir, revision, all_revisions)
    found, _skipped = select(snapshots, explicit=bool(targets))
    return found


INTERRUPTED = "interrupted; every file is either as it was or completely rewritten (run the command again to finish)"


def click_error(e: BaseException) -> tuple[str, int] | None:
    """(message, exit code) for click's own exceptions (matched by name, robust to click versions)."""
    names = {c.__name__ for c in type(e).__mro__}
    if "Exit" in names:  # --help, --version: click already printed what it had to
        return "", int(getattr(e, "exit_code", 0))
    if "Abort" in names:  # click's wrapper around a Ctrl-C inside a command
        return INTERRUPTED, int(ExitCode.INTERRUPTED)
    if "NoArgsIsHelpError" in names:
        return e.format_message(), 2  # type: ignore[attr-defined]
    if "ClickException" in names and hasattr(e, "format_message"):
        ctx = getattr(e, "ctx", None)
        cmd = f" {ctx.info_name}" if ctx is not None and getattr(ctx, "parent", None) is not None else ""
        return f"error: {e.format_message()} (see: gemma-doctor{cmd} --help)", int(getattr(e, "exit_code", 2))
    return None


def error_code(e: DoctorError) -> int:
    """The documented exit code of one of gemma-doctor's own errors."""
    if isinstance(e, (WriteError, LockTimeout)):
        return ExitCode.WRITE_FAILED
    if isinstance(e, HubAccessError):
        return ExitCode.NO_ACCESS
    if isinstance(e, HubUnreachable):
        return ExitCode.HUB_UNREACHABLE
    return ExitCode.USAGE
