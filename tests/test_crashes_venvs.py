"""The crashes behind GD105-GD109 shown by the real libraries, before and after the cure, and `check` judging them
from each venv's own installed versions (no planning option). One helper process per venv
(tests/scripts/crash_cases.py runs several cases and prints JSON), shared by the module's tests:

- V5_EARLY (transformers 5.5.1, inside three windows at once): Gemma 3 / PaliGemma token_type_ids, Gemma 4
  mm_token_type_ids, Gemma 4 KV sharing without a cache; the model it trains is reloaded by the main venv
  (5.23.0) to show which loss is the right one.
- V4_LATE (4.57.6): a config saved by the main venv's 5.23.0 loses its RoPE scaling.
- LEGACY (4.50.0): Gemma 3n's model_type is unknown to it.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

from tests.builders import HubCache, gemma3_12b_config, gemma3n_config, paligemma2_config
from tests.test_crashes import gemma4_config
from tests.venvs import LEGACY, V4_LATE, V5_EARLY, ensure_venv, subprocess_env

pytestmark = pytest.mark.slow

SCRIPT = Path(__file__).parent / "scripts" / "crash_cases.py"


def _cases(python: Path | str, out: Path, *cases: str) -> dict:
    done = subprocess.run([str(python), str(SCRIPT), str(out), *cases], capture_output=True, text=True, timeout=600,
                          env=subprocess_env())
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    for case in cases:
        assert "case_error" not in result[case], result[case]
    return result


def _check(python: Path | str, hub: HubCache, repo: str) -> dict[str, dict]:
    done = subprocess.run([str(python), "-m", "gemma_doctor", "check", repo, "--cache-dir", str(hub.root), "--format",
                           "json", "--fail-on", "never"], capture_output=True, text=True, timeout=300,
                          env=subprocess_env(HF_HUB_CACHE=str(hub.root)))
    assert done.returncode == 0, done.stdout + done.stderr[-3000:]
    doc = json.loads(done.stdout)
    assert doc["environment"]["stack"]["planned"] is False
    return {f["code"]: f for f in doc["models"][0]["findings"]}


@pytest.fixture(scope="module")
def work(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("crashes")


@pytest.fixture(scope="module")
def v5(work) -> dict:
    """Every 5.5.1 case, run once; the KV-shared model it saves is left in ``work``/kv."""
    result = _cases(ensure_venv(V5_EARLY), work, "token-type-ids", "mm-token-type-ids", "kv-sharing-save")
    assert result["transformers"] == "5.5.1"
    return result


@pytest.fixture(scope="module")
def v5_check(work) -> dict[str, dict[str, dict]]:
    """`check` run by the 5.5.1 venv itself on each checkpoint shape, by name."""
    python = ensure_venv(V5_EARLY)
    hub = HubCache(work / "hub-v5")
    configs = {"gemma3": gemma3_12b_config(), "paligemma2": paligemma2_config(),
               "gemma4-e2b": gemma4_config(kv_shared=20), "gemma4-31b": gemma4_config(bidirectional="vision")}
    for name, cfg in configs.items():
        hub.add(f"org/{name}", {"config.json": cfg})
    return {name: _check(python, hub, f"org/{name}") for name in configs}


# ---------------------------------------------------------------------------------------------- GD105

@pytest.mark.parametrize("name", ["gemma3", "paligemma"])
def test_text_only_training_crashes_on_5_5_1_and_trains_with_the_doctor_callback(v5, name):
    r = v5["token-type-ids"][name]
    assert r["unguarded"] == {"error": "ValueError: `token_type_ids` is required as a model input when training"}
    assert math.isfinite(r["guarded"]["train_loss"])
    # The hook supplies exactly what an explicit batch column would: the same loss, and no look into the future.
    assert r["hooked_loss"] == pytest.approx(r["explicit_ids_loss"], abs=1e-6)
    assert r["future_leak_guarded"] is False


def test_a_peft_wrapped_gemma3_is_guarded_too(v5):
    """PEFT calls the wrapped model's forward() directly, so the hook on the inner Gemma3Model does the work."""
    r = v5["token-type-ids"]["gemma3_peft"]
    assert r["unguarded"] == {"error": "ValueError: `token_type_ids` is required as a model input when training"}
    # LoRA's B starts at zero: the first step's loss is the base model's on the same batch.
    assert r["guarded"]["train_loss"] == pytest.approx(v5["token-type-ids"]["gemma3"]["explicit_ids_loss"], abs=1e-5)


def test_the_supplied_constant_is_zeros_for_gemma3_and_ones_for_paligemma(v5):
    r = v5["token-type-ids"]
    assert r["gemma3"]["supplied"] == ["Gemma3ForConditionalGeneration.token_type_ids=0", "Gemma3Model.token_type_ids=0"]
    assert r["paligemma"]["supplied"] == ["PaliGemmaForConditionalGeneration.token_type_ids=1",
                                          "PaliGemmaModel.token_type_ids=1"]
    # Gemma 3's Trainer step sees the same batch as the explicit forward pass (PaliGemma's Trainer loss is
    # normalised by Trainer's token count, not the model's shifted one, so it differs by design).
    assert r["gemma3"]["guarded"]["train_loss"] == pytest.approx(r["gemma3"]["explicit_ids_loss"], abs=1e-5)


def test_check_with_the_installed_5_5_1_flags_the_multimodal_checkpoints(v5_check):
    for name, value in (("gemma3", 0), ("paligemma2", 1)):
        gd105 = v5_check[name]["GD105"]
        assert gd105["severity"] == "error" and gd105["details"]["value"] == value
        assert "transformers 5.5.1 (installed) is affected" in gd105["message"]


# ---------------------------------------------------------------------------------------------- GD106

def test_gemma4_vision_bidirectional_needs_mm_token_type_ids_and_prepare_supplies_them(v5, v5_check):
    r = v5["mm-token-type-ids"]
    assert r["unguarded"] == {"error": "ValueError: `mm_token_type_ids` is required as a model input when training"}
    assert r["token_type_ids_zeros"] == r["unguarded"]  # the Gemma 3 key is not what 5.5 reads for Gemma 4
    assert r["supplied"] == ["Gemma4ForConditionalGeneration.mm_token_type_ids=0", "Gemma4Model.mm_token_type_ids=0"]
    assert math.isfinite(r["guarded"]["loss"])
    assert v5_check["gemma4-31b"]["GD106"]["severity"] == "error"
    assert "GD106" not in v5_check["gemma4-e2b"]


# ---------------------------------------------------------------------------------------------- GD107

@pytest.fixture(scope="module")
def kv_reloaded_by_5_23(v5, work) -> dict:
    """The 5.5.1-built KV-shared model, loaded by the main venv's transformers 5.23.0 (fixed): the true loss."""
    return _cases(sys.executable, work, "kv-sharing-load")["kv-sharing-load"]


def test_kv_sharing_without_a_cache_gives_a_wrong_loss_on_5_5_1(v5, kv_reloaded_by_5_23):
    r = v5["kv-sharing-save"]
    truth = kv_reloaded_by_5_23["with_cache"]
    assert kv_reloaded_by_5_23["without_cache"] == pytest.approx(truth, abs=1e-6)  # 5.23: both paths agree
    assert r["with_cache"] == pytest.approx(truth, abs=1e-5)
    # Without a cache 5.5.1 ignores the sharing: the loss is the unshared model's, not the model's.
    assert abs(r["without_cache"] - truth) > 1e-3
    assert r["without_cache"] == pytest.approx(r["unshared_weights_same_seed"], abs=1e-6)
    # Gradient checkpointing drops the cache too, whatever use_cache says (GD620).
    assert r["checkpointing_with_cache"] == pytest.approx(r["without_cache"], abs=1e-5)


def test_prepare_keeps_the_cache_on_where_switching_it_off_breaks_kv_sharing(v5, kv_reloaded_by_5_23):
    r = v5["kv-sharing-save"]
    truth = kv_reloaded_by_5_23["with_cache"]
    assert r["old_guard"] == pytest.approx(r["without_cache"], abs=1e-6)  # use_cache off everywhere: broken
    assert r["disabled"] == [] and "config.text_config.use_cache" in r["enabled"]
    assert r["prepared"] == pytest.approx(truth, abs=1e-5)
    # Checkpointing drops the cache whatever use_cache says: prepare() cannot cure that and says so.
    assert r["checkpointing_warnings"] == ["KvSharingWarning"]


def test_a_real_trainer_trains_the_broken_path_unguarded_and_the_right_one_with_the_callback(v5, kv_reloaded_by_5_23):
    """Trainer writes TrainingArguments.use_cache (False) onto the model config after building; the callback's
    train-begin guard switches it back on for this model on this release."""
    r = v5["kv-sharing-save"]
    assert r["unguarded_trainer"]["train_loss"] == pytest.approx(r["without_cache"], abs=1e-5)
    assert r["guarded_trainer"]["train_loss"] == pytest.approx(kv_reloaded_by_5_23["with_cache"], abs=1e-5)


def test_check_with_the_installed_5_5_1_flags_kv_sharing(v5_check):
    gd107 = v5_check["gemma4-e2b"]["GD107"]
    assert gd107["severity"] == "error" and "transformers 5.5.1 (installed) is affected" in gd107["message"]
    assert "GD107" not in v5_check["gemma4-31b"]  # no KV sharing in that shape


# ---------------------------------------------------------------------------------------------- GD109

@pytest.fixture(scope="module")
def rope_skew(work) -> dict:
    """A linear-x8 gemma3_text saved by the main venv (5.23.0), then loaded by 4.57.6."""
    saved = _cases(sys.executable, work, "rope-save")["rope-save"]
    loaded = _cases(ensure_venv(V4_LATE), work, "rope-load")
    return {"saved": saved, "loaded": loaded}


def test_a_5x_saved_rope_scaling_is_silently_dropped_by_4_57_6(rope_skew):
    assert rope_skew["saved"] == {"ratio": 8.0, "saved_keys": ["rope_parameters"]}
    loaded = rope_skew["loaded"]
    assert loaded["transformers"] == "4.57.6"
    r = loaded["rope-load"]
    assert r["rope_scaling"] is None and r["ratio"] == 1.0 and r["max_logit_diff"] > 1e-3
    assert not any("rope" in w.lower() for w in r["warnings"])  # silent


def test_check_by_4_57_6_flags_the_real_5x_saved_config(rope_skew, work):
    hub = HubCache(work / "hub-v4")
    hub.add("org/rope", {"config.json": (work / "rope" / "config.json").read_bytes()})
    gd109 = _check(ensure_venv(V4_LATE), hub, "org/rope")["GD109"]
    assert gd109["severity"] == "error" and gd109["key"] == "rope_parameters"
    assert "transformers 4.57.6 (installed) reads only rope_scaling" in gd109["message"]


# ---------------------------------------------------------------------------------------------- GD108

def test_check_by_transformers_4_50_0_says_it_cannot_load_gemma3n(tmp_path):
    hub = HubCache(tmp_path / "hub")
    hub.add("google/gemma-3n-E2B-it", {"config.json": gemma3n_config()})
    gd108 = _check(ensure_venv(LEGACY), hub, "google/gemma-3n-E2B-it")["GD108"]
    assert gd108["severity"] == "error"
    assert gd108["message"].startswith("transformers 4.50.0 cannot load model_type gemma3n (needs >= 4.53.0)")
