"""The Run's distributed fields (run.Distributed, issue 32): the engine (none / DDP / FSDP1 / FSDP2 / DeepSpeed),
DeepSpeed's own ZeRO stage, offload, the FSDP wrap classes checked against the model's classes and the processes per
node, each with its source, resolved once (run.config_sharding) from every reader: a training config, an accelerate
YAML, a DeepSpeed JSON and a launch line, all read by the real readers. The memory plan's sharding and the rules
(GD133, GD661, GD682) take the same reading."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gemma_doctor.facts import CheckOptions, Environment, MemoryRequest, ModelFacts
from gemma_doctor.family import detect
from gemma_doctor.locate import Snapshot
from gemma_doctor.plan import runplan
from gemma_doctor.readers import launch, training_config
from gemma_doctor.readers.jsonfile import JsonFile
from gemma_doctor.readers.versions import Versions
from gemma_doctor.rules import distributed as distributed_rules
from gemma_doctor.rules import members
from gemma_doctor.rules.common import run_distributed
from gemma_doctor.run import Engine
from tests.test_distributed import ACCEL_FSDP, DS_Z3, MODELS, NEW


def facts_env(tc, model: str = "gemma3_text", **versions: str):
    cfg = MODELS[model]
    folder = Path("model")
    facts = ModelFacts(Snapshot("x", folder), JsonFile(folder / "config.json", True, data=cfg),
                       JsonFile(folder / "generation_config.json", False), detect(cfg))
    return facts, Environment(Versions({k: v for k, v in {**NEW, **versions}.items() if v}), training_config=tc)


def of_text(text: str, path: str, model: str = "gemma3_text", **versions: str):
    tc = training_config.parse(text, path, yaml_first=not path.endswith(".json"))
    assert tc.ok, tc.error
    facts, env = facts_env(tc, model, **versions)
    return run_distributed(facts, env)


def of_line(line: str, cwd: Path, model: str = "gemma3_text"):
    tc = launch.parse(line, str(cwd))
    assert tc.ok, tc.error
    facts, env = facts_env(tc, model)
    return run_distributed(facts, env)


def view(d) -> dict:
    """The fields as (value, source), None where a field does not apply."""
    pair = lambda s: None if s is None else (s.value.value if isinstance(s.value, Engine) else s.value, s.source)  # noqa: E731
    return {"engine": pair(d.engine), "zero_stage": pair(d.zero_stage), "offload_optimizer": pair(d.offload_optimizer),
            "offload_params": pair(d.offload_params),
            "wrap_classes": None if d.wrap_classes is None else
            ([(w.name, w.in_model) for w in d.wrap_classes.value], d.wrap_classes.source),
            "processes_per_node": pair(d.processes_per_node)}


# --- each field from each reader -------------------------------------------------------------------------------------

def test_a_trl_training_config_gives_fsdp2_its_wrap_classes_checked_and_its_offload():
    text = ("fsdp: full_shard auto_wrap\nfsdp_config:\n  version: 2\n  cpu_offload: true\n"
            "  transformer_layer_cls_to_wrap: [Gemma3DecoderLayer, GemmaDecoderLayer]\nbf16: true\n")
    assert view(of_text(text, "sft.yaml")) == {
        "engine": ("fsdp2", "training config fsdp_config.version"), "zero_stage": None, "offload_optimizer": None,
        "offload_params": ("cpu", "training config fsdp_config.cpu_offload"),
        "wrap_classes": ([("Gemma3DecoderLayer", True), ("GemmaDecoderLayer", False)],
                         "training config fsdp_config.transformer_layer_cls_to_wrap"),
        "processes_per_node": (1, "default")}


@pytest.mark.parametrize("transformers, engine", [("5.23.0", "fsdp2"), ("5.9.0", "fsdp1")])
def test_trainingarguments_fsdp_without_a_version_follows_the_stacks_default(transformers, engine):
    d = of_text("fsdp: full_shard\n", "sft.yaml", transformers=transformers)
    assert d.engine.value.value == engine and d.engine.source.startswith("training config fsdp (TrainingArguments")


def test_an_accelerate_yaml_gives_deepspeed_its_stage_offload_and_processes_per_node():
    text = ("compute_environment: LOCAL_MACHINE\ndistributed_type: DEEPSPEED\ndeepspeed_config:\n  zero_stage: 3\n"
            "  offload_optimizer_device: cpu\n  offload_param_device: nvme\nnum_machines: 2\nnum_processes: 16\n")
    assert view(of_text(text, "accelerate.yaml")) == {
        "engine": ("deepspeed", "training config distributed_type"),
        "zero_stage": (3, "training config deepspeed_config.zero_stage"),
        "offload_optimizer": ("cpu", "training config deepspeed_config.offload_optimizer_device"),
        "offload_params": ("nvme", "training config deepspeed_config.offload_param_device"),
        "wrap_classes": None,
        "processes_per_node": (8, "16 processes (training config num_processes) over 2 nodes (training config "
                                  "num_machines)")}


def test_an_accelerate_fsdp_yaml_is_fsdp1_unless_its_version_says_2():
    d = of_text(ACCEL_FSDP, "accelerate.yaml")
    assert d.engine.value is Engine.FSDP1 and d.zero_stage is None
    assert of_text(ACCEL_FSDP.replace("fsdp_version: 1", "fsdp_version: 2"), "accelerate.yaml").engine.value \
        is Engine.FSDP2


def test_a_deepspeed_json_is_deepspeed_with_its_own_stage_and_offload():
    assert view(of_text(DS_Z3, "ds.json")) == {
        "engine": ("deepspeed", "training config zero_optimization.stage"),
        "zero_stage": (3, "training config zero_optimization.stage"), "offload_optimizer": None,
        "offload_params": ("cpu", "training config zero_optimization.offload_param.device"), "wrap_classes": None,
        "processes_per_node": (1, "default")}


def test_a_launch_line_gives_the_engine_of_the_deepspeed_json_it_names_and_its_processes_per_node(tmp_path):
    (tmp_path / "ds.json").write_text(DS_Z3)
    d = of_line("torchrun --nnodes 2 --nproc-per-node 4 train.py --deepspeed ds.json --bf16", tmp_path)
    assert view(d) == {
        "engine": ("deepspeed", "training config script --deepspeed"),
        "zero_stage": (3, "training config script --deepspeed (ds.json: zero_optimization.stage)"),
        "offload_optimizer": None,
        "offload_params": ("cpu", "training config script --deepspeed (ds.json: zero_optimization.offload_param.device)"),
        "wrap_classes": None,
        "processes_per_node": (4, "8 processes (training config torchrun line: num_processes) over 2 nodes "
                                  "(training config torchrun line: num_machines)")}


@pytest.mark.parametrize("line, engine", [
    ("torchrun --nproc-per-node 4 train.py --bf16", ("ddp", "training config torchrun line: num_processes")),
    ("accelerate launch --multi_gpu --num_processes 4 train.py", ("ddp", "training config accelerate line: "
                                                                         "distributed_type")),
    ("accelerate launch --use_fsdp --num_processes 4 train.py", ("fsdp1", "training config accelerate line: "
                                                                          "distributed_type (accelerate's FSDP plugin: "
                                                                          "version 1 unless fsdp_version says 2)")),
    ("python train.py --bf16", ("none", "one process")),
])
def test_a_launch_line_gives_the_engine(line, engine, tmp_path):
    d = of_line(line, tmp_path)
    assert (d.engine.value.value, d.engine.source) == engine


# --- FSDP's auto-wrap policy and version: as written, or the default of what sets FSDP up ----------------------------

def wrap_view(d) -> tuple:
    """(auto_wrap as (value, source) or None, auto_wrap_stated, version_stated, engine)."""
    policy = None if d.auto_wrap is None else (getattr(d.auto_wrap.value, "value", d.auto_wrap.value), d.auto_wrap.source)
    return policy, d.auto_wrap_stated, d.version_stated, d.engine.value.value


ACCEL_NO_POLICY = ACCEL_FSDP.replace("  fsdp_auto_wrap_policy: TRANSFORMER_BASED_WRAP\n", "").replace(
    "  fsdp_version: 1\n", "")


@pytest.mark.parametrize("text, path, versions, expected", [
    # TrainingArguments (TRL): `auto_wrap` in the fsdp option states transformer-based wrapping; no version written
    ("fsdp: full_shard auto_wrap\n", "sft.yaml", {},
     (("transformer_based_wrap", "training config fsdp"), True, False, "fsdp2")),
    # without it, TrainingArguments' default: transformer-based from transformers 5.10, nothing wrapped before
    ("fsdp: full_shard\n", "sft.yaml", {"transformers": "5.23.0"},
     (("transformer_based_wrap", "training config fsdp (TrainingArguments' default from transformers 5.10: "
                                 "TRANSFORMER_BASED_WRAP)"), False, False, "fsdp2")),
    ("fsdp: full_shard\n", "sft.yaml", {"transformers": "5.9.0"},
     (("no_wrap", "training config fsdp (TrainingArguments before transformers 5.10: no wrapping without auto_wrap)"),
      False, False, "fsdp1")),
    ("fsdp: full_shard\n", "sft.yaml", {"transformers": None},
     (("transformer_based_wrap", "training config fsdp (TrainingArguments' default from transformers 5.10: "
                                 "TRANSFORMER_BASED_WRAP; the stack's transformers may be older: no wrapping)"),
      False, False, "fsdp2")),
    # min_num_params > 0 wraps by size beside auto_wrap before transformers 5.10; from 5.10 only beside
    # auto_wrap_policy: SIZE_BASED_WRAP (TrainingArguments built on 4.57.6, 5.9.0, 5.10.1, 5.23.0)
    ("fsdp: full_shard auto_wrap\nfsdp_config:\n  min_num_params: 100000\n", "sft.yaml", {"transformers": "5.9.0"},
     (("size_based_wrap", "training config fsdp_config.min_num_params (TrainingArguments before transformers 5.10: "
                          "auto_wrap with min_num_params > 0)"), True, False, "fsdp1")),
    ("fsdp: full_shard auto_wrap\nfsdp_config:\n  min_num_params: 100000\n", "sft.yaml", {"transformers": "5.23.0"},
     (("transformer_based_wrap", "training config fsdp (TrainingArguments' default from transformers 5.10: "
                                 "TRANSFORMER_BASED_WRAP; fsdp_config.min_num_params is read only beside "
                                 "auto_wrap_policy: SIZE_BASED_WRAP)"), False, False, "fsdp2")),
    ("fsdp: full_shard\nfsdp_config:\n  min_num_params: 100000\n", "sft.yaml", {"transformers": "5.9.0"},
     (("no_wrap", "training config fsdp (TrainingArguments before transformers 5.10: no wrapping without auto_wrap)"),
      False, False, "fsdp1")),
    ("fsdp: full_shard\nfsdp_config:\n  min_num_params: 100000\n  auto_wrap_policy: SIZE_BASED_WRAP\n", "sft.yaml",
     {"transformers": "5.23.0"}, (("size_based_wrap", "training config fsdp_config.auto_wrap_policy"), True, False,
                                  "fsdp2")),
    ("fsdp: full_shard\nfsdp_config:\n  auto_wrap_policy: NO_WRAP\n  version: 2\n", "sft.yaml", {},
     (("no_wrap", "training config fsdp_config.auto_wrap_policy"), True, True, "fsdp2")),
    # a version written that is neither 1 nor 2 is stated, and no FSDP2 (accelerate runs FSDP2 for 2 alone)
    ("fsdp: full_shard\nfsdp_config:\n  version: 3\n", "sft.yaml", {"transformers": "5.14.1"},
     (("transformer_based_wrap", "training config fsdp (TrainingArguments' default from transformers 5.10: "
                                 "TRANSFORMER_BASED_WRAP)"), False, True, "fsdp1")),
    # accelerate's YAML: its policy and version as written, else its plugin's defaults (NO_WRAP, version 1)
    (ACCEL_FSDP, "accelerate.yaml", {},
     (("transformer_based_wrap", "training config fsdp_config.fsdp_auto_wrap_policy"), True, True, "fsdp1")),
    (ACCEL_NO_POLICY, "accelerate.yaml", {},
     (("no_wrap", "training config distributed_type (accelerate's FSDP plugin: NO_WRAP unless fsdp_auto_wrap_policy "
                  "names one)"), False, False, "fsdp1")),
    # a word accelerate does not know is kept as written (accelerate refuses it; nothing is taken to wrap by class)
    (ACCEL_FSDP.replace("TRANSFORMER_BASED_WRAP", "BY_LAYER"), "accelerate.yaml", {},
     (("BY_LAYER", "training config fsdp_config.fsdp_auto_wrap_policy"), True, True, "fsdp1")),
    # not FSDP: no policy, nothing stated
    (DS_Z3, "ds.json", {}, (None, False, False, "deepspeed")),
])
def test_the_auto_wrap_policy_and_the_version_stated_from_each_config(text, path, versions, expected):
    assert wrap_view(of_text(text, path, **versions)) == expected


@pytest.mark.parametrize("line, expected", [
    ("accelerate launch --use_fsdp --fsdp_auto_wrap_policy SIZE_BASED_WRAP --fsdp_version 2 train.py",
     (("size_based_wrap", "training config accelerate line: fsdp_config.fsdp_auto_wrap_policy"), True, True, "fsdp2")),
    # the flag overrides the config file's policy; the file's version stays written
    ("accelerate launch --config_file fsdp.yaml --fsdp_auto_wrap_policy SIZE_BASED_WRAP train.py",
     (("size_based_wrap", "training config accelerate line: fsdp_config.fsdp_auto_wrap_policy"), True, True, "fsdp1")),
    ("accelerate launch --use_fsdp --num_processes 4 train.py",
     (("no_wrap", "training config accelerate line: distributed_type (accelerate's FSDP plugin: NO_WRAP unless "
                  "fsdp_auto_wrap_policy names one)"), False, False, "fsdp1")),
    # TrainingArguments on the script's line
    ("torchrun --nproc-per-node 8 train.py --fsdp full_shard --bf16",
     (("transformer_based_wrap", "training config script --fsdp (TrainingArguments' default from transformers 5.10: "
                                 "TRANSFORMER_BASED_WRAP)"), False, False, "fsdp2")),
    ("torchrun --nproc_per_node=8 train.py --fsdp 'full_shard auto_wrap' --fsdp_config.auto_wrap_policy NO_WRAP "
     "--fsdp_config.version 2",
     (("no_wrap", "training config script --fsdp_config.auto_wrap_policy"), True, True, "fsdp2")),
])
def test_the_auto_wrap_policy_and_the_version_stated_from_a_launch_line(line, expected, tmp_path):
    (tmp_path / "fsdp.yaml").write_text(ACCEL_FSDP)
    assert wrap_view(of_line(line, tmp_path)) == expected


def test_the_distributed_json_states_the_policy_and_what_is_written_and_null_where_not_fsdp():
    j = of_text(ACCEL_NO_POLICY.replace("fsdp_config:\n", "fsdp_config:\n  fsdp_version: 2\n"), "accelerate.yaml").to_json()
    assert (j["auto_wrap"]["value"], j["auto_wrap_stated"], j["fsdp_version_stated"]) == ("no_wrap", False, True)
    j = of_text(DS_Z3, "ds.json").to_json()
    assert (j["auto_wrap"], j["auto_wrap_stated"], j["fsdp_version_stated"]) == (None, None, None)


@pytest.mark.parametrize("config, expected", [
    ("fsdp: full_shard\n", [("GD662", "error", "fsdp")]),  # TrainingArguments' default: FSDP2 from 5.10
    ("fsdp: full_shard\nfsdp_config:\n  version: 2\n", [("GD662", "error", "fsdp_config.version")]),
    ("fsdp: full_shard\nfsdp_config:\n  version: 1\n", []),
    ("fsdp: full_shard\nfsdp_config:\n  version: 3\n", []),  # the Run's engine said FSDP2 by default before
])
def test_gd662_judges_the_runs_fsdp_version_as_written_or_by_default(config, expected):
    """GD662 (FSDP2 with Gemma's tied embedding on accelerate 1.14.0) reads the Run's engine and whether its version is
    written; the Run and the rule agree on a version written that is neither 1 nor 2."""
    tc = training_config.parse(config, "sft.yaml", yaml_first=True)
    facts, env = facts_env(tc, "gemma3_text", transformers="5.14.1", accelerate="1.14.0", torch="2.13.0")
    found = [(f.code, f.severity.value, f.key) for f in distributed_rules.check(facts, env, CheckOptions(gpu=None))
             if f.code == "GD662"]
    assert found == expected
    assert (run_distributed(facts, env).engine.value is Engine.FSDP2) == bool(expected)


# --- one precedence ------------------------------------------------------------------------------------------------

def test_accelerate_distributed_type_decides_and_a_leftover_deepspeed_section_is_ignored():
    """accelerate reads deepspeed_config only when distributed_type is DEEPSPEED: an FSDP config that still holds a
    deepspeed_config section is FSDP, with no ZeRO stage and no DeepSpeed offload."""
    text = ACCEL_FSDP.replace("FULL_SHARD", "SHARD_GRAD_OP") + (
        "deepspeed_config:\n  zero_stage: 3\n  offload_optimizer_device: cpu\n")
    d = of_text(text, "accelerate.yaml")
    assert (d.engine.value, d.zero_stage, d.offload_optimizer) == (Engine.FSDP1, None, None)


def test_trainingarguments_with_fsdp_and_deepspeed_both_named_runs_deepspeed(tmp_path):
    """TrainingArguments sets up DeepSpeed's state whenever `deepspeed` is set (transformers 5.23 training_args.py:
    use_deepspeed), whatever `fsdp` says."""
    (tmp_path / "ds.json").write_text(DS_Z3.replace('"stage": 3', '"stage": 2'))
    tc = training_config.read(str(_write(tmp_path / "sft.yaml", f"fsdp: full_shard\ndeepspeed: {tmp_path / 'ds.json'}\n")))
    facts, env = facts_env(tc)
    d = run_distributed(facts, env)
    assert (d.engine.value, d.zero_stage.value) == (Engine.DEEPSPEED, 2)
    values, _ = runplan.run_request(tc, MemoryRequest(), "sft")
    assert (values["zero_stage"], "fsdp" in values) == (2, False)


def test_a_launchers_flag_overrides_its_config_files_engine(tmp_path):
    (tmp_path / "fsdp.yaml").write_text(ACCEL_FSDP)
    assert of_line("accelerate launch --config_file fsdp.yaml train.py", tmp_path).engine.value is Engine.FSDP1
    d = of_line("accelerate launch --config_file fsdp.yaml --use_deepspeed --zero_stage 2 train.py", tmp_path)
    assert (d.engine.value, d.zero_stage.value) == (Engine.DEEPSPEED, 2)


def _write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


# --- the defects of the old reading (each fails before the Run's distributed) ----------------------------------------

def test_a_leftover_deepspeed_section_of_an_fsdp_accelerate_config_is_no_zero3_for_gd661_nor_the_memory_plan():
    """Before: GD661 (DeepSpeed ZeRO-3's loading path) was an ERROR on an accelerate FSDP run of Gemma 4 with towers
    whose YAML kept a deepspeed_config section, and the memory plan counted ZeRO-3 for a SHARD_GRAD_OP run; accelerate
    reads neither (distributed_type FSDP)."""
    text = ACCEL_FSDP.replace("FULL_SHARD", "SHARD_GRAD_OP").replace(
        "  fsdp_auto_wrap_policy: TRANSFORMER_BASED_WRAP\n", "") + "deepspeed_config:\n  zero_stage: 3\n"
    tc = training_config.parse(text, "accelerate.yaml", yaml_first=True)
    facts, env = facts_env(tc, "gemma4", transformers="5.5.4")
    assert [f.code for f in distributed_rules.check(facts, env, CheckOptions(gpu=None))] == []
    values, src = runplan.run_request(tc, MemoryRequest(), "sft")
    assert (values["zero_stage"], values["fsdp"], src["zero_stage"]) == (
        2, True, "training config fsdp_config.fsdp_sharding_strategy")


@pytest.mark.parametrize("defaults", ["deepspeed: null\nfsdp: ''\n", "deepspeed: null\n", "fsdp: ''\n"])
def test_a_saved_configs_empty_deepspeed_and_fsdp_do_not_hide_a_multi_gpu_ddp_run_from_gd133(defaults, tmp_path):
    """Before: TrainingArguments' own defaults (`deepspeed: null`, `fsdp: ''`, as a saved config writes them) were
    taken for DeepSpeed / FSDP, so GD133 (DDP with towers that get no gradient) said nothing on a multi-GPU launch."""
    (tmp_path / "sft.yaml").write_text("per_device_train_batch_size: 2\nbf16: true\n" + defaults)
    tc = launch.parse("accelerate launch --multi_gpu --num_processes 2 train.py --config sft.yaml", str(tmp_path))
    assert tc.ok, tc.error
    facts, env = facts_env(tc, "gemma4")
    assert run_distributed(facts, env).engine.value is Engine.DDP
    assert [f.code for f in members.check(facts, env, CheckOptions(gpu=None))] == ["GD133"]


def test_fsdp_true_the_transformers_5_spelling_is_planned_sharded_not_as_ddp():
    """Before: `fsdp: true` (transformers 5's `--fsdp`) named no strategy, so the memory plan counted every weight,
    gradient and optimizer state on every GPU (DDP); FSDP shards FULL_SHARD by default (accelerate's plugin; FSDP2's
    reshard_after_forward true)."""
    tc = training_config.parse("fsdp: true\nnum_processes: 4\n", "sft.yaml", yaml_first=True)
    values, src = runplan.run_request(tc, MemoryRequest(), "sft")
    assert (values.get("zero_stage"), values.get("fsdp")) == (3, True)
    assert src["zero_stage"].endswith("(FSDP's default sharding: FULL_SHARD)")


# --- the Run in check's JSON ---------------------------------------------------------------------------------------

def test_check_json_states_the_runs_distributed_fields_the_rules_judged(hub, cli, tmp_path):
    from tests.test_gemma4_lint import E2B

    hub.add("google/gemma-4-E2B-it", {"config.json": E2B})
    (tmp_path / "accelerate.yaml").write_text(
        "distributed_type: FSDP\nfsdp_config:\n  fsdp_version: 2\n  fsdp_transformer_layer_cls_to_wrap: "
        "Gemma4TextDecoderLayer,Gemma3DecoderLayer\nnum_processes: 8\nnum_machines: 2\nmixed_precision: bf16\n")
    r = cli("check", "google/gemma-4-E2B-it", "--cache-dir", hub.root, "--gpu", "A100", "--training-config",
            tmp_path / "accelerate.yaml", "--format", "json", "--fail-on", "never")
    [model] = r.json()["models"]
    d = model["run"]["distributed"]
    assert d["engine"] == {"value": "fsdp2", "source": "training config fsdp_config.fsdp_version"}
    assert d["zero_stage"] is None and d["processes_per_node"]["value"] == 4
    # the version written, the policy left to accelerate's plugin (NO_WRAP)
    assert (d["auto_wrap"]["value"], d["auto_wrap_stated"], d["fsdp_version_stated"]) == ("no_wrap", False, True)
    assert d["wrap_classes"]["value"] == [{"name": "Gemma4TextDecoderLayer", "in_model": True},
                                          {"name": "Gemma3DecoderLayer", "in_model": False}]
    # the rule judged the same list: the class the Run marks absent is the one GD682 names
    [gd682] = [f for f in model["findings"] if f["code"] == "GD682"]
    assert gd682["details"]["classes_absent"] == ["Gemma3DecoderLayer"]
    # the memory plan shards what the engine says: FSDP2's default resharding, FULL_SHARD (ZeRO-3)
    assert model["run"]["zero_stage"]["value"] == 3
    json.dumps(model["run"])


def test_zero3_through_a_launch_line_on_one_process_is_deepspeeds_loading_path_for_gd661(hub, cli, tmp_path,
                                                                                           monkeypatch):
    """GD661 is DeepSpeed ZeRO-3's loading path, which one process takes too: the Run's engine and DeepSpeed's own stage
    say so where the memory plan's sharding (run.zero_stage) is 0 on one GPU."""
    from tests.test_gemma4_lint import E2B

    hub.add("google/gemma-4-E2B-it", {"config.json": E2B})
    (tmp_path / "ds.json").write_text(DS_Z3)
    monkeypatch.chdir(tmp_path)
    r = cli("check", "google/gemma-4-E2B-it", "--cache-dir", hub.root, "--gpu", "A100", "--with",
            "transformers==5.5.4", "--launch", "python train.py --deepspeed ds.json --bf16", "--format", "json",
            "--fail-on", "never")
    [model] = r.json()["models"]
    run = model["run"]
    assert run["distributed"]["engine"]["value"] == "deepspeed" and run["distributed"]["zero_stage"]["value"] == 3
    assert run["hardware"]["count"]["value"] == 1 and run["zero_stage"]["value"] == 0
    assert [f["severity"] for f in model["findings"] if f["code"] == "GD661"] == ["error"]
