"""gemma-doctor installs into the environments it diagnoses without changing them: next to transformers
4.50.x (which pins huggingface_hub < 1.0) and next to transformers 5.x with the newest huggingface_hub."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.venvs import ROOT, ensure_venv

pytestmark = pytest.mark.slow


def _would_install(python: Path | str) -> dict[str, str]:
    """What `pip install <this project>` would install or upgrade there: name -> version."""
    done = subprocess.run([str(python), "-m", "pip", "install", "--dry-run", "--quiet", "--report", "-",
                           "--disable-pip-version-check", str(ROOT)], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout)
    return {item["metadata"]["name"].lower(): item["metadata"]["version"] for item in report["install"]}


def _installed(python: Path | str, name: str) -> str:
    code = f"from importlib.metadata import version; print(version({name!r}))"
    return subprocess.run([str(python), "-c", code], capture_output=True, text=True, check=True).stdout.strip()


def _all_installed(python: Path | str) -> dict[str, str]:
    code = ("import json; from importlib.metadata import distributions; "
            "print(json.dumps({d.metadata['Name'].lower().replace('_', '-'): d.version for d in distributions()}))")
    return json.loads(subprocess.run([str(python), "-c", code], capture_output=True, text=True, check=True).stdout)


def _assert_changes_nothing(python: Path | str) -> None:
    """Only new packages may appear; nothing already installed is upgraded or downgraded."""
    before = _all_installed(python)
    plan = {k.replace("_", "-"): v for k, v in _would_install(python).items()}
    plan.pop("gemma-doctor")
    moved = {name: (before[name], version) for name, version in plan.items() if name in before}
    assert moved == {}, moved
    for pinned in ("transformers", "huggingface-hub", "accelerate", "torch", "tokenizers", "safetensors"):
        assert pinned not in plan


def test_installs_next_to_transformers_4_50_without_moving_it():
    python = ensure_venv()
    assert _installed(python, "transformers") == "4.50.0"
    assert _installed(python, "huggingface_hub").startswith("0.")
    _assert_changes_nothing(python)


def test_installs_next_to_the_newest_transformers_without_moving_it():
    transformers = pytest.importorskip("transformers")
    if int(transformers.__version__.split(".")[0]) < 5:
        pytest.skip("the test environment does not hold transformers 5.x")
    _assert_changes_nothing(sys.executable)
