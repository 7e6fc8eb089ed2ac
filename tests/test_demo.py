"""examples/demo.sh, the README's first command, in the README's own install (no transformers) and the test stack.

demo.sh states the exit code of every step and exits 1 when one differs, so the demo passing here means each step
did what it claims: above all, the L4 prescription exists (a version pin where the stack cannot tell) and passes
check --training-config."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.venvs import ROOT, ensure_light_venv, subprocess_env

pytestmark = pytest.mark.slow


def _run_demo(python: Path, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    """demo.sh with ``python`` as `python` and this working tree's gemma-doctor on PATH."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "gemma-doctor").write_text(f'#!/bin/sh\nexec "{python}" -m gemma_doctor "$@"\n')
    (bin_dir / "python").write_text(f'#!/bin/sh\nexec "{python}" "$@"\n')
    for f in bin_dir.iterdir():
        f.chmod(0o755)
    env = subprocess_env(PATH=f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}",
                         GEMMA_DOCTOR_EXAMPLE_CACHE=str(tmp_path / "cache"), TMPDIR=str(tmp_path))
    return subprocess.run(["bash", str(ROOT / "examples" / "demo.sh")], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=600)


def _assert_passed(r: subprocess.CompletedProcess[str]) -> None:
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-4000:]
    assert "every step gave the exit code it claims" in r.stdout
    assert "no run passes check; the way out" not in r.stdout  # the L4 YAML is a prescription


def test_demo_passes_every_step_without_transformers(tmp_path):
    """The README's install: `pip install -e .` brings no transformers. recommend --gpu L4 gave "no run passes check"
    (GD105 unknown) and demo.sh still exited 0."""
    python = ensure_light_venv()
    missing = subprocess.run([str(python), "-c", "import importlib.util as u; print(u.find_spec('transformers'))"],
                             capture_output=True, text=True, env=subprocess_env(), check=True).stdout.strip()
    assert missing == "None"
    r = _run_demo(python, tmp_path)
    _assert_passed(r)
    assert '# needs transformers>=5.6.0: pip install "transformers>=5.6.0" (resolves GD105' in r.stdout


def test_demo_passes_every_step_with_the_test_stack(tmp_path):
    r = _run_demo(Path(sys.executable), tmp_path)
    _assert_passed(r)
    assert "# needs transformers" not in r.stdout  # the installed transformers is out of every window
