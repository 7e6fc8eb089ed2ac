"""DeepSpeed's inputs read as they run, each read once (issue 32, round 12).

- A `deepspeed:` JSON a config names is read once: the path check and the settings it adds share one read (it was
  read twice: once to judge it, once more for its settings).
- A `deepspeed:` path the run stops at (a folder, a FIFO, a dangling link, text that is not JSON) is GD601 for that
  path, and the rest of the config (batch, precision, accumulation ...) is still planned; it made the whole config
  unread.
- `deepspeed --hostfile FILE` (default /job/hostfile) is read as DeepSpeed 0.19.8's launcher/runner.py reads it
  (fetch_hostfile, parse_inclusion_exclusion, apply_num_nodes_and_gpus), checked here against those functions
  themselves; it was not read at all.
- `--exclude localhost:1` without a hostfile counts the GPUs visible less the slots it names, as DeepSpeed's own pool
  ({"localhost": its device count}) does; it left the GPUs visible (one too many).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from gemma_doctor.readers import launch, training_config
from tests.test_hostile_round11 import deepspeed_target


def _check(cli, model, *args: str) -> tuple[dict, list[str]]:
    r = cli("check", str(model), *args, "--gpu", "A100", "--format", "json", "--fail-on", "never")
    assert r.code == 0 and "Traceback" not in r.err, r
    found = r.json()["models"][0]
    return found["memory"]["run"], [f["message"] for f in found["findings"] if f["code"] == "GD601"]


# --- one read of the DeepSpeed JSON ------------------------------------------------------------------------------

# Counts the opens of one path in a fresh interpreter (an audit hook sees every open(), os.open() included), while the
# training config that names it, or a launch line, is read.
_COUNT_OPENS = """
import os, sys
target = os.path.realpath(sys.argv[1])
opens = []
sys.addaudithook(lambda event, args: opens.append(args[0]) if event == "open" and isinstance(args[0], (str, bytes))
                 and os.path.realpath(args[0]) == target else None)
from gemma_doctor.readers import launch, training_config
tc = training_config.read(sys.argv[2]) if sys.argv[3] == "config" else launch.parse(sys.argv[2], cwd=sys.argv[4])
print(len(opens), tc.get("zero_stage").value)
"""


@pytest.mark.parametrize("how", ["config", "launch"])
def test_a_deepspeed_json_is_read_once(tmp_path, how):
    ds = tmp_path / "ds.json"
    ds.write_text(json.dumps({"zero_optimization": {"stage": 3}}))
    config = tmp_path / "train.yaml"
    config.write_text("bf16: true\ndeepspeed: ds.json\n")
    what = str(config) if how == "config" else "torchrun --nproc-per-node 2 train.py --deepspeed ds.json"
    out = subprocess.run([sys.executable, "-c", _COUNT_OPENS, str(ds), what, how, str(tmp_path)],
                         capture_output=True, text=True, check=True, timeout=120, cwd=tmp_path)
    assert out.stdout.split() == ["1", "3"], out


def test_a_json_next_to_the_config_is_read_where_the_path_as_written_names_a_folder(tmp_path, monkeypatch):
    work = tmp_path / "work"
    (work / "ds.json").mkdir(parents=True)  # as written, from the working folder: a folder
    (tmp_path / "cfg").mkdir()
    (tmp_path / "cfg" / "ds.json").write_text(json.dumps({"zero_optimization": {"stage": 2}}))
    (tmp_path / "cfg" / "train.yaml").write_text("bf16: true\ndeepspeed: ds.json\n")
    monkeypatch.chdir(work)
    tc = training_config.read(str(tmp_path / "cfg" / "train.yaml"))
    assert (tc.get("zero_stage").value, tc.problems) == (2, ())


# --- a bad deepspeed: path is GD601 beside a planned config ----------------------------------------------------------

@pytest.mark.parametrize("kind", ["folder", "fifo", "dangling", "yaml"])
def test_a_deepspeed_path_the_run_stops_at_is_gd601_and_the_rest_of_the_config_is_planned(cli, model, tmp_path, kind):
    target = deepspeed_target(tmp_path, kind)
    config = tmp_path / "train.yaml"
    config.write_text(f"fp16: true\nper_device_train_batch_size: 3\ngradient_accumulation_steps: 5\ndeepspeed: {target}\n")
    run, gd601 = _check(cli, model, "--training-config", str(config))
    assert [m for m in gd601 if f"deepspeed: {target} " in m] == gd601 and len(gd601) == 1, gd601
    assert (run["batch_size"], run["gradient_accumulation_steps"], run["precision"]) == (3, 5, "fp16"), run
    assert run["sources"]["batch_size"] == "training config per_device_train_batch_size", run


def test_a_deepspeed_path_on_a_launch_line_is_gd601_and_the_rest_of_the_line_is_planned(cli, model, tmp_path,
                                                                                        monkeypatch):
    (tmp_path / "adir").mkdir()
    monkeypatch.chdir(tmp_path)
    run, gd601 = _check(cli, model, "--launch",
                        "torchrun --nproc-per-node 2 train.py --deepspeed adir --per_device_train_batch_size 3")
    assert len(gd601) == 1 and "adir is a folder, not a DeepSpeed JSON file" in gd601[0], gd601
    assert (run["num_gpus"], run["batch_size"]) == (2, 3), run


# --- the hostfile, as DeepSpeed's runner reads it ----------------------------------------------------------------

HOSTFILE = "worker-0 slots=4\n# a comment\n\nworker-1 slots=2 max_slots=2\n"

# Hostfile texts, and launch options over them (or over no hostfile: DeepSpeed's own pool, localhost with the GPUs it
# sees, 4 here). Each is run through DeepSpeed 0.19.8's own functions below and through the launch reader.
HOSTFILES = {"two": HOSTFILE, "crlf": HOSTFILE.replace("\n", "\r\n"), "one": "localhost slots=8\n",
             "arabic": "worker-0 slots=٣\n", "dup": "worker-0 slots=4\nworker-0 slots=2\n",
             "bad": "worker-0 slots=4\nworker-1 4\n", "empty": "# none\n\n", "zero": "worker-0 slots=0\n",
             "tail": "worker-0 slots=2x\n"}
CASES = [
    ("two", ""), ("crlf", ""), ("one", ""), ("arabic", ""), ("dup", ""), ("bad", ""), ("empty", ""), ("zero", ""),
    ("tail", ""),
    ("two", "--num_nodes 1"), ("two", "--num_nodes 5"), ("two", "--num_gpus 8"), ("two", "--num_nodes 1 --num_gpus 2"),
    ("two", "--num_gpus -1"), ("two", "--include worker-1"), ("two", "--include worker-1:1@worker-0:0,3"),
    ("two", "--exclude worker-0"), ("two", "--exclude worker-1:0@worker-0:1,1"), ("two", "--exclude worker-0@worker-1"),
    ("two", "--include worker-2"), ("two", "--include worker-1:2"), ("two", "--exclude worker-0:9"),
    ("two", "--include localhost:0"),
    (None, "--exclude localhost:1"), (None, "--exclude localhost:0,3"), (None, "--exclude localhost"),
    (None, "--exclude localhost:4"), (None, "--include localhost:1,2"), (None, "--include localhost:7"),
    (None, "--include localhost"),
]

# DeepSpeed's runner.main, from fetch_hostfile to apply_num_nodes_and_gpus, on each case: (processes, nodes) or the
# error it stops with.
_DEEPSPEED = """
import json, sys, collections
from deepspeed.launcher import runner
out = []
for hostfile, options in json.loads(sys.argv[1]):
    args = runner.parse_args([*options.split(), "--hostfile", hostfile or "/nonexistent/hostfile", "train.py"])
    try:
        pool = runner.fetch_hostfile(args.hostfile)
        if args.num_nodes >= 0 or args.num_gpus >= 0:
            if args.include != "" or args.exclude != "":
                raise ValueError("Cannot specify num_nodes/gpus with include/exclude")
        if not pool:
            pool = {"localhost": 4}
        active = runner.parse_inclusion_exclusion(pool, args.include, args.exclude)
        active = runner.apply_num_nodes_and_gpus(active, args.num_nodes, args.num_gpus)
        processes = sum(len(slots) for slots in active.values())
        out.append([processes, len(active)] if processes else "error")
    except ValueError as e:
        out.append("error")
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def deepspeed_reads(tmp_path_factory):
    from tests.venvs import ensure_deepspeed

    folder = tmp_path_factory.mktemp("hostfiles")
    for name, text in HOSTFILES.items():
        (folder / name).write_bytes(text.encode())
    cases = [(str(folder / h) if h else None, options) for h, options in CASES]
    env = {**os.environ, "PYTHONPATH": str(ensure_deepspeed())}
    out = subprocess.run([sys.executable, "-c", _DEEPSPEED, json.dumps(cases)], capture_output=True, text=True, env=env,
                         check=True, timeout=600)
    return folder, dict(zip(map(tuple, CASES), json.loads(out.stdout.splitlines()[-1])))


@pytest.mark.slow
@pytest.mark.parametrize("hostfile, options", CASES)
def test_the_launch_reader_counts_a_deepspeed_line_as_deepspeed_s_runner_does(deepspeed_reads, hostfile, options):
    folder, theirs = deepspeed_reads
    line = f"deepspeed {options} {'--hostfile ' + hostfile if hostfile else ''} train.py"
    tc = launch.parse(line, cwd=str(folder), visible=4)
    ours = "error" if not tc.ok else [tc.get("num_processes").value if tc.get("num_processes") else 4,
                                      tc.get("num_machines").value]
    assert ours == theirs[(hostfile, options)], (line, tc.error, ours)


@pytest.mark.parametrize("hostfile, said", [
    ("dup", "names worker-0 twice"), ("bad", "has a line that is not `host slots=N`: worker-1 4"),
    ("empty", "names no host"), ("zero", "is left with no GPU slot"),
])
def test_a_hostfile_deepspeed_stops_at_is_gd601_in_one_line(cli, model, tmp_path, hostfile, said):
    (tmp_path / "hf").write_text(HOSTFILES[hostfile])
    run, gd601 = _check(cli, model, "--launch", f"deepspeed --hostfile {tmp_path / 'hf'} train.py")
    assert len(gd601) == 1 and said in gd601[0] and "\n" not in gd601[0], gd601


def test_check_plans_the_processes_and_machines_of_the_hostfile(cli, model, tmp_path):
    (tmp_path / "hf").write_text(HOSTFILE)
    run, gd601 = _check(cli, model, "--launch", f"deepspeed -H {tmp_path / 'hf'} --exclude worker-0:3 train.py")
    assert (run["num_gpus"], gd601) == (5, []), run
    assert run["sources"]["num_gpus"] == f"training config deepspeed line: num_processes (hostfile {tmp_path / 'hf'}: " \
                                        "2 hosts, 6 slots)", run


def test_the_default_hostfile_is_read_where_the_line_names_none(cli, model, tmp_path, monkeypatch):
    # DeepSpeed's DLTS_HOSTFILE is /job/hostfile; this machine has none, so the reader's copy of the name points here.
    (tmp_path / "hostfile").write_text(HOSTFILE)
    monkeypatch.setattr(launch, "DEEPSPEED_HOSTFILE", str(tmp_path / "hostfile"))
    run, gd601 = _check(cli, model, "--launch", "deepspeed --num_nodes 1 train.py")
    assert (run["num_gpus"], gd601) == (4, []), run


def _hostile(tmp_path, kind: str) -> str:
    path = tmp_path / "hf"
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "folder":
        path.mkdir()
    elif kind == "device":
        return "/dev/zero"
    elif kind == "dangling":
        os.symlink("nowhere", path)
    elif kind == "loop":
        os.symlink("hf", path)
    elif kind == "outside":  # a link out of the folder to a real hostfile: DeepSpeed's open() follows it
        (tmp_path / "elsewhere").mkdir()
        (tmp_path / "elsewhere" / "hosts").write_text(HOSTFILE)
        os.symlink(tmp_path / "elsewhere" / "hosts", path)
    elif kind == "huge":
        path.write_bytes(b"worker-0 slots=4\n" + b"#" * (launch.MAX_HOSTFILE_BYTES + 10))
    elif kind == "binary":
        path.write_bytes(b"worker-0 slots=4\n\xff\xfe\n")
    elif kind == "digits":
        path.write_text("worker-0 slots=" + "9" * 5000 + "\n")
    return str(path)


@pytest.mark.parametrize("kind, processes, said", [
    ("fifo", 1, None), ("folder", 1, None), ("device", 1, None), ("dangling", 1, None), ("loop", 1, None),
    ("outside", 6, None), ("huge", 1, "larger than 1 MiB"), ("binary", 1, "is not UTF-8 text"),
    ("digits", 1, "past any machine's GPUs"),
])
def test_a_hostile_hostfile_never_blocks_nor_crashes(cli, model, tmp_path, kind, processes, said):
    # What is no regular file is no hostfile to DeepSpeed (os.path.isfile: local resources only): never opened blocking.
    run, gd601 = _check(cli, model, "--launch", f"deepspeed --hostfile {_hostile(tmp_path, kind)} train.py")
    assert run["num_gpus"] == processes, run
    assert (said is None and not gd601) or (len(gd601) == 1 and said in gd601[0]), gd601


# --- --exclude without a hostfile ---------------------------------------------------------------------------------

@pytest.mark.parametrize("line, visible, processes", [
    ("deepspeed --exclude localhost:1 train.py", 4, 3),
    ("deepspeed -e localhost:0,3 train.py", 8, 6),
    ("deepspeed --exclude localhost:1 train.py", None, None),  # no probe here: the GPUs visible stand, not judged
    ("deepspeed --exclude worker-1:0 train.py", 4, None),  # another host: the training machine's hostfile, not judged
])
def test_an_exclude_without_a_hostfile_counts_the_gpus_visible_less_its_slots(line, visible, processes):
    tc = launch.parse(line, visible=visible)
    assert tc.ok and (tc.get("num_processes").value if tc.get("num_processes") else None) == processes, tc


# --- a config's problems survive a launch line ---------------------------------------------------------------------

def test_a_config_s_refused_key_is_still_said_when_a_launch_line_joins_it(cli, model, tmp_path):
    # launch.combine built the joined config without the file's problems: GD680 vanished once --launch was given.
    config = tmp_path / "trl.yaml"
    config.write_text("bf16: true\nper_device_train_batch_sze: 2\n")
    r = cli("check", str(model), "--training-config", str(config), "--launch", "torchrun --nproc-per-node 2 train.py",
            "--gpu", "A100", "--format", "json", "--fail-on", "never")
    assert r.code == 0, r
    assert [f["key"] for f in r.json()["models"][0]["findings"] if f["code"] == "GD680"] == \
        ["per_device_train_batch_sze"], r.out
