"""TRL's preference trainers in the rehearsal (gemma_doctor/rehearse/preference.py): KTO (`trl kto --config`,
`rl: kto`) and ORPO (`rl: orpo`, TRL's experimental ORPOTrainer) run as themselves on the twin, as DPO does
(tests/test_rehearse_launch.py); other RL settings keep GD951. Real TRL 1.16 trainers on the tiny Gemma 3 text twin of
tests/test_rehearse.py; each rehearsal is one child that imports the stack, so they are few and marked slow."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from tests.test_rehearse import model_folder

LORA = "use_peft: true\nlora_r: 8\nlora_target_modules: [q_proj, k_proj, v_proj, o_proj]\n"
KTO = "bf16: true\nlearning_rate: 0.001\nmax_length: 128\nbeta: 0.1\n" + LORA


def _plan_of(tmp_path: Path, text: str):
    from gemma_doctor.rehearse.runner import plan_for

    folder = tmp_path / "google--tiny"
    folder.mkdir(exist_ok=True)
    (folder / "config.json").write_text(json.dumps({"architectures": ["Gemma3ForCausalLM"], "model_type": "gemma3_text"}))
    config = tmp_path / "run.yaml"
    config.write_text(text)
    return plan_for(str(folder), None, "main", config, 3)


@pytest.mark.parametrize("text, trainer", [
    ("rl: kto\nadapter: lora\nmicro_batch_size: 2\n", "trl-kto"),  # axolotl
    ("rl: orpo\nadapter: lora\nmicro_batch_size: 2\n", "trl-orpo"),  # axolotl
    ("stage: kto\nfinetuning_type: lora\n", "trl-kto"),  # LLaMA-Factory
    # LLaMA-Factory's ORPO switch under stage: dpo (before: rehearsed as DPO, the switch not read)
    ("stage: dpo\nfinetuning_type: lora\npref_loss: orpo\n", "trl-orpo"),
    ("stage: dpo\nfinetuning_type: lora\npref_loss: sigmoid\n", "trl-dpo"),
    # reward modelling (before: GD951 "not rehearsable here: a RM run" and the SFT loop)
    ("stage: rm\nfinetuning_type: lora\n", "trl-reward"),  # LLaMA-Factory
    ("base_model: google/tiny\nreward_model: true\nadapter: lora\nmicro_batch_size: 2\n", "trl-reward"),  # axolotl
    # online DPO (before: GD951 "not rehearsable here: a ONLINE_DPO run"): TRL's experimental OnlineDPOTrainer
    ("rl: online_dpo\nper_device_train_batch_size: 2\nbeta: 0.1\n", "trl-online-dpo"),
])
def test_a_kto_or_orpo_setting_runs_that_trainer_not_a_gd951_note(tmp_path, text, trainer):
    # before: GD951 "not rehearsable here: a KTO run", and the twin ran the SFT loop
    plan, findings, _, _ = _plan_of(tmp_path, text)
    assert plan["trainer"] == trainer and not [f for f in findings if f.code == "GD951"]


def test_an_rl_loop_the_twin_does_not_run_keeps_its_gd951_note(tmp_path):
    plan, findings, _, _ = _plan_of(tmp_path, "stage: ppo\nfinetuning_type: lora\n")
    assert [f.code for f in findings] == ["GD951"] and "PPO" in findings[0].message
    assert "KTO, ORPO" in findings[0].fix and plan["trainer"] not in ("trl-kto", "trl-orpo", "trl-reward")


@pytest.mark.parametrize("text, source, task", [
    ("stage: rm\nfinetuning_type: lora\n", "llama-factory", "SEQ_CLS"),
    ("base_model: google/tiny\nreward_model: true\nadapter: lora\n", "axolotl", "SEQ_CLS"),
    ("stage: rm\nfinetuning_type: lora\nlora_task_type: seq_cls\n", "llama-factory", "SEQ_CLS"),
])
def test_a_reward_run_plans_its_stages_and_the_task_type_its_trainer_hands_peft(tmp_path, text, source, task):
    # axolotl picks SEQ_CLS for a sequence classifier (its loaders/adapter.py); LLaMA-Factory trains a value head,
    # rehearsed on a sequence classifier with a note
    plan, _, notes, _ = _plan_of(tmp_path, text)
    assert plan["reward"] == {"task_type": task, "source": source}
    assert plan["stages"] == ["load", "setup", "labels", "train", "accumulation", "eval", "save", "merge"]
    assert any("value head" in n for n in notes) == (source == "llama-factory")


@pytest.mark.parametrize("line, found", [
    ("trl kto --config k.yaml", (Path("k.yaml"), "trl-kto")),
    ("accelerate launch -m trl kto --config=k.yaml", (Path("k.yaml"), "trl-kto")),
    ("trl rloo --config r.yaml", (Path("r.yaml"), "trl-rloo")),  # GRPO's loop (grpo.py, tests/test_rehearse_grpo.py)
    ("trl reward --config r.yaml", (Path("r.yaml"), "trl-reward")),  # before: None, a script line
])
def test_a_trl_kto_or_rloo_line_names_its_config_and_trainer(line, found):
    from gemma_doctor.rehearse import trl_launch

    assert trl_launch(line) == found


def _rehearse(cli, tmp_path: Path, *args: str) -> tuple[int, dict]:
    got = cli("rehearse", model_folder(tmp_path, "gemma3_text"), *args, "--format", "json")
    return got.code, got.json()["rehearsals"][0]


@pytest.mark.slow
def test_a_kto_config_rehearses_through_kto_trainer_and_its_micro_batch_of_one_is_caught(tmp_path, cli):
    """Synthetic unpaired rows (each answer desirable, a refusal undesirable). With LoRA the reference is the base with
    the adapter off, so at the first step the implied reward and the KL estimate are 0 and the loss is 1 - sigmoid(0).
    KTO's loss is not a mean over rows (its KL term is estimated across each micro-batch), so the accumulation check is
    skipped with that reason, not judged. A micro-batch of one is refused by TRL itself at setup: the rehearsal names
    the stage and TRL's line, where check has nothing to say."""
    config = tmp_path / "kto.yaml"
    config.write_text("per_device_train_batch_size: 2\n" + KTO)
    code, doc = _rehearse(cli, tmp_path, "--launch", f"trl kto --config {config}")
    assert doc["findings"] == [] and code == 0 and doc["trainer"] == "trl-kto"
    got = {s["stage"]: s for s in doc["stages"]}
    assert [(s["stage"], s["status"]) for s in doc["stages"]] == [
        ("twin", "ok"), ("load", "ok"), ("setup", "ok"), ("labels", "skipped"), ("train", "ok"),
        ("accumulation", "skipped"), ("eval", "ok"), ("generate", "ok"), ("save", "ok"), ("merge", "ok")]
    assert got["setup"]["trainer"] == "KTOTrainer" and "KL term" in got["accumulation"]["reason"]
    assert got["train"]["losses"][0] == pytest.approx(0.5, abs=1e-3) and got["train"]["moved"] == got["train"]["trainable"]

    one = tmp_path / "kto1.yaml"
    one.write_text("per_device_train_batch_size: 1\ngradient_accumulation_steps: 8\n" + KTO)
    code, doc = _rehearse(cli, tmp_path, "--launch", f"trl kto --config {one}", "--steps", "1")
    assert code != 0 and doc["trainer"] == "trl-kto"
    [crash] = [f for f in doc["findings"] if f["severity"] == "error"]
    assert crash["code"] == "GD956" and "batch size must be > 1" in crash["message"], crash  # the setup stage
    # TRL's own check refused the setting (a `raise` of kto_trainer.py): the fix says change it, not "a bug upstream"
    assert crash["fix"].startswith("not in the catalogue: the library refuses this setting") \
        and "kto_trainer.py" in crash["fix"], crash


@pytest.mark.slow
def test_an_axolotl_orpo_config_rehearses_through_orpo_trainer(tmp_path, cli):
    """`rl: orpo` in an axolotl config: TRL's experimental ORPOTrainer (no reference model) on synthetic preference
    pairs; its loss is a mean over rows, so the accumulation check judges it (and finds it equal)."""
    config = tmp_path / "orpo.yml"
    config.write_text("base_model: google/tiny-gemma3_text\nrl: orpo\nadapter: lora\nlora_r: 8\n"
                      "lora_target_modules: [q_proj, k_proj, v_proj, o_proj]\nmicro_batch_size: 2\n"
                      "gradient_accumulation_steps: 2\nlearning_rate: 0.001\nsequence_len: 128\nbf16: true\n")
    code, doc = _rehearse(cli, tmp_path, "--training-config", str(config))
    assert doc["findings"] == [] and code == 0 and doc["trainer"] == "trl-orpo"
    got = {s["stage"]: s for s in doc["stages"]}
    assert got["setup"]["trainer"] == "ORPOTrainer" and got["accumulation"]["status"] == "ok"
    assert math.isfinite(got["train"]["losses"][0]) and got["train"]["moved"] == got["train"]["trainable"]


# -- reward modelling (gemma_doctor/rehearse/reward.py) ---------------------------------------------------------------
REWARD_PLAN = {"reward": {"task_type": "CAUSAL_LM", "source": "trl"}}


def _reward_findings(records: list[dict], plan: dict = REWARD_PLAN) -> list:
    from gemma_doctor import catalogue
    from gemma_doctor.rehearse import invariants, reward

    return reward.judge(records, invariants.judge(records, catalogue.entries()), plan)


def _reward_train(score: dict, rates: tuple = (0.001, 0.001)) -> dict:
    return {"stage": "train", "status": "ok", "losses": [0.69, 0.68], "grad_norms": [1.0, 0.9], "trainable": 3,
            "moved": 3, "learning_rates": list(rates), "margins": [0.01, 0.02], "score": score}


@pytest.mark.parametrize("score, found", [
    ({"names": ["score.weight"], "trainable": ["score.weight"], "moved": ["score.weight"]}, []),
    # frozen: the random head stays (a LoRA that does not save it reloads with another random head)
    ({"names": ["base_model.model.score.weight"], "trainable": [], "moved": []}, ["GD989"]),
    ({"names": ["score.weight"], "trainable": ["score.weight"], "moved": []}, ["GD989"]),
])
def test_the_score_head_of_a_reward_model_must_train(score, found):
    assert [f.code for f in _reward_findings([_reward_train(score)])] == found


def test_a_reload_that_differs_after_a_frozen_score_head_names_the_head_not_a_library_bug():
    """Measured (`trl reward` with lora_task_type: FEATURE_EXTRACTION): the loss falls, nothing raises, the adapter is
    saved without the frozen random head, and the reload scores otherwise (0.309 -> 0.168)."""
    frozen = _reward_train({"names": ["base_model.model.score.weight"], "trainable": [], "moved": []})
    save = {"stage": "save", "status": "ok", "max_abs_diff": 0.062, "scale": 0.075}
    got = {f.code: f for f in _reward_findings([frozen, save])}
    assert sorted(got) == ["GD975", "GD989"] and "GD989" in got["GD975"].fix and "upstream" not in got["GD975"].fix


def test_an_unmoved_score_head_under_a_learning_rate_of_0_is_not_judged():
    still = {"names": ["score.weight"], "trainable": ["score.weight"], "moved": []}
    assert _reward_findings([_reward_train(still, rates=(0.0, 0.0))]) == []


def test_a_model_without_a_sequence_classification_class_is_named_so():
    """Measured on transformers 5.23: AutoModelForSequenceClassification refuses gemma4 (and gemma3n): no class."""
    line = ("ValueError: Unrecognized configuration class <class 'transformers.models.gemma4.configuration_gemma4."
            "Gemma4Config'> for this kind of AutoModel: AutoModelForSequenceClassification. Model type should be one "
            "of GPT2Config, AlbertConfig, ...")
    [f] = _reward_findings([{"stage": "load", "status": "error", "exception": "ValueError", "line": line}])
    assert f.code == "GD997" and f.key == "load" and "Gemma4Config" in f.message and "GPT2Config" not in f.message


def test_peft_s_crash_on_a_classifier_is_gd988_only_for_a_causal_lm_adapter():
    line = "AttributeError: 'Gemma3TextForSequenceClassification' object has no attribute 'prepare_inputs_for_generation'"
    crash = [{"stage": "setup", "status": "error", "exception": "AttributeError", "line": line}]
    [f] = _reward_findings(crash)
    assert f.code == "GD988" and "lora_task_type: SEQ_CLS" in f.fix
    # with SEQ_CLS already, the same line is not this mechanism: the ordinary crash finding stands
    assert [f.code for f in _reward_findings(crash, {"reward": {"task_type": "SEQ_CLS"}})] == ["GD956"]


@pytest.mark.slow
def test_a_trl_reward_run_rehearses_through_reward_trainer_and_its_default_lora_task_type_is_caught(tmp_path, cli):
    """`trl reward --config` with use_peft and no lora_task_type: TRL's ModelConfig hands PEFT task_type CAUSAL_LM,
    and PEFT 0.21.2 fails wrapping the sequence classifier RewardTrainer trains (AttributeError
    prepare_inputs_for_generation, reproduced on the twin). check has nothing to say; the rehearsal names it (GD988)
    and reruns the twin with lora_task_type: SEQ_CLS through every stage: the healthy reward run, clean (the score
    head trains and is saved with the adapter, the reload scores alike, the merge keeps it). Two children."""
    config = tmp_path / "reward.yaml"
    config.write_text("per_device_train_batch_size: 2\nlearning_rate: 0.001\nmax_length: 128\nbf16: true\n" + LORA)
    # one step: the cure's run is the whole healthy reward run, every stage of it (CI's time)
    code, doc = _rehearse(cli, tmp_path, "--launch", f"trl reward --config {config}", "--steps", "1")
    assert code != 0 and doc["trainer"] == "trl-reward"
    assert [(s["stage"], s["status"]) for s in doc["stages"]] == [("twin", "ok"), ("load", "ok"), ("setup", "error")]
    assert next(s for s in doc["stages"] if s["stage"] == "load")["cls"] == "Gemma3TextForSequenceClassification"
    [found] = doc["findings"]
    assert found["code"] == "GD988" and "prepare_inputs_for_generation" in found["message"], found
    cure = found["details"]["cure_run"]
    assert found["details"]["cure"].startswith("cure verified in this stack") and cure["findings"] == [], found
    assert cure["stages"] == [[s, "ok"] for s in ("twin", "load", "setup")] + [["labels", "skipped"]] + \
        [[s, "ok"] for s in ("train", "accumulation", "eval", "save", "merge")]
    assert "the score head moved" in found["details"]["cure"] and "scores after reload differ by 0" in found["details"]["cure"]


# -- online DPO (gemma_doctor/rehearse/grpo.py: an online loop) --------------------------------------------------------
def test_online_dpo_s_completion_length_is_capped_under_its_own_key_and_vllm_is_off():
    from gemma_doctor.rehearse import grpo

    over, notes = grpo.translate({"use_vllm": True, "max_new_tokens": 256, "mask_truncated_completions": True},
                                 grpo.ONLINE_DPO)
    assert over == {"use_vllm": False, "max_new_tokens": grpo.COMPLETION_CAP} and len(notes) == 2
    # OnlineDPOConfig's default (64) is capped too; GRPO's key is not its
    assert grpo.translate({"max_completion_length": 8}, grpo.ONLINE_DPO)[0] == {"max_new_tokens": grpo.COMPLETION_CAP}


@pytest.mark.slow
def test_an_online_dpo_config_rehearses_through_online_dpo_trainer(tmp_path, cli):
    """`rl: online_dpo`: TRL 1.16's experimental OnlineDPOTrainer generates two completions per prompt with
    transformers' generate() (no vLLM on a CPU), the synthetic reward (grpo.py) scores them and DPO's loss trains the
    pair; at the first step the policy is the reference, so the loss is log 2. A reward model the config names is not
    loaded (said); the save reloads the adapter alike."""
    config = tmp_path / "online.yaml"
    config.write_text("rl: online_dpo\nper_device_train_batch_size: 2\nlearning_rate: 0.001\nmax_new_tokens: 64\n"
                      "beta: 0.1\nreward_model_path: org/rm\nbf16: true\n" + LORA)
    code, doc = _rehearse(cli, tmp_path, "--training-config", str(config), "--steps", "2")  # each step generates
    assert doc["findings"] == [] and code == 0 and doc["trainer"] == "trl-online-dpo"
    got = {s["stage"]: s for s in doc["stages"]}
    assert [(s["stage"], s["status"]) for s in doc["stages"]] == [
        ("twin", "ok"), ("load", "ok"), ("setup", "ok"), ("train", "ok"), ("save", "ok")]
    assert got["setup"]["trainer"] == "OnlineDPOTrainer" and got["setup"]["max_new_tokens"] == 16
    assert got["setup"]["rewards"] == ["synthetic_reward for org/rm"]
    assert got["train"]["losses"][0] == pytest.approx(math.log(2), abs=1e-3)
    assert got["train"]["moved"] == got["train"]["trainable"] and got["train"]["lora_b"]["moved"] > 0
