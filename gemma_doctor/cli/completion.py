"""`gemma-doctor completion`: the shell completion script click writes for the whole app."""

from __future__ import annotations

import click

from gemma_doctor.cli import common
from gemma_doctor.report import ExitCode


@click.command(context_settings=common.CONTEXT)
@click.argument("shell", type=click.Choice(["bash", "zsh", "fish"]))
def completion(shell: str) -> int:
    """Print the shell completion script, e.g. eval "$(gemma-doctor completion bash)" in ~/.bashrc."""
    from click.shell_completion import get_completion_class

    from gemma_doctor.cli import app

    cls = get_completion_class(shell)
    assert cls is not None  # the Choice above only admits shells click supports
    common.out(cls(app, {}, "gemma-doctor", "_GEMMA_DOCTOR_COMPLETE").source() + "\n")
    return ExitCode.OK
