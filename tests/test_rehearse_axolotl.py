"""An axolotl run rehearsed through axolotl's own data path (gemma_doctor/rehearse/axolotl.py): axolotl 0.19.0's
chat_template prompt strategy labels the rows, the labels invariant judges them, the twin trains on them. With the
rule catalogue out of it (no `check` rule runs; the catalogue only names what the rehearsal met), the rehearsal alone
catches axolotl's untrained end-of-turn token (GD972) and verifies the catalogue's cure (eot_tokens) on the same
stack; a config that already sets the cure is clean.

axolotl is put on the child's path as a user's environment has it: the gemma-doctor command runs with axolotl 0.19.0
importable (installed without its dependencies' stack, as tests/test_catalogue.py runs it; its prompt strategies need
only colorama and addict beside transformers and datasets).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from gemma_doctor.rehearse import invariants
from tests.test_catalogue import AXOLOTL
from tests.test_rehearse import model_folder
from tests.venvs import ensure_packages, subprocess_env

# axolotl's keys: its batch, LoRA and sequence length, one chat_template dataset (a file not present: synthetic rows
# in its format), no eot_tokens (axolotl's default: the eos token, which Gemma's template never emits).
CONFIG = ("base_model: google/tiny-gemma3_text\nbf16: true\nadapter: lora\nlora_r: 8\nlora_target_modules: [q_proj, "
          "v_proj]\nmicro_batch_size: 2\nsequence_len: 128\nlearning_rate: 0.001\n"
          "datasets:\n  - path: chats.jsonl\n    type: chat_template\n")
CURED = CONFIG + 'eot_tokens: ["<end_of_turn>"]\n'


def _rehearse(tmp_path: Path, *args: str) -> dict:
    """`gemma-doctor rehearse ... --format json` with axolotl importable, as in a user's axolotl environment."""
    env = subprocess_env(PYTHONPATH=f"{ensure_packages(AXOLOTL)}:{subprocess_env()['PYTHONPATH']}")
    done = subprocess.run([sys.executable, "-m", "gemma_doctor", "rehearse", str(model_folder(tmp_path, "gemma3_text")),
                           *args, "--steps", "1", "--format", "json"], capture_output=True, text=True, env=env,
                          cwd=tmp_path, timeout=900)
    assert done.returncode in (0, 1), done.stderr[-3000:]
    return json.loads(done.stdout)["rehearsals"][0]


@pytest.mark.slow
def test_axolotl_s_untrained_turn_end_is_caught_by_the_rehearsal_and_its_cure_verified(tmp_path):
    """Before, an axolotl config was rehearsed through a plain language-modelling collator that trains every token:
    the turn end was trained in the twin's rows and GD972 never fired. Now axolotl's own strategy labels them."""
    (tmp_path / "axolotl.yaml").write_text(CONFIG)
    doc = _rehearse(tmp_path, "--training-config", "axolotl.yaml")
    [gd972] = [f for f in doc["findings"] if f["code"] == "GD972"]
    assert gd972["message"].startswith("2 of 2 samples hold the end-of-turn token but do not train it")
    assert doc["trainer"] == "axolotl", doc
    assert any("axolotl 0.19.0's `chat_template` prompt strategy" in n for n in doc["notes"]), doc["notes"]
    assert gd972["details"]["catalogue"] == "axolotl-gemma-eot-untrained"
    assert all(r["trained"] and not r["eot_trained"] for r in gd972["details"]["rows"])
    assert gd972["details"]["cure"] == ('cure verified in this stack: with eot_tokens: ["<end_of_turn>"] axolotl '
                                        "0.19.0 trains the turn end"), gd972
    # The twin trained on axolotl's rows: every stage after the labels passed.
    assert [s["status"] for s in doc["stages"] if s["stage"] != "twin"] == ["ok"] * 9, doc["stages"]
    assert [f["code"] for f in doc["findings"]] == ["GD972"]


@pytest.mark.slow
def test_a_config_with_the_cure_set_rehearses_clean_through_axolotl(tmp_path):
    (tmp_path / "axolotl.yaml").write_text(CURED)
    doc = _rehearse(tmp_path, "--launch", "axolotl train axolotl.yaml")  # the line that runs it: its config
    assert doc["trainer"] == "axolotl" and doc["findings"] == [], doc["findings"]
    assert doc["status"] == "passed"


def test_without_axolotl_the_run_is_rehearsed_through_the_trainer_and_the_report_says_so(tmp_path):
    """The test process cannot import axolotl (the rehearsal never installs it): one line says so."""
    from gemma_doctor.rehearse.runner import plan_for

    (tmp_path / "axolotl.yaml").write_text(CONFIG)
    plan, findings, notes, _ = plan_for(str(model_folder(tmp_path, "gemma3_text")), None, "main",
                                        tmp_path / "axolotl.yaml", 1)
    assert "axolotl" not in plan and plan["trainer"] == "transformers" and findings == []
    assert notes == ["axolotl is not importable in this environment: its prompt strategy did not build the labels; "
                     "the run is rehearsed through transformers' Trainer with the config's keys gemma-doctor reads"]


def test_the_plan_carries_the_dataset_entry_and_the_keys_axolotl_s_strategy_reads(tmp_path, monkeypatch):
    from gemma_doctor.rehearse.runner import plan_for

    monkeypatch.syspath_prepend(str(ensure_packages(AXOLOTL)))
    (tmp_path / "chats.jsonl").write_text(json.dumps({"messages": [{"role": "user", "content": "hi"}]}) + "\n")
    (tmp_path / "axolotl.yaml").write_text(CONFIG + "train_on_inputs: true\n")
    plan, _, notes, _ = plan_for(str(model_folder(tmp_path, "gemma3_text")), None, "main", tmp_path / "axolotl.yaml", 1)
    part = plan["axolotl"]
    assert part["dataset"] == {"path": "chats.jsonl", "type": "chat_template"}
    assert part["cfg"] == {"sequence_len": 128, "train_on_inputs": True}
    assert part["rows"] == str(tmp_path / "chats.jsonl") and part["eot_missing"] is True
    assert part["completion_only"] is False and plan["settings"]["completion_only"] is False
    assert notes == []  # the child says where its labels came from, once it has built them


@pytest.mark.parametrize("line, config", [
    ("axolotl train cfg.yml", "cfg.yml"),
    ("axolotl train cfg.yml --learning-rate 1e-4", "cfg.yml"),
    ("/opt/venv/bin/axolotl train ./c.yaml", "./c.yaml"),
    ("python -m axolotl.cli.train cfg.yml", "cfg.yml"),
    ("accelerate launch --num_processes 1 -m axolotl.cli.train cfg.yml", "cfg.yml"),
    ("axolotl preprocess cfg.yml", None),
    ("axolotl train", None),
    ("python train.py cfg.yml", None),
    ("axolotl train 'unclosed", None),
])
def test_axolotl_launch_lines_name_their_config(line, config):
    from gemma_doctor.rehearse import axolotl

    got = axolotl.axolotl_launch(line)
    assert got == (Path(config) if config else None)


def test_the_cure_adds_the_terminator_to_eot_tokens_once():
    from gemma_doctor.rehearse import axolotl

    assert axolotl.cure({"cfg": {}, "terminator": "<end_of_turn>"}) == {"eot_tokens": ["<end_of_turn>"]}
    assert axolotl.cure({"cfg": {"eot_tokens": ["<eos>"]}, "terminator": "<turn|>"}) == \
        {"eot_tokens": ["<eos>", "<turn|>"]}
    assert axolotl.terminator("gemma4_text") == "<turn|>" and axolotl.terminator("gemma3") == "<end_of_turn>"


def test_gd972_of_axolotl_rows_names_the_catalogue_entry_only_where_its_setting_is_missing():
    rows = [{"tokens": 30, "trained": 9, "eot_present": True, "eot_trained": False, "prompt_masked": 21}]
    [missing] = invariants.judge_labels({"per_sample": rows, "axolotl": {"version": "0.19.0", "eot_missing": True,
                                                                         "terminator": "<end_of_turn>"}})
    assert missing.details["catalogue"] == invariants.AXOLOTL_EOT and 'eot_tokens: ["<end_of_turn>"]' in missing.fix
    # eot_tokens set, and still untrained (train_on_eot: none, measured on axolotl 0.19.0): not the catalogue's case.
    [set_] = invariants.judge_labels({"per_sample": rows, "axolotl": {"version": "0.19.0", "eot_missing": False,
                                                                      "terminator": "<end_of_turn>"}})
    assert "catalogue" not in set_.details and "train_on_eot" in set_.fix
    [plain] = invariants.judge_labels({"per_sample": rows})
    assert "catalogue" not in plain.details


@pytest.mark.slow
def test_a_dataset_type_whose_axolotl_handler_does_not_import_falls_back_to_the_rehearsal_s_rows(tmp_path):
    """`type: alpaca` is not in axolotl's strategy registry: its dataset wrapper handles it, and that module imports
    axolotl's whole data stack (posthog, ...), absent here. The rows are then the rehearsal's own, said in a note: not
    a crash at setup (GD956), nor a prompt-masking judgement (GD973) on rows axolotl did not make."""
    script = """
import json, sys
from pathlib import Path
from transformers import AutoTokenizer
from gemma_doctor.rehearse import axolotl
from gemma_doctor.rehearse.twin import synthetic_tokenizer
folder = Path(sys.argv[1])
for name, data in synthetic_tokenizer({"model_type": "gemma3_text", "vocab_size": 256}, 256).items():
    (folder / name).write_bytes(data)
part, note = axolotl.plan_part({"base_model": "google/tiny-gemma3_text", "learning_rate": 0.001,
                                "datasets": [{"path": "x.jsonl", "type": "alpaca"}]}, None, "gemma3_text")
class Run:
    plan, notes, tokenizer = {"axolotl": part}, [], AutoTokenizer.from_pretrained(str(folder))
print(json.dumps({"data": axolotl.data(Run), "plan": Run.plan, "notes": Run.notes}))
"""
    env = subprocess_env(PYTHONPATH=f"{ensure_packages(AXOLOTL)}:{subprocess_env()['PYTHONPATH']}")
    done = subprocess.run([sys.executable, "-c", script, str(tmp_path)], capture_output=True, text=True, env=env,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    got = json.loads(done.stdout.strip().splitlines()[-1])
    assert got["data"] is None and got["plan"] == {}
    assert got["notes"] == ["axolotl's data path for dataset type 'alpaca' does not import here (ModuleNotFoundError: "
                            "No module named 'posthog'): the labels are the rehearsal's own, not axolotl's"]


def test_the_terminator_is_the_one_in_the_template_the_rows_are_rendered_with():
    """A Gemma 4 target without tokenizer files gets the twin's synthetic tokenizer, whose template ends turns with
    <end_of_turn>: the cure must add that, not Gemma 4's <turn|> (axolotl drops an eot token its template lacks, and
    the cure would 'not help'). Measured by hand on the tiny Gemma 4 twin: GD972, cure verified with <end_of_turn>."""
    from types import SimpleNamespace

    from gemma_doctor.rehearse import axolotl

    part = {"terminator": "<turn|>", "cfg": {}, "dataset": {"type": "chat_template"}}
    gemma3_style = SimpleNamespace(chat_template="{{ '<start_of_turn>' + role }}{{ '<end_of_turn>\n' }}")
    gemma4_style = SimpleNamespace(chat_template="{{ '<|turn>' + role }}{{ '<turn|>\n' }}")
    assert axolotl._template_terminator(part, gemma3_style) == "<end_of_turn>"
    assert axolotl._template_terminator(part, gemma4_style) == "<turn|>"
    assert axolotl._template_terminator(part, SimpleNamespace(chat_template=None)) == "<turn|>"


@pytest.mark.slow
def test_a_config_axolotl_refuses_stops_the_rehearsal_at_setup_with_axolotl_s_own_message(tmp_path):
    """`batch_size` beside `gradient_accumulation_steps` (each decides the other): `axolotl train` stops at its config
    validation (axolotl 0.19.0, reproduced). Before, the rehearsal never ran axolotl's validation and trained the twin
    on a config axolotl would not start with."""
    (tmp_path / "axolotl.yaml").write_text(CURED + "batch_size: 16\ngradient_accumulation_steps: 4\n")
    doc = _rehearse(tmp_path, "--training-config", "axolotl.yaml")
    [f] = doc["findings"]
    assert f["code"] == "GD956" and f["key"] == "setup", f
    assert f["message"].endswith("Refused: axolotl 0.19.0 refuses the config: please set only one of "
                                 "gradient_accumulation_steps or batch_size"), f["message"]
    assert "the library refuses this setting by a check of its own" in f["fix"], f["fix"]
    assert [s["stage"] for s in doc["stages"]][-1] == "setup"


def test_axolotl_s_validation_refuses_warns_and_gives_its_defaults():
    """axolotl's own validate_config on the whole config, as `axolotl train` runs it first (axolotl 0.19.0): mutually
    exclusive keys and a wrong type are refusals in axolotl's words; what it only warns about is returned to be said;
    the keys the prompt strategy reads come back with the schema's values."""
    script = """
import json
from gemma_doctor.rehearse import axolotl
base = {"base_model": "google/tiny-gemma3_text", "adapter": "lora", "lora_r": 8, "micro_batch_size": 2,
        "sequence_len": 128, "learning_rate": 0.001, "datasets": [{"path": "c.jsonl", "type": "chat_template"}]}
out = {}
cases = {"clean": {}, "packing": {"sample_packing": True}, "warmup": {"warmup_steps": 10, "warmup_ratio": 0.1},
         "rate": {"learning_rate": "fast"}}
for name, extra in cases.items():
    part, _ = axolotl.plan_part({**base, **extra}, None, "gemma3_text")
    try:
        checked, said = axolotl.validated(part)
        out[name] = {"train_on_inputs": checked.get("train_on_inputs"), "said": said}
    except axolotl.Refused as e:
        out[name] = {"refused": str(e)}
print(json.dumps(out))
"""
    env = subprocess_env(PYTHONPATH=f"{ensure_packages(AXOLOTL)}:{subprocess_env()['PYTHONPATH']}")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    got = json.loads(done.stdout.strip().splitlines()[-1])
    assert got["clean"] == {"train_on_inputs": False, "said": []}
    assert any(m.startswith("`sample_packing` without an attention backend does not handle cross-sample "
                            "decontamination") for m in got["packing"]["said"]), got["packing"]
    assert got["warmup"] == {"refused": "axolotl 0.19.0 refuses the config: warmup_steps and warmup_ratio are "
                                        "mutually exclusive"}
    assert got["rate"] == {"refused": "axolotl 0.19.0 refuses the config: could not convert string to float: 'fast' "
                                      "(learning_rate)"}
