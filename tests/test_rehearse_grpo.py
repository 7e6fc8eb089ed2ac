"""The GRPO rehearsal (gemma_doctor/rehearse/grpo.py): a GRPO config rehearsed through TRL's own GRPOTrainer on the
twin, with the user's GRPO settings kept and only what a CPU cannot do replaced.

The config's translation and the judgement are pure and tested on plain data. Two real child runs on the pinned stack
(TRL 1.16), marked slow: a healthy config rehearses clean, and a reward function that gives every completion the same
reward is found (every advantage 0: the LoRA does not move). Each child builds its own twin: on this tiny config the
build is under a second of a child's half minute (the stack's imports are the rest), so a kept twin
(GEMMA_DOCTOR_TWIN_CACHE, which the driver's child does not read) would save nothing worth a second path.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gemma_doctor.rehearse import grpo, invariants, trl_launch
from gemma_doctor.rehearse.runner import plan_for
from tests.test_rehearse import model_folder

# -- the config as the rehearsal runs it ------------------------------------------------------------------------------
HEALTHY = ("bf16: true\nlearning_rate: 0.001\nper_device_train_batch_size: 4\nnum_generations: 4\n"
           "generation_batch_size: 8\nmax_completion_length: 256\nbeta: 0.04\nloss_type: dapo\nscale_rewards: batch\n"
           "epsilon: 0.2\nnum_iterations: 2\nuse_peft: true\nlora_r: 8\nlora_target_modules: [q_proj, v_proj]\n")


def test_only_what_a_cpu_cannot_do_is_replaced_each_said():
    over, notes = grpo.translate({"use_vllm": True, "max_completion_length": 1024, "mask_truncated_completions": True,
                                  "num_generations": 16, "beta": 0.04, "loss_type": "dr_grpo"})
    assert over == {"use_vllm": False, "max_completion_length": grpo.COMPLETION_CAP,
                    "mask_truncated_completions": False}
    assert len(notes) == 3 and "vLLM" in notes[0] and "1024 capped" in notes[1]
    # TRL's default length (512) is capped too; a short one, and everything else, is the user's
    assert grpo.translate({}) == ({"max_completion_length": grpo.COMPLETION_CAP},
                                  [f"max_completion_length 512 capped at {grpo.COMPLETION_CAP} tokens on the twin"])
    assert grpo.translate({"max_completion_length": 8, "use_vllm": False}) == ({}, [])


@pytest.mark.parametrize("raw, names", [
    ({"reward_funcs": ["accuracy_reward", "my_rewards.length"]}, ["accuracy_reward", "my_rewards.length"]),
    ({"reward_funcs": "think_format_reward"}, ["think_format_reward"]),
    ({"reward_funcs": [3, ""]}, []),
    ({}, []),
])
def test_the_reward_functions_are_the_ones_the_config_names(raw, names):
    assert grpo.reward_names(raw) == names


def test_the_synthetic_reward_differs_when_the_completions_do_and_only_then():
    got = grpo.synthetic_reward([[{"role": "assistant", "content": text}] for text in ("Paris", "Rome", "Paris")])
    assert got[0] == got[2] != got[1] and all(0 <= x < 1 for x in got)
    assert grpo.synthetic_reward(["plain text"]) == grpo.synthetic_reward([[{"content": "plain text"}]])


def test_the_prompts_are_the_users_first_rows_else_synthetic_conversational_prompts_with_solutions(tmp_path):
    from types import SimpleNamespace

    data = tmp_path / "prompts.jsonl"
    data.write_text("".join(json.dumps({"prompt": f"Add 1 and {i}.", "answer": str(i + 1)}) + "\n" for i in range(20)))
    assert grpo.rows(SimpleNamespace(s={"dataset": str(data)})) == [
        {"prompt": f"Add 1 and {i}.", "answer": str(i + 1)} for i in range(8)]
    made = grpo.rows(SimpleNamespace(s={"dataset": None}))
    assert len(made) == 8 and made[0]["prompt"][0]["role"] == "user" and made[0]["solution"]


def test_a_reward_that_cannot_be_had_here_is_replaced_in_its_place(tmp_path, monkeypatch):
    """One stand-in per missing function (and for a reward model), so the config's reward_weights still hold one
    weight per function; the user's importable ones are kept, each replacement said."""
    import sys
    from types import SimpleNamespace

    # rewards() puts the run's folder first on the path, as `trl grpo` does (in the child; here, in this test only)
    monkeypatch.setattr(sys, "path", list(sys.path))
    monkeypatch.delitem(sys.modules, "unit_rewards", raising=False)
    (tmp_path / "unit_rewards.py").write_text("def length(completions, **kwargs):\n"
                                              "    return [1.0] * len(completions)\n")
    run = SimpleNamespace(notes=[], plan={"cwd": str(tmp_path), "raw": {
        "reward_model_name_or_path": "org/rm", "reward_funcs": ["unit_rewards.length", "nowhere.reward", "bleu"]}})
    got = grpo.rewards(run)
    sys.modules.pop("unit_rewards", None)
    assert [name for name, _ in got] == [f"{grpo.SYNTHETIC} for org/rm", "unit_rewards.length",
                                         f"{grpo.SYNTHETIC} for nowhere.reward", f"{grpo.SYNTHETIC} for bleu"]
    assert got[1][1](["a", "b"]) == [1.0, 1.0] and got[2][1](["a"]) == grpo.synthetic_reward(["a"])
    assert len({f.__name__ for _, f in got}) == 4 and len(run.notes) == 3
    assert "ModuleNotFoundError" in run.notes[1] and "bleu" in run.notes[2]
    alone = SimpleNamespace(notes=[], plan={"raw": {}})
    assert grpo.rewards(alone) == [(grpo.SYNTHETIC, grpo.synthetic_reward)] and len(alone.notes) == 1


@pytest.mark.parametrize("line, found", [
    ("trl grpo --config grpo.yaml", (Path("grpo.yaml"), "trl-grpo")),
    ("accelerate launch --num_processes 1 /opt/bin/trl grpo --config=grpo.yaml", (Path("grpo.yaml"), "trl-grpo")),
])
def test_a_trl_grpo_line_names_its_config(line, found):
    assert trl_launch(line) == found


def test_a_grpo_config_is_rehearsed_as_grpo_and_another_rl_run_keeps_its_note(tmp_path):
    # before: GRPO got a GD951 note "not rehearsable here: a GRPO run" and was rehearsed as a plain run
    config = tmp_path / "grpo.yaml"
    config.write_text(HEALTHY)
    plan, findings, _, _ = plan_for(str(model_folder(tmp_path, "gemma3_text")), None, "main", config, 3)
    assert plan["trainer"] == "trl-grpo" and not [f for f in findings if f.code == "GD951"]
    assert plan["stages"] == ["load", "setup", "train", "save"] and plan["cwd"] == str(Path.cwd())
    ppo = tmp_path / "ppo.yaml"
    ppo.write_text("stage: ppo\nfinetuning_type: lora\n")
    _, findings, _, _ = plan_for(str(model_folder(tmp_path, "gemma3_text")), None, "main", ppo, 3)
    assert [f.message for f in findings if f.code == "GD951"] == [
        "not rehearsable here: a PPO run (its trainer's generation, rewards and reference model); its model, adapter, "
        "precision and save are rehearsed as a transformers run"]


# -- the judgement, on plain records ----------------------------------------------------------------------------------
def _train(rewards: list[list[float | str]], advantages: list[float], *, names: list[str] | None = None,
           lengths: list[int] | None = None, moved: int = 0, norms: list[float] | None = None,
           contrast: list[list[float | str]] | None = None) -> dict:
    rollout = {"lengths": lengths or [16] * len(rewards), "texts": [40] * len(rewards), "rewards": rewards,
               "advantages": advantages}
    seen = {"rollouts": [rollout], "max_completion_length": 16, "num_generations": 2,
            "reward_names": names or ["my_rewards.constant"]}
    if contrast is not None:
        seen["contrast"] = {"completions": ["a"] * len(contrast), "rewards": contrast}
    return {"stage": "train", "status": "ok", "losses": [0.0, 0.0], "grad_norms": norms or [0.0, 0.0],
            "trainable": 4, "moved": moved, "lora_b": {"count": 2, "moved": min(moved, 2)}, "rollouts": seen}


def codes(record: dict) -> list[tuple[str, str]]:
    return [(f.code, f.severity.value) for f in invariants.judge([record], [])]


def test_equal_rewards_in_every_group_are_one_finding_not_four():
    """Zero advantages leave the loss, the gradient and every parameter at rest: GD996 says why, and GD968-GD970
    (which would say only that nothing moved) are not added."""
    assert codes(_train([[1.0], [1.0], [0.5], [0.5]], [0.0] * 4)) == [("GD996", "warning")]
    # the synthetic reward differs whenever the completions do: equal rewards mean equal completions, an error
    assert codes(_train([[0.3], [0.3]], [0.0, 0.0], names=[grpo.SYNTHETIC])) == [("GD996", "error")]
    [none] = invariants.judge([_train([["nan"], ["nan"]], [0.0, 0.0])], [])
    assert "no completion was scored" in none.message


def test_equal_rewards_from_a_reward_that_scores_other_completions_differently_are_only_a_note():
    """A format or correctness reward scores a twin's random text alike; the same function scoring the contrast
    completions (the row's solution, boxed, ...) differently shows it is not constant: info, not a warning."""
    flat = [[0.0], [0.0], [0.0], [0.0]]
    assert codes(_train(flat, [0.0] * 4, names=["think_format_reward"], contrast=[[0.0], [0.0], [1.0], [0.0]])) == \
        [("GD996", "info")]
    assert codes(_train(flat, [0.0] * 4, contrast=[[0.0], [0.0], ["nan"], [0.0]])) == [("GD996", "warning")]


def test_the_contrast_completions_keep_the_format_and_a_failing_call_is_the_probes_not_the_runs():
    """The contrast is scored through the trainer's own scoring step; a reward function that refuses those
    completions (here: any boxed answer) leaves a reason in the record, and the run trains on."""
    class Rows(list):
        def tolist(self) -> list:
            return list(self)

    def tokenizer(text: str, add_special_tokens: bool) -> dict:
        return {"input_ids": list(text.encode())}

    inputs = [{"prompt": [{"role": "user", "content": "7 x 6?"}], "solution": "42"}] * 5
    chat = [[{"role": "assistant", "content": "xq"}]] * 5

    def score(inputs, prompts, completions, ids):
        texts = [c[0]["content"] for c in completions]
        if any("boxed" in t for t in texts):
            raise ValueError("no boxed answers here")
        return Rows([[float(len(t))] for t in texts])

    got = grpo.contrast(score, tokenizer, inputs, [i["prompt"] for i in inputs], chat)
    assert got == {"error": "ValueError: no boxed answers here"}
    plain = grpo.contrast(lambda i, p, c, ids: Rows([[float(len(t))] for t in c]), tokenizer, inputs, ["q"] * 5,
                          ["xq"] * 5)
    assert plain["completions"] == ["42", "The answer is \\boxed{42}.", "<think>\nLet me check.\n</think>\n42", "",
                                    "I do not know."]
    assert plain["rewards"] == [[float(len(t))] for t in plain["completions"]]
    # no contrast to go by: the user's reward keeps the warning
    flat = _train([[0.0], [0.0]], [0.0, 0.0])
    flat["rollouts"]["contrast"] = got
    assert codes(flat) == [("GD996", "warning")]


def test_a_healthy_grpo_record_has_no_finding_though_its_first_loss_is_zero():
    # the advantages of a group sum to 0, so GRPO's loss is 0 at its first step in any correct stack
    assert codes(_train([[0.1], [0.9]], [-0.7, 0.7], moved=4, norms=[0.5, 0.6])) == []
    # advantages present, yet nothing moved: the ordinary train invariants still judge
    assert {c for c, _ in codes(_train([[0.1], [0.9]], [-0.7, 0.7], moved=0))} == {"GD968", "GD969", "GD970"}


def test_an_infinite_reward_is_its_own_finding():
    """TRL 1.16 turns an infinite reward's advantages into 0 (nan_to_num) and trains on silently: GD995, and not also
    GD996, whose cure (rewards that differ) is not this one."""
    assert codes(_train([["inf"], ["-inf"]], [0.0, 0.0])) == [("GD995", "error")]
    assert codes(_train([["inf"], [0.5]], [0.0, 0.0])) == [("GD995", "error")]


# -- real runs through TRL's GRPOTrainer (slow) -----------------------------------------------------------------------
def _rehearse(cli, tmp_path: Path, monkeypatch, config: str, *, launch: bool = False) -> tuple[int, dict]:
    monkeypatch.chdir(tmp_path)  # reward functions are imported from the folder the rehearsal starts in
    (tmp_path / "my_rewards.py").write_text("def constant(completions, **kwargs):\n"
                                            "    return [1.0] * len(completions)\n")
    (tmp_path / "grpo.yaml").write_text(config)
    how = ("--launch", "trl grpo --config grpo.yaml") if launch else ("--training-config", "grpo.yaml")
    got = cli("rehearse", model_folder(tmp_path, "gemma3_text"), *how, "--format", "json")
    return got.code, got.json()["rehearsals"][0]


@pytest.mark.slow
def test_a_healthy_grpo_config_rehearses_clean_with_its_settings_kept(tmp_path, cli, monkeypatch):
    code, doc = _rehearse(cli, tmp_path, monkeypatch, HEALTHY)
    assert doc["findings"] == [] and code == 0, doc["findings"]
    assert [(s["stage"], s["status"]) for s in doc["stages"]] == [("twin", "ok"), ("load", "ok"), ("setup", "ok"),
                                                                  ("train", "ok"), ("save", "ok")]
    setup, train = doc["stages"][2], doc["stages"][3]
    assert setup["trainer"] == "GRPOTrainer" and setup["rewards"] == [grpo.SYNTHETIC]
    assert {k: setup[k] for k in ("num_generations", "generation_batch_size", "beta", "loss_type", "scale_rewards",
                                  "epsilon", "num_iterations", "max_completion_length")} == {
        "num_generations": 4, "generation_batch_size": 8, "beta": 0.04, "loss_type": "dapo", "scale_rewards": "batch",
        "epsilon": 0.2, "num_iterations": 2, "max_completion_length": grpo.COMPLETION_CAP}
    rollouts = train["rollouts"]["rollouts"]
    # generation_batch_size 8 at 4 a step, num_iterations 2: one generation of 2 prompts x 4 completions serves 4
    # optimizer steps, so the 3 rehearsed steps train on one rollout
    assert len(rollouts) == 1 and len(rollouts[0]["lengths"]) == 8 and len(train["losses"]) == 3
    assert all(0 < n <= grpo.COMPLETION_CAP for r in rollouts for n in r["lengths"])
    assert train["lora_b"]["moved"] == train["lora_b"]["count"] > 0
    assert any(f"256 capped at {grpo.COMPLETION_CAP}" in n for n in doc["notes"])


@pytest.mark.slow
def test_a_constant_reward_is_found_with_its_figures(tmp_path, cli, monkeypatch):
    """The field's silent GRPO failure (trl#5697: every reward 0, zero loss, zero gradient, no error): here a reward
    function of the user's that returns 1.0 for every completion, through `trl grpo --config`."""
    config = HEALTHY.replace("loss_type: dapo\n", "loss_type: grpo\nreward_funcs: [my_rewards.constant]\n")
    code, doc = _rehearse(cli, tmp_path, monkeypatch, config, launch=True)
    assert [(f["code"], f["severity"]) for f in doc["findings"]] == [("GD996", "warning")], doc["findings"]
    train = doc["stages"][3]
    assert train["moved"] == 0 and train["lora_b"]["moved"] == 0 and set(train["grad_norms"]) == {0.0}
    details = doc["findings"][0]["details"]
    assert details["groups"][0] == [1.0] * 4 and "my_rewards.constant" in doc["findings"][0]["fix"]
    # the same function scored other completions of the same prompts (the row's solution, ...) alike too
    assert {r[0] for r in details["contrast"]["rewards"]} == {1.0} and "" in details["contrast"]["completions"]
    assert doc["stages"][2]["rewards"] == ["my_rewards.constant"] and code == 0


@pytest.mark.slow
def test_rloo_runs_through_rloo_trainer_and_a_constant_reward_is_found(tmp_path, cli, monkeypatch):
    """`trl rloo --config`: TRL 1.16's RLOOTrainer is GRPO's loop with leave-one-out advantages (the same generation and
    scoring steps, which the probes wrap), so it is rehearsed as itself, not as GD951 and an SFT loop. A reward that
    gives every completion 1.0 leaves every leave-one-out advantage 0: GD996 with its figures."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "my_rewards.py").write_text("def constant(completions, **kwargs):\n    return [1.0] * len(completions)\n")
    (tmp_path / "rloo.yaml").write_text("num_generations: 4\nper_device_train_batch_size: 4\nlearning_rate: 0.001\n"
                                        "max_completion_length: 64\nbeta: 0.04\nreward_funcs: [my_rewards.constant]\n"
                                        "use_peft: true\nlora_r: 8\nlora_target_modules: [q_proj, k_proj, v_proj, o_proj]\n")
    got = cli("rehearse", model_folder(tmp_path, "gemma3_text"), "--launch", "trl rloo --config rloo.yaml",
              "--format", "json")
    doc = got.json()["rehearsals"][0]
    assert doc["trainer"] == "trl-rloo" and doc["stages"][2]["trainer"] == "RLOOTrainer"
    assert [(s["stage"], s["status"]) for s in doc["stages"]] == [("twin", "ok"), ("load", "ok"), ("setup", "ok"),
                                                                  ("train", "ok"), ("save", "ok")]
    assert [(f["code"], f["severity"]) for f in doc["findings"]] == [("GD996", "warning")], doc["findings"]
    assert doc["findings"][0]["details"]["groups"][0] == [1.0] * 4 and doc["stages"][3]["moved"] == 0
