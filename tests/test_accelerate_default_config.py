"""`accelerate launch` without --config_file reads accelerate's default config (issue 32, round 12).

accelerate 1.15.0's launch (commands/launch.py _validate_launch_command) loads default_config_file
(commands/config/config_args.py: $HF_HOME, else $XDG_CACHE_HOME/huggingface, else ~/.cache/huggingface, then
accelerate/default_config.yaml) where the line names no --config_file, that file exists and --cpu is not given; its
mixed_precision, num_processes and distributed_type then stand where the line's flags say none. gemma-doctor read
only a --config_file, so such a run was planned in fp32 on one process, GD609 saying "unless the launcher adds it".
Checked here against accelerate's own _validate_launch_command on the same lines and file.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest


DEFAULT = "compute_environment: LOCAL_MACHINE\ndistributed_type: MULTI_GPU\nmixed_precision: bf16\nnum_processes: 2\n" \
          "num_machines: 1\n"
LINES = ["accelerate launch train.py", "accelerate launch --mixed_precision fp16 train.py",
         "accelerate launch --num_processes 4 train.py"]

_ACCELERATE = """
import json, shlex, sys
from accelerate.commands.launch import launch_command_parser, _validate_launch_command
out = []
for line in json.loads(sys.argv[1]):
    args = launch_command_parser().parse_args(shlex.split(line)[2:])
    _validate_launch_command(args)
    out.append([args.mixed_precision, args.num_processes])
print(json.dumps(out))
"""


@pytest.fixture
def hf_home(tmp_path, monkeypatch):
    home = tmp_path / "hf"
    (home / "accelerate").mkdir(parents=True)
    (home / "accelerate" / "default_config.yaml").write_text(DEFAULT)
    monkeypatch.setenv("HF_HOME", str(home))
    return home


def _check(cli, model, line: str) -> tuple[dict, list[dict]]:
    r = cli("check", str(model), "--launch", line, "--gpu", "A100", "--format", "json", "--fail-on", "never")
    assert r.code == 0 and "Traceback" not in r.err, r
    found = r.json()["models"][0]
    return found["memory"]["run"], found["findings"]


@pytest.mark.slow
def test_the_launch_reader_reads_accelerate_s_default_config_as_accelerate_launch_does(cli, model, hf_home):
    out = subprocess.run([sys.executable, "-c", _ACCELERATE, json.dumps(LINES)], capture_output=True, text=True,
                         check=True, timeout=300, env={**os.environ, "HF_HOME": str(hf_home)})
    theirs = json.loads(out.stdout.splitlines()[-1])
    ours = [[run["precision"], run["num_gpus"]] for run in (_check(cli, model, line)[0] for line in LINES)]
    assert ours == theirs == [["bf16", 2], ["fp16", 2], ["bf16", 4]]


def test_the_default_config_is_named_as_the_source(cli, model, hf_home):
    run, findings = _check(cli, model, "accelerate launch train.py")
    assert run["sources"]["precision"] == "training config default_config.yaml: mixed_precision", run
    assert not [f for f in findings if f["code"] in ("GD601", "GD609")], findings


def test_a_config_file_on_the_line_leaves_the_default_config_unread(cli, model, hf_home, tmp_path):
    own = tmp_path / "own.yaml"
    own.write_text("compute_environment: LOCAL_MACHINE\ndistributed_type: 'NO'\nmixed_precision: fp16\n")
    run, _ = _check(cli, model, f"accelerate launch --config_file {own} train.py")
    assert (run["precision"], run["num_gpus"]) == ("fp16", 1), run


def test_a_default_config_accelerate_cannot_read_is_gd601(cli, model, hf_home):
    (hf_home / "accelerate" / "default_config.yaml").write_text("mixed_precision: [bf16\n")
    _, findings = _check(cli, model, "accelerate launch train.py")
    gd601 = [f["message"] for f in findings if f["code"] == "GD601"]
    assert len(gd601) == 1 and "accelerate's default config" in gd601[0], gd601


def test_without_a_default_config_gd609_says_the_launch_line_was_read(cli, model, tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HOME", str(tmp_path / "empty"))
    _, findings = _check(cli, model, "accelerate launch train.py")
    gd609 = [f["message"] for f in findings if f["code"] == "GD609"]
    assert len(gd609) == 1 and "unless the launcher adds it" not in gd609[0], gd609
