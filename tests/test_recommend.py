"""The precision recommendation: the decision table row by row, the CLI, the JSON shape, and the emitted
snippets executed against the real transformers / TRL / PEFT in this environment."""

from __future__ import annotations

import json
import types

import pytest

from gemma_doctor.plan import recommend
from gemma_doctor.plan.recommend import Inputs, decide, python_snippets, training_config_yaml
from tests.builders import HubCache, gemma2_config, gemma3_1b_config, gemma3_12b_config, llama_config, paligemma2_config, variant

NEW = {"transformers": "5.0.0", "peft": "0.17.0", "trl": "1.0.0"}


def inputs(family="gemma3", native=True, backend="cuda", **kw) -> Inputs:
    return Inputs(family=family, gpu_native_bf16=native, gpu_backend=backend, gpu_label="GPU",
                  versions=kw.pop("versions", NEW), **kw)


# --- the decision table (docs/precision.md) ------------------------------------------------------

@pytest.mark.parametrize("family,native,backend,precision,load", [
    # native bf16: bf16 mixed precision for every family
    ("gemma3", True, "cuda", "bf16", "bfloat16"),
    ("gemma2", True, "cuda", "bf16", "bfloat16"),
    ("gemma", True, "cuda", "bf16", "bfloat16"),
    ("paligemma2", True, "rocm", "bf16", "bfloat16"),
    # no native bf16, Gemma 2/3/3n/PaliGemma 2: fp32, never fp16
    ("gemma3", False, "cuda", "fp32", "float32"),
    ("gemma2", False, "cuda", "fp32", "float32"),
    ("gemma3n", False, "cuda", "fp32", "float32"),
    ("paligemma2", False, "cuda", "fp32", "float32"),
    ("gemma3", None, "mps", "fp32", "float32"),  # unknown counts as not native
    # no native bf16, Gemma 1 / PaliGemma 1: fp16 with loss scaling, fp32 master weights
    ("gemma", False, "cuda", "fp16", "float32"),
    ("paligemma", False, "cuda", "fp16", "float32"),
    # no GPU at all: fp32 on the CPU
    ("gemma3", False, "none", "fp32", "float32"),
    ("gemma", False, "none", "fp32", "float32"),
])
def test_decision_table(family, native, backend, precision, load):
    rec = decide(inputs(family, native, backend))
    assert rec.precision == precision and rec.load_dtype == load
    args = rec.training_arguments
    assert args["bf16"] is (precision == "bf16") and args["fp16"] is (precision == "fp16")
    assert args.get("tf32", False) is (precision == "bf16" and backend == "cuda")
    assert rec.frameworks["accelerate"]["mixed_precision"] == {"bf16": "bf16", "fp16": "fp16", "fp32": "no"}[precision]
    ax = rec.frameworks["axolotl"]
    assert ax["bf16"] is args["bf16"] and ax["fp16"] is args["fp16"]
    assert rec.frameworks["unsloth"]["from_pretrained"]["dtype"] == load
    assert rec.frameworks["transformers"]["use_cache"] is False
    assert any("use_cache=False" in r and "gemma-doctor fix" in r for r in rec.reasons)


def test_fp32_for_gemma3_cites_the_sources_and_the_cost():
    text = " ".join(decide(inputs("gemma3", False)).reasons)
    for needle in ("65504", "#36822", "Unsloth", "never fp16", "twice"):
        assert needle in text


def test_fp16_lora_keeps_the_base_in_fp16_and_adapters_in_fp32():
    rec = decide(inputs("gemma", False, task="lora"))
    assert rec.precision == "fp16" and rec.load_dtype == "float16"
    assert rec.frameworks["peft"]["adapter_dtype"] == "float32"


@pytest.mark.parametrize("native,family,compute,precision", [
    (True, "gemma3", "bfloat16", "bf16"), (False, "gemma3", "float32", "fp32"),
    (False, "gemma2", "float32", "fp32"), (False, "gemma", "float16", "fp16"),
])
def test_qlora_compute_dtype(native, family, compute, precision):
    for rec in (decide(inputs(family, native, quantization="4bit")), decide(inputs(family, native, task="qlora"))):
        bnb = rec.frameworks["peft"]["bitsandbytes_config"]
        assert rec.precision == precision
        assert bnb == {"load_in_4bit": True, "bnb_4bit_quant_type": "nf4", "bnb_4bit_use_double_quant": True,
                       "bnb_4bit_compute_dtype": compute}
        assert rec.frameworks["peft"]["prepare_model_for_kbit_training"] is True
        assert rec.frameworks["axolotl"]["adapter"] == "qlora" and rec.frameworks["axolotl"]["load_in_4bit"] is True
        assert rec.frameworks["unsloth"]["from_pretrained"]["load_in_4bit"] is True


def test_prequantized_gptq_checkpoint_gets_no_bitsandbytes_config():
    rec = decide(inputs("gemma3", True, quantization="4bit", quant_method="gptq"))
    assert rec.frameworks["peft"]["bitsandbytes_config"] is None
    assert any("already quantized (gptq)" in r for r in rec.reasons)


@pytest.mark.parametrize("task,cls", [("dpo", "DPOConfig"), ("orpo", "ORPOConfig"), ("kto", "KTOConfig"),
                                      ("grpo", "GRPOConfig"), ("ppo", None)])
@pytest.mark.parametrize("native", [True, False])
def test_rl_tasks_get_the_stable_dpo_setting_with_the_chosen_precision(task, cls, native):
    rec = decide(inputs("gemma3", native, task=task))
    args = rec.training_arguments
    assert {k: args[k] for k in ("gradient_checkpointing", "optim", "max_grad_norm")} == recommend.STABLE_RL_SETTINGS
    assert args["bf16"] is native
    assert rec.frameworks["trl"]["config_class"] == cls  # TRL >= 1.0 has no PPOConfig
    assert rec.frameworks["axolotl"]["optimizer"] == "adamw_torch_fused"
    assert rec.frameworks["axolotl"].get("rl") == (None if task == "ppo" else task)


def test_sft_does_not_get_rl_settings():
    args = decide(inputs("gemma3", True)).training_arguments
    assert "optim" not in args and "max_grad_norm" not in args


@pytest.mark.parametrize("peft,cast", [("0.11.1", True), ("0.12.0", False), (None, False)])
def test_old_peft_gets_the_cast_loop(peft, cast):
    rec = decide(inputs("gemma3", True, versions={**NEW, "peft": peft}))
    assert rec.frameworks["peft"]["cast_adapters_to_fp32"] is cast
    code = python_snippets(rec, "m")["peft"]
    active = "\nfor param in model.parameters():" in code
    assert active is cast
    assert "param.data = param.data.float()" in code  # commented out when PEFT does it already


@pytest.mark.parametrize("transformers,key", [("4.50.0", "torch_dtype"), ("4.56.0", "dtype"), ("5.0.0", "dtype"), (None, "torch_dtype")])
def test_dtype_keyword_follows_the_installed_transformers(transformers, key):
    rec = decide(inputs("gemma3", True, versions={**NEW, "transformers": transformers}))
    assert rec.frameworks["transformers"]["from_pretrained"] == {key: "bfloat16"}


def test_emulation_trap_note_when_not_bf16():
    rec = decide(Inputs(family="gemma3", gpu_native_bf16=False, gpu_trap=True))
    assert any("is_bf16_supported" in n and "bf16: auto" in n for n in rec.notes)


def test_saved_fp16_gemma3_is_called_out():
    rec = decide(inputs("gemma3", True, saved_dtype="float16", saved_dtype_source="safetensors"))
    assert any("saved in float16" in r and "check --weights" in r for r in rec.reasons)


@pytest.mark.parametrize("bad,fn", [("gemma9", recommend.normalise_family), ("sftt", recommend.normalise_task),
                                    ("3bit", recommend.normalise_quantization)])
def test_bad_option_values(bad, fn):
    from gemma_doctor.errors import UsageError

    with pytest.raises(UsageError):
        fn(bad)


def test_recommend_module_is_pure():
    import ast
    import inspect

    tree = ast.parse(inspect.getsource(recommend))
    names = {a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, (ast.Import, ast.ImportFrom))
             for a in getattr(n, "names", [])} | {(n.module or "").split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
    assert not names & {"torch", "transformers", "rich", "typer", "huggingface_hub", "os", "pathlib"}


# --- the snippets, executed ----------------------------------------------------------------------

@pytest.fixture
def planned_gpu(monkeypatch):
    """Make transformers believe it runs on the planned Ampere+ GPU (TrainingArguments checks bf16/tf32 support)."""
    import transformers.training_args as ta

    monkeypatch.setattr(ta, "is_torch_bf16_gpu_available", lambda: True)
    monkeypatch.setattr(ta, "is_torch_tf32_available", lambda: True)
    monkeypatch.setattr(ta, "enable_tf32", lambda *a, **k: None)


ROWS = [("gemma3", True, "sft"), ("gemma3", False, "dpo"), ("gemma", False, "lora"), ("gemma2", True, "dpo"),
        ("gemma3", False, "sft"), ("gemma3", True, "grpo"), ("gemma3", True, "kto")]


@pytest.mark.parametrize("family,native,task", ROWS)
def test_training_arguments_snippet_constructs(family, native, task, planned_gpu):
    from transformers import TrainingArguments

    rec = decide(inputs(family, native, task=task))
    ns: dict = {}
    exec(compile(python_snippets(rec, "m")["transformers"], "<snippet>", "exec"), ns)
    assert isinstance(ns["args"], TrainingArguments)
    assert ns["args"].bf16 is rec.training_arguments["bf16"] and ns["args"].fp16 is rec.training_arguments["fp16"]
    assert TrainingArguments(output_dir="o", **rec.training_arguments).max_grad_norm == rec.training_arguments.get("max_grad_norm", 1.0)


@pytest.mark.parametrize("family,native,task", ROWS)
def test_trl_snippet_constructs(family, native, task, planned_gpu):
    trl = pytest.importorskip("trl")
    # TRL's config snippet is the prescription's where TRL's trainer runs it (--trainer trl; axolotl's `rl:` runs TRL's
    # preference trainers): beside an axolotl SFT prescription its SFTConfig would be another run (chunked log-probs).
    rec = decide(inputs(family, native, task=task, versions={**NEW, "trl": trl.__version__}, trainer="trl"))
    axolotl = decide(inputs(family, native, task=task, versions={**NEW, "trl": trl.__version__}))
    assert ("trl" in python_snippets(axolotl, "m")) is (axolotl.frameworks["trl"]["config_class"] != "SFTConfig")
    code = python_snippets(rec, "m")["trl"]
    ns: dict = {}
    exec(compile(code, "<snippet>", "exec"), ns)
    cfg = ns["config"]
    assert type(cfg).__name__ == rec.frameworks["trl"]["config_class"]
    assert cfg.bf16 is rec.training_arguments["bf16"]
    if task == "dpo":
        assert (cfg.gradient_checkpointing, cfg.optim, cfg.max_grad_norm) == (True, "adamw_torch_fused", 1.0)


@pytest.fixture(scope="module")
def tiny_gemma3(tmp_path_factory):
    """A tiny random Gemma 3 text model saved locally in bf16 (no download)."""
    import torch
    from transformers import Gemma3ForCausalLM, Gemma3TextConfig

    cfg = Gemma3TextConfig(vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
                           num_key_value_heads=1, head_dim=16, sliding_window=16, max_position_embeddings=64)
    torch.manual_seed(0)
    path = tmp_path_factory.mktemp("tiny-gemma3")
    Gemma3ForCausalLM(cfg).to(torch.bfloat16).save_pretrained(path)
    return path


@pytest.mark.parametrize("native,peft_version", [(True, "0.17.0"), (False, "0.17.0"), (True, "0.11.0")])
def test_loading_and_peft_snippets_run_on_a_real_tiny_model(tiny_gemma3, native, peft_version):
    import torch

    rec = decide(inputs("gemma3", native, task="lora", versions={**NEW, "peft": peft_version}))
    snippets = python_snippets(rec, str(tiny_gemma3))
    ns: dict = {}
    exec(compile(snippets["loading"], "<loading>", "exec"), ns)
    model = ns["model"]
    assert model.dtype == getattr(torch, rec.load_dtype)
    assert all(m.config.use_cache is False for m in model.modules() if hasattr(getattr(m, "config", None), "use_cache"))
    assert model.generation_config.use_cache is False
    exec(compile(snippets["peft"], "<peft>", "exec"), ns)
    trainable = [p for p in ns["model"].parameters() if p.requires_grad]
    assert trainable and all(p.dtype == torch.float32 for p in trainable)  # adapters in fp32 either way


def test_the_peft_snippet_runs_after_the_language_model_alone_loading(tiny_gemma3):
    """A multimodal Gemma 3's snippets load the language model alone (Gemma3ForCausalLM) as one way, then the PEFT
    section: its language_model regex matched no module of that model (model.layers.N...) and PEFT stopped with
    "Target modules ... not found in the base model" (reproduced with PEFT 0.21.2). Both loadings, real PEFT."""
    rec = decide(inputs("gemma3", True, task="lora", nested=True))
    snippets = python_snippets(rec, str(tiny_gemma3))
    ns: dict = {}
    exec(compile(snippets["loading_text_only"], "<loading_text_only>", "exec"), ns)
    exec(compile(snippets["peft"], "<peft>", "exec"), ns)
    wrapped = {n for n, m in ns["model"].named_modules() if hasattr(m, "lora_A")}
    assert any(n.endswith("self_attn.q_proj") for n in wrapped) and any(n.endswith("mlp.down_proj") for n in wrapped)


def test_every_python_output_compiles(cli, hub):
    hub.add("google/gemma-3-1b-it", {"config.json": gemma3_1b_config()})
    for gpu in ("T4", "A100", "none", "MI300X"):
        r = cli("recommend", "--cache-dir", hub.root, "--gpu", gpu, "--task", "dpo", "--qlora", "--format", "python")
        assert r.code == 0, r
        compile(r.out, "<recommend>", "exec")


# --- YAML ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("family,native,task,quant", [("gemma3", True, "dpo", "4bit"), ("gemma3", False, "sft", None),
                                                      ("gemma", False, "lora", None)])
def test_the_training_config_yaml_is_one_document_with_the_expected_keys(family, native, task, quant):
    yaml = pytest.importorskip("yaml")
    rec = decide(inputs(family, native, task=task, quantization=quant))
    text = training_config_yaml(rec)
    (ax,) = list(yaml.safe_load_all(text))  # one document: check --training-config reads it (issue 20)
    assert ax == rec.frameworks["axolotl"]
    assert ax["bf16"] is (rec.precision == "bf16")  # explicit, never "auto"
    assert "bf16: auto" in text  # the comment that explains why not
    mixed = {"bf16": "bf16", "fp16": "fp16", "fp32": "no"}[rec.precision]
    assert f'# accelerate (accelerate config / accelerate launch): mixed_precision: "{mixed}"' in text


def test_yaml_format_is_one_training_config_per_model(cli, hub):
    yaml = pytest.importorskip("yaml")
    hub.add("google/gemma-3-1b-it", {"config.json": gemma3_1b_config()})
    hub.add("google/gemma-2-2b-it", {"config.json": gemma2_config()})
    r = cli("recommend", "--cache-dir", hub.root, "--gpu", "T4", "--format", "yaml")
    assert r.code == 0, r
    docs = list(yaml.safe_load_all(r.out))
    assert len(docs) == 2
    assert [d.get("base_model") for d in docs] == ["google/gemma-2-2b-it", "google/gemma-3-1b-it"]
    assert all(d["bf16"] is False and d["fp16"] is False for d in docs)


# --- the CLI -------------------------------------------------------------------------------------

@pytest.mark.parametrize("gpu,precision", [("T4", "fp32"), ("V100", "fp32"), ("RTX 2080 Ti", "fp32"), ("sm_75", "fp32"),
                                           ("7.5", "fp32"), ("8.0", "bf16"), ("A100", "bf16"), ("a10g", "bf16"),
                                           ("L4", "bf16"), ("H100", "bf16"), ("rtx 4090", "bf16"), ("sm_120", "bf16"),
                                           ("none", "fp32")])
def test_recommend_gpu_values(cli, hub, gpu, precision):
    hub.add("google/gemma-3-12b-it", {"config.json": gemma3_12b_config()})
    r = cli("recommend", "google/gemma-3-12b-it", "--cache-dir", hub.root, "--gpu", gpu, "--format", "json")
    m = r.json()["models"][0]
    # a 12B on a 16 GB GPU: no prescription passes (only a tight QLoRA fits), and the nearest run says the precision
    assert r.code == (1 if m["prescription"] is None else 0), r
    assert (m["recommendation"] or m["nearest"])["precision"] == precision


def rec_method(m: dict) -> str:
    return m["recommendation"]["method"]


def test_recommend_json_shape(cli, hub):
    hub.add("google/gemma-3-12b-it", {"config.json": gemma3_12b_config()})
    r = cli("recommend", "google/gemma-3-12b-it", "--cache-dir", hub.root, "--gpu", "A100", "--task", "dpo", "--format", "json")
    assert r.code == 0, r
    doc = r.json()
    assert set(doc) == {"schema_version", "command", "status", "task", "gpu", "models"}
    assert (doc["schema_version"], doc["command"], doc["status"], doc["task"]) == (1, "recommend", "ok", "dpo")
    assert doc["gpu"]["label"] == "A100 (sm_80)" and doc["gpu"]["source"] == "--gpu"
    (m,) = doc["models"]
    assert set(m) == {"target", "repo_id", "revision", "commit", "path", "family", "planned", "recommendation", "snippets",
                      "memory", "prescription", "way_out", "blocking", "status"}
    assert m["status"] == "prescribed"
    assert m["prescription"]["method"] == rec_method(m) and m["way_out"] == [] and m["blocking"] == []
    assert (m["repo_id"], m["family"], m["planned"]) == ("google/gemma-3-12b-it", "gemma3", False)
    rec = m["recommendation"]
    assert set(rec) == {"precision", "load_dtype", "summary", "reasons", "notes", "inputs", "frameworks", "method"}
    assert rec["method"] == m["memory"]["method"] and m["memory"]["verdict"] in ("fits", "tight")
    assert rec["precision"] == "bf16" and rec["load_dtype"] == "bfloat16"
    assert rec["inputs"] == {"family": "gemma3", "saved_dtype": "bfloat16", "gpu": "A100 (sm_80)", "gpu_backend": "cuda",
                             "native_bf16": True, "quantization": None, "quant_method": None, "task": "dpo"}
    fw = rec["frameworks"]
    assert set(fw) == {"transformers", "trl", "peft", "axolotl", "accelerate", "unsloth", "serving"}
    assert fw["serving"]["dtype"] == "bfloat16" and m["prescription"]["serving"] == fw["serving"]
    run = m["memory"]["run"]
    ckpt = run["gradient_checkpointing"]
    # transformers 5.23 (installed) names gradient checkpointing activation_checkpointing (the old name warns)
    assert fw["transformers"]["training_arguments"] == {"bf16": True, "fp16": False, "tf32": True,
                                                        "optim": "adamw_torch_fused", "max_grad_norm": 1.0,
                                                        "per_device_train_batch_size": run["batch_size"],
                                                        "gradient_accumulation_steps": run["gradient_accumulation_steps"],
                                                        **({"activation_checkpointing": True,
                                                            "activation_checkpointing_kwargs": {"use_reentrant": False}}
                                                           if ckpt else {})}
    assert fw["transformers"]["auto_class"] == "AutoModelForImageTextToText"
    # TRL's config is TrainingArguments plus the prescribed sequence length
    assert fw["trl"] == {"config_class": "DPOConfig", "module": "trl",
                         "config": {**fw["transformers"]["training_arguments"], "max_length": run["seq_len"]}}
    assert fw["accelerate"] == {"mixed_precision": "bf16"}
    assert set(m["snippets"]) == {"python", "yaml", "command"} and m["snippets"]["yaml"].count("\nbase_model: ") == 1
    assert m["snippets"]["command"] == "axolotl train run.yaml"  # the trainer's own CLI over the YAML saved


def test_recommend_text_has_reasons_and_python(cli, hub):
    hub.add("google/gemma-3-1b-it", {"config.json": gemma3_1b_config()})
    r = cli("recommend", "--cache-dir", hub.root, "--gpu", "T4")
    assert r.code == 0, r
    assert "precision fp32" in r.out and "why:" in r.out and "65504" in r.out
    assert "TrainingArguments(output_dir=" in r.out and "FastModel.from_pretrained" in r.out


def test_recommend_family_plan_needs_no_cache(cli, tmp_path):
    r = cli("recommend", "--family", "gemma3", "--gpu", "T4", "--cache-dir", tmp_path / "nothing-here", "--format", "json")
    assert r.code == 0, r
    (m,) = r.json()["models"]
    assert m["planned"] is True and m["family"] == "gemma3" and m["recommendation"]["precision"] == "fp32"
    assert m["recommendation"]["inputs"]["saved_dtype"] == "bfloat16"


def test_recommend_with_nothing_to_recommend_says_how_to_plan(cli, hub):
    hub.add("meta/llama", {"config.json": llama_config()})
    r = cli("recommend", "--cache-dir", hub.root)
    assert r.code == 2 and "--family gemma3" in r.err


@pytest.mark.parametrize("args,needle", [(["--gpu", "T5"], "compute capability"), (["--task", "xyz"], "--task"),
                                         (["--quantization", "3bit"], "--quantization"), (["--family", "llama"], "--family"),
                                         (["--family", "gemma3", "google/gemma-3-1b-it"], "--family"),
                                         (["--qlora", "--quantization", "8bit"], "--qlora")])
def test_recommend_usage_errors(cli, hub, args, needle):
    hub.add("google/gemma-3-1b-it", {"config.json": gemma3_1b_config()})
    r = cli("recommend", "--cache-dir", hub.root, *args)
    assert r.code == 2 and needle in r.err and len(r.err.strip().splitlines()) == 1, r


def test_quantization_is_detected_from_the_checkpoint(cli, hub):
    qc = {"quant_method": "bitsandbytes", "load_in_4bit": True, "bnb_4bit_compute_dtype": "bfloat16", "bnb_4bit_quant_type": "nf4"}
    hub.add("org/gemma-3-1b-bnb", {"config.json": variant(gemma3_1b_config(), quantization_config=qc)})
    # check's recommendation: recommend prescribes nothing here (GD402: no trainer can change the compute dtype of a
    # checkpoint saved in 4-bit but the loading snippet's loop, which no axolotl YAML can write)
    r = cli("check", "org/gemma-3-1b-bnb", "--cache-dir", hub.root, "--gpu", "T4", "--format", "json", "--fail-on",
            "never")
    rec = r.json()["models"][0]["recommendation"]
    assert rec["inputs"]["quantization"] == "4bit"
    assert rec["frameworks"]["peft"]["bitsandbytes_config"]["bnb_4bit_compute_dtype"] == "float32"
    assert any("bnb_4bit_compute_dtype=bfloat16" in n for n in rec["notes"])


# --- check: per-model recommendation and findings ----------------------------------------------

def _codes(model: dict) -> dict[str, str]:
    return {f["code"]: f["severity"] for f in model["findings"]}


def test_check_json_and_text_carry_the_recommendation(cli, hub):
    hub.add("google/gemma-3-1b-it", {"config.json": gemma3_1b_config()})
    r = cli("check", "--cache-dir", hub.root, "--gpu", "H100", "--format", "json", "--fail-on", "never")
    rec = r.json()["models"][0]["recommendation"]
    assert rec["precision"] == "bf16" and rec["frameworks"]["transformers"]["training_arguments"]["tf32"] is True
    t = cli("check", "--cache-dir", hub.root, "--gpu", "H100", "--fail-on", "never")
    assert "precision bf16: bf16=True, fp16=False, tf32=True on H100 (sm_90)" in t.out


def test_non_gemma_models_get_no_recommendation(cli, hub):
    hub.add("meta/llama", {"config.json": llama_config()})
    hub.add("google/gemma-3-1b-it", {"config.json": gemma3_1b_config()})
    # beside a Gemma model (alone, a non-Gemma target is "nothing to check", exit 2)
    r = cli("check", "meta/llama", "google/gemma-3-1b-it", "--cache-dir", hub.root, "--gpu", "T4", "--format", "json",
            "--fail-on", "never")
    m = next(m for m in r.json()["models"] if m["repo_id"] == "meta/llama")
    assert "recommendation" not in m and "prescription" not in m and not {"GD302", "GD303"} & set(_codes(m))


@pytest.mark.parametrize("gpu,config,expected", [
    ("T4", gemma3_1b_config, {"GD302": "warning", "GD303": "warning"}),
    ("T4", paligemma2_config, {"GD302": "warning", "GD303": "warning"}),
    ("A100", gemma3_1b_config, {}),
    ("none", gemma3_1b_config, {"GD301": "info"}),
])
def test_gpu_findings(cli, hub, gpu, config, expected):
    hub.add("org/model", {"config.json": config()})
    r = cli("check", "--cache-dir", hub.root, "--gpu", gpu, "--format", "json", "--fail-on", "never")
    got = {c: s for c, s in _codes(r.json()["models"][0]).items() if c.startswith("GD3")}
    assert got == expected


def test_gemma1_on_t4_gets_the_trap_but_not_fp32(cli, hub):
    hub.add("google/gemma-7b", {"config.json": {"architectures": ["GemmaForCausalLM"], "model_type": "gemma", "torch_dtype": "bfloat16"}})
    r = cli("check", "--cache-dir", hub.root, "--gpu", "T4", "--format", "json", "--fail-on", "never")
    m = r.json()["models"][0]
    assert "GD302" not in _codes(m) and _codes(m)["GD303"] == "warning"
    assert m["recommendation"]["precision"] == "fp16"


def test_gd304_unknown_bf16(cli, hub, monkeypatch):
    from gemma_doctor.readers import gpu as gpu_reader

    monkeypatch.setattr(gpu_reader, "probe", lambda *a, **k: gpu_reader.probe_mps("15.0", "Apple M9"))
    hub.add("org/model", {"config.json": gemma3_1b_config()})
    r = cli("check", "--cache-dir", hub.root, "--format", "json", "--fail-on", "never")
    assert _codes(r.json()["models"][0])["GD304"] == "info"


def test_gd401_old_peft_planned_for_the_training_machine(cli, hub):
    hub.add("org/model", {"config.json": gemma3_1b_config()})
    plan = ("--with", "peft==0.11.1")
    r = cli("check", "--cache-dir", hub.root, "--gpu", "A100", "--format", "json", "--fail-on", "never", *plan)
    m = r.json()["models"][0]
    assert _codes(m)["GD401"] == "warning"
    assert m["recommendation"]["frameworks"]["peft"]["cast_adapters_to_fp32"] is True
    # the installed PEFT (>= 0.12, a test dependency) upcasts adapters itself: no finding without the plan
    r = cli("check", "--cache-dir", hub.root, "--gpu", "A100", "--format", "json", "--fail-on", "never")
    assert "GD401" not in _codes(r.json()["models"][0])
    # fp32 (T4) loads fp32 weights: adapters are fp32 anyway, no finding
    r = cli("check", "--cache-dir", hub.root, "--gpu", "T4", "--format", "json", "--fail-on", "never", *plan)
    assert "GD401" not in _codes(r.json()["models"][0])


@pytest.mark.parametrize("gpu,expected", [("T4", True), ("A100", False)])
def test_gd402_bnb_bf16_compute_on_a_gpu_without_bf16(cli, hub, gpu, expected):
    qc = {"quant_method": "bitsandbytes", "load_in_4bit": True, "bnb_4bit_compute_dtype": "bfloat16"}
    hub.add("org/gemma-3-1b-bnb", {"config.json": variant(gemma3_1b_config(), quantization_config=qc)})
    r = cli("check", "--cache-dir", hub.root, "--gpu", gpu, "--format", "json", "--fail-on", "never")
    assert ("GD402" in _codes(r.json()["models"][0])) is expected


@pytest.mark.parametrize("peft, helper", [
    ("0.7.1", "for p in model.parameters(): if p.requires_grad: p.data = p.data.float()"),
    ("0.8.0", "peft.cast_mixed_precision_params(model, dtype)"),  # the first release with the helper
    ("0.11.1", "peft.cast_mixed_precision_params(model, dtype)"),
])
def test_gd401_fix_uses_the_cast_the_planned_peft_has(cli, hub, peft, helper):
    hub.add("org/model", {"config.json": gemma3_1b_config()})
    r = cli("check", "--cache-dir", hub.root, "--gpu", "A100", "--format", "json", "--fail-on", "never",
            "--with", f"peft=={peft}")
    [gd401] = [f for f in r.json()["models"][0]["findings"] if f["code"] == "GD401"]
    assert gd401["fix"] == f'pip install "peft>=0.12.0", or after get_peft_model: {helper}'


def test_gd401_for_adapters_on_a_quantized_base_even_when_it_loads_in_fp32(cli, hub):
    """QLoRA on a T4: the precision is fp32, but the 4-bit base still leaves PEFT < 0.12 adapters in half precision."""
    qc = {"quant_method": "bitsandbytes", "load_in_4bit": True, "bnb_4bit_compute_dtype": "float16"}
    hub.add("org/gemma-3-1b-bnb", {"config.json": variant(gemma3_1b_config(), quantization_config=qc)})
    r = cli("check", "--cache-dir", hub.root, "--gpu", "T4", "--format", "json", "--fail-on", "never",
            "--with", "peft==0.11.1")
    m = r.json()["models"][0]
    assert m["recommendation"]["load_dtype"] == "float32"
    assert _codes(m)["GD401"] == "warning"


GEMMA1 = {"architectures": ["GemmaForCausalLM"], "model_type": "gemma", "torch_dtype": "bfloat16"}


@pytest.mark.parametrize("config, qc, expected", [
    # bf16 compute on a T4: the fix names the dtype the family is safe in
    (gemma3_1b_config(), {"load_in_4bit": True, "bnb_4bit_compute_dtype": "bfloat16"}, "float32"),
    (GEMMA1, {"load_in_4bit": True, "bnb_4bit_compute_dtype": "torch.bfloat16"}, "float16"),
    # not bf16 compute, not bitsandbytes 4-bit, or a compute dtype nobody wrote down: nothing to say
    (gemma3_1b_config(), {"load_in_4bit": True, "bnb_4bit_compute_dtype": "float16"}, None),
    (gemma3_1b_config(), {"load_in_8bit": True}, None),  # LLM.int8 computes in the declared bfloat16
    (gemma3_1b_config(), {"quant_method": "gptq", "bits": 4}, None),  # GPTQ computes in the declared bfloat16
])
def test_gd402_only_for_bitsandbytes_4bit_bf16_compute_and_names_a_safe_dtype(cli, hub, config, qc, expected):
    hub.add("org/q", {"config.json": variant(config, quantization_config={"quant_method": "bitsandbytes", **qc})})
    r = cli("check", "--cache-dir", hub.root, "--gpu", "T4", "--format", "json", "--fail-on", "never")
    gd402 = [f for f in r.json()["models"][0]["findings"] if f["code"] == "GD402"]
    if expected is None:
        assert gd402 == []
    else:
        assert len(gd402) == 1 and f"m.compute_dtype = torch.{expected} " in gd402[0]["fix"]


@pytest.mark.parametrize("training", [
    "base_model: x\nadapter: qlora\nload_in_4bit: true\nbnb_config_kwargs: {bnb_4bit_compute_dtype: float32}\n",
    '{"use_peft": true, "load_in_4bit": true, "bnb_4bit_compute_dtype": "float32", "max_length": 512}',
], ids=["axolotl", "trl"])
def test_a_training_configs_compute_dtype_does_not_reach_a_checkpoint_saved_in_4bit(cli, hub, tmp_path, training):
    """GD402 was silenced by the config's compute dtype, which no trainer applies to a checkpoint saved quantized:
    axolotl 0.19.0 loads it with BitsAndBytesConfig(**model_config.quantization_config) and never reads
    bnb_config_kwargs there; transformers 5.23.0 keeps the checkpoint's quantization_config (merge_quantization_configs
    warns and returns bfloat16 for a BitsAndBytesConfig of float32, run here)."""
    import torch
    import warnings
    from transformers import BitsAndBytesConfig
    from transformers.quantizers.auto import AutoHfQuantizer

    qc = {"quant_method": "bitsandbytes", "load_in_4bit": True, "bnb_4bit_compute_dtype": "bfloat16"}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        merged = AutoHfQuantizer.merge_quantization_configs(
            dict(qc), BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_compute_dtype=torch.float32))
    assert merged.bnb_4bit_compute_dtype == torch.bfloat16
    hub.add("org/q", {"config.json": variant(gemma3_1b_config(), quantization_config=qc)})
    path = tmp_path / "train.yaml"
    path.write_text(training)
    r = cli("check", "--cache-dir", hub.root, "--gpu", "T4", "--format", "json", "--fail-on", "never",
            "--training-config", str(path))
    [gd402] = [f for f in r.json()["models"][0]["findings"] if f["code"] == "GD402"]
    assert "Linear4bit" in gd402["fix"] and "BitsAndBytesConfig(..." not in gd402["fix"]


def test_the_prescription_for_a_checkpoint_saved_in_4bit_sets_its_compute_dtype_where_it_applies(cli, hub):
    """On a checkpoint saved in bitsandbytes 4-bit the YAML wrote bnb_config_kwargs and the loading snippet a
    BitsAndBytesConfig, both ignored there (above): now neither; the snippet sets the compute dtype on the layers."""
    qc = {"quant_method": "bitsandbytes", "load_in_4bit": True, "bnb_4bit_compute_dtype": "float32"}
    hub.add("org/q", {"config.json": variant(gemma3_1b_config(), quantization_config=qc)})
    r = cli("recommend", "org/q", "--cache-dir", hub.root, "--gpu", "A100", "--format", "json")
    m = r.json()["models"][0]
    assert r.code == 0 and m["prescription"]["method"] == "qlora"
    assert "bnb_config_kwargs" not in m["snippets"]["yaml"]
    loading = m["snippets"]["python"]["loading"]
    assert "quantization_config=" not in loading and "module.compute_dtype = torch.bfloat16" in loading
    assert any("axolotl has no key for it" in n for n in m["recommendation"]["notes"])


def test_gd402_is_silent_when_only_the_tensor_layout_says_bitsandbytes(cli, hub):
    """The layout gives 4-bit away but not the compute dtype: no guess, and no crash on the missing value."""
    from tests.test_safetensors import st_file

    names = ["l.weight", "l.weight.absmax", "l.weight.quant_map"]
    hub.add("org/q", {"config.json": gemma3_1b_config(), "model.safetensors": st_file({n: ("I32", [4]) for n in names})})
    r = cli("check", "--cache-dir", hub.root, "--gpu", "T4", "--format", "json", "--fail-on", "never")
    m = r.json()["models"][0]
    assert m["dtypes"]["quantization"]["compute_dtype"] is None
    assert "GD402" not in _codes(m)


# --- serving: the dtype per engine on the GPU named (issue 26, item 4) ------------------------------------------

@pytest.mark.parametrize("family, native, dtype, vllm_says", [
    ("gemma3", True, "bfloat16", "--dtype bfloat16"),
    ("gemma3", False, "float32", "vLLM refuses float16 for Gemma 2/3"),  # activations beyond fp16: never float16
    ("gemma2", False, "float32", "vLLM refuses float16 for Gemma 2/3"),
    ("gemma", False, "float16", "--dtype float16"),  # Gemma 1's activations fit fp16
    ("gemma3", None, "bfloat16", "--dtype bfloat16"),  # unknown GPU: bf16 if it has it, said in the reason
])
def test_serving_dtype_follows_the_gpu_and_the_member(family, native, dtype, vllm_says):
    rec = decide(inputs(family, native))
    serve = rec.frameworks["serving"]
    assert serve["dtype"] == dtype and vllm_says in serve["vllm"] and serve["transformers"] == {"dtype": dtype}
    if native is None:
        assert "unknown" in serve["reason"] and ("float32" if family != "gemma" else "float16") in serve["reason"]


def test_serving_says_to_name_the_dtype_when_the_checkpoint_is_saved_in_float16():
    rec = decide(inputs("gemma3", True, saved_dtype="float16"))
    assert "saved in float16, which --dtype auto would keep" in rec.frameworks["serving"]["vllm"]


def test_serving_without_a_gpu_states_the_rule():
    serve = decide(inputs("gemma3", None, backend="none")).frameworks["serving"]
    assert serve["dtype"] is None and "never float16" in serve["reason"]


def test_recommend_json_says_its_status_as_the_exit_code_does(cli, tmp_path):
    """`recommend --format json` had no `status`: a script had to read the exit code or look for a null prescription."""
    r = cli("recommend", "--family", "gemma3", "--size", "12b", "--gpu", "T4", "--cache-dir", tmp_path, "--format", "json")
    assert r.code == 1
    doc = r.json()
    assert doc["status"] == "no-prescription" and [m["status"] for m in doc["models"]] == ["no-prescription"]
    r = cli("recommend", "--family", "gemma3", "--size", "12b", "--gpu", "A100", "--cache-dir", tmp_path, "--format", "json")
    assert r.code == 0 and r.json()["status"] == "ok" and r.json()["models"][0]["status"] == "prescribed"


@pytest.mark.parametrize("gpu", [(), ("--gpu", "none")])
def test_a_batch_without_a_gpu_is_prescribed_as_asked(cli, hub, gpu):
    """`recommend --batch-size 4` with no GPU named gave "no prescription" (exit 1): GD650 warned of the fp32 logits
    against a memory verdict of "unknown" and rejected every candidate. Nothing limits memory without a GPU: the run
    asked for is prescribed, its logits counted in the plan and said as information."""
    hub.add("google/gemma-3-1b-it", {"config.json": gemma3_1b_config()})
    r = cli("recommend", "google/gemma-3-1b-it", "--cache-dir", hub.root, "--batch-size", "4", *gpu, "--format", "json")
    m = r.json()["models"][0]
    assert r.code == 0 and m["status"] == "prescribed" and m["blocking"] == [], m["blocking"]
    assert m["memory"]["run"]["batch_size"] == 4 and m["memory"]["verdict"] == "unknown"


def test_a_prescription_on_several_gpus_says_how_to_launch_it_and_check_reads_that_back_as_the_same_run(cli, hub,
                                                                                                        tmp_path):
    """`recommend --gpu T4 --num-gpus 8` prescribes QLoRA under DeepSpeed ZeRO-3 (12.4 GiB per GPU), yet its text and
    Python views gave only TrainingArguments / TRL settings: run one process per GPU, that is a DDP run of whole
    replicas the plan never judged. The launch line (accelerate's flags) is in every Python view, and check reads the
    TrainingArguments snippet with that line back as the prescription's very memory plan."""
    hub.add("google/gemma-3-12b-it", {"config.json": gemma3_12b_config()})
    args = ("google/gemma-3-12b-it", "--cache-dir", hub.root, "--gpu", "T4", "--num-gpus", "8")
    m = cli("recommend", *args, "--format", "json").json()["models"][0]
    p = m["prescription"]
    assert (p["num_gpus"], p["zero_stage"]) == (8, 3), p
    line = "accelerate launch --num_processes 8 --use_deepspeed --zero_stage 3 --mixed_precision no train.py"
    assert f"#   {line}\n" in m["snippets"]["python"]["launch"]
    python = cli("recommend", *args, "--format", "python").out
    compile(python, "<recommend>", "exec")
    assert f"#   {line}\n" in python and line in cli("recommend", *args).out
    config = tmp_path / "args.json"
    config.write_text(json.dumps(m["recommendation"]["frameworks"]["transformers"]["training_arguments"]))
    c = cli("check", *args[:3], "--gpu", "T4", "--training-config", config, "--launch", line, "--method", p["method"],
            "--seq-len", str(p["seq_len"]), "--format", "json").json()["models"][0]
    assert c["memory"]["summary"] == p["memory"] and "(8 GPUs, ZeRO-3)" in p["memory"], (c["memory"]["summary"], p)
    # One GPU: nothing to launch
    one = cli("recommend", "google/gemma-3-12b-it", "--cache-dir", hub.root, "--gpu", "A100", "--format", "json").json()
    assert "launch" not in one["models"][0]["snippets"]["python"]


def test_a_zero2_prescription_launches_the_offload_its_axolotl_file_has_and_a_full_one_wraps_no_adapter(cli, hub,
                                                                                                       tmp_path):
    """The YAML of a ZeRO-2 prescription names axolotl's deepspeed_configs/zero2.json, which offloads the optimizer to
    the CPU, and the plan counts that offload; the launch line said `--zero_stage 2` alone, a run holding the optimizer
    states on the GPU that the plan freed. It now says `--offload_optimizer_device cpu`, and check reads the snippet
    with it back as the prescription's memory plan. A full fine-tuning prescription showed a PEFT LoRA section and the
    adapters' precision reason: neither belongs to its run."""
    hub.add("google/gemma-3-12b-it", {"config.json": gemma3_12b_config()})
    args = ("google/gemma-3-12b-it", "--cache-dir", hub.root, "--gpu", "H100", "--num-gpus", "8", "--method", "full")
    m = cli("recommend", *args, "--format", "json").json()["models"][0]
    p = m["prescription"]
    assert (p["num_gpus"], p["zero_stage"], p["method"]) == (8, 2, "full"), p
    line = ("accelerate launch --num_processes 8 --use_deepspeed --zero_stage 2 --offload_optimizer_device cpu "
            "--mixed_precision bf16 train.py")
    assert f"#   {line}\n" in m["snippets"]["python"]["launch"], m["snippets"]["python"]["launch"]
    assert "peft" not in m["snippets"]["python"]
    assert not any("LoRA adapter" in r for r in m["recommendation"]["reasons"]), m["recommendation"]["reasons"]
    config = tmp_path / "args.json"
    config.write_text(json.dumps(m["recommendation"]["frameworks"]["transformers"]["training_arguments"]))
    c = cli("check", *args[:3], "--gpu", "H100", "--training-config", config, "--launch", line, "--method", "full",
            "--seq-len", str(p["seq_len"]), "--format", "json").json()["models"][0]
    assert c["memory"]["summary"] == p["memory"], (c["memory"]["summary"], p["memory"])
    # A LoRA prescription keeps its PEFT section.
    lora = cli("recommend", *args[:5], "--method", "lora", "--format", "json").json()["models"][0]
    assert "peft" in lora["snippets"]["python"]
