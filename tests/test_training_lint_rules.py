"""The training-config lint (rules/training.py) as a decision table: every clause of every GD60x condition is varied
on its own, with the other clauses held where the finding would fire, so that dropping or flipping any one of them
changes what a user is told. tests/test_training_lint.py drives the same rule through the CLI on real-world files;
this file calls the rule itself, on real config readers and real GPU facts (no mocks), to reach every branch."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gemma_doctor import pipeline
from gemma_doctor.facts import CheckOptions, Environment, ModelFacts
from gemma_doctor.family import detect
from gemma_doctor.locate import Snapshot
from gemma_doctor.plan import advice
from gemma_doctor.readers import gpu as gpu_reader
from gemma_doctor.readers import training_config
from gemma_doctor.readers.jsonfile import JsonFile
from gemma_doctor.readers.versions import Versions
from gemma_doctor.rules import training
from gemma_doctor.readers.training_config import truthy
from gemma_doctor.rules.training import GpuView, fallback_gpu, gpu_view
from tests.builders import gemma3_12b_config, gemma3n_config

GEMMA1 = {"architectures": ["GemmaForCausalLM"], "model_type": "gemma", "torch_dtype": "bfloat16"}
MODELS = {"gemma3": gemma3_12b_config(), "gemma3n": gemma3n_config(), "gemma": GEMMA1}


def _rocm_unknown_arch() -> gpu_reader.GpuFacts:
    """What the KFD probe reports for a ROCm GPU whose gfx target it does not know: bf16 unknown, and
    torch.cuda.is_bf16_supported() says True on ROCm before looking at the GPU (the emulation trap)."""
    dev = gpu_reader.GpuDevice(0, "AMD GPU", None, None, None, arch="gfx1030")
    return gpu_reader.combine([dev], "rocm", "probe", "sysfs")


def lint(settings, model="gemma3", gpu="A100", task=None, transformers="5.23.0", trl=None):
    """Findings of the training rule alone: [(code, severity, key)] in order, and the findings themselves."""
    text = json.dumps(settings, indent=2) if isinstance(settings, dict) else settings
    tc = training_config.parse(text, "train.json" if isinstance(settings, dict) else "train.yaml",
                               yaml_first=not isinstance(settings, dict))
    assert tc.ok, tc.error
    cfg = MODELS[model]
    folder = Path("model")
    facts = ModelFacts(Snapshot("x", folder), JsonFile(folder / "config.json", True, data=cfg),
                       JsonFile(folder / "generation_config.json", False), detect(cfg))
    gpu_facts = gpu if isinstance(gpu, gpu_reader.GpuFacts) else gpu_reader.resolve(gpu)
    versions = {"transformers": transformers} | ({"trl": trl} if trl else {})
    env = Environment(Versions(versions), gpu=gpu_facts, training_config=tc)
    options = CheckOptions(gpu=None, task=task)
    # check's Run of this config, resolved as the pipeline resolves it (the rule reads the trainer's defaults from it)
    rec, mem = pipeline.with_memory(facts, advice.recommendation_for(facts, gpu_facts, task, env.libraries), options,
                                    env, gpu_facts)
    facts = pipeline.with_run(facts, env, rec, mem)
    assert facts.run is not None
    found = list(training.check(facts, env, options))
    return [(f.code, f.severity.value, f.key) for f in found], found


FP32 = ("GD609", "info", None)


@pytest.mark.parametrize("settings, model, gpu, expected", [
    # the precision switches: only a truthy value turns fp16/bf16 on
    ({"fp16": False, "bf16": True}, "gemma3", "A100", []),
    ({"fp16": True}, "gemma3", "A100", [("GD602", "error", "fp16")]),
    ({"fp16": True}, "gemma", "T4", []),  # Gemma 1 fits fp16: GD602 needs an fp16-unsafe model
    ({"mixed_precision": "fp16"}, "gemma3n", "A100", [("GD602", "error", "mixed_precision")]),
    ({"fp16": True, "bf16": True}, "gemma", "A100", [("GD604", "error", "fp16")]),
    # bf16 where the GPU has no native bf16
    ({"bf16": True}, "gemma3", "T4", [("GD603", "error", "bf16")]),
    ({"bf16": True}, "gemma3", "A100", []),
    ({"bf16": "true"}, "gemma3", "T4", [("GD603", "error", "bf16")]),  # a string, but not "auto": no GD605
    ({"bf16": True, "use_cpu": False}, "gemma3", "T4", [("GD603", "error", "bf16")]),
    ({"bf16": True, "use_cpu": True}, "gemma3", "T4", []),  # CPU autocast: the GPU is not used
    ("bf16: auto\nuse_cpu: yes\n", "gemma3", "T4", []),
    # bf16: auto resolves through is_bf16_supported()
    ("bf16: auto\n", "gemma3", "T4", [("GD605", "warning", "bf16")]),  # CUDA: the emulation trap
    ("bf16: auto\n", "gemma3", "M1", [("GD605", "warning", "bf16")]),  # no native bf16, no trap
    ("bf16: auto\n", "gemma3", _rocm_unknown_arch(), [("GD605", "warning", "bf16")]),  # the trap, native unknown
    ("bf16: auto\n", "gemma3", "A100", []),
    ("bf16: Auto \n", "gemma3", "L4", []),
    # DeepSpeed's "auto" copies TrainingArguments: it sets no precision of its own
    ({"bf16": {"enabled": "auto"}, "zero_optimization": {"stage": 2}}, "gemma3", "T4", [FP32]),
    ({}, "gemma3", "T4", [FP32]),
])
def test_precision_decisions(settings, model, gpu, expected):
    assert lint(settings, model, gpu)[0] == expected


@pytest.mark.parametrize("settings, trl, gpu, expected", [
    ("max_length: 1024\n", "1.16.0", "A100", []),  # SFTConfig sets bf16 = not fp16: a bf16 run, not fp32
    ("max_length: 1024\nfp16: false\n", "1.16.0", "A100", []),  # fp16 off alone: bf16 too
    ("max_length: 1024\n", "1.16.0", "T4", [("GD603", "error", None)]),  # bf16 by TRL's default on a T4
    ("max_length: 1024\nbf16: false\n", "1.16.0", "T4", [FP32]),  # the cure: fp32 said outright
    ("max_length: 1024\nfp16: true\n", "1.16.0", "A100", [("GD602", "error", "fp16")]),
    ("max_length: 1024\n", "0.18.2", "A100", [FP32]),  # before 0.19 TRL kept TrainingArguments' fp32
    ("max_length: 1024\n", None, "A100", [FP32]),  # TRL's version unknown: GD609 names both
])
def test_a_trl_config_that_sets_no_bf16_trains_in_bf16_by_trls_default(settings, trl, gpu, expected):
    """GD609 said a TRL config without bf16 "trains in fp32 unless the launcher adds it", yet TRL >= 0.19's configs set
    `bf16 = not fp16` where bf16 is unset (TRL 1.16: SFTConfig().bf16 is True): the run trains in bf16, and on a T4
    that is GD603's emulated bf16, which passed silently."""
    got, found = lint(settings, "gemma3", gpu, trl=trl)
    assert got == expected
    if expected and expected[0][0] == "GD603":
        assert "unset: TRL's config turns it on" in found[0].message and "trl 1.16.0" in found[0].message
    if trl is None:
        assert "TRL >= 0.19 turns bf16 on" in found[0].message and "bf16: false" in found[0].fix


def test_a_deepspeed_config_is_read_as_deepspeed():
    """The DeepSpeed row above only means something if the reader takes that file for a DeepSpeed config."""
    tc = training_config.parse(json.dumps({"bf16": {"enabled": "auto"}, "zero_optimization": {"stage": 2}}),
                               "ds.json", yaml_first=False)
    assert tc.kind == "deepspeed" and tc.get("bf16").value == "auto"


def test_gd602_and_gd603_name_the_model_and_the_gpu():
    _, [f] = lint({"fp16": True}, "gemma3", "A100")
    assert "fp16 on gemma3:" in f.message
    _, [f] = lint({"bf16": True}, "gemma3", "T4")
    assert "T4 (sm_75) has no native bf16" in f.message
    assert f.fix == "set bf16 to false and train in fp32 (never fp16 for this model), or use an A100/L4/H100-class GPU"
    _, [f] = lint({"bf16": True}, "gemma", "T4")
    assert f.fix == "set bf16 to false and train in fp32, or use an A100/L4/H100-class GPU"  # Gemma 1 fits fp16


@pytest.mark.parametrize("settings, model, transformers, expected, hybrid", [
    ({"bf16": True, "use_cache": False, "gradient_checkpointing": True}, "gemma3", "4.50.0", [], None),
    ({"bf16": True, "use_cache": True}, "gemma3", "4.50.0", [("GD606", "error", "use_cache")], True),
    ({"bf16": True, "use_cache": True}, "gemma3", "5.23.0", [("GD606", "warning", "use_cache")], True),
    ({"fp16": True, "use_cache": True}, "gemma", "4.50.0", [], None),  # Gemma 1 builds no HybridCache
    ({"bf16": True, "use_cache": True}, "gemma3n", "4.50.0", [], None),  # nor does Gemma 3n
    ({"use_cache": True, "gradient_checkpointing": False}, "gemma3", "4.50.0", [FP32], None),
    # gradient checkpointing alone: a warning whatever transformers will run, and no HybridCache story
    ({"use_cache": True, "gradient_checkpointing": True}, "gemma3", "4.50.0", [FP32, ("GD606", "warning", "use_cache")], False),
    ({"bf16": True, "use_cache": True, "gradient_checkpointing": True}, "gemma3n", "4.50.0",
     [("GD606", "warning", "use_cache")], False),
])
def test_use_cache_decisions(settings, model, transformers, expected, hybrid):
    got, found = lint(settings, model, "A100" if "bf16" in settings else "T4", transformers=transformers)
    assert got == expected
    if hybrid is not None:
        [f] = [f for f in found if f.code == "GD606"]
        assert ("HybridCache" in f.message) is hybrid
        assert ('pip install "transformers>=4.51.0"' in f.fix) is (transformers == "4.50.0")


def test_use_cache_conflicts_with_checkpointing_that_trls_config_turns_on_by_default():
    """TRL's SFTConfig checkpoints where the config leaves gradient_checkpointing unset (TRL 1.16.0:
    SFTConfig().gradient_checkpointing is True): use_cache: true conflicts with it as much as with the key written
    (before: no GD606 for the config below)."""
    settings = {"max_length": 1024, "bf16": True, "use_cache": True}
    got, found = lint(settings, "gemma3n", "A100", trl="1.16.0")
    assert got == [("GD606", "warning", "use_cache")]
    assert "it conflicts with gradient checkpointing (on by the default of TRL SFTConfig" in found[0].message
    assert lint({**settings, "gradient_checkpointing": False}, "gemma3n", "A100", trl="1.16.0")[0] == []


def test_use_cache_with_fp16_tells_of_the_hybridcache_crash():
    _, found = lint({"fp16": True, "use_cache": True}, "gemma3", "A100", transformers="4.50.0")
    [f] = [f for f in found if f.code == "GD606"]
    assert f.severity.value == "error" and "with fp16: true the evaluation loop builds a HybridCache" in f.message


@pytest.mark.parametrize("settings, model, task, expected", [
    ({"bf16": True}, "gemma3", "dpo", [("GD607", "info", None)]),  # the task from --task
    ({"bf16": True, "rl": "dpo"}, "gemma3", None, [("GD607", "info", None)]),
    ({"bf16": True, "rl": "sft"}, "gemma3", "dpo", []),  # the config's own trainer wins over --task
    ({"bf16": True, "rl": "dpo"}, "gemma", None, []),  # Gemma 1 fits fp16: no divergence report
    ({"bf16": True, "rl": "dpo", "max_grad_norm": 1.0}, "gemma3", None, []),
    ({"bf16": True, "rl": "dpo", "max_grad_norm": 0}, "gemma3", None, [("GD607", "warning", "max_grad_norm")]),
    ({"bf16": True, "rl": "dpo", "max_grad_norm": True}, "gemma3", None, [("GD607", "warning", "max_grad_norm")]),
    ({"fp16": True, "rl": "orpo"}, "gemma3", None, [("GD602", "error", "fp16"), ("GD607", "warning", None)]),
    ({"bf16": True}, "gemma3", "sft", []),
])
def test_dpo_clipping_decisions(settings, model, task, expected):
    assert lint(settings, model, "A100", task=task)[0] == expected


def test_gd607_says_why_clipping_is_off_and_mentions_fp16_only_for_an_fp16_recipe():
    _, [f] = lint({"bf16": True, "rl": "dpo", "max_grad_norm": 0}, "gemma3", "A100")
    assert f.message.startswith("DPO on gemma3: max_grad_norm is 0, which turns gradient clipping off: ")
    _, [f] = lint({"bf16": True, "rl": "dpo", "max_grad_norm": True}, "gemma3", "A100")
    assert "max_grad_norm is True, which turns gradient clipping off" in f.message
    _, [_, f] = lint({"fp16": True, "rl": "orpo"}, "gemma3", "A100")
    assert f.message.startswith("ORPO on gemma3: max_grad_norm is missing (and the recipe trains in fp16): ")


TORCH_FP16 = {"bf16": True, "torch_dtype": "float16"}


@pytest.mark.parametrize("extra, model, expected", [
    ({}, "gemma3", [("GD610", "error", "torch_dtype")]),
    ({}, "gemma", []),
    ({"load_in_4bit": True}, "gemma3", [("GD608", "error", "torch_dtype")]),  # TRL: torch_dtype is the compute dtype
    ({"load_in_4bit": False}, "gemma3", [("GD610", "error", "torch_dtype")]),
    ({"quantization_bit": 4}, "gemma3", [("GD608", "error", "torch_dtype")]),  # LLaMA-Factory
    ({"quantization_bit": 8}, "gemma3", [("GD610", "error", "torch_dtype")]),  # 8-bit: no 4-bit compute dtype
    ({"adapter": "qlora"}, "gemma3", [("GD608", "error", "torch_dtype")]),
    ({"adapter": "lora"}, "gemma3", [("GD610", "error", "torch_dtype")]),
    ({"adapter": "qlora"}, "gemma", []),
])
def test_float16_loading_and_4bit_compute_dtype(extra, model, expected):
    assert lint({**TORCH_FP16, **extra}, model, "A100")[0] == expected


@pytest.mark.parametrize("compute, model, gpu, expected", [
    ("bfloat16", "gemma3", "T4", [FP32, ("GD608", "error", "bnb_4bit_compute_dtype")]),
    ("bfloat16", "gemma3", "A100", [FP32]),
    ("float32", "gemma3", "T4", [FP32]),
    ("float16", "gemma3", "A100", [FP32, ("GD608", "error", "bnb_4bit_compute_dtype")]),
    ("float16", "gemma", "T4", [FP32]),
])
def test_qlora_compute_dtype_decisions(compute, model, gpu, expected):
    got, found = lint({"load_in_4bit": True, "bnb_4bit_compute_dtype": compute}, model, gpu)
    assert got == expected
    gd608 = [f.message for f in found if f.code == "GD608"]
    if gd608:
        assert ("has no native bf16" in gd608[0]) is (compute == "bfloat16")
        assert ("activations exceed fp16's range" in gd608[0]) is (compute == "float16")


def test_qlora_without_a_compute_dtype_is_not_judged():
    assert lint({"load_in_4bit": True, "bf16": True}, "gemma3", "A100")[0] == []


@pytest.mark.parametrize("value, on", [
    (True, True), (False, False), (1, True), (1.0, True), (0, False), (2, False), (4, False), (None, False),
    ("true", True), (" Yes ", True), ("ON", True), ("1", True), ("false", False), ("no", False), ("0", False),
    ("auto", False), ([1], False), ({}, False),
])
def test_truthy_reads_switches_as_configs_spell_them(value, on):
    assert truthy(value) is on


def test_gpu_view_prefers_the_environments_gpu_then_the_gpu_option():
    t4 = gpu_reader.resolve("T4")
    assert gpu_view(Environment(Versions(), gpu=t4), CheckOptions(gpu="A100")) == GpuView(False, True, "T4 (sm_75)")
    # a CPU run (no GPU) judges nothing: bf16 is fine under CPU autocast
    assert gpu_view(Environment(Versions(), gpu=gpu_reader.resolve("none")), CheckOptions()) == GpuView(None, False, "no GPU")
    # an Environment built without GPU facts (library callers) falls back on --gpu, then on "unknown"
    assert gpu_view(Environment(Versions()), CheckOptions(gpu="T4")) == fallback_gpu("T4") == GpuView(False, True, "T4 (sm_75)")
    assert gpu_view(Environment(Versions()), CheckOptions()) == GpuView(None, False, "unknown GPU")


def test_fallback_gpu_never_raises_and_knows_no_trap_where_there_is_no_gpu():
    assert fallback_gpu("not a gpu") == GpuView(None, False, "not a gpu")
    assert fallback_gpu("none") == GpuView(None, False, "no GPU")
    assert fallback_gpu("8.0") == GpuView(True, False, "sm_80")
