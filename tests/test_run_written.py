"""The Run keeps the settings as the training config writes them (issue 32, run.Written), beside the resolved ones:
the precision switches (both on: GD604; `auto`: GD605; all off: fp32 in the file's words), tf32, the attention backend
as named (axolotl's switches, fa3, a kernels-hub name), packing, the evaluation batch and whether predictions are
kept, LoRA's targets as written, modules_to_save and 4-bit loading, each with the key it came from, in every trainer's
format. Read by the real reader (readers/training_config.parse) and resolved with the memory plan check makes."""

from __future__ import annotations

import json

import pytest

from gemma_doctor import run as run_mod
from gemma_doctor.plan import runplan
from gemma_doctor.readers import gpu as gpu_reader
from gemma_doctor.readers import training_config as tc_reader
from gemma_doctor.run import Sourced
from tests.builders import gemma3_12b_config

SHAPE = runplan.shape_for(gemma3_12b_config(), None)


def run_of(text: str, name: str) -> run_mod.Run:
    """check's Run of a training config: the memory plan of it on an A100, resolved with the config it was made from."""
    tc = tc_reader.parse(text, name, yaml_first=not name.endswith(".json"))
    assert tc.error is None, tc.error
    mem = runplan.plan_memory(SHAPE, precision="bf16", gpu=gpu_reader.resolve("A100"), request=runplan.MemoryRequest(),
                              training_config=tc, task="sft")
    return run_mod.resolve(mem, model="gemma3", stack=None, trainer=run_mod.trainer_of(tc), stated=(),
                           training_config=tc)


def src(key: str) -> str:
    return run_mod.FROM_CONFIG + key


TRL = json.dumps({"model_name_or_path": "google/gemma-3-12b-it", "max_length": 1024, "bf16": True, "tf32": True,
                  "packing": True, "per_device_eval_batch_size": 2, "prediction_loss_only": True,
                  "eval_accumulation_steps": 4, "use_peft": True, "lora_target_modules": ["q_proj", "v_proj"],
                  "lora_modules_to_save": ["embed_tokens"], "model_init_kwargs": {"attn_implementation": "fa3"}})
AXOLOTL = """base_model: google/gemma-3-12b-it
adapter: qlora
load_in_4bit: true
bf16: auto
tf32: auto
flash_attention: "true"
sample_packing: true
micro_batch_size: 2
eval_batch_size: 1
lora_target_linear: true
lora_modules_to_save: [embed_tokens, lm_head]
"""
LLAMA_FACTORY = """model_name_or_path: google/gemma-3-12b-it
stage: sft
finetuning_type: lora
lora_target: q_proj,v_proj
additional_target: embed_tokens
neat_packing: true
flash_attn: kernels-community/flash-attn3
fp16: true
bf16: true
per_device_train_batch_size: 1
"""


def test_a_trl_config_s_settings_as_written_are_the_run_s():
    w = run_of(TRL, "sft.json").written
    assert w.switches.on == (Sourced("bf16", src("bf16")),) and w.switches.explicit and not w.switches.conflict
    assert w.tf32 == Sourced(True, src("tf32"))
    assert w.attention == Sourced("fa3", src("model_init_kwargs.attn_implementation"))
    assert (w.backend, w.attention_setting) == ("flash_attention_3", "attn_implementation")
    assert w.packing == Sourced("packing", src("packing"))
    assert w.eval_batch == Sourced(2, src("per_device_eval_batch_size"))
    assert w.keeps_predictions == Sourced(False, src("prediction_loss_only"))
    assert w.eval_accumulation == Sourced(4, src("eval_accumulation_steps"))
    assert w.lora.enabled and w.lora.targets == Sourced(("q_proj", "v_proj"), src("lora_target_modules"))
    assert w.lora.modules_to_save == Sourced(("embed_tokens",), src("lora_modules_to_save"))
    assert w.lora.quant_bits is None


def test_an_axolotl_config_s_settings_as_written_are_the_run_s():
    run = run_of(AXOLOTL, "axolotl.yaml")
    w = run.written
    # `bf16: auto`: the machine decides (GD605); nothing explicit, no autocast turned on by the file
    assert w.switches.auto == (Sourced("bf16", src("bf16")),) and not w.switches.explicit and not w.switches.on
    assert w.switches.is_auto("bf16") and not w.switches.fp32
    assert w.tf32 == Sourced("auto", src("tf32"))
    # axolotl's schema (0.19.0, pydantic `bool | None`) reads the string "true" as true
    assert w.attention == Sourced("flash_attention_2", src("flash_attention"))
    assert w.attention_setting == "flash_attention"
    assert w.packing == Sourced("packing", src("sample_packing"))
    assert w.eval_batch == Sourced(1, src("eval_batch_size")) and w.keeps_predictions is None
    assert w.lora.enabled and w.lora.targets is None and w.lora.all_linear == Sourced(True, src("lora_target_linear"))
    assert w.lora.given and w.lora.modules_to_save == Sourced(("embed_tokens", "lm_head"), src("lora_modules_to_save"))
    assert w.lora.quant_bits == Sourced(4, src("load_in_4bit"))
    # beside the resolved run: the memory plan's attention and LoRA targets, which the written ones do not replace
    assert run.lora is not None and run.lora.value.targets == "all-linear"


def test_a_llama_factory_config_s_settings_as_written_are_the_run_s():
    w = run_of(LLAMA_FACTORY, "lf.yaml").written
    # both on: transformers refuses to start (GD604), which the Run's one precision cannot say
    assert w.switches.conflict and w.switches.setting("fp16") == "fp16" and w.switches.setting("bf16") == "bf16"
    assert w.attention == Sourced("kernels-community/flash-attn3", src("flash_attn"))
    assert w.backend == "kernels-community/flash-attn3"  # a kernels-hub name, kept as written
    assert w.packing == Sourced("packing", src("neat_packing"))
    assert w.lora.targets == Sourced(("q_proj", "v_proj"), src("lora_target"))
    assert w.lora.modules_to_save == Sourced(("embed_tokens",), src("additional_target"))


@pytest.mark.parametrize("text, on, fp32, setting", [
    ("mixed_precision: bf16\n", ("bf16",), False, "mixed_precision"),
    ("bf16: false\nfp16: false\n", (), True, None),
    ("mixed_precision: 'no'\n", (), True, None),
    ("mixed_precision: fp8\n", (), False, None),  # neither on nor off: not fp32 by the switches
    ("per_device_train_batch_size: 2\n", (), False, None),  # no switch: the launcher decides (GD609)
])
def test_the_switches_say_what_the_file_turns_on(text, on, fp32, setting):
    w = run_of(text, "args.yaml").written
    assert tuple(s.value for s in w.switches.on) == on and w.switches.fp32 is fp32
    assert w.switches.setting("bf16") == setting


def test_no_training_config_writes_nothing():
    mem = runplan.plan_memory(SHAPE, precision="bf16", gpu=gpu_reader.resolve("A100"),
                              request=runplan.MemoryRequest(), training_config=None, task="sft")
    run = run_mod.resolve(mem, model="gemma3", stack=None, trainer=run_mod.trainer_of(None), stated=())
    assert run.written == run_mod.Written() and not run.written.switches.stated


@pytest.mark.parametrize("gpu, precision", [("T4", "fp32"), ("A100", "bf16")])
def test_the_prescribed_run_s_precision_comes_from_the_prescription(gpu, precision):
    """A candidate of the search writes its precision in its YAML's switches: the prescribed Run's precision says so
    ("prescription", was "recommended": plan/search.py planned its candidates with config_precision=False). That its
    switches as written state the same precision is test_run_roundtrip's (GD302's "already trains in fp32" reads them)."""
    from gemma_doctor.cli import main

    import contextlib
    import io

    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):
        try:
            main(["recommend", "--family", "gemma3", "--size", "1b", "--gpu", gpu, "--format", "json"])
        except SystemExit as e:
            assert not e.code
    prescribed = json.loads(out.getvalue())["models"][0]["prescription"]["run"]["precision"]
    assert prescribed == {"value": precision, "source": "prescription"}
