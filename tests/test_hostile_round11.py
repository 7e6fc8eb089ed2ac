"""Hostile input to the eleventh round's new surfaces (recommend --trainer, the launch lines' process counts, GD663,
list's sizing): what an attacker's pass found and what each input now gives.

The launchers' own readings were reproduced here with the installed torch 2.13.0 and accelerate 1.15.0 (a CPU run
of `torchrun --nproc-per-node V hello.py` and `accelerate launch --cpu --num_processes V hello.py`):
- torchrun reads --nproc-per-node with Python's int() (so ' 2 ', '+2', '1_000', '٣' are counts) or a device word
  (auto, gpu, cpu, xpu); 0 and -1 stop it with an AssertionError, '1e9', 'abc', '1:2' with "Unsupported
  nproc_per_node value". gemma-doctor read 0, 1e99 and abc as "no count" (the GPUs visible) and '٣' as none.
- torchrun's --nnodes is N or MIN:MAX with 0 < MIN <= MAX (parse_min_max_nnodes, config_from_args): '4:1', '0:4',
  '1:2:3' stop it. gemma-doctor read '4:1' as 1 node, '0:4' as 4, '1:2:3' as 3: runs torchrun never starts.
- accelerate launch reads --num_processes (and its other integer options) with argparse type=int: '1e9', '2.5', ''
  stop it ("invalid int value"); gemma-doctor planned one process and passed.
Each such line is now GD601 with one line saying why; a line the launcher runs is read as it reads it.
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


@pytest.mark.parametrize("line, said", [
    ("torchrun --nproc-per-node 0 train.py", "--nproc-per-node 0 stops torchrun"),
    ("torchrun --nproc-per-node -1 train.py", "--nproc-per-node -1 stops torchrun"),
    ("torchrun --nproc-per-node 1e99 train.py", "--nproc-per-node 1e99 is not a count torchrun reads"),
    ("torchrun --nproc_per_node=abc train.py", "--nproc-per-node abc is not a count torchrun reads"),
    ("torchrun --nproc-per-node 1:2 train.py", "--nproc-per-node 1:2 is not a count torchrun reads"),
    ("torchrun --nnodes 4:1 --nproc-per-node 2 train.py", "--nnodes 4:1 is not a count or MIN:MAX"),
    ("torchrun --nnodes 0:4 --nproc-per-node 2 train.py", "--nnodes 0:4 is not a count or MIN:MAX"),
    ("torchrun --nnodes 1:2:3 --nproc-per-node 2 train.py", "--nnodes 1:2:3 is not a count or MIN:MAX"),
    ("python -m torch.distributed.run --nnodes=0 train.py", "--nnodes 0 is not a count or MIN:MAX"),
    ("accelerate launch --num_processes 1e9 train.py", "--num_processes 1e9 is not an integer"),
    ("accelerate launch --num-processes '' --multi_gpu train.py", "--num_processes '' is not an integer"),
    ("accelerate launch --num_processes=2.5 train.py", "--num_processes 2.5 is not an integer"),
    ("accelerate launch --num_machines abc --num_processes 2 train.py", "--num_machines abc is not an integer"),
    ("accelerate launch --use_deepspeed --zero_stage three train.py", "--zero_stage three is not an integer"),
])
def test_a_count_the_launcher_refuses_is_gd601_not_a_silent_default(cli, model, line, said):
    processes, gd601 = _run(cli, model, line)
    assert processes == 1 and any(said in m for m in gd601), (processes, gd601)


@pytest.mark.parametrize("line, processes", [
    ("torchrun --nproc-per-node ' 2 ' train.py", 2),
    ("torchrun --nproc-per-node +2 train.py", 2),
    ("torchrun --nproc-per-node ٣ train.py", 3),  # int('٣') == 3: torchrun started 3 ranks here
    ("torchrun --nnodes 1:4 --nproc-per-node 2 train.py", 8),  # elastic: the most it may run
    ("torchrun --nnodes 2:2 --nproc-per-node 4 train.py", 8),
    ("torchrun --nproc-per-node auto train.py", 1),  # the launching machine's devices: the GPUs visible
    ("accelerate launch --num_processes=٣ train.py", 3),
    ("accelerate launch --num_processes 4 --multi_gpu train.py", 4),
])
def test_a_count_the_launcher_runs_is_read_as_it_reads_it(cli, model, line, processes):
    got, gd601 = _run(cli, model, line)
    assert (got, gd601) == (processes, [])
