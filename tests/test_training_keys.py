"""GD680 / GD681: keys and values of a TRL / TrainingArguments config that its trainer refuses, found before the run
with the setting meant; the key table (trainer_keys.json) is read from the installed TRL's own dataclasses."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gemma_doctor.readers.training_config import parse, trainer_keys
from tests.builders import gemma3_12b_config, generation_config

TYPOS = "model_name_or_path: m\ndataset_name: d\noutput_dir: out\nper_device_train_batch_sze: 4\nbf16: ture\n"


def _findings(hub, cli, tmp_path, text: str, name: str = "sft.yaml") -> tuple[int, list[dict]]:
    hub.add("google/gemma-3-12b-it", {"config.json": gemma3_12b_config(), "generation_config.json": generation_config()})
    (tmp_path / name).write_text(text)
    r = cli("check", "google/gemma-3-12b-it", "--cache-dir", hub.root, "--gpu", "A100", "--training-config",
            tmp_path / name, "--format", "json")
    return r.code, r.json()["models"][0]["findings"]


def test_a_misspelt_key_and_a_misspelt_boolean_are_errors_that_name_the_setting_meant(hub, cli, tmp_path):
    """Both passed silently: the batch was the default one, and `bf16: ture` read as 'trains in fp32' (GD609)."""
    code, found = _findings(hub, cli, tmp_path, TYPOS)
    assert code == 1
    by_code = {f["code"]: f for f in found}
    assert by_code["GD680"]["key"] == "per_device_train_batch_sze" and by_code["GD680"]["details"]["line"] == 4
    assert "did you mean per_device_train_batch_size?" in by_code["GD680"]["message"]
    assert by_code["GD681"]["key"] == "bf16" and by_code["GD681"]["fix"] == "bf16: true"
    assert "GD609" not in by_code  # the run does not train in fp32: it does not start


def test_a_script_s_own_keys_older_trl_keys_and_other_trainers_are_not_flagged(hub, cli, tmp_path):
    own = "lr: 3e-5\nmodel_path: x\nmax_seq_length: 2048\nevaluation_strategy: steps\nbf16: auto\nfp16: no\n"
    assert not [f for f in _findings(hub, cli, tmp_path, own)[1] if f["code"] in ("GD680", "GD681")]
    axolotl = "base_model: google/gemma-3-12b-it\nmicro_batch_size: 2\nper_device_train_batch_sze: 4\n"
    assert parse(axolotl, "a.yaml", True).problems == ()


def test_json_configs_name_the_line_too():
    tc = parse(json.dumps({"bf16": True, "gradient_acumulation_steps": 4}, indent=1), "args.json", False)
    [p] = tc.problems
    assert (p.kind, p.key, p.suggestion, p.line) == ("unknown-key", "gradient_acumulation_steps",
                                                     "gradient_accumulation_steps", 3)


@pytest.mark.slow
def test_trl_itself_refuses_both_and_the_table_is_the_installed_trl_s(tmp_path):
    """The evidence: the installed TRL's parser (what `trl sft --config` runs) stops on each mistake, and the key
    table equals what docs/gen_trainer_keys.py reads from that TRL's dataclasses."""
    trl = pytest.importorskip("trl")
    from trl import ModelConfig, ScriptArguments, SFTConfig, TrlParser
    from trl.scripts.utils import DatasetMixtureConfig

    table = trainer_keys()
    if trl.__version__ != table["read_from"]["trl"]:
        pytest.skip(f"the table was read from TRL {table['read_from']['trl']}, not {trl.__version__}")
    # bf16 false and use_cpu: SFTConfig refuses bf16 on a machine without a GPU before it looks at unknown keys.
    base = "model_name_or_path: m\ndataset_name: d\noutput_dir: out\nuse_cpu: true\n"
    for extra, words in (("bf16: false\nper_device_train_batch_sze: 4\n", "Unknown arguments from config file"),
                         ("bf16: ture\n", None)):
        (tmp_path / "c.yaml").write_text(base + extra)
        parser = TrlParser((ScriptArguments, SFTConfig, ModelConfig, DatasetMixtureConfig))
        with pytest.raises((ValueError, SystemExit)) as e:
            parser.parse_args_and_config(args=["--config", str(tmp_path / "c.yaml")])
        if words:
            assert words in str(e.value)
        else:
            assert e.type is SystemExit  # argparse: "Truthy value expected: got ture"
    import importlib.util

    spec = importlib.util.spec_from_file_location("gen_trainer_keys", Path(__file__).parent.parent / "docs" / "gen_trainer_keys.py")
    gen = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gen)
    assert gen.render() == gen.OUT.read_text()


@pytest.mark.parametrize("text, words", [
    ("model: google/gemma-3-12b-it\ntensor-parallel-size: 2\nmax-model-len: 8192\ndtype: bfloat16\n", "vLLM serving"),
    ("model-path: google/gemma-3-12b-it\ntp-size: 2\nmem-fraction-static: 0.8\n", "SGLang server"),
    ("trainer:\n  devices: 8\n  precision: bf16-mixed\nmodel:\n  micro_batch_size: 1\nexp_manager: {}\n", "NeMo"),
])
def test_serving_and_nemo_configs_are_refused_in_one_line_not_read_as_fp32_training(hub, cli, tmp_path, text, words):
    """Read as transformers training configs they said "trains in fp32" (GD609)."""
    hub.add("google/gemma-3-12b-it", {"config.json": gemma3_12b_config()})
    (tmp_path / "c.yaml").write_text(text)
    r = cli("check", "google/gemma-3-12b-it", "--cache-dir", hub.root, "--training-config", tmp_path / "c.yaml")
    assert r.code == 2 and r.out == "" and words in r.err and r.err.count("\n") == 1


@pytest.mark.parametrize("line", ["vllm serve google/gemma-3-12b-it --tensor-parallel-size 2",
                                  "python -m vllm.entrypoints.openai.api_server --model google/gemma-3-12b-it",
                                  "python3 -m sglang.launch_server --model-path google/gemma-3-12b-it --tp 2"])
def test_a_serving_launch_line_is_no_unreadable_training_run(hub, cli, line):
    """`--launch "vllm serve ..."` failed GD601 ("not a launcher gemma-doctor reads")."""
    hub.add("google/gemma-3-12b-it", {"config.json": gemma3_12b_config()})
    r = cli("check", "google/gemma-3-12b-it", "--cache-dir", hub.root, "--launch", line, "--format", "json",
            "--fail-on", "never")
    codes = {f["code"] for f in r.json()["models"][0]["findings"]}
    assert not {c for c in codes if c.startswith("GD6")}, codes


AXOLOTL_TYPOS = ("base_model: google/gemma-3-12b-it\nadapter: lora\nmicro_batch_sze: 2\ngradient_acumulation_steps: 4\n"
                 "sequence_len: 2048\nbf16: true\n")


def test_a_misspelt_axolotl_key_is_named_with_the_field_meant(hub, cli, tmp_path):
    """axolotl 0.19.0's schema drops a key it has no field for (pydantic's extra="ignore": `micro_batch_sze: 2`
    validates and trains with micro_batch_size 1, reproduced), and check passed it silently; TRL's typos were already
    GD680. GD986 names each with its line and the field meant, from axolotl's own schema (axolotl_keys.json)."""
    code, found = _findings(hub, cli, tmp_path, AXOLOTL_TYPOS, "axolotl.yaml")
    gd986 = {f["key"]: f for f in found if f["code"] == "GD986"}
    assert set(gd986) == {"micro_batch_sze", "gradient_acumulation_steps"}, found
    assert gd986["micro_batch_sze"]["severity"] == "warning" and gd986["micro_batch_sze"]["details"]["line"] == 3
    assert "did you mean micro_batch_size?" in gd986["micro_batch_sze"]["message"]
    assert gd986["gradient_acumulation_steps"]["fix"] == "rename gradient_acumulation_steps to gradient_accumulation_steps"
    assert gd986["micro_batch_sze"]["details"]["read_from"] == {"axolotl": "0.19.0"}
    assert not [f for f in found if f["code"] in ("GD680", "GD681")]  # TRL's table is not axolotl's


def test_a_misspelt_axolotl_boolean_is_an_error_not_a_run_in_fp32(hub, cli, tmp_path):
    """Issue 32: `bf16: ture` passed silently. A TRL config's was GD681 already; an axolotl config's was read as off
    and check said GD609 "trains in fp32", while axolotl 0.19.0's schema refuses the config before training starts
    (a pydantic ValidationError: test_axolotl_s_schema_refuses_the_booleans_check_flags runs it)."""
    code, found = _findings(hub, cli, tmp_path, "base_model: google/gemma-3-12b-it\nadapter: lora\nbf16: ture\n",
                            "axolotl.yaml")
    by_code = {f["code"]: f for f in found}
    assert code == 1 and by_code["GD681"]["severity"] == "error", sorted(by_code)
    gd681 = by_code["GD681"]
    assert (gd681["key"], gd681["details"]["line"], gd681["fix"]) == ("bf16", 3, "bf16: true")
    assert "axolotl 0.19.0's schema refuses the config" in gd681["message"] and "did you mean true?" in gd681["message"]
    assert "GD609" not in by_code and "GD986" not in by_code  # the run does not start; bf16 is axolotl's own key


# (key, value as a YAML string, refused by axolotl 0.19.0's schema): pydantic reads yes/no, true/false, on/off, t/f,
# y/n, 1/0 in any case and strips nothing; a `Literal["auto"] | bool` field (bf16, tf32) its word as written, a plain
# bool field (fp16) not even "auto"; gradient_checkpointing is `Literal["offload", "offload_disk"] | bool`.
AXOLOTL_BOOLEANS = (("bf16", "ture", True), ("bf16", "True", False), ("bf16", "ON", False), ("bf16", " true", True),
                    ("bf16", "Auto", True), ("bf16", "auto", False), ("bf16", "off", False), ("fp16", "auto", True),
                    ("fp16", "ture", True), ("fp16", "No", False), ("tf32", "auto", False), ("tf32", "yse", True),
                    ("gradient_checkpointing", "offload", False), ("gradient_checkpointing", "ture", True),
                    ("sample_packing", "Y", False), ("sample_packing", "1", False), ("sample_packing", "2", True))


@pytest.mark.parametrize("key, value, refused", AXOLOTL_BOOLEANS)
def test_an_axolotl_boolean_is_read_as_pydantic_reads_it(key, value, refused):
    tc = parse(f"base_model: m\n{key}: {json.dumps(value)}\n", "ax.yaml", True)
    assert [(p.kind, p.key) for p in tc.problems] == ([("not-boolean", key)] if refused else [])


@pytest.mark.slow
def test_axolotl_s_schema_refuses_the_booleans_check_flags():
    """The evidence: axolotl 0.19.0's AxolotlInputConfig (what `axolotl train` validates first) refuses exactly the
    values AXOLOTL_BOOLEANS flags, and the literal words of axolotl_keys.json are docs/gen_axolotl_keys.py's reading of
    that schema."""
    import subprocess
    import sys

    from tests.venvs import ROOT, ensure_packages, subprocess_env

    script = (
        "import json, sys\n"
        "from axolotl.utils.schemas.config import AxolotlInputConfig\n"
        "sys.path.insert(0, sys.argv[2])\n"
        "import gen_axolotl_keys\n"
        "base = dict(base_model='m', datasets=[{'path': 'd', 'type': 'alpaca'}], micro_batch_size=1, num_epochs=1,\n"
        "            learning_rate=1e-4, output_dir='o', sequence_len=512)\n"
        "refused = []\n"
        "for key, value in json.loads(sys.argv[1]):\n"
        "    try:\n"
        "        AxolotlInputConfig(**base, **{key: value})\n"
        "        refused.append(False)\n"
        "    except ValueError:\n"
        "        refused.append(True)\n"
        "print(json.dumps({'refused': refused, 'table': gen_axolotl_keys.render()}))\n")
    env = subprocess_env(PYTHONPATH=f"{ensure_packages(AXOLOTL)}:{ROOT}", HF_HUB_OFFLINE="1")
    done = subprocess.run([sys.executable, "-c", script, json.dumps([(k, v) for k, v, _ in AXOLOTL_BOOLEANS]),
                           str(ROOT / "docs")], capture_output=True, text=True, env=env, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    ran = json.loads(done.stdout.strip().splitlines()[-1])
    assert ran["refused"] == [refused for _, _, refused in AXOLOTL_BOOLEANS]
    assert ran["table"] == (ROOT / "gemma_doctor" / "readers" / "axolotl_keys.json").read_text()


LF_TYPO = ("model_name_or_path: google/gemma-3-12b-it\nstage: sft\ndo_train: true\nfinetuning_type: lora\n"
           "template: gemma3\nper_device_train_batch_sze: 4\n")


def test_a_misspelt_llamafactory_key_is_named_with_the_field_meant(hub, cli, tmp_path):
    """Issue 32: key typos passed silently. LLaMA-Factory 0.9.5 refuses a key its argument classes lack
    (test_llamafactory_itself_refuses_the_typo_and_the_table_is_its_arguments runs it); check said nothing."""
    code, found = _findings(hub, cli, tmp_path, LF_TYPO, "lf.yaml")
    gd680 = [f for f in found if f["code"] == "GD680"]
    assert code == 1 and len(gd680) == 1, found
    assert (gd680[0]["key"], gd680[0]["severity"], gd680[0]["details"]["line"]) == ("per_device_train_batch_sze", "error", 6)
    assert "LLaMA-Factory 0.9.5's arguments; did you mean per_device_train_batch_size?" in gd680[0]["message"]
    assert gd680[0]["fix"] == "rename per_device_train_batch_sze to per_device_train_batch_size"
    # the keys recommend writes for LLaMA-Factory are its own (a flagged one would reject every candidate)
    from gemma_doctor.readers.training_config import key_table

    sys_path = str(Path(__file__).resolve().parent.parent / "benchmarks")
    import sys

    sys.path.insert(0, sys_path)
    try:
        import prescription_grid
    finally:
        sys.path.remove(sys_path)
    assert prescription_grid.LF_KEYS <= set(key_table("llamafactory_keys")["keys"])


@pytest.mark.parametrize("written, flagged", [('"false"', True), ("ture", True), ('"no"', True), ("false", False),
                                              ('"true"', False), ("true", False)])
def test_a_llamafactory_boolean_written_as_a_string_is_read_as_llamafactory_runs_it(hub, cli, tmp_path, written, flagged):
    """LLaMA-Factory 0.9.5 hands a string to bf16 unconverted, where any non-empty one is true (the slow test below runs
    its parser): `bf16: "false"` trains in bf16. check planned it in the recommended bf16 and said GD609 "trains in
    fp32" beside it (`bf16: ture`), or planned fp32 (`"false"`); now the Run is bf16 from the key and GD681 says why."""
    (tmp_path / "lf.yaml").write_text(f"model_name_or_path: google/gemma-3-12b-it\nstage: sft\nfinetuning_type: lora\n"
                                      f"bf16: {written}\n")
    hub.add("google/gemma-3-12b-it", {"config.json": gemma3_12b_config(), "generation_config.json": generation_config()})
    r = cli("check", "google/gemma-3-12b-it", "--cache-dir", hub.root, "--gpu", "A100", "--training-config",
            tmp_path / "lf.yaml", "--format", "json")
    m = r.json()["models"][0]
    codes = {f["code"]: f for f in m["findings"]}
    on = written != "false"
    assert (m["run"]["precision"]["value"], m["run"]["precision"]["source"]) == ("bf16" if on else "fp32",
                                                                                 "training config bf16")
    assert ("GD609" in codes) is not on
    assert ("GD681" in codes) is flagged, sorted(codes)
    if flagged:
        assert codes["GD681"]["key"] == "bf16" and "any non-empty string is true" in codes["GD681"]["message"]


@pytest.mark.slow
def test_llamafactory_itself_refuses_the_typo_and_the_table_is_its_arguments():
    """The evidence: LLaMA-Factory 0.9.5's own parser (`_parse_train_args`, what `llamafactory-cli train` runs) stops
    on the misspelt key and reads the config without it, turns bf16 on for any string, and llamafactory_keys.json is
    docs/gen_llamafactory_keys.py's reading of its argument classes."""
    import os
    import subprocess

    import yaml

    from tests.venvs import ROOT, ensure_llamafactory, subprocess_env

    script = (
        "import json, sys\n"
        "sys.path.insert(0, sys.argv[2])\n"
        "import gen_llamafactory_keys\n"
        "from llamafactory.hparams.parser import _parse_train_args\n"
        "config = json.loads(sys.argv[1])\n"
        "out = {'table': gen_llamafactory_keys.render()}\n"
        "try:\n"
        "    _parse_train_args(config)\n"
        "    out['typo'] = 'read'\n"
        "except ValueError as e:\n"
        "    out['typo'] = str(e)\n"
        "config.pop('per_device_train_batch_sze')\n"
        "out['batch'] = _parse_train_args(config)[2].per_device_train_batch_size\n"
        "out['bf16'] = {}\n"
        "for written in ('false', 'ture', 'no', 'true'):\n"
        "    try:\n"
        "        _parse_train_args({**config, 'bf16': written})\n"
        "        out['bf16'][written] = 'off'\n"
        "    except ValueError as e:  # TrainingArguments on a machine without bf16: bf16 was on\n"
        "        out['bf16'][written] = 'on' if 'bf16' in str(e) else str(e)\n"
        "print(json.dumps(out))\n")
    config = {**yaml.safe_load(LF_TYPO), "dataset": "identity", "output_dir": "out"}
    python, packages = ensure_llamafactory()
    done = subprocess.run([str(python), "-c", script, json.dumps(config), str(ROOT / "docs")], capture_output=True,
                          text=True, timeout=600, env=subprocess_env(PYTHONPATH=os.pathsep.join((str(ROOT), str(packages)))))
    assert done.returncode == 0, done.stderr[-3000:]
    ran = json.loads(done.stdout.strip().splitlines()[-1])
    assert ran["typo"] == "Some keys are not used by the HfArgumentParser: ['per_device_train_batch_sze']", ran["typo"]
    assert ran["batch"] == 8  # TrainingArguments' default: the run the typo meant to change
    # a string is no boolean to LLaMA-Factory: any non-empty one turns bf16 on ("Your setup doesn't support bf16/gpu")
    assert ran["bf16"] == {"false": "on", "ture": "on", "no": "on", "true": "on"}, ran["bf16"]
    assert ran["table"] == (ROOT / "gemma_doctor" / "readers" / "llamafactory_keys.json").read_text()


def test_the_axolotl_yaml_recommend_writes_has_no_key_axolotl_drops(hub, cli, tmp_path):
    """Every key of the prescription's axolotl YAML passes GD986 (a rejected key would reject every candidate) and is a
    field of axolotl's schema (GD986 flags only near-misspellings: num_processes, torch_dtype and a bare
    bnb_4bit_compute_dtype passed it while axolotl dropped them), for LoRA, QLoRA, 8-bit, preference and sharded runs."""
    import yaml

    from gemma_doctor.readers.training_config import key_table

    axolotl = set(key_table("axolotl_keys")["keys"])
    hub.add("google/gemma-3-12b-it", {"config.json": gemma3_12b_config(), "generation_config.json": generation_config()})
    for extra in (("--gpu", "L4"), ("--gpu", "L4", "--task", "qlora"), ("--gpu", "A100", "--task", "dpo"),
                  ("--gpu", "A100", "--num-gpus", "4"), ("--gpu", "T4", "--num-gpus", "8"),
                  ("--gpu", "A100", "--quantization", "8bit")):
        text = cli("recommend", "google/gemma-3-12b-it", "--cache-dir", hub.root, *extra, "--format", "yaml").out
        tc = parse(text, "rec.yaml", True)
        assert tc.kind == "axolotl" and tc.problems == (), (extra, tc.problems)
        assert sorted(set(yaml.safe_load(text)) - axolotl) == [], extra


def test_the_axolotl_key_table_is_read_from_axolotl_s_schema():
    """The table names its source and release, and holds the keys axolotl's configs are made of (its aliases too)."""
    from gemma_doctor.readers.training_config import key_table

    table = key_table("axolotl_keys")
    assert table["read_from"] == {"axolotl": "0.19.0"} and "AxolotlInputConfig" in table["schema"]
    assert {"base_model", "micro_batch_size", "gradient_accumulation_steps", "sequence_len", "adapter",
            "lora_target_linear", "datasets", "model_type", "model_config"} <= set(table["keys"])
    assert table["keys"] == sorted(set(table["keys"]))


@pytest.mark.parametrize("switches, dtype, key", [("bf16: true\n", "bfloat16", "bf16"), ("fp16: true\n", "float16", "fp16"),
                                                  ("bf16: false\n", "float32", "bf16")])
def test_a_quantized_axolotl_config_loads_in_the_dtype_its_precision_says(switches, dtype, key):
    """axolotl's normalize_config sets torch_dtype from bf16 / fp16 / load_in_8bit (else float32) and loads with it
    (0.19.0, run on the real package: bf16 -> torch.bfloat16, fp16 / load_in_8bit -> torch.float16, bf16 and fp16
    off -> torch.float32): the reader states that dtype where the config names none."""
    tc = parse(f"base_model: m\nadapter: qlora\nload_in_4bit: true\n{switches}", "ax.yaml", True)
    got = tc.get("torch_dtype")
    assert (got.key, got.value) == (key, dtype)


@pytest.mark.parametrize("switches, expected", [("bf16: auto\nfp16: true\n", ("fp16", "float16")),
                                                ("bf16: auto\n", None),
                                                # no switch is `bf16: auto`, the schema's default (was float32)
                                                ("", None), ("fp16: true\n", ("fp16", "float16"))])
def test_axolotl_s_bf16_auto_is_the_gpu_s_choice_unless_fp16_is_on(switches, expected):
    """axolotl 0.19.0's resolve_dtype (utils/config/__init__.py) turns `bf16: auto` off where fp16 is on (torch_dtype
    float16, was left open), and leaves it to is_torch_bf16_gpu_available otherwise (no dtype the reader can state).
    An unset bf16 is `auto`: validate_config fills in the schema's default before normalize_config (both run on the
    real 0.19.0 here: no switch -> torch.bfloat16 where the GPU has bf16, torch.float16 where not)."""
    tc = parse(f"base_model: m\nadapter: qlora\nload_in_4bit: true\n{switches}", "ax.yaml", True)
    got = tc.get("torch_dtype")
    assert ((got.key, got.value) if got is not None else None) == expected


def test_a_qlora_axolotl_config_without_a_dtype_is_no_gd705(hub, cli, tmp_path):
    """GD705 (transformers 4.x loads bitsandbytes weights in float16 where no dtype is named) called every axolotl
    QLoRA config without torch_dtype an error: axolotl always names the dtype (above), and torch_dtype is no key of its
    schema (the prescription wrote it, axolotl dropped it)."""
    hub.add("google/gemma-3-12b-it", {"config.json": gemma3_12b_config(), "generation_config.json": generation_config()})
    path = tmp_path / "ax.yaml"
    path.write_text("base_model: google/gemma-3-12b-it\nadapter: qlora\nload_in_4bit: true\nbf16: true\nmicro_batch_size: 1\n")
    r = cli("check", "google/gemma-3-12b-it", "--cache-dir", hub.root, "--gpu", "A100", "--with", "transformers==4.50.3",
            "--training-config", path, "--format", "json", "--fail-on", "never")
    assert "GD705" not in {f["code"] for f in r.json()["models"][0]["findings"]}


AXOLOTL = ("axolotl==0.19.0", "colorama==0.4.6", "addict==2.4.0", "pillow==13.0.0")  # as tests/test_catalogue.py
# The cases of axolotl's own config path that the two precision tests below hold check's plan to: on the training GPU
# (is_torch_bf16_gpu_available True and False) and on a Mac's "mps".
AXOLOTL_PRECISION = {"none": {}, "fp16 off": {"fp16": False}, "bf16 off": {"bf16": False}, "auto": {"bf16": "auto"},
                     "auto, fp16": {"bf16": "auto", "fp16": True}, "bf16": {"bf16": True}}
AXOLOTL_PRECISION_MPS = {**AXOLOTL_PRECISION, "bf16, fp16 off": {"bf16": True, "fp16": False}, "fp16": {"fp16": True}}


@pytest.fixture(scope="module")
def axolotl_ran(tmp_path_factory) -> dict:
    """What axolotl 0.19.0's validate_config and normalize_config make of each case
    (tests/scripts/axolotl_precision.py), both devices in one process: one start-up importing axolotl and transformers
    instead of two (about 9 s each in CI); each device's cases are validated and normalised afresh, and the results
    are the ones two processes gave (docs/ci.md, "The fourteenth round")."""
    import subprocess
    import sys

    import transformers

    from tests.venvs import ROOT, ensure_packages, subprocess_env

    tiny = tmp_path_factory.mktemp("axolotl") / "tiny"
    transformers.Gemma3TextConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
                                  num_key_value_heads=1, head_dim=16, vocab_size=300).save_pretrained(tiny)
    env = subprocess_env(PYTHONPATH=f"{ensure_packages(AXOLOTL)}:{ROOT}", HF_HUB_OFFLINE="1")
    done = subprocess.run([sys.executable, str(ROOT / "tests" / "scripts" / "axolotl_precision.py"), str(tiny),
                           json.dumps(AXOLOTL_PRECISION), json.dumps(AXOLOTL_PRECISION_MPS)], capture_output=True,
                          text=True, env=env, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.slow
def test_axolotl_s_own_config_path_gives_the_precision_and_load_dtype_check_plans(axolotl_ran):
    """axolotl 0.19.0's validate_config fills in its schema's `bf16: auto` where the config sets none, and
    normalize_config's resolve_dtype turns it on where is_torch_bf16_gpu_available() says so (every CUDA GPU: torch
    counts emulation), else fp16 (run here on the real modules): the precision and load dtype check plans for an axolotl
    config (runplan.trainer_defaults over the config's switches) are the ones axolotl runs with on a bf16 GPU. Was: no
    switch planned in the recommended precision, its load dtype float32."""
    from gemma_doctor.plan import runplan

    cases, ran = AXOLOTL_PRECISION, axolotl_ran
    # Where the GPU says no bf16 (a CPU; torch counts a T4's emulation as bf16), axolotl falls back to fp16
    assert ran["none|False"] == {"bf16": False, "fp16": True, "torch_dtype": "float16"}
    for name, settings in cases.items():
        axolotl = ran[f"{name}|True"]
        text = "base_model: m\nmicro_batch_size: 1\n" + "".join(f"{k}: {str(v).lower()}\n" for k, v in settings.items())
        tc = parse(text, "ax.yaml", True)
        values, _ = runplan.run_request(tc, runplan.MemoryRequest(), "sft")
        for key, value, _why in runplan.trainer_defaults(tc, None, None):
            if key in ("precision", "load_dtype"):
                values[key] = value
        autocast = "bf16" if axolotl["bf16"] else "fp16" if axolotl["fp16"] else "fp32"
        assert (values.get("precision"), values.get("load_dtype")) == (autocast, axolotl["torch_dtype"]), name


@pytest.mark.slow
def test_axolotl_on_mps_runs_fp16_where_bf16_is_on_or_auto_and_check_plans_that(axolotl_ran):
    """axolotl 0.19.0's resolve_dtype on the device its choose_device picks on a Mac ("mps"): bf16 on or auto (either
    answer of is_torch_bf16_gpu_available: macOS 14+ says True) becomes fp16 with float16 weights unless fp16 is
    written false, which leaves fp32 (run here on the real modules). check plans the same on an MPS GPU
    (runplan.trainer_defaults with the GPU's backend); was bf16 with bfloat16 weights."""
    from gemma_doctor.plan import runplan

    cases, ran = AXOLOTL_PRECISION_MPS, axolotl_ran
    assert ran["bf16|True|mps"] == {"bf16": False, "fp16": True, "torch_dtype": "float16"}
    for name, settings in cases.items():
        text = "base_model: m\nmicro_batch_size: 1\n" + "".join(f"{k}: {str(v).lower()}\n" for k, v in settings.items())
        tc = parse(text, "ax.yaml", True)
        values, _ = runplan.run_request(tc, runplan.MemoryRequest(), "sft")
        for key, value, _why in runplan.trainer_defaults(tc, None, None, "mps"):
            if key in ("precision", "load_dtype"):
                values[key] = value
        for gpu_bf16 in (True, False):  # macOS 14+ or older: the same run on MPS
            axolotl = ran[f"{name}|{gpu_bf16}|mps"]
            autocast = "bf16" if axolotl["bf16"] else "fp16" if axolotl["fp16"] else "fp32"
            assert (values.get("precision"), values.get("load_dtype")) == (autocast, axolotl["torch_dtype"]), name
