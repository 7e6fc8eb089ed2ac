"""Rendering a prescribed run and reading it back is the identity (issue 32): for random runs, the training config the
prescription emits (axolotl's keys, `recommend --format yaml`; and each trainer format `recommend --trainer` writes,
TRL's `trl sft --config` and TrainingArguments', in test_each_trainers_config_reads_back_as_the_same_run) read by
`check --training-config`'s reader gives back the same method, batch, accumulation, sequence, checkpointing, LoRA
rank and targets, GPUs, sharding and attention; the training config the search judges each candidate by (built from
the run, never printed: search.as_read) is exactly that YAML read back, so judging the run directly is judging its
YAML; and the TRL / TrainingArguments settings of the snippets, read as a TRL config, state the same batch,
accumulation, checkpointing, sequence and precision. Hypothesis, in the derandomised CI profile (tests/conftest.py). The Run planned from the training config built from
the run equals the Run planned from the YAML read back, for random runs and for every candidate the search judges at
points of the prescription grid, each trainer format's among them."""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

import yaml

from gemma_doctor import run as run_mod
from gemma_doctor.run import DEFAULT_LORA_R, DEFAULT_LORA_TARGETS, Settings
from gemma_doctor.plan import recommend, runplan, search
from gemma_doctor.readers import gpu as gpu_reader
from gemma_doctor.readers import training_config as tc_reader
from tests.builders import gemma3_1b_config, gemma3_12b_config

ROOT = Path(__file__).resolve().parent.parent
# The shapes the Runs of the random runs are planned for: the multimodal 12B and the text-only 1B.
SHAPES = {True: runplan.shape_for(gemma3_12b_config(), None), False: runplan.shape_for(gemma3_1b_config(), None)}


def planned_run(tc: tc_reader.TrainingConfig, shape: Any, precision: str, gpu: Any, request: runplan.MemoryRequest,
                task: str, trl_chunks: bool = False, defaults: tuple[Any, ...] = ()) -> run_mod.Run:
    """The Run check plans from ``tc`` (nothing remembered: config_key None), with the trainer ``tc`` decides and the
    settings as ``tc`` writes them (precision switches, tf32, backend, packing, LoRA's targets and modules_to_save)."""
    mem = runplan.plan_memory(shape, precision=precision, gpu=gpu, request=request, training_config=tc, task=task,
                              trl_chunks=trl_chunks, config_precision=False, defaults=defaults)
    return run_mod.resolve(mem, model=None, stack=None, trainer=run_mod.trainer_of(tc), stated=(), training_config=tc)


def said_precision(written: run_mod.Written) -> str | None:
    """The autocast the switches as written state (bf16 | fp16 | fp32), None where they state none or conflict."""
    on = {s.value for s in written.switches.on}
    if written.switches.conflict or written.switches.other:
        return None
    return on.pop() if on else ("fp32" if written.switches.fp32 else None)


@dataclass(frozen=True)
class Drawn:
    """A random prescribed run as drawn: what its config states (None: the trainer's default, left unwritten)."""

    method: str
    batch_size: int
    gradient_accumulation_steps: int
    gradient_checkpointing: bool
    seq_len: int
    lora_r: int | None
    lora_targets: str | tuple[str, ...] | None  # None: PEFT's own, not named
    num_gpus: int
    zero_stage: int
    attention: str | None  # None: sdpa, transformers' default

    def settings(self) -> Settings:
        """The run's settings, as the search's memory plan holds them (the views read these, nothing else)."""
        named = (("lora", "chosen by the search"),) if self.lora_targets is not None else ()
        return Settings(method=self.method, batch_size=self.batch_size,
                        gradient_accumulation_steps=self.gradient_accumulation_steps,
                        gradient_checkpointing=self.gradient_checkpointing, seq_len=self.seq_len,
                        quant_bits=4 if self.method == "qlora" else None, lora_r=self.lora_r or DEFAULT_LORA_R,
                        lora_targets=self.lora_targets if self.lora_targets is not None else DEFAULT_LORA_TARGETS,
                        num_gpus=self.num_gpus, zero_stage=self.zero_stage, attention=self.attention or "sdpa",
                        sources=named)


@st.composite
def runs(draw: st.DrawFn) -> tuple[recommend.Inputs, Drawn]:
    method = draw(st.sampled_from(("full", "lora", "qlora")))
    gpus = draw(st.sampled_from((1, 2, 4, 8)))
    nested = draw(st.booleans())
    family = draw(st.sampled_from(("gemma3", "gemma2", "gemma"))) if not nested else "gemma3"
    targets = draw(st.sampled_from((None, ("q_proj", "v_proj"), r".*\.(q_proj|o_proj)"))) if method != "full" else None
    advice = Drawn(
        method=method, batch_size=draw(st.integers(1, 64)), gradient_accumulation_steps=draw(st.integers(1, 64)),
        gradient_checkpointing=draw(st.booleans()), seq_len=draw(st.sampled_from((128, 512, 1024, 2048, 8192))),
        lora_r=draw(st.sampled_from((4, 8, 16, 64))) if method != "full" else None, lora_targets=targets,
        num_gpus=gpus, zero_stage=draw(st.sampled_from((2, 3))) if gpus > 1 else 0,
        attention=draw(st.sampled_from((None, "eager"))))
    inputs = recommend.Inputs(family=family, gpu_native_bf16=draw(st.booleans()), nested=nested,
                              quantization="4bit" if method == "qlora" else None, settings=advice.settings(),
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
    read_back = tc_reader.parse(text, search.PRESCRIPTION, yaml_first=True)
    assert repr(direct) == repr(read_back), text
    # ... and so is the Run check plans from each (method, shape, LoRA, trainer, memory, every field's source).
    shape, gpu = SHAPES[inputs.nested], gpu_reader.resolve("A100" if inputs.gpu_native_bf16 else "T4")
    planned = planned_run(read_back, shape, rec.precision, gpu, runplan.MemoryRequest(), "sft")
    assert planned_run(direct, shape, rec.precision, gpu, runplan.MemoryRequest(), "sft") == planned, text
    # The settings as written read back as the run states them: the precision its switches say, tf32, no packing, and
    # the LoRA targets the run names.
    written = planned.written
    assert said_precision(written) == rec.precision and not written.switches.auto, text
    assert written.tf32 == run_mod.Sourced(yaml.safe_load(text)["tf32"], "training config tf32"), text
    assert written.packing is None and written.attention == (
        run_mod.Sourced(advice.attention, "training config attn_implementation") if advice.attention else None), text
    assert written.lora.enabled is (advice.method != "full"), text
    if advice.lora_targets is not None:
        assert written.lora.targets.value == advice.lora_targets, text
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


@st.composite
def one_process_runs(draw: st.DrawFn) -> tuple[recommend.Inputs, Drawn]:
    """A random run on one GPU (what the TRL and TrainingArguments formats state), with attention and targets."""
    import dataclasses

    inputs, advice = draw(runs())
    advice = dataclasses.replace(advice, num_gpus=1, zero_stage=0)
    versions = draw(st.sampled_from(({}, {"transformers": "5.23.0"}, {"transformers": "4.57.6"})))
    task = draw(st.sampled_from(("sft", "dpo")))  # DPO: the `trl` format's `trl dpo --config` (SFT for the others)
    return dataclasses.replace(inputs, settings=advice.settings(), versions=versions, task=task), advice


# The trainer each format's config is executed by (trainers.ConfigKind.decide), read back by check's reader; the `trl`
# format's DPO run is TRL's DPOTrainer's (`trl dpo --config`).
FORMAT_TRAINERS = {"axolotl": run_mod.Trainer.AXOLOTL, "trl": run_mod.Trainer.TRL_SFT,
                   "transformers": run_mod.Trainer.TRANSFORMERS, "llama-factory": run_mod.Trainer.LLAMA_FACTORY}
TASK_TRAINERS = {("trl", "dpo"): run_mod.Trainer.TRL_DPO}


@pytest.mark.parametrize("fmt", recommend.TRAINER_FORMATS)
@settings(max_examples=40)
@given(run=one_process_runs())
def test_each_trainers_config_reads_back_as_the_same_run(fmt, run):
    """recommend --trainer FMT --format yaml, read by check's reader, is the run: the trainer that executes it, the
    method, batch, accumulation, checkpointing (written off where TRL's default is on), sequence (TRL's max_length;
    the TrainingArguments format leaves it to the script), LoRA rank and targets, quantization, attention, precision
    switches and load dtype; the config the search judges (as_read) is that YAML read back, and the Run planned from
    each is the same. Every key is one the trainer's parser accepts (readers/trainer_keys.json: TRL 1.16's)."""
    import dataclasses

    inputs, advice = run
    # a pattern of the user's is no LLaMA-Factory lora_target: refused before (tests/test_trainer_formats.py)
    assume(fmt != "llama-factory" or not isinstance(advice.lora_targets, str)
           or advice.lora_targets in recommend.LF_ALL_TARGETS)
    if inputs.task not in recommend.FORMAT_TASKS.get(fmt, recommend.TASKS):
        inputs = dataclasses.replace(inputs, task="sft")  # a task the format does not write: refused before
    task = inputs.task
    rec = recommend.decide(dataclasses.replace(inputs, trainer=fmt))
    text = recommend.training_config_yaml(rec)
    read_back = tc_reader.parse(text, search.PRESCRIPTION, yaml_first=True)
    assert read_back.error is None and not read_back.problems, text
    assert read_back.trainer.value is TASK_TRAINERS.get((fmt, task), FORMAT_TRAINERS[fmt]), text
    # The task is the config's own (check plans a DPO run's paired sequences without --task dpo).
    assert (read_back.task or "sft") == task, text
    assert repr(search.as_read(rec)) == repr(read_back), text
    if fmt == "llama-factory":  # its parser's own keys: LF_KEYS, each accepted by LLaMA-Factory 0.9.5's (a slow test)
        assert not set(yaml.safe_load(text)) - LF_KEYS, text
    else:
        table = "axolotl_keys" if fmt == "axolotl" else "trainer_keys"
        assert not set(yaml.safe_load(text)) - set(tc_reader.key_table(table)["keys"]), text
    shape, gpu = SHAPES[inputs.nested], gpu_reader.resolve("A100" if inputs.gpu_native_bf16 else "T4")
    defaults = runplan.trainer_defaults(read_back, None)
    planned = planned_run(read_back, shape, rec.precision, gpu, runplan.MemoryRequest(), task, True, defaults)
    assert planned_run(search.as_read(rec), shape, rec.precision, gpu, runplan.MemoryRequest(), task, True,
                       defaults) == planned, text
    assert said_precision(planned.written) == rec.precision, text
    values, _ = runplan.run_request(read_back, runplan.MemoryRequest(), task)
    expected = {"method": advice.method, "batch_size": advice.batch_size,
                "gradient_accumulation_steps": advice.gradient_accumulation_steps,
                "gradient_checkpointing": advice.gradient_checkpointing}
    if fmt != "transformers":
        expected["seq_len"] = advice.seq_len
    else:
        # The format has no key for it: the YAML's head names the option check is given (`--seq-len N`), and with it
        # the run read back is the run's sequence (recommend.told_seq_len; the search judges it so).
        import re

        told = re.findall(r"--seq-len (\d+)", text)
        assert told == [str(advice.seq_len)] == [str(recommend.told_seq_len(rec))], text
        with_told, _ = runplan.run_request(read_back, runplan.MemoryRequest(seq_len=int(told[0])), task)
        assert with_told["seq_len"] == advice.seq_len, text
    if advice.method != "full":
        expected["lora_r"] = advice.lora_r
    if advice.lora_targets is not None:
        # LLaMA-Factory's `all` is all-linear, the towers left out on a multimodal checkpoint (freeze_vision_tower)
        lf_all = fmt == "llama-factory" and isinstance(advice.lora_targets, str)
        expected["lora_targets"] = "all-linear" if lf_all else advice.lora_targets
    if advice.attention is not None:
        expected["attention"] = advice.attention
    # Left out means the trainer's default: full fine-tuning (no use_peft), no accumulation; the trainer's own
    # (LLaMA-Factory checkpoints unless disable_gradient_checkpointing).
    own = dict((n, v) for n, v, _ in defaults)
    got = {k: values.get(k, {**DEFAULTS, "method": "full", **own}.get(k)) for k in expected}
    assert got == expected, text
    if fmt == "llama-factory":
        # LLaMA-Factory loads the checkpoint's dtype (torch_dtype="auto": none known here) and upcasts full
        # fine-tuning's weights to float32 unless pure_bf16, which a bf16 full fine-tuning writes.
        full_upcast = advice.method == "full" and rec.precision != "bf16"
        assert own.get("load_dtype") == ("float32" if full_upcast else None), text
        assert (yaml.safe_load(text).get("pure_bf16") is True) is (advice.method == "full" and rec.precision == "bf16")
    elif fmt != "axolotl" and advice.method != "qlora":
        # TRL loads in float32 and a plain Trainer's from_pretrained in the checkpoint's dtype unless told: the dtype
        # the plan counts is written.
        assert own.get("load_dtype") == rec.load_dtype, text


DEFAULTS = {"gradient_checkpointing": False, "gradient_accumulation_steps": 1}


def _lf_keys() -> frozenset[str]:
    """The keys recommend writes in LLaMA-Factory's YAML, each parsed by LLaMA-Factory 0.9.5 itself
    (benchmarks/prescription_grid.LF_KEYS)."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        import prescription_grid as grid
    finally:
        sys.path.pop(0)
    return grid.LF_KEYS


LF_KEYS = _lf_keys()


@settings(max_examples=40)
@given(runs())
def test_the_snippets_state_the_same_run(run):
    """The TRL config and TrainingArguments of the snippets, written as the JSON a TRL script reads (`trl sft --config`),
    read back as the run the YAML states: batch, accumulation, checkpointing, sequence (TRL) and precision. On
    transformers 5.23.0 the snippets write activation_checkpointing (its new name): it was read as no checkpointing."""
    import dataclasses

    inputs, advice = run
    for versions in ({}, {"transformers": "5.23.0"}):
        _snippets_state_the_yamls_run(recommend.decide(dataclasses.replace(inputs, versions=versions)))


def _snippets_state_the_yamls_run(rec: recommend.Recommendation) -> None:
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
        # The Run's switches as each snippet writes them state the YAML's precision (GD302-GD605 judge these).
        assert said_precision(run_mod.written(tc)) == said_precision(run_mod.written(search.as_read(rec))) \
            == rec.precision, (name, config)


# Points of the prescription grid (benchmarks/prescription_grid.py): a --family plan of each kind of model (text-only,
# multimodal with a regex's targets, KV-shared Gemma 4), 1-4 GPUs, GPUs with and without bf16, on the test stack and on
# a stack that names no transformers (the search pins one), an RL task; every candidate each search judges is checked.
GRID_POINTS = (
    ("--family", "gemma3", "--size", "12b", "--gpu", "T4"),
    ("--family", "gemma3", "--size", "12b", "--gpu", "L4", "--num-gpus", "2", "--task", "dpo"),
    ("--family", "gemma4", "--size", "e2b", "--gpu", "V100", "--with", "transformers==5.5.1"),
    ("--family", "gemma2", "--size", "9b", "--gpu", "A100", "--num-gpus", "4", "--method", "full"),
    ("--family", "gemma3", "--size", "4b", "--gpu", "RTX 3060", "--requirements", "{reqs}"),
    ("--family", "gemma3", "--size", "12b", "--gpu", "T4", "--trainer", "trl"),
    ("--family", "gemma3", "--size", "1b", "--gpu", "L4", "--trainer", "transformers", "--requirements", "{reqs}"),
    ("--family", "gemma3", "--size", "4b", "--gpu", "A100", "--trainer", "llama-factory", "--method", "full"),
    ("--family", "gemma3", "--size", "12b", "--gpu", "L4", "--trainer", "llama-factory"),
    ("--family", "gemma3", "--size", "12b", "--gpu", "A100", "--trainer", "trl", "--task", "dpo"),
)


@pytest.fixture(scope="module")
def judged_candidates(tmp_path_factory) -> list[tuple[Any, ...]]:
    """Every candidate the search judged at GRID_POINTS: its recommendation, the training config it was judged by, and
    what its memory plan was made with (recorded around the search's own functions, which run unchanged)."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import prescription_grid as grid

    sys.path.pop(0)
    reqs = tmp_path_factory.mktemp("stack") / "requirements-without-transformers.txt"
    reqs.write_text("peft==0.21.2\ntrl==1.16.0\naccelerate==1.15.0\n")
    built: dict[int, Any] = {}
    seen: list[tuple[Any, ...]] = []
    as_read, checked_plan = search.as_read, search._checked_plan

    def recording_as_read(rec: recommend.Recommendation) -> tc_reader.TrainingConfig:
        tc = as_read(rec)
        built[id(tc)] = (rec, tc)
        return tc

    def recording_checked_plan(shape: Any, precision: str, gpu: Any, request: Any, key: str, tc: Any, task: str,
                               trl_chunks: bool = False, defaults: tuple[Any, ...] = ()) -> Any:
        if id(tc) in built:
            seen.append((*built[id(tc)], shape, precision, gpu, request, task, trl_chunks, defaults))
        return checked_plan(shape, precision, gpu, request, key, tc, task, trl_chunks, defaults)

    run = grid.in_process()
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(search, "as_read", recording_as_read)
        mp.setattr(search, "_checked_plan", recording_checked_plan)
        for point in GRID_POINTS:
            code, out, err = run("recommend", *(a.format(reqs=reqs) for a in point), "--format", "json")
            assert code in (0, 1), err
    return seen


def test_every_candidate_the_search_judges_is_its_yaml_read_back(judged_candidates):
    """The training config each candidate is judged by, built from the run, is the YAML that run prints read back by
    check's reader, and the Run check plans from each is the same: judging the Run is judging its YAML."""
    assert len(judged_candidates) >= len(GRID_POINTS)
    kinds = set()
    trainers_seen = set()
    for rec, direct, shape, precision, gpu, request, task, trl_chunks, defaults in judged_candidates:
        text = recommend.training_config_yaml(rec)
        read_back = tc_reader.parse(text, search.PRESCRIPTION, yaml_first=True)
        assert read_back.error is None and repr(direct) == repr(read_back), text
        # the trainer's defaults of what the YAML leaves open (axolotl's load dtype of its switches), as check plans it
        assert defaults == runplan.trainer_defaults(read_back, None), text
        assert planned_run(direct, shape, precision, gpu, request, task, trl_chunks, defaults) == \
            planned_run(read_back, shape, precision, gpu, request, task, trl_chunks, defaults), text
        kinds.add((rec.method, direct.get("num_processes") is not None, direct.get("rl") is not None))
        trainers_seen.add(direct.trainer.value)
    assert len(kinds) >= 4, kinds  # full, LoRA and QLoRA runs, sharded and not, SFT and DPO were among them
    # each trainer format's candidates too, TRL's DPOTrainer's among them
    assert trainers_seen == set(FORMAT_TRAINERS.values()) | set(TASK_TRAINERS.values()), trainers_seen
