"""One reading of a launch line's process count (readers/launch.py), for check and for the rehearsal's ranks
(rehearse/launch.ranks_of), and an accelerate config given directly (`check --training-config accelerate.yaml`) read
as `accelerate launch --config_file` reads it.

accelerate 1.15.0 copies a config's num_processes and num_machines into its arguments unconverted; every launcher
compares num_machines with 1 (utils/launch.py: `num_machines > 1`), and over several machines a run of several
processes divides num_processes by them (`num_processes // num_machines`). A string there is a TypeError before the
script starts (run here: tests/test_hostile_round13.py's _ACCELERATE on each case). torch 2.13.0's torchrun starts one
process a node unless told (get_args_parser: --nproc-per-node defaults to "1").
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.test_hostile_round13 import _ACCELERATE

# (distributed_type, num_processes, num_machines as written in the YAML, processes accelerate runs on each machine or
# None where it stops)
CASES = [
    ("MULTI_GPU", "'4'", "2", None), ("FSDP", "'4'", "2", None), ("MULTI_GPU", "4", "'2'", None),
    ("MULTI_GPU", "4", "'1'", None), ("NO", "1", "'1'", None), ("MULTI_GPU", "4", "2", 2), ("FSDP", "8", "2", 4),
    ("MULTI_GPU", "'4'", "1", 4), ("NO", "4", "1", 1), ("MULTI_GPU", "-1", "1", None), ("NO", "'3'", "1", None),
]


def _config(folder, distributed: str, processes: str, machines: str):
    extra = "fsdp_config:\n  fsdp_version: 2\n" if distributed == "FSDP" else ""
    name = f"{distributed}-{processes.strip(chr(39))}-{machines.strip(chr(39))}-{len(processes)}{len(machines)}"
    path = folder / f"{name}.yaml"
    path.write_text(f"compute_environment: LOCAL_MACHINE\ndistributed_type: {distributed}\nmixed_precision: bf16\n"
                    f"num_processes: {processes}\nnum_machines: {machines}\nmachine_rank: 0\n"
                    f"main_process_ip: 127.0.0.1\nmain_process_port: 29500\n{extra}", encoding="utf-8")
    return path


@pytest.mark.slow
def test_the_cases_are_what_accelerate_runs(tmp_path):
    paths = [str(_config(tmp_path, *case[:3])) for case in CASES]
    out = subprocess.run([sys.executable, "-c", _ACCELERATE, json.dumps(paths)], capture_output=True, text=True,
                         check=True, timeout=300, env={**os.environ, "HF_HOME": str(tmp_path / "hf")})
    assert json.loads(out.stdout.splitlines()[-1]) == [case[3] for case in CASES]


@pytest.mark.parametrize("distributed, processes, machines, runs", CASES)
def test_the_processes_a_config_s_launch_starts_on_each_machine_are_accelerate_s(tmp_path, distributed, processes,
                                                                                machines, runs):
    from gemma_doctor.readers import launch

    config = _config(tmp_path, distributed, processes, machines)
    line = f"accelerate launch --config_file {config} train.py"
    assert launch.local_processes(line) == runs
    tc = launch.parse(line)
    if runs is None:
        assert "stops accelerate launch" in tc.error and "\n" not in tc.error, tc.error
    else:
        assert tc.ok and tc.get("num_processes").value == runs * int(machines), tc


def _check(cli, model, *args: str) -> tuple[int, list[str]]:
    r = cli("check", str(model), *args, "--gpu", "A100", "--format", "json", "--fail-on", "never")
    assert r.code == 0 and "Traceback" not in r.err, r
    doc = r.json()
    gd601 = [f["message"] for f in doc["models"][0]["findings"] if f["code"] == "GD601"]
    return doc["models"][0]["memory"]["run"]["num_gpus"], gd601


@pytest.mark.parametrize("distributed, processes, machines, runs", CASES)
def test_an_accelerate_config_given_directly_is_read_as_its_launch_line_reads_it(cli, model, tmp_path, distributed,
                                                                                 processes, machines, runs):
    """Before, `--training-config accelerate.yaml` planned num_processes as written ('4' as 4 over 2 machines, 4
    under the single-process launcher) where `--launch "accelerate launch --config_file"` of the same file refused it
    or planned 1."""
    config = _config(tmp_path, distributed, processes, machines)
    direct = _check(cli, model, "--training-config", str(config))
    launched = _check(cli, model, "--launch", f"accelerate launch --config_file {config} train.py")
    assert len(direct[1]) == len(launched[1]) == (runs is None), (direct, launched)
    if runs is None:
        assert "stops accelerate launch" in direct[1][0] and "\n" not in direct[1][0]
    else:
        assert direct[0] == launched[0] == runs * int(machines)


# -- torchrun's default ----------------------------------------------------------------------------------------------
def test_torchrun_starts_one_process_a_node_unless_told():
    """The evidence, from torch installed here."""
    from torch.distributed.run import get_args_parser

    assert get_args_parser().parse_args(["train.py"]).nproc_per_node == "1"
    assert get_args_parser().parse_args(["--nnodes", "2", "train.py"]).nproc_per_node == "1"


@pytest.mark.parametrize("line, planned", [("torchrun train.py --bf16", 1), ("torchrun --nnodes 2 train.py", 2),
                                           ("python -m torch.distributed.run train.py", 1)])
def test_a_torchrun_line_without_a_count_plans_one_process_a_node_not_every_gpu(cli, model, line, planned):
    """Before, check planned the GPUs --num-gpus names (or the machine shows), where torchrun starts one process."""
    r = cli("check", str(model), "--launch", line, "--gpu", "A100", "--format", "json", "--fail-on", "never")
    assert r.code == 0, r
    run = r.json()["models"][0]["memory"]["run"]
    assert run["num_gpus"] == planned and "torchrun's default --nproc-per-node 1" in run["sources"]["num_gpus"], run


# -- the rehearsal's ranks: the same reading ------------------------------------------------------------------------
@pytest.mark.parametrize("line, ranks", [
    # the line's count over its machines, split as accelerate splits it (it ran 4 as 2 a machine)
    ("accelerate launch --num_processes 4 --num_machines 2 train.py", 2),
    ("torchrun --nnodes 2 train.py", 1),
    # the interpreter's options before -m, and accelerate's launch module: the launchers all the same
    ("python -u -m torch.distributed.run --nproc_per_node 2 train.py", 2),
    ("python -m accelerate.commands.launch --num_processes 2 train.py", 2),
    # a script's own arguments are not the launcher's count
    ("python train.py --num_processes 4", 1),
    ("llamafactory-cli train config.yaml", None),  # its own launcher decides
])
def test_the_rehearsal_counts_a_lines_ranks_as_check_reads_the_line(line, ranks):
    from gemma_doctor.rehearse.launch import ranks_of

    assert ranks_of(line.split()) == ranks


def test_a_config_the_launcher_stops_on_starts_no_ranks(tmp_path):
    """`num_processes: '2'` under the single-process launcher: accelerate stops (TypeError), so no rank count (the
    rehearsal refuses the line before: test_a_config_file_no_launcher_can_read_is_one_line_for_rehearse)."""
    from gemma_doctor.rehearse.launch import ranks_of

    config = tmp_path / "acc.yaml"
    config.write_text("compute_environment: LOCAL_MACHINE\ndistributed_type: 'NO'\nnum_processes: '2'\n")
    assert ranks_of(["accelerate", "launch", "--config_file", str(config), "train.py"]) is None


def test_accelerates_default_config_is_the_one_the_launched_command_s_environment_names(tmp_path):
    """The rehearsal's child runs with a private HF_HOME, where accelerate finds no default config: its ranks are
    the launcher's own choice there; under an HF_HOME holding one, that config's count."""
    from gemma_doctor.rehearse.launch import rank_threads, ranks_of
    from gemma_doctor.rehearse.process import _environment

    home = tmp_path / "users-hf"
    (home / "accelerate").mkdir(parents=True)
    (home / "accelerate" / "default_config.yaml").write_text(
        "compute_environment: LOCAL_MACHINE\ndistributed_type: MULTI_GPU\nnum_processes: 2\n")
    argv = ["accelerate", "launch", "train.py"]
    assert ranks_of(argv, {"HF_HOME": str(home)}) == 2
    child = _environment(tmp_path / "root")  # HF_HOME: the rehearsal's own folder
    assert ranks_of(argv, child) is None
    assert rank_threads(child, argv).get("OMP_NUM_THREADS") == os.environ.get("OMP_NUM_THREADS")


# -- hostile --config_file on a launch line ---------------------------------------------------------------------------
def _hostile(tmp_path, kind: str):
    path = tmp_path / f"{kind}.yaml"
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "link-to-fifo":
        os.mkfifo(tmp_path / "real-fifo")
        path.symlink_to(tmp_path / "real-fifo")
    elif kind == "dangling":
        path.symlink_to(tmp_path / "nowhere.yaml")
    elif kind == "folder":
        path.mkdir()
    elif kind == "huge":
        with open(path, "wb") as f:
            f.write(b"num_processes: 2\n")
            f.truncate(2 << 30)  # 2 GiB, sparse
    elif kind == "not-utf8":
        path.write_bytes(b"compute_environment: LOCAL_MACHINE\ndistributed_type: MULTI_GPU\nnum_processes: \xff\xfe\n")
    elif kind == "device":
        return "/dev/zero"
    return str(path)


HOSTILE = ["fifo", "link-to-fifo", "dangling", "folder", "huge", "not-utf8", "device"]


@pytest.mark.parametrize("kind", HOSTILE)
def test_the_ranks_of_a_line_naming_a_hostile_config_never_hang(tmp_path, kind):
    """Before, ranks_of read --config_file with a plain read_text: a FIFO there hung the rehearsal (here: the
    subprocess's timeout), /dev/zero and a 2 GiB file were read whole."""
    config = _hostile(tmp_path, kind)
    code = ("import json, sys\nfrom gemma_doctor.rehearse.launch import ranks_of\n"
            "print(json.dumps(ranks_of(['accelerate', 'launch', '--config_file', sys.argv[1], 'train.py'])))")
    done = subprocess.run([sys.executable, "-c", code, config], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and json.loads(done.stdout) is None, done.stderr[-2000:]


@pytest.mark.parametrize("kind", HOSTILE)
def test_a_config_file_no_launcher_can_read_is_one_finding_for_check(cli, model, tmp_path, kind):
    config = _hostile(tmp_path, kind)
    _, gd601 = _check(cli, model, "--launch", f"accelerate launch --config_file {config} train.py")
    assert len(gd601) == 1 and "--config_file" in gd601[0] and "\n" not in gd601[0], gd601


@pytest.mark.parametrize("kind", HOSTILE)
def test_a_config_file_no_launcher_can_read_is_one_line_for_rehearse(cli, tmp_path, monkeypatch, kind):
    """On a machine with a GPU driver the rehearsal skips the CPU ranks' rewrite of the config (ranks.cpu_launch),
    which on this CPU machine refused such a file first: there the line went on to build the twin and then hung in
    ranks_of. Now the launch line is refused before anything is built, with or without a driver."""
    from gemma_doctor.readers import gpu
    from tests.test_rehearse_launch import model_folder

    monkeypatch.setattr(gpu, "nvidia_driver_present", lambda: True)
    config = _hostile(tmp_path, kind)
    (tmp_path / "train.py").write_text("")
    monkeypatch.chdir(tmp_path)
    got = cli("rehearse", model_folder(tmp_path, "gemma3_text"), "--launch",
              f"accelerate launch --config_file {config} train.py", "--device", "cuda")
    assert got.code == 2 and got.out == "" and got.err.count("\n") == 1 and "--config_file" in got.err, got.err
