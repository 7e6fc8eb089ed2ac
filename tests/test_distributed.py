"""The distributed-run lint (rules/distributed.py, GD660-GD662) and the reading of launch configs behind it.

The decision tables call the rule on real config readers and version facts. The reproduction (slow) runs accelerate's
own auto-wrap code on tiny models in two venvs, once each (tests/scripts/fsdp_wrap_cases.py): transformers 4.57.6 +
accelerate 1.10.1 (V4_LATE: Gemma 3's list still names the Siglip tower) and this venv's 5.23.0 + 1.15.0 (Gemma 4's
list names towers a text-only or audio-less model lacks). `check`, run in each venv on the saved config with an
accelerate YAML, raises GD660; the class list the finding names, pasted into the YAML, silences it, and passed to the
same accelerate code, wraps the model.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from gemma_doctor.facts import CheckOptions, Environment, ModelFacts
from gemma_doctor.family import detect
from gemma_doctor.locate import Snapshot
from gemma_doctor.readers import training_config
from gemma_doctor.readers.jsonfile import JsonFile
from gemma_doctor.readers.versions import Versions
from gemma_doctor.rules import distributed
from tests.builders import gemma3_1b_config, gemma3_12b_config
from tests.test_crashes import gemma4_config
from tests.venvs import ACCEL_FSDP2_TIED_PACKAGES, ROOT, V4_LATE, ensure_packages, ensure_venv, subprocess_env

SCRIPT = Path(__file__).parent / "scripts" / "fsdp_wrap_cases.py"
TIED_SCRIPT = Path(__file__).parent / "scripts" / "fsdp2_tied.py"

GEMMA4_NO_AUDIO = {**gemma4_config(), "audio_config": None}
GEMMA4_TEXT = {"architectures": ["Gemma4ForCausalLM"], "model_type": "gemma4_text", "hidden_size": 1536,
               "num_hidden_layers": 35, "vocab_size": 262144}
MODELS = {"gemma3_text": gemma3_1b_config(), "gemma3": gemma3_12b_config(), "gemma4": gemma4_config(),
          "gemma4_no_audio": GEMMA4_NO_AUDIO, "gemma4_text": GEMMA4_TEXT,
          "gemma3_untied": {**gemma3_1b_config(), "tie_word_embeddings": False}}
NEW = {"transformers": "5.23.0", "accelerate": "1.15.0", "torch": "2.13.0"}


def lint(text: str, model: str, path: str = "accelerate.yaml", **versions: str):
    """[(code, severity, key)] of the distributed rule alone, and the findings."""
    tc = training_config.parse(text, path, yaml_first=path.endswith(".yaml"))
    assert tc.ok, tc.error
    cfg = MODELS[model]
    folder = Path("model")
    facts = ModelFacts(Snapshot("x", folder), JsonFile(folder / "config.json", True, data=cfg),
                       JsonFile(folder / "generation_config.json", False), detect(cfg))
    packages = {k: v for k, v in {**NEW, **versions}.items() if v}
    env = Environment(Versions(packages), training_config=tc)
    found = list(distributed.check(facts, env, CheckOptions(gpu=None)))
    return [(f.code, f.severity.value, f.key) for f in found], found


ACCEL_FSDP = """compute_environment: LOCAL_MACHINE
distributed_type: FSDP
fsdp_config:
  fsdp_version: 1
  fsdp_auto_wrap_policy: TRANSFORMER_BASED_WRAP
  fsdp_sharding_strategy: FULL_SHARD
num_machines: 2
num_processes: 16
"""
WITH_CLASSES = ACCEL_FSDP.replace("  fsdp_version: 1\n", "  fsdp_version: 1\n  fsdp_transformer_layer_cls_to_wrap: X\n")
WRAP = ("GD660", "error", "fsdp_config.fsdp_auto_wrap_policy")


@pytest.mark.parametrize("text, model, transformers, expected", [
    (ACCEL_FSDP, "gemma3_text", "4.57.6", [WRAP]),
    (ACCEL_FSDP, "gemma3_text", "5.14.1", [WRAP]),
    (ACCEL_FSDP, "gemma3_text", "5.15.0", []),  # the first release listing Gemma3DecoderLayer alone
    (ACCEL_FSDP, "gemma3_text", None, [("GD660", "warning", "fsdp_config.fsdp_auto_wrap_policy")]),
    (ACCEL_FSDP, "gemma3", "4.57.6", []),  # the multimodal model has the Siglip classes
    (ACCEL_FSDP, "gemma4_text", "5.23.0", [WRAP]),
    (ACCEL_FSDP, "gemma4_no_audio", "5.23.0", [WRAP]),
    (ACCEL_FSDP, "gemma4", "5.23.0", []),  # both towers: every listed class is there
    (WITH_CLASSES.replace(": X\n", ": Gemma3DecoderLayer\n"), "gemma3_text", "4.57.6", []),  # the cure: a class list
    # a class list that names a class the model lacks: accelerate stops all the same (GD682)
    (WITH_CLASSES.replace(": X\n", ": GemmaDecoderLayer\n"), "gemma3_text", "5.23.0",
     [("GD682", "error", "fsdp_config.fsdp_transformer_layer_cls_to_wrap")]),
    (WITH_CLASSES.replace(": X\n", ": Gemma3DecoderLayr\n"), "gemma3", "5.23.0",
     [("GD682", "error", "fsdp_config.fsdp_transformer_layer_cls_to_wrap")]),
    ("fsdp: full_shard auto_wrap\nfsdp_config:\n  transformer_layer_cls_to_wrap: [Gemma3DecoderLayer, SiglipEncoderLayer]\n",
     "gemma3", "5.23.0", []),
    (ACCEL_FSDP.replace("TRANSFORMER_BASED_WRAP", "SIZE_BASED_WRAP"), "gemma4_text", "5.23.0", []),
    (ACCEL_FSDP.replace("  fsdp_auto_wrap_policy: TRANSFORMER_BASED_WRAP\n", ""), "gemma4_text", "5.23.0", []),  # NO_WRAP
    (ACCEL_FSDP.replace("distributed_type: FSDP", "distributed_type: MULTI_GPU"), "gemma4_text", "5.23.0", []),
    # TrainingArguments / TRL / axolotl: `fsdp: ... auto_wrap` picks TRANSFORMER_BASED_WRAP unless min_num_params > 0
    ("fsdp: full_shard auto_wrap\nbf16: true\n", "gemma3_text", "4.57.6", [("GD660", "error", "fsdp")]),
    ("fsdp: [full_shard, auto_wrap]\nfsdp_config:\n  fsdp_transformer_layer_cls_to_wrap: Gemma3DecoderLayer\n",
     "gemma3_text", "4.57.6", []),
    ("fsdp: full_shard auto_wrap\nfsdp_config:\n  min_num_params: 100000\n", "gemma3_text", "4.57.6", []),
    # from 5.10 min_num_params is read only beside auto_wrap_policy: SIZE_BASED_WRAP (TrainingArguments built on
    # 4.57.6, 5.9.0, 5.10.1, 5.23.0: size-based up to 5.9.0, TRANSFORMER_BASED_WRAP from 5.10.1; was no GD660)
    ("fsdp: full_shard auto_wrap\nfsdp_config:\n  min_num_params: 100000\n", "gemma4_text", "5.23.0",
     [("GD660", "error", "fsdp")]),
    ("fsdp: full_shard\nfsdp_config:\n  min_num_params: 100000\n", "gemma3_text", "5.14.1", [("GD660", "error", "fsdp")]),
    ("fsdp: full_shard auto_wrap\nfsdp_config:\n  min_num_params: 100000\n", "gemma3_text", None,
     [("GD660", "warning", "fsdp")]),
    ("fsdp: full_shard\nfsdp_config:\n  min_num_params: 100000\n", "gemma3_text", "5.9.0", []),  # no auto_wrap: none
    ("fsdp: full_shard\nfsdp_config:\n  min_num_params: 100000\n  auto_wrap_policy: SIZE_BASED_WRAP\n", "gemma4_text",
     "5.23.0", []),
    ("fsdp: full_shard\n", "gemma3_text", "4.57.6", []),  # no auto_wrap: no wrapping before transformers 5.10
    ("fsdp: full_shard\n", "gemma4_text", "5.9.0", []),
    # from 5.10 TrainingArguments wraps TRANSFORMER_BASED_WRAP whenever fsdp is on (training_args.py of the wheels)
    ("fsdp: full_shard\n", "gemma4_text", "5.10.1", [("GD660", "error", "fsdp")]),
    ("fsdp: full_shard\n", "gemma3_text", "5.14.1", [("GD660", "error", "fsdp")]),
    ("fsdp: full_shard\n", "gemma3_text", "5.15.0", []),
    ("fsdp: full_shard\nfsdp_config:\n  auto_wrap_policy: NO_WRAP\n", "gemma4_text", "5.23.0", []),
    ("fsdp: ''\n", "gemma3_text", "4.57.6", []),
    ("fsdp: full_shard\nfsdp_config:\n  auto_wrap_policy: TRANSFORMER_BASED_WRAP\n", "gemma4_text", "5.23.0",
     [("GD660", "error", "fsdp_config.auto_wrap_policy")]),
])
def test_fsdp_wrap_decisions(text, model, transformers, expected):
    assert lint(text, model, transformers=transformers)[0] == expected


def test_gd660_names_the_classes_to_paste():
    _, [f] = lint(ACCEL_FSDP, "gemma4_no_audio", transformers="5.23.0")
    assert f.details["classes_to_wrap"] == ["Gemma4TextDecoderLayer", "Gemma4VisionEncoderLayer"]
    assert f.details["classes_absent"] == ["Gemma4AudioLayer"]
    assert "fsdp_transformer_layer_cls_to_wrap: Gemma4TextDecoderLayer,Gemma4VisionEncoderLayer" in f.fix
    assert "pip install" not in f.fix  # no release fixes Gemma 4's list yet
    _, [f] = lint(ACCEL_FSDP, "gemma3_text", transformers="4.57.6")
    assert f.details["line"] == 5 and 'pip install "transformers>=5.15.0"' in f.fix
    assert "SiglipVisionEmbeddings, SiglipEncoderLayer, SiglipMultiheadAttentionPoolingHead" in f.message


DS_Z3 = json.dumps({"zero_optimization": {"stage": 3, "offload_param": {"device": "cpu"}}, "bf16": {"enabled": True}})


@pytest.mark.parametrize("text, path, model, transformers, expected", [
    (DS_Z3, "ds.json", "gemma4", "5.5.4", [("GD661", "error", "zero_optimization.stage")]),
    (DS_Z3, "ds.json", "gemma4", "5.5.0", [("GD661", "error", "zero_optimization.stage")]),
    (DS_Z3, "ds.json", "gemma4", "5.6.0", []),
    (DS_Z3, "ds.json", "gemma4", None, [("GD661", "warning", "zero_optimization.stage")]),
    (DS_Z3, "ds.json", "gemma4_text", "5.5.4", []),  # no towers, no clip buffers
    (DS_Z3.replace('"stage": 3', '"stage": 2'), "ds.json", "gemma4", "5.5.4", []),
    ("distributed_type: DEEPSPEED\ndeepspeed_config:\n  zero_stage: 3\n", "accelerate.yaml", "gemma4", "5.5.1",
     [("GD661", "error", "deepspeed_config.zero_stage")]),
])
def test_zero3_clip_buffer_decisions(text, path, model, transformers, expected):
    assert lint(text, model, path, transformers=transformers)[0] == expected


FSDP2 = ACCEL_FSDP.replace("fsdp_version: 1", "fsdp_version: 2") \
    .replace("  fsdp_auto_wrap_policy: TRANSFORMER_BASED_WRAP\n", "")
TIED = ("GD662", "error", "fsdp_config.fsdp_version")


@pytest.mark.parametrize("text, model, accelerate, torch, expected", [
    (FSDP2, "gemma3_text", "1.14.0", "2.13.0", [TIED]),
    (FSDP2, "gemma4_text", "1.14.0", "2.13.0", [TIED]),
    (FSDP2, "gemma3_text", "1.15.0", "2.13.0", []),
    (FSDP2, "gemma3_text", "1.13.0", "2.13.0", []),
    (FSDP2, "gemma3_text", "1.14.0", "2.12.0", []),  # torch 2.12 lets two groups see one parameter
    (FSDP2, "gemma3_text", "1.14.0", None, [("GD662", "warning", "fsdp_config.fsdp_version")]),
    (FSDP2, "gemma3_untied", "1.14.0", "2.13.0", []),
    # TrainingArguments without fsdp_config.version: FSDP2 from transformers 5.10 (NEW pins 5.23.0)
    ("fsdp: full_shard\n", "gemma3_text", "1.14.0", "2.13.0", [("GD662", "error", "fsdp")]),
    ("fsdp: full_shard\nfsdp_config:\n  version: 1\n", "gemma3_text", "1.14.0", "2.13.0", []),
    (ACCEL_FSDP.replace("  fsdp_auto_wrap_policy: TRANSFORMER_BASED_WRAP\n", ""), "gemma3_text", "1.14.0", "2.13.0",
     []),  # FSDP1
])
def test_fsdp2_tied_embedding_decisions(text, model, accelerate, torch, expected):
    found = lint(text, model, accelerate=accelerate, torch=torch, transformers="5.23.0")[0]
    assert [f for f in found if f[0] == "GD662"] == expected


def test_trainer_fsdp_defaults_to_version_2_only_from_transformers_5_10():
    assert [f[0] for f in lint("fsdp: full_shard\n", "gemma3_text", accelerate="1.14.0", transformers="5.9.0")[0]] == []
    [f] = [f for f in lint("fsdp: full_shard\n", "gemma3_text", accelerate="1.14.0", transformers=None)[1]
           if f.code == "GD662"]
    assert f.severity.value == "warning" and "TrainingArguments' default from transformers 5.10" in f.message


def test_an_accelerate_config_is_read_with_its_sharding_and_shape():
    tc = training_config.parse(WITH_CLASSES, "accelerate.yaml", yaml_first=True)
    got = {k: (s.key, s.value, s.line) for k, s in tc.settings.items()}
    assert tc.kind == "accelerate"
    assert got["distributed_type"] == ("distributed_type", "FSDP", 2)
    assert got["fsdp_version"] == ("fsdp_config.fsdp_version", 1, 4)
    assert got["fsdp_wrap_classes"] == ("fsdp_config.fsdp_transformer_layer_cls_to_wrap", "X", 5)
    assert got["num_machines"] == ("num_machines", 2, 8) and got["num_processes"] == ("num_processes", 16, 9)
    ds = training_config.parse(DS_Z3, "ds.json", yaml_first=False)
    assert ds.kind == "deepspeed" and ds.get("zero_stage").value == 3 and ds.get("offload_param").value == "cpu"


# --- the reproduction: accelerate's own code, two venvs -------------------------------------------------------------

def _cases(python: str, out: Path, classes: dict) -> dict:
    done = subprocess.run([python, str(SCRIPT), str(out), json.dumps(classes)], capture_output=True, text=True,
                          timeout=600, env=subprocess_env())
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def _check(python: str, folder: Path, launch: Path, env: dict[str, str] | None = None) -> dict[str, dict]:
    done = subprocess.run([python, "-m", "gemma_doctor", "check", str(folder), "--training-config", str(launch),
                           "--format", "json", "--fail-on", "never"], capture_output=True, text=True, timeout=300,
                          env=env or subprocess_env())
    assert done.returncode == 0, done.stdout + done.stderr[-3000:]
    return {f["code"]: f for f in json.loads(done.stdout)["models"][0]["findings"]}


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict:
    """Per venv: the run with no class list, check's findings before and after pasting the cure, the cured run. The
    main stack's cured run also passes GD682's class list for gemma3_text (the cure of a wrong class, a Gemma 1
    layer: test_accelerate_stops_on_a_wrap_class_the_model_lacks...), one run of the script instead of two: the
    script takes a class list per model, and that model's run with no list is the uncured run's."""
    out = {}
    _, [gd682] = lint(WITH_CLASSES.replace(": X\n", ": GemmaDecoderLayer\n"), "gemma3_text")
    for label, python in (("4.57.6", str(ensure_venv(V4_LATE))), ("5.23.0", sys.executable)):
        work = tmp_path_factory.mktemp(f"fsdp-{label}")
        before = _cases(python, work, {})
        assert before["transformers"] == label
        launch = work / "accelerate.yaml"
        launch.write_text(ACCEL_FSDP)
        findings, cures = {}, {}
        for name in before["models"]:
            findings[name] = _check(python, work / name, launch)
            cure = findings[name].get("GD660", {}).get("details", {}).get("classes_to_wrap")
            if cure:
                cures[name] = cure
        cured_launch = work / "cured.yaml"
        after_findings = {}
        for name, cure in cures.items():
            cured_launch.write_text(WITH_CLASSES.replace(": X\n", f": {','.join(cure)}\n"))
            after_findings[name] = _check(python, work / name, cured_launch)
        wrong_class_cure = {"gemma3_text": gd682.details["classes_to_wrap"]} if label == "5.23.0" else {}
        after = _cases(python, work, {**cures, **wrong_class_cure})
        out[label] = {"before": before, "findings": findings, "cures": cures, "after_findings": after_findings,
                      "after": after, "wrong_class_cure": wrong_class_cure}
    return out


EXPECTED_CURES = {
    "4.57.6": {"gemma3_text": ["Gemma3DecoderLayer"]},
    "5.23.0": {"gemma4_text": ["Gemma4TextDecoderLayer"],
               "gemma4_no_audio": ["Gemma4TextDecoderLayer", "Gemma4VisionEncoderLayer"]},
}


@pytest.mark.slow
@pytest.mark.parametrize("label", ["4.57.6", "5.23.0"])
def test_accelerate_fails_where_gd660_says_and_its_cure_wraps_the_model(runs, label):
    run = runs[label]
    assert run["cures"] == EXPECTED_CURES[label]
    for name, model in run["before"]["models"].items():
        failed = [v for v in (model["fsdp1"], model["fsdp2"]) if v != "ok"]
        if name in run["cures"]:
            # Before: accelerate stops, naming a class the finding lists as absent.
            absent = run["findings"][name]["GD660"]["details"]["classes_absent"]
            assert len(failed) == 2, model
            for error in failed:
                assert error.startswith("ValueError: Could not find the transformer layer class ")
                assert error.split("class ")[1].split(" in the model")[0] in absent
            # After: the class list from the finding silences it and accelerate's policy wraps the layers.
            assert "GD660" not in run["after_findings"][name]
            assert run["after"]["models"][name]["fsdp1"] == "ok" and run["after"]["models"][name]["fsdp2"] == "ok"
        else:
            assert failed == [] and "GD660" not in run["findings"][name]  # 5.23.0's Gemma 3: nothing to report


def test_a_deepspeed_file_named_by_the_training_config_adds_its_stage(tmp_path):
    """`deepspeed: ds_z3.json` (TRL, axolotl, LLaMA-Factory): GD661 reads the stage from the named file."""
    (tmp_path / "ds_z3.json").write_text(json.dumps({"zero_optimization": {"stage": 3}, "deepspeed": "ds_z3.json"}))
    (tmp_path / "sft.yaml").write_text("bf16: true\ndeepspeed: ds_z3.json\n")
    tc = training_config.read(str(tmp_path / "sft.yaml"))
    stage = tc.get("zero_stage")
    assert (stage.key, stage.value) == ("deepspeed (ds_z3.json: zero_optimization.stage)", 3)
    (tmp_path / "sft.yaml").write_text("bf16: true\ndeepspeed: missing.json\n")
    assert training_config.read(str(tmp_path / "sft.yaml")).get("zero_stage") is None  # nothing to add, no error
    # The named file refers to itself: read one level, never further.
    assert training_config.read(str(tmp_path / "ds_z3.json")).get("zero_stage").key == "zero_optimization.stage"


AX_DS = "base_model: acme/model\nmicro_batch_size: 1\nbf16: true\ndeepspeed: {}\n"


@pytest.mark.parametrize("name, stage, offload", [
    ("deepspeed_configs/zero3.json", 3, (None, None)),
    ("deepspeed_configs/zero3_bf16.json", 3, (None, None)),
    ("deepspeed_configs/zero3_bf16_cpuoffload_all.json", 3, ("cpu", "cpu")),
    ("deepspeed_configs/zero3_bf16_cpuoffload_params.json", 3, (None, "cpu")),
    ("deepspeed_configs/zero2.json", 2, ("cpu", None)),  # axolotl's zero2.json offloads the optimizer
    ("deepspeed_configs/zero1.json", 1, (None, None)),
    ("zero3.json", 3, (None, None)),
])
def test_axolotl_s_bundled_deepspeed_file_is_read_by_its_name_where_it_is_not_on_disk(tmp_path, name, stage, offload):
    """Issue 32: `deepspeed: deepspeed_configs/zero3.json` in an axolotl config names a file axolotl's repository
    ships (`axolotl fetch deepspeed_configs`; deepspeed_configs/ read at 067b021), seldom on the checking machine: its
    stage and offload are read by the name (was: nothing, so GD661 did not judge it and the plan did not shard)."""
    (tmp_path / "ax.yaml").write_text(AX_DS.format(name))
    tc = training_config.read(str(tmp_path / "ax.yaml"))
    got = tc.get("zero_stage")
    assert (got.value, got.key) == (stage, f"deepspeed (axolotl's deepspeed_configs/{Path(name).name}: "
                                           "zero_optimization.stage)")
    assert tuple(getattr(tc.get(n), "value", None) for n in ("offload_optimizer", "offload_param")) == offload
    facts, env = facts_env_of(tc, "gemma4", transformers="5.5.4")
    found = [(f.code, f.severity.value) for f in distributed.check(facts, env, CheckOptions(gpu=None))]
    assert found == ([("GD661", "error")] if stage == 3 else [])


def test_a_local_deepspeed_file_wins_over_axolotl_s_bundled_one_and_only_axolotl_reads_the_bundle(tmp_path):
    (tmp_path / "deepspeed_configs").mkdir()
    (tmp_path / "deepspeed_configs" / "zero3.json").write_text(json.dumps({"zero_optimization": {"stage": 2}}))
    (tmp_path / "ax.yaml").write_text(AX_DS.format("deepspeed_configs/zero3.json"))
    got = training_config.read(str(tmp_path / "ax.yaml")).get("zero_stage")
    assert (got.value, got.key) == (2, "deepspeed (zero3.json: zero_optimization.stage)")
    # a TRL config naming a file of that name that is not here: nothing is assumed of it
    (tmp_path / "sft.yaml").write_text("max_length: 512\nbf16: true\ndeepspeed: deepspeed_configs/zero3_bf16.json\n")
    assert training_config.read(str(tmp_path / "sft.yaml")).get("zero_stage") is None
    (tmp_path / "ax2.yaml").write_text(AX_DS.format("somewhere/zero3.json"))  # not axolotl's folder
    assert training_config.read(str(tmp_path / "ax2.yaml")).get("zero_stage") is None


def facts_env_of(tc, model: str, **versions: str):
    cfg = MODELS[model]
    folder = Path("model")
    facts = ModelFacts(Snapshot("x", folder), JsonFile(folder / "config.json", True, data=cfg),
                       JsonFile(folder / "generation_config.json", False), detect(cfg))
    return facts, Environment(Versions({k: v for k, v in {**NEW, **versions}.items() if v}), training_config=tc)


@pytest.fixture(scope="module")
def tied_runs(tmp_path_factory) -> dict:
    """FSDP2 through accelerate's fsdp2_prepare_model on 2 gloo processes, and check's GD662, per accelerate."""
    work = tmp_path_factory.mktemp("fsdp2-tied")
    folder = work / "gemma3-1b"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(gemma3_1b_config()))
    launch = work / "fsdp2.yaml"
    launch.write_text(FSDP2.replace("  fsdp_sharding_strategy: FULL_SHARD\n", "  fsdp_reshard_after_forward: true\n"))
    out = {}
    # accelerate 1.14.0 beside this interpreter's stack, first on the path: the very versions of the ACCEL_FSDP2_TIED
    # venv's lock, which differs from the test stack in accelerate alone (tests/test_venvs_lock.py), without building it.
    accelerate_114 = subprocess_env(PYTHONPATH=f"{ensure_packages(ACCEL_FSDP2_TIED_PACKAGES)}:{ROOT}")
    for env in (accelerate_114, subprocess_env()):
        done = subprocess.run([sys.executable, str(TIED_SCRIPT)], capture_output=True, text=True, timeout=600, env=env)
        assert done.returncode == 0, done.stderr[-3000:]
        run = json.loads(done.stdout.strip().splitlines()[-1])
        run["findings"] = _check(sys.executable, folder, launch, env)
        out[run["accelerate"]] = run
    return out


@pytest.mark.slow
def test_fsdp2_refuses_the_tied_embedding_where_gd662_says_and_the_next_accelerate_runs(tied_runs):
    assert sorted(tied_runs) == ["1.14.0", "1.15.0"]
    before, after = tied_runs["1.14.0"], tied_runs["1.15.0"]
    assert before["torch"].startswith("2.13") and after["torch"].startswith("2.13")
    for rank in before["ranks"]:
        assert rank["tied"] and rank["result"].startswith(
            "ValueError: Parameter 'model.embed_tokens.weight' is shared with a parameter already managed by another "
            "FSDP group"), rank
    gd662 = before["findings"]["GD662"]
    assert gd662["severity"] == "error" and gd662["fix"].startswith('pip install "accelerate>=1.15.0"')
    # The cure: the release the finding names prepares and trains the same model on the same two ranks.
    assert [r["result"] for r in after["ranks"]] == ["ok", "ok"]
    assert after["ranks"][0]["loss"] == after["ranks"][1]["loss"]
    assert "GD662" not in after["findings"]


# --- the launch command line (check --launch) ------------------------------------------------------------------

def lint_launch(line: str, model: str, cwd: Path, **versions: str):
    """[(code, severity, key)] of the distributed rule for a run launched by ``line`` (run from ``cwd``)."""
    from gemma_doctor.readers import launch

    tc = launch.parse(line, str(cwd))
    assert tc.ok, tc.error
    cfg = MODELS[model]
    folder = Path("model")
    facts = ModelFacts(Snapshot("x", folder), JsonFile(folder / "config.json", True, data=cfg),
                       JsonFile(folder / "generation_config.json", False), detect(cfg))
    env = Environment(Versions({k: v for k, v in {**NEW, **versions}.items() if v}), training_config=tc)
    return [(f.code, f.severity.value) for f in distributed.check(facts, env, CheckOptions(gpu=None))], tc


@pytest.mark.parametrize("line, expected", [
    # the config file named on the line, as accelerate reads it
    ("accelerate launch --config_file fsdp.yaml train.py", [("GD660", "error")]),
    # the same run spelled with accelerate's flags alone
    ("accelerate launch --use_fsdp --fsdp_auto_wrap_policy TRANSFORMER_BASED_WRAP --num_processes 8 train.py",
     [("GD660", "error")]),
    # dash spellings, and a switch before the script (accelerate 1.15.0's parser: --debug takes no value)
    ("accelerate launch --use-fsdp --debug --fsdp-auto-wrap-policy TRANSFORMER_BASED_WRAP train.py --bf16",
     [("GD660", "error")]),
    # the cure on the line: the class list the finding names
    ("accelerate launch --config_file fsdp.yaml --fsdp_transformer_layer_cls_to_wrap Gemma4TextDecoderLayer train.py",
     []),
    ("accelerate launch --config_file fsdp.yaml --fsdp_auto_wrap_policy SIZE_BASED_WRAP train.py", []),
    ("accelerate launch \\\n  --use_fsdp \\\n  --fsdp_auto_wrap_policy TRANSFORMER_BASED_WRAP \\\n  train.py",
     [("GD660", "error")]),
    # TrainingArguments on the script's line (torchrun): from 5.10 `--fsdp full_shard` wraps by class
    ("torchrun --nnodes 2 --nproc-per-node 8 train.py --fsdp full_shard --bf16", [("GD660", "error")]),
    ("torchrun --nproc_per_node=8 train.py --fsdp 'full_shard auto_wrap' --fsdp_config.auto_wrap_policy NO_WRAP", []),
])
def test_a_launch_line_is_linted_like_its_config(line, expected, tmp_path):
    (tmp_path / "fsdp.yaml").write_text(ACCEL_FSDP)
    assert lint_launch(line, "gemma4_text", tmp_path, transformers="5.23.0")[0] == expected


@pytest.mark.parametrize("line, processes, machines", [
    ("torchrun --nnodes 2 --nproc-per-node 8 train.py", 16, 2),
    ("torchrun --nnodes=1:4 --nproc_per_node 2 train.py", 8, 4),  # elastic: the most it may run
    ("python -m torch.distributed.run --nproc-per-node 4 train.py", 4, 1),
    # python's own options before -m (-u, -B, -X opt, -W arg) are not the module's
    ("python -u -m torch.distributed.run --nproc-per-node 4 train.py", 4, 1),
    ("python3 -X dev -W ignore -B -m torch.distributed.run --nnodes 2 --nproc_per_node 2 train.py", 4, 2),
    # torch.distributed.launch (deprecated, still in torch 2.13.0): torchrun's parser and its --use-env switch
    ("python -m torch.distributed.launch --use-env --nnodes 2 --nproc_per_node 4 train.py", 8, 2),
    # a CI step or job script continues the line with backslash-newline (bash drops both)
    ("torchrun \\\n  --nnodes 2 \\\n  --nproc-per-node 8 \\\r\n  train.py", 16, 2),
    ("deepspeed --num_gpus 4 --num_nodes 2 train.py --deepspeed ds.json", 8, 2),
    ("NCCL_DEBUG=INFO accelerate launch --config_file fsdp.yaml --num_processes 32 --num_machines 4 train.py", 32, 4),
    ("accelerate launch --config_file fsdp.yaml train.py", 16, 2),  # the file's own shape
])
def test_a_launch_line_gives_the_shape_of_the_run(line, processes, machines, tmp_path):
    (tmp_path / "fsdp.yaml").write_text(ACCEL_FSDP)
    _, tc = lint_launch(line, "gemma4_text", tmp_path)
    assert (tc.get("num_processes").value, tc.get("num_machines").value) == (processes, machines)


def test_a_launch_line_follows_the_deepspeed_json_it_names(tmp_path):
    (tmp_path / "ds.json").write_text(DS_Z3)
    found, tc = lint_launch("deepspeed --num_gpus 8 train.py --deepspeed ds.json --bf16", "gemma4", tmp_path,
                            transformers="5.5.4")
    assert found == [("GD661", "error")] and tc.get("zero_stage").value == 3


def test_check_reads_the_launch_line_end_to_end(cli, tmp_path, monkeypatch):
    """The memory plan shards over the processes the line starts; the script's arguments are its settings; a line
    that cannot be read is a finding on the launch command, never a traceback."""
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text(json.dumps(gemma3_12b_config()))
    monkeypatch.chdir(tmp_path)
    line = ("torchrun --nnodes 2 --nproc-per-node 4 train.py --per_device_train_batch_size 2 --max_seq_length 512 "
            "--gradient_checkpointing --bf16 --deepspeed ds.json")
    (tmp_path / "ds.json").write_text(json.dumps({"zero_optimization": {"stage": 3}}))
    r = cli("check", str(model), "--launch", line, "--gpu", "A100", "--format", "json", "--fail-on", "never")
    doc = r.json()
    settings = doc["environment"]["training_config"]["settings"]
    assert settings["num_processes"]["value"] == 8 and settings["batch_size"]["value"] == 2
    assert settings["zero_stage"]["value"] == 3
    run = doc["models"][0]["memory"]["run"]
    assert (run["num_gpus"], run["zero_stage"], run["batch_size"], run["seq_len"]) == (8, 3, 2, 512)
    assert run["sources"]["num_gpus"] == "training config torchrun line: num_processes"
    for bad, said in (("bash train.sh", "is not a launcher"), ("torchrun --nnodes", "has no value"),
                      ("accelerate launch --config_file missing.yaml train.py", "does not exist"),
                      ("torchrun 'unclosed", "not a command line"),
                      ("python t.py --" + ".".join(["a"] * 3000) + " 1", "nested deeper"),
                      ("deepspeed --num_gpus x t.py", "is not an integer"),
                      ("accelerate launch --config_file /dev/null/x t.py", "does not exist")):
        r = cli("check", str(model), "--launch", bad, "--gpu", "A100", "--format", "json", "--fail-on", "never")
        assert r.code == 0 and "Traceback" not in r.err, r
        assert said in json.dumps(r.json()["environment"]["training_config"]), bad


@pytest.mark.parametrize("line", ["torchrun --nnodes ² train.py", "torchrun --nproc_per_node ² train.py",
                                  "deepspeed --num_gpus ² train.py", "accelerate launch --num_processes ² train.py",
                                  "python train.py --per_device_train_batch_size ²"])
def test_a_count_of_non_ascii_digits_is_not_a_count(cli, tmp_path, line):
    """'²' is a digit to str.isdigit() but not to int(): a count written so is read as no count (or GD601's
    'is not a count'), never exit 70."""
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text(json.dumps(gemma3_12b_config()))
    r = cli("check", str(model), "--launch", line, "--gpu", "A100", "--format", "json", "--fail-on", "never")
    assert r.code == 0 and "Traceback" not in r.err, r
    processes = r.json()["models"][0]["memory"]["run"]["num_gpus"]
    assert processes == 1 or "is not a count" in json.dumps(r.json()["environment"]["training_config"])


@pytest.mark.slow
def test_accelerate_stops_on_a_wrap_class_the_model_lacks_and_the_class_table_is_the_installed_transformers(tmp_path,
                                                                                                        runs):
    """GD682's evidence: accelerate's own auto-wrap on a tiny Gemma 3 built here stops on GemmaDecoderLayer (Gemma 1's)
    and on a misspelling, and wraps with the class the finding names (in the runs fixture's cured run of this stack);
    model_classes.json equals what docs/gen_model_classes.py reads from this transformers."""
    classes = {"gemma3_text": ["GemmaDecoderLayer"]}
    done = subprocess.run([sys.executable, str(SCRIPT), str(tmp_path), json.dumps(classes)], capture_output=True,
                          text=True, timeout=600, env=subprocess_env())
    assert done.returncode == 0, done.stderr[-2000:]
    got = json.loads(done.stdout)["models"]["gemma3_text"]
    assert "Could not find the transformer layer class GemmaDecoderLayer" in got["fsdp1"], got
    _, [finding] = lint(WITH_CLASSES.replace(": X\n", ": GemmaDecoderLayer\n"), "gemma3_text")
    assert finding.code == "GD682" and finding.details["classes_to_wrap"] == ["Gemma3DecoderLayer"]
    cured = runs["5.23.0"]
    assert cured["wrong_class_cure"] == {"gemma3_text": finding.details["classes_to_wrap"]}
    assert cured["after"]["transformers"] == "5.23.0" and cured["after"]["models"]["gemma3_text"]["fsdp1"] == "ok"
    import importlib.util

    import transformers

    from gemma_doctor.readers.model_classes import model_classes

    if transformers.__version__ != model_classes().read_from:
        pytest.skip(f"the table was read from transformers {model_classes().read_from}")
    spec = importlib.util.spec_from_file_location("gen_model_classes", Path(__file__).parent.parent / "docs" / "gen_model_classes.py")
    gen = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gen)
    assert gen.render() == gen.OUT.read_text()


@pytest.mark.parametrize("line, ds_bf16, expected", [
    ("deepspeed --num_gpus 2 train.py --deepspeed ds.json", True, "GD603"),
    ("deepspeed --num_gpus 2 train.py --deepspeed_config ds.json", True, "GD603"),  # deepspeed's own argument
    ("deepspeed --num_gpus 2 train.py --deepspeed ds.json", "auto", "GD609"),  # auto copies TrainingArguments
])
def test_the_precision_of_a_deepspeed_json_reached_through_launch_is_read(cli, tmp_path, monkeypatch, line, ds_bf16,
                                                                          expected):
    """The JSON's bf16 was ignored: the run read as 'trains in fp32' (GD609), and bf16 on a T4 passed."""
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text(json.dumps(gemma3_12b_config()))
    monkeypatch.chdir(tmp_path)
    (tmp_path / "ds.json").write_text(json.dumps({"bf16": {"enabled": ds_bf16}, "zero_optimization": {"stage": 2}}))
    r = cli("check", str(model), "--launch", line, "--gpu", "T4", "--format", "json", "--fail-on", "never")
    codes = {f["code"]: f for f in r.json()["models"][0]["findings"]}
    assert expected in codes and not {"GD603", "GD609"} - {expected} & set(codes)
    if expected == "GD603":
        assert "ds.json: bf16.enabled" in codes["GD603"]["key"]


# What accelerate 1.15.0 and torch 2.13.0's torchrun do with a process count they do not run as written (run here:
# `accelerate launch --num_processes 0 t.py` without a GPU runs t.py once; `--multi_gpu --num_processes 0` raises
# "You need to use at least 2 processes"; `--num_processes 1e9` exits 2, "invalid int value"; `torchrun
# --nproc-per-node 0|-1` stops in its elastic agent (AssertionError), `1e9` "Unsupported nproc_per_node value", `auto`
# started one process per CPU core here (no GPU)). Each is read as the launcher runs it or refused in one line: never
# a silent single process.
@pytest.mark.parametrize("line, processes, said", [
    ("accelerate launch --num_processes 0 train.py --bf16", 1, "num_processes 0 (accelerate's single-process launcher"),
    ("accelerate launch --num_processes -1 train.py --bf16", 1,
     "num_processes -1 (accelerate's single-process launcher"),
    ("accelerate launch --num_processes 1e9 train.py", None, "is not an integer: accelerate launch refuses it"),
    ("accelerate launch --num_processes nan train.py", None, "is not an integer"),
    ("accelerate launch --multi_gpu --num_processes 0 train.py", None, "stops accelerate launch"),
    ("accelerate launch --multi_gpu --num_processes 1 train.py", None, "at least 2 processes"),
    ("accelerate launch --use_fsdp --num_processes -1 train.py", None, "stops accelerate launch"),
    ("accelerate launch --config_file fsdp.yaml --num_processes 0 train.py", None, "stops accelerate launch"),
    ("torchrun --nproc-per-node 0 train.py", None, "--nproc-per-node 0 stops torchrun"),
    ("torchrun --nproc_per_node=-1 train.py", None, "--nproc-per-node -1 stops torchrun"),
    ("torchrun --nproc-per-node 1e9 train.py", None, "is not a count torchrun reads"),
    ("torchrun --nproc-per-node cpu train.py", None, "one process per CPU core"),
    ("torchrun --nproc-per-node auto train.py --bf16", 3, "torchrun line: num_processes auto"),
    ("torchrun --nnodes 2 --nproc-per-node gpu train.py --bf16", 3, "torchrun line: num_processes auto"),
])
def test_a_process_count_the_launcher_does_not_run_as_written_is_read_as_it_runs_or_refused(cli, tmp_path, monkeypatch,
                                                                                              line, processes, said):
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text(json.dumps(gemma3_12b_config()))
    (tmp_path / "fsdp.yaml").write_text(ACCEL_FSDP)
    monkeypatch.chdir(tmp_path)
    r = cli("check", str(model), "--launch", line, "--gpu", "A100", "--num-gpus", "3", "--format", "json",
            "--fail-on", "never")
    assert r.code == 0 and "Traceback" not in r.err, r
    doc = r.json()
    run = doc["models"][0]["memory"]["run"]
    if processes is None:  # refused in one line (GD601), the launcher's own reason in it
        error = doc["environment"]["training_config"]["error"]
        assert said in error and "\n" not in error
        assert [f["code"] for f in doc["models"][0]["findings"] if said in f["message"]] == ["GD601"]
    elif "auto" in said:  # one process per GPU visible: the count --num-gpus gives, said so
        r = cli("check", str(model), "--launch", line, "--gpu", "A100", "--format", "json", "--fail-on", "never")
        seen = r.json()["models"][0]["memory"]["run"]
        assert seen["num_gpus"] == 1 and "one process per GPU visible (1)" in seen["sources"]["num_gpus"]
        assert run["num_gpus"] == processes and run["sources"]["num_gpus"] == "option"
    else:
        setting = doc["environment"]["training_config"]["settings"]["num_processes"]
        assert setting["value"] == processes and said in setting["key"]
        assert run["num_gpus"] == 3  # --num-gpus wins, as over any config's count


def test_the_launchers_themselves_treat_those_counts_so():
    """The evidence, from the launchers installed here: accelerate's parser refuses a count that is not an integer;
    torchrun's determine_local_world_size reads integers as given (its agent then refuses one under 1) and names."""
    from accelerate.commands.launch import launch_command_parser
    from torch.distributed.run import determine_local_world_size

    for bad in ("1e9", "nan", "auto"):
        with pytest.raises(SystemExit):
            launch_command_parser().parse_args(["--num_processes", bad, "train.py"])
    assert launch_command_parser().parse_args(["--num_processes", "-1", "train.py"]).num_processes == -1
    assert determine_local_world_size("0") == 0 and determine_local_world_size("-1") == -1
    for bad in ("1e9", "all"):
        with pytest.raises(ValueError, match="Unsupported nproc_per_node value"):
            determine_local_world_size(bad)
    assert determine_local_world_size("cpu") >= 1
