"""The pitfall catalogue reproduced with the real libraries, before and after the cure, and `check` judging each
venv's own installed versions (package metadata, no planning option).

One subprocess per venv runs every case of tests/scripts/pitfalls_repro.py (tiny models built there):
the main venv (transformers 5.23 / current PEFT), V4_LATE (4.57.6 + PEFT 0.17.1) and LEGACY (4.50.0).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.builders import HubCache, gemma2_config, gemma3_1b_config, variant
from tests.venvs import LEGACY, V4_LATE, ensure_venv, subprocess_env

pytestmark = pytest.mark.slow

SCRIPT = Path(__file__).parent / "scripts" / "pitfalls_repro.py"
MAIN_CASES = ("gemma2_sdpa", "packing", "lora_targets", "embed_scale", "bidirectional", "eos", "pad_eos", "double_bos",
              "vocab_rows", "recommended_snippets", "lora_targets_paligemma", "tied_modules_to_save")


def _run(python: Path | str, *cases: str) -> dict:
    done = subprocess.run([str(python), str(SCRIPT), *cases], capture_output=True, text=True, timeout=600,
                          env=subprocess_env())
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def main() -> dict:
    return _run(sys.executable, *MAIN_CASES)


@pytest.fixture(scope="module")
def v4_python() -> Path:
    return ensure_venv(V4_LATE)


@pytest.fixture(scope="module")
def legacy_python() -> Path:
    return ensure_venv(LEGACY)


@pytest.fixture(scope="module")
def v4(v4_python) -> dict:
    return _run(v4_python, "gemma2_sdpa", "embed_scale", "bidirectional", "packing", "lora_targets",
                "recommended_snippets", "tied_modules_to_save", "grad_accum")


@pytest.fixture(scope="module")
def legacy(legacy_python) -> dict:
    return _run(legacy_python, "gemma2_sdpa", "bidirectional", "packing", "grad_accum")


def test_the_venvs_hold_the_versions_the_windows_are_about(main, v4, legacy):
    assert main["versions"]["transformers"].startswith("5.")
    assert (v4["versions"]["transformers"], v4["versions"]["peft"]) == ("4.57.6", "0.17.1")
    assert legacy["versions"]["transformers"] == "4.50.0"


def test_gd640_sdpa_drops_gemma2_softcapping_silently_until_5_21_then_refuses_and_eager_is_the_cure(main, v4, legacy):
    for old in (v4, legacy):
        r = old["gemma2_sdpa"]
        assert r["default_backend"] == "sdpa" and r["eager_loads"]
        assert r["eager_vs_sdpa_max_diff"] > 0.2 * r["eager_max_logit"]  # the softcap is not applied
    r = main["gemma2_sdpa"]
    assert r["default_backend"] == "eager" and r["eager_loads"]
    assert r["sdpa_error"].startswith("ValueError") and "scaled_dot_product_attention" in r["sdpa_error"]


def test_gd645_packed_sequences_mix_without_the_position_ids_mask(main, v4, legacy):
    ref = legacy["packing"]["reference_max_logit"]
    assert legacy["packing"]["reset_position_ids_no_mask_diff"] > 0.5 * ref  # transformers < 4.53.1: contaminated
    for fixed in (v4, main):  # the cure: >= 4.53.1, reset position_ids and no attention_mask
        assert fixed["packing"]["reset_position_ids_no_mask_diff"] < 1e-4
        assert fixed["packing"]["reset_position_ids_all_ones_mask_diff"] > 0.5 * ref  # TRL < 0.23's batch


def test_gd420_gd421_peft_has_no_default_targets_and_broad_ones_reach_the_vision_tower(main, v4):
    """Gemma 3 (PEFT 0.21 and 0.17) and PaliGemma (SigLIP names its layers like Gemma's)."""
    for r in (main["lora_targets"], v4["lora_targets"], main["lora_targets_paligemma"]):
        assert "Please specify `target_modules`" in r["default"]["error"]
        assert r["all_linear"]["vision"] > 0 and r["bare_names"]["vision"] > 0
        for cure in ("lm_only_regex", "all_linear_excluding_towers"):  # what the fix says
            assert r[cure] == {"vision": 0, "projector": 0, "language": r["all_linear"]["language"]}


def test_gd422_peft_0_17_ignores_embed_scale_and_0_18_plus_applies_it(main, v4):
    assert not v4["embed_scale"]["scaled"] and v4["embed_scale"]["max_abs_error"] > 1.0
    assert main["embed_scale"]["scaled"] and main["embed_scale"]["max_abs_error"] < 1e-4


def test_gd505_gd422_modules_to_save_unties_gemmas_head_before_peft_0_18_and_ensure_weight_tying_keeps_it(main, v4):
    """The trap GD505/GD422's advice avoids: on PEFT 0.17.1 the merged model reloads with another head, and
    ensure_weight_tying does not exist; on the current PEFT with ensure_weight_tying the head stays tied."""
    old, new = v4["tied_modules_to_save"], main["tied_modules_to_save"]
    assert old["plain"]["peft"] == "0.17.1" and not old["plain"]["tied_after_merge"]
    assert old["plain"]["reload_max_diff"] > 0.1  # 0.43 measured: the reloaded model is not the trained one
    assert "ensure_weight_tying" in old["ensured"]["error"]
    assert new["ensured"]["tied_after_merge"] and new["ensured"]["reload_max_diff"] == 0.0
    assert new["ensured_with_lm_head"]["reload_max_diff"] == 0.0  # on 0.21.2; 0.18.0 unties it (versioning.py)


def test_gd423_gd424_bidirectional_attention_and_the_halving_window(main, v4, legacy):
    assert legacy["bidirectional"]["first_token_changes_with_last"] == 0.0  # 4.50.0 runs it causal
    for new in (v4, main):
        assert new["bidirectional"]["first_token_changes_with_last"] > 0.1
    assert v4["bidirectional"]["saved_sliding_window_after_each_round_trip"] == [257, 129]
    assert main["bidirectional"]["saved_sliding_window_after_each_round_trip"] == [512, 512]


def test_gd739_gemma3_multimodal_gradient_accumulation_scales_loss_and_update_before_4_57(v4, legacy):
    """transformers #37197: batch 1 x accumulation 4 against batch 4 x accumulation 1 on the same rows, one SGD step of
    the real Trainer. 4.50.0 (bad through 4.56.2, bisected by hand) multiplies the multimodal class's logged loss,
    grad norm and weight change by 4, LoRA or not; 4.57.6 (fixed in 4.57.0) and Gemma3ForCausalLM agree."""
    bad, good = legacy["grad_accum"], v4["grad_accum"]
    for r in (bad["multimodal"], bad["multimodal_lora"]):
        assert r["batch1_acc4"]["accepts_loss_kwargs"]  # forward(**lm_kwargs): the Trainer skips loss / 4
        for key in ("loss_ratio", "grad_norm_ratio", "weight_change_ratio"):
            assert r[key] == pytest.approx(4.0, rel=1e-3), (key, r)
    for r in (good["multimodal"], good["multimodal_lora"], good["multimodal_cured"], bad["multimodal_cured"],
              bad["text"], good["text"]):
        for key in ("loss_ratio", "grad_norm_ratio", "weight_change_ratio"):
            assert r[key] == pytest.approx(1.0, rel=1e-3), (key, r)
    assert not good["multimodal"]["batch1_acc4"]["accepts_loss_kwargs"]


def test_gd901_gd902_gd903_gd505_eos_pad_bos_and_vocab(main):
    assert main["eos"] == {"eos_1": [106] * 8, "eos_1_106": [106]}
    assert main["pad_eos"] == {"pad_is_pad": 2, "pad_is_eos": 0}
    assert main["double_bos"] == {"rendered_then_tokenized": 2, "rendered_then_tokenized_no_special": 1}
    assert main["vocab_rows"]["before"].startswith("IndexError") and main["vocab_rows"]["after_resize"][-1] == 131


def test_recommend_snippets_load_the_language_model_alone_and_lora_it_only_on_4x_and_5x(main, v4):
    """Point 2 of issue 10: what to load and which targets, run as emitted (key_mapping on 5.x only)."""
    for r in (main["recommended_snippets"], v4["recommended_snippets"]):
        assert r["text_only_class"] == "Gemma3ForCausalLM" and r["text_only_params_vision"] == 0
        assert r["text_only_matrices_equal"] == r["text_only_matrices"] > 0  # every text weight found, none random
        assert r["peft_on_full_model"]["vision"] == r["peft_on_full_model"]["projector"] == 0
        assert r["peft_on_full_model"]["language"] > 0


# --- check in each venv judges that venv's installed versions ------------------------------------------

TRAINING = {"use_peft": True, "lora_target_modules": ["q_proj", "embed_tokens"], "packing": True, "bf16": True}
EMBEDDING_GEMMA = variant(gemma3_1b_config(), use_bidirectional_attention=True, sliding_window=512)


def _codes_by_repo(python: Path | str, tmp_path: Path) -> dict[str, dict[str, str]]:
    hub = HubCache(tmp_path / "hub")
    hub.add("google/gemma-3-1b-it", {"config.json": gemma3_1b_config()})
    hub.add("google/gemma-2-2b-it", {"config.json": gemma2_config()})
    hub.add("google/embeddinggemma-300m", {"config.json": EMBEDDING_GEMMA})
    tc = tmp_path / "train.json"
    tc.write_text(json.dumps(TRAINING))
    done = subprocess.run([str(python), "-m", "gemma_doctor", "check", "--cache-dir", str(hub.root), "--format", "json",
                           "--fail-on", "never", "--training-config", str(tc)], capture_output=True, text=True,
                          timeout=300, env=subprocess_env(HF_HUB_CACHE=str(hub.root)))
    assert done.returncode == 0, done.stdout + done.stderr[-3000:]
    pitfalls = ("GD422", "GD423", "GD424", "GD640", "GD645")
    return {m["target"]: {f["code"]: f["severity"] for f in m["findings"] if f["code"] in pitfalls}
            for m in json.loads(done.stdout)["models"]}


def test_check_in_each_venv_flags_what_its_libraries_do(v4_python, legacy_python, tmp_path):
    v4 = _codes_by_repo(v4_python, tmp_path / "v4")
    # PEFT 0.17.1 ignores embed_scale; 4.57.6 makes Gemma 2 default to sdpa; V4_LATE has no TRL, so whether its
    # packing keeps sequences apart (TRL >= 0.23) is unknown: a warning, not an error.
    assert v4 == {"google/gemma-3-1b-it": {"GD422": "error", "GD645": "warning"},
                  "google/gemma-2-2b-it": {"GD640": "warning", "GD645": "warning"},
                  "google/embeddinggemma-300m": {"GD422": "error", "GD424": "warning", "GD645": "warning"}}
    legacy = _codes_by_repo(legacy_python, tmp_path / "legacy")
    # 4.50.0: packing mixes sequences whatever TRL does, and use_bidirectional_attention is not read.
    assert legacy == {"google/gemma-3-1b-it": {"GD422": "error", "GD645": "error"},
                      "google/gemma-2-2b-it": {"GD640": "warning", "GD645": "error"},
                      "google/embeddinggemma-300m": {"GD422": "error", "GD423": "error", "GD645": "error"}}
    main = _codes_by_repo(sys.executable, tmp_path / "main")  # transformers 5.23, PEFT >= 0.18, TRL >= 0.23
    assert main == {"google/gemma-3-1b-it": {}, "google/gemma-2-2b-it": {}, "google/embeddinggemma-300m": {}}
