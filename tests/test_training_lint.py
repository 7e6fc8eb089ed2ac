"""`check --training-config`: the precision settings of a training run judged against the model and the GPU."""

from __future__ import annotations

import json

import pytest

from gemma_doctor.readers import training_config
from gemma_doctor.rules.training import fallback_gpu
from tests.builders import gemma2_config, gemma3_1b_config, gemma3_12b_config, generation_config, llama_config

TRL_DPO_FP16 = {"output_dir": "out", "fp16": True, "beta": 0.1, "rpo_alpha": None, "max_grad_norm": 0.0,
                "gradient_checkpointing": True, "model_init_kwargs": {"use_cache": True, "torch_dtype": "float16"}}
AXOLOTL_AUTO = """base_model: google/gemma-3-12b-it
adapter: qlora
load_in_4bit: true
micro_batch_size: 2
bf16: auto
tf32: false
rl: dpo
"""
ACCELERATE_BF16 = """compute_environment: LOCAL_MACHINE
distributed_type: MULTI_GPU
mixed_precision: bf16
num_processes: 2
"""


def _lint(hub, cli, tmp_path, name, text, *extra, config=None):
    hub.add("google/gemma-3-12b-it", {"config.json": config or gemma3_12b_config(), "generation_config.json": generation_config()})
    path = tmp_path / name
    path.write_text(text if isinstance(text, str) else json.dumps(text, indent=2))
    r = cli("check", "google/gemma-3-12b-it", "--cache-dir", hub.root, "--training-config", path, "--format", "json", *extra)
    [model] = r.json()["models"]
    return r, path, [f for f in model["findings"] if f["code"].startswith("GD6")]


def _by_code(findings):
    return {f["code"]: f for f in findings}


def test_trl_json_fp16_dpo_on_gemma3_points_at_each_key_and_line(hub, cli, tmp_path):
    r, path, findings = _lint(hub, cli, tmp_path, "dpo.json", TRL_DPO_FP16, "--gpu", "A100")
    got = _by_code(findings)
    assert r.code == 1
    # GD610: model_init_kwargs.torch_dtype float16. GD611: the config names no use_peft, so TRL's DPOTrainer trains every
    # weight (ModelConfig.use_peft false), loaded in float16, under fp16: the GradScaler refuses (on main the method was
    # left open and chosen, so GD611 was not said)
    assert set(got) == {"GD602", "GD606", "GD607", "GD610", "GD611"}
    assert (got["GD602"]["severity"], got["GD602"]["file"], got["GD602"]["key"]) == ("error", str(path), "fp16")
    assert got["GD602"]["details"]["line"] == 3  # json.dumps(indent=2): line 1 "{", line 2 output_dir, line 3 fp16
    assert (got["GD606"]["key"], got["GD606"]["severity"]) == ("model_init_kwargs.use_cache", "warning")
    assert "gradient_checkpointing" in got["GD606"]["message"]
    assert (got["GD607"]["severity"], got["GD607"]["key"]) == ("warning", "max_grad_norm")
    assert "turns gradient clipping off" in got["GD607"]["message"]


def test_axolotl_bf16_auto_on_t4_warns_and_qlora_is_judged_against_the_gpu(hub, cli, tmp_path):
    r, path, findings = _lint(hub, cli, tmp_path, "axolotl.yml", AXOLOTL_AUTO + "bnb_4bit_compute_dtype: bfloat16\n", "--gpu", "T4")
    got = _by_code(findings)
    assert set(got) == {"GD605", "GD607", "GD608"}
    assert (got["GD605"]["severity"], got["GD605"]["key"], got["GD605"]["details"]["line"]) == ("warning", "bf16", 5)
    assert "T4" in got["GD605"]["message"]
    assert (got["GD608"]["severity"], got["GD608"]["key"], got["GD608"]["details"]["line"]) == ("error", "bnb_4bit_compute_dtype", 8)
    # DPO with bf16 and no max_grad_norm relies on the trainer default: info, not a warning
    assert got["GD607"]["severity"] == "info"


def test_axolotl_bf16_auto_on_an_ampere_gpu_is_fine(hub, cli, tmp_path):
    _, _, findings = _lint(hub, cli, tmp_path, "axolotl.yaml", AXOLOTL_AUTO + "max_grad_norm: 1.0\n", "--gpu", "L4")
    assert findings == []


def test_accelerate_bf16_on_a_gpu_without_native_bf16_is_an_error(hub, cli, tmp_path):
    r, path, findings = _lint(hub, cli, tmp_path, "accelerate.yaml", ACCELERATE_BF16, "--gpu", "V100")
    [f] = findings
    assert (f["code"], f["severity"], f["file"], f["key"], f["details"]["line"]) == ("GD603", "error", str(path), "mixed_precision", 3)
    assert r.code == 1


def test_both_fp16_and_bf16(hub, cli, tmp_path):
    _, _, findings = _lint(hub, cli, tmp_path, "args.yaml", "bf16: true\nfp16: true\n", "--gpu", "H100")
    got = _by_code(findings)
    assert set(got) == {"GD602", "GD604"}
    assert got["GD604"]["details"]["line"] == 2


def test_deepspeed_enabled_blocks_are_read(hub, cli, tmp_path):
    ds = {"train_micro_batch_size_per_gpu": "auto", "fp16": {"enabled": True}, "zero_optimization": {"stage": 2}}
    _, _, findings = _lint(hub, cli, tmp_path, "ds.json", ds, "--gpu", "A100")
    [f] = findings
    assert (f["code"], f["key"]) == ("GD602", "fp16.enabled")


def test_no_precision_setting_is_reported_as_fp32(hub, cli, tmp_path):
    r, _, findings = _lint(hub, cli, tmp_path, "args.json", {"output_dir": "x", "learning_rate": 1e-4})
    assert [(f["code"], f["severity"]) for f in findings] == [("GD609", "info")]


@pytest.mark.parametrize("plan, severity", [(("--with", "transformers==4.50.0"), "error"), ((), "warning")])
def test_use_cache_in_training_config_is_an_error_where_transformers_450_will_run(hub, cli, tmp_path, plan, severity):
    """Planned for a 4.50.0 machine it crashes evaluation: an error; with the installed 5.x only a warning.
    The same with 4.50.0 really installed: tests/test_legacy_libraries.py."""
    _, _, findings = _lint(hub, cli, tmp_path, "args.json", {"bf16": True, "use_cache": True}, "--gpu", "A100", *plan)
    [f] = findings
    assert (f["code"], f["severity"], f["key"]) == ("GD606", severity, "use_cache")
    assert "HybridCache" in f["message"] and ("4.51.0" in f["fix"]) is (severity == "error")


@pytest.mark.parametrize("text, name, error", [
    ("bf16: [true\n", "bad.yaml", "not valid YAML"),
    ('{"bf16": true,}', "bad.json", "not valid JSON"),
    ("- bf16\n- fp16\n", "list.yaml", "not a mapping"),
    ("", "empty.yaml", "empty file"),
    ("\xff\xfe", "binary.json", "not UTF-8"),
])
def test_malformed_training_configs_are_findings_not_tracebacks(hub, cli, tmp_path, text, name, error):
    hub.add("org/m", {"config.json": gemma2_config()})
    path = tmp_path / name
    path.write_bytes(text.encode("latin-1"))
    r = cli("check", "org/m", "--cache-dir", hub.root, "--training-config", path, "--format", "json")
    [f] = [f for f in r.json()["models"][0]["findings"] if f["code"].startswith("GD6")]
    assert (f["code"], f["severity"], f["file"]) == ("GD601", "error", str(path))
    assert error in f["message"]
    assert "Traceback" not in r.err


def test_missing_training_config_is_a_one_line_usage_error(hub, cli, tmp_path):
    hub.add("org/m", {"config.json": gemma3_1b_config()})
    r = cli("check", "org/m", "--cache-dir", hub.root, "--training-config", tmp_path / "nope.yaml")
    assert r.code == 2
    assert r.out == ""
    assert r.err.strip().count("\n") == 0 and "nope.yaml does not exist" in r.err


def test_non_gemma_models_are_not_linted(hub, cli, tmp_path):
    hub.add("org/llama", {"config.json": llama_config()})
    hub.add("org/gemma", {"config.json": gemma3_1b_config()})  # a llama alone is no Gemma to check (exit 2)
    path = tmp_path / "a.json"
    path.write_text('{"fp16": true}')
    r = cli("check", "org/llama", "org/gemma", "--cache-dir", hub.root, "--training-config", path, "--format", "json")
    assert [f["code"] for f in r.json()["models"][0]["findings"]] == ["GD003"]
    assert "GD602" in {f["code"] for f in r.json()["models"][1]["findings"]}


def test_training_config_is_reported_once_in_the_environment(hub, cli, tmp_path):
    r, path, _ = _lint(hub, cli, tmp_path, "a.yaml", "fp16: true\n", "--gpu", "T4")
    env = r.json()["environment"]["training_config"]
    assert env == {"path": str(path), "kind": "transformers", "error": None,
                   "settings": {"fp16": {"key": "fp16", "value": True, "line": 1}},
                   "trainer": {"value": "transformers", "source": "training config (TrainingArguments keys only: a "
                                                                  "plain transformers Trainer, unless --launch names TRL)"}}


def test_fallback_gpu_reading():
    assert fallback_gpu("T4").native_bf16 is False and fallback_gpu("T4").emulated_trap
    assert fallback_gpu("8.0").native_bf16 is True
    assert fallback_gpu("none").native_bf16 is None


def test_reader_never_raises_on_yaml_bombs_and_deep_nesting():
    bomb = "a: &a [x, x, x, x, x, x, x, x, x]\n" + "".join(
        f"{chr(98 + i)}: &{chr(98 + i)} [*{chr(97 + i)}, *{chr(97 + i)}, *{chr(97 + i)}, *{chr(97 + i)}]\n" for i in range(8))
    tc = training_config.parse(bomb + "bf16: true\n", "x.yaml", yaml_first=True)
    assert tc.ok and tc.get("bf16").value is True
    deep = training_config.parse("[" * 100000 + "]" * 100000, "x.json", yaml_first=False)
    assert not deep.ok


TRL_LORA_NO_PEFT = ("model_name_or_path: google/gemma-3-12b-it\nbf16: true\nmax_length: 1024\nlora_r: 16\n"
                    "lora_alpha: 32\nlora_target_modules: [q_proj, v_proj]\n")


@pytest.mark.parametrize("extra, severity, key, method", [
    ("", "warning", "lora_r", "full"),
    ("load_in_4bit: true\n", "error", "load_in_4bit", "qlora"),
    ("use_peft: false\n", "warning", "lora_r", "full"),
    ("use_peft: true\n", None, None, "lora"),
    ("use_peft: true\nload_in_4bit: true\n", None, None, "qlora"),
], ids=["lora-keys", "4bit", "use-peft-false", "use-peft", "qlora"])
def test_trl_lora_keys_without_use_peft_are_planned_as_trl_runs_them(hub, cli, tmp_path, extra, severity, key, method):
    """GD612: TRL 1.16's get_peft_config reads use_peft alone, so a TRL YAML with lora_r / lora_target_modules but no
    use_peft: true trains every weight (planned as full fine-tuning, a warning), and with load_in_4bit loads a
    quantized model without adapters, which transformers' Trainer refuses (an error). On main the method was left
    open ("chosen to fit") and nothing was said."""
    r, path, findings = _lint(hub, cli, tmp_path, "trl.yaml", TRL_LORA_NO_PEFT + extra, "--gpu", "H100")
    got = _by_code(findings)
    model = r.json()["models"][0]
    assert model["memory"]["method"] == method, model["memory"]["summary"]
    if severity is None:
        assert "GD612" not in got, got["GD612"]["message"]
        return
    f = got["GD612"]
    assert (f["severity"], f["file"], f["key"]) == (severity, str(path), key)
    assert "use_peft: true" in f["message"] and "use_peft: true" in f["fix"]
    if severity == "warning":
        assert "lora_r, lora_alpha, lora_target_modules" in f["message"] and "every weight" in f["message"]
        assert model["run"]["method"]["source"].startswith(
            "training config use_peft" if extra else "default of TRL's ModelConfig (use_peft false unless set): "
                                                     "lora_r, lora_alpha, lora_target_modules unused")
    else:
        assert "purely quantized" in f["message"] and r.code == 1


# Each LoRA key of TRL 1.16.0's ModelConfig, with a value other than its default: the keys get_peft_config reads
# (test_trl_peft_keys_are_the_keys_get_peft_config_reads runs it to list them).
TRL_PEFT_KEYS = {"lora_r": 8, "lora_alpha": 64, "lora_dropout": 0.1, "lora_target_modules": ["q_proj", "v_proj"],
                 "lora_target_parameters": ["mlp.experts.gate_up_proj"], "lora_modules_to_save": ["lm_head"],
                 "lora_task_type": "SEQ_CLS", "use_rslora": True, "use_dora": True}
# Every other field of ModelConfig, with a value other than its default.
TRL_OTHER_MODEL_KEYS = {"model_name_or_path": "m", "model_revision": "r", "dtype": "bfloat16",
                        "attn_implementation": "sdpa", "use_peft": True, "load_in_8bit": True, "load_in_4bit": False,
                        "bnb_4bit_quant_type": "fp4", "use_bnb_nested_quant": True, "bnb_4bit_quant_storage": "uint8"}


def _trl_116():
    trl = pytest.importorskip("trl")
    if trl.__version__ != "1.16.0":
        pytest.skip(f"read in TRL 1.16.0, not {trl.__version__}")
    return trl


def test_trl_peft_keys_are_the_keys_get_peft_config_reads():
    """TRL 1.16.0's get_peft_config, run on a ModelConfig with use_peft true and one field changed at a time: the
    LoraConfig it builds changes for exactly the keys of TRL_PEFT_KEYS, and those are the keys GD612 names
    (run.TRL_PEFT_KEYS)."""
    _trl_116()
    import dataclasses

    from trl import ModelConfig, get_peft_config

    from gemma_doctor import run

    fields = {f.name for f in dataclasses.fields(ModelConfig)}
    assert fields == set(TRL_PEFT_KEYS) | set(TRL_OTHER_MODEL_KEYS), fields ^ (set(TRL_PEFT_KEYS) | set(TRL_OTHER_MODEL_KEYS))
    base = get_peft_config(ModelConfig(use_peft=True)).to_dict()
    read = {k for k, v in {**TRL_PEFT_KEYS, **TRL_OTHER_MODEL_KEYS}.items() if k != "use_peft"
            and get_peft_config(ModelConfig(**{"use_peft": True, k: v})).to_dict() != base}
    assert read == set(TRL_PEFT_KEYS)
    assert set(run.TRL_PEFT_KEYS.values()) >= read, read - set(run.TRL_PEFT_KEYS.values())


@pytest.mark.parametrize("key", sorted(TRL_PEFT_KEYS))
def test_each_trl_peft_key_alone_without_use_peft_is_gd612(hub, cli, tmp_path, key):
    """GD612 for each key get_peft_config reads, written alone without use_peft: TRL 1.16.0's own `trl sft` parser
    reads the key, keeps use_peft false and gives no peft_config, so the run trains every weight; check plans full
    fine-tuning and names the key. Before, only lora_r / lora_target_modules / lora_target_parameters /
    lora_modules_to_save were seen: lora_alpha, lora_dropout, lora_task_type, use_rslora or use_dora alone passed."""
    import yaml

    value = TRL_PEFT_KEYS[key]
    if _trl_116():
        from trl import get_peft_config
        from trl.scripts.sft import make_parser

        path = tmp_path / "parsed.yaml"
        path.write_text(yaml.safe_dump({"model_name_or_path": "google/gemma-2b", "dataset_name": "d",
                                        "output_dir": "out", "use_cpu": True, key: value}))
        _, _, model, *_ = make_parser().parse_args_and_config(args=["--config", str(path)],
                                                              fail_with_unknown_args=True)
        assert (model.use_peft, getattr(model, key), get_peft_config(model)) == (False, value, None)
    text = "model_name_or_path: google/gemma-3-12b-it\nbf16: true\nmax_length: 1024\n" + yaml.safe_dump({key: value})
    r, path, findings = _lint(hub, cli, tmp_path, "trl.yaml", text, "--gpu", "H100")
    f = _by_code(findings).get("GD612")
    assert f is not None, [g["code"] for g in findings]
    assert (f["severity"], f["file"], f["key"]) == ("warning", str(path), key)
    assert f"{key} written without use_peft: true" in f["message"], f["message"]
    model = r.json()["models"][0]
    assert model["memory"]["method"] == "full"
    assert f"{key} unused" in model["run"]["method"]["source"], model["run"]["method"]["source"]


def test_trainingarguments_lora_keys_are_the_scripts_business(hub, cli, tmp_path):
    """A plain TrainingArguments config's LoRA keys are read by the user's own script: no GD612."""
    _, _, findings = _lint(hub, cli, tmp_path, "args.yaml", "output_dir: out\nbf16: true\nlora_r: 16\n",
                           "--gpu", "H100")
    assert "GD612" not in _by_code(findings)


@pytest.mark.parametrize("method", ["lora", "qlora"])
def test_recommends_trl_yaml_passes_check_without_gd612(hub, cli, tmp_path, method):
    """recommend --trainer trl writes use_peft: true for LoRA and QLoRA, so its prescription passes
    check --fail-on warning with no GD612."""
    hub.add("google/gemma-3-12b-it", {"config.json": gemma3_12b_config(),
                                      "generation_config.json": generation_config()})
    m = cli("recommend", "google/gemma-3-12b-it", "--cache-dir", hub.root, "--gpu", "A100", "--trainer", "trl",
            "--method", method, "--format", "json").json()["models"][0]
    assert m["prescription"] is not None, m.get("blocking")
    path = tmp_path / "trl.yaml"
    path.write_text(m["snippets"]["yaml"])
    r = cli("check", "google/gemma-3-12b-it", "--cache-dir", hub.root, "--gpu", "A100", "--training-config", path,
            "--fail-on", "warning", "--format", "json")
    codes = [f["code"] for f in r.json()["models"][0]["findings"]]
    assert "GD612" not in codes and r.code == 0, codes
