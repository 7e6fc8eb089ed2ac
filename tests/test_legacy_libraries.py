"""Findings about old libraries, judged against the real old libraries installed (not a patched version number):
the cached legacy venv (tests/venvs.py: transformers 4.50.0, accelerate 1.5.2, PEFT 0.11.1) runs gemma-doctor
from this working tree, with no planning option, so the versions come from that venv's package metadata."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from tests.builders import HubCache, gemma3_1b_config, gemma3_12b_config, generation_config
from tests.venvs import ensure_venv, subprocess_env

pytestmark = pytest.mark.slow

SCRIPTS = Path(__file__).parent / "scripts"


@pytest.fixture(scope="module")
def legacy_python() -> Path:
    return ensure_venv()


def _check(python: Path, hub: HubCache, repo: str, *extra: str) -> dict:
    done = subprocess.run([str(python), "-m", "gemma_doctor", "check", repo, "--cache-dir", str(hub.root), "--format",
                           "json", "--fail-on", "never", *extra], capture_output=True, text=True, timeout=300,
                          env=subprocess_env(HF_HUB_CACHE=str(hub.root)))
    assert done.returncode == 0, done.stdout + done.stderr[-3000:]
    return json.loads(done.stdout)


def test_peft_0_11_really_leaves_lora_adapters_in_bf16_and_check_says_so(legacy_python, tmp_path):
    """The pitfall behind GD401, shown by the installed PEFT itself, then reported from its metadata."""
    made = subprocess.run([str(legacy_python), str(SCRIPTS / "lora_adapter_dtype.py")], capture_output=True, text=True,
                          timeout=300, env=subprocess_env())
    assert made.returncode == 0, made.stderr[-3000:]
    assert "ADAPTER-DTYPES peft=0.11.1 bfloat16" in made.stdout, made.stdout

    hub = HubCache(tmp_path / "hub")
    hub.add("org/gemma-3-1b", {"config.json": gemma3_1b_config()})
    doc = _check(legacy_python, hub, "org/gemma-3-1b", "--gpu", "A100")
    assert doc["environment"]["stack"]["planned"] is False
    [gd401] = [f for f in doc["models"][0]["findings"] if f["code"] == "GD401"]
    assert gd401["severity"] == "warning" and gd401["details"] == {"peft": "0.11.1"}
    assert "peft 0.11.1 is installed" in gd401["message"] and "peft>=0.12" in gd401["fix"]
    assert doc["models"][0]["recommendation"]["frameworks"]["peft"]["cast_adapters_to_fp32"] is True


def test_use_cache_in_a_training_config_is_an_error_with_the_installed_transformers_450(legacy_python, tmp_path):
    hub = HubCache(tmp_path / "hub")
    hub.add("google/gemma-3-12b-it", {"config.json": gemma3_12b_config(), "generation_config.json": generation_config()})
    args = tmp_path / "args.json"
    args.write_text(json.dumps({"bf16": True, "use_cache": True}))
    doc = _check(legacy_python, hub, "google/gemma-3-12b-it", "--gpu", "A100", "--training-config", str(args))
    assert doc["environment"]["stack"]["packages"]["transformers"]["version"] == "4.50.0"
    [f] = [f for f in doc["models"][0]["findings"] if f["code"].startswith("GD6")]
    assert (f["code"], f["severity"], f["key"]) == ("GD606", "error", "use_cache")
    assert "HybridCache" in f["message"] and "4.51.0" in f["fix"]
