"""Hostile input to the ninth round's readers of the run (issue 32's distributed and written settings, the rehearsal's
2-rank paths): each input once gave a traceback, exit 70, or a hang, and now gives a one-line message or a finding.

The sweep that found them (every key of readers/training_config.KEYS with lists, mappings, null, "ture", 10**30, -5,
NaN, inf, 2.5, "auto", "", unicode, 100,000 characters..., in TRL, axolotl, accelerate and DeepSpeed configs, through
check, recommend and fix --dry-run: 29,000 runs, none of them a defect;
launch lines with unbalanced quotes, NUL, 100k characters, --num_processes 0/-1/1e9/nan, --nproc-per-node auto;
FIFOs, link loops, folders and /dev/zero as configs) is benchmarks/hostile_inputs.py --sweep; what it found is here.
No child process is started: every case is decided before a rank would run.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from gemma_doctor.rehearse import ranks
from tests.builders import HubCache, gemma3_1b_config, generation_config

REPO = "google/gemma-3-1b-it"
LONG = "a" * 300  # a file name no Linux file system holds (NAME_MAX 255): stat raises ENAMETOOLONG


def _alias_bomb(last: str) -> str:
    """700 bytes of YAML whose ``last`` line names 9**9 items through aliases."""
    return "a: &a [x, x, x, x, x, x, x, x, x]\n" + "".join(
        f"{chr(98 + i)}: &{chr(98 + i)} [" + ", ".join([f"*{chr(97 + i)}"] * 9) + "]\n" for i in range(8)) + last


@pytest.fixture
def model(hub: HubCache) -> HubCache:
    hub.add(REPO, {"config.json": gemma3_1b_config(), "generation_config.json": generation_config()})
    return hub


def _check(cli, hub: HubCache, config: Path):
    r = cli("check", REPO, "--cache-dir", hub.root, "--training-config", config, "--format", "json")
    assert r.code in (0, 1), r
    [m] = r.json()["models"]
    return {f["code"]: f for f in m["findings"]}


# --- check: the training config and what it names --------------------------------------------------------------


def test_a_deepspeed_file_named_past_any_file_name_is_not_a_traceback(model, cli, tmp_path):
    """`deepspeed: <300 characters>.json`: Path.is_file raised ENAMETOOLONG (exit 70); now the name names no file and
    the config's own settings stand (the engine is DeepSpeed by the setting)."""
    config = tmp_path / "trl.json"
    config.write_text(json.dumps({"output_dir": "o", "bf16": True, "deepspeed": LONG + ".json"}))
    r = cli("check", REPO, "--cache-dir", model.root, "--training-config", config, "--format", "json")
    assert r.code in (0, 1), r
    assert r.json()["models"][0]["run"]["distributed"]["engine"]["value"] == "deepspeed"


def test_a_launch_line_naming_such_a_deepspeed_file_is_read(model, cli):
    r = cli("check", REPO, "--cache-dir", model.root, "--launch", f"deepspeed --num_gpus 2 train.py --deepspeed "
            f"{'/'.join([LONG] * 3)}.json", "--format", "json")
    assert r.code in (0, 1), r
    assert r.json()["models"][0]["run"]["distributed"]["engine"]["value"] == "deepspeed"


@pytest.mark.parametrize("depth", [101, 2_000, 400_000])
def test_yaml_nested_past_any_config_is_refused_before_pyyaml_scans_it(model, cli, tmp_path, depth):
    """PyYAML's scanner is quadratic in the nesting of flow collections (2,000 `[`: 5-15 s, then "maximum recursion
    depth exceeded"); the reader refuses such a file by counting its brackets, as it refuses deep JSON."""
    config = tmp_path / "deep.yaml"
    config.write_text("output_dir: o\nfsdp_config: " + "[" * depth + "]" * depth + "\n")
    found = _check(cli, model, config)
    assert "nested too deeply to be a training config" in found["GD601"]["message"], found
    # One level less is read (readers/training_config.MAX_FLOW_NESTING: 100), brackets in strings counted too.
    config.write_text("output_dir: o\nbf16: true\nlora_target_modules: [q_proj]\nfsdp_config: " + "[" * 99 + "]" * 99
                      + "\nchat_template: '{{ x }}'\n")
    assert "GD601" not in _check(cli, model, config)


# --- LoRA target regexes: PEFT fullmatches them against every module name, and so does the plan ---------------


# A regex declined for what it may do is a warning (the scan is no proof: PEFT may well run it); one that does not
# compile is an error (PEFT raises).
@pytest.mark.parametrize("pattern, words, severity", [
    ("(.*)*Z", "repeats a repetition ((.*)*)", "warning"),  # 10 s on 24 characters of a module name before; a hang on 40
    ("(a+)+$", "repeats a repetition ((a+)+)", "warning"),
    ("(.|.)*q_proj", "repeats a repetition ((.|.)*)", "warning"),
    (".*" * 6 + "Z", "has 6 unbounded repetitions (more than 4)", "warning"),  # run.MAX_TARGET_REPEATS
    ("(" * 1500 + ")" * 1500, "is not a regular expression Python compiles (RecursionError", "error"),  # exit 70 before
    ("(x", "is not a valid regular expression: PEFT raises re.error", "error"),
    (".*" + "x" * 5000, "is 5,002 characters long", "warning"),  # re.compile takes ~30 µs a character
])
def test_a_lora_regex_that_backtracks_or_breaks_re_is_a_finding_not_a_hang(model, cli, tmp_path, pattern, words,
                                                                           severity):
    config = tmp_path / "peft.yaml"
    config.write_text("output_dir: o\nuse_peft: true\nlora_r: 8\nlora_target_modules: " + json.dumps(pattern) + "\n")
    found = _check(cli, model, config)
    assert words in found["GD425"]["message"], found.get("GD425")
    assert found["GD425"]["severity"] == severity, found["GD425"]


@pytest.mark.parametrize("pattern", [
    r".*\.(q_proj|v_proj)", r"^(?!.*vision).*\.(q|k|v|o)_proj$", r"model\.layers\.(\d+)\.self_attn\.(q|v)_proj",
    r".*language_model.*\.(q_proj|k_proj|v_proj|o_proj|gate_proj|up_proj|down_proj)", "(a|b){2}", "(ab)+", r"\(a+\)*",
    r"[()|*]+\.(q|v)_proj",  # parentheses, a bar and a star in a class: no group, no repetition in one
])
def test_the_regexes_peft_users_write_are_run(pattern):
    from gemma_doctor.run import target_regex

    assert not isinstance(target_regex(pattern), str), target_regex(pattern)


@pytest.mark.parametrize("pattern, words", [
    ("a{99999999999}", "OverflowError"), ("(x", "PEFT raises re.error"), ("(?:" * 1000 + ")" * 1000, "RecursionError"),
    ("(a|b){1," + "9" * 4000 + "}", "repeats a repetition ((a|b){1,999"),
    ("(a|b){12}", "repeats a repetition"), ("{" * 500_000, "is 500,000 characters long"),
])
def test_what_re_compile_raises_is_said(pattern, words):
    from gemma_doctor.run import target_regex

    assert words in target_regex(pattern)


# --- rehearse: the launch line, the model folder and the accelerate config it names -----------------------------


def test_a_launched_script_past_any_file_name_is_a_usage_error(model, cli, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    r = cli("rehearse", REPO, "--cache-dir", model.root, "--launch", f"python {LONG}.py")
    assert r.code == 2 and "is not a file" in r.err, r


@pytest.mark.parametrize("kind", ["fifo", "nested"])
def test_a_model_folder_whose_config_is_a_fifo_or_too_deep_is_refused_unread(cli, tmp_path, kind):
    """The rehearsal read config.json with read_text: a FIFO hung it, 100,000 `[` were exit 70 (RecursionError)."""
    folder = tmp_path / "model"
    folder.mkdir()
    if kind == "fifo":
        os.mkfifo(folder / "config.json")
    else:
        (folder / "config.json").write_text('{"architectures": ["Gemma3ForCausalLM"], "x": ' + "[" * 100_000
                                            + "]" * 100_000 + "}")
    (tmp_path / "t.yaml").write_text("output_dir: o\n")
    r = cli("rehearse", folder, "--training-config", tmp_path / "t.yaml")
    assert r.code == 2 and "config.json cannot be read" in r.err, r


def test_an_accelerate_config_whose_unread_setting_is_an_alias_bomb_is_one_line(model, cli, tmp_path, monkeypatch):
    """fsdp_config.fsdp_sync_module_states is no setting the reader bounds; the CPU ranks' replacements str()'d it:
    9**9 items, memory and minutes. Now the config is made plain data within the reader's bounds."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "train.py").write_text("print('never run')\n")
    (tmp_path / "fsdp.yaml").write_text("distributed_type: FSDP\n" + _alias_bomb(
        "fsdp_config:\n  fsdp_version: 2\n  fsdp_sync_module_states: *i\n"))
    r = cli("rehearse", REPO, "--cache-dir", model.root, "--launch", "accelerate launch --config_file fsdp.yaml train.py")
    assert r.code == 2 and "expands to more than 10000 items" in r.err, r


def test_read_config_bounds_what_the_reader_does_not_read(tmp_path):
    path = tmp_path / "fsdp.yaml"
    path.write_text("distributed_type: FSDP\n" + _alias_bomb("junk: *i\n"))
    with pytest.raises(Exception, match="expands to more than 10000 items"):
        ranks.read_config(path)
    path.write_text("distributed_type: FSDP\nfsdp_config:\n  fsdp_version: 2\n  fsdp_sync_module_states: true\n")
    assert ranks.read_config(path)["fsdp_config"] == {"fsdp_version": 2, "fsdp_sync_module_states": True}
