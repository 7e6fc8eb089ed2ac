"""The run's settings are one type (issue 32, item 1): run.Settings is what the memory plan is computed from and what the
Run keeps, so the Run's method, batch, precision ... and its memory figures cannot describe two runs.

- The type: the Run has one field of settings (``Run.settings``, a ``Settings``) and no field of its own for a
  setting; each setting it states (method, batch, precision, LoRA, GPUs ...) is the settings' value with the settings'
  source.
- A property over random runs (options, an axolotl or TRL training config, a GPU or none, a model shape, as check
  plans them): the memory plan computed again from the Run's settings alone, on the GPU the Run was judged against,
  is the Run's memory (line, verdict, bytes per GPU, components, trainable parameters), so every input of the plan is
  read from the settings. Hypothesis, in the derandomised CI profile (tests/conftest.py).
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from gemma_doctor import run as run_mod
from gemma_doctor.plan import memory, runplan
from gemma_doctor.readers import gpu as gpu_reader
from gemma_doctor.readers import training_config as tc_reader
from gemma_doctor.run import Run, Settings, Sourced
from tests.builders import gemma3_1b_config, gemma3_12b_config

SHAPES = (runplan.shape_for(gemma3_1b_config(), None), runplan.shape_for(gemma3_12b_config(), None))
# Each setting the Run states, and the field of Settings it is read from.
STATED = {"method": "method", "precision": "precision", "load_dtype": "load_dtype", "batch": "batch_size",
          "accumulation": "gradient_accumulation_steps", "seq_len": "seq_len", "attention": "attention",
          "checkpointing": "gradient_checkpointing"}


def test_the_run_keeps_one_copy_of_its_settings() -> None:
    fields = {f.name: f.type for f in dataclasses.fields(Run)}
    assert fields["settings"] in (Settings, "Settings")
    # No field of the Run holds a setting again (a second copy, which could differ from what was planned).
    views = set(STATED) | {"hardware", "lora", "zero_stage", "loss", "task", "text_only"}
    assert not (views | {f.name for f in dataclasses.fields(Settings)}) & set(fields), sorted(fields)
    # Settings is the memory plan's input: no other type of the run is left in plan/memory.py (RunSpec went).
    assert memory.Settings is Settings and not hasattr(memory, "RunSpec")
    # The plan keeps its settings under their own name (``MemoryPlan.settings``; ``run`` was the Run's word for them).
    plan_fields = {f.name: f.type for f in dataclasses.fields(memory.MemoryPlan)}
    assert plan_fields["settings"] in (Settings, "Settings") and "run" not in plan_fields


@st.composite
def runs(draw: st.DrawFn) -> tuple[Any, ...]:
    """(shape, gpu spec, MemoryRequest, training config text and name or None, task, trl_chunks)."""
    request = runplan.MemoryRequest(
        method=draw(st.sampled_from((None, "full", "lora", "qlora"))), batch_size=draw(st.none() | st.integers(1, 16)),
        seq_len=draw(st.none() | st.sampled_from((256, 1024, 4096))),
        gradient_checkpointing=draw(st.sampled_from((None, True, False))),
        num_gpus=draw(st.none() | st.integers(1, 8)))
    kind = draw(st.sampled_from((None, "axolotl", "trl")))
    config: tuple[str, str] | None = None
    if kind is not None:
        data: dict[str, Any] = {}
        if kind == "axolotl":
            data["base_model"] = "google/gemma-3-1b-it"
            adapter = draw(st.sampled_from((None, "lora", "qlora")))
            if adapter:
                data["adapter"] = adapter
                data["lora_r"] = draw(st.sampled_from((8, 16, 64)))
                targets = draw(st.sampled_from((None, ["q_proj", "v_proj"], r".*\.(q_proj|o_proj)")))
                if targets is None:
                    data["lora_target_linear"] = True
                else:
                    data["lora_target_modules"] = targets
            data["micro_batch_size"] = draw(st.integers(1, 8))
            data["gradient_accumulation_steps"] = draw(st.integers(1, 8))
            data["sequence_len"] = draw(st.sampled_from((512, 2048)))
            data[draw(st.sampled_from(("bf16", "fp16")))] = draw(st.sampled_from((True, False, "auto")))
            if draw(st.booleans()):
                data["deepspeed"] = draw(st.sampled_from(("deepspeed_configs/zero2.json",
                                                          "deepspeed_configs/zero3_bf16.json")))
            if draw(st.booleans()):
                data["eval_batch_size"] = draw(st.integers(1, 8))
            text, name = yaml.safe_dump(data), "run.yaml"
        else:
            data["per_device_train_batch_size"] = draw(st.integers(1, 8))
            data["gradient_accumulation_steps"] = draw(st.integers(1, 8))
            data["max_length"] = draw(st.sampled_from((512, 2048)))
            data["gradient_checkpointing"] = draw(st.booleans())
            data[draw(st.sampled_from(("bf16", "fp16")))] = draw(st.booleans())
            data["attn_implementation"] = draw(st.sampled_from(("eager", "sdpa")))
            if draw(st.booleans()):
                data["use_peft"] = True
                data["lora_target_modules"] = draw(st.sampled_from((["q_proj", "v_proj"], "all-linear")))
            if draw(st.booleans()):
                data["per_device_eval_batch_size"] = draw(st.integers(1, 8))
                data["prediction_loss_only"] = draw(st.booleans())
            if draw(st.booleans()):
                data["fsdp"] = draw(st.sampled_from(("full_shard auto_wrap", "shard_grad_op", "full_shard offload")))
            text, name = json.dumps(data), "sft_config.json"
        config = (text, name)
    return (draw(st.sampled_from(SHAPES)), draw(st.sampled_from(("T4", "L4", "A100", "H100", "none"))), request,
            config, draw(st.sampled_from(("sft", "dpo"))), draw(st.booleans()))


def check_run(shape: Any, gpu_spec: str, request: Any, config: tuple[str, str] | None, task: str,
              trl_chunks: bool) -> tuple[Run, Any]:
    """The Run check resolves for these inputs (runplan.plan_memory, then run.resolve), and the GPU it planned for."""
    tc = tc_reader.parse(config[0], config[1], yaml_first=config[1].endswith(".yaml")) if config else None
    gpu = gpu_reader.resolve(gpu_spec)
    mem = runplan.plan_memory(shape, precision="bf16", gpu=gpu, request=request, training_config=tc, task=task,
                              trl_chunks=trl_chunks, defaults=runplan.trainer_defaults(tc, None))
    return run_mod.resolve(mem, model="gemma3", stack=None, trainer=run_mod.trainer_of(tc), stated=(),
                           training_config=tc), gpu


@settings(max_examples=80, deadline=None)
@given(runs())
def test_the_plan_of_a_run_is_the_plan_of_its_settings(case: tuple[Any, ...]) -> None:
    shape = case[0]
    run, _gpu = check_run(*case)
    s = run.settings
    # Every input of the plan is a setting: planned again from the settings alone, the same figures.
    again = memory.plan(shape, s, run.memory.gpu_bytes, run.memory.gpu_name)
    assert again.summary() == run.memory.summary, case
    assert (again.verdict, again.per_gpu_bytes, tuple(again.components.items()), again.trainable_params) == (
        run.memory.verdict, run.memory.per_gpu_bytes, run.memory.components, run.memory.trainable), case
    assert again.settings == s
    # What the Run states of each setting is the settings' value and source, nothing copied beside them.
    for view, name in STATED.items():
        stated = getattr(run, view)
        assert Sourced(stated.value.value if view == "method" else stated.value, stated.source) == s.sourced(name)
    assert (run.hardware.count, run.hardware.nodes) == (s.sourced("num_gpus"), s.sourced("num_nodes"))
    assert run.zero_stage.value == (s.zero_stage if s.num_gpus > 1 else 0)
    assert run.effective_batch == s.batch_size * s.gradient_accumulation_steps
    assert (run.lora is None) == (s.method == "full")
    if run.lora is not None:
        assert (run.lora.value.r, run.lora.value.targets, run.lora.source) == (s.lora_r, s.lora_targets,
                                                                               s.source("lora"))
    assert (run.loss.value == "chunked log-probs") == s.chunked_loss
    # The JSON views of the Run and of the plan state the same settings.
    view, planned = run.to_json(), s.to_json()
    assert (view["batch"]["value"], view["gradient_accumulation_steps"]["value"], view["seq_len"]["value"],
            view["precision"]["value"], view["method"]["value"]) == (
        planned["batch_size"], planned["gradient_accumulation_steps"], planned["seq_len"], planned["precision"],
        planned["method"])


# The run's settings a description of a run would repeat (Settings' fields beyond method, precision and task, which a
# decision's inputs and a request name too).
_RUN_FIELDS = frozenset({"batch_size", "gradient_accumulation_steps", "gradient_checkpointing", "seq_len", "lora_r",
                         "lora_targets", "num_gpus", "zero_stage", "optimizer", "attention", "quant_bits", "eval_batch",
                         "offload_optimizer", "offload_params", "fsdp"})
# Classes allowed to name several of them, and why: the user's ask before it is resolved (each None where left open).
_ASKS = {("facts", "MemoryRequest")}


def test_no_second_description_of_the_run() -> None:
    """Issue 32: the precision decision, snippets and YAML render the run's Settings, not a copy of them. No class of
    the package but run.Settings declares more than three of the run's settings (recommend.MemoryAdvice did: method,
    batch, accumulation, checkpointing, sequence, LoRA, GPUs, ZeRO stage, optimizer, attention, built from the plan
    and read by the views); the decision's inputs hold the Settings themselves, and check hands the plan's own."""
    import ast
    from pathlib import Path

    from gemma_doctor.plan import advice, recommend

    package = Path(run_mod.__file__).parent
    repeated = []
    for path in sorted(package.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ClassDef):
                names = {s.target.id for s in node.body if isinstance(s, ast.AnnAssign) and isinstance(s.target, ast.Name)}
                where = (".".join(path.relative_to(package).with_suffix("").parts), node.name)
                if len(names & _RUN_FIELDS) > 3 and where not in _ASKS and where != ("run", "Settings"):
                    repeated.append((*where, sorted(names & _RUN_FIELDS)))
    assert not repeated, repeated
    assert not hasattr(recommend, "MemoryAdvice")
    fields = {f.name: f.type for f in dataclasses.fields(recommend.Inputs)}
    assert fields["settings"] in (Settings, "Settings | None") and "memory" not in fields
    # What the recommendation renders is the memory plan's own Settings (the one the Run keeps), not a copy.
    mem = runplan.plan_memory(SHAPES[1], precision="bf16", gpu=gpu_reader.resolve("L4"),
                              request=runplan.MemoryRequest(method="lora", batch_size=2), training_config=None, task="sft")
    assert advice.planned_settings(mem) is mem.plan.settings
