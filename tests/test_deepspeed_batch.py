"""A DeepSpeed JSON's batch (issue 32): the Trainer's integration fills an "auto" train_micro_batch_size_per_gpu /
gradient_accumulation_steps / train_batch_size from TrainingArguments and stops at start-up on a number that differs
(transformers >= 4.7.0, HfTrainerDeepSpeedConfig.fill_match; reproduced with transformers 5.23.0 and DeepSpeed 0.19.8:
`ds train_micro_batch_size_per_gpu=2 vs hf per_device_train_batch_size=8`). The Run's batch stays TrainingArguments'
(the config's, else its default 8), its source says where DeepSpeed's "auto" copies it, and a number that differs is
GD663, whether the JSON is reached through a training config's `deepspeed:` key or a `--launch` line."""

from __future__ import annotations

import json

import pytest

from tests.builders import gemma3_1b_config

REPO = "google/gemma-3-1b-it"
AUTO = {"train_micro_batch_size_per_gpu": "auto", "gradient_accumulation_steps": "auto", "train_batch_size": "auto"}
MESSAGE = ("Please correct the following DeepSpeed config values that mismatch TrainingArguments values:\n"
           "- ds train_micro_batch_size_per_gpu=2 vs hf per_device_train_batch_size=8\n"
           "The easiest method is to set these DeepSpeed config values to 'auto'.")


def check(hub, cli, tmp_path, monkeypatch, ds: dict, *, config: str | None = None, line: str | None = None) -> dict:
    """check's JSON view of the one model, with a ZeRO-2 DeepSpeed JSON `ds.json` in the working folder."""
    hub.add(REPO, {"config.json": gemma3_1b_config()})
    (tmp_path / "ds.json").write_text(json.dumps({"zero_optimization": {"stage": 2}, **ds}))
    monkeypatch.chdir(tmp_path)
    given = []
    if config is not None:
        (tmp_path / "sft.yaml").write_text(config)
        given = ["--training-config", "sft.yaml"]
    if line is not None:
        given = ["--launch", line]
    r = cli("check", REPO, "--cache-dir", hub.root, "--gpu", "A100", *given, "--format", "json", "--fail-on", "never")
    [model] = r.json()["models"]
    return model


def gd663(model: dict) -> list[dict]:
    return [f for f in model["findings"] if f["code"] == "GD663"]


@pytest.mark.parametrize("way", ["config", "launch"])
def test_a_micro_batch_other_than_trainingarguments_default_is_the_start_up_crash_and_the_run_keeps_8(
        hub, cli, tmp_path, monkeypatch, way):
    """train_micro_batch_size_per_gpu: 2 beside TrainingArguments' default 8: transformers raises at start-up; before
    this, the Run said batch 8 and nothing was flagged."""
    model = check(hub, cli, tmp_path, monkeypatch, {"train_micro_batch_size_per_gpu": 2},
                  config="deepspeed: ds.json\nbf16: true\n" if way == "config" else None,
                  line="python train.py --deepspeed ds.json --bf16" if way == "launch" else None)
    [finding] = gd663(model)
    assert finding["severity"] == "error" and MESSAGE in finding["message"]
    assert finding["key"] == ("deepspeed" if way == "config" else "script --deepspeed") + \
        " (ds.json: train_micro_batch_size_per_gpu)"
    assert finding["details"]["mismatches"] == ["- ds train_micro_batch_size_per_gpu=2 vs hf "
                                                "per_device_train_batch_size=8"]
    assert model["run"]["batch"]["value"] == 8


def test_every_mismatching_number_is_listed_as_transformers_lists_them(hub, cli, tmp_path, monkeypatch):
    """Micro batch and accumulation against the config's own values; the global batch against world x micro x
    accumulation where the processes are written (num_processes 2: 2 x 4 x 2 = 16)."""
    model = check(hub, cli, tmp_path, monkeypatch,
                  {"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 4, "train_batch_size": 32},
                  line="torchrun --nproc_per_node 2 train.py --deepspeed ds.json --per_device_train_batch_size 4 "
                       "--gradient_accumulation_steps 2 --bf16")
    [finding] = gd663(model)
    assert finding["details"]["mismatches"] == [
        "- ds train_micro_batch_size_per_gpu=2 vs hf per_device_train_batch_size=4",
        "- ds gradient_accumulation_steps=4 vs hf gradient_accumulation_steps=2",
        "- ds train_batch_size=32 vs hf train_batch_size (calculated)=16"]
    assert (model["run"]["batch"]["value"], model["run"]["gradient_accumulation_steps"]["value"]) == (4, 2)


@pytest.mark.parametrize("ds", [AUTO, {"train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 2}])
def test_auto_or_matching_numbers_are_fine(hub, cli, tmp_path, monkeypatch, ds):
    model = check(hub, cli, tmp_path, monkeypatch, ds,
                  config="deepspeed: ds.json\nper_device_train_batch_size: 4\ngradient_accumulation_steps: 2\n")
    assert gd663(model) == []
    assert (model["run"]["batch"]["value"], model["run"]["gradient_accumulation_steps"]["value"]) == (4, 2)


def test_auto_copies_trainingarguments_batch_and_the_source_says_so(hub, cli, tmp_path, monkeypatch):
    model = check(hub, cli, tmp_path, monkeypatch, AUTO, config="deepspeed: ds.json\nbf16: true\n")
    batch = model["run"]["batch"]
    assert batch["value"] == 8 and batch["source"] == (
        "default of transformers TrainingArguments (per_device_train_batch_size 8) (DeepSpeed's deepspeed "
        "(ds.json: train_micro_batch_size_per_gpu): auto copies it)")
    assert gd663(model) == []


def test_auto_find_batch_size_leaves_the_micro_batch_unchecked(hub, cli, tmp_path, monkeypatch):
    """transformers passes must_match=False for the micro and global batch under auto_find_batch_size."""
    model = check(hub, cli, tmp_path, monkeypatch, {"train_micro_batch_size_per_gpu": 2},
                  config="deepspeed: ds.json\nauto_find_batch_size: true\n")
    assert gd663(model) == []
    # the finder starts at 8 and halves on OOM: the search's choice stands (plan/runplan.trainer_defaults, which read
    # auto_find_batch_size from a setting no reader gave before this)
    assert not model["run"]["batch"]["source"].startswith("default of transformers TrainingArguments")


# transformers' own integration on the same DeepSpeed JSON and TrainingArguments, in a process that imports DeepSpeed
# (HfTrainerDeepSpeedConfig needs it): for each case, its ValueError's text, or "ok". Each case builds its own
# TrainingArguments and HfTrainerDeepSpeedConfig, so the cases share one interpreter's start-up (transformers and
# DeepSpeed imported once: about 9 s a process in CI) and nothing else; each case's outcome is the one its own process
# printed before (compared case by case, docs/ci.md "The fourteenth round").
INTEGRATION = """
import json, sys
from transformers import TrainingArguments
from transformers.integrations.deepspeed import HfTrainerDeepSpeedConfig
said = []
for i, (ds, kwargs) in enumerate(json.loads(sys.argv[1])):
    args = TrainingArguments(output_dir=f"{sys.argv[2]}/{i}", report_to=[], use_cpu=True, **kwargs)
    h = HfTrainerDeepSpeedConfig(ds)
    try:
        h.trainer_config_process(args)
        h.trainer_config_finalize(args, None, 100)
        said.append("ok")
    except ValueError as e:
        said.append(str(e).strip())  # as the one-case process printed it, stripped
print(json.dumps(said))
"""

# (the DeepSpeed JSON's batch keys, the training config, the same settings as TrainingArguments keywords)
GD663_CASES = [
    ({"train_micro_batch_size_per_gpu": 2}, "bf16: true\n", {}),
    ({"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 4, "train_batch_size": "auto"},
     "per_device_train_batch_size: 4\ngradient_accumulation_steps: 2\n",
     {"per_device_train_batch_size": 4, "gradient_accumulation_steps": 2}),
    (AUTO, "per_device_train_batch_size: 4\n", {"per_device_train_batch_size": 4}),
    ({"train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 1}, "per_device_train_batch_size: 4\n",
     {"per_device_train_batch_size": 4}),
]


@pytest.fixture(scope="module")
def integration_said(tmp_path_factory) -> list[str]:
    """What transformers' integration says of each of GD663_CASES (a ZeRO-2 JSON), in their order."""
    import os
    import subprocess
    import sys

    from tests.venvs import ensure_deepspeed

    env = {**os.environ, "PYTHONPATH": str(ensure_deepspeed())}
    cases = [({"zero_optimization": {"stage": 2}, **ds}, kwargs) for ds, _, kwargs in GD663_CASES]
    out = subprocess.run([sys.executable, "-c", INTEGRATION, json.dumps(cases), str(tmp_path_factory.mktemp("out"))],
                         capture_output=True, text=True, env=env, check=True, timeout=300)
    said = json.loads(out.stdout.strip().splitlines()[-1])
    assert len(said) == len(GD663_CASES)
    return said


@pytest.mark.parametrize("ds, config, kwargs", GD663_CASES)
def test_gd663_says_what_transformers_own_integration_raises(hub, cli, tmp_path, monkeypatch, integration_said, ds,
                                                             config, kwargs):
    """The reproduction kept as a test: transformers 5.23.0's HfTrainerDeepSpeedConfig with DeepSpeed 0.19.8 raises
    exactly where GD663 is given, with the lines GD663 lists."""
    raised = integration_said[GD663_CASES.index((ds, config, kwargs))]
    model = check(hub, cli, tmp_path, monkeypatch, ds, config="deepspeed: ds.json\n" + config)
    said = gd663(model)
    if raised == "ok":
        assert said == []
    else:
        [finding] = said
        assert raised.splitlines()[1:-1] == finding["details"]["mismatches"]
        assert f'"{raised}"' in finding["message"]


def test_gd663_judges_the_files_whatever_batch_the_plan_is_asked_for(hub, cli, tmp_path, monkeypatch):
    """`--batch-size 2` plans another batch, but the files still run TrainingArguments' default 8 against the JSON's 2:
    the Trainer stops all the same. Before, GD663 read the memory plan's Run, whose batch the option set, and said
    nothing."""
    hub.add(REPO, {"config.json": gemma3_1b_config()})
    (tmp_path / "ds.json").write_text(json.dumps({"zero_optimization": {"stage": 2}, "train_micro_batch_size_per_gpu": 2}))
    (tmp_path / "sft.yaml").write_text("deepspeed: ds.json\nbf16: true\n")
    monkeypatch.chdir(tmp_path)
    r = cli("check", REPO, "--cache-dir", hub.root, "--gpu", "A100", "--training-config", "sft.yaml", "--batch-size",
            "2", "--format", "json", "--fail-on", "never")
    [model] = r.json()["models"]
    assert model["run"]["batch"]["value"] == 2  # the plan's batch is the option's
    [finding] = gd663(model)
    assert finding["details"]["mismatches"] == ["- ds train_micro_batch_size_per_gpu=2 vs hf "
                                                "per_device_train_batch_size=8"]


@pytest.mark.parametrize("config, expected", [
    ("deepspeed: ds.json\nbf16: true\n", ["- ds train_micro_batch_size_per_gpu=2 vs hf per_device_train_batch_size=8",
                                         "- ds gradient_accumulation_steps=4 vs hf gradient_accumulation_steps=1"]),
    ("deepspeed: ds.json\nper_device_train_batch_size: 2\ngradient_accumulation_steps: 4\n", []),
    ("deepspeed: ds.json\nauto_find_batch_size: true\n",
     ["- ds gradient_accumulation_steps=4 vs hf gradient_accumulation_steps=1"]),
])
def test_gd663_is_judged_where_no_memory_plan_is_made(tmp_path, config, expected):
    """The rule on a model with no Run (no memory plan made of it: the API's and the search's facts before a plan):
    the DeepSpeed JSON against the training config's own batch or TrainingArguments' defaults. Before, nothing was
    judged without a Run."""
    from gemma_doctor.facts import CheckOptions, Environment, ModelFacts
    from gemma_doctor.family import detect
    from gemma_doctor.locate import Snapshot
    from gemma_doctor.readers import training_config
    from gemma_doctor.readers.jsonfile import JsonFile
    from gemma_doctor.readers.versions import Versions
    from gemma_doctor.rules import distributed

    (tmp_path / "ds.json").write_text(json.dumps({"zero_optimization": {"stage": 2}, "train_micro_batch_size_per_gpu": 2,
                                                  "gradient_accumulation_steps": 4}))
    (tmp_path / "sft.yaml").write_text(config)
    tc = training_config.load(str(tmp_path / "sft.yaml"))
    cfg = gemma3_1b_config()
    facts = ModelFacts(Snapshot("x", tmp_path), JsonFile(tmp_path / "config.json", True, data=cfg),
                       JsonFile(tmp_path / "generation_config.json", False), detect(cfg))
    assert facts.run is None
    env = Environment(Versions({"transformers": "5.23.0", "accelerate": "1.15.0", "torch": "2.13.0"}),
                      training_config=tc)
    found = [f for f in distributed.check(facts, env, CheckOptions(gpu=None)) if f.code == "GD663"]
    assert [f.details["mismatches"] for f in found] == ([expected] if expected else [])
