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


import pytest



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


# DeepSpeed 0.19.8's launcher (deepspeed/launcher/runner.py, its parse_args and resource filter run here): --num_nodes
# and --num_gpus are argparse type=int (`1:4`, `abc` stop it: "invalid int value"), -1 / 0 GPUs is every GPU visible;
# --include runs the slots it lists; --include/--exclude beside a count, or together, stop it. gemma-doctor read `1:4`
# as torchrun's MIN:MAX (4 processes), refused -1 and 0 ("not a count") and ignored --include.
@pytest.mark.parametrize("line, said", [
    ("deepspeed --num_nodes 1:4 train.py", "--num_nodes 1:4 is not an integer"),
    ("deepspeed --num_gpus 1:4 train.py", "--num_gpus 1:4 is not an integer"),
    ("deepspeed --num_gpus abc train.py", "--num_gpus abc is not an integer"),
    ("deepspeed --num_accelerators 2.5 train.py", "--num_gpus 2.5 is not an integer"),
    ("deepspeed --include localhost:0,1 --num_gpus 2 train.py", "Cannot specify num_nodes/gpus with include/exclude"),
    ("deepspeed --exclude localhost:0 --num_nodes 1 train.py", "Cannot specify num_nodes/gpus with include/exclude"),
    ("deepspeed -i localhost:0 -e localhost:1 train.py", "mutually exclusive"),
    ("deepspeed --include localhost:a train.py", "is not host[:slot,...][@host...]"),
    ("deepspeed --include localhost:1:2 train.py", "is not host[:slot,...][@host...]"),
    ("deepspeed --include localhost:0@ train.py", "is not host[:slot,...][@host...]"),
    ("deepspeed --include localhost:-1 train.py", "names a GPU slot below 0"),
])
def test_a_deepspeed_count_its_launcher_refuses_is_gd601(cli, model, line, said):
    processes, gd601 = _run(cli, model, line)
    assert processes == 1 and any(said in m for m in gd601), (processes, gd601)


@pytest.mark.parametrize("line, processes", [
    ("deepspeed --num_gpus -1 train.py", 1),  # every GPU visible: one here (check's default run)
    ("deepspeed --num_gpus 0 train.py", 1),  # 0 too: apply_num_nodes_and_gpus trims only for N > 0
    ("deepspeed --num_gpus ' 2 ' train.py", 2),
    ("deepspeed --num_accelerators ٣ train.py", 3),
    ("deepspeed --num_nodes -1 --num_gpus 4 train.py", 4),  # every host: one without a hostfile
    ("deepspeed --include localhost:0,1 train.py", 2),
    ("deepspeed -i localhost:0,1,1 train.py", 2),  # duplicates removed, as DeepSpeed does
    ("deepspeed --include localhost@localhost:1,3 train.py", 2),  # the listed slots win over the bare host
    ("deepspeed --include worker-0:0,1@worker-1:0,1 train.py", 4),
])
def test_a_deepspeed_count_is_read_as_its_launcher_reads_it(cli, model, line, processes):
    got, gd601 = _run(cli, model, line)
    assert (got, gd601) == (processes, [])


@pytest.mark.parametrize("line, said", [
    ("deepspeed --num_gpus -1 train.py", "deepspeed line: num_processes -1 (deepspeed: every GPU visible) auto"),
    ("deepspeed --include localhost train.py", "deepspeed line: num_processes auto"),
])
def test_deepspeed_every_gpu_is_the_gpus_visible_said_so(cli, model, line, said):
    r = cli("check", str(model), "--launch", line, "--gpu", "A100", "--format", "json", "--fail-on", "never")
    assert r.code == 0, r
    run = r.json()["models"][0]["memory"]["run"]
    assert run["num_gpus"] == 1, run
    assert run["sources"]["num_gpus"] == f"training config {said}: one process per GPU visible (1)", run


# transformers 5.23.0's TrainingArguments(deepspeed=PATH), run here with DeepSpeed 0.19.8: a folder raises
# IsADirectoryError, a dangling link ValueError ("Expected a string path to an existing deepspeed config"), a YAML file
# JSONDecodeError (a FIFO: open() waits for a writer). gemma-doctor ignored each ("an unreadable file adds nothing").
def deepspeed_target(tmp_path, kind: str) -> str:
    """A `deepspeed:` path the run stops at, of ``kind`` (folder, fifo, dangling, yaml), made in ``tmp_path``."""
    import os

    if kind == "folder":
        (tmp_path / "adir").mkdir()
        return "adir"
    if kind == "fifo":
        os.mkfifo(tmp_path / "pipe.json")
        return "pipe.json"
    if kind == "dangling":
        os.symlink("nowhere.json", tmp_path / "ds.json")
        return "ds.json"
    (tmp_path / "adir.yaml").write_text("zero_optimization:\n  stage: 3\n")
    return "adir.yaml"


@pytest.mark.parametrize("kind, said", [
    ("folder", "is a folder, not a DeepSpeed JSON file"),
    ("fifo", "is not a regular file"),
    ("dangling", "is a link to nowhere.json, which does not exist"),
    ("yaml", "is not a JSON file"),
])
def test_a_deepspeed_setting_naming_no_json_file_is_gd601(cli, model, tmp_path, kind, said):
    target = deepspeed_target(tmp_path, kind)
    config = tmp_path / "train.yaml"
    config.write_text(f"bf16: true\ndeepspeed: {target}\n")
    r = cli("check", str(model), "--training-config", str(config), "--gpu", "A100", "--format", "json",
            "--fail-on", "never")
    assert r.code == 0 and "Traceback" not in r.err, r
    gd601 = [f["message"] for f in r.json()["models"][0]["findings"] if f["code"] == "GD601"]
    assert any(f"deepspeed: {target} {said}" in m for m in gd601), gd601


def test_a_deepspeed_path_on_the_launch_line_naming_a_folder_is_gd601(cli, model, tmp_path, monkeypatch):
    (tmp_path / "adir").mkdir()
    monkeypatch.chdir(tmp_path)
    _, gd601 = _run(cli, model, "torchrun --nproc-per-node 2 train.py --deepspeed adir")
    assert any("adir is a folder, not a DeepSpeed JSON file" in m for m in gd601), gd601


@pytest.mark.parametrize("value", ['\'{"zero_optimization": {"stage": 2}}\'', "missing.json", "ds.json"])
def test_a_deepspeed_setting_transformers_reads_or_this_machine_lacks_is_no_gd601(cli, model, tmp_path, value):
    (tmp_path / "ds.json").write_text('{"zero_optimization": {"stage": 2}}')
    config = tmp_path / "train.yaml"
    config.write_text(f"bf16: true\ndeepspeed: {value}\n")
    r = cli("check", str(model), "--training-config", str(config), "--gpu", "A100", "--format", "json",
            "--fail-on", "never")
    assert r.code == 0, r
    assert not [f for f in r.json()["models"][0]["findings"] if f["code"] == "GD601"], r.out
