"""The Python API: gemma_doctor.diagnose(), prepare() and DoctorCallback, with a real Trainer on a tiny Gemma 3.

transformers 5.x runs in-process; transformers 4.50.0 (where the HybridCache crash lives) in the shared legacy
venv of tests/venvs.py, running the same script with this working tree's gemma_doctor.
"""

from __future__ import annotations

import importlib
import json
import subprocess
import sys
import warnings
from pathlib import Path
from types import SimpleNamespace

import pytest

import gemma_doctor
from gemma_doctor.errors import UsageError
from tests.builders import gemma3_12b_config, generation_config
from tests.venvs import ensure_venv, subprocess_env

SCRIPT = Path(__file__).parent / "scripts" / "guarded_trainer.py"
sys.path.insert(0, str(SCRIPT.parent))
import guarded_trainer  # noqa: E402


def test_import_gemma_doctor_stays_light():
    code = ("import sys, gemma_doctor; gemma_doctor.__version__; "
            "print(sorted(m for m in ('torch', 'transformers', 'typer', 'rich', 'yaml') if m in sys.modules)); "
            "gemma_doctor.prepare; gemma_doctor.diagnose; "
            "print(sorted(m for m in ('torch', 'transformers', 'typer', 'rich', 'yaml') if m in sys.modules))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    # nothing heavy on import, and the API needs none of it either until a model is handed over
    assert done.stdout.splitlines() == ["[]", "[]"]


@pytest.mark.parametrize("import_submodule_first", [False, True])
def test_diagnose_returns_the_report_the_cli_renders(hub, cli, import_submodule_first):
    hub.add("google/gemma-3-12b-it", {"config.json": gemma3_12b_config(), "generation_config.json": generation_config()})
    if import_submodule_first:
        importlib.import_module("gemma_doctor.pipeline")  # the internals loaded first must not shadow the API
    report = gemma_doctor.diagnose("google/gemma-3-12b-it", cache_dir=str(hub.root), gpu="A100",
                                   with_packages=("transformers==4.50.3",))
    assert isinstance(report, gemma_doctor.Report)
    expected = cli("check", "google/gemma-3-12b-it", "--cache-dir", hub.root, "--gpu", "A100", "--format", "json",
                   "--with", "transformers==4.50.3").json()
    got = report.to_json(gemma_doctor.report.FailOn.ERROR)
    assert json.loads(json.dumps(got)) == expected
    assert report.failed(gemma_doctor.report.FailOn.ERROR)


@pytest.fixture(scope="module")
def model():
    return guarded_trainer.tiny_gemma3()


def test_prepare_switches_use_cache_off_on_every_config_once(model):
    first = gemma_doctor.prepare(model)
    assert "config.text_config.use_cache" in first.disabled and "generation_config.use_cache" in first.disabled
    assert set(guarded_trainer.use_cache_flags(model).values()) == {False}
    assert first.family == "gemma3" and first.problems == ()
    assert gemma_doctor.prepare(model).disabled == ()  # idempotent


@pytest.mark.parametrize("args, gpu, problem", [
    (SimpleNamespace(fp16=True, bf16=False), None, "fp16=True on gemma3"),
    (SimpleNamespace(fp16=False, bf16=True, use_cpu=False), "T4", "has no native bf16"),
    ({"bf16": True}, "sm_75", "has no native bf16"),
])
def test_precision_mismatch_raises_or_warns(model, args, gpu, problem):
    with pytest.raises(gemma_doctor.PrecisionMismatch, match=problem):
        gemma_doctor.prepare(model, args, gpu=gpu)
    with pytest.warns(gemma_doctor.PrecisionWarning, match=problem):
        result = gemma_doctor.prepare(model, args, on_mismatch="warn", gpu=gpu)
    assert any(problem in p for p in result.problems)
    assert set(guarded_trainer.use_cache_flags(model).values()) == {False}


@pytest.mark.parametrize("args, gpu", [
    (SimpleNamespace(fp16=False, bf16=True, use_cpu=False), "A100"),
    (SimpleNamespace(fp16=False, bf16=True, use_cpu=True), "T4"),  # CPU autocast: the GPU does not matter
    (SimpleNamespace(fp16=False, bf16=False), "T4"),
])
def test_matching_precision_passes_silently(model, args, gpu):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert gemma_doctor.prepare(model, args, on_mismatch="warn", gpu=gpu).problems == ()


def test_on_mismatch_is_validated(model):
    with pytest.raises(ValueError, match="on_mismatch"):
        gemma_doctor.prepare(model, on_mismatch="explode")


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["unguarded", "prepare", "callback"])
def test_real_trainer_evaluates_in_bf16_with_transformers_5(mode):
    result = guarded_trainer.run(mode)
    assert result["outcome"] == "ok"
    if mode != "unguarded":
        assert set(result["use_cache"].values()) == {False}


@pytest.fixture(scope="module")
def legacy_python() -> Path:
    return ensure_venv()


@pytest.mark.slow
@pytest.mark.parametrize("mode, outcome", [
    ("unguarded", "hybridcache-crash"),
    ("prepare", "ok"),
    ("callback", "ok"),
    # documented limitation: added after the Trainer is built, the callback first acts at on_train_begin
    ("callback-added-late", "hybridcache-crash"),
])
def test_guard_cures_the_hybridcache_crash_with_transformers_450(legacy_python, mode, outcome):
    done = subprocess.run([str(legacy_python), str(SCRIPT), mode], capture_output=True, text=True, timeout=300,
                          env=subprocess_env())
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["transformers"] == "4.50.0"
    assert result["outcome"] == outcome
    if outcome == "ok":
        assert set(result["use_cache"].values()) == {False}
        assert isinstance(result["eval_loss"], float)


@pytest.mark.parametrize("gpu", ["T5", "sm_20", "A100-7GB"])
def test_prepare_refuses_a_gpu_the_cli_refuses_with_the_same_message(hub, cli, model, gpu):
    """prepare(gpu=...) took an unknown GPU silently and skipped the bf16 guard, where `check --gpu` refuses it."""
    hub.add("google/gemma-3-12b-it", {"config.json": gemma3_12b_config()})
    r = cli("check", "google/gemma-3-12b-it", "--cache-dir", hub.root, "--gpu", gpu)
    assert r.code == 2 and r.out == ""
    said = r.err.strip().removeprefix("gemma-doctor: error: ")
    args = SimpleNamespace(fp16=False, bf16=True, use_cpu=False)
    model.generation_config.use_cache = True
    before = guarded_trainer.use_cache_flags(model)
    with pytest.raises(UsageError) as raised:
        gemma_doctor.prepare(model, args, gpu=gpu)
    assert str(raised.value) == said
    assert isinstance(raised.value, ValueError)  # a bad argument value, as Python callers catch it
    assert guarded_trainer.use_cache_flags(model) == before  # refused before the model was touched
    gemma_doctor.prepare(model)
    with pytest.raises(UsageError):
        gemma_doctor.DoctorCallback(gpu=gpu)
