"""`rehearse TARGET --launch "torchrun --nproc-per-node 2 train.py --deepspeed ds.json"`: the user's own Trainer under
DeepSpeed on 2 CPU (gloo) ranks (docs/rehearsal.md, "DeepSpeed on 2 CPU ranks").

DeepSpeed 0.19.8 and its small dependencies come from tests/venvs.py (beside the main venv's pinned stack, on
PYTHONPATH); the twin is kept beside the module (GEMMA_DOCTOR_TWIN_CACHE) and each run copies it. DeepSpeed's
shared-memory op, which its CPU ranks JIT-built at every first start (minutes of g++), is not built: the probe starts
DeepSpeed's backend without it, as on a GPU. Two children (a healthy ZeRO-3 LoRA run, a config DeepSpeed's integration
refuses) and the op's absence in a launched process, marked slow; the rules of a kept JIT build (the CPU optimizers of
an offloading config are still built) are checked without DeepSpeed.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from gemma_doctor.rehearse import kept
from tests.kept_twins import kept_twin
from tests.test_rehearse import model_folder
from tests.venvs import ensure_deepspeed

SCRIPTS = Path(__file__).resolve().parent / "scripts" / "launch"
REPO = "google/tiny-gemma3_text"  # model_folder's folder google--tiny-gemma3_text names this repo id
# A ZeRO config as the Trainer's integration takes it: "auto" filled from TrainingArguments.
ZERO = {"zero_optimization": {"stage": 2, "overlap_comm": False, "contiguous_gradients": True},
        "bf16": {"enabled": "auto"}, "train_micro_batch_size_per_gpu": "auto", "gradient_accumulation_steps": "auto",
        "gradient_clipping": "auto", "train_batch_size": "auto"}


@pytest.fixture(scope="module")
def target(tmp_path_factory) -> Path:
    return model_folder(tmp_path_factory.mktemp("target"), "gemma3_text")


@pytest.fixture(scope="module")
def deepspeed_here(tmp_path_factory, target):
    """DeepSpeed importable by the rehearsal (this process looks it up, the ranks import it) with `ninja` on PATH; the
    twin kept where run_script copies it from. No JIT build of DeepSpeed's is kept there: the ranks build none (the
    probe starts DeepSpeed's backend without its shared-memory op, as on a GPU)."""
    packages = ensure_deepspeed()
    folder = kept_twin(tmp_path_factory, target, 2)
    with pytest.MonkeyPatch.context() as mp:
        mp.syspath_prepend(str(packages))
        mp.setenv("PYTHONPATH", str(packages))
        mp.setenv("PATH", f"{packages / 'bin'}{os.pathsep}{os.environ.get('PATH', '')}")
        mp.setenv(kept.ENV, str(folder))
        yield folder


def launch(cli, target: Path, tmp_path: Path, monkeypatch, config: dict) -> tuple[int, dict]:
    (tmp_path / "ds.json").write_text(json.dumps(config))
    monkeypatch.chdir(SCRIPTS)
    got = cli("rehearse", target, "--launch",
              f"torchrun --nproc-per-node 2 train_hf.py {REPO} --deepspeed {tmp_path / 'ds.json'}", "--steps", "2",
              "--device", "cpu", "--format", "json")
    return got.code, got.json()["rehearsals"][0]


@pytest.mark.slow
# ZeRO-3 only: ZeRO-2 takes the same path less the partitioned parameters (measured in docs/rehearsal.md, 648 s cold
# and 99 s with the build kept); each child here is about a minute of CI on 2 cores.
@pytest.mark.parametrize("stage", [3])
def test_a_healthy_zero_lora_run_rehearses_the_users_trainer_on_two_cpu_ranks(cli, target, tmp_path, monkeypatch,
                                                                              deepspeed_here, stage):
    """ZeRO-3 holds each parameter as an empty tensor beside its shard: the probe read them as they were (a false
    GD957 on both ranks: "The size of tensor a (32) must match the size of tensor b (0)"), and rank 0's reload and
    generation alone hung both ranks (zero.Init, synced_gpus); measured on the pinned stack before the mend."""
    code, doc = launch(cli, target, tmp_path, monkeypatch, {**ZERO, "zero_optimization": {
        **ZERO["zero_optimization"], "stage": stage}})
    assert doc["findings"] == [] and code == 0, doc["findings"]
    by = {s["stage"]: s for s in doc["stages"]}
    assert by["setup"]["ranks"] == 2 and by["setup"]["trainer"] == "Trainer"
    assert by["setup"]["sharding"] == f"deepspeed zero {stage}"  # the Trainer did shard with DeepSpeed
    assert [by[name]["status"] for name in ("labels", "train", "eval", "save", "generate", "merge")] == ["ok"] * 6
    # the user's Trainer trained under DeepSpeed: finite losses, every LoRA B matrix moved, the checkpoint reloads
    train = by["train"]
    assert len(train["losses"]) == 2 and train["moved"] == train["trainable"] > 0
    assert train["lora_b"]["moved"] == train["lora_b"]["count"] > 0
    assert by["accumulation"]["status"] == "skipped"  # one process only: said, not silently dropped
    # trained without DeepSpeed's shared-memory op: no rank built it, so no finished build was kept beside the twin
    assert not list(deepspeed_here.glob("torch_extensions-*")), list(deepspeed_here.iterdir())



@pytest.mark.slow
@pytest.mark.usefixtures("deepspeed_here")
def test_a_config_deepspeed_refuses_is_the_crash_of_its_stage_on_every_rank(cli, target, tmp_path, monkeypatch):
    """A JSON whose micro-batch is not the script's (4 against per_device_train_batch_size 2): the Trainer's DeepSpeed
    integration refuses it on each rank before the engine is built (reproduced on the pinned stack)."""
    code, doc = launch(cli, target, tmp_path, monkeypatch, {**ZERO, "train_micro_batch_size_per_gpu": 4})
    assert code == 1 and {f["code"] for f in doc["findings"]} == {"GD957"}, doc["findings"]
    lines = sorted(f["message"] for f in doc["findings"])
    assert [line.split("] ")[0].rsplit("[", 1)[1] for line in lines] == ["rank 0", "rank 1"]
    assert all("mismatch TrainingArguments" in line for line in lines), lines


@pytest.mark.slow
def test_deepspeed_starts_on_cpu_ranks_without_building_its_shared_memory_op(tmp_path):
    """In a launched process (the probe armed by its sitecustomize) DeepSpeed's torch backend gets no shared-memory op,
    as on a GPU, where the CUDA accelerator has none: nothing is JIT-built (a compiler that always fails is named, so
    a build fails at once instead of taking minutes of g++), and DeepSpeed's all-reduce falls back to the process
    group's. Before, `build_shm_op()` built `deepspeed_shm_comm` at every first start on CPU ranks."""
    from gemma_doctor.rehearse.launch import HOOK
    from gemma_doctor.rehearse.process import _environment

    packages = ensure_deepspeed()
    (tmp_path / "plan.json").write_text(json.dumps({"root": str(tmp_path), "events": str(tmp_path / "events.jsonl")}))
    env = _environment(tmp_path, "cpu")
    env.update({"GEMMA_DOCTOR_LAUNCH_PLAN": str(tmp_path / "plan.json"), "CXX": "false", "CC": "false",
                "PYTHONPATH": os.pathsep.join((str(HOOK), str(packages), env["PYTHONPATH"]))})
    (tmp_path / "tmp").mkdir()
    # deepspeed.comm's `from .comm import *` rebinds its attribute `torch` to torch itself: the module by its name
    code = ("import importlib; backend = importlib.import_module('deepspeed.comm.torch'); "
            "print('op:', backend.build_shm_op())")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=600)
    assert done.returncode == 0 and done.stdout.strip().splitlines()[-1] == "op: None", done.stderr[-2000:]
    assert not (tmp_path / "torch_extensions").exists() or not any((tmp_path / "torch_extensions").iterdir())


# -- the JIT builds the rehearsal keeps (no DeepSpeed needed) ---------------------------------------------------------
def test_every_rehearsal_child_builds_torch_extensions_in_its_own_folder(tmp_path, monkeypatch):
    """Never the user's ~/.cache/torch_extensions, where a build killed mid-way leaves a lock later builds wait on."""
    from gemma_doctor.rehearse.process import _environment

    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path / "users"))
    monkeypatch.setenv("DS_ACCELERATOR", "cuda")
    env = _environment(tmp_path / "root", "cpu")
    assert env["TORCH_EXTENSIONS_DIR"] == str(tmp_path / "root" / "torch_extensions")
    assert env["DS_ACCELERATOR"] == "cpu"


def built(folder: Path, name: str, library: bool = True, lock: bool = False) -> Path:
    """A torch JIT build folder as cpp_extension.load leaves it (library, objects, ninja files), or one cut short."""
    build = folder / name
    build.mkdir(parents=True)
    for file in ("build.ninja", ".ninja_log", "shm.o", *((f"{name}.so",) if library else ()), *(("lock",) if lock
                                                                                                  else ())):
        (build / file).write_text(file)
    return build


def test_a_finished_build_is_kept_and_copied_with_its_file_times_and_without_a_lock(tmp_path, monkeypatch):
    twins, first, second = tmp_path / "twins", tmp_path / "first", tmp_path / "second"
    twins.mkdir()
    build = built(first, "deepspeed_shm_comm")
    built(first, "cut_short", library=False)  # a build the deadline cut: not kept
    old = 1_600_000_000
    for f in build.iterdir():
        os.utime(f, (old, old))
    kept.keep_extensions(twins, first)
    (kept_folder,) = twins.iterdir()
    assert sorted(p.name for p in kept_folder.iterdir()) == ["deepspeed_shm_comm"]
    # a lock found in the kept folder (a copy made while a build held it) is never copied into a rehearsal's folder
    (kept_folder / "deepspeed_shm_comm" / "lock").write_text("")
    assert kept.find_extensions(twins, second)
    copied = second / "deepspeed_shm_comm"
    assert sorted(p.name for p in copied.iterdir()) == sorted(p.name for p in build.iterdir())
    assert {int(p.stat().st_mtime) for p in copied.iterdir()} == {old}  # ninja then finds it up to date
    assert kept.unfinished(first) == ["cut_short"] and kept.unfinished(second) == []


def test_a_build_still_holding_its_lock_is_not_kept(tmp_path):
    twins = tmp_path / "twins"
    twins.mkdir()
    built(tmp_path / "run", "deepspeed_shm_comm", lock=True)
    kept.keep_extensions(twins, tmp_path / "run")
    assert list(twins.iterdir()) == [] and not kept.find_extensions(twins, tmp_path / "next")
