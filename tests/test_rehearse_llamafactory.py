"""`rehearse TARGET --launch "llamafactory-cli train cfg.yaml"`: LLaMA-Factory's own train on the twin, through its own
CLI, in a venv of its own stack (tests/venvs.py: ensure_llamafactory; LLaMA-Factory 0.9.5, transformers 5.6.0, TRL
0.24.0, PEFT 0.18.1, datasets 4.0.0, accelerate 1.11.0), the Trainer probe armed in its process.

Two children, the twin built once and kept for the second (GEMMA_DOCTOR_TWIN_CACHE): the reported failure
(LlamaFactory#7427 / #9671: the gemma3 template on a text-only Gemma 3 asks for a processor), met by LLaMA-Factory's
own code, and a healthy LoRA SFT config with a local ShareGPT dataset and evaluation, which must rehearse clean. The
copy of the user's YAML is tested on plain data, without a child.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from gemma_doctor.errors import UsageError
from gemma_doctor.rehearse import llamafactory
from tests.test_rehearse import model_folder
from tests.venvs import ROOT, ensure_llamafactory, subprocess_env

REPO = "google/tiny-gemma3_text"  # model_folder's folder google--tiny-gemma3_text names this repo id
# LLaMA-Factory's own example (examples/train_lora/llama3_lora_sft.yaml) for Gemma 3, as a user writes it.
LORA_SFT = f"""\
model_name_or_path: {REPO}
stage: sft
do_train: true
finetuning_type: lora
lora_rank: 8
lora_target: all
dataset: alpaca_en_demo
template: gemma3
cutoff_len: 256
max_samples: 1000
preprocessing_num_workers: 16
output_dir: saves/gemma3-1b/lora/sft
logging_steps: 10
save_steps: 500
plot_loss: true
overwrite_output_dir: true
per_device_train_batch_size: 2
gradient_accumulation_steps: 2
learning_rate: 1.0e-4
num_train_epochs: 3.0
lr_scheduler_type: cosine
warmup_ratio: 0.1
bf16: true
"""


# -- the launch line and the copy of the YAML (no child) --------------------------------------------------------------
@pytest.mark.parametrize("line, found", [
    ("llamafactory-cli train cfg.yaml", ("cfg.yaml", [])),
    ("/opt/venv/bin/llamafactory-cli train examples/lora.yml learning_rate=1e-5", ("examples/lora.yml",
                                                                                   ["learning_rate=1e-5"])),
    ("lmf train cfg.json", ("cfg.json", [])),
    ("python train.py", None),
    ("trl sft --config sft.yaml", None),
])
def test_a_llamafactory_train_line_names_its_config_and_overrides(line, found):
    got = llamafactory.config_of(line)
    assert (None if got is None else (str(got[0]), got[1])) == found


@pytest.mark.parametrize("line", ["llamafactory-cli webui", "llamafactory-cli train", "llamafactory-cli train --help"])
def test_a_llamafactory_line_that_trains_nothing_is_one_line(line):
    with pytest.raises(UsageError, match="--launch"):
        llamafactory.config_of(line)


def test_without_llamafactory_installed_the_rehearsal_names_it_and_runs_nothing(tmp_path, cli, monkeypatch):
    # The project's own venv holds no LLaMA-Factory: GD950, as for any library the run needs, and no child.
    (tmp_path / "cfg.yaml").write_text(LORA_SFT)
    monkeypatch.chdir(tmp_path)
    got = cli("rehearse", model_folder(tmp_path, "gemma3_text"), "--launch", "llamafactory-cli train cfg.yaml",
              "--format", "json")
    assert got.code == 1
    doc = got.json()["rehearsals"][0]
    [f] = doc["findings"]
    assert f["code"] == "GD950" and "LLaMA-Factory is not installed" in f["message"], f
    assert doc["stages"] == [] and doc["repo_id"] == REPO


def test_the_copy_replaces_only_what_the_rehearsal_owns_and_says_each(tmp_path):
    (tmp_path / "cfg.yaml").write_text(LORA_SFT + "quantization_bit: 4\nflash_attn: fa2\ndeepspeed: ds_z3.json\n"
                                       "optim: paged_adamw_8bit\nresume_from_checkpoint: saves/ckpt\n")
    path, notes = llamafactory.copy_config(Path("cfg.yaml"), tmp_path / "out", 2, REPO, tmp_path)
    import yaml

    copy = yaml.safe_load(path.read_text())
    user = yaml.safe_load(LORA_SFT)
    kept = {k: v for k, v in user.items() if k not in ("max_samples", "preprocessing_num_workers", "output_dir",
                                                        "plot_loss")}
    assert {k: copy[k] for k in kept} == kept  # every other key as the user wrote it
    assert (copy["max_steps"], copy["output_dir"], copy["max_samples"]) == (2, "llamafactory-output", 8)
    assert copy["flash_attn"] == "sdpa" and copy["optim"] == "adamw_torch"
    for gone in ("quantization_bit", "deepspeed", "resume_from_checkpoint", "plot_loss", "preprocessing_num_workers"):
        assert gone not in copy and any(n.startswith(f"{gone}:") for n in notes), (gone, notes)
    info = json.loads((tmp_path / "out" / "llamafactory" / "dataset_info.json").read_text())
    rows = json.loads(Path(info["alpaca_en_demo"]["file_name"]).read_text())
    assert len(rows) == 8 and set(rows[0]) == {"instruction", "input", "output"}
    assert any("alpaca_en_demo (not in any dataset_info.json found): 8 synthetic rows" in n for n in notes)


def test_a_local_dataset_keeps_its_rows_and_a_hub_one_gets_rows_in_its_format(tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    (data / "chat.json").write_text("[]")
    tags = {"role_tag": "role", "content_tag": "content", "user_tag": "user", "assistant_tag": "assistant"}
    shape = {"formatting": "sharegpt", "columns": {"messages": "messages"}, "tags": tags}
    (data / "dataset_info.json").write_text(json.dumps({"mine": {"file_name": "chat.json", **shape},
                                                        "hub": {"hf_hub_url": "org/chat", **shape}}))
    (tmp_path / "cfg.yaml").write_text(LORA_SFT.replace("alpaca_en_demo", "mine,hub") + "dataset_dir: data\n")
    _, notes = llamafactory.copy_config(Path("cfg.yaml"), tmp_path / "out", 3, REPO, tmp_path)
    info = json.loads((tmp_path / "out" / "llamafactory" / "dataset_info.json").read_text())
    assert info["mine"]["file_name"] == str(data / "chat.json")
    [row] = json.loads(Path(info["hub"]["file_name"]).read_text())[:1]
    assert [m["role"] for m in row["messages"]] == ["user", "assistant"]
    assert "hf_hub_url" not in info["hub"]
    assert any(n.startswith("dataset hub (a hub dataset)") for n in notes), notes


@pytest.mark.parametrize("stage, pairs", [("rm", True), ("dpo", True), ("sft", False)])
def test_an_unseen_dataset_of_a_pairwise_stage_gets_pairs_with_their_columns_named(tmp_path, stage, pairs):
    """LLaMA-Factory's own demo datasets (dpo_en_demo) live in its repo's data/ folder, not beside a user's config.
    Before, the rehearsal wrote plain alpaca rows for them, and LLaMA-Factory 0.9.5 refused the rm stage ("The dataset
    is not applicable in the current training stage": a false alarm); ranking rows whose entry names no chosen /
    rejected columns then stopped in its formatter (KeyError: None). Both met through `llamafactory-cli train`."""
    (tmp_path / "cfg.yaml").write_text(LORA_SFT.replace("stage: sft", f"stage: {stage}")
                                       .replace("alpaca_en_demo", "dpo_en_demo"))
    _, notes = llamafactory.copy_config(Path("cfg.yaml"), tmp_path / "out", 3, REPO, tmp_path)
    entry = json.loads((tmp_path / "out" / "llamafactory" / "dataset_info.json").read_text())["dpo_en_demo"]
    row = json.loads(Path(entry["file_name"]).read_text())[0]
    if pairs:
        assert entry["ranking"] is True and entry["columns"] == {"chosen": "chosen", "rejected": "rejected"}
        assert set(row) == {"instruction", "input", "chosen", "rejected"}
        assert any("(alpaca, ranking)" in n for n in notes), notes
    else:
        assert "ranking" not in entry and set(row) == {"instruction", "input", "output"}


def test_a_broken_dataset_info_or_max_samples_ends_in_synthetic_rows_not_a_traceback(tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    (data / "dataset_info.json").write_text(json.dumps({
        "odd": {"file_name": "a\u0000b.json", "formatting": "sharegpt", "columns": ["messages"], "tags": {"x": [1]}}}))
    (tmp_path / "cfg.yaml").write_text(LORA_SFT.replace("alpaca_en_demo", "odd").replace("max_samples: 1000",
                                                                                          "max_samples: many"))
    path, notes = llamafactory.copy_config(Path("cfg.yaml"), tmp_path / "out", 3, REPO, tmp_path)
    info = json.loads((tmp_path / "out" / "llamafactory" / "dataset_info.json").read_text())
    assert info["odd"]["formatting"] == "sharegpt" and "columns" not in info["odd"]
    assert set(json.loads(Path(info["odd"]["file_name"]).read_text())[0]) == {"conversations"}
    assert "max_samples: 8" in path.read_text()
    (tmp_path / "long.yaml").write_text(LORA_SFT + f"dataset_dir: {'d' * 5000}\n")  # past any file name's length
    path, notes = llamafactory.copy_config(Path("long.yaml"), tmp_path / "out2", 3, REPO, tmp_path)
    assert any("(not in any dataset_info.json found)" in n for n in notes), notes


def test_unchanged_parameters_are_not_judged_where_the_learning_rate_was_0_at_every_step():
    """`--steps 1` with LLaMA-Factory's example (warmup_ratio 0.1, so the one step is warm-up at rate 0) left every
    parameter of the 262k-vocabulary Gemma 3 twin unchanged: GD969 and GD970 on a healthy run, before."""
    from gemma_doctor.rehearse.invariants import judge_train

    record = {"losses": [12.56], "grad_norms": [2.293], "trainable": 84, "moved": 0,
              "lora_b": {"count": 42, "moved": 0}}
    assert [f.code for f in judge_train({**record, "learning_rates": [0.0]})] == []
    assert [f.code for f in judge_train({**record, "learning_rates": [0.0, 1e-4]})] == ["GD969", "GD970"]
    assert [f.code for f in judge_train(record)] == ["GD969", "GD970"]  # the driver records no rate


@pytest.mark.parametrize("name", ["missing.yaml", "d" * 5000 + ".yaml"])
def test_a_config_that_cannot_be_read_is_one_line(tmp_path, cli, monkeypatch, name):
    monkeypatch.chdir(tmp_path)
    got = cli("rehearse", model_folder(tmp_path, "gemma3_text"), "--launch", f"llamafactory-cli train {name}")
    assert got.code == 2 and len(got.err.strip().splitlines()) == 1, got.err
    with pytest.raises(UsageError, match="is not a file"):
        llamafactory.copy_config(Path(name), tmp_path / "out", 3, REPO, tmp_path)


# -- LLaMA-Factory's own train on the twin ----------------------------------------------------------------------------
@pytest.fixture(scope="module")
def factory(tmp_path_factory) -> tuple[Path, dict[str, str]]:
    """(the venv's python, its environment: this tree and LLaMA-Factory on PYTHONPATH, the module's kept twins)."""
    python, packages = ensure_llamafactory()
    twins = tmp_path_factory.mktemp("twins")
    return python, subprocess_env(PYTHONPATH=os.pathsep.join((str(ROOT), str(packages))),
                                  GEMMA_DOCTOR_TWIN_CACHE=str(twins))


def rehearse(factory, folder: Path, config: Path) -> tuple[int, dict]:
    python, env = factory
    done = subprocess.run([str(python), "-m", "gemma_doctor", "rehearse", str(folder), "--launch",
                           f"llamafactory-cli train {config.name}", "--format", "json"], cwd=config.parent,
                          capture_output=True, text=True, timeout=900, env=env)
    assert done.returncode in (0, 1), done.stderr[-3000:]
    return done.returncode, json.loads(done.stdout)["rehearsals"][0]


@pytest.mark.slow
def test_the_gemma3_template_on_a_text_only_gemma3_stops_in_llamafactory_before_training(tmp_path, factory):
    """LlamaFactory#7427 / #9671, met by LLaMA-Factory 0.9.5's own code: its gemma3 template carries the multimodal
    plugin, which asks a text-only checkpoint (no processor files) for a processor while the rows are tokenized."""
    (tmp_path / "lf.yaml").write_text(LORA_SFT)
    code, doc = rehearse(factory, model_folder(tmp_path, "gemma3_text"), tmp_path / "lf.yaml")
    assert code == 1
    assert doc["stack"]["transformers"] == "5.6.0" and doc["trainer"] == "script"
    [f] = doc["findings"]
    assert f["code"] == "GD956" and "Processor was not found" in f["message"], f
    assert f["details"]["catalogue"] == "llamafactory-gemma3-template-text-only"
    assert "template: gemma" in f["fix"]
    assert [(s["stage"], s["status"]) for s in doc["stages"]] == [("twin", "ok"), ("script", "error")]


@pytest.mark.slow
def test_a_healthy_llamafactory_lora_sft_run_rehearses_clean(tmp_path, factory):
    """The text template, the user's local ShareGPT rows (the first 8), evaluation on a split of them: LLaMA-Factory's
    trainer trains, evaluates and saves an adapter that reloads onto the twin with the same logits."""
    data = tmp_path / "data"
    data.mkdir()
    rows = [{"conversations": [{"from": "human", "value": f"What is {i} + {i}?"},
                               {"from": "gpt", "value": f"{i} + {i} = {2 * i}."}]} for i in range(20)]
    (data / "chat.json").write_text(json.dumps(rows))
    (data / "dataset_info.json").write_text(json.dumps({"chat": {"file_name": "chat.json", "formatting": "sharegpt"}}))
    config = LORA_SFT.replace("template: gemma3", "template: gemma").replace("alpaca_en_demo", "chat")
    (tmp_path / "lf.yaml").write_text(config + "dataset_dir: data\nval_size: 0.25\neval_strategy: steps\n"
                                      "eval_steps: 100\nper_device_eval_batch_size: 2\n")
    code, doc = rehearse(factory, model_folder(tmp_path, "gemma3_text"), tmp_path / "lf.yaml")
    assert doc["findings"] == [], doc["findings"]
    assert code == 0
    # after train(), generation and the merge run on the copy the save stage reloaded, and the accumulation check on
    # copies of LLaMA-Factory's own trainer (as for any launched script)
    assert [(s["stage"], s["status"]) for s in doc["stages"]] == [
        ("twin", "ok"), ("setup", "ok"), ("labels", "ok"), ("eval", "ok"), ("train", "ok"), ("save", "ok"),
        ("generate", "ok"), ("merge", "ok"), ("accumulation", "ok")]
    setup, train = (next(s for s in doc["stages"] if s["stage"] == k) for k in ("setup", "train"))
    assert setup["trainer"] == "CustomSeq2SeqTrainer"  # LLaMA-Factory's own trainer, not the rehearsal's
    assert len(train["losses"]) == 3 and train["lora_b"]["moved"] > 0
    # warmup_ratio 0.1 of 3 steps: the first step is warm-up at rate 0 (why `--steps 1` must not judge moving)
    assert train["learning_rates"][0] == 0 and train["learning_rates"][-1] > 0, train["learning_rates"]
    assert any(n.startswith("dataset chat: its first rows") for n in doc["notes"]), doc["notes"]


@pytest.mark.slow
def test_llamafactory_s_rm_stage_on_its_demo_dataset_trains_through_its_own_trainer_without_a_false_alarm(tmp_path,
                                                                                                       factory):
    """`stage: rm` on LLaMA-Factory's demo dataset (dpo_en_demo, not beside the config): the rehearsal's pairs in its
    ranking format, LLaMA-Factory's PairwiseTrainer trains the value head and the adapter. Before: 'The dataset is not
    applicable in the current training stage' (the rehearsal's plain rows), then, with pairs, GD960 from the
    rehearsal's own reload (the value-head wrapper returns a tuple; the head is saved beside the adapter): both false
    alarms. Its save is now skipped with why. (`stage: dpo` the same way: clean, measured in docs/rehearsal.md.)"""
    config = LORA_SFT.replace("template: gemma3", "template: gemma").replace("stage: sft", "stage: rm")
    (tmp_path / "lf.yaml").write_text(config.replace("alpaca_en_demo", "dpo_en_demo"))
    code, doc = rehearse(factory, model_folder(tmp_path, "gemma3_text"), tmp_path / "lf.yaml")
    assert doc["findings"] == [] and code == 0, doc["findings"]
    got = [(s["stage"], s["status"]) for s in doc["stages"]]
    # after the save, whatever would run on its reloaded copy (generation, the merge) is skipped too: there is none;
    # the accumulation check runs on the script's own trainer (PairwiseTrainer), not on a reloaded copy: it holds
    assert got[:5] == [("twin", "ok"), ("setup", "ok"), ("labels", "ok"), ("train", "ok"), ("save", "skipped")], got
    assert ("accumulation", "ok") in got[5:], got
    assert all(status == "skipped" for stage, status in got[5:] if stage != "accumulation"), got
    setup, train, save = (next(s for s in doc["stages"] if s["stage"] == k) for k in ("setup", "train", "save"))
    assert setup["trainer"] == "PairwiseTrainer" and train["lora_b"]["moved"] > 0
    assert "value-head" in save["reason"]
    assert any("dpo_en_demo (not in any dataset_info.json found): 8 synthetic rows in its format (alpaca, ranking)"
               in n for n in doc["notes"]), doc["notes"]
