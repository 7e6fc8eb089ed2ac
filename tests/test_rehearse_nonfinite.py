"""The rehearsal's diagnosis of a non-finite loss or gradient (gemma_doctor/rehearse/nonfinite.py) and the cure text
the parent makes of it (invariants.nonfinite_cure), on a tiny real Gemma 3 model in-process.

The kernel case itself (SDPA's cuDNN kernel, left padding, bf16) needs a CUDA GPU: it was measured on an H200
(benchmarks/gpu_nan_window.py, docs/rehearsal.md); here the diagnosis's logic runs on real models and real steps.
"""

from __future__ import annotations

import math

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from gemma_doctor.rehearse import nonfinite  # noqa: E402
from gemma_doctor.rehearse.invariants import LEFT_PAD_SDPA, judge_train, nonfinite_cure  # noqa: E402


def _config() -> object:
    return transformers.Gemma3TextConfig(vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                         num_attention_heads=2, num_key_value_heads=1, head_dim=8,
                                         max_position_embeddings=64, sliding_window=8, pad_token_id=0)


def _model(attn: str | None = None, poisoned: bool = False) -> object:
    torch.manual_seed(0)
    model = transformers.Gemma3ForCausalLM(_config())
    if attn:
        model.config._attn_implementation = attn
    if poisoned:  # an overflowed weight: every forward is non-finite
        with torch.no_grad():
            model.model.norm.weight[0] = float("inf")
    return model


def _batches() -> list[dict]:
    ids = torch.tensor([[0, 0, 0, 5, 6, 7], [9, 10, 11, 12, 13, 14]])
    mask = (ids != 0).long()
    return [{"input_ids": ids, "attention_mask": mask, "labels": ids.masked_fill(mask == 0, -100)}]


def test_left_padding_is_seen_and_moved_to_the_right():
    batch = _batches()[0]
    assert nonfinite.left_padded(batch["attention_mask"])
    right = nonfinite.right_padded(batch)
    assert not nonfinite.left_padded(right["attention_mask"])
    assert right["input_ids"][0].tolist() == [5, 6, 7, 0, 0, 0]
    assert right["labels"][0].tolist() == [5, 6, 7, -100, -100, -100]
    assert right["input_ids"][1].tolist() == batch["input_ids"][1].tolist()
    assert not nonfinite.left_padded(torch.ones(2, 4, dtype=torch.long))


def test_finite_batches_on_a_fresh_twin_mean_the_values_grew_during_training():
    got = nonfinite.diagnose(_batches(), lambda attn: _model(attn), "cpu")
    assert got["reproduced"] is False and got["stepped"] == 1 and "error" not in got
    text = nonfinite_cure(got, "DEFAULT")
    assert "grew during training" in text and "DEFAULT" in text


def test_a_batch_non_finite_under_every_cure_keeps_the_default_cure():
    got = nonfinite.diagnose(_batches(), lambda attn: _model(attn, poisoned=True), "cpu")
    assert got["reproduced"] is True and got["batch"] == 0 and got["left_padded"] is True
    assert got["as_run"]["finite"] is False
    # CPU: no cuDNN cure to try; the right-padded rows and eager attention are tried and stay non-finite.
    assert set(got["cures"]) == {"padding on the right", "eager attention"}
    assert all(c["finite"] is False for c in got["cures"].values())
    text = nonfinite_cure(got, "DEFAULT")
    assert "no cure tried gave finite values" in text and text.endswith("DEFAULT")
    assert LEFT_PAD_SDPA not in text


def test_a_cure_that_gives_finite_values_is_reported_verified():
    # The twin as the run loads it (sdpa) overflows; with eager attention it does not: the kernel is the cause.
    got = nonfinite.diagnose(_batches(), lambda attn: _model(attn, poisoned=attn is None), "cpu")
    assert got["cures"]["eager attention"]["finite"] is True
    assert got["cures"]["padding on the right"]["finite"] is False
    findings = judge_train({"losses": [1.0, float("nan")], "grad_norms": [1.0, float("nan")], "nonfinite": got})
    gd967 = next(f for f in findings if f.code == "GD967")
    assert "cure verified in this stack: eager attention" in gd967.fix
    assert gd967.details["nonfinite"]["batch"] == 0
    # Not the left-padding mechanism: right padding did not help and no cuDNN kernel was in play.
    assert LEFT_PAD_SDPA not in gd967.fix and "catalogue" not in gd967.details


def test_a_diagnosis_that_could_not_step_says_nothing():
    assert nonfinite_cure({"reproduced": False, "stepped": 2, "error": "TypeError: x"}, "DEFAULT") == "DEFAULT"


def test_the_left_padding_mechanism_is_named_when_its_cures_work():
    diagnosis = {"reproduced": True, "batch": 1, "pads": 12, "left_padded": True, "stepped": 3,
                 "cures": {"SDPA without the cuDNN kernel": {"finite": True}, "padding on the right": {"finite": True},
                           "eager attention": {"finite": True}}}
    gd967 = next(f for f in judge_train({"losses": [1.0], "grad_norms": [math.nan], "nonfinite": diagnosis})
                 if f.code == "GD967")
    assert gd967.details["catalogue"] == LEFT_PAD_SDPA
    assert "padding_side" in gd967.fix and "enable_cudnn_sdp(False)" in gd967.fix


@pytest.mark.parametrize("poisoned", [False, True])
def test_of_run_steps_the_trainers_own_batches(tmp_path, poisoned):
    import tokenizers

    _model(poisoned=poisoned).save_pretrained(tmp_path / "twin")
    tok = transformers.PreTrainedTokenizerFast(
        tokenizer_object=tokenizers.Tokenizer(tokenizers.models.WordLevel({str(i): i for i in range(64)},
                                                                          unk_token="1")),
        pad_token="0", padding_side="left")
    rows = [{"input_ids": list(range(3, 3 + n)), "attention_mask": [1] * n} for n in (3, 6, 4, 5)]
    args = transformers.TrainingArguments(str(tmp_path / "out"), per_device_train_batch_size=2, use_cpu=True,
                                          report_to=[], remove_unused_columns=False)
    trainer = transformers.Trainer(model=_model(), args=args, train_dataset=rows,
                                   data_collator=transformers.DataCollatorForLanguageModeling(tok, mlm=False))

    from gemma_doctor.rehearse.driver import Run

    run = Run({"settings": {}, "workdir": str(tmp_path), "architecture": "Gemma3ForCausalLM",
               "repo_id": str(tmp_path / "twin")}, events=None)
    run.trainer = trainer
    got = nonfinite.of_run(run)
    if not poisoned:
        assert got["reproduced"] is False and got["stepped"] == 2 and "error" not in got  # 4 rows, batches of 2
    else:  # the fresh twin is the saved one: its first batch, as the trainer's collator padded it (left)
        assert got["reproduced"] is True and got["batch"] == 0 and got["left_padded"] is True
        assert got["as_run"]["finite"] is False
