"""Colour only on a terminal and never with NO_COLOR; shell completion; --version; hints naming the next command."""

from __future__ import annotations

import io
import os
import subprocess
import sys

import pytest

from gemma_doctor import __version__
from gemma_doctor.cli import common
from tests.builders import gemma3_12b_config, generation_config


class _Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_color_needs_a_terminal_and_no_no_color(monkeypatch):
    assert common.color(_Tty()) is True
    assert common.color(io.StringIO()) is False
    monkeypatch.setenv("NO_COLOR", "1")
    assert common.color(_Tty()) is False


@pytest.mark.parametrize("command", [["check", "google/gemma-3-12b-it"], ["list"], ["fix", "google/gemma-3-12b-it"]])
def test_terminal_output_is_coloured_unless_no_color(hub, cli, monkeypatch, command):
    hub.add("google/gemma-3-12b-it", {"config.json": gemma3_12b_config(), "generation_config.json": generation_config()})
    monkeypatch.setattr(common, "color", lambda stream=None: not os.environ.get("NO_COLOR") and True)
    coloured = cli(*command, "--cache-dir", hub.root)
    assert "\x1b[" in coloured.out
    monkeypatch.setenv("NO_COLOR", "1")
    plain = cli(*command, "--cache-dir", hub.root)
    assert "\x1b[" not in plain.out and plain.code == coloured.code


def test_piped_output_has_no_colour_or_box_art(hub):
    hub.add("google/gemma-3-12b-it", {"config.json": gemma3_12b_config(), "generation_config.json": generation_config()})
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    env.pop("NO_COLOR", None)
    for command in (["check", "google/gemma-3-12b-it"], ["list"]):
        done = subprocess.run([sys.executable, "-m", "gemma_doctor", *command, "--cache-dir", str(hub.root)],
                              capture_output=True, text=True, env=env)
        assert "google/gemma-3-12b-it" in done.stdout
        assert "\x1b[" not in done.stdout + done.stderr
        assert not any(ch in done.stdout for ch in "│─┃━┏┌╭")


def test_version(cli):
    r = cli("--version")
    assert (r.code, r.out) == (0, f"gemma-doctor {__version__}\n")


def test_shell_completion_is_offered(cli):
    r = cli("completion", "bash")
    assert r.code == 0 and "_GEMMA_DOCTOR_COMPLETE=bash_complete" in r.out
    env = {**os.environ, "_GEMMA_DOCTOR_COMPLETE": "bash_complete", "COMP_WORDS": "gemma-doctor ch", "COMP_CWORD": "1"}
    done = subprocess.run([sys.executable, "-c", "from gemma_doctor.cli import main; main()"], capture_output=True, text=True,
                          env=env)
    assert "plain,check" in done.stdout.split()  # click 8 bash protocol: type,value per line


def test_a_misspelt_command_is_answered_with_the_one_meant(cli):
    """The group finds each command's module when it is asked for, and still names the close ones (click >= 8.4)."""
    import click

    r = cli("chek")
    assert r.code == 2 and r.err.count("\n") == 1 and "No such command 'chek'" in r.err
    if hasattr(click.exceptions, "NoSuchCommand"):
        assert "Did you mean 'check'?" in r.err


def test_missing_model_names_the_download_command(hub, cli):
    hub.add("google/gemma-3-12b-it", {"config.json": gemma3_12b_config()})
    r = cli("check", "google/gemma-3-1b-it", "--cache-dir", hub.root)
    assert r.code == 2 and "hf download google/gemma-3-1b-it" in r.err
