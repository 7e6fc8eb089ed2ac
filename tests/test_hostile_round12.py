"""Hostile input to the twelfth round's new surfaces (deepspeed's hostfile and --include/--exclude against it,
accelerate's default config, a training config's `deepspeed:` path, LLaMA-Factory's keys and string booleans): what an
attacker's pass found and what each input now gives. Every input: a finding or a one-line message, never exit 70.
"""

from __future__ import annotations

import json

import pytest

from tests.builders import gemma3_12b_config


@pytest.fixture
def model(tmp_path):
    folder = tmp_path / "model"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(gemma3_12b_config()))
    return folder


def _run(cli, model, line: str):
    r = cli("check", str(model), "--launch", line, "--gpu", "A100", "--format", "json", "--fail-on", "never")
    assert r.code == 0 and "Traceback" not in r.err, r
    doc = r.json()
    gd601 = [f["message"] for f in doc["models"][0]["findings"] if f["code"] == "GD601"]
    return doc["models"][0]["memory"]["run"]["num_gpus"], gd601


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
