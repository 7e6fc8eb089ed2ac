"""Where the rehearsal's child trains (`rehearse --device`) and how `--real-weights` is held against the memory plan:
the child's environment, the device it settles on, the planned run it measures, and the judgement and the view of the
measured peak against the plan. Cheap: no child process, a tiny in-process model for the measured step.
The GPU side of the same code ran on an H200 (docs/rehearsal.md, "On a GPU, second run"); this machine has none."""

from __future__ import annotations

from pathlib import Path

import pytest

from gemma_doctor.rehearse import invariants
from gemma_doctor.rehearse.process import _environment
from gemma_doctor.rehearse.runner import Rehearsal, _measurable
from gemma_doctor.render import rehearse as view

GIB = 2**30


@pytest.mark.parametrize("user", [None, "1", ""])
def test_cpu_hides_every_gpu_and_auto_keeps_the_users_choice(tmp_path, monkeypatch, user):
    if user is None:
        monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    else:
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", user)
    assert _environment(tmp_path, "cpu")["CUDA_VISIBLE_DEVICES"] == ""
    for device in ("auto", "cuda"):
        env = _environment(tmp_path, device)
        # before --device, the child always got "" when the user had set nothing: no GPU was ever used
        assert env.get("CUDA_VISIBLE_DEVICES") == user


def test_the_device_settles_in_the_child():
    torch = pytest.importorskip("torch")
    from gemma_doctor.rehearse.driver import _device

    assert _device("cpu") == "cpu"
    assert _device("auto") == ("cuda" if torch.cuda.is_available() else "cpu")
    if not torch.cuda.is_available():
        with pytest.raises(RuntimeError, match=r"--device cuda: torch .* sees no CUDA device here"):
            _device("cuda")


def _plan(**run):
    base = {"method": "lora", "batch_size": 4, "seq_len": 1024, "lora_r": 16, "lora_targets": ["q_proj"],
            "gradient_checkpointing": True, "load_dtype": "bfloat16", "num_gpus": 1, "chunked_loss": False,
            "optimizer": "adamw_torch_fused"}
    return {"tensor_bytes": 10 * GIB, "summary": "LoRA r=16 ...", "run": {**base, **run}}


def test_the_measured_step_is_the_planned_run_or_none():
    got, why = _measurable(_plan())
    assert why is None and got == {"method": "lora", "batch_size": 4, "seq_len": 1024, "lora_r": 16, "lora_targets": ["q_proj"],
                   "gradient_checkpointing": True, "load_dtype": "bfloat16"}
    assert _measurable(_plan(method="full"))[0]["method"] == "full"
    # runs the step cannot execute as planned, each with its reason: 4-bit loading, sharding over GPUs, TRL's chunks
    for run, reason in (({"method": "qlora"}, "unquantized"), ({"num_gpus": 2}, "one device"),
                        ({"chunked_loss": True}, "chunked log-probs"),
                        ({"liger_dpo_loss": True}, "Liger's fused DPO loss")):  # one pair's logits planned
        got, why = _measurable(_plan(**run))
        assert got is None and reason in why, run
    assert _measurable(None) == (None, None) and _measurable({"run": {}}) == (None, None)


def _record(peak: int, **extra):
    return {"stage": "real-weights", "status": "ok", "device": "cuda", "dtype": "bfloat16", "seq_len": 1024,
            "batch": 4, "lora": True, "peak_bytes": peak, "peak_source": "cuda.max_memory_allocated",
            "act_absmax": 40.0, "grad_absmax": 1.0, "fp16_overflow": False, "nonfinite": False,
            "fp16_headroom": 1600.0, **extra}


def test_the_peak_is_held_against_the_plan_and_the_device():
    codes = lambda r: {f.code for f in invariants.judge([r], [])}  # noqa: E731
    assert codes(_record(10 * GIB, plan_tensor_bytes=10 * GIB, device_bytes=80 * GIB)) == {"GD985"}
    over = invariants.judge([_record(12 * GIB, plan_tensor_bytes=10 * GIB, device_bytes=80 * GIB)], [])
    assert {f.code for f in over} == {"GD985", "GD983"}
    assert "1.20x the memory plan's 10.00 GiB" in next(f.message for f in over if f.code == "GD983")
    assert "GD982" in codes(_record(90 * GIB, plan_tensor_bytes=10 * GIB, device_bytes=80 * GIB))
    # no plan, no device: nothing to hold it against (the CPU, a chunked TRL run)
    assert codes(_record(12 * GIB)) == {"GD985"}


def test_the_view_says_where_it_ran_and_the_plan_beside_the_peak():
    r = Rehearsal("t", "google/x", "transformers", stack={"torch": "2.11.0", "device": "cuda", "gpu": "NVIDIA H200",
                                                         "compute_capability": "9.0"},
                  stages=[_record(int(10.5 * GIB), plan_tensor_bytes=10 * GIB)])
    text = view.render_text(r)
    head = text.splitlines()[0]
    assert head.endswith("torch 2.11.0; on NVIDIA H200 (compute capability 9.0)") and "device" not in head
    assert "peak 10.50 GiB (cuda.max_memory_allocated) against the plan's 10.00 GiB (x1.05)" in text
    cpu = Rehearsal("t", "google/x", "transformers", stack={"torch": "2.13.0", "device": "cpu"})
    assert view.render_text(cpu).splitlines()[0].endswith("torch 2.13.0; on the CPU")


def test_the_measured_step_takes_the_runs_lora_checkpointing_and_optimizer(tmp_path):
    torch = pytest.importorskip("torch")
    pytest.importorskip("peft")
    from gemma_doctor.rehearse.realweights import measure_step
    from tests import tiny_family

    torch.set_num_threads(1)
    folder = tiny_family.save("gemma3_text", tmp_path / "plain")
    base = measure_step(folder, seq_len=16, dtype="float32", lora=True)
    q = measure_step(folder, seq_len=16, dtype="float32", lora=True, lora_r=16, lora_targets=["q_proj"],
                     gradient_checkpointing=True, optimizer_step=True)
    full = measure_step(folder, seq_len=16, dtype="float32", lora=False, optimizer_step=True)
    txt = tiny_family.TXT
    q_out = txt["num_attention_heads"] * txt.get("head_dim", txt["hidden_size"] // txt["num_attention_heads"])
    assert q["lora_r"] == 16 and q["gradient_checkpointing"] and q["optimizer_step"]
    # LoRA r 16 on q_proj alone: A (16 x hidden) + B (q_out x 16) per layer
    assert q["trainable_params"] == txt["num_hidden_layers"] * 16 * (txt["hidden_size"] + q_out)
    assert q["trainable_params"] < base["trainable_params"]  # against r 8 on every linear
    assert full["lora_r"] is None and full["trainable_params"] > base["trainable_params"]
    assert all(r["loss"] == r["loss"] and r["peak_bytes"] > 0 and not r["oom"] for r in (base, q, full))


def _write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def _plan_of(tmp_path: Path, config: Path):
    import json

    from gemma_doctor.rehearse.runner import plan_for

    folder = tmp_path / "google--tiny"
    folder.mkdir(exist_ok=True)
    (folder / "config.json").write_text(json.dumps({"architectures": ["Gemma3ForCausalLM"], "model_type": "gemma3_text"}))
    return plan_for(str(folder), None, "main", config, 3)


def test_a_dpo_config_given_as_the_training_config_is_rehearsed_as_dpo(tmp_path):
    # before: any config with a TRL key (max_length) was rehearsed as an SFT run, DPO only through --launch
    dpo = _write(tmp_path, "dpo.yaml", "beta: 0.1\nloss_type: sigmoid\nmax_length: 256\nbf16: true\n")
    plan, findings, _, _ = _plan_of(tmp_path, dpo)
    assert plan["trainer"] == "trl-dpo" and not [f for f in findings if f.code == "GD951"]
    sft = _write(tmp_path, "sft.yaml", "max_length: 256\nbf16: true\nstage: sft\n")
    assert _plan_of(tmp_path, sft)[0]["trainer"] == "trl-sft" and not _plan_of(tmp_path, sft)[1]


def test_a_grpo_config_is_rehearsed_as_grpo_on_the_readers_decision(tmp_path):
    # before (round 3): a GD951 note "not rehearsable here: a GRPO run" and a plain run; tests/test_rehearse_grpo.py
    # holds the GRPO run itself
    from gemma_doctor.readers import training_config

    grpo = _write(tmp_path, "grpo.yaml", "num_generations: 8\nmax_completion_length: 128\nbf16: true\n")
    assert training_config.load(str(grpo)).get("rl").value == "grpo"  # check's reader: one decision for both
    plan, findings, _, _ = _plan_of(tmp_path, grpo)
    assert plan["trainer"] == "trl-grpo" and not [f for f in findings if f.code == "GD951"]
