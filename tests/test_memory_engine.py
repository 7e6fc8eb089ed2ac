"""The memory plan counts what the Run's engine does (issue 32): DeepSpeed's mixed precision and offload, FSDP's offload,
held against DeepSpeed 0.19.8's own estimators (run in a child process beside the main venv, as tests/venvs.py
builds DeepSpeed for the rehearsal), and a training config's written offload reaching `check --format json`."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from gemma_doctor.plan import memory
from gemma_doctor.run import Settings
from tests.builders import gemma3_1b_config
from tests.venvs import ensure_deepspeed

# A few Gemma sizes: the smallest (where the tied embedding is a third of the model) to the largest.
SIZES = (("gemma3", "1b"), ("gemma3", "4b"), ("gemma3", "12b"), ("gemma3", "27b"), ("gemma2", "9b"))
GPUS = 8
# (stage, offload_optimizer, offload_params): DeepSpeed's estimators know no parameter offload without optimizer offload.
CASES = ((2, False, False), (2, True, False), (3, False, False), (3, True, False), (3, True, True))
# What DeepSpeed's estimators call model states: parameters, gradients, optimizer states (and ZeRO's fp32 copies), with
# the units gathered whole.
STATES = ("weights", "towers", "gathered_root_unit", "gradients", "unsharded_root_gradient", "optimizer_states",
          "fp32_master_copies")

_ESTIMATE = """
import json, sys
from deepspeed.runtime.zero.stage3 import estimate_zero3_model_states_mem_needs
from deepspeed.runtime.zero.stage_1_and_2 import estimate_zero2_model_states_mem_needs
out = []
for total, largest, gpus, stage, opt, par in json.loads(sys.stdin.read()):
    if stage == 2:
        out.append(estimate_zero2_model_states_mem_needs(total, gpus, 1, cpu_offload=opt)[1])
    else:
        out.append(estimate_zero3_model_states_mem_needs(total, largest, gpus, 1, cpu_offload=opt,
                                                        cpu_offload_params=par)[1])
print(json.dumps(out))
"""


def _run(shape: memory.ModelShape, stage: int, opt: bool, par: bool) -> memory.MemoryPlan:
    # One token: activations and logits are negligible, the model states are what is left.
    return memory.plan(shape, Settings(method="full", precision="bf16", load_dtype="float32", batch_size=1,
                                             seq_len=1, num_gpus=GPUS, zero_stage=stage, offload_optimizer=opt,
                                             offload_params=par, text_only=False, device="cpu"))


@pytest.fixture(scope="module")
def estimates() -> dict[tuple[str, str, int, bool, bool], int]:
    """DeepSpeed's GPU estimate for every size and case, its largest layer the embedding (model_to_params takes the
    module with most parameters of its own: a Gemma's tied embedding)."""
    rows, keys = [], []
    for family, size in SIZES:
        p = memory.published_shape(family, size).params
        for stage, opt, par in CASES:
            rows.append((p.total, p.embed, GPUS, stage, opt, par))
            keys.append((family, size, stage, opt, par))
    env = {**os.environ, "PYTHONPATH": str(ensure_deepspeed())}
    done = subprocess.run([sys.executable, "-c", _ESTIMATE], input=json.dumps(rows), capture_output=True, text=True,
                          env=env, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    return dict(zip(keys, json.loads(done.stdout.strip().splitlines()[-1])))


@pytest.mark.parametrize("family,size", SIZES)
@pytest.mark.parametrize("stage,opt,par", CASES)
def test_the_model_states_are_deepspeeds_own_estimate(estimates, family, size, stage, opt, par):
    """ZeRO-2: at the optimizer step (nothing in flight) exactly DeepSpeed's 2 + 18/n bytes per parameter (the 16-bit
    parameters on every rank; 16-bit and fp32 gradients, fp32 parameters and Adam states of the partition), 2 with the
    optimizer offloaded. ZeRO-3: at the embedding's backward, DeepSpeed's 4 bytes of its largest layer (the embedding
    gathered, and its 16-bit gradient) + 18/n (2/n with the optimizer offloaded, 0 with the parameters too), and the
    plan holds more by what it counts and the estimator does not, no more: the two decoder layers gathered (the one
    computed, the one prefetched) and, without offload, the fp32 gradient partition (ZeRO-3's 18 leaves it out, ZeRO-2's
    counts it) less the root's own gradient shard (the root's gradient is counted whole once)."""
    shape = memory.published_shape(family, size)
    p = shape.params
    plan = _run(shape, stage, opt, par)
    est = estimates[(family, size, stage, opt, par)]
    if stage == 2:
        held = sum(v for k, v in plan.phases["optimizer-step"].items() if k in STATES)
        assert abs(held - est) <= GPUS, (held, est)  # integer division per term
        return
    held = sum(v for k, v in plan.phases["embedding-backward"].items() if k in STATES)
    layers = 2 * 2 * ((p.linear + p.other) // shape.layers)
    extra = layers + (0 if opt else 2 * p.total // GPUS - 2 * (p.embed + p.per_layer_embed + p.lm_head) // GPUS)
    assert abs(held - (est + extra)) <= 4 * GPUS, (held, est, extra)
    assert est <= held <= 1.3 * est


def test_deepspeed_casts_to_16_bits_and_keeps_fp32_copies_where_fsdp_trains_as_loaded():
    shape = memory.published_shape("gemma3", "1b")
    n = shape.params.total
    base = dict(method="full", precision="bf16", load_dtype="float32", batch_size=1, seq_len=1, num_gpus=4,
                device="cpu")
    ds = memory.plan(shape, Settings(**base, zero_stage=2)).phases["optimizer-step"]
    assert ds["weights"] == 2 * n and ds["fp32_master_copies"] == 8 * n // 4 and ds["optimizer_states"] == 8 * n // 4
    fsdp = memory.plan(shape, Settings(**base, zero_stage=2, fsdp=True)).phases["optimizer-step"]
    assert "fp32_master_copies" not in {k for k, v in fsdp.items() if v} and fsdp["optimizer_states"] == 8 * n // 4


def test_fsdp_offload_params_leaves_shards_gradients_and_the_step_on_the_cpu():
    shape = memory.published_shape("gemma3", "4b")
    base = dict(method="full", precision="bf16", load_dtype="bfloat16", batch_size=1, seq_len=1, num_gpus=4,
                zero_stage=3, fsdp=True, device="cpu")
    on = memory.plan(shape, Settings(**base)).phases
    off = memory.plan(shape, Settings(**base, offload_params=True))
    step = off.phases["optimizer-step"]
    p = shape.params
    layers = 2 * 2 * ((p.linear + p.other) // shape.layers)
    assert step["weights"] == layers and step["towers"] == step["gradients"] == step["optimizer_states"] == 0
    assert off.phases["embedding-backward"]["unsharded_root_gradient"] == on["embedding-backward"][
        "unsharded_root_gradient"]
    assert any("FSDP offload_params" in a for a in off.assumptions)


def _check(cli, hub, tmp_path, name: str, text: str, *extra: str) -> dict:
    if not list(hub.root.glob("models--google--gemma-3-1b-it")):
        hub.add("google/gemma-3-1b-it", {"config.json": gemma3_1b_config()})
    (tmp_path / name).write_text(text)
    r = cli("check", "--cache-dir", hub.root, "--gpu", "A100", "--num-gpus", "4", "--training-config",
            tmp_path / name, "--format", "json", "--fail-on", "never", *extra)
    assert r.code == 0, r
    return r.json()["models"][0]["memory"]


@pytest.mark.parametrize("offload,what", [({"offload_param": {"device": "cpu"}}, "offload_params"),
                                           ({"offload_optimizer": {"device": "nvme"}}, "offload_optimizer")])
def test_a_deepspeed_configs_written_offload_changes_checks_memory(cli, hub, tmp_path, offload, what):
    """Before: ZeRO-3's offload_param reached the Run but not the plan (every parameter shard counted on the GPU)."""
    head = ("per_device_train_batch_size: 1\nmax_length: 512\nbf16: true\ngradient_checkpointing: true\n"
            "deepspeed: {}\n")
    zero = {"stage": 3}
    (tmp_path / "plain.json").write_text(json.dumps({"bf16": {"enabled": True}, "zero_optimization": zero}))
    (tmp_path / "off.json").write_text(json.dumps({"bf16": {"enabled": True}, "zero_optimization": {**zero, **offload}}))
    plain = _check(cli, hub, tmp_path, "plain.yaml", head.format(tmp_path / "plain.json"))
    off = _check(cli, hub, tmp_path, "off.yaml", head.format(tmp_path / "off.json"))
    assert off["run"][what] is True and plain["run"][what] is False
    assert off["run"]["sources"][what].startswith("training config deepspeed")
    assert off["per_gpu_bytes"] < plain["per_gpu_bytes"]
    if what == "offload_params":
        assert off["components"]["weights"] < plain["components"]["weights"]
    else:  # the states, ZeRO's fp32 copies and the gradient partitions (before: the gradients stayed)
        assert {"optimizer_states", "fp32_master_copies", "gradients"} & set(off["components"]) == set()
        assert {"optimizer_states", "fp32_master_copies", "gradients"} <= set(plain["components"])


def test_trainingarguments_fsdp_offload_word_is_fsdps_parameter_offload(cli, hub, tmp_path):
    """Before: `fsdp: "full_shard auto_wrap offload"` (TrainingArguments' FSDPOption.OFFLOAD) was read as FULL_SHARD
    without offload: the Run said no offload and the plan held every shard and the optimizer states on the GPU."""
    head = "per_device_train_batch_size: 1\nmax_length: 512\nbf16: true\ngradient_checkpointing: true\n"
    plain = _check(cli, hub, tmp_path, "plain.yaml", head + "fsdp: full_shard auto_wrap\n")
    off = _check(cli, hub, tmp_path, "off.yaml", head + "fsdp: full_shard auto_wrap offload\n")
    assert off["run"]["offload_params"] is True and off["run"]["sources"]["offload_params"] == "training config fsdp"
    assert off["per_gpu_bytes"] < plain["per_gpu_bytes"] and "optimizer_states" not in off["components"]


# --- evaluation ------------------------------------------------------------------------------------------------------

EVAL_HEAD = "per_device_train_batch_size: 1\nmax_length: 1024\nbf16: true\ngradient_checkpointing: true\n"


@pytest.mark.parametrize("written,peak,kept,said", [
    # The eval batch's b*s*V logits at its loss outweigh the training step's (batch 1): the evaluation moment is the peak.
    ("per_device_eval_batch_size: 8\n", "evaluation", False, "keeps none without compute_metrics"),
    ("per_device_eval_batch_size: 8\nprediction_loss_only: true\n", "evaluation", False,
     "training config prediction_loss_only"),
    # Predictions kept and never moved: they grow with the eval set (a lower bound counted, and said).
    ("per_device_eval_batch_size: 8\nprediction_loss_only: false\n", "evaluation", True, "grows with the eval set"),
    ("per_device_eval_batch_size: 8\nprediction_loss_only: false\neval_accumulation_steps: 3\n", "evaluation", True,
     "for 3 batches (training config eval_accumulation_steps"),
])
def test_the_evaluation_moment_is_planned_where_the_config_writes_it(cli, hub, tmp_path, written, peak, kept, said):
    """Before: the Run read the evaluation batch, kept predictions and eval accumulation, and no memory term did."""
    plain = _check(cli, hub, tmp_path, "plain.yaml", EVAL_HEAD)
    mem = _check(cli, hub, tmp_path, "eval.yaml", EVAL_HEAD + written)
    assert plain["peak"] != "evaluation" and mem["peak"] == peak
    assert mem["run"]["eval_batch"] == 8 and mem["run"]["sources"]["eval_batch"] == \
        "training config per_device_eval_batch_size"
    assert ("kept_predictions" in mem["components"]) is kept
    assert mem["per_gpu_bytes"] > plain["per_gpu_bytes"]
    assert any(said in a for a in mem["assumptions"]), mem["assumptions"]


def test_eval_accumulation_bounds_the_kept_predictions():
    shape = memory.published_shape("gemma3", "1b")
    base = dict(method="lora", batch_size=1, seq_len=1024, eval_batch=2, keeps_predictions=True)
    kept = {k: memory.plan(shape, Settings(**base, eval_accumulation=k)).phases["evaluation"] for k in (1, 4, 16)}
    unit = 2 * 1024 * shape.vocab * 4  # one batch's fp32 predictions
    assert kept[1].get("kept_predictions", 0) == 0 and kept[1]["eval_logits"] > 0  # moved after every batch
    assert kept[4]["kept_predictions"] == 8 * unit and kept[16]["kept_predictions"] == 32 * unit
    gpus = memory.plan(shape, Settings(**base, eval_accumulation=4, num_gpus=4)).phases["evaluation"]
    assert gpus["kept_predictions"] == 4 * 8 * unit  # gather_for_metrics: every rank holds every rank's batch


def test_what_the_plan_keeps_is_what_transformers_trainer_keeps(monkeypatch, tmp_path):
    """A real Trainer.evaluate (transformers of the pinned stack) on a tiny Gemma 3: the predictions EvalLoopContainer
    holds on the device are one fp32 b*s*V tensor per batch, concatenated until eval_accumulation_steps moves them, and
    nothing without compute_metrics; the plan's kept predictions are those batches (and, at the k-th concatenation,
    the k-1 before it and the new one)."""
    import torch
    from transformers import Gemma3ForCausalLM, Gemma3TextConfig, Trainer, TrainingArguments, trainer_pt_utils

    held: list[int] = []
    add = trainer_pt_utils.EvalLoopContainer.add

    def watched(self, tensors):
        add(self, tensors)
        if isinstance(self.tensors, torch.Tensor) and self.tensors.dim() == 3:
            held.append(self.tensors.numel() * self.tensors.element_size())

    monkeypatch.setattr(trainer_pt_utils.EvalLoopContainer, "add", watched)
    vocab, seq, batch, k = 256, 16, 2, 3
    torch.manual_seed(0)
    model = Gemma3ForCausalLM(Gemma3TextConfig(vocab_size=vocab, hidden_size=32, intermediate_size=64,
                                               num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1,
                                               head_dim=16, sliding_window=16, max_position_embeddings=64))
    rows = [{"input_ids": torch.randint(0, vocab, (seq,)), "labels": torch.randint(0, vocab, (seq,))} for _ in range(8)]

    def evaluate(metrics, steps):
        held.clear()
        args = TrainingArguments(output_dir=str(tmp_path), per_device_eval_batch_size=batch, use_cpu=True,
                                 eval_accumulation_steps=steps, report_to=[])
        Trainer(model=model, args=args, eval_dataset=rows, compute_metrics=metrics).evaluate()
        return list(held)

    assert evaluate(None, None) == []  # evaluate() keeps nothing without compute_metrics
    metrics = lambda p: {"n": float(len(p.predictions))}  # noqa: E731
    unit = batch * seq * vocab * 4
    assert evaluate(metrics, None) == [unit * i for i in range(1, 5)]  # grows with the eval set
    assert max(evaluate(metrics, k)) == k * unit
    shape = memory.shape_from_config(model.config.to_dict())
    plan = memory.plan(shape, Settings(method="full", precision="fp32", load_dtype="float32", batch_size=1,
                                             seq_len=seq, eval_batch=batch, keeps_predictions=True,
                                             eval_accumulation=k, device="cpu"))
    kept = plan.phases["evaluation"]["kept_predictions"]
    assert kept in ((k - 1) * unit, 2 * k * unit)
    assert plan.phases["evaluation"].get("eval_logits", 0) == 0 or kept == (k - 1) * unit
    none = memory.plan(shape, Settings(method="full", precision="fp32", load_dtype="float32", batch_size=1,
                                             seq_len=seq, eval_batch=batch, device="cpu"))
    assert "kept_predictions" not in none.phases["evaluation"]


def test_gd801_names_the_evaluation_settings_where_evaluation_is_the_peak(cli, hub, tmp_path):
    """The training settings the search varies do not lower an evaluation peak: GD801's fix names what does first."""
    hub.add("google/gemma-3-1b-it", {"config.json": gemma3_1b_config()})
    (tmp_path / "eval.yaml").write_text(EVAL_HEAD + "per_device_eval_batch_size: 8\nprediction_loss_only: false\n")
    r = cli("check", "--cache-dir", hub.root, "--gpu", "L4", "--training-config", tmp_path / "eval.yaml", "--format",
            "json", "--fail-on", "never")
    [gd801] = [f for f in r.json()["models"][0]["findings"] if f["code"] == "GD801"]
    assert gd801["fix"].startswith("the peak is evaluation's kept predictions: set eval_accumulation_steps")


def test_the_summary_says_deepspeeds_16_bit_weights_and_fp32_copies_not_the_float32_load():
    """TRL's float32 load under DeepSpeed bf16: the engine casts the parameters to bfloat16 and keeps fp32 master
    copies (the plan counts them), so the line says that, in text and JSON alike, not 'bf16 with float32 weights'."""
    shape = memory.published_shape("gemma3", "1b")
    base = dict(method="full", precision="bf16", load_dtype="float32", batch_size=1, seq_len=1, num_gpus=4,
                device="cpu", sources=(("load_dtype", "training config"),))
    ds = memory.plan(shape, Settings(**base, zero_stage=2))
    assert "bf16 with bfloat16 weights and fp32 master copies," in ds.summary(), ds.summary()
    assert "float32 weights" not in ds.summary() and ds.to_json()["summary"] == ds.summary()
    fp16 = memory.plan(shape, Settings(**{**base, "precision": "fp16"}, zero_stage=3))
    assert "fp16 with float16 weights and fp32 master copies," in fp16.summary(), fp16.summary()
    # FSDP trains the parameters as loaded: the float32 load is what is held, and said.
    fsdp = memory.plan(shape, Settings(**base, zero_stage=2, fsdp=True))
    assert "bf16 with float32 weights," in fsdp.summary() and "master" not in fsdp.summary(), fsdp.summary()
