"""The rehearsal on the pinned stack (transformers 5.23, PEFT 0.21, TRL 1.16): healthy LoRA SFT runs of Gemma 3 text,
Gemma 3 multimodal and Gemma 4 raise nothing; labels that train nothing are caught by the invariants alone; hostile
targets and configs end in one line or a finding, never a hang. The judgement (invariants.py) is tested on plain
records too: it is pure.

Each rehearsal is a real child process (twin built and trained by the installed libraries) on a tiny config:
hidden 64, two layers, a vocabulary of 256, so a run takes seconds of compute (most of it imports).
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gemma_doctor.rehearse import invariants

TXT = dict(vocab_size=256, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
           num_key_value_heads=1, head_dim=16, max_position_embeddings=128, pad_token_id=0, eos_token_id=1,
           bos_token_id=2)
SIGLIP = dict(model_type="siglip_vision_model", hidden_size=32, intermediate_size=64, num_hidden_layers=1,
              num_attention_heads=2, image_size=28, patch_size=14)
G4V = dict(model_type="gemma4_vision", hidden_size=32, intermediate_size=64, num_hidden_layers=1,
           num_attention_heads=2, num_key_value_heads=2, head_dim=16, patch_size=4, pooling_kernel_size=2,
           position_embedding_size=64)
G4A = dict(model_type="gemma4_audio", hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
           subsampling_conv_channels=[8, 4], output_proj_dims=32, conv_kernel_size=3)

CONFIGS = {
    "gemma3_text": dict(TXT, architectures=["Gemma3ForCausalLM"], model_type="gemma3_text", torch_dtype="bfloat16"),
    "gemma3": dict(architectures=["Gemma3ForConditionalGeneration"], model_type="gemma3", torch_dtype="bfloat16",
                   text_config=dict(TXT, model_type="gemma3_text"), vision_config=SIGLIP, mm_tokens_per_image=4,
                   image_token_index=255, boi_token_index=253, eoi_token_index=254, eos_token_id=[1, 106]),
    "gemma4": dict(architectures=["Gemma4ForConditionalGeneration"], model_type="gemma4", dtype="bfloat16",
                   text_config=dict(TXT, model_type="gemma4_text", num_hidden_layers=4, sliding_window=8,
                                    layer_types=["sliding_attention", "full_attention"] * 2, global_head_dim=32,
                                    num_kv_shared_layers=2, vocab_size_per_layer_input=256,
                                    hidden_size_per_layer_input=8),
                   vision_config=G4V, audio_config=G4A, boi_token_id=250, eoi_token_id=251, image_token_id=252,
                   video_token_id=253, boa_token_id=254, eoa_token_index=255, audio_token_id=249),
}
LORA_SFT = "bf16: true\nper_device_train_batch_size: 2\nlearning_rate: 0.001\nmax_length: 256\nuse_peft: true\n" \
           "lora_r: 8\nlora_target_modules: [q_proj, k_proj, v_proj, o_proj]\n"


def model_folder(root: Path, member: str, config: dict | None = None) -> Path:
    """A model folder holding only the member's config.json (as a download of its config would)."""
    folder = root / f"google--tiny-{member}"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(config if config is not None else CONFIGS[member]))
    return folder


def rehearse(cli, *args: str):
    got = cli("rehearse", *args, "--format", "json")
    return got, (got.json()["rehearsals"][0] if got.out.strip() else None)


@pytest.mark.slow
@pytest.mark.parametrize("member", ["gemma3_text", "gemma3", "gemma4"])
def test_a_healthy_lora_sft_run_rehearses_every_stage_without_a_finding(tmp_path, cli, member):
    config = tmp_path / "sft.yaml"
    # Gemma 4's towers hold Gemma4ClippableLinear projections also named q_proj..., which PEFT refuses (PEFT #3129):
    # a working Gemma 4 LoRA config targets the language model's.
    targets = "'.*language_model.*[.](q|k|v|o)_proj'" if member == "gemma4" else "[q_proj, k_proj, v_proj, o_proj]"
    config.write_text(LORA_SFT.replace("[q_proj, k_proj, v_proj, o_proj]", targets))
    got, doc = rehearse(cli, model_folder(tmp_path, member), "--training-config", config)
    assert doc["findings"] == [], doc["findings"]
    assert got.code == 0
    assert [s["stage"] for s in doc["stages"]] == ["twin", "load", "setup", "labels", "train", "accumulation", "eval",
                                                  "generate", "save", "merge"]
    assert all(s["status"] == "ok" for s in doc["stages"])
    assert doc["trainer"] == "trl-sft" and doc["stack"]["trl"]
    train = next(s for s in doc["stages"] if s["stage"] == "train")
    assert len(train["losses"]) == 3 and train["moved"] > 0
    assert len(train["learning_rates"]) == 3 and all(r > 0 for r in train["learning_rates"])


@pytest.mark.slow
def test_lora_targets_that_reach_gemma4_s_towers_crash_at_setup_and_gd440_s_cure_is_verified(tmp_path, cli):
    """'.*(q|k|v|o)_proj' also matches the towers' Gemma4ClippableLinear projections: PEFT 0.21.2 refuses them when the
    trainer is built (met by benchmarks/rehearse_members.py). The crash names the Gemma 4 entry (not Gemma 3n's, whose
    refusal PEFT words alike), and its cure, the language model's projections, reruns the stages to setup."""
    config = tmp_path / "sft.yaml"
    config.write_text(LORA_SFT.replace("[q_proj, k_proj, v_proj, o_proj]", "'.*(q|k|v|o)_proj'"))
    got, doc = rehearse(cli, model_folder(tmp_path, "gemma4"), "--training-config", config, "--steps", "1")
    [f] = doc["findings"]
    assert (f["code"], f["key"]) == ("GD956", "setup") and "Gemma4ClippableLinear" in f["message"], f
    assert f["details"]["catalogue"] == "peft-gemma4-clippable-linear"
    assert f["details"]["cure"].startswith("cure verified in this stack: with target_modules: "
                                           '".*language_model.*'), f["details"]["cure"]
    assert got.code == 1


@pytest.mark.slow
def test_a_warm_up_from_zero_over_every_rehearsed_step_is_a_note_not_a_false_alarm(tmp_path, cli):
    """`--steps 1` of a run whose warm-up starts at 0 (warmup_steps 5): its one step applies a learning rate of 0, so
    nothing moves in any correct stack. Before, GD969 and GD970 called that healthy run broken; the driver now records
    the rate each step applies and the judgement leaves unchanged parameters unjudged, with a note."""
    config = tmp_path / "sft.yaml"
    config.write_text(LORA_SFT + "warmup_steps: 5\n")
    got, doc = rehearse(cli, model_folder(tmp_path, "gemma3_text"), "--training-config", config, "--steps", "1")
    train = next(s for s in doc["stages"] if s["stage"] == "train")
    assert train["learning_rates"] == [0.0] and train["moved"] == 0
    assert doc["findings"] == [] and got.code == 0, doc["findings"]
    assert any("learning rate was 0" in n for n in doc["notes"])


@pytest.mark.slow
def test_real_weights_measures_one_step_of_the_real_checkpoint_beside_the_twin_rehearsal(tmp_path, cli):
    import torch
    import transformers

    folder = tmp_path / "google--tiny-real"
    torch.manual_seed(0)
    config = transformers.Gemma3TextConfig(**{k: v for k, v in TXT.items()})
    transformers.Gemma3ForCausalLM(config).to(torch.bfloat16).save_pretrained(folder)
    sft = tmp_path / "sft.yaml"
    sft.write_text(LORA_SFT.replace("max_length: 256", "max_length: 16"))
    got, doc = rehearse(cli, folder, "--training-config", sft, "--real-weights")
    assert got.code == 0, doc["findings"]
    [real] = [s for s in doc["stages"] if s["stage"] == "real-weights"]
    assert real["status"] == "ok" and real["device"] == "cpu" and real["peak_source"] == "rss"
    assert real["fp16_overflow"] is False and real["grad_absmax"] > 0
    # A TRL SFT config on TRL 1.16: the plan counts TRL's chunked log-probs, which one forward of the model does not
    # compute, so the peak is not held against it, and the note says so (tests/test_rehearse_device.py: the rest).
    assert "plan_tensor_bytes" not in real
    assert any("not held against the memory plan" in n and "chunked" in n for n in doc["notes"]), doc["notes"]


def test_real_weights_of_a_folder_without_weights_is_a_finding(tmp_path, cli):
    """The bundled examples hold config.json and no weights: the measured step cannot run, and says so."""
    from gemma_doctor.rehearse.runner import Rehearsal

    record = {"stage": "real-weights", "status": "error", "exception": "OSError", "line": "OSError: no weights"}
    [f] = invariants.judge([record], [])
    assert f.code == "GD964" and "real checkpoint" in f.message
    assert Rehearsal("t", "r", "trl-sft", stages=[record], findings=[f]).failed


@pytest.mark.slow
def test_check_rehearse_adds_the_rehearsal_to_the_model_and_its_findings(tmp_path, cli):
    """Labels that train nothing, caught where no exception is raised (facts.md section 15): a pre-tokenized dataset
    whose labels are all masked (a preprocessing step that masked everything), which TRL keeps as it is with
    max_length null. Through check --rehearse, so the findings are the model's own."""
    rows = [{"input_ids": list(range(110, 130 + i)), "labels": [-100] * (20 + i)} for i in range(10)]
    data = tmp_path / "data.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    config = tmp_path / "sft.yaml"
    config.write_text(LORA_SFT.replace("max_length: 256", "max_length: null") + f"dataset_name: {data}\n")
    got = cli("check", model_folder(tmp_path, "gemma3_text"), "--training-config", config, "--rehearse",
              "--format", "json")
    [model] = got.json()["models"]
    assert got.code == 1
    codes = {f["code"] for f in model["findings"]}
    assert "GD971" in codes and codes & {"GD965", "GD966", "GD968"}, model["findings"]
    assert model["rehearsal"]["status"] == "failed" and model["rehearsal"]["stages"]


def test_check_rehearse_needs_named_models(cli):
    got = cli("check", "--rehearse")
    assert got.code == 2 and "--rehearse" in got.err


def test_a_missing_config_json_is_one_line(tmp_path, cli):
    folder = tmp_path / "empty"
    folder.mkdir()
    got = cli("rehearse", folder)
    assert got.code == 2 and got.out == ""
    assert got.err.strip().count("\n") == 0 and "config.json" in got.err


@pytest.mark.parametrize("text", ["[1, 2]\n", "a: [\n", ""])
def test_a_broken_training_config_is_one_line(tmp_path, cli, text):
    config = tmp_path / "bad.yaml"
    config.write_text(text)
    got = cli("rehearse", model_folder(tmp_path, "gemma3_text"), "--training-config", config)
    assert got.code == 2 and got.out == ""
    assert got.err.strip().count("\n") == 0 and "bad.yaml" in got.err


def test_a_config_naming_no_architecture_is_one_line(tmp_path, cli):
    got = cli("rehearse", model_folder(tmp_path, "x", {"model_type": "gemma3_text"}))
    assert got.code == 2 and "architecture" in got.err


@pytest.mark.slow
def test_a_child_past_its_deadline_is_killed_with_its_group_and_reported(tmp_path):
    """--timeout 1: the child (importing transformers) is killed; a finding, and no process left behind."""
    folder = model_folder(tmp_path, "gemma3_text")
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "gemma_doctor", "rehearse", str(folder), "--timeout", "1",
                           "--format", "json"], capture_output=True, text=True, timeout=120)
    doc = json.loads(done.stdout)["rehearsals"][0]
    assert done.returncode == 1
    assert [f["code"] for f in doc["findings"]] == ["GD952"]
    assert time.monotonic() - started < 100  # not a speed assertion: the run must not have waited for the child
    left = subprocess.run(["pgrep", "-f", "gemma_doctor.rehearse.child"], capture_output=True, text=True).stdout
    assert str(folder) not in left


def test_launch_rehearses_a_trl_sft_config_and_refuses_other_lines_in_one_line(tmp_path, cli):
    from gemma_doctor.rehearse import config_of_launch

    assert config_of_launch("accelerate launch -m trl sft --config x.yaml") == Path("x.yaml")
    got = cli("rehearse", model_folder(tmp_path, "gemma3_text"), "--launch", "python train.py --bf16")
    assert got.code == 2 and got.err.count("\n") == 1


# -- recommend --rehearse: the prescription rehearsed before it is printed ---------------------------------------------
@pytest.mark.slow
def test_recommend_rehearse_says_a_prescription_rehearsed_clean(tmp_path, cli):
    """The prescription's own YAML (axolotl keys: full fine-tuning, bf16, batch 8) through the twin: clean, printed."""
    folder = model_folder(tmp_path, "gemma3_text")
    got = cli("recommend", folder, "--gpu", "H100", "--rehearse", "--format", "yaml")
    assert got.code == 0, got.err
    assert got.out.rstrip().splitlines()[-1].startswith(f"# {folder}: rehearsed: clean (10 stages through torch ")
    assert "base_model:" in got.out and "bf16: true" in got.out


@pytest.mark.slow
def test_recommend_rehearse_withdraws_a_prescription_whose_rehearsal_breaks(tmp_path, cli):
    """A config.json that the installed transformers cannot build (an activation a newer release wrote): check's rules
    pass it and recommend prescribes a run; the rehearsal meets the crash, names it, and the prescription is withdrawn
    (exit 1, "no-prescription", the failure as the way out) instead of being printed as passing."""
    folder = model_folder(tmp_path, "gemma3_text", dict(CONFIGS["gemma3_text"], hidden_activation="gelu_tanh_v9"))
    plain = cli("recommend", folder, "--gpu", "H100", "--format", "json")
    assert plain.code == 0 and plain.json()["status"] == "ok"
    got = cli("recommend", folder, "--gpu", "H100", "--rehearse", "--format", "json")
    doc = got.json()
    [model] = doc["models"]
    assert got.code == 1 and doc["status"] == "no-prescription" and model["status"] == "no-prescription"
    assert model["rehearsal"].startswith("failed, the prescription is withdrawn: GD954 "), model["rehearsal"]
    assert "gelu_tanh_v9" in model["rehearsal"]
    assert model["snippets"] is None and model["recommendation"] is None
    assert any("failed its rehearsal" in w and "gelu_tanh_v9" in w for w in model["way_out"]), model["way_out"]


@pytest.mark.slow
def test_an_axolotl_config_rehearses_at_its_micro_batch_size(tmp_path, cli):
    """recommend's prescription is axolotl's keys: micro_batch_size is no TrainingArguments field, so the twin trained
    at the Trainer's default batch of 8 (all six synthetic rows in one batch); now at the run's own batch."""
    config = tmp_path / "axolotl.yaml"
    config.write_text("base_model: google/tiny-gemma3_text\nbf16: true\nadapter: lora\nlora_r: 8\n"
                      "micro_batch_size: 2\nsequence_len: 64\n")
    got = cli("rehearse", model_folder(tmp_path, "gemma3_text"), "--training-config", config, "--steps", "1")
    assert got.code == 0, got.out
    [labels] = [line.split() for line in got.out.splitlines() if line.split()[:1] == ["labels"]]
    assert labels[1:4] == ["ok", "2", "samples,"], got.out


def test_recommend_rehearse_of_a_family_plan_says_it_was_not_rehearsed(cli):
    """A --family plan has no config.json to build a twin from: said, no child started, the plan printed as before."""
    got = cli("recommend", "--family", "gemma3", "--size", "1b", "--gpu", "H100", "--rehearse")
    assert got.code == 0, got.err
    assert got.out.rstrip().splitlines()[-1].endswith("not rehearsed: no model folder with a config.json to build a "
                                                      "twin from (a --family plan); download the model's config and "
                                                      "recommend it by path")


@pytest.mark.parametrize("lines, targets", [
    # LLaMA-Factory's lora_target defaults to "all" (every linear layer): PEFT's "all-linear". Left open, PEFT 0.11.1
    # refused Gemma 3 ("Please specify `target_modules`", the field corpus's LlamaFactory#7563 config), a crash the
    # real run never meets.
    ("stage: sft\nfinetuning_type: lora\n", "all-linear"),
    ("stage: sft\nfinetuning_type: lora\nlora_target: all\n", "all-linear"),
    # its comma list, which PEFT would read as one regular expression matching nothing
    ("stage: sft\nfinetuning_type: lora\nlora_target: q_proj,v_proj\n", ["q_proj", "v_proj"]),
    # not LLaMA-Factory's: left as written (PEFT's own default, or the regex the user wrote)
    ("use_peft: true\nlora_r: 8\n", None),
    ("use_peft: true\nlora_target_modules: q_proj,v_proj\n", "q_proj,v_proj"),
    # axolotl's lora_target_linear: every linear layer (it was ignored: PEFT's per-model default targets instead)
    ("base_model: google/gemma-3-1b-it\nadapter: lora\nlora_target_linear: true\n", "all-linear"),
    ("base_model: google/gemma-3-1b-it\nadapter: lora\nlora_target_linear: true\nlora_target_modules: [q_proj]\n",
     "all-linear"),  # axolotl adds every linear layer to the modules named
])
def test_llama_factory_lora_targets_are_read_as_llama_factory_reads_them(tmp_path, lines, targets):
    from gemma_doctor.readers import training_config
    from gemma_doctor.rehearse.runner import _raw, settings_of

    config = tmp_path / "train.yaml"
    config.write_text(lines)
    assert settings_of(training_config.load(str(config)), _raw(str(config)), None)["lora"]["targets"] == targets


@pytest.mark.parametrize("lines, lora", [
    # TRL's scripts read use_peft alone (TRL 1.16 get_peft_config): lora_* keys without it train every weight (GD612)
    ("max_length: 256\nlora_r: 8\nlora_target_modules: [q_proj, v_proj]\n", False),
    ("max_length: 256\nuse_peft: false\nlora_r: 8\n", False),
    ("max_length: 256\nuse_peft: true\nlora_r: 8\n", True),
    # a plain TrainingArguments script reads its LoRA keys its own way: rehearsed with LoRA, as before
    ("per_device_train_batch_size: 2\nlora_r: 8\n", True),
])
def test_a_trl_config_without_use_peft_is_rehearsed_as_the_full_fine_tuning_trl_runs(tmp_path, lines, lora):
    from gemma_doctor.readers import training_config
    from gemma_doctor.rehearse.runner import _raw, settings_of

    config = tmp_path / "train.yaml"
    config.write_text(lines)
    assert (settings_of(training_config.load(str(config)), _raw(str(config)), None)["lora"] is not None) is lora


# -- the judgement, on plain records ----------------------------------------------------------------------------------
def test_the_hybridcache_line_matches_its_catalogue_entry_with_a_rehearsable_cure():
    from gemma_doctor import catalogue

    entry = invariants.catalogue_match("AttributeError: 'HybridCache' object has no attribute 'float'", "eval",
                                       catalogue.entries())
    assert entry is not None and entry["id"] == "hybridcache-float"
    assert entry["id"] in invariants.CURE_PATCHES


def test_an_unknown_crash_says_it_is_not_in_the_catalogue():
    from gemma_doctor import catalogue

    [f] = invariants.judge([{"stage": "save", "status": "error", "exception": "OSError", "line": "OSError: disk gone",
                             "frames": ["modeling_utils.py:12 in save_pretrained"]}], catalogue.entries())
    assert f.code == "GD960" and "not in the catalogue" in f.fix and "modeling_utils.py" in f.fix


def test_a_libraries_own_refusal_is_told_apart_from_a_failure_deeper_down():
    """A ValueError raised by the innermost frame's `raise` (a library checking a setting: TRL's KTO refusing a
    micro-batch of one) says "change the setting"; an error from below (a KeyError, a ValueError out of a call) says
    "report it upstream"."""
    from gemma_doctor import catalogue
    from gemma_doctor.rehearse.driver import _error

    def check(batch: int) -> None:
        if batch <= 1:
            raise ValueError("batch size must be > 1")

    def lookup() -> None:
        int("x")  # a ValueError raised inside int(), not by a check of the innermost frame's own

    got = {}
    for name, call in (("refusal", lambda: check(1)), ("below", lookup), ("key", lambda: {}["k"])):
        try:
            call()
        except Exception as e:  # noqa: BLE001 - the records under test
            got[name] = {"stage": "setup", "status": "error", **_error(e)}
    assert [got[n]["refused"] for n in ("refusal", "below", "key")] == [True, False, False]
    fixes = {n: invariants.judge([r], catalogue.entries())[0].fix for n, r in got.items()}
    assert fixes["refusal"].startswith("not in the catalogue: the library refuses this setting") \
        and "in check" in fixes["refusal"]
    assert all(fixes[n].startswith("not in the catalogue: report it upstream") for n in ("below", "key"))


@pytest.mark.parametrize("record, code", [
    ({"losses": [0.0, 0.0], "grad_norms": [1.0, 1.0], "trainable": 2, "moved": 2}, "GD966"),
    ({"losses": [1.0, float("nan")], "grad_norms": [1.0, 1.0], "trainable": 2, "moved": 2}, "GD965"),
    ({"losses": [1.0, 1.0], "grad_norms": [0.0, 0.0], "trainable": 2, "moved": 2}, "GD968"),
    ({"losses": [1.0, 1.0], "grad_norms": [1.0, float("inf")], "trainable": 2, "moved": 2}, "GD967"),
    ({"losses": [1.0, 1.0], "grad_norms": [1.0, 1.0], "trainable": 2, "moved": 0}, "GD969"),
    ({"losses": [1.0], "grad_norms": [1.0], "trainable": 2, "moved": 1, "lora_b": {"count": 4, "moved": 0}}, "GD970"),
])
def test_each_training_invariant_has_its_finding(record, code):
    assert [f.code for f in invariants.judge_train(record)] == [code]


def test_healthy_training_figures_raise_nothing():
    assert invariants.judge_train({"losses": [2.0, 1.9], "grad_norms": [0.5, 0.4], "trainable": 4, "moved": 4,
                                   "lora_b": {"count": 2, "moved": 2}}) == []


def test_logits_within_bf16_rounding_pass_and_a_lost_head_does_not():
    ok = {"stage": "merge", "status": "ok", "merged": {"max_abs_diff": 0.014, "scale": 0.88},
          "reloaded": {"max_abs_diff": 0.0, "scale": 0.88}}
    lost = {**ok, "reloaded": {"max_abs_diff": 2.25, "scale": 3.1}}
    assert invariants.judge([ok], []) == []
    assert [f.code for f in invariants.judge([lost], [])] == ["GD977"]


def test_labels_invariants():
    rows = [{"tokens": 40, "trained": 0, "eot_present": True, "eot_trained": False, "prompt_masked": 40},
            {"tokens": 40, "trained": 30, "eot_present": True, "eot_trained": False, "prompt_masked": 10},
            {"tokens": 40, "trained": 40, "eot_present": True, "eot_trained": True, "prompt_masked": 0}]
    codes = [f.code for f in invariants.judge_labels({"per_sample": rows, "completion_only": True})]
    assert codes == ["GD971", "GD972", "GD973"]


def test_peft_s_refusal_names_the_entry_of_the_rehearsed_member():
    """PEFT words its refusal of a module it cannot wrap the same way for every member, and Gemma 3n's timm modules
    came first in the catalogue: a Gemma 4 twin's refusal (benchmarks/rehearse_members.py, PEFT 0.21.2) was named
    "gemma3n-lora-timm-modules" with Gemma 3n's cure (GD421). An entry naming its members matches those only."""
    from gemma_doctor import catalogue
    from gemma_doctor.rehearse import invariants

    tail = (") is not supported. Currently, only the following modules are supported: `torch.nn.Linear`, "
            "`torch.nn.Embedding`, `torch.nn.Conv1d`, `torch.nn.Conv2d`, `torch.nn.Conv3d`, "
            "`transformers.pytorch_utils.Conv1D`, `torch.nn.MultiheadAttention.`.")
    record = {"stage": "setup", "exception": "ValueError",
              "line": "ValueError: Target module Gemma4ClippableLinear( (linear): Linear(in_features=32, "
                      "out_features=32, bias=False) " + tail}
    gemma4 = invariants.crash(record, catalogue.entries(), model_type="gemma4")
    assert gemma4.details["catalogue"] == "peft-gemma4-clippable-linear" and "(GD440)" in gemma4.fix, gemma4.fix
    timm = dict(record, line="ValueError: Target module TimmWrapperModel( (timm_model): MobileNetV5Encoder() " + tail)
    gemma3n = invariants.crash(timm, catalogue.entries(), model_type="gemma3n")
    assert gemma3n.details["catalogue"] == "gemma3n-lora-timm-modules"
    other = invariants.crash(timm, catalogue.entries(), model_type="gemma3")
    assert "catalogue" not in other.details and other.fix.startswith("not in the catalogue")


@pytest.mark.parametrize("model_type, architecture, stage, line, instead", [
    ("embedding_gemma2_text", "EmbeddingGemma2TextModel", "setup",
     "AttributeError: 'EmbeddingGemma2TextModel' object has no attribute 'prepare_inputs_for_generation'",
     "sentence-transformers"),
    ("shieldgemma2", "ShieldGemma2ForImageClassification", "setup",
     "AttributeError: 'ShieldGemma2ForImageClassification' object has no attribute 'prepare_inputs_for_generation'",
     "classification loss"),
    ("diffusion_gemma", "DiffusionGemmaForBlockDiffusion", "setup",
     "AttributeError: 'DiffusionGemmaForBlockDiffusion' object has no attribute 'prepare_inputs_for_generation'",
     "diffusion objective"),
    ("t5gemma", "T5GemmaForConditionalGeneration", "train",
     "ValueError: You must specify exactly one of input_ids or inputs_embeds", "Seq2SeqTrainer"),
])
def test_a_crash_of_a_member_that_is_not_a_causal_lm_says_so_instead_of_report_upstream(model_type, architecture,
                                                                                        stage, line, instead):
    """Met rehearsing every member's tiny checkpoint with a LoRA SFT config (benchmarks/rehearse_members.py): the
    embedding models, ShieldGemma 2 and T5Gemma crash under TRL's SFTTrainer, and the fix said "report it upstream to
    the library of the innermost frame". It is the run's mismatch; the fix names what trains that kind."""
    from gemma_doctor import catalogue
    from gemma_doctor.rehearse import invariants, runner

    plan = {"model_type": model_type, "architecture": architecture, "trainer": "trl-sft"}
    [f] = invariants.judge([{"stage": stage, "status": "error", "exception": line.split(":")[0], "line": line}],
                           catalogue.entries(), model_type)
    assert f.fix.startswith("not in the catalogue: report it upstream")
    told = runner._of_another_kind(f, plan)
    assert "report it upstream" not in told.fix and instead in told.fix and architecture in told.fix, told.fix
    assert told.code == f.code and told.message == f.message
    # A causal LM's crash keeps its own fix.
    assert runner._of_another_kind(f, {**plan, "model_type": "gemma3_text"}) == f


def test_a_part_this_machine_cannot_rehearse_is_named_as_data_not_by_its_wording(tmp_path):
    """recommend --rehearse lists what was not rehearsable here from each finding's `not_here`; it cut the message's
    wording before (a prefix that a reworded message would have silently kept)."""
    from gemma_doctor.rehearse.runner import plan_for

    (tmp_path / "q.yaml").write_text(LORA_SFT + "load_in_4bit: true\n")
    _plan, findings, _notes, _ = plan_for(str(model_folder(tmp_path, "gemma3_text")), None, "main", tmp_path / "q.yaml",
                                          1)
    parts = [f.details["not_here"] for f in findings if (f.details or {}).get("not_here")]
    assert parts == ["bitsandbytes quantization (QLoRA / 8-bit loading): rehearsed unquantized"], findings
    assert all(f.message.endswith(p) for f, p in zip([f for f in findings if f.details.get("not_here")], parts))


RANK_FAILS = {
    # rank 1 raises: its exception line, not the launcher's banner (the CI of 29 Nov reported a ZeRO-3 run's failure
    # as "the script exited with status 1: =====", the last line of torch's launcher summary)
    "raises": ('raise RuntimeError("rank one fell over")', "RuntimeError: rank one fell over (rank 1 failed)"),
    # rank 1 is killed: no exception line to show, so the launcher's root cause (its rank and exit code)
    "killed": ("os.kill(os.getpid(), signal.SIGKILL)", "rank 1 failed with exit code -9"),
}


@pytest.mark.slow
@pytest.mark.parametrize("case", sorted(RANK_FAILS))
def test_a_rank_that_fails_under_torchs_launcher_is_told_by_its_own_line(tmp_path, case):
    """What a failed launched run reports (rehearse/process.py _tail) from the output of the real torchrun of the
    pinned torch: the failed rank's last exception line, else its exit code."""
    from gemma_doctor.rehearse.process import _tail

    body, said = RANK_FAILS[case]
    script = tmp_path / "boom.py"
    script.write_text(f"import os, signal\nif os.environ.get('RANK') == '1':\n    {body}\n")
    log = tmp_path / "out.log"
    with open(log, "wb") as out:
        done = subprocess.run([str(Path(sys.executable).parent / "torchrun"), "--nproc-per-node", "2", str(script)],
                              stdout=out, stderr=subprocess.STDOUT, timeout=120)
    assert done.returncode != 0 and "=====" in log.read_text()  # the launcher's banner ends the output
    assert _tail(log) == said
