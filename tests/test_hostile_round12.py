"""Hostile input to the twelfth round's new surfaces (deepspeed's hostfile and --include/--exclude against it,
accelerate's default config, a training config's `deepspeed:` path, LLaMA-Factory's keys and string booleans): what an
attacker's pass found and what each input now gives. Every input: a finding or a one-line message, never exit 70.
"""

from __future__ import annotations

import os
import socket

import pytest

from tests.test_hostile_round11 import _run  # check with a launch line: (processes planned, GD601 messages)


def _messages(cli, model, config, code: str) -> list[str]:
    """check of ``model`` with the training config ``config``: the messages of its findings of ``code`` (no traceback)."""
    r = cli("check", str(model), "--training-config", str(config), "--gpu", "A100", "--format", "json",
            "--fail-on", "never")
    assert r.code == 0 and "Traceback" not in r.err, r
    return [f["message"] for f in r.json()["models"][0]["findings"] if f["code"] == code]


# A hostfile's `slots=` is any run of digits (DeepSpeed 0.19.8's _parse_hostfile: `slots=(\d+)`, int()), and
# --num_gpus any int: the pool was listed slot by slot (list(range(slots))), so `slots=99999999999999999` or
# `--num_gpus 99999999999999999` beside a hostfile ended in MemoryError (exit 70). The pool is now counted.
@pytest.mark.parametrize("hostfile, extra", [
    ("a slots=99999999999999999\n", ""),
    ("a slots=2\nb slots=4\n", "--num_gpus 99999999999999999"),
    ("a slots=99999999999999999\nb slots=2\n", "--exclude a:0"),
    ("a slots=99999999999999999\nb slots=2\n", "--include a"),
])
def test_a_hostfile_of_huge_slot_counts_is_gd601_not_a_memory_error(cli, model, tmp_path, hostfile, extra):
    (tmp_path / "hostfile").write_text(hostfile)
    processes, gd601 = _run(cli, model, f"deepspeed --hostfile {tmp_path / 'hostfile'} {extra} train.py")
    assert processes == 1 and any("beyond any real run" in m for m in gd601), gd601


@pytest.mark.parametrize("extra, processes", [
    ("--include a:0,1@b", 6), ("--include a:0@a:1", 2), ("--include b:1,3", 2), ("--exclude a:0", 5),
    ("--exclude a", 4), ("--exclude b:3@a:1", 4), ("--num_gpus 3", 6), ("--num_nodes 1", 2),
])
def test_the_counted_pool_runs_what_deepspeed_runs(cli, model, tmp_path, extra, processes):
    (tmp_path / "hostfile").write_text("a slots=2\nb slots=4\n")
    assert _run(cli, model, f"deepspeed -H {tmp_path / 'hostfile'} {extra} train.py") == (processes, [])


# A `deepspeed:` path that is a link loop or a socket: accelerate 1.15.0's HfDeepSpeedConfig (which transformers'
# TrainingArguments builds) was run here on each: a loop fails os.path.exists as a dangling link does ("Expected a
# string path to an existing deepspeed config"), a socket passes it and open() fails (OSError: [Errno 6] No such device
# or address). gemma-doctor judged the dangling link and the FIFO but took both of these as "unreadable to this user"
# and said nothing.
def _socket(folder, name):
    """A Unix socket bound at folder/name (bound relative: a pytest folder is longer than a socket's path may be)."""
    s = socket.socket(socket.AF_UNIX)
    here = os.getcwd()
    os.chdir(folder)
    try:
        s.bind(name)
    finally:
        os.chdir(here)
    return s


@pytest.mark.parametrize("kind, said", [("loop", "is a link loop"), ("socket", "is not a regular file")])
def test_a_deepspeed_path_that_is_a_link_loop_or_a_socket_is_gd601(cli, model, tmp_path, kind, said):
    ds = tmp_path / "ds.json"
    if kind == "loop":
        (tmp_path / "other.json").symlink_to("ds.json")
        ds.symlink_to("other.json")
    else:
        held = _socket(tmp_path, "ds.json")  # noqa: F841 (kept open for the run)
    config = tmp_path / "train.yaml"
    config.write_text(f"per_device_train_batch_size: 2\nbf16: true\ndeepspeed: {ds}\n")
    gd601 = _messages(cli, model, config, "GD601")
    assert any(f"deepspeed: {ds} {said}" in m for m in gd601), gd601


_LF = "model_name_or_path: google/gemma-3-12b\nstage: sft\nfinetuning_type: lora\ndo_train: true\n"


# LLaMA-Factory's `bf16: ''`: transformers 5.23.0's HfArgumentParser.parse_dict (as LLaMA-Factory calls it) keeps the
# string, and '' is false (run here: bf16 '' passed where 'false' raised transformers' "Your setup doesn't support
# bf16/gpu", the error of a bf16 run on a CPU). GD681 said "so the run has bf16 on" of both.
@pytest.mark.parametrize("value, said", [("''", "so the run has bf16 off"), ("'false'", "so the run has bf16 on")])
def test_gd681_says_an_empty_string_leaves_the_boolean_off(cli, model, tmp_path, value, said):
    config = tmp_path / "lf.yaml"
    config.write_text(f"{_LF}bf16: {value}\n")
    gd681 = _messages(cli, model, config, "GD681")
    assert len(gd681) == 1 and gd681[0].endswith(said), gd681


# A config of tens of thousands of keys no field has (LLaMA-Factory's table, as TRL's and axolotl's): each was matched
# against the table's ~480 names with difflib, about a millisecond a key, so a 1 MiB file of 100,000 keys took 91 s
# here (before; 24 s after, nearly all PyYAML's). The first MAX_KEYS_MATCHED keys are matched, the rest not judged.
MAX_KEYS_MATCHED = 1000  # readers/training_config.py's


def test_only_the_first_thousand_unknown_keys_are_matched_against_the_key_table(cli, model, tmp_path):
    config = tmp_path / "lf.yaml"
    config.write_text(_LF + "".join(f"per_device_train_batch_sizf{i}: 1\n" for i in range(MAX_KEYS_MATCHED + 5)))
    r = cli("check", str(model), "--training-config", str(config), "--gpu", "A100", "--format", "json",
            "--fail-on", "never")
    assert r.code == 0 and "Traceback" not in r.err, r
    gd680 = [f["key"] for f in r.json()["models"][0]["findings"] if f["code"] == "GD680"]
    assert gd680 == [f"per_device_train_batch_sizf{i}" for i in range(MAX_KEYS_MATCHED)], len(gd680)
