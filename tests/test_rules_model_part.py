"""What a rule declares it reads holds for every run (codes.emits ``model_only`` / ``model_part``), so the model part of a
judgement, shared by check's rules and every candidate of its search (rules.Shared), is exact.

A random run: a model (the example cache's Gemma 3 12B and Gemma 4 E2B, read with their headers; a Gemma 3 1B with its
tokenizer files; a published config of the family table), a stack (the test stack, transformers named at a release in or out of the
windows the rules know, or a requirements file without transformers), a GPU or none, the memory options, a task, and a
training config (none, a TRL JSON or an axolotl YAML of random keys), resolved into check's own Run as check resolves it
(pipeline.environment, pipeline.with_memory, pipeline.with_run). For each:
(a) every rule declared model-only finds on it exactly what it finds with the run's parts left out (the Run, the
    training config, the memory options): what rules.Shared keys by;
(b) every rule judged in two parts has the same model part for it, and its findings, handed that part, are its own;
(c) check's rules with a Shared the search filled (its candidates judged under their own training configs) find what
    they find alone, in the same order.
Hypothesis in the derandomised CI profile (tests/conftest.py)."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from gemma_doctor import pipeline, rules
from gemma_doctor.facts import CheckOptions, ModelFacts
from gemma_doctor.plan import advice, runplan
from tests.builders import HubCache, gemma3_1b_config, generation_config

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ("google/gemma-3-12b-it", "google/gemma-4-E2B-it")
# A model with its tokenizer files: a chat template that writes <bos> and the EOS as the pad token (GD902, GD903 read
# the training config's pad token and whether one is given).
TOKENIZED = "org/gemma-3-1b-tokenized"
TOKENIZER_CONFIG = {"bos_token": "<bos>", "eos_token": "<eos>", "pad_token": "<eos>", "add_bos_token": True,
                    "chat_template": "{{ bos_token }}{% for m in messages %}{{ m['content'] }}{% endfor %}"}
PLANNED = (("gemma", "2b"), ("gemma2", "9b"), ("gemma3", "1b"), ("gemma3", "27b"), ("gemma3n", "e2b"), ("gemma4", "e4b"),
           ("gemma4", "31b"))
# transformers at releases inside and outside the windows the rules know (GD105's 5.0-5.5, GD107's, the horizon), the
# test stack's own (none named), and a stack without transformers.
STACKS = ((), ("transformers==4.50.3",), ("transformers==5.5.0", "peft==0.10.0"), ("transformers==5.23.0",),
          "no-transformers")
GPUS = (None, "T4", "A100", "H100", "V100")
TRL_KEYS = {
    "bf16": st.booleans(), "fp16": st.booleans(), "gradient_checkpointing": st.booleans(),
    "per_device_train_batch_size": st.integers(1, 16), "gradient_accumulation_steps": st.integers(1, 8),
    "attn_implementation": st.sampled_from(("eager", "sdpa", "flash_attention_2")), "use_cache": st.booleans(),
    "packing": st.booleans(), "max_length": st.sampled_from((512, 2048)), "torch_dtype": st.sampled_from(
        ("bfloat16", "float16", "float32")), "use_peft": st.booleans(),
    "lora_target_modules": st.sampled_from((["q_proj", "v_proj"], "all-linear")), "num_processes": st.integers(1, 4),
    "pad_token": st.sampled_from(("<pad>", "<eos>")), "gradient_checkpointing_kwargs": st.just({"use_reentrant": True}),
}
AXOLOTL_KEYS = {
    "adapter": st.sampled_from(("lora", "qlora")), "load_in_4bit": st.booleans(), "bf16": st.booleans(),
    "fp16": st.booleans(), "gradient_checkpointing": st.booleans(), "micro_batch_size": st.integers(1, 16),
    "flash_attention": st.booleans(), "sequence_len": st.sampled_from((512, 2048)), "sample_packing": st.booleans(),
    "lora_target_linear": st.booleans(), "lora_target_modules": st.just(["q_proj", "v_proj"]),
}


class World(dict):
    """The models, their folder and the stack file every example shares (shown by name: Hypothesis prints the
    arguments of a failing example)."""

    def __repr__(self) -> str:
        return "World()"


@pytest.fixture(scope="module")
def world(tmp_path_factory) -> World:
    root = tmp_path_factory.mktemp("model-part")
    cache = root / "hub"
    subprocess.run([sys.executable, str(ROOT / "examples" / "build_example_cache.py"), str(cache)], check=True,
                   capture_output=True)
    HubCache(cache).add(TOKENIZED, {"config.json": gemma3_1b_config(), "generation_config.json": generation_config(),
                                    "tokenizer_config.json": TOKENIZER_CONFIG})
    options = CheckOptions()
    located, _ = pipeline.locate_targets([*EXAMPLES, TOKENIZED], cache)
    models, _ = pipeline.select_sources(located, explicit=True)
    facts = [pipeline.read_more(m, options) for m in models]
    facts += [advice.planned_facts(family, size, f"org/{family}-{size}") for family, size in PLANNED]
    reqs = root / "requirements-without-transformers.txt"
    reqs.write_text("peft==0.21.2\ntrl==1.16.0\naccelerate==1.15.0\n")
    return World(root=root, facts=facts, requirements=reqs)


@st.composite
def runs(draw: st.DrawFn) -> dict:
    kind = draw(st.sampled_from((None, "trl", "axolotl")))
    keys = TRL_KEYS if kind == "trl" else AXOLOTL_KEYS
    config = draw(st.fixed_dictionaries({}, optional=keys)) if kind is not None else None
    memory = draw(st.none() | st.builds(
        runplan.MemoryRequest, method=st.none() | st.sampled_from(("full", "lora", "qlora")),
        batch_size=st.none() | st.integers(1, 16), seq_len=st.none() | st.sampled_from((256, 1024, 4096)),
        gradient_checkpointing=st.none() | st.booleans(), num_gpus=st.none() | st.integers(1, 8)))
    return {"gpu": draw(st.sampled_from(GPUS)), "task": draw(st.sampled_from((None, "sft", "dpo", "grpo"))),
            "kind": kind, "config": config, "memory": memory}


def _judged(world: dict, run: dict, n: int, model: int, stack: object) -> tuple[ModelFacts, object, CheckOptions]:
    """The facts of ``world``'s ``model`` with check's own Run, the environment and the options of ``run`` on
    ``stack``."""
    path = None
    if run["kind"] is not None:
        if run["kind"] == "trl":
            path = world["root"] / f"run-{n}.json"
            path.write_text(json.dumps(run["config"]))
        else:
            path = world["root"] / f"run-{n}.yaml"
            path.write_text(yaml.safe_dump({"base_model": "google/gemma-3-12b-it", **run["config"]}))
    options = CheckOptions(gpu=run["gpu"], task=run["task"], memory=run["memory"],
                           training_config=str(path) if path is not None else None,
                           with_packages=stack if isinstance(stack, tuple) else (),
                           requirements=str(world["requirements"]) if stack == "no-transformers" else None)
    env = pipeline.environment(options)
    facts = world["facts"][model]
    gpu = env.gpu if env.gpu is not None else pipeline.gpu_reader.for_options(options)
    rec = advice.recommendation_for(facts, gpu, options.task, env.libraries)
    rec, mem = pipeline.with_memory(facts, rec, options, env, gpu)
    return pipeline.with_run(facts, env, rec, mem), env, options


def _without_run(facts: ModelFacts, env: object, options: CheckOptions) -> tuple:
    """The inputs with the run's parts left out, as rules.Shared keys them."""
    return (facts.with_(run=None), dataclasses.replace(env, training_config=None),
            dataclasses.replace(options, training_config=None, memory=None))


def test_rules_declare_what_they_read() -> None:
    """The rules that read the model alone say so (codes.emits), and the costly rules are among them or in two parts:
    the declarations the property below holds."""
    only = {f"{r.__module__.rsplit('.', 1)[-1]}.{r.__name__}" for r in rules.RULES if getattr(r, "model_only", False)}
    parts = {f"{r.__module__.rsplit('.', 1)[-1]}.{r.__name__}" for r in rules.RULES
             if getattr(r, "model_part", None) is not None}
    assert only == {"files.check", "after.check", "use_cache.check", "dtypes.check", "libraries.beyond_horizon",
                    "libraries.unknown_names"}
    assert parts == {"crashes.check", "catalogue.check"}
    assert all(getattr(r, "model_only", False) or getattr(r, "model_part", None) is not None
               for r in rules.RULES if getattr(r, "costly", False))


# Runs the rules read the run of most: the cache kept on without checkpointing (GD107's K/V sharing), the pad token
# named (GD902), a half-precision load under an old PEFT (GD401), a QLoRA YAML.
@settings(max_examples=15, suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@example(run={"gpu": "A100", "task": None, "kind": "trl", "memory": None,
              "config": {"use_cache": True, "gradient_checkpointing": False, "pad_token": "<pad>", "bf16": True}})
@example(run={"gpu": "T4", "task": "sft", "kind": "axolotl", "memory": None,
              "config": {"adapter": "qlora", "load_in_4bit": True, "gradient_checkpointing": True, "fp16": True}})
@example(run={"gpu": None, "task": None, "kind": None, "memory": runplan.MemoryRequest(method="lora", batch_size=2),
              "config": None})
@given(run=runs())
def test_what_a_rule_declares_model_only_is_the_same_for_every_run(world: dict, run: dict) -> None:
    """(a) and (b): a model-only rule's findings, a two-part rule's model part and its findings handed that part do
    not depend on the run (the Run, the training config, the memory options), for every model and stack."""
    for model in range(len(world["facts"])):
        for stack in STACKS:
            world["n"] = world.get("n", 0) + 1
            _holds(*_judged(world, run, world["n"], model, stack))


def _holds(facts: ModelFacts, env: object, options: CheckOptions) -> None:
    bare = _without_run(facts, env, options)
    for rule in rules.RULES:
        name = f"{rule.__module__}.{rule.__name__}"
        if getattr(rule, "model_only", False):
            assert tuple(rule(facts, env, options)) == tuple(rule(*bare)), name
        made = getattr(rule, "model_part", None)
        if made is not None:
            part = made(*bare)
            assert made(facts, env, options) == part, name
            assert tuple(rule(facts, env, options, part=part)) == tuple(rule(facts, env, options)), name


@settings(max_examples=15, suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(run=runs(), model=st.integers(0, len(EXAMPLES) + len(PLANNED)), stack=st.sampled_from(STACKS))
def test_check_and_its_search_share_the_model_part_exactly(world: dict, run: dict, model: int, stack: object) -> None:
    """(c): the search fills the Shared with the model part under its candidates' runs (their training configs, their
    Runs); check's rules on check's own run, handed it, find exactly what they find alone."""
    world["n"] = world.get("n", 0) + 1
    facts, env, options = _judged(world, run, world["n"], model, stack)
    shared = rules.Shared()
    judgement = pipeline.decide(facts.with_(run=None), options, env, shared)
    assert rules.run(judgement.facts, env, options, shared) == rules.run(judgement.facts, env, options)
    assert rules.run(facts, env, options, shared) == rules.run(facts, env, options)
