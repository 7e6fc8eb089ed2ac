"""Rendering a prescribed run and reading it back is the identity (issue 32): for random runs, the training config the
prescription emits (axolotl's keys, `recommend --format yaml`, the only trainer format it writes) read by
`check --training-config`'s reader gives back the same method, batch, accumulation, sequence, checkpointing, LoRA
rank and targets, GPUs, sharding and attention; the training config the search judges each candidate by (built from
the run, never printed: search.as_read) is exactly that YAML read back, so judging the run directly is judging its
YAML; and the TRL / TrainingArguments settings of the snippets, read as a TRL config, state the same batch,
accumulation, checkpointing, sequence and precision. Hypothesis, in the derandomised CI profile (tests/conftest.py)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

import json

import yaml

from gemma_doctor.plan import recommend, runplan, search
from gemma_doctor.readers import training_config as tc_reader


@st.composite
def runs(draw: st.DrawFn) -> tuple[recommend.Inputs, recommend.MemoryAdvice]:
    method = draw(st.sampled_from(("full", "lora", "qlora")))
    gpus = draw(st.sampled_from((1, 2, 4, 8)))
    nested = draw(st.booleans())
    family = draw(st.sampled_from(("gemma3", "gemma2", "gemma"))) if not nested else "gemma3"
    targets = draw(st.sampled_from((None, ("q_proj", "v_proj"), r".*\.(q_proj|o_proj)"))) if method != "full" else None
    advice = recommend.MemoryAdvice(
        method=method, batch_size=draw(st.integers(1, 64)), gradient_accumulation_steps=draw(st.integers(1, 64)),
        gradient_checkpointing=draw(st.booleans()), fits=True, summary="", quant_bits=4 if method == "qlora" else None,
        seq_len=draw(st.sampled_from((128, 512, 1024, 2048, 8192))),
        lora_r=draw(st.sampled_from((4, 8, 16, 64))) if method != "full" else None, lora_targets=targets,
        num_gpus=gpus, zero_stage=draw(st.sampled_from((2, 3))) if gpus > 1 else 0,
        attention=draw(st.sampled_from((None, "eager"))))
    inputs = recommend.Inputs(family=family, gpu_native_bf16=draw(st.booleans()), nested=nested,
                              quantization="4bit" if method == "qlora" else None, memory=advice,
                              model_id="google/gemma-3-12b-it" if nested else "google/gemma-3-1b-it")
    return inputs, advice


@settings(max_examples=60)
@given(runs())
def test_the_prescription_yaml_reads_back_as_the_same_run(run):
    inputs, advice = run
    rec = recommend.decide(inputs)
    text = recommend.training_config_yaml(rec)
    tc = tc_reader.parse(text, "prescription.yaml", yaml_first=True)
    assert tc.error is None, text
    # Every key is one of axolotl's schema, which drops any other without a word (GD986's table): num_processes,
    # torch_dtype and a bare bnb_4bit_compute_dtype were written.
    assert not set(yaml.safe_load(text)) - set(tc_reader.key_table("axolotl_keys")["keys"]), text
    # The rules read a training config and nothing else of the file: the one built from the run is the one read back
    # (repr tells True from 1 and 1.0 from 1, which == does not).
    direct = search.as_read(rec)
    assert repr(direct) == repr(tc_reader.parse(text, search.PRESCRIPTION, yaml_first=True)), text
    values, _ = runplan.run_request(tc, runplan.MemoryRequest(), "sft")
    expected = {"method": advice.method, "batch_size": advice.batch_size,
                "gradient_accumulation_steps": advice.gradient_accumulation_steps,
                "gradient_checkpointing": advice.gradient_checkpointing, "seq_len": advice.seq_len}
    if advice.method != "full":
        expected["lora_r"] = advice.lora_r
    if advice.lora_targets is not None:
        expected["lora_targets"] = advice.lora_targets
    if advice.num_gpus > 1:
        expected.update(num_gpus=advice.num_gpus, zero_stage=advice.zero_stage)
    if advice.attention is not None:
        expected["attention"] = advice.attention
    got = {k: values.get(k) for k in expected}
    if got.get("gradient_accumulation_steps") is None and advice.gradient_accumulation_steps == 1:
        got["gradient_accumulation_steps"] = 1  # accumulation 1 is the default, left out of the YAML
    assert got == expected, text


DEFAULTS = {"gradient_checkpointing": False, "gradient_accumulation_steps": 1}


@settings(max_examples=40)
@given(runs())
def test_the_snippets_state_the_same_run(run):
    """The TRL config and TrainingArguments of the snippets, written as the JSON a TRL script reads (`trl sft --config`),
    read back as the run the YAML states: batch, accumulation, checkpointing, sequence (TRL) and precision."""
    inputs, advice = run
    rec = recommend.decide(inputs)
    yaml_values, _ = runplan.run_request(search.as_read(rec), runplan.MemoryRequest(), "sft")
    fw = rec.frameworks
    for name, config in (("transformers", fw["transformers"]["training_arguments"]), ("trl", fw["trl"]["config"])):
        if config is None:
            continue
        tc = tc_reader.parse(json.dumps(config), f"{name}.json", yaml_first=False)
        assert tc.error is None and tc.kind == "transformers", (name, config)
        values, _ = runplan.run_request(tc, runplan.MemoryRequest(), "sft")
        keys = ["batch_size", "gradient_accumulation_steps", "gradient_checkpointing"] + (["seq_len"] if name == "trl" else [])
        # Left out means the trainer's default: no checkpointing, no accumulation.
        said = {k: values.get(k, DEFAULTS.get(k)) for k in keys}
        assert said == {k: yaml_values.get(k, DEFAULTS.get(k)) for k in keys}, (name, config)
        for flag in ("bf16", "fp16"):
            assert tc_reader.truthy(tc.get(flag).value) == tc_reader.truthy(search.as_read(rec).get(flag).value)
