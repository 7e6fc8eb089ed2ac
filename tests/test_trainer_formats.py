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
    """A TRL config given as --training-config: the prescription is TRL's (its format, its memory plan). (These
    configs say their method: without use_peft TRL trains every weight, which check plans; Gemma 3 12B fits an L4 with
    QLoRA alone, the method the search chose where the config named none.)"""
    path = tmp_path / "mine.yaml"
    path.write_text("model_name_or_path: google/gemma-3-12b-it\nmax_length: 1024\nuse_peft: true\nload_in_4bit: true\n")
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


@pytest.mark.parametrize("trainer,extra", [("trl", ("--num-gpus", "2")), ("trl", ("--task", "grpo")),
                                           ("llama-factory", ("--num-gpus", "2")), ("llama-factory", ("--task", "dpo")),
                                           ("transformers", ("--task", "dpo"))])
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
    sample = [p for p in points if p.gpu in ("L4", "A100") and p.task in ("sft", "qlora", "dpo")]
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
    ("model_name_or_path: google/gemma-3-12b-it\nmax_length: 1024\nuse_peft: true\n", ("--num-gpus", "2"),
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
    path.write_text("model_name_or_path: google/gemma-3-12b-it\nmax_length: 1024\nuse_peft: true\n")
    p = cli("recommend", G3, "--cache-dir", examples, "--gpu", "A100", "--training-config", path,
            "--format", "json").json()["models"][0]["prescription"]
    assert p["trainer_fallback"] is None and p["run"]["trainer"]["value"] == "trl-sft"
    p = cli("recommend", G3, "--cache-dir", examples, "--gpu", "A100", "--num-gpus", "2", "--format",
            "json").json()["models"][0]["prescription"]
    assert p["trainer_fallback"] is None


# --- TRL's DPOTrainer (issue 32) ----------------------------------------------------------------------------------------

def test_trl_dpo_is_a_trl_dpo_config_and_check_plans_it_as_that_dpo_run_without_task(cli, examples, tmp_path):
    """`recommend --trainer trl --task dpo` writes a `trl dpo --config` YAML (DPOConfig's beta and loss_type, max_length,
    ModelConfig's LoRA keys), which check reads as TRL's DPOTrainer's run and plans at the same memory line with no
    --task: the config names its task. On main the run fell back to axolotl's YAML."""
    args = ("recommend", G3, "--cache-dir", examples, "--gpu", "A100", "--trainer", "trl", "--task", "dpo")
    text = cli(*args)
    assert text.code == 0, text.err
    assert "trainer trl: the run as a `trl dpo --config` YAML (TRL's DPOTrainer)" in text.out, text.out
    m = cli(*args, "--format", "json").json()["models"][0]
    p = m["prescription"]
    assert p["run"]["trainer"]["value"] == "trl-dpo" and p["trainer_fallback"] is None, p
    data = yaml.safe_load(m["snippets"]["yaml"])
    assert m["snippets"]["yaml"].startswith("# trl dpo --config THIS_FILE"), m["snippets"]["yaml"][:200]
    assert (data["beta"], data["loss_type"], data["max_length"], data["per_device_train_batch_size"]) == \
        (0.1, ["sigmoid"], p["seq_len"], p["batch_size"]), data
    assert "rl" not in data and "base_model" not in data
    path = tmp_path / "dpo.yaml"
    path.write_text(m["snippets"]["yaml"])
    code, doc = _check_memory(cli, examples, "A100", path)
    assert code == 0, [f["code"] for f in doc["models"][0]["findings"]]
    model = doc["models"][0]
    assert model["run"]["trainer"]["value"] == "trl-dpo", model["run"]
    assert any(a.startswith("dpo: chosen and rejected") for a in model["memory"]["assumptions"]), model["memory"]
    assert model["memory"]["summary"] == p["memory"] == _memory_line(text.out).removeprefix("memory ")


def test_check_of_an_axolotl_dpo_yaml_plans_the_dpo_run_without_task(cli, examples, tmp_path):
    """axolotl's `rl: dpo` YAML (recommend --task dpo) read by check without --task: the paired DPO run recommend
    planned (33.2 GiB on an A100), not an SFT run of it (29.3 GiB on main)."""
    args = ("recommend", G3, "--cache-dir", examples, "--gpu", "A100", "--task", "dpo", "--format", "json")
    m = cli(*args).json()["models"][0]
    assert yaml.safe_load(m["snippets"]["yaml"])["rl"] == "dpo"
    path = tmp_path / "axolotl-dpo.yaml"
    path.write_text(m["snippets"]["yaml"])
    code, doc = _check_memory(cli, examples, "A100", path)
    assert code == 0, [f["code"] for f in doc["models"][0]["findings"]]
    assert doc["models"][0]["memory"]["summary"] == m["prescription"]["memory"]
    assert any(a.startswith("dpo: chosen and rejected") for a in doc["models"][0]["memory"]["assumptions"])


def test_a_users_trl_dpo_config_gets_trls_dpo_format(cli, examples, tmp_path):
    """A `trl dpo` config given as --training-config (its own keys say DPOConfig): the prescription is TRL's DPOTrainer's
    run in its format, with no fallback to axolotl and no --task."""
    path = tmp_path / "mine.yaml"
    path.write_text("model_name_or_path: google/gemma-3-12b-it\nbeta: 0.1\nloss_type: [sigmoid]\nmax_length: 1024\n"
                    "use_peft: true\n")
    m = cli("recommend", G3, "--cache-dir", examples, "--gpu", "A100", "--training-config", path,
            "--format", "json").json()["models"][0]
    assert m["prescription"]["run"]["trainer"]["value"] == "trl-dpo" and m["prescription"]["trainer_fallback"] is None
    assert yaml.safe_load(m["snippets"]["yaml"])["beta"] == 0.1


@pytest.mark.slow
def test_every_key_of_trls_sft_and_dpo_configs_is_one_trls_parser_accepts(cli, examples, tmp_path):
    """TRL 1.16's own TrlParser, as `trl sft|dpo --config` builds it (trl/scripts/sft.py, dpo.py: ScriptArguments, the
    trainer's config, ModelConfig, DatasetMixtureConfig), refusing unknown keys (fail_with_unknown_args), parses the
    YAML of SFT and DPO prescriptions (LoRA, QLoRA, full) and reads the same run: batch, accumulation, max_length,
    checkpointing, beta and loss type, LoRA rank. (bf16 is written false and tf32 left out: TrainingArguments refuses
    both on this CPU.)"""
    trl = pytest.importorskip("trl")
    from trl import DPOConfig, ModelConfig, ScriptArguments, SFTConfig, TrlParser
    from trl.scripts.utils import DatasetMixtureConfig

    if trl.__version__ != "1.16.0":
        pytest.skip(f"the formats are TRL 1.16.0's, not {trl.__version__}'s")
    points = [("sft", "A100", ()), ("dpo", "A100", ()), ("dpo", "A100", ("--quantization", "4bit")),
              ("dpo", "H200", ("--method", "full"))]
    for n, (task, gpu, extra) in enumerate(points):
        r = cli("recommend", G3, "--cache-dir", examples, "--gpu", gpu, "--trainer", "trl", "--task", task, *extra,
                "--format", "json")
        assert r.code == 0, r.err
        m = r.json()["models"][0]
        p = m["prescription"]
        data = yaml.safe_load(m["snippets"]["yaml"])
        data.pop("tf32", None)
        data.update(bf16=False, use_cpu=True)
        path = tmp_path / f"trl{n}.yaml"
        path.write_text(yaml.safe_dump(data))
        config = DPOConfig if task == "dpo" else SFTConfig
        parser = TrlParser((ScriptArguments, config, ModelConfig, DatasetMixtureConfig))
        _, args, model, _ = parser.parse_args_and_config(
            args=["--config", str(path), "--dataset_name", "d"], fail_with_unknown_args=True)
        checkpointing = getattr(args, "activation_checkpointing", None) or args.gradient_checkpointing
        assert (args.per_device_train_batch_size, args.gradient_accumulation_steps, args.max_length,
                bool(checkpointing)) == (p["batch_size"], p["gradient_accumulation_steps"], p["seq_len"],
                                         p["gradient_checkpointing"]), (task, data)
        assert model.use_peft is (p["method"] != "full") and model.dtype == p["load_dtype"], (task, data)
        if p["method"] != "full":
            assert model.lora_r == p["lora"]["r"], data
        assert model.load_in_4bit is (p["method"] == "qlora"), data
        if task == "dpo":
            assert (args.beta, list(args.loss_type)) == (0.1, ["sigmoid"]), data


# --- LLaMA-Factory's views, each format's command, the TrainingArguments format's sequence (issue 32) ------------------

def _run_exp_keys(code: str) -> dict:
    """The mapping a `run_exp(dict(...))` snippet passes, read by Python's own parser (never executed)."""
    import ast

    call = next(n for n in ast.walk(ast.parse(code)) if isinstance(n, ast.Call) and getattr(n.func, "id", "") == "dict")
    return {k.arg: ast.literal_eval(k.value) for k in call.keywords}


def test_llamafactorys_views_are_its_yaml_its_run_exp_and_its_command(cli, examples):
    """A LLaMA-Factory prescription's Python is LLaMA-Factory's own API over the very keys of its YAML
    (llamafactory.train.tuner.run_exp takes the mapping `llamafactory-cli train` reads from the file), and its command
    is `llamafactory-cli train run.yaml dataset=...`; no transformers / PEFT / Unsloth code, which is another trainer's
    run. On main the snippets were TrainingArguments', the loading code and PEFT's."""
    args = ("recommend", G3, "--cache-dir", examples, "--gpu", "L4", "--trainer", "llama-factory")
    m = cli(*args, "--format", "json").json()["models"][0]
    snippets = m["snippets"]
    assert set(snippets["python"]) == {"llama-factory"}, list(snippets["python"])
    code = snippets["python"]["llama-factory"]
    assert "from llamafactory.train.tuner import run_exp" in code
    assert _run_exp_keys(code) == {**yaml.safe_load(snippets["yaml"]), "dataset": "YOUR_DATASET"}
    assert snippets["command"] == "llamafactory-cli train run.yaml dataset=YOUR_DATASET"
    text = cli(*args).out
    assert "start it: llamafactory-cli train run.yaml dataset=YOUR_DATASET" in text and "TrainingArguments(" not in text
    python = cli(*args, "--format", "python").out
    assert "run_exp(dict(" in python and "from_pretrained" not in python
    compile(python, "recommend.py", "exec")  # the python view stays paste-able Python


@pytest.mark.parametrize("trainer,extra,command", [
    ("axolotl", (), "axolotl train run.yaml"),
    ("trl", (), "trl sft --config run.yaml --dataset_name YOUR_DATASET"),
    ("trl", ("--task", "dpo"), "trl dpo --config run.yaml --dataset_name YOUR_PREFERENCE_DATASET"),
    ("transformers", (), None),
    ("llama-factory", (), "llamafactory-cli train run.yaml dataset=YOUR_DATASET"),
])
def test_each_format_names_the_command_that_starts_it(cli, examples, trainer, extra, command):
    """JSON's snippets.command and the text view's "start it:" are the trainer's own CLI over the YAML saved as
    run.yaml; a TrainingArguments file is read by the user's own script (null)."""
    args = ("recommend", G3, "--cache-dir", examples, "--gpu", "A100", "--trainer", trainer, *extra)
    m = cli(*args, "--format", "json").json()["models"][0]
    assert m["snippets"]["command"] == command
    line = next(x for x in cli(*args).out.splitlines() if "the run as" in x and "start it:" in x)
    assert line.endswith(f"start it: {command}" if command else "start it: your training script, tokenizing to "
                         f"{m['prescription']['seq_len']} tokens"), line


def test_a_trainingarguments_prescription_is_planned_at_the_sequence_its_check_command_names(cli, examples, tmp_path):
    """The TrainingArguments format has no key for the sequence: its YAML's head, the text view and the Python snippet
    name `--seq-len N` (and where the script tokenizes to N), and the prescription is planned as check plans that YAML
    with it. On main `recommend --seq-len 2048 --trainer transformers` printed a memory line of 1024 tokens (the YAML
    read back without the option) beside a head saying 2048."""
    args = ("recommend", G3, "--cache-dir", examples, "--gpu", "A100", "--trainer", "transformers", "--seq-len", "2048")
    m = cli(*args, "--format", "json").json()["models"][0]
    p = m["prescription"]
    assert p["seq_len"] == 2048 and "x 2048 tokens" in p["memory"], p["memory"]
    assert "check --training-config THIS_FILE --seq-len 2048" in m["snippets"]["yaml"]
    assert "max_length=2048" in m["snippets"]["python"]["transformers"]
    assert "(check --training-config run.yaml --seq-len 2048 reads it)" in cli(*args).out
    path = tmp_path / "run.yaml"
    path.write_text(m["snippets"]["yaml"])
    code, doc = _check_memory(cli, examples, "A100", path, "--seq-len", "2048")
    assert code == 0, [f["code"] for f in doc["models"][0]["findings"]]
    assert doc["models"][0]["memory"]["summary"] == p["memory"]
    assert doc["models"][0]["run"]["seq_len"]["value"] == 2048


def test_v100_dpo_the_way_out_names_trls_dpotrainer_and_following_it_passes_check(cli, examples, tmp_path):
    """On a V100 axolotl's DPO run of gemma-3-12b-it does not fit; TRL's DPOTrainer holds no full logits (TRL >= 1.15):
    the way out names `--trainer trl` with its figure, and that command's `trl dpo` YAML passes check at that figure.
    On main a DPO run had no trainer line in its way out (TRL's format did not state DPO)."""
    r = cli("recommend", G3, "--cache-dir", examples, "--gpu", "V100", "--task", "dpo", "--format", "json")
    assert r.code == 1
    way = r.json()["models"][0]["way_out"]
    line = next((w for w in way if w.startswith("--trainer trl (its run: TRL's DPOTrainer")), None)
    assert line is not None, way
    args = ("recommend", G3, "--cache-dir", examples, "--gpu", "V100", "--task", "dpo", "--trainer", "trl")
    followed = cli(*args, "--format", "json")
    assert followed.code == 0, followed.err
    m = followed.json()["models"][0]
    assert line.endswith(m["prescription"]["memory"]), (line, m["prescription"]["memory"])
    path = tmp_path / "v100-dpo.yaml"
    path.write_text(m["snippets"]["yaml"])
    code, doc = _check_memory(cli, examples, "V100", path)
    assert code == 0, [f["code"] for f in doc["models"][0]["findings"]]
    assert doc["models"][0]["memory"]["summary"] == m["prescription"]["memory"]


def test_a_trl_dpo_launch_line_plans_the_dpo_run_of_its_config(cli, examples, tmp_path):
    """`check --launch "trl dpo --config FILE"`: the launch line names TRL's DPOTrainer, so the file (here without
    DPOConfig's own keys, which alone would read as `trl sft`) is planned as the paired DPO run, with no --task, at the
    memory line recommend prescribed for it."""
    m = cli("recommend", G3, "--cache-dir", examples, "--gpu", "A100", "--trainer", "trl", "--task", "dpo",
            "--format", "json").json()["models"][0]
    data = yaml.safe_load(m["snippets"]["yaml"])
    for key in ("beta", "loss_type"):
        data.pop(key)
    path = tmp_path / "args.yaml"
    path.write_text(yaml.safe_dump(data))
    r = cli("check", G3, "--cache-dir", examples, "--gpu", "A100", "--launch", f"trl dpo --config {path}",
            "--format", "json")
    model = r.json()["models"][0]
    assert model["run"]["trainer"]["value"] == "trl-dpo", model["run"]["trainer"]
    assert model["memory"]["summary"] == m["prescription"]["memory"]


# --- One renderer per trainer format, each rendering the run's Settings (issue 32) -----------------------------------

def test_every_trainer_format_is_one_registered_renderer():
    """recommend --trainer's formats are one interface (recommend.TrainerFormat) in one registry (FORMATS), in
    TRAINER_FORMATS' order; the kind check's reader recognises and the tasks each writes come from it."""
    from gemma_doctor.plan import recommend

    assert tuple(recommend.FORMATS) == recommend.TRAINER_FORMATS
    assert all(isinstance(f, recommend.TrainerFormat) and f.name == name for name, f in recommend.FORMATS.items())
    assert recommend.FORMAT_KINDS == {"axolotl": "axolotl", "trl": "transformers", "transformers": "transformers",
                                      "llama-factory": "llama-factory"}
    assert recommend.FORMAT_TASKS["axolotl"] == frozenset(recommend.TASKS)
    assert recommend.FORMAT_TASKS["trl"] == frozenset(recommend.TRL_TASKS)


def _decided(trainer: str, task: str = "sft", **settings):
    from gemma_doctor.plan import recommend
    from gemma_doctor.run import Settings

    run = Settings(**{"method": "lora", "batch_size": 2, "gradient_accumulation_steps": 4, "seq_len": 1024,
                      "gradient_checkpointing": True, **settings})
    return recommend.decide(recommend.Inputs(family="gemma3", gpu_native_bf16=True, gpu_label="A100", task=task,
                                             model_id=G3, nested=True, settings=run, trainer=trainer,
                                             versions={"transformers": "5.23.0", "trl": "1.16.0"}))


@pytest.mark.parametrize("trainer,task,settings", [
    ("trl", "sft", {}), ("trl", "sft", {"method": "qlora", "quant_bits": 4}), ("trl", "dpo", {"method": "full"}),
    ("transformers", "sft", {"method": "qlora", "quant_bits": 8, "attention": "eager"}),
    ("llama-factory", "sft", {"method": "qlora", "quant_bits": 4, "lora_targets": ("q_proj", "v_proj")}),
    ("llama-factory", "sft", {"method": "full", "gradient_checkpointing": False, "optimizer": "adamw_8bit",
                              "attention": "eager"}),
])
def test_trl_transformers_and_llamafactory_formats_render_the_runs_settings_not_axolotls_keys(trainer, task, settings):
    """TRL's, TrainingArguments' and LLaMA-Factory's YAML are rendered from the run's Settings (with the precision
    decision), not from axolotl's rendering of them: with axolotl's keys gone the format is the same, and it states the
    Settings' batch, accumulation, sequence, checkpointing and LoRA rank. On main they read axolotl's keys
    (`frameworks["axolotl"]`: a KeyError without them)."""
    from gemma_doctor import frozen
    from gemma_doctor.plan import recommend

    rec = _decided(trainer, task, lora_r=8, **settings)
    keys = recommend.format_mapping(rec)
    bare = frozen.replace(rec, frameworks={k: v for k, v in rec.frameworks.items() if k != "axolotl"})
    assert recommend.format_mapping(bare) == keys
    assert recommend.training_config_yaml(bare) == recommend.training_config_yaml(rec)
    run = rec.given.settings
    lf = trainer == "llama-factory"
    assert (keys["per_device_train_batch_size"], keys["gradient_accumulation_steps"]) == (2, 4)
    if lf:
        assert (keys["cutoff_len"], keys["finetuning_type"]) == (1024, "full" if run.method == "full" else "lora")
        assert keys.get("use_reentrant_gc") is (False if run.gradient_checkpointing else None)
        assert keys.get("disable_gradient_checkpointing") is (None if run.gradient_checkpointing else True)
    elif trainer == "trl":
        assert keys["max_length"] == 1024 and keys["model_name_or_path"] == G3
    if run.method != "full":
        assert keys["lora_rank" if lf else "lora_r"] == 8


def test_axolotls_dpo_is_planned_with_the_full_logits_on_a_stack_whose_trl_chunks_dpo(cli, examples, tmp_path):
    """axolotl 0.19.0 runs DPO through AxolotlDPOTrainer, TRL's DPOTrainer with no log-prob code of its own, under the
    TRL it requires (trl==1.9.0), which holds the whole logits; with TRL 1.16 its DPO config does not import
    (benchmarks/axolotl_dpo_logits.py, docs/memory.md). So check of axolotl's `rl: dpo` YAML plans chosen and rejected
    rows' b x s x V logits (12 bytes each) even on the test stack, whose TRL 1.16 chunks its own DPOTrainer's: axolotl
    is not a chunking trainer (trainers.CHUNKING_TRAINERS). A guard: the plan was so before this was read."""
    from gemma_doctor.trainers import CHUNKING_TRAINERS, Trainer

    assert Trainer.AXOLOTL not in CHUNKING_TRAINERS
    m = cli("recommend", G3, "--cache-dir", examples, "--gpu", "A100", "--task", "dpo",
            "--format", "json").json()["models"][0]
    path = tmp_path / "axolotl-dpo.yaml"
    path.write_text(m["snippets"]["yaml"])
    _, doc = _check_memory(cli, examples, "A100", path)
    memory = doc["models"][0]["memory"]
    run = memory["run"]
    assert doc["models"][0]["run"]["trainer"]["value"] == "axolotl" and run["task"] == "dpo", run
    assert run["chunked_loss"] is False, run
    assert memory["components"]["logits"] == 2 * run["batch_size"] * run["seq_len"] * 262_144 * 12, memory["components"]


def test_trls_grpoconfig_states_no_prompt_length_so_recommend_writes_no_trl_grpo_config(cli):
    """Why `--trainer trl --task grpo` stays one line naming axolotl (docs/decision.md): TRL 1.16's GRPOConfig bounds
    the completion (max_completion_length) and not the prompt (no max_prompt_length: the trainer truncates no prompt),
    so a `trl grpo` YAML cannot state the run's sequence, and check reading it back could not plan it. A TRL that
    brings a prompt bound back fails here: the format can then be written."""
    import dataclasses

    trl = pytest.importorskip("trl")
    if trl.__version__ != "1.16.0":
        pytest.skip(f"read in TRL 1.16.0, not {trl.__version__}")
    fields = {f.name for f in dataclasses.fields(trl.GRPOConfig)}
    assert {"max_completion_length", "num_generations", "use_vllm"} <= fields
    assert not {f for f in fields if "prompt" in f and "length" in f}, fields
    r = cli("recommend", "--family", "gemma3", "--size", "12b", "--gpu", "A100", "--trainer", "trl", "--task", "grpo")
    assert r.code == 2 and "--task grpo is prescribed as axolotl's YAML (--trainer axolotl)" in r.err, r.err
