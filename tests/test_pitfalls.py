"""The pitfall catalogue's rules (GD42x, GD505, GD64x, GD65x, GD90x) on real hub-cache layouts: which files and
settings raise which finding, with which severity, for the libraries that will run (named with --with so the
answer does not depend on this venv). The pitfalls themselves are reproduced with the real libraries in
tests/test_pitfalls_repro.py."""

from __future__ import annotations

import json

import pytest
import yaml

from tests.builders import gemma2_config, gemma3_1b_config, gemma3_12b_config, gemma3n_config, generation_config, variant
from tests.test_safetensors import st_file

LM_ONLY = r".*language_model.*\.(q_proj|k_proj|v_proj|o_proj|gate_proj|up_proj|down_proj)"
CHAT_TEMPLATE = "{{ bos_token }}{% for m in messages %}<start_of_turn>{{ m['role'] }}\n{{ m['content'] }}<end_of_turn>\n{% endfor %}"


def tokenizer_config(**changes) -> dict:
    """A Gemma 3 -it tokenizer_config.json: special tokens, a few added tokens with their ids, the chat template."""
    added = {"0": "<pad>", "1": "<eos>", "2": "<bos>", "3": "<unk>", "105": "<start_of_turn>", "106": "<end_of_turn>"}
    cfg = {"bos_token": "<bos>", "eos_token": "<eos>", "pad_token": "<pad>", "unk_token": "<unk>", "add_bos_token": True,
           "add_eos_token": False, "chat_template": CHAT_TEMPLATE, "tokenizer_class": "GemmaTokenizer",
           "added_tokens_decoder": {k: {"content": v, "special": True, "lstrip": False, "rstrip": False,
                                        "normalized": False, "single_word": False} for k, v in added.items()}}
    cfg.update(changes)
    return cfg


def check(cli, hub, tmp_path, files: dict, training: dict | str | None = None, *extra: str, repo="acme/model") -> dict:
    """Findings of `check --format json` by code (a list per code)."""
    hub.add(repo, files)
    args = ["check", repo, "--cache-dir", str(hub.root), "--format", "json", "--fail-on", "never", *extra]
    if training is not None:
        path = tmp_path / ("train.json" if isinstance(training, dict) else "train.yaml")
        path.write_text(json.dumps(training, indent=2) if isinstance(training, dict) else training)
        args += ["--training-config", str(path)]
    r = cli(*args)
    assert r.code == 0, r
    [model] = r.json()["models"]
    out: dict[str, list[dict]] = {}
    for f in model["findings"]:
        out.setdefault(f["code"], []).append(f)
    return out


MM = {"config.json": gemma3_12b_config(), "generation_config.json": generation_config()}


# --- GD420 / GD421: LoRA targets on multimodal checkpoints ----------------------------------------------

def test_trl_lora_without_targets_on_multimodal_gemma3_is_an_error_that_names_the_lm_only_regex(cli, hub, tmp_path):
    got = check(cli, hub, tmp_path, MM, {"use_peft": True, "bf16": True}, "--gpu", "A100")
    [f] = got["GD420"]
    assert (f["severity"], f["key"]) == ("error", "use_peft")
    assert "Please specify `target_modules`" in f["message"] and LM_ONLY in f["fix"]
    assert "GD421" not in got


@pytest.mark.parametrize("targets, hit", [("all-linear", "all-linear"),
                                          (["q_proj", "k_proj", "v_proj", "o_proj"], "k_proj, q_proj, v_proj")])
def test_broad_or_bare_targets_on_multimodal_gemma3_warn_that_the_vision_tower_gets_adapters(cli, hub, tmp_path, targets, hit):
    got = check(cli, hub, tmp_path, MM, {"use_peft": True, "lora_target_modules": targets, "bf16": True}, "--gpu", "A100")
    [f] = got["GD421"]
    assert (f["severity"], f["key"]) == ("warning", "lora_target_modules")
    assert hit in f["message"] and "vision tower" in f["message"] and LM_ONLY in f["fix"]
    assert "GD420" not in got


@pytest.mark.parametrize("training", [
    {"use_peft": True, "lora_target_modules": LM_ONLY},
    {"use_peft": True, "lora_target_modules": "all-linear", "exclude_modules": ".*vision_tower.*"},
    {"use_peft": False, "bf16": True},
    {"use_peft": False, "lora_target_modules": "all-linear"},
])
def test_lm_only_targets_exclusions_and_full_fine_tuning_are_not_flagged(cli, hub, tmp_path, training):
    got = check(cli, hub, tmp_path, MM, training, "--gpu", "A100")
    assert not {"GD420", "GD421"} & set(got)


def test_axolotl_lora_target_linear_on_gemma3n_warns_about_both_towers(cli, hub, tmp_path):
    got = check(cli, hub, tmp_path, {"config.json": gemma3n_config()},
                "base_model: google/gemma-3n-E2B-it\nadapter: lora\nlora_target_linear: true\nbf16: true\n", "--gpu", "A100")
    [f] = got["GD421"]
    assert f["key"] == "lora_target_linear" and "vision/audio tower" in f["message"]


@pytest.mark.parametrize("freeze, flagged", [("", False), ("freeze_vision_tower: true\n", False),
                                            ("freeze_vision_tower: false\n", True)])
def test_llamafactory_all_targets_leave_the_towers_out_while_it_freezes_them(cli, hub, tmp_path, freeze, flagged):
    """LLaMA-Factory 0.9.5's `lora_target: all` (find_all_linear_modules) and its names (patch_target_modules) skip a
    Gemma composite's towers while freeze_vision_tower is on, its default: no GD421 then (recommend --trainer
    llama-factory prescribes exactly this); with the towers unfrozen they are wrapped."""
    got = check(cli, hub, tmp_path, MM, "model_name_or_path: google/gemma-3-4b-it\nstage: sft\nfinetuning_type: lora\n"
                "lora_target: all\nbf16: true\n" + freeze, "--gpu", "A100")
    assert ("GD421" in got) is flagged, sorted(got)


def test_bare_names_on_a_text_only_gemma3_are_fine(cli, hub, tmp_path):
    got = check(cli, hub, tmp_path, {"config.json": gemma3_1b_config()},
                {"use_peft": True, "lora_target_modules": ["q_proj", "v_proj"]}, "--gpu", "A100")
    assert not {"GD420", "GD421"} & set(got)


# --- GD422: PEFT < 0.18 and the scaled embedding --------------------------------------------------------

@pytest.mark.parametrize("training, key", [
    ({"use_peft": True, "lora_target_modules": ["q_proj", "embed_tokens"]}, "lora_target_modules"),
    ({"use_peft": True, "lora_target_modules": ["q_proj"], "trainable_token_indices": [5, 17]}, "trainable_token_indices"),
])
def test_embed_tokens_as_a_peft_target_follows_the_peft_that_will_run(cli, hub, tmp_path, training, key):
    files = {"config.json": gemma3_1b_config()}
    old = check(cli, hub, tmp_path, files, training, "--with", "peft==0.17.1", "--with", "transformers==4.57.6")
    [f] = old["GD422"]
    assert (f["severity"], f["key"]) == ("error", key) and "peft 0.17.1" in f["message"] and "peft>=0.18.0" in f["fix"]
    new = check(cli, hub, tmp_path, files, training, "--with", "peft==0.18.0", repo="acme/new")
    assert "GD422" not in new
    unknown = check(cli, hub, tmp_path, files, training, "--with", "peft>=0.15", repo="acme/unknown")
    assert [f["severity"] for f in unknown["GD422"]] == ["warning"]


def test_gemma2_embedding_is_scaled_in_the_module_only_from_transformers_5_4(cli, hub, tmp_path):
    training = {"use_peft": True, "lora_target_modules": ["embed_tokens"]}
    files = {"config.json": gemma2_config()}
    assert "GD422" not in check(cli, hub, tmp_path, files, training, "--with", "peft==0.17.1", "--with", "transformers==4.57.6")
    got = check(cli, hub, tmp_path, files, training, "--with", "peft==0.17.1", "--with", "transformers==5.4.0", repo="acme/b")
    assert [f["severity"] for f in got["GD422"]] == ["error"]


# --- GD423 / GD424 and fp16: EmbeddingGemma --------------------------------------------------------------

EMBEDDING_GEMMA = variant(gemma3_1b_config(), use_bidirectional_attention=True, sliding_window=512,
                          architectures=["Gemma3TextModel"], hidden_size=768)


def test_a_paligemma_saved_by_transformers_5_is_not_taken_for_embeddinggemma(cli, hub, tmp_path):
    """transformers 5.x's PaliGemmaConfig saves text_config.use_bidirectional_attention: true (its prefix-LM
    attention): GD423 called it "EmbeddingGemma ... embeddings wrong" on any transformers before 4.57."""
    from transformers import PaliGemmaConfig

    text = {"model_type": "gemma2", "hidden_size": 64, "num_hidden_layers": 2, "intermediate_size": 128,
            "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 32, "vocab_size": 1000}
    vision = {"model_type": "siglip_vision_model", "hidden_size": 32, "num_hidden_layers": 1, "intermediate_size": 64,
              "num_attention_heads": 2, "image_size": 28, "patch_size": 14}
    PaliGemmaConfig(text_config=text, vision_config=vision).save_pretrained(tmp_path / "saved")
    saved = json.loads((tmp_path / "saved" / "config.json").read_text())
    assert saved["text_config"]["use_bidirectional_attention"] is True  # the real library writes it
    for tf in ("4.56.2", "4.57.6"):
        got = check(cli, hub, tmp_path, {"config.json": saved}, None, "--with", f"transformers=={tf}", repo=f"acme/pg-{tf}")
        assert not {"GD423", "GD424"} & set(got), (tf, sorted(got))


@pytest.mark.parametrize("tf, code, severity", [("4.56.2", "GD423", "error"), ("4.57.6", "GD424", "warning"),
                                                ("5.15.1", "GD424", "warning"), ("5.16.0", None, None)])
def test_embeddinggemma_attention_follows_the_transformers_that_will_run(cli, hub, tmp_path, tf, code, severity):
    got = check(cli, hub, tmp_path, {"config.json": EMBEDDING_GEMMA}, None, "--with", f"transformers=={tf}")
    found = {c: f for c, f in got.items() if c in ("GD423", "GD424")}
    if code is None:
        assert found == {}
    else:
        assert list(found) == [code] and found[code][0]["severity"] == severity
        assert found[code][0]["key"] == ("use_bidirectional_attention" if code == "GD423" else "sliding_window")


def test_embeddinggemma_in_fp16_is_the_fp16_rule_with_its_own_evidence(cli, hub, tmp_path):
    got = check(cli, hub, tmp_path, {"config.json": variant(EMBEDDING_GEMMA, torch_dtype="float16")}, {"fp16": True},
                "--gpu", "T4", "--with", "transformers==5.16.0")
    assert all("TEI #748" in got[code][0]["message"] for code in ("GD202", "GD302", "GD602"))
    assert got["GD602"][0]["severity"] == "error"
    plain = check(cli, hub, tmp_path, {"config.json": variant(gemma3_1b_config(), torch_dtype="float16")}, {"fp16": True},
                  "--gpu", "T4", repo="acme/plain")
    assert not any("TEI" in plain[code][0]["message"] for code in ("GD202", "GD302", "GD602"))


# --- GD640 / GD641: attention backend --------------------------------------------------------------------

G2 = {"config.json": variant(gemma2_config(), head_dim=256)}


@pytest.mark.parametrize("tf, severity, words", [("4.57.6", "error", "ignores it"), ("5.23.0", "error", "refuses it")])
def test_explicit_sdpa_on_gemma2_is_an_error_in_every_release(cli, hub, tmp_path, tf, severity, words):
    got = check(cli, hub, tmp_path, G2, {"model_init_kwargs": {"attn_implementation": "sdpa"}}, "--with", f"transformers=={tf}")
    [f] = got["GD640"]
    assert (f["severity"], f["key"]) == (severity, "model_init_kwargs.attn_implementation") and words in f["message"]


@pytest.mark.parametrize("tf, expected", [("4.44.2", "warning"), ("4.46.3", None), ("4.57.6", "warning"),
                                          ("5.21.0", None), ("5.23.0", None)])
def test_gemma2_default_backend_is_judged_and_the_assumption_said(cli, hub, tmp_path, tf, expected):
    got = check(cli, hub, tmp_path, G2, None, "--with", f"transformers=={tf}")
    assert [f["severity"] for f in got.get("GD640", [])] == ([expected] if expected else [])
    if expected:
        assert "assumed: attn_implementation is not set" in got["GD640"][0]["message"]


def test_gemma3_under_sdpa_is_never_flagged(cli, hub, tmp_path):
    got = check(cli, hub, tmp_path, MM, {"attn_implementation": "sdpa", "bf16": True}, "--with", "transformers==4.57.6")
    assert "GD640" not in got


def test_eager_on_gemma2_is_fine_and_old_flash_attn_drops_the_softcap(cli, hub, tmp_path):
    assert "GD640" not in check(cli, hub, tmp_path, G2, {"attn_implementation": "eager"}, "--with", "transformers==4.57.6")
    got = check(cli, hub, tmp_path, G2, {"attn_implementation": "flash_attention_2"}, "--with", "flash-attn==2.5.9",
                "--gpu", "A100", repo="acme/fa")
    assert [f["severity"] for f in got["GD640"]] == ["warning"] and "2.6.0" in got["GD640"][0]["message"]


@pytest.mark.parametrize("fa, expected", [("2.6.0.post1", "warning"), ("2.6.1", "warning"), ("2.6.2", None)])
def test_flash_attn_before_2_6_2_has_no_softcap_backward_and_the_cure_names_2_6_2(cli, hub, tmp_path, fa, expected):
    """The cure said flash-attn>=2.6.0; the sdists of 2.6.0.post1 and 2.6.1 have no softcapping in the backward."""
    got = check(cli, hub, tmp_path, G2, {"attn_implementation": "flash_attention_2"}, "--with", f"flash-attn=={fa}",
                "--gpu", "A100", repo="acme/fa")
    assert [f["severity"] for f in got.get("GD640", [])] == ([expected] if expected else [])
    if expected:
        assert "backward" in got["GD640"][0]["message"] and '"flash-attn>=2.6.2"' in got["GD640"][0]["fix"]


@pytest.mark.parametrize("fa, gpu, expected", [("2.5.4", "A10G", "error"), ("2.5.4", "A100", None),
                                               ("2.5.5", "A10G", None), ("2.5.4", None, "warning")])
def test_fa2_backward_with_head_dim_256_depends_on_flash_attn_and_the_gpu(cli, hub, tmp_path, fa, gpu, expected):
    extra = ["--with", f"flash-attn=={fa}"] + (["--gpu", gpu] if gpu else ["--gpu", "none"])
    got = check(cli, hub, tmp_path, {"config.json": gemma3_1b_config()}, {"attn_implementation": "flash_attention_2"}, *extra)
    assert [f["severity"] for f in got.get("GD641", [])] == ([expected] if expected else [])


# --- GD645: packing ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("training, tf, trl, expected", [
    ({"packing": True, "attn_implementation": "sdpa"}, "4.50.0", "0.24.0", "error"),
    ({"packing": True, "attn_implementation": "sdpa"}, "4.57.6", "0.19.1", "error"),
    ({"packing": True, "attn_implementation": "eager"}, "4.57.6", "0.24.0", None),
    ({"padding_free": True}, "5.23.0", "1.16.0", None),
    ({"packing": True, "attn_implementation": "flash_attention_2"}, "4.50.0", "0.19.1", None),
    ({"packing": False, "attn_implementation": "sdpa"}, "4.50.0", "0.19.1", None),
])
def test_packing_is_judged_against_the_backend_and_the_versions(cli, hub, tmp_path, training, tf, trl, expected):
    got = check(cli, hub, tmp_path, {"config.json": gemma3_1b_config()}, training,
                "--with", f"transformers=={tf}", "--with", f"trl=={trl}")
    assert [f["severity"] for f in got.get("GD645", [])] == ([expected] if expected else [])


def test_axolotl_sample_packing_is_judged_on_transformers_only(cli, hub, tmp_path):
    yaml = "base_model: google/gemma-3-1b-it\nsample_packing: true\nmicro_batch_size: 1\nsequence_len: 512\n"
    got = check(cli, hub, tmp_path, {"config.json": gemma3_1b_config()}, yaml, "--with", "transformers==4.53.0",
                "--with", "trl==0.19.1")
    [f] = got["GD645"]
    assert (f["severity"], f["key"]) == ("error", "sample_packing") and "4.53.1" in f["message"] and "TRL" not in f["message"]
    assert "GD645" not in check(cli, hub, tmp_path, {"config.json": gemma3_1b_config()}, yaml,
                                "--with", "transformers==4.53.1", repo="acme/new")


# --- GD650: logits memory ---------------------------------------------------------------------------------

def test_logits_memory_warns_with_the_number_unless_trl_chunks_it(cli, hub, tmp_path):
    training = {"per_device_train_batch_size": 1, "max_length": 4096, "bf16": True}
    got = check(cli, hub, tmp_path, {"config.json": gemma3_1b_config()}, training, "--with", "trl==1.14.0",
                "--gpu", "T4")
    [f] = got["GD650"]
    assert f["severity"] == "warning" and f["details"]["logits_fp32_bytes"] == 4096 * 262144 * 4
    assert "4.0 GiB" in f["message"]
    # Without a GPU nothing limits memory: the plan counts them, and GD650 says so as information
    free = check(cli, hub, tmp_path, {"config.json": gemma3_1b_config()}, training, "--with", "trl==1.14.0",
                 repo="acme/d")
    assert [g["severity"] for g in free["GD650"]] == ["info"] and "no GPU is named" in free["GD650"][0]["message"]
    chunked = check(cli, hub, tmp_path, {"config.json": gemma3_1b_config()}, training, "--with", "trl==1.15.0", repo="acme/b")
    assert [g["severity"] for g in chunked["GD650"]] == ["info"] and "does not apply" in chunked["GD650"][0]["message"]
    small = check(cli, hub, tmp_path, {"config.json": gemma3_1b_config()}, {**training, "max_length": 1024},
                  "--with", "trl==1.14.0", repo="acme/c")
    assert "GD650" not in small


@pytest.mark.parametrize("config, training, task", [
    (gemma3_1b_config(), {"per_device_train_batch_size": 2, "max_length": 8192, "bf16": True}, "sft"),
    (gemma3_1b_config(), {"per_device_train_batch_size": 1, "max_length": 4096, "bf16": True, "beta": 0.1}, "dpo"),
    (gemma2_config(), {"per_device_train_batch_size": 1, "max_length": 8192, "bf16": True}, "sft"),
], ids=["sft", "dpo", "gemma2-softcap"])
def test_logits_figure_is_the_memory_plans_logits_component(cli, hub, tmp_path, config, training, task):
    """GD650 said ~20 GiB of logits where the plan for the same run counted 32 GiB: two formulas for one tensor."""
    hub.add("acme/model", {"config.json": config})
    path = tmp_path / "train.json"
    path.write_text(json.dumps(training))
    r = cli("check", "acme/model", "--cache-dir", hub.root, "--format", "json", "--fail-on", "never", "--gpu", "H100",
            "--training-config", path, "--with", "trl==1.14.0", "--task", task)
    [model] = r.json()["models"]
    [gd650] = [f for f in model["findings"] if f["code"] == "GD650"]
    plan = model["memory"]
    assert plan["peak"] == "loss" and (plan["run"]["batch_size"], plan["run"]["seq_len"]) == (
        training["per_device_train_batch_size"], training["max_length"])
    logits = plan["components"]["logits"]
    assert f"{logits / 1024**3:.1f} GiB" in gd650["message"], (plan["components"], gd650["message"])
    assert f"{logits / 1024**3:.1f} GiB alive at the loss" in gd650["message"]
    assert gd650["details"]["logits_bytes"] == logits
    assert plan["run"]["task"] == task and ("x 2 (chosen and rejected)" in gd650["message"]) is (task == "dpo")


# --- GD505 / GD503: embedding rows against the tokenizer ---------------------------------------------------

def test_tokens_beyond_the_embedding_rows_are_an_error_naming_them(cli, hub, tmp_path):
    tok = tokenizer_config()
    tok["added_tokens_decoder"]["300"] = {"content": "<tool_call>", "special": True}
    files = {"config.json": variant(gemma3_1b_config(), vocab_size=300), "tokenizer_config.json": tok,
             "model.safetensors": st_file({"model.embed_tokens.weight": ("BF16", [300, 8])})}
    got = check(cli, hub, tmp_path, files)
    [f] = got["GD505"]
    assert (f["severity"], f["key"], f["file"]) == ("error", "model.embed_tokens.weight", "model.safetensors")
    assert "<tool_call> (300)" in f["message"] and "resize_token_embeddings" in f["fix"]
    files["model.safetensors"] = st_file({"model.embed_tokens.weight": ("BF16", [301, 8])})
    assert "GD505" not in check(cli, hub, tmp_path, files, repo="acme/resized")


def test_the_zero_pad_row_is_not_flagged_and_zero_added_tokens_are_named(cli, hub, tmp_path):
    import numpy as np
    from safetensors.numpy import save

    emb = np.ones((300, 8), dtype=np.float32)
    emb[0] = 0  # the pad row: zero by design
    files = {"config.json": variant(gemma3_1b_config(), vocab_size=300, torch_dtype="float32"),
             "tokenizer_config.json": tokenizer_config(), "model.safetensors": save({"model.embed_tokens.weight": emb})}
    assert "GD503" not in check(cli, hub, tmp_path, files, None, "--weights")
    emb[106] = 0
    files["model.safetensors"] = save({"model.embed_tokens.weight": emb})
    [f] = check(cli, hub, tmp_path, files, None, "--weights", repo="acme/zero")["GD503"]
    assert "1 all-zero row(s)" in f["message"] and "<end_of_turn> (106)" in f["message"]
    assert "pad row 0 is zero by design" in f["message"] and f["details"]["ranges"] == [[106, 106]]


# --- GD901 / GD902 / GD903: EOS, pad, BOS ------------------------------------------------------------------

def test_a_chat_checkpoint_whose_eos_lacks_end_of_turn_never_stops(cli, hub, tmp_path):
    gen = variant(generation_config(), eos_token_id=1)
    got = check(cli, hub, tmp_path, {"config.json": gemma3_1b_config(), "generation_config.json": gen,
                                     "tokenizer_config.json": tokenizer_config()})
    [f] = got["GD901"]
    assert (f["severity"], f["file"], f["key"]) == ("warning", "generation_config.json", "eos_token_id")
    assert "[1, 106]" in f["fix"]
    gemma2_ids = check(cli, hub, tmp_path, {"config.json": gemma3_1b_config(), "tokenizer_config.json": tokenizer_config(),
                                            "generation_config.json": variant(gen, eos_token_id=[1, 107])}, repo="acme/g2ids")
    assert "newline" in gemma2_ids["GD901"][0]["message"]
    fine = check(cli, hub, tmp_path, {"config.json": gemma3_1b_config(), "generation_config.json": generation_config(),
                                      "tokenizer_config.json": tokenizer_config()}, repo="acme/fine")
    assert "GD901" not in fine


def test_without_generation_config_the_eos_of_config_json_is_read(cli, hub, tmp_path):
    got = check(cli, hub, tmp_path, {"config.json": variant(gemma3_1b_config(), eos_token_id=1),
                                     "tokenizer_config.json": tokenizer_config()})
    assert got["GD901"][0]["file"] == "config.json"


def test_pad_equal_to_eos_in_the_tokenizer_or_the_training_config_warns(cli, hub, tmp_path):
    files = {"config.json": gemma3_1b_config(), "tokenizer_config.json": tokenizer_config(pad_token="<eos>")}
    [f] = check(cli, hub, tmp_path, files)["GD902"]
    assert (f["severity"], f["file"], f["key"]) == ("warning", "tokenizer_config.json", "pad_token")
    files["tokenizer_config.json"] = tokenizer_config()
    got = check(cli, hub, tmp_path, files, {"pad_token": "<eos>"}, repo="acme/tc")
    assert got["GD902"][0]["key"] == "pad_token" and got["GD902"][0]["file"].endswith("train.json")
    assert "GD902" not in check(cli, hub, tmp_path, files, repo="acme/fine")


@pytest.mark.parametrize("trl, training, severity", [
    ("0.16.1", {"bf16": True, "max_length": 1024}, "warning"), ("0.17.0", {"bf16": True, "max_length": 1024}, "info"),
    # Only TrainingArguments keys: a plain transformers Trainer runs it (trainers.decide), not TRL's data preparation.
    ("0.16.1", {"bf16": True}, "info")], ids=["old-trl", "new-trl", "plain-trainer"])
def test_double_bos_is_said_with_a_training_config_and_warns_on_old_trl(cli, hub, tmp_path, trl, training, severity):
    files = {"config.json": gemma3_1b_config(), "tokenizer_config.json": tokenizer_config()}
    assert "GD903" not in check(cli, hub, tmp_path, files)
    got = check(cli, hub, tmp_path, files, training, "--with", f"trl=={trl}", repo="acme/t")
    assert [f["severity"] for f in got["GD903"]] == [severity]
    no_bos = check(cli, hub, tmp_path, {**files, "tokenizer_config.json": tokenizer_config(add_bos_token=False)},
                   {"bf16": True}, repo="acme/nobos")
    assert "GD903" not in no_bos


def test_a_broken_tokenizer_config_is_no_traceback(cli, hub, tmp_path):
    got = check(cli, hub, tmp_path, {"config.json": gemma3_1b_config(), "tokenizer_config.json": b"{not json",
                                     "generation_config.json": variant(generation_config(), eos_token_id=1)})
    assert not {"GD505", "GD901", "GD902", "GD903"} & set(got)


@pytest.mark.parametrize("tok", [
    {"added_tokens_decoder": ["<pad>"], "chat_template": {"name": "x"}, "pad_token": 5, "eos_token": None},
    {"added_tokens_decoder": {"-1": {"content": "<x>"}, "99999999999999999999": {"content": "<y>"}, "7": 3}},
    {"chat_template": [{"name": "default", "template": "{{ bos_token }}<end_of_turn>"}, "junk"], "pad_token": {"x": 1}},
])
def test_odd_tokenizer_configs_are_read_without_a_traceback(cli, hub, tmp_path, tok):
    got = check(cli, hub, tmp_path, {"config.json": gemma3_1b_config(), "tokenizer_config.json": tok,
                                     "model.safetensors": st_file({"model.embed_tokens.weight": ("BF16", [4, 2])})},
                {"bf16": True})
    assert "GD505" not in got and "GD902" not in got


def test_boundaries_head_dim_192_and_two_gib_of_logits(cli, hub, tmp_path):
    files = {"config.json": variant(gemma3_1b_config(), head_dim=192)}
    fa2 = {"attn_implementation": "flash_attention_2", "per_device_train_batch_size": 1, "max_length": 2048}
    got = check(cli, hub, tmp_path, files, fa2, "--with", "flash-attn==2.5.4", "--gpu", "A10G", "--with", "trl==1.14.0")
    assert "GD641" not in got  # the limit is head_dim > 192
    assert got["GD650"][0]["details"]["logits_fp32_bytes"] == 2 * 1024**3  # exactly 2 GiB warns
    below = check(cli, hub, tmp_path, files, {**fa2, "max_length": 2047}, "--with", "trl==1.14.0", repo="acme/below")
    assert "GD650" not in below


def test_a_transformers_range_that_straddles_4_57_warns_instead_of_failing(cli, hub, tmp_path):
    got = check(cli, hub, tmp_path, {"config.json": EMBEDDING_GEMMA}, None, "--with", "transformers>=4.50")
    assert [f["severity"] for f in got["GD423"]] == ["warning"] and "GD424" not in got


# --- GD505 / GD422: training Gemma's tied embedding follows the PEFT that will run --------------------------

def test_tied_embedding_advice_follows_the_peft_that_will_run(cli, hub, tmp_path):
    """modules_to_save=["embed_tokens", "lm_head"] was advised whatever PEFT: before 0.18 (no ensure_weight_tying) it
    unties Gemma's tied head and the merged model reloads with another one; even on 0.18.0 listing lm_head unties it
    (tests/scripts/tied_modules_to_save.py); vLLM refuses adapters with modules_to_save (vllm #9280)."""
    tok = tokenizer_config()
    tok["added_tokens_decoder"]["300"] = {"content": "<tool_call>", "special": True}
    files = {"config.json": variant(gemma3_1b_config(), vocab_size=300), "tokenizer_config.json": tok,
             "model.safetensors": st_file({"model.embed_tokens.weight": ("BF16", [300, 8])})}
    lora = {"use_peft": True, "lora_target_modules": ["q_proj", "embed_tokens"]}
    fixes = {}
    for n, peft in enumerate(("peft==0.17.1", "peft==0.21.2", "peft>=0.15")):
        got = check(cli, hub, tmp_path, files, lora, "--with", peft, "--with", "transformers==4.57.6", repo=f"acme/m{n}")
        fixes[peft] = (got["GD505"][0]["fix"], got["GD422"][0]["fix"] if "GD422" in got else None)
    cure = 'modules_to_save=["embed_tokens"] with ensure_weight_tying=True'
    for gd505, gd422 in fixes.values():
        assert cure in gd505 and "vllm #9280" in gd505
        assert 'modules_to_save=["embed_tokens", "lm_head"]' not in gd505 + (gd422 or "")
    old_505, old_422 = fixes["peft==0.17.1"]
    assert old_505.count('pip install "peft>=0.18.0", then ' + cure) == 1 and "peft 0.17.1 (--with) has no" in old_505
    assert old_422.startswith('pip install "peft>=0.18.0" (PR #2825); to train the whole embedding instead, ' + cure)
    new_505, new_422 = fixes["peft==0.21.2"]
    assert "pip install" not in new_505 and new_422 is None  # 0.18+: no GD422, and GD505's cure needs no upgrade
    assert fixes["peft>=0.15"][0].count("with PEFT >= 0.18.0, " + cure) == 1


@pytest.mark.parametrize("training, gpu, expected", [
    ({"attn_implementation": "flash_attention_2", "bf16": True}, "T4", ["GD683"]),
    ({"attn_implementation": "flash_attention_2", "fp16": True}, "V100", ["GD683"]),
    ("base_model: x\nflash_attention: true\nmicro_batch_size: 1\n", "T4", ["GD683"]),  # axolotl's switch
    # axolotl's schema (0.19.0: `flash_attention: bool | None`, pydantic) reads the string "true" as true (was missed)
    ("base_model: x\nflash_attention: \"true\"\nmicro_batch_size: 1\n", "T4", ["GD683"]),
    ({"attn_implementation": "flash_attention_2", "bf16": True}, "A10G", []),
    # (a batch of 1: TrainingArguments' default of 8 in fp32 fits no method on an A100-40GB, GD801)
    ({"attn_implementation": "flash_attention_2", "torch_dtype": "float32", "per_device_train_batch_size": 1}, "A100",
     ["GD684"]),
    ({"attn_implementation": "flash_attention_2", "torch_dtype": "float32", "bf16": True}, "A100", []),
    ({"attn_implementation": "sdpa", "torch_dtype": "float32"}, "T4", []),
    # TRL's SFTConfig (max_length) turns bf16 on where fp16 is off (TRL 1.16.0 here): the queries reach flash-attn in
    # bf16, cast from fp32 to the autocast dtype by transformers' flash_attention integration (was GD684)
    ({"attn_implementation": "flash_attention_2", "torch_dtype": "float32", "max_length": 1024}, "A100", []),
    ({"attn_implementation": "flash_attention_2", "torch_dtype": "float32", "max_length": 1024, "bf16": False}, "A100",
     ["GD684"]),
])
def test_flash_attention_2_before_ampere_or_on_fp32_is_refused_by_flash_attn(cli, hub, tmp_path, training, gpu, expected):
    """Both passed: flash-attn 2's flash_api.cpp refuses GPUs before sm80 and fp32 inputs (2.6.x sdists)."""
    got = check(cli, hub, tmp_path, {"config.json": gemma3_1b_config()}, training, "--gpu", gpu,
                "--with", "flash-attn==2.6.3")
    assert sorted(c for c in got if c in ("GD683", "GD684")) == expected
    assert "GD641" not in got  # the head_dim backward check is moot where flash-attn 2 never runs


@pytest.mark.parametrize("stack, training, load, expected", [
    # A plain Trainer config that names no dtype: the user's own from_pretrained loads the weights. transformers 5.23.0
    # (the test stack) loads the checkpoint's dtype (reproduced on a tiny bf16 Gemma 3: torch.bfloat16), so
    # flash-attn gets bf16 queries: no GD684 (the memory plan counted fp32 weights, 43.8 GiB for a 12b)
    ((), {"attn_implementation": "flash_attention_2", "bf16": False, "per_device_train_batch_size": 1}, "bfloat16", []),
    # transformers 4.x loads float32 where no dtype is given: both say fp32
    (("--with", "transformers==4.57.6"), {"attn_implementation": "flash_attention_2", "bf16": False}, "float32",
     ["GD684"]),
    ((), {"attn_implementation": "flash_attention_2", "torch_dtype": "float32", "per_device_train_batch_size": 1},
     "float32", ["GD684"]),
    # TRL 1.16.0 loads float32 where model_init_kwargs names no dtype (TRL_LOADS_FP32): with bf16 off nothing casts
    ((), {"attn_implementation": "flash_attention_2", "max_length": 1024, "bf16": False}, "float32", ["GD684"]),
    # axolotl passes from_pretrained the torch_dtype its switches make (0.19.0 normalize_config's resolve_dtype):
    # float32 with bf16 and fp16 off, and nothing casts the queries (was no GD684: the plan's own float32)
    (("--with", "axolotl==0.19.0"), {"base_model": "acme/model", "micro_batch_size": 1, "flash_attention": True,
                                     "bf16": False}, "float32", ["GD684"]),
    # no switch is its schema's bf16: auto, bf16 on every CUDA GPU (validate_config + normalize_config run on 0.19.0:
    # torch.bfloat16): no GD684 (was float32 and GD684)
    (("--with", "axolotl==0.19.0"), {"base_model": "acme/model", "micro_batch_size": 1, "flash_attention": True},
     "bfloat16", []),
    # the config's format names the trainer that runs it, whatever this machine has installed: axolotl 0.19.0's and
    # LLaMA-Factory 0.9.5's loaders are assumed where the stack does not name them (was no GD684: the plan's own dtype)
    ((), {"base_model": "acme/model", "micro_batch_size": 1, "flash_attention": True, "bf16": False}, "float32",
     ["GD684"]),
    ((), {"stage": "sft", "finetuning_type": "full", "flash_attn": "fa2"}, "float32", ["GD684"]),
    (("--with", "axolotl==0.19.0"), {"base_model": "acme/model", "micro_batch_size": 1, "flash_attention": True,
                                     "bf16": True}, "bfloat16", []),
    # bf16: auto is bf16 on every GPU flash-attn 2 runs on (Ampere+): the GPU decides, the plan's dtype stays
    (("--with", "axolotl==0.19.0"), {"base_model": "acme/model", "micro_batch_size": 1, "flash_attention": True,
                                     "bf16": "auto"}, "bfloat16", []),
    # LLaMA-Factory 0.9.5 loads torch_dtype="auto" and init_adapter upcasts a full fine-tuning's weights to float32
    # unless pure_bf16: without bf16 flash-attn gets fp32 queries (was no GD684)
    (("--with", "llamafactory==0.9.5"), {"stage": "sft", "finetuning_type": "full", "flash_attn": "fa2"}, "float32",
     ["GD684"]),
    (("--with", "llamafactory==0.9.5"), {"stage": "sft", "finetuning_type": "full", "flash_attn": "fa2",
                                         "bf16": True}, "float32", []),
    # a LoRA base stays in the checkpoint's dtype (bf16 here): flash-attn gets bf16 queries (was float32 in the plan)
    (("--with", "llamafactory==0.9.5"), {"stage": "sft", "finetuning_type": "lora", "flash_attn": "fa2"}, "bfloat16",
     []),
])
def test_gd684_and_the_memory_plan_read_the_one_load_dtype_of_the_run(cli, hub, tmp_path, stack, training, load,
                                                                       expected):
    """GD684 (FlashAttention-2 on fp32 weights) and the memory plan state the same load dtype: the Run's."""
    hub.add("acme/model", {"config.json": gemma3_1b_config()})
    path = tmp_path / "train.json"
    path.write_text(json.dumps(training))
    r = cli("check", "acme/model", "--cache-dir", str(hub.root), "--format", "json", "--fail-on", "never", "--gpu",
            "A100", "--training-config", str(path), "--with", "flash-attn==2.6.3", *stack)
    assert r.code == 0, r
    [model] = r.json()["models"]
    assert sorted(f["code"] for f in model["findings"] if f["code"] == "GD684") == expected
    assert model["run"]["load_dtype"] == load and model["memory"]["run"]["load_dtype"] == load


AX = {"base_model": "acme/model", "micro_batch_size": 1}
LF = {"stage": "sft", "finetuning_type": "lora"}


@pytest.mark.parametrize("training, gpu, precision, load, codes", [
    # axolotl 0.19.0's schema defaults bf16 to `auto`, which resolve_dtype turns on wherever
    # torch.cuda.is_bf16_supported() says so, counting emulation (validate_config + normalize_config run here: no
    # switch -> bf16, torch.bfloat16): bf16 on an A100 and, emulated, on a T4 (GD605), never fp32 (was GD609 and,
    # on a T4, an fp32 plan of 20.3 GiB)
    (AX, "A100", "bf16", "bfloat16", set()),
    (AX, "T4", "bf16", "bfloat16", {"GD605"}),
    ({**AX, "fp16": False}, "A100", "bf16", "bfloat16", set()),  # fp16 off leaves bf16's auto (was fp32)
    ({**AX, "bf16": "auto", "fp16": True}, "T4", "fp16", "float16", {"GD605", "GD602"}),  # auto turns off beside fp16
    ({**AX, "bf16": False}, "A100", "fp32", "float32", {"GD609"}),
    # LLaMA-Factory 0.9.5: bf16 / fp16 false unless set, no autocast (was the recommended bf16); a LoRA base keeps the
    # checkpoint's dtype
    (LF, "A100", "fp32", "bfloat16", {"GD609"}),
    ({**LF, "bf16": True}, "A100", "bf16", "bfloat16", set()),
    # LLaMA-Factory 0.9.5's pure_bf16 (hparams/parser.py: compute_dtype bfloat16; model/loader.py: torch_dtype "auto",
    # the checkpoint's bfloat16; model/adapter.py: no fp32 upcast under pure_bf16) trains the weights in bfloat16,
    # with or without `bf16`: never fp32 (was GD609, "trains in fp32", beside a plan in the recommended precision), and
    # on a T4 bf16 is emulated (GD603; LLaMA-Factory's own check takes emulation for support). Full fine-tuning keeps
    # bfloat16 weights (was float32 beside bf16).
    ({**LF, "pure_bf16": True}, "A100", "bf16", "bfloat16", set()),
    ({**LF, "finetuning_type": "full", "pure_bf16": True}, "A100", "bf16", "bfloat16", set()),
    ({**LF, "finetuning_type": "full", "pure_bf16": True, "bf16": True}, "A100", "bf16", "bfloat16", set()),
    ({**LF, "pure_bf16": True}, "T4", "bf16", "bfloat16", {"GD603"}),
    # axolotl on Apple MPS (0.19.0's resolve_dtype, run on the real module with the device a Mac gives,
    # tests/test_training_keys.py): bf16 on or auto becomes fp16 with float16 weights unless fp16 is written false
    # (then fp32), whatever the chip's bf16: GD602 on Gemma 3, never GD603 / GD605, GD609 only where it is fp32 (was
    # bf16 on an M3; on an M1 bf16 with GD605 or GD603)
    (AX, "M3", "fp16", "float16", {"GD602"}),
    (AX, "M1", "fp16", "float16", {"GD602"}),
    ({**AX, "bf16": True}, "M1", "fp16", "float16", {"GD602"}),
    ({**AX, "bf16": True, "fp16": False}, "M3", "fp32", "float32", set()),
    ({**AX, "bf16": False}, "M3", "fp32", "float32", {"GD609"}),
])
def test_axolotl_and_llamafactory_configs_are_planned_in_the_precision_their_trainer_runs(
        cli, hub, tmp_path, training, gpu, precision, load, codes):
    """The precision of an axolotl / LLaMA-Factory config that sets no switch is its trainer's own default, by the
    config's format (the release read here assumed: neither trainer is installed): the Run, the memory plan and the
    precision findings say the same."""
    hub.add("acme/model", {"config.json": gemma3_1b_config()})
    path = tmp_path / "train.json"
    path.write_text(json.dumps(training))
    r = cli("check", "acme/model", "--cache-dir", str(hub.root), "--format", "json", "--fail-on", "never", "--gpu", gpu,
            "--training-config", str(path))
    [model] = r.json()["models"]
    run = model["run"]
    assert (run["precision"]["value"], run["load_dtype"]) == (precision, load)
    assert (model["memory"]["run"]["precision"], model["memory"]["run"]["load_dtype"]) == (precision, load)
    assert {f["code"] for f in model["findings"]} & {"GD602", "GD603", "GD605", "GD609"} == codes
    if "switch" not in str(training) and "bf16" not in training and "fp16" not in training:
        trainer = "axolotl 0.19.0" if "base_model" in training else "llamafactory 0.9.5"
        assert run["precision"]["source"].startswith(f"default of {trainer} (assumed: ")


@pytest.mark.parametrize("gpu", ["M3", "M4"])
def test_the_prescription_on_apple_mps_is_the_run_its_axolotl_yaml_runs_there(cli, hub, tmp_path, gpu):
    """On an MPS chip with native bf16, recommend prescribed bf16 and wrote `bf16: true, fp16: false` into its axolotl
    YAML, which axolotl 0.19.0 runs in fp32 there (resolve_dtype turns bf16 off on MPS; fp16 written false stays off):
    check of that YAML planned another run than the prescription's. The prescription is now fp32 on MPS for a Gemma
    that overflows fp16, its YAML says so, and check of it plans the very run, without an error or a warning."""
    hub.add("acme/model", {"config.json": gemma3_1b_config()})
    r = cli("recommend", "acme/model", "--cache-dir", str(hub.root), "--gpu", gpu, "--format", "json")
    [m] = r.json()["models"]
    p = m["prescription"]
    assert m["recommendation"]["precision"] == p["precision"] == "fp32"
    assert any("runs none on Apple MPS" in why for why in m["recommendation"]["reasons"])
    y = yaml.safe_load(m["snippets"]["yaml"])
    assert (y["bf16"], y["fp16"]) == (False, False)
    path = tmp_path / "run.yaml"
    path.write_text(m["snippets"]["yaml"])
    r = cli("check", "acme/model", "--cache-dir", str(hub.root), "--gpu", gpu, "--training-config", str(path),
            "--format", "json", "--fail-on", "warning")
    [checked] = r.json()["models"]
    assert r.code == 0 and not [f for f in checked["findings"] if f["severity"] in ("error", "warning")]
    assert checked["memory"]["summary"] == p["memory"] and checked["run"]["precision"]["value"] == "fp32"


@pytest.mark.parametrize("training, severity", [
    ({"bf16": False}, "info"),  # the config's switches say fp32: it follows GD302's advice
    ({"max_length": 1024, "bf16": False}, "info"),  # TRL's SFTConfig with bf16 off: fp32 too
    # TRL's SFTConfig with fp16 off and bf16 unset turns bf16 on (TRL 1.16.0 here: bf16 = not fp16), emulated on a T4:
    # the run does not train in fp32 (was "info", as if it followed the advice)
    ({"max_length": 1024, "fp16": False}, "warning"),
    ({"per_device_train_batch_size": 4}, "warning"),  # no switch: the launcher decides
])
def test_gd302_is_a_fact_only_where_the_run_trains_in_fp32(cli, hub, tmp_path, training, severity):
    """GD302 (no native bf16, a model that overflows fp16) is information where the run already trains in fp32: the
    Run's precision as the config's own switches set it, not a trainer that turns bf16 on by its default."""
    got = check(cli, hub, tmp_path, {"config.json": gemma3_1b_config()}, training, "--gpu", "T4")
    assert [f["severity"] for f in got["GD302"]] == [severity]


def test_gemma3n_tokens_beyond_the_rows_are_not_cured_by_resizing_the_multimodal_model(cli, hub, tmp_path):
    """GD505 advised resize_token_embeddings(len(tokenizer)) on a multimodal Gemma 3n, whose forward embeds every id
    >= audio_config.vocab_offset with embed_audio. Reproduced on tiny real modules: the audio embedder raises
    IndexError for a resized id, a resized Gemma3nForCausalLM embeds it."""
    import torch
    import transformers as T
    from transformers.models.gemma3n.modeling_gemma3n import Gemma3nMultimodalEmbedder

    text = T.Gemma3nTextConfig(vocab_size=400, vocab_size_per_layer_input=256, hidden_size=32,
                               hidden_size_per_layer_input=8, intermediate_size=64, num_hidden_layers=2,
                               num_attention_heads=2, num_key_value_heads=1, head_dim=16, laurel_rank=4,
                               altup_num_inputs=2, num_kv_shared_layers=0, sliding_window=8,
                               layer_types=["sliding_attention", "full_attention"], activation_sparsity_pattern=[0.0, 0.0])
    audio = T.Gemma3nAudioConfig(vocab_offset=320, vocab_size=80, hidden_size=32)
    with pytest.raises(IndexError):
        Gemma3nMultimodalEmbedder(audio, text)(input_ids=torch.tensor([[405]]))
    causal = T.Gemma3nForCausalLM(text).eval()
    causal.resize_token_embeddings(410)
    assert causal(input_ids=torch.tensor([[1, 405]])).logits.shape[-1] == 410

    tok = tokenizer_config()
    tok["added_tokens_decoder"]["405"] = {"content": "<tool_call>", "special": True}
    config = {**gemma3n_config(), "audio_config": {"model_type": "gemma3n_audio", "vocab_offset": 320, "vocab_size": 80}}
    files = {"config.json": config, "tokenizer_config.json": tok,
             "model.safetensors": st_file({"model.language_model.embed_tokens.weight": ("BF16", [400, 8])})}
    [f] = check(cli, hub, tmp_path, files)["GD505"]
    assert "audio_config.vocab_offset (320)" in f["message"] and f["details"]["audio_vocab_offset"] == 320
    assert "Gemma3nForCausalLM" in f["fix"] and not f["fix"].startswith("model.resize_token_embeddings")


def test_on_a_t4_gd302_offers_no_fp32_for_awq_and_warns_of_unsloth_s_fp16_narrowed_fp32(cli, hub, tmp_path):
    """GD302 prescribed fp32 for an AWQ checkpoint, whose kernels compute in float16 (transformers' AwqQuantizer), and
    fp32 through unsloth-zoo releases whose forced-float32 path narrows every Linear to float16 (GD714's wheels)."""
    awq = variant(gemma3_12b_config(), quantization_config={"quant_method": "awq", "bits": 4, "group_size": 128})
    [f] = check(cli, hub, tmp_path, {"config.json": awq}, None, "--gpu", "T4", repo="acme/awq")["GD302"]
    assert "AWQ" in f["message"] and "no fp32 path" in f["message"] and "unquantized checkpoint" in f["fix"]
    assert "fp32 settings" not in f["fix"]
    files = {"config.json": gemma3_12b_config(), "generation_config.json": generation_config()}
    old = check(cli, hub, tmp_path, files, None, "--gpu", "T4", "--with", "unsloth==2026.7.1",
                "--with", "unsloth-zoo==2026.7.1", repo="acme/old")["GD302"][0]
    assert "narrowed to float16" in old["message"] and 'unsloth-zoo>=2026.8.7' in old["fix"]
    new = check(cli, hub, tmp_path, files, None, "--gpu", "T4", "--with", "unsloth==2026.8.7",
                "--with", "unsloth-zoo==2026.8.7", repo="acme/new")["GD302"][0]
    assert "Unsloth" not in new["message"]
    plain = check(cli, hub, tmp_path, files, None, "--gpu", "T4", repo="acme/plain")["GD302"][0]
    assert "Unsloth" not in plain["message"] and "fp32 settings" in plain["fix"]


def test_lora_on_an_awq_checkpoint_is_not_quantized_again_and_is_planned_at_awq_s_bytes(cli, hub, tmp_path):
    """Issue 32: `recommend` prescribed "4bit QLoRA" on an AWQ checkpoint, its axolotl YAML and Unsloth snippet asking
    bitsandbytes to quantize the quantized weights again (`load_in_4bit`); a config's `adapter: lora` on it was planned
    with 16-bit weights. Now LoRA on the weights as saved, planned at AWQ's bytes, in the prescription and in check."""
    awq = variant(gemma3_12b_config(), quantization_config={"quant_method": "awq", "bits": 4, "group_size": 128})
    hub.add("acme/awq", {"config.json": awq, "generation_config.json": generation_config()})
    r = cli("recommend", "acme/awq", "--cache-dir", hub.root, "--gpu", "A100", "--format", "json")
    assert r.code == 0, r
    [model] = r.json()["models"]
    assert "LoRA on the awq 4-bit checkpoint" in model["recommendation"]["summary"]
    assert "QLoRA" not in model["recommendation"]["summary"]
    assert "load_in_4bit=False" in model["snippets"]["python"]["unsloth"]
    y = cli("recommend", "acme/awq", "--cache-dir", hub.root, "--gpu", "A100", "--format", "yaml")
    assert "load_in_4bit" not in y.out and 'adapter: "lora"' in y.out
    path = tmp_path / "awq.yaml"
    path.write_text(y.out)
    c = cli("check", "acme/awq", "--cache-dir", hub.root, "--gpu", "A100", "--training-config", path, "--format", "json",
            "--fail-on", "warning")
    assert c.code == 0, c
    [checked] = c.json()["models"]
    plan = checked["memory"]
    assert plan["run"]["method"] == "qlora" and "quantization_config (awq 4-bit)" in str(plan)
    assert any("checkpoint's own awq 4-bit quantization" in a for a in plan["assumptions"])
    assert plan["summary"] == model["memory"]["summary"]
    # A plain `adapter: lora` axolotl config of the user's own is planned on the quantized weights too.
    own = tmp_path / "own.yaml"
    own.write_text("base_model: acme/awq\nadapter: lora\nbf16: true\nmicro_batch_size: 4\nsequence_len: 1024\n")
    o = cli("check", "acme/awq", "--cache-dir", hub.root, "--gpu", "A100", "--training-config", own, "--format", "json",
            "--fail-on", "never")
    [mine] = o.json()["models"]
    assert mine["memory"]["run"]["method"] == "qlora" and mine["memory"]["components"]["weights"] < 10 * 2**30


@pytest.mark.parametrize("text, gpu, code, words", [
    # GD650 named TrainingArguments' per_device_train_batch_size on an axolotl config, whose key is micro_batch_size
    ("base_model: x\nadapter: lora\nmicro_batch_size: 8\nsequence_len: 4096\nbf16: true\n", "A100", "GD650",
     ("micro_batch_size 8 x sequence_len 4096",)),
    ("stage: sft\nfinetuning_type: lora\nper_device_train_batch_size: 8\ncutoff_len: 4096\nbf16: true\n", "A100",
     "GD650", ("per_device_train_batch_size 8 x cutoff_len 4096",)),
    # GD683's fix said attn_implementation="sdpa" to axolotl (flash_attention) and LLaMA-Factory (flash_attn) configs
    ("base_model: x\nflash_attention: true\nmicro_batch_size: 1\n", "T4", "GD683",
     ("flash_attention: false with sdp_attention: true",)),
    ("stage: sft\nfinetuning_type: lora\nflash_attn: fa2\nper_device_train_batch_size: 1\n", "T4", "GD683",
     ("flash_attn: sdpa",)),
    ("attn_implementation: flash_attention_2\nbf16: true\nper_device_train_batch_size: 1\n", "T4", "GD683",
     ("attn_implementation: sdpa",)),
])
def test_a_finding_names_the_key_of_the_config_s_own_format(cli, hub, tmp_path, text, gpu, code, words):
    """A finding that names a key names it as the config's own format writes it: the user searches their file for it."""
    hub.add("google/gemma-3-1b-it", {"config.json": gemma3_1b_config()})
    tc = tmp_path / "run.yaml"
    tc.write_text(text)
    m = cli("check", "--cache-dir", hub.root, "--gpu", gpu, "--training-config", tc, "--with", "flash-attn==2.6.3",
            "--format", "json", "--fail-on", "never").json()["models"][0]
    [f] = [f for f in m["findings"] if f["code"] == code]
    said = f["message"] + " " + f["fix"]
    assert all(w in said for w in words), said
    wrong = {"GD650": "per_device_train_batch_size", "GD683": 'attn_implementation="sdpa"'}[code]
    assert ("per_device_train_batch_size" in text) or wrong not in said, said


GEMMA1 = {"architectures": ["GemmaForCausalLM"], "model_type": "gemma", "hidden_size": 2048, "num_hidden_layers": 18,
          "num_attention_heads": 8, "num_key_value_heads": 1, "head_dim": 256, "intermediate_size": 16384,
          "vocab_size": 256000, "torch_dtype": "bfloat16", "use_cache": True, "pad_token_id": 0}


@pytest.mark.parametrize("training, flagged", [
    # axolotl 0.19.0's normalize_config loads float16 wherever fp16 is on: full fine-tuning then has float16 grads
    ({"base_model": "acme/model", "micro_batch_size": 1, "fp16": True}, True),
    ({"base_model": "acme/model", "micro_batch_size": 1, "fp16": True, "adapter": "lora"}, False),  # fp32 adapters
    ({"base_model": "acme/model", "micro_batch_size": 1, "fp16": True,
      "deepspeed": "deepspeed_configs/zero1.json"}, False),  # DeepSpeed's own loss scaler keeps fp32 masters
    # a TrainingArguments / TRL config that names the float16 load
    # a TrainingArguments / TRL config that names the float16 load (full fine-tuning: the script adds no adapter)
    ({"per_device_train_batch_size": 1, "fp16": True, "bf16": False, "torch_dtype": "float16", "method": "full"}, True),
    ({"per_device_train_batch_size": 1, "fp16": True, "bf16": False, "method": "full"}, False),  # float32 load
])
def test_gd611_fp16_full_fine_tuning_of_float16_weights_is_the_grad_scalers_refusal(cli, hub, tmp_path, training,
                                                                                   flagged):
    """torch's GradScaler refuses float16 gradients ("Attempting to unscale FP16 gradients.", reproduced below on the
    CPU); the Trainer's fp16 goes through it. check planned axolotl's fp16 full fine-tuning in float16 weights (its
    own load dtype) and said nothing; recommend prescribed that run on a T4 for an fp16-safe Gemma."""
    import torch

    p = torch.nn.Parameter(torch.ones(4, dtype=torch.float16))
    scaler = torch.amp.GradScaler("cpu")
    scaler.scale((p * p).sum()).backward()
    with pytest.raises(ValueError, match="Attempting to unscale FP16 gradients"):
        scaler.unscale_(torch.optim.AdamW([p]))
    hub.add("acme/model", {"config.json": GEMMA1})
    training = dict(training)
    method = ("--method", training.pop("method")) if "method" in training else ()
    path = tmp_path / "train.json"
    path.write_text(json.dumps(training))
    r = cli("check", "acme/model", "--cache-dir", str(hub.root), "--format", "json", "--fail-on", "never", "--gpu", "T4",
            "--training-config", str(path), *method)
    [model] = r.json()["models"]
    found = {f["code"]: f for f in model["findings"]}
    assert ("GD611" in found) is flagged, (model["run"]["load_dtype"], sorted(found))
    if flagged:
        assert found["GD611"]["severity"] == "error" and found["GD611"]["key"] in ("fp16", "torch_dtype")


def test_recommend_on_a_t4_never_prescribes_fp16_full_fine_tuning_of_float16_weights(cli, hub):
    """The prescription's axolotl YAML with fp16: true and no adapter loads float16 (axolotl's normalize_config), a run
    GD611 refuses: the search plans each candidate as check reads its YAML back, so it prescribes another run, whose
    YAML passes check with the same memory line."""
    hub.add("google/gemma-2b", {"config.json": GEMMA1})
    args = ("google/gemma-2b", "--cache-dir", hub.root, "--gpu", "T4", "--method", "full")
    m = cli("recommend", *args, "--format", "json").json()["models"][0]
    # fp16 full fine-tuning is no run under axolotl, fp32 does not fit 15 GiB: no prescription, GD611 said first and
    # LoRA the first way out (before: prescribed "full fine-tuning, fp16" while its YAML loads float16)
    assert m["status"] == "no-prescription", m.get("prescription")
    assert m["way_out"][0].startswith("GD611: ") and m["way_out"][1].startswith("--method lora: "), m["way_out"]


@pytest.mark.parametrize("gpu", ["M3", "M4"])
def test_on_apple_mps_a_trl_prescription_keeps_bf16_where_only_axolotls_yaml_loses_it(cli, hub, tmp_path, gpu):
    """axolotl's resolve_dtype turns bf16 off on MPS; TRL's SFTTrainer does not: `recommend --trainer trl` on an MPS
    chip with native bf16 prescribes bf16 (was fp32 for every trainer once the axolotl fp32 rule landed), and check of
    its `trl sft --config` YAML plans that very run without an error or a warning."""
    hub.add("acme/model", {"config.json": gemma3_1b_config()})
    r = cli("recommend", "acme/model", "--cache-dir", str(hub.root), "--gpu", gpu, "--trainer", "trl", "--format", "json")
    [m] = r.json()["models"]
    p = m["prescription"]
    assert m["recommendation"]["precision"] == p["precision"] == "bf16"
    path = tmp_path / "run.yaml"
    path.write_text(m["snippets"]["yaml"])
    r = cli("check", "acme/model", "--cache-dir", str(hub.root), "--gpu", gpu, "--training-config", str(path),
            "--format", "json", "--fail-on", "warning")
    [checked] = r.json()["models"]
    assert r.code == 0 and not [f for f in checked["findings"] if f["severity"] in ("error", "warning")], checked["findings"]
    assert checked["memory"]["summary"] == p["memory"] and checked["run"]["precision"]["value"] == "bf16"
