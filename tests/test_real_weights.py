"""measure_step (gemma_doctor/rehearse/realweights.py): one real training step, each module's largest activation and
gradient against fp16's range, and the step's peak memory. Tiny real checkpoints saved by the installed transformers;
one has planted large activations (a layer's down_proj scaled so its output passes 65504 in fp32)."""

from __future__ import annotations

from pathlib import Path

import pytest

from gemma_doctor.rehearse.realweights import FP16_MAX, MeasureError, measure_step

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from tests import tiny_family  # noqa: E402

@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory) -> dict[str, Path]:
    """"plain": tiny Gemma 3 text; "hot": the same with layer 1's down_proj scaled by 1e8 (fp32 on disk)."""
    root = tmp_path_factory.mktemp("rw")
    torch.set_num_threads(1)
    plain = tiny_family.save("gemma3_text", root / "plain")
    model = transformers.AutoModelForCausalLM.from_pretrained(plain, dtype=torch.float32)
    with torch.no_grad():
        model.model.layers[1].mlp.down_proj.weight.mul_(1e8)
    model.save_pretrained(root / "hot")
    return {"plain": plain, "hot": root / "hot"}


def test_planted_overflow_is_found_and_named(checkpoints):
    got = measure_step(checkpoints["hot"], seq_len=16, dtype="float32")
    assert got["fp16_overflow"] is True
    # LoRA wraps the projection: the overflow is in its frozen base layer, named as in the checkpoint's model
    assert got["first_overflow"] == "model.layers.1.mlp.down_proj.base_layer"
    assert got["act_absmax"] > FP16_MAX and got["nonfinite"] is False
    assert got["fp16_headroom"] < 1
    by_name = {m["name"]: m for m in got["modules"]}
    assert by_name["model.layers.0.mlp.down_proj.base_layer"]["act_absmax"] < FP16_MAX  # layer 0 is untouched


def test_full_fine_tune_names_the_module_and_measures_its_gradient(checkpoints):
    got = measure_step(checkpoints["hot"], seq_len=16, dtype="float32", lora=False)
    assert got["first_overflow"] == "model.layers.1.mlp.down_proj"
    by_name = {m["name"]: m for m in got["modules"]}
    assert by_name["model.layers.1.mlp.down_proj"]["grad_absmax"] > 0


def test_planted_overflow_in_fp16_is_non_finite(checkpoints):
    got = measure_step(checkpoints["hot"], seq_len=16, dtype="float16", lora=False)
    assert got["nonfinite"] is True and got["fp16_overflow"] is True
    assert got["first_overflow"] == "model.layers.1.mlp.down_proj"


def test_ordinary_checkpoint_reports_headroom(checkpoints):
    got = measure_step(checkpoints["plain"], seq_len=16, dtype="float32")
    assert got["fp16_overflow"] is False and got["first_overflow"] is None and got["nonfinite"] is False
    assert 0 < got["act_absmax"] < FP16_MAX and 0 < got["grad_absmax"] < FP16_MAX
    assert got["fp16_headroom"] == pytest.approx(FP16_MAX / max(got["act_absmax"], got["grad_absmax"]))
    names = {m["name"] for m in got["modules"]}
    assert {"model.layers.0.mlp.down_proj.base_layer", "model.layers.1.self_attn.o_proj.base_layer"} <= names
    assert any(m["grad_absmax"] for m in got["modules"])  # gradients measured, not only activations
    assert got["device"] == "cpu" and got["peak_source"] == "rss"


def test_chat_formatted_texts_through_the_models_tokenizer(checkpoints, tmp_path):
    from gemma_doctor.rehearse.twin import build_twin
    from tests.builders import HubCache

    folder = checkpoints["plain"]
    snap = HubCache(tmp_path / "hub").add("org/g3", {p.name: p.read_bytes() for p in folder.iterdir() if p.is_file()})
    twin = build_twin(snap, "org/g3", tmp_path / "twin")  # a checkpoint with a tokenizer and a chat template
    got = measure_step(twin.snapshot, seq_len=24, batch=2, dtype="float32", texts=["What is 2+2?"])
    assert got["batch"] == 2 and got["seq_len"] == 24 and got["loss"] > 0


def test_cpu_step_measures_rss(tmp_path):
    """A 262k-vocabulary checkpoint: its fp32 weights (33.6 MB, allocated afresh by the load) must be inside the step's
    peak RSS increase, and the increase must be bounded."""
    config = transformers.Gemma3TextConfig(**{**tiny_family.TXT, "vocab_size": 262144})
    torch.manual_seed(0)
    model = transformers.Gemma3ForCausalLM(config)
    model.save_pretrained(tmp_path / "ckpt")
    weights = sum(p.numel() * p.element_size() for p in model.parameters())
    del model
    got = measure_step(tmp_path / "ckpt", seq_len=32, dtype="float32")
    assert got["device"] == "cpu" and got["peak_source"] == "rss"
    assert weights <= got["peak_bytes"] < 2 * 1024**3, (weights, got["peak_bytes"])


@pytest.mark.parametrize("kwargs, message", [
    ({"seq_len": 8, "dtype": "int8"}, "dtype 'int8'"),
    ({"seq_len": 0}, "at least 1"),
    ({"seq_len": 8, "device": "cuda:7"}, "no CUDA device"),
])
def test_bad_requests_are_one_line(checkpoints, kwargs, message):
    if "cuda" in kwargs.get("device", "") and torch.cuda.is_available():
        pytest.skip("a CUDA device is present")
    with pytest.raises(MeasureError, match=message):
        measure_step(checkpoints["plain"], **kwargs)


def test_not_a_checkpoint(tmp_path):
    with pytest.raises(MeasureError, match="no config.json"):
        measure_step(tmp_path, seq_len=8)


def test_judge_follows_the_measurement(checkpoints):
    from gemma_doctor.rehearse.realweights import judge

    hot = measure_step(checkpoints["hot"], seq_len=16, dtype="float32", lora=False)
    codes = {f.code: f for f in judge(hot, train_dtype="float16")}
    assert set(codes) == {"GD980"} and codes["GD980"].severity.value == "error"
    assert "model.layers.1.mlp.down_proj" in codes["GD980"].message
    assert judge(hot, train_dtype="bfloat16")[0].severity.value == "warning"
    plain = measure_step(checkpoints["plain"], seq_len=16, dtype="float32")
    assert [f.code for f in judge(plain)] == ["GD985"]
    fp16 = measure_step(checkpoints["hot"], seq_len=16, dtype="float16", lora=False)
    assert {f.code for f in judge(fp16)} == {"GD980", "GD981"}
    plain = {**plain, "peak_bytes": 10 * 2**30}
    assert "GD982" in {f.code for f in judge(plain, device_bytes=8 * 2**30)}
    assert "GD983" in {f.code for f in judge(plain, plan_bytes=8 * 2**30)}
    assert "GD983" not in {f.code for f in judge(plain, plan_bytes=10 * 2**30)}
    assert [f.code for f in judge({**plain, "oom": True, "error": "CUDA out of memory"})] == ["GD984"]


def test_multimodal_checkpoint_gets_lora_on_its_text_model(tmp_path):
    folder = tiny_family.save("gemma3", tmp_path / "g3")
    got = measure_step(folder, seq_len=8, dtype="float32")
    names = {m["name"] for m in got["modules"]}
    assert "model.language_model.layers.0.self_attn.q_proj.base_layer" in names
    assert got["fp16_overflow"] is False and got["loss"] > 0
