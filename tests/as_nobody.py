"""Run gemma-doctor as user nobody (tests of permissions, which root ignores), from wherever the clone lives.

A clone in a 0700 folder (root's home, ``mktemp -d``) cannot be entered by nobody: neither its gemma_doctor nor a
venv inside it can be imported or executed. So the package and the libraries ``check``/``fix`` import on a cached
model are copied once per process into a world-readable folder, and an interpreter nobody can execute (this one,
else the system Python of the same version) runs them. Where there is none, the test skips and says why.
"""

from __future__ import annotations

import atexit
import functools
import importlib.util
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
NOBODY = 65534
# What `check`, `fix` and `restore` of a cached model import (no torch, transformers or huggingface_hub: see
# tests/test_startup_imports.py), with the libraries rich renders through.
_LIBRARIES = ("click", "rich", "markdown_it", "mdurl", "pygments", "packaging", "yaml", "_yaml", "numpy", "safetensors")


def setpriv(python: str, *args: str) -> list[str]:
    """The command line that runs ``python *args`` as nobody."""
    return ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups", python, *args]


def _copy_libraries(dest: Path) -> None:
    shutil.copytree(ROOT / "gemma_doctor", dest / "gemma_doctor", ignore=shutil.ignore_patterns("__pycache__"))
    for name in _LIBRARIES:
        spec = importlib.util.find_spec(name)
        if spec is None or spec.origin is None and not spec.submodule_search_locations:
            continue
        if spec.submodule_search_locations:  # a package: its folder, and a sibling NAME.libs of bundled .so files
            folder = Path(list(spec.submodule_search_locations)[0])
            shutil.copytree(folder, dest / folder.name, ignore=shutil.ignore_patterns("__pycache__", "tests"))
            libs = folder.parent / f"{folder.name}.libs"
            if libs.is_dir():
                shutil.copytree(libs, dest / libs.name)
        else:
            shutil.copy2(spec.origin, dest / Path(spec.origin).name)
    for path in [dest, *dest.rglob("*")]:
        if not path.is_symlink():
            os.chmod(path, 0o755 if path.is_dir() or os.access(path, os.X_OK) else 0o644)


def _interpreters() -> list[str]:
    seen: list[str] = []
    for candidate in (sys.executable, getattr(sys, "_base_executable", ""), os.path.realpath(sys.executable),
                      shutil.which(f"python{sys.version_info[0]}.{sys.version_info[1]}", path="/usr/local/bin:/usr/bin:/bin")):
        if candidate and candidate not in seen:
            seen.append(candidate)
    return seen


@functools.lru_cache(maxsize=1)
def runtime() -> tuple[str, str] | str:
    """(python, PYTHONPATH) with which nobody runs this tree's gemma_doctor, or the reason there is none."""
    if os.geteuid() != 0:
        return "switches to user nobody, which needs root"
    if not shutil.which("setpriv"):
        return "switches to user nobody with setpriv, which is not installed"
    dest = Path(tempfile.mkdtemp(prefix="gd-nobody-lib-"))
    atexit.register(shutil.rmtree, dest, True)
    os.chmod(dest, 0o755)
    _copy_libraries(dest)
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(dest), "PYTHONNOUSERSITE": "1", "PYTHONDONTWRITEBYTECODE": "1"}
    want = f"{sys.version_info[0]}.{sys.version_info[1]}"
    tried = []
    for python in _interpreters():
        probe = subprocess.run(setpriv(python, "-c", "import sys, gemma_doctor.cli, yaml, numpy; "
                                                      "print('%d.%d' % sys.version_info[:2])"),
                               env=env, cwd="/", capture_output=True, text=True, timeout=120)
        if probe.returncode == 0 and probe.stdout.strip() == want:
            return python, str(dest)
        tried.append(f"{python}: {(probe.stderr.strip().splitlines() or [probe.stdout.strip()])[-1][:120]}")
    return "no Python " + want + " that user nobody can execute (" + "; ".join(tried) + ")"


def run(*args: str, cwd: Path, **extra_env: str) -> subprocess.CompletedProcess[str]:
    """``python -m gemma_doctor *args`` as nobody; the caller has skipped unless ``runtime()`` is a tuple."""
    got = runtime()
    assert isinstance(got, tuple), got
    python, path = got
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(cwd), "HF_HUB_OFFLINE": "1", "NO_COLOR": "1",
           "PYTHONPATH": path, "HF_HUB_CACHE": str(cwd / "nope"), "PYTHONDONTWRITEBYTECODE": "1",
           "PYTHONNOUSERSITE": "1", **extra_env}
    return subprocess.run(setpriv(python, "-m", "gemma_doctor", *args), cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=120)


def skip_reason() -> str | None:
    """Why a test that runs as nobody cannot run here, or None."""
    got = runtime()
    return None if isinstance(got, tuple) else got
