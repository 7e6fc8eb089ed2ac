"""The command line: one module per command (check, fix, restore, recommend, list, rehearse, completion), what they
share in common.py, and here the group that finds them and main(), which turns every expected error into one line and
an exit code.

Built on click directly: typer >= 0.29 (which transformers 5.x pulls in unpinned, so gemma-doctor cannot
pin an older one) builds a pydantic TypeAdapter for every option on every start, about 0.2 s of a 0.5 s
`check` (docs/benchmarks.md). A command's module is imported only when that command runs (or when help or completion
lists them all), so `check` builds no option of the other commands; heavy modules (rich, numpy, torch, transformers)
are imported inside the commands that need them.
"""

from __future__ import annotations

import importlib
import os
import sys
from typing import Any

import click

from gemma_doctor import __version__
from gemma_doctor.cli.common import CONTEXT, INTERRUPTED, click_error, error_code, hint
from gemma_doctor.errors import DoctorError, UsageError
from gemma_doctor.report import ExitCode

# Each command's name -> its module (gemma_doctor/cli/<module>.py) and the click command in it.
COMMANDS: dict[str, tuple[str, str]] = {
    "check": ("check", "check"),
    "completion": ("completion", "completion"),
    "fix": ("fix", "fix"),
    "list": ("list_models", "list_models"),
    "recommend": ("recommend", "recommend"),
    "rehearse": ("rehearse", "rehearse"),
    "restore": ("restore", "restore"),
}


class _Commands(click.Group):
    """A group that imports a command's module when the command is asked for (click's documented lazy loading)."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        """Every command's name, sorted as click sorts them."""
        return sorted(COMMANDS)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        """The command named ``cmd_name`` (its module imported now), or None."""
        found = COMMANDS.get(cmd_name)
        if found is None:
            return None
        module, attr = found
        return getattr(importlib.import_module(f"gemma_doctor.cli.{module}"), attr)

    def resolve_command(self, ctx: click.Context, args: list[str]) -> Any:
        """click's, with the command names it suggests from ("Did you mean 'check'?") where it has only its own."""
        try:
            return super().resolve_command(ctx, args)
        except click.UsageError as e:
            # click >= 8.4 suggests close names from the group's own table, empty here; older clicks suggest nothing.
            if type(e).__name__ != "NoSuchCommand" or getattr(e, "possibilities", None):
                raise
            raise type(e)(e.command_name, possibilities=self.list_commands(ctx), ctx=ctx) from None  # type: ignore


@click.group(cls=_Commands, context_settings=CONTEXT, no_args_is_help=True)
@click.version_option(__version__, "--version", prog_name="gemma-doctor", message="%(prog)s %(version)s",
                      help="Print the version and exit.")
def app() -> None:
    """Find Gemma-family checkpoints in the Hugging Face cache or on the Hub, diagnose them before mixed-precision
    training, and fix them safely and reversibly."""


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
        hint(f"error: {e}")
        code = ExitCode.USAGE
    except DoctorError as e:
        hint(f"error: {e}")
        code = error_code(e)
    except KeyboardInterrupt:
        hint(INTERRUPTED)
        code = ExitCode.INTERRUPTED
    except BrokenPipeError:
        code = 0
    except Exception as e:  # noqa: BLE001 - the last line of defence: one line, traceback on request
        known = click_error(e)
        if known is None and isinstance(e.__cause__, KeyboardInterrupt):
            # Ctrl-C during an import that creates a dataclass: Python re-raises it from __set_name__ as
            # "RuntimeError: Error calling __set_name__" (seen in tests/test_crash_safety.py's random kills).
            known = INTERRUPTED, int(ExitCode.INTERRUPTED)
        if known is not None:
            if known[0].startswith("Usage:"):
                sys.stderr.write(known[0] + "\n")
            elif known[0]:
                hint(known[0])
            code = known[1]
        else:
            if os.environ.get("GEMMA_DOCTOR_DEBUG"):
                raise
            hint(f"internal error: {type(e).__name__}: {e} (set GEMMA_DOCTOR_DEBUG=1 for a traceback, and please report it)")
            code = ExitCode.INTERNAL
    if argv is None:
        # A real process whose result is printed: a late Ctrl-C (while exiting) must not turn a finished
        # run into a silent exit 130. (Not when called in-process with argv, e.g. by tests.)
        import signal

        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            signal.signal(sig, signal.SIG_IGN)
    sys.exit(int(code))
