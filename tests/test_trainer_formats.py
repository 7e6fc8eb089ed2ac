"""The prescription is a Run of ONE named trainer (issue 32): `recommend --trainer axolotl|trl|transformers` searches,
judges and writes the run as that trainer's config, check of that config plans the very run (its memory line), the
views show that trainer's snippets only (TRL's SFTConfig beside axolotl's run was a run of other memory), and where
the user left the trainer open the way out names another trainer whose run passes, which holds when followed. On the
bundled example cache (gemma-3-12b-it, real safetensors headers) and the test stack (TRL 1.16: chunked log-probs)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from tests.builders import build_example_cache

G3 = "google/gemma-3-12b-it"


@pytest.fixture(scope="module")
def examples(tmp_path_factory) -> Path:
    cache = tmp_path_factory.mktemp("trainers") / "hub"
    build_example_cache(cache)
    return cache


def _memory_line(text: str) -> str:
    return next(line.strip() for line in text.splitlines() if line.strip().startswith("memory "))


def _check_memory(cli, examples: Path, gpu: str, path: Path, *extra: str) -> tuple[int, dict]:
    r = cli("check", G3, "--cache-dir", examples, "--gpu", gpu, "--training-config", path, "--fail-on", "warning",
            "--format", "json", *extra)
    return r.code, r.json()


@pytest.mark.parametrize("trainer,seq", [("trl", ()), ("transformers", ("--seq-len", "1024")), ("axolotl", ()),
                                         ("llama-factory", ())])
def test_l4_the_text_memory_line_is_the_run_check_plans_from_that_trainers_yaml(cli, examples, tmp_path, trainer, seq):
    """On an L4, the memory line recommend prints for --trainer T is the line check plans from T's YAML read back
    (TRL's SFTTrainer: no full logits, 16.3 GiB at batch 4; axolotl's and a plain Trainer's: 19.7 GiB at batch 2).
    On main the TRL SFTConfig snippet stood beside axolotl's 19.7 GiB line and no TRL config could be asked for."""
    args = ("recommend", G3, "--cache-dir", examples, "--gpu", "L4", "--trainer", trainer)
    text = cli(*args)
    assert text.code == 0, text.err
    r = cli(*args, "--format", "yaml")
    path = tmp_path / f"{trainer}.yaml"
    path.write_text(r.out)
    data = yaml.safe_load(r.out)
    code, doc = _check_memory(cli, examples, "L4", path, *seq)
    assert code == 0, doc
    model = doc["models"][0]
    assert f"memory {model['memory']['summary']}" == _memory_line(text.out)
    assert model["run"]["trainer"]["value"] == {"trl": "trl-sft", "transformers": "transformers",
                                                "axolotl": "axolotl", "llama-factory": "llama-factory"}[trainer]
    chunked = "logits" not in model["memory"]["components"] or model["memory"]["components"]["logits"] < 2 ** 30
    assert chunked is (trainer == "trl"), model["memory"]["components"]
    assert ("model_name_or_path" in data) is (trainer in ("trl", "llama-factory"))
    assert ("base_model" in data) is (trainer == "axolotl") and ("stage" in data) is (trainer == "llama-factory")
    # JSON's prescription states the trainer its run is written for, and the same memory.
    j = cli(*args, "--format", "json").json()["models"][0]
    assert j["prescription"]["run"]["trainer"]["value"] == model["run"]["trainer"]["value"]
    assert j["prescription"]["memory"] == model["memory"]["summary"]


def test_l4_trl_holds_less_than_axolotls_run(cli, examples):
    """The figures of the issue: TRL's run of the same model and GPU holds less (chunked log-probs)."""
    lines = {t: _memory_line(cli("recommend", G3, "--cache-dir", examples, "--gpu", "L4", "--trainer", t).out)
             for t in ("trl", "axolotl")}
    assert "16.3 GiB" in lines["trl"] and "batch 4" in lines["trl"], lines
    assert "19.7 GiB" in lines["axolotl"] and "batch 2" in lines["axolotl"], lines


def test_the_snippets_shown_are_the_prescribed_trainers(cli, examples):
    """Beside axolotl's run no TRL SFTConfig (another run: chunked log-probs) is shown as if it were the prescription;
    with --trainer trl, the TRL config is shown and the plain Trainer's TrainingArguments (full logits) is not."""
    axolotl = cli("recommend", G3, "--cache-dir", examples, "--gpu", "L4", "--format", "json").json()["models"][0]
    trl = cli("recommend", G3, "--cache-dir", examples, "--gpu", "L4", "--trainer", "trl",
              "--format", "json").json()["models"][0]
    assert "trl" not in axolotl["snippets"]["python"] and "transformers" in axolotl["snippets"]["python"]
    assert "trl" in trl["snippets"]["python"] and "transformers" not in trl["snippets"]["python"]
    text = cli("recommend", G3, "--cache-dir", examples, "--gpu", "L4").out
    assert "trainer axolotl" in text and "--trainer trl" in text and "SFTConfig(" not in text


def test_t4_the_way_out_names_trl_and_following_it_passes_check(cli, examples, tmp_path):
    """On a T4 axolotl's run of gemma-3-12b-it does not fit (15.6 GiB of 15.0): no prescription. TRL's SFTTrainer
    holds no full logits: the way out names `--trainer trl` with its figure, and that command's YAML passes check at
    that very figure. On main the way out said nothing of another trainer."""
    r = cli("recommend", G3, "--cache-dir", examples, "--gpu", "T4", "--format", "json")
    assert r.code == 1
    way = r.json()["models"][0]["way_out"]
    line = next((w for w in way if w.startswith("--trainer trl")), None)
    assert line is not None, way
    followed = cli("recommend", G3, "--cache-dir", examples, "--gpu", "T4", "--trainer", "trl", "--format", "json")
    assert followed.code == 0, followed.err
    m = followed.json()["models"][0]
    assert line.endswith(m["prescription"]["memory"]), (line, m["prescription"]["memory"])
    path = tmp_path / "t4.yaml"
    path.write_text(cli("recommend", G3, "--cache-dir", examples, "--gpu", "T4", "--trainer", "trl",
                        "--format", "yaml").out)
    code, doc = _check_memory(cli, examples, "T4", path)
    assert code == 0, [f["code"] for f in doc["models"][0]["findings"]]
    assert doc["models"][0]["memory"]["summary"] == m["prescription"]["memory"]


G4 = "google/gemma-4-E2B-it"


def test_a_blocker_of_axolotls_run_names_the_trainer_whose_run_passes_and_following_it_passes_check(cli, examples,
                                                                                                     tmp_path):
    """A blocker that is not memory: Gemma 4 E2B (20 KV-shared layers) on transformers 5.5.1 trains a wrong loss
    without the cache (GD107), and axolotl switches use_cache off whatever its YAML says (check_model_config, 0.19.0):
    every axolotl run is GD107, no prescription. TRL's config keeps use_cache on (GD107 info): the way out names
    `--trainer trl` with its run's line, and that command's YAML passes check --fail-on warning at that very figure.
    On main the way out named only the transformers upgrade (the trainer was tried only where memory blocked)."""
    stack = ("--gpu", "A100", "--with", "transformers==5.5.1")
    r = cli("recommend", G4, "--cache-dir", examples, *stack, "--format", "json")
    assert r.code == 1
    m = r.json()["models"][0]
    assert [b.split(":", 1)[0] for b in m["blocking"]] == ["GD107"], m["blocking"]
    line = next((w for w in m["way_out"] if w.startswith("--trainer ")), None)
    assert line is not None and line.startswith("--trainer trl (its run: "), m["way_out"]
    followed = cli("recommend", G4, "--cache-dir", examples, *stack, "--trainer", "trl", "--format", "json")
    assert followed.code == 0, followed.err
    p = followed.json()["models"][0]["prescription"]
    assert line.endswith(p["memory"]) and p["run"]["trainer"]["value"] == "trl-sft", (line, p["memory"])
    path = tmp_path / "g4.yaml"
    path.write_text(cli("recommend", G4, "--cache-dir", examples, *stack, "--trainer", "trl", "--format", "yaml").out)
    assert yaml.safe_load(path.read_text())["use_cache"] is True
    r = cli("check", G4, "--cache-dir", examples, *stack, "--training-config", path, "--fail-on", "warning",
            "--format", "json")
    doc = r.json()["models"][0]
    assert r.code == 0, [(f["code"], f["severity"]) for f in doc["findings"]]
    assert doc["memory"]["summary"] == p["memory"]
    assert [f["severity"] for f in doc["findings"] if f["code"] == "GD107"] == ["info"]
    # The user's choice is kept: with --trainer axolotl, or an axolotl config, no other trainer is named.
    chosen = cli("recommend", G4, "--cache-dir", examples, *stack, "--trainer", "axolotl", "--format", "json")
    assert chosen.code == 1 and not [w for w in chosen.json()["models"][0]["way_out"] if w.startswith("--trainer")]


def test_a_blocker_every_trainer_meets_names_no_trainer(cli, examples):
    """A blocker of the stack whatever the trainer (GD108: transformers 4.49.0 cannot load a Gemma 3) gets no trainer
    line: only its cure."""
    r = cli("recommend", G3, "--cache-dir", examples, "--gpu", "A100", "--with", "transformers==4.49.0",
            "--format", "json")
    assert r.code == 1
    way = r.json()["models"][0]["way_out"]
    assert way == ['GD108: pip install "transformers>=4.50.0"'], way


def test_a_chosen_trainer_gets_no_other_trainers_way_out(cli, examples):
    """The user's choice is kept: with --trainer axolotl the way out does not switch trainers."""
    r = cli("recommend", G3, "--cache-dir", examples, "--gpu", "T4", "--trainer", "axolotl", "--format", "json")
    assert r.code == 1
    assert not [w for w in r.json()["models"][0]["way_out"] if w.startswith("--trainer")]


def test_the_training_configs_trainer_is_the_default(cli, examples, tmp_path):
    """A TRL config given as --training-config: the prescription is TRL's (its format, its memory plan)."""
    path = tmp_path / "mine.yaml"
    path.write_text("model_name_or_path: google/gemma-3-12b-it\nmax_length: 1024\n")
    m = cli("recommend", G3, "--cache-dir", examples, "--gpu", "L4", "--training-config", path,
            "--format", "json").json()["models"][0]
    assert m["prescription"]["run"]["trainer"]["value"] == "trl-sft"
    assert "model_name_or_path" in yaml.safe_load(m["snippets"]["yaml"])


@pytest.mark.parametrize("value,said", [
    ("trll", "did you mean 'trl'?"),
    ("axolot", "did you mean 'axolotl'?"),
    ("lama-factory", "did you mean 'llama-factory'?"),
    ("unsloth", "use one of: axolotl, trl, transformers, llama-factory"),
])
def test_an_unknown_trainer_is_one_line_and_exit_2(cli, value, said):
    r = cli("recommend", "--family", "gemma3", "--size", "1b", "--gpu", "L4", "--trainer", value)
    assert r.code == 2 and said in r.err and len(r.err.strip().splitlines()) == 1, r.err


@pytest.mark.parametrize("value", ["TRL", "trl_sft", "sft", "Transformers", "hf", "Axolotl", "LLaMA-Factory",
                                   "llamafactory", "lf"])
def test_the_obvious_spellings_are_accepted(cli, value):
    r = cli("recommend", "--family", "gemma3", "--size", "1b", "--gpu", "L4", "--trainer", value, "--format", "json")
    assert r.code == 0, r.err


@pytest.mark.parametrize("trainer", ["trl", "llama-factory"])
@pytest.mark.parametrize("extra", [("--num-gpus", "2"), ("--task", "dpo")])
def test_what_a_trl_config_cannot_state_is_one_line(cli, extra, trainer):
    r = cli("recommend", "--family", "gemma3", "--size", "1b", "--gpu", "L4", "--trainer", trainer, *extra)
    assert r.code == 2 and "--trainer axolotl" in r.err and len(r.err.strip().splitlines()) == 1, r.err


def test_a_sample_of_the_grids_trainer_dimension_passes_its_own_check(cli, examples, tmp_path):
    """benchmarks/prescription_grid.py's trainer-format points (every example, GPU and SFT task for --trainer trl and
    --trainer transformers; 96 points, run in full by the benchmark): a fixed sample, each a prescription that passes
    check under its own trainer (keys its parser accepts, the same memory line) or an honest none with a way out."""
    import sys

    root = Path(__file__).resolve().parent.parent
    sys.path.insert(0, str(root / "benchmarks"))
    try:
        import prescription_grid as grid
    finally:
        sys.path.pop(0)

    def run(*args: str) -> tuple[int, str, str]:
        r = cli(*args)
        return r.code, r.out, r.err

    points = grid.trainer_points(examples)
    sample = [p for p in points if p.gpu in ("L4", "A100") and p.task in ("sft", "qlora")]
    outcomes = [grid.judge_point(run, p, tmp_path) for p in sample]
    assert not [o for o in outcomes if o.kind == "violation"], [o.detail for o in outcomes if o.kind == "violation"]
    prescribed = {o.point.extra[1] for o in outcomes if o.kind == "prescribed"}
    assert prescribed == set(grid.TRAINERS), prescribed


# --- LLaMA-Factory (issue 32) ------------------------------------------------------------------------------------------

def test_llamafactory_bf16_full_fine_tuning_writes_pure_bf16_and_check_plans_bf16_weights(cli, examples, tmp_path):
    """LLaMA-Factory 0.9.5 upcasts full fine-tuning's trainable weights to float32 unless pure_bf16 (model/adapter.py
    init_adapter): the bf16 full fine-tuning recommend prescribes writes it, and check of that YAML plans the same
    memory line with bfloat16 weights; without it check plans float32 weights, another run."""
    args = ("recommend", G3, "--cache-dir", examples, "--gpu", "H200", "--trainer", "llama-factory", "--method", "full")
    r = cli(*args, "--format", "json")
    assert r.code == 0, r.err
    m = r.json()["models"][0]
    data = yaml.safe_load(m["snippets"]["yaml"])
    assert (data["finetuning_type"], data["bf16"], data["pure_bf16"], data["stage"]) == ("full", True, True, "sft")
    path = tmp_path / "lf.yaml"
    path.write_text(m["snippets"]["yaml"])
    code, doc = _check_memory(cli, examples, "H200", path)
    assert code == 0, [f["code"] for f in doc["models"][0]["findings"]]
    assert doc["models"][0]["memory"]["summary"] == m["prescription"]["memory"]
    assert doc["models"][0]["run"]["trainer"]["value"] == "llama-factory"
    data.pop("pure_bf16")
    path.write_text(yaml.safe_dump(data))
    _, upcast = _check_memory(cli, examples, "H200", path)
    assert upcast["models"][0]["memory"]["summary"] != m["prescription"]["memory"]


def test_llamafactory_lora_of_a_multimodal_gemma3_targets_all_and_passes_its_own_check(cli, examples, tmp_path):
    """On an L4 the QLoRA run as LLaMA-Factory's YAML: `lora_target: all` (LF leaves the vision tower out while
    freeze_vision_tower, its default, is on), 4-bit nf4 by quantization_bit, the gemma3 template of a multimodal
    checkpoint; check of it plans the same memory line and flags nothing."""
    args = ("recommend", G3, "--cache-dir", examples, "--gpu", "L4", "--trainer", "llama-factory")
    r = cli(*args, "--format", "json")
    assert r.code == 0, r.err
    m = r.json()["models"][0]
    data = yaml.safe_load(m["snippets"]["yaml"])
    assert (data["finetuning_type"], data["lora_target"], data["quantization_bit"], data["template"]) == \
        ("lora", "all", 4, "gemma3"), data
    path = tmp_path / "lf.yaml"
    path.write_text(m["snippets"]["yaml"])
    code, doc = _check_memory(cli, examples, "L4", path)
    assert code == 0, [f["code"] for f in doc["models"][0]["findings"]]
    assert doc["models"][0]["memory"]["summary"] == m["prescription"]["memory"]


def test_a_target_pattern_is_no_llamafactory_setting(cli, examples, tmp_path):
    """LLaMA-Factory's lora_target holds names or `all`: a user's regex is refused in one line, not written as `all`."""
    path = tmp_path / "mine.json"
    path.write_text('{"use_peft": true, "lora_target_modules": ".*\\\\.(q_proj|v_proj)"}')
    r = cli("recommend", G3, "--cache-dir", examples, "--gpu", "A100", "--training-config", path,
            "--trainer", "llama-factory")
    assert r.code == 2 and "not the pattern" in r.err and len(r.err.strip().splitlines()) == 1, r.err


_LF_PARSE = """
import json, sys, yaml
from transformers import HfArgumentParser
from llamafactory.hparams.parser import _TRAIN_ARGS
out = []
for path in sys.argv[1:]:
    d = yaml.safe_load(open(path))
    d["dataset"] = "identity"
    for k in ("bf16", "tf32"):
        d.pop(k, None)
    m, data, t, f, g = HfArgumentParser(_TRAIN_ARGS).parse_dict(d, allow_extra_keys=False)
    out.append([f.finetuning_type, f.lora_rank, f.lora_target, f.pure_bf16, m.quantization_bit, m.quantization_type,
                m.double_quantization, m.disable_gradient_checkpointing, m.use_reentrant_gc,
                t.per_device_train_batch_size, t.gradient_accumulation_steps, data.cutoff_len, data.template])
print(json.dumps(out))
"""


@pytest.mark.slow
def test_every_key_recommend_writes_is_one_llamafactorys_parser_accepts(cli, examples, tmp_path):
    """LLaMA-Factory 0.9.5's own HfArgumentParser over its five argument classes (hparams/parser.py _TRAIN_ARGS), with
    allow_extra_keys=False, parses the YAML of full, LoRA, QLoRA and 8-bit prescriptions and reads the same run:
    method, rank, targets, quantization, batch, accumulation, cutoff_len, template, checkpointing. (bf16 and tf32 are
    left out of the parse: TrainingArguments refuses them on this CPU; both are its own fields.)"""
    import json
    import os
    import subprocess

    from tests.venvs import ROOT, ensure_llamafactory, subprocess_env

    points = [(G3, "A100", ("--quantization", "4bit")), (G3, "H200", ("--method", "full")),
              (G3, "A100", ()), (G3, "H100", ("--quantization", "8bit"))]
    quantized = [4, None, None, 8]
    paths, runs = [], []
    for n, (model, gpu, extra) in enumerate(points):
        r = cli("recommend", model, "--cache-dir", examples, "--gpu", gpu, "--trainer", "llama-factory", *extra,
                "--format", "json")
        assert r.code == 0, r.err
        m = r.json()["models"][0]
        path = tmp_path / f"lf{n}.yaml"
        path.write_text(m["snippets"]["yaml"])
        paths.append(str(path))
        runs.append(m["prescription"])
    python, packages = ensure_llamafactory()
    done = subprocess.run([str(python), "-c", _LF_PARSE, *paths], capture_output=True, text=True, timeout=600,
                          env=subprocess_env(PYTHONPATH=os.pathsep.join((str(ROOT), str(packages)))))
    assert done.returncode == 0, done.stderr[-3000:]
    for parsed, p, want in zip(json.loads(done.stdout), runs, quantized):
        ftype, rank, target, pure, bits, qtype, double, no_ckpt, reentrant, batch, accumulation, cutoff, template = parsed
        assert ftype == ("full" if p["method"] == "full" else "lora"), (parsed, p)
        assert (batch, accumulation, cutoff) == (p["batch_size"], p["gradient_accumulation_steps"], p["seq_len"])
        assert no_ckpt is not p["gradient_checkpointing"] and (reentrant is False or no_ckpt), parsed
        assert template == "gemma3" and pure is (p["method"] == "full"), parsed
        if p["method"] != "full":
            assert target == ["all"] and rank == 16, parsed
        assert bits == want, parsed
        if bits == 4:
            assert (qtype, double) == ("nf4", True), parsed


@pytest.mark.parametrize("config,extra,said", [
    ("model_name_or_path: google/gemma-3-12b-it\nmax_length: 1024\n", ("--num-gpus", "2"),
     "TRL's format holds one process, the run is on 2 GPUs; your config's trainer was trl-sft"),
    ("model_name_or_path: google/gemma-3-12b-it\nstage: sft\nfinetuning_type: lora\ntemplate: gemma3\n",
     ("--task", "dpo"), "LLaMA-Factory's format holds SFT, LoRA and QLoRA, not dpo; your config's trainer was llama-factory"),
])
def test_a_fallback_from_the_configs_trainer_to_axolotl_is_said_in_text_and_json(cli, examples, tmp_path, config,
                                                                                 extra, said):
    """The user's --training-config names a trainer whose format cannot state the prescribed run (one process, SFT):
    the run is written as axolotl's YAML, and the trainer line and JSON's prescription say why, naming the user's
    trainer. On main the prescription fell back to axolotl without a word."""
    path = tmp_path / "mine.yaml"
    path.write_text(config)
    args = ("recommend", G3, "--cache-dir", examples, "--gpu", "A100", "--training-config", path, *extra)
    text = cli(*args)
    assert text.code == 0, text.err
    line = next(line.strip() for line in text.out.splitlines() if line.strip().startswith("trainer "))
    assert line == f"trainer axolotl: the run as axolotl's YAML ({said})", line
    p = cli(*args, "--format", "json").json()["models"][0]["prescription"]
    assert p["trainer_fallback"] == said and p["run"]["trainer"]["value"] == "axolotl"


def test_no_fallback_is_said_where_the_configs_trainer_writes_the_run(cli, examples, tmp_path):
    path = tmp_path / "mine.yaml"
    path.write_text("model_name_or_path: google/gemma-3-12b-it\nmax_length: 1024\n")
    p = cli("recommend", G3, "--cache-dir", examples, "--gpu", "A100", "--training-config", path,
            "--format", "json").json()["models"][0]["prescription"]
    assert p["trainer_fallback"] is None and p["run"]["trainer"]["value"] == "trl-sft"
    p = cli("recommend", G3, "--cache-dir", examples, "--gpu", "A100", "--num-gpus", "2", "--format",
            "json").json()["models"][0]["prescription"]
    assert p["trainer_fallback"] is None
