"""Hostile input left from the twelfth round (accelerate's config `num_processes`, a YAML config of 100,000 keys): what
the real launcher does with each, and what gemma-doctor now says. Every input: a count as the launcher runs it, or a
finding or a one-line message, never exit 70 or a traceback.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.test_hostile_round11 import _run  # check with a launch line: (processes planned, GD601 messages)

# accelerate 1.15.0 copies a config's num_processes into its arguments unconverted (commands/launch.py
# _validate_launch_command). -1 stops it. A run of several processes hands str(value) to torchrun's --nproc_per_node,
# which int() reads ('٣' runs 3; 0 or less stops its agent; 2.5, true, null: "Unsupported nproc_per_node value"); the
# single-process launcher compares the value with 1 (a string: TypeError) and runs one process. Run here on each; before,
# gemma-doctor planned one process for every one of them but '3' (3, also under 'NO', which stops) and said nothing.
CASES = [  # (distributed_type, num_processes as written in the YAML, processes accelerate runs or None where it stops)
    ("MULTI_GPU", "-1", None), ("NO", "-1", None), ("MULTI_GPU", "0", None), ("NO", "0", 1),
    ("MULTI_GPU", "'٣'", 3), ("MULTI_GPU", "٣", 3), ("FSDP", "'٣'", 3), ("NO", "'٣'", None), ("NO", "'3'", None),
    ("MULTI_GPU", "2.5", None), ("NO", "2.5", 1), ("FSDP", "true", None), ("MULTI_GPU", "null", None),
    ("NO", "null", 1), ("NO", "2", 1), ("MULTI_GPU", "2", 2),
]

_ACCELERATE = """
import json, sys
from accelerate.commands.launch import launch_command_parser, _validate_launch_command
from accelerate.utils.launch import prepare_multi_gpu_env, prepare_simple_launcher_cmd_env
from torch.distributed.run import determine_local_world_size
out = []
for path in json.loads(sys.argv[1]):
    try:
        args = launch_command_parser().parse_args(["--config_file", path, "train.py"])
        _validate_launch_command(args)
        if args.multi_gpu or args.use_fsdp:
            prepare_multi_gpu_env(args)
            n = determine_local_world_size(args.nproc_per_node)
            out.append(n if n >= 1 else None)  # torchrun's agent refuses a local world size under 1
        else:
            prepare_simple_launcher_cmd_env(args)
            out.append(1)
    except (ValueError, TypeError):
        out.append(None)
print(json.dumps(out))
"""


def _config(folder, distributed: str, processes: str):
    extra = "fsdp_config:\n  fsdp_version: 2\n" if distributed == "FSDP" else ""
    path = folder / f"{distributed}-{processes.strip(chr(39))}.yaml"
    path.write_text(f"compute_environment: LOCAL_MACHINE\ndistributed_type: {distributed}\nmixed_precision: bf16\n"
                    f"num_processes: {processes}\nnum_machines: 1\n{extra}", encoding="utf-8")
    return path


@pytest.fixture
def hf_home(tmp_path, monkeypatch):
    home = tmp_path / "hf"
    (home / "accelerate").mkdir(parents=True)
    monkeypatch.setenv("HF_HOME", str(home))
    return home


@pytest.mark.parametrize("distributed, processes, runs", CASES)
def test_an_accelerate_default_config_s_num_processes_is_counted_as_accelerate_runs_it(
        cli, model, hf_home, distributed, processes, runs):
    (hf_home / "accelerate" / "default_config.yaml").write_bytes(
        _config(hf_home, distributed, processes).read_bytes())
    planned, gd601 = _run(cli, model, "accelerate launch train.py")
    if runs is None:
        assert len(gd601) == 1 and "default_config.yaml stops accelerate launch" in gd601[0], gd601
        assert "\n" not in gd601[0]
    else:
        assert (planned, gd601) == (runs, []), (planned, gd601)


def test_a_count_on_the_line_leaves_the_config_s_unread(cli, model, tmp_path):
    config = _config(tmp_path, "MULTI_GPU", "-1")  # accelerate: the line's --num_processes stands, -1 is never read
    assert _run(cli, model, f"accelerate launch --config_file {config} --num_processes 4 train.py") == (4, [])


@pytest.mark.slow
def test_the_cases_are_what_accelerate_runs(tmp_path):
    paths = [str(_config(tmp_path, d, p)) for d, p, _ in CASES]
    out = subprocess.run([sys.executable, "-c", _ACCELERATE, json.dumps(paths)], capture_output=True, text=True,
                         check=True, timeout=300, env={**os.environ, "HF_HOME": str(tmp_path / "hf")})
    assert json.loads(out.stdout.splitlines()[-1]) == [runs for _, _, runs in CASES]


# A YAML config of 100,000 keys (1 MiB) took 24 s of check, nearly all in PyYAML's pure-Python composer, which every
# launcher reads a config with (yaml.safe_load): libyaml's would be 8x faster here, but a file it reads otherwise than
# the launcher (they differ on edge cases) would be judged as a run that never starts. The largest YAML in axolotl's
# repository is 20.8 KiB, LLaMA-Factory's 4.6 KiB: a YAML config over 128 KiB is GD601 in one line, never composed.
MAX_YAML_BYTES = 128 * 1024  # readers/training_config.py's


def _many_keys(size: int) -> str:
    head = "model_name_or_path: google/gemma-3-12b\nstage: sft\nfinetuning_type: lora\ndo_train: true\nbf16: true\n"
    lines, n = [head], len(head)
    while n <= size:
        lines.append(f"k{len(lines)}: 1\n")
        n += len(lines[-1])
    return "".join(lines)[:size]


@pytest.mark.parametrize("launch", [False, True])
def test_a_yaml_config_over_the_limit_is_one_line_and_never_composed(cli, model, tmp_path, monkeypatch, launch):
    import yaml

    composed = []
    real = yaml.SafeLoader.get_single_node
    monkeypatch.setattr(yaml.SafeLoader, "get_single_node", lambda self: composed.append(1) or real(self))
    config = tmp_path / "train.yaml"
    config.write_text(_many_keys(MAX_YAML_BYTES + 1))
    if launch:  # the same file named on a launch line
        _, gd601 = _run(cli, model, f"accelerate launch --config_file {config} train.py")
    else:
        r = cli("check", str(model), "--training-config", str(config), "--gpu", "A100", "--format", "json",
                "--fail-on", "never")
        assert r.code == 0 and "Traceback" not in r.err, r
        gd601 = [f["message"] for f in r.json()["models"][0]["findings"] if f["code"] == "GD601"]
    assert len(gd601) == 1 and "a YAML file of 128 KiB, larger than any training config" in gd601[0], gd601
    assert "not read (at most 128 KiB)" in gd601[0] and "\n" not in gd601[0]
    assert composed == []


def test_a_yaml_config_at_the_limit_is_read(cli, model, tmp_path):
    config = tmp_path / "train.yaml"
    config.write_text(_many_keys(MAX_YAML_BYTES).rsplit("\n", 1)[0] + "\n")
    r = cli("check", str(model), "--training-config", str(config), "--gpu", "A100", "--format", "json",
            "--fail-on", "never")
    assert r.code == 0 and "Traceback" not in r.err, r
    model_doc = r.json()["models"][0]
    assert not [f for f in model_doc["findings"] if f["code"] == "GD601"]
    assert model_doc["memory"]["run"]["precision"] == "bf16", model_doc["memory"]["run"]


# A `deepspeed:` JSON whose top level is not an object, or over 1 MiB, got no finding: the first was read, found no
# DeepSpeed config and added nothing; the second was not read whole and not judged. accelerate 1.15.0's HfDeepSpeedConfig
# (the class transformers' TrainingArguments builds from `deepspeed`), run here: an array, number or null stops it
# (AttributeError: 'list' object has no attribute 'get'); a 2 MiB object is read whole and its ZeRO stage 3 runs.
@pytest.mark.parametrize("text, said", [
    ('[{"zero_optimization": {"stage": 3}}]', "is JSON but an array, not an object of DeepSpeed settings"),
    ("[]", "is JSON but an array"), ("3", "is JSON but a number"), ("null", "is JSON but null"),
    (json.dumps({"zero_optimization": {"stage": 3}, "x": "a" * (1 << 20)}),
     "is larger than 1 MiB, which no DeepSpeed config is: not read here, so its ZeRO stage, offload and batch are not "
     "planned"),
])
def test_a_deepspeed_json_that_is_no_object_or_over_a_mib_is_gd601(cli, model, tmp_path, text, said):
    (tmp_path / "ds.json").write_text(text)
    config = tmp_path / "train.yaml"
    config.write_text(f"per_device_train_batch_size: 2\nbf16: true\ndeepspeed: {tmp_path / 'ds.json'}\n")
    r = cli("check", str(model), "--training-config", str(config), "--gpu", "A100", "--format", "json",
            "--fail-on", "never")
    assert r.code == 0 and "Traceback" not in r.err, r
    found = r.json()["models"][0]
    gd601 = [f["message"] for f in found["findings"] if f["code"] == "GD601"]
    assert len(gd601) == 1 and f"deepspeed: {tmp_path / 'ds.json'} {said}" in gd601[0] and "\n" not in gd601[0], gd601
    # An array, number or null stops the run; a file too large to plan is read by the run, which starts: a warning.
    severity = [f["severity"] for f in found["findings"] if f["code"] == "GD601"]
    assert severity == ["warning" if "larger than" in said else "error"], severity
    assert found["memory"]["run"]["precision"] == "bf16"  # the config's own settings are still planned


@pytest.mark.slow
def test_hf_deepspeed_config_stops_at_each_top_level_that_is_no_object(tmp_path):
    for i, text in enumerate(['[{"zero_optimization": {"stage": 3}}]', "[]", "3", "null"]):
        (tmp_path / f"{i}.json").write_text(text)
    code = ("import sys\nfrom accelerate.utils.deepspeed import HfDeepSpeedConfig\nfor p in sys.argv[1:]:\n"
            "    try:\n        HfDeepSpeedConfig(p); print('ran')\n"
            "    except AttributeError as e:\n        print('stopped', e)\n")
    out = subprocess.run([sys.executable, "-c", code, *(str(tmp_path / f"{i}.json") for i in range(4))],
                         capture_output=True, text=True, check=True, timeout=300)
    assert [line.split()[0] for line in out.stdout.splitlines()] == ["stopped"] * 4, out.stdout


# `CUDA_VISIBLE_DEVICES=0,1 deepspeed train.py`: DeepSpeed 0.19.8's runner.main, with no hostfile and none of
# --include/--exclude/--num_gpus N > 0/--num_nodes N > 1, turns the variable into `--include localhost:0,1` and unsets
# it (the slots are then the machine's own GPUs); with one of them it ignores the variable. The reader dropped the
# variable: the run was planned on every GPU visible (or one, with --gpu). Below, main's own lines on each case, then
# its parse_inclusion_exclusion and apply_num_nodes_and_gpus, on a machine of 4 GPUs.
ENV_CASES = [("0,1", ""), ("2,3", ""), ("3", ""), ("0,1", "--num_gpus 3"), ("0", "--num_gpus 0"),
             ("0,1", "--num_nodes 1"), ("", ""), ("4", ""), ("0,x", ""), ("1,1", "")]

_DEEPSPEED_ENV = """
import json, sys
from deepspeed.launcher import runner
out = []
for visible_devices, options in json.loads(sys.argv[1]):
    args = runner.parse_args([*options.split(), "--hostfile", "/nonexistent/hostfile", "train.py"])
    try:
        pool = runner.fetch_hostfile(args.hostfile)
        if not pool and len(visible_devices):  # runner.main, 0.19.8
            if not (len(args.include) or len(args.exclude) or args.num_nodes > 1 or args.num_gpus > 0):
                args.include = f"localhost:{visible_devices}"
        if args.num_nodes >= 0 or args.num_gpus >= 0:
            if args.include != "" or args.exclude != "":
                raise ValueError("Cannot specify num_nodes/gpus with include/exclude")
        pool = pool or {"localhost": 4}
        active = runner.parse_inclusion_exclusion(pool, args.include, args.exclude)
        active = runner.apply_num_nodes_and_gpus(active, args.num_nodes, args.num_gpus)
        out.append(sum(len(slots) for slots in active.values()))
    except ValueError:
        out.append("error")
print(json.dumps(out))
"""
ENV_RUNS = [2, 2, 1, 3, "error", "error", 4, "error", "error", 1]


def _env_line(visible_devices: str, options: str) -> str:
    return f"CUDA_VISIBLE_DEVICES={visible_devices} deepspeed {options} train.py"


@pytest.mark.parametrize("case, runs", list(zip(ENV_CASES, ENV_RUNS)))
def test_cuda_visible_devices_on_a_deepspeed_line_is_its_include(case, runs):
    from gemma_doctor.readers import launch

    tc = launch.parse(_env_line(*case), visible=4)
    ours = "error" if not tc.ok else (tc.get("num_processes").value if tc.get("num_processes") else 4)
    assert ours == runs, (case, tc.error)
    if not tc.ok and case[1] == "":
        assert "CUDA_VISIBLE_DEVICES" in tc.error and "\n" not in tc.error, tc.error


def test_check_plans_the_gpus_cuda_visible_devices_names(cli, model):
    planned, gd601 = _run(cli, model, "CUDA_VISIBLE_DEVICES=0,1 deepspeed train.py")  # --gpu A100: no probe
    assert (planned, gd601) == (2, []), (planned, gd601)


@pytest.mark.slow
def test_the_env_cases_are_what_deepspeed_s_runner_runs():
    from tests.venvs import ensure_deepspeed

    env = {**os.environ, "PYTHONPATH": str(ensure_deepspeed())}
    out = subprocess.run([sys.executable, "-c", _DEEPSPEED_ENV, json.dumps(ENV_CASES)], capture_output=True, text=True,
                         env=env, check=True, timeout=600)
    assert json.loads(out.stdout.splitlines()[-1]) == ENV_RUNS
