"""The method a user fixes reaches every trainer's run (issue 32: "a user's explicit choice is kept").

A training config that names no method runs its trainer's default, and check plans that run: TRL's trainers and a plain
Trainer train every weight (TRL's ModelConfig.use_peft is false unless set: get_peft_config gives no peft_config),
axolotl without `adapter` too, LLaMA-Factory without `finetuning_type` trains LoRA (0.9.5's FinetuningArguments). On
main, `recommend --trainer trl|transformers --method full` wrote a YAML without use_peft that check planned as QLoRA
"chosen to fit": the precision line and the YAML said full fine-tuning, the memory line QLoRA."""

from __future__ import annotations

import pytest
import yaml

from gemma_doctor.plan import runplan
from gemma_doctor.readers import gpu as gpu_reader
from gemma_doctor.readers import training_config
from gemma_doctor.trainers import Trainer
from tests.test_pitfalls import GEMMA1

# How the memory line (and the precision line) names each method.
SUMMARY_WORDS = {"full": "full fine-tuning", "lora": "LoRA r=", "qlora": "QLoRA "}
TRAINERS = ("trl", "transformers", "axolotl", "llama-factory")


@pytest.fixture(scope="module")
def gemma1(tmp_path_factory):
    from tests.builders import HubCache

    hub = HubCache(tmp_path_factory.mktemp("gemma1"))
    hub.add("google/gemma-2b", {"config.json": GEMMA1})
    return str(hub.root)


@pytest.mark.parametrize("method", ["full", "lora", "qlora"])
@pytest.mark.parametrize("trainer", TRAINERS)
def test_the_method_fixed_is_the_method_planned_in_every_view_and_by_check_of_the_yaml(cli, gemma1, tmp_path,
                                                                                       trainer, method):
    """Gemma 1 2B on a T4, `--method M --trainer T`: a prescription is a run of M in the JSON (prescription, its Run,
    the memory block), the text's precision and memory lines, and check of its YAML plans M at the same figure; no
    prescription names M's run as the nearest (the method fixed is the choice that cannot pass). On main `--trainer
    trl|transformers --method full` prescribed "full fine-tuning" with the memory of a QLoRA run (4.6 / 7.5 GiB)."""
    args = ("recommend", "google/gemma-2b", "--cache-dir", gemma1, "--gpu", "T4", "--method", method, "--trainer",
            trainer)
    m = cli(*args, "--format", "json").json()["models"][0]
    mem, p = m["memory"], m["prescription"]
    assert mem["method"] == mem["run"]["method"] == method and "method" in mem["fixed"], (mem["method"], mem["fixed"])
    assert SUMMARY_WORDS[method] in mem["summary"], mem["summary"]
    text = cli(*args).out
    if p is None:
        assert m["status"] == "no-prescription" and f"nearest run: {mem['summary']}" in text, text
        return
    assert p["method"] == p["run"]["method"]["value"] == m["recommendation"]["method"] == method
    assert p["memory"] == mem["summary"] and f"memory {p['memory']}" in text, (p["memory"], text)
    head = next(line for line in text.splitlines() if line.strip().startswith("precision "))
    assert {"full": "full fine-tuning", "lora": "LoRA", "qlora": "QLoRA"}[method] in head, head
    path = tmp_path / "run.yaml"
    path.write_text(m["snippets"]["yaml"])
    told = ("--seq-len", str(p["seq_len"])) if trainer == "transformers" else ()  # the format states no sequence
    checked = cli("check", "google/gemma-2b", "--cache-dir", gemma1, "--gpu", "T4", "--training-config", path, *told,
                  "--format", "json").json()["models"][0]
    assert checked["memory"]["method"] == checked["run"]["method"]["value"] == method, checked["memory"]["summary"]
    assert checked["memory"]["summary"] == p["memory"]


def _planned(text: str, name: str = "c.yaml") -> tuple[str, str, tuple[str, ...]]:
    """(method, its source, the settings fixed) of check's plan of a config (no option given), as pipeline plans it."""
    tc = training_config.parse(text, name, yaml_first=True)
    req = runplan.request_spec(precision="bf16", gpu=gpu_reader.resolve("A100"), request=runplan.MemoryRequest(),
                               training_config=tc, task="sft", defaults=runplan.trainer_defaults(tc, None))
    return req.base.method, req.base.source("method"), req.fixed


@pytest.mark.parametrize("text, trainer, method, source", [
    ("model_name_or_path: google/gemma-2b\nmax_length: 1024\nbf16: true\n", Trainer.TRL_SFT, "full",
     "default of TRL's ModelConfig (use_peft false unless set)"),
    ("model_name_or_path: google/gemma-2b\nbeta: 0.1\nloss_type: [sigmoid]\n", Trainer.TRL_DPO, "full",
     "default of TRL's ModelConfig (use_peft false unless set)"),
    ("per_device_train_batch_size: 2\noutput_dir: out\nbf16: true\n", Trainer.TRANSFORMERS, "full",
     "default of transformers Trainer: the config names no PEFT"),
    ("model_name_or_path: google/gemma-2b\nstage: sft\ntemplate: gemma\nbf16: true\n", Trainer.LLAMA_FACTORY, "lora",
     "default of LLaMA-Factory (0.9.5's finetuning_type: lora unless set)"),
    ("base_model: google/gemma-2b\nbf16: true\n", Trainer.AXOLOTL, "full",
     "default of axolotl (0.19.0: no adapter, every weight trains)"),
], ids=["trl-sft", "trl-dpo", "training-arguments", "llama-factory", "axolotl"])
def test_a_config_that_names_no_method_plans_its_trainers_default_with_its_source(text, trainer, method, source):
    """Where a config leaves the method to its trainer, the Run takes that trainer's default, fixed (the config settles
    it), with the default as its source. On main TRL's, TrainingArguments' and LLaMA-Factory's were open ("chosen to
    fit": QLoRA wherever full fine-tuning did not fit)."""
    tc = training_config.parse(text, "c.yaml", yaml_first=True)
    assert tc.trainer.value is trainer
    got, where, fixed = _planned(text)
    assert (got, "method" in fixed) == (method, True) and where.startswith(source), where


@pytest.mark.parametrize("name, text, method", [
    ("trl.yaml", "model_name_or_path: google/gemma-2b\nmax_length: 1024\n", "full"),
    ("args.yaml", "per_device_train_batch_size: 1\noutput_dir: out\n", "full"),
    ("axolotl.yaml", "base_model: google/gemma-2b\n", "full"),
    ("lf.yaml", "model_name_or_path: google/gemma-2b\nstage: sft\ntemplate: gemma\n", "lora"),
], ids=["trl", "training-arguments", "axolotl", "llama-factory"])
def test_recommend_keeps_the_method_a_users_config_leaves_to_its_trainer(cli, gemma1, tmp_path, name, text, method):
    """The search keeps the method of the user's config as check plans it (the search's own request takes no trainer
    defaults, so a default read there alone was open to it: an axolotl config without `adapter`, full fine-tuning, got
    a QLoRA prescription). Gemma 1 2B on a T4: full fine-tuning fits nowhere, so no prescription, its nearest run a
    full one; LLaMA-Factory's LoRA is prescribed."""
    path = tmp_path / name
    path.write_text(text)
    m = cli("recommend", "google/gemma-2b", "--cache-dir", gemma1, "--gpu", "T4", "--training-config", path,
            "--format", "json").json()["models"][0]
    assert m["memory"]["method"] == method and "method" in m["memory"]["fixed"], m["memory"]["summary"]
    if m["prescription"] is not None:
        assert m["prescription"]["method"] == m["prescription"]["run"]["method"]["value"] == method
    else:
        assert method == "full", m["blocking"]


@pytest.mark.parametrize("text, method", [
    ("max_length: 1024\nuse_peft: true\n", "lora"),
    ("max_length: 1024\nuse_peft: true\nload_in_4bit: true\n", "qlora"),
    ("max_length: 1024\nuse_peft: false\n", "full"),
    ("stage: sft\ntemplate: gemma\nfinetuning_type: full\n", "full"),
    ("stage: sft\ntemplate: gemma\nquantization_bit: 4\n", "qlora"),
    ("base_model: m\nadapter: qlora\nload_in_4bit: true\n", "qlora"),
])
def test_a_config_that_names_its_method_keeps_it(text, method):
    """The config's own words stand over the trainer's default."""
    got, where, fixed = _planned(text)
    assert got == method and "method" in fixed and where.startswith("training config"), where


@pytest.mark.parametrize("text, method, source", [
    ("max_length: 1024\nlora_r: 16\nlora_target_modules: all-linear\n", "full",
     "default of TRL's ModelConfig (use_peft false unless set): lora_r, lora_target_modules unused"),
    ("max_length: 1024\nuse_peft: true\nlora_r: 16\nlora_target_modules: all-linear\n", "lora",
     "training config use_peft"),
    ("max_length: 1024\nlora_r: 16\nload_in_4bit: true\n", "qlora", "training config load_in_4bit"),
], ids=["lora-keys-no-use-peft", "use-peft", "4bit-no-use-peft"])
def test_trl_lora_keys_without_use_peft_plan_the_full_run_trl_runs(text, method, source):
    """A TRL config with LoRA keys but no use_peft: true trains every weight (TRL 1.16's get_peft_config reads use_peft
    alone: test_trls_own_parser_ignores_lora_keys_without_use_peft), and check plans that, naming the unused keys. On
    main the method was left open ("chosen to fit"). With load_in_4bit the quantized run stays planned: GD612 says
    transformers refuses it."""
    got, where, fixed = _planned(text)
    assert (got, "method" in fixed) == (method, True) and where.startswith(source), where


def test_lora_keys_of_a_trainingarguments_script_leave_the_method_open():
    """A TrainingArguments config with LoRA keys but no use_peft: the user's script reads them its own way."""
    got, where, fixed = _planned("per_device_train_batch_size: 1\noutput_dir: out\nlora_r: 16\n")
    assert "method" not in fixed, where


def test_trls_own_parser_ignores_lora_keys_without_use_peft(tmp_path):
    """TRL 1.16's own `trl sft` parser (trl/scripts/sft.py make_parser) reads lora_r / lora_target_modules without
    use_peft as no PEFT, and still quantizes for load_in_4bit (get_quantization_config reads it alone)."""
    trl = pytest.importorskip("trl")
    if trl.__version__ != "1.16.0":
        pytest.skip(f"read in TRL 1.16.0, not {trl.__version__}")
    from trl import get_peft_config, get_quantization_config
    from trl.scripts.sft import make_parser

    path = tmp_path / "c.yaml"
    path.write_text("model_name_or_path: google/gemma-2b\ndataset_name: d\noutput_dir: out\nuse_cpu: true\n"
                    "lora_r: 16\nlora_alpha: 32\nlora_target_modules: [q_proj, v_proj]\nload_in_4bit: true\n")
    _, _, model, *_ = make_parser().parse_args_and_config(args=["--config", str(path)], fail_with_unknown_args=True)
    assert (model.use_peft, model.lora_r, model.lora_target_modules) == (False, 16, ["q_proj", "v_proj"])
    assert get_peft_config(model) is None and get_quantization_config(model).load_in_4bit is True
    assert training_config.parse(path.read_text(), "c.yaml", yaml_first=True).trainer.value.runs_trl


def test_trls_own_parser_gives_no_peft_config_for_a_full_prescription(cli, gemma1, tmp_path):
    """TRL 1.16's own parser, as `trl sft --config` builds it, reads the YAML recommend writes for `--trainer trl
    --method full` on an A100 (a run that fits) as no PEFT (get_peft_config: None): every weight trains, the run check
    plans."""
    trl = pytest.importorskip("trl")
    from trl import ModelConfig, ScriptArguments, SFTConfig, TrlParser, get_peft_config
    from trl.scripts.utils import DatasetMixtureConfig

    if trl.__version__ != "1.16.0":
        pytest.skip(f"read in TRL 1.16.0, not {trl.__version__}")
    m = cli("recommend", "google/gemma-2b", "--cache-dir", gemma1, "--gpu", "A100", "--method", "full", "--trainer",
            "trl", "--format", "json").json()["models"][0]
    assert m["prescription"]["method"] == m["memory"]["method"] == "full"
    data = yaml.safe_load(m["snippets"]["yaml"])
    assert "use_peft" not in data
    data.pop("tf32", None)
    data.update(bf16=False, use_cpu=True)  # TrainingArguments refuses bf16 and tf32 on this CPU
    path = tmp_path / "full.yaml"
    path.write_text(yaml.safe_dump(data))
    parser = TrlParser((ScriptArguments, SFTConfig, ModelConfig, DatasetMixtureConfig))
    _, _, model, _ = parser.parse_args_and_config(args=["--config", str(path), "--dataset_name", "d"],
                                                  fail_with_unknown_args=True)
    assert model.use_peft is False and get_peft_config(model) is None


@pytest.mark.slow
def test_llamafactorys_own_parser_reads_a_config_without_finetuning_type_as_lora(tmp_path):
    """LLaMA-Factory 0.9.5's own HfArgumentParser over its argument classes (as test_trainer_formats parses every
    prescription) gives finetuning_type "lora" to a config that names none, the method check plans for it."""
    import json
    import os
    import subprocess

    from tests.test_trainer_formats import _LF_PARSE
    from tests.venvs import ROOT, ensure_llamafactory, subprocess_env

    text = "model_name_or_path: google/gemma-2b\nstage: sft\ndo_train: true\ntemplate: gemma\noutput_dir: out\n"
    path = tmp_path / "lf.yaml"
    path.write_text(text)
    python, packages = ensure_llamafactory()
    done = subprocess.run([str(python), "-c", _LF_PARSE, str(path)], capture_output=True, text=True, timeout=600,
                          env=subprocess_env(PYTHONPATH=os.pathsep.join((str(ROOT), str(packages)))))
    assert done.returncode == 0, done.stderr[-3000:]
    [parsed] = json.loads(done.stdout)
    assert parsed[0] == "lora" and parsed[4] is None, parsed  # finetuning_type, quantization_bit
    assert _planned(text)[0] == "lora"
