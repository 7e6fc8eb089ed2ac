"""The 2-rank rehearsal's parent side without a child (gemma_doctor/rehearse/ranks.py): what an accelerate config's
sharding is, what the CPU ranks replace, the ranks' records judged, and the options' one-line errors."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from gemma_doctor.rehearse import ranks

FSDP = {"distributed_type": "FSDP", "num_processes": 8, "mixed_precision": "bf16",
        "fsdp_config": {"fsdp_version": 2, "fsdp_auto_wrap_policy": "TRANSFORMER_BASED_WRAP",
                        "fsdp_transformer_layer_cls_to_wrap": "Gemma3DecoderLayer",
                        "fsdp_cpu_ram_efficient_loading": True,
                        "fsdp_sync_module_states": True, "fsdp_state_dict_type": "FULL_STATE_DICT"}}


@pytest.mark.parametrize("config, expected", [
    (FSDP, "fsdp"), ({"fsdp_config": {"fsdp_version": 1}}, "fsdp"), ({"distributed_type": "DEEPSPEED"}, "deepspeed"),
    ({"deepspeed_config": {"zero_stage": 3}}, "deepspeed"), ({"distributed_type": "MULTI_GPU"}, None), ({}, None),
])
def test_the_sharding_of_an_accelerate_config(config, expected):
    assert ranks.kind(config) == expected


def test_what_a_cpu_cannot_do_is_replaced_and_said_and_nothing_else():
    said = ranks.replacements(FSDP)
    assert any(s.startswith("sync_module_states needs an accelerator device") for s in said)
    assert any(s.startswith("cpu_ram_efficient_loading needs sync_module_states") for s in said)
    assert "num_processes 8: 2 CPU ranks" in said and any("gloo" in s for s in said)
    # bf16 runs on the CPU ranks; version, wrap policy and classes, state-dict type are kept (not said as replaced)
    assert not any("mixed_precision" in s or "fsdp_version" in s or "Gemma3DecoderLayer" in s for s in said)
    assert "mixed_precision fp16: bf16 on the CPU ranks (fp16 and fp8 need a GPU)" in \
        ranks.replacements({**FSDP, "mixed_precision": "fp16"})
    plain = ranks.replacements({"fsdp_config": {"fsdp_sync_module_states": False}, "num_processes": 2})
    assert len(plain) == 1 and "gloo" in plain[0]


def _ok(rank: int, **extra) -> list[dict]:
    stages = [{"stage": s, "status": "ok", "rank": rank} for s in ranks.RANK_STAGES]
    extra = {"reload": {"state_dict_type": "FULL_STATE_DICT", "max_abs_diff": 0.0, "scale": 1.0}, **extra}
    for s in stages:
        s.update(extra.get(s["stage"], {}))
    return stages + [{"stage": "done", "status": "ok", "rank": rank}]


def codes(found) -> list[str]:
    return [f.code for f in found]


def test_healthy_ranks_give_no_finding():
    good = {"agree": {"digest": "ab"}, "train": {"losses": [5.5, 5.4]},
            "reload": {"state_dict_type": "FULL_STATE_DICT", "max_abs_diff": 0.0, "scale": 0.3}}
    assert ranks.judge({0: _ok(0, **good), 1: _ok(1, **good)}, None, 0.05) == []


def test_each_broken_invariant_across_ranks_is_its_finding():
    r0 = _ok(0, agree={"digest": "ab"}, train={"losses": [5.5, 5.4]},
             reload={"state_dict_type": "SHARDED_STATE_DICT", "max_abs_diff": None, "why": "from_pretrained fails"})
    r1 = _ok(1, agree={"digest": "cd"}, train={"losses": [5.5, float("nan")]})
    found = ranks.judge({0: r0, 1: r1}, None, 0.05)
    assert codes(found) == ["GD991", "GD992", "GD993"]
    assert "rank 1" in found[0].message and "SHARDED_STATE_DICT" in found[2].message
    logits = _ok(0, reload={"state_dict_type": "FULL_STATE_DICT", "max_abs_diff": 1.0, "scale": 2.0})
    assert codes(ranks.judge({0: logits, 1: _ok(1)}, None, 0.05)) == ["GD993"]


def test_a_crash_on_one_rank_gives_that_ranks_line_and_the_rank_stopped_with_it_is_not_blamed():
    r0 = [{"stage": "load", "status": "ok", "rank": 0}]
    r1 = [{"stage": "load", "status": "ok", "rank": 1},
          {"stage": "train", "status": "error", "rank": 1, "line": "RuntimeError: boom on rank 1"}]
    found = ranks.judge({0: r0, 1: r1}, "the script exited with status 1", 0.05)
    assert codes(found) == ["GD990"] and found[0].message == "rank 1 crashed at train: RuntimeError: boom on rank 1"


def test_a_rank_that_hangs_is_named_with_the_last_stage_it_reached():
    found = ranks.judge({0: [{"stage": "load", "status": "ok", "rank": 0}]}, "timeout after 9 s", 0.05)
    assert codes(found) == ["GD990", "GD990"]
    assert "rank 0 did not finish its stages (timeout after 9 s); last stage reached: load" == found[0].message
    assert found[1].message.endswith("last stage reached: start")


def test_a_wrap_class_the_model_lacks_is_one_finding_with_the_class_to_name():
    line = "ValueError: Could not find the transformer layer class Gemma2DecoderLayer in the model."
    crash = [{"stage": "wrap", "status": "error", "rank": r, "line": line, "classes": ["Gemma2DecoderLayer"],
              "suggest": "Gemma3DecoderLayer"} for r in range(2)]
    found = ranks.judge({0: [crash[0]], 1: [crash[1]]}, None, 0.05)
    assert codes(found) == ["GD994"] and found[0].fix.endswith("Gemma3DecoderLayer")
    nothing = _ok(0, wrap={"policy": "transformer_based_wrap", "classes": ["X"], "wrapped": 0})
    assert codes(ranks.judge({0: nothing, 1: _ok(1)}, None, 0.05)) == ["GD994"]


def test_the_options_that_cannot_go_together_are_one_line(tmp_path, cli):
    from tests.test_rehearse import model_folder

    config = tmp_path / "fsdp.yaml"
    config.write_text("distributed_type: FSDP\nfsdp_config: {fsdp_version: 2}\n")
    (tmp_path / "train.py").write_text("")
    target = model_folder(tmp_path, "gemma3_text")
    for extra in (("--real-weights",), ("--launch", f"python {tmp_path / 'train.py'}")):
        got = cli("rehearse", target, "--accelerate-config", config, *extra)
        assert got.code == 2 and got.out == "" and got.err.count("\n") == 1, got.err


def test_an_accelerate_config_that_is_not_a_mapping_is_one_line(tmp_path):
    from gemma_doctor.errors import UsageError

    bad = tmp_path / "bad.yaml"
    bad.write_text("- just\n- a list\n")
    with pytest.raises(UsageError, match="accelerate config"):
        ranks.read_config(bad)


def test_deepspeed_not_installed_is_named_never_skipped(tmp_path, monkeypatch):
    import importlib.util

    from gemma_doctor.rehearse.runner import Rehearsal

    config = tmp_path / "ds.yaml"
    config.write_text("distributed_type: DEEPSPEED\ndeepspeed_config: {zero_stage: 3}\n")
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "deepspeed" else real(name, *a))
    result = ranks.rehearse_ranks(Rehearsal("t", "r", "transformers"), {}, config, 10)
    assert codes(result.findings) == ["GD950"] and "DeepSpeed is not installed" in result.findings[0].message


@pytest.mark.parametrize("line", ["deepspeed --num_gpus 8 train.py --deepspeed ds.json",
                                  "torchrun --nproc-per-node 2 train.py --deepspeed=ds.json",
                                  "accelerate launch --use_deepspeed train.py", "accelerate launch --config_file "
                                  "ACCEL train.py"])
def test_a_deepspeed_launch_line_where_deepspeed_is_not_installed_is_gd950_and_runs_nothing(cli, tmp_path, line,
                                                                                           monkeypatch):
    """The main venv holds no DeepSpeed (the pinned stack): a launch line that runs it is named, never started."""
    import importlib.util

    from tests.test_rehearse import model_folder

    assert importlib.util.find_spec("deepspeed") is None
    (tmp_path / "train.py").write_text("raise SystemExit('never run')\n")
    (tmp_path / "accel.yaml").write_text("distributed_type: DEEPSPEED\ndeepspeed_config: {zero_stage: 2}\n")
    monkeypatch.chdir(tmp_path)
    got = cli("rehearse", model_folder(tmp_path, "gemma3_text"), "--launch", line.replace("ACCEL", "accel.yaml"),
              "--format", "json")
    doc = got.json()["rehearsals"][0]
    assert got.code == 1 and codes_of(doc) == ["GD950"] and doc["stages"] == [], doc["findings"]
    assert "DeepSpeed is not installed" in doc["findings"][0]["message"]


def test_a_deepspeed_line_runs_its_script_on_two_cpu_ranks_under_torchs_launcher(tmp_path):
    import sys

    argv = ["/venv/bin/deepspeed", "--num_gpus", "8", "--master_port=29600", "--bind_cores_to_rank", "train.py",
            "--deepspeed", "ds.json", "--lr", "1"]
    out, notes = ranks.cpu_launch(argv, tmp_path)
    assert out == [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", "train.py",
                   "--deepspeed", "ds.json", "--lr", "1"]
    assert len(notes) == 1 and "--num_gpus 8 --master_port=29600 --bind_cores_to_rank" in notes[0]


def test_a_launched_deepspeed_accelerate_config_is_a_copy_on_two_ranks_and_nothing_else_changed(tmp_path):
    """`--num_processes 8` on 2 cores started 8 ranks, each importing the stack (measured: killed after a minute)."""
    import yaml

    config = tmp_path / "ds.yaml"
    settings = {"distributed_type": "DEEPSPEED", "num_processes": 8, "mixed_precision": "bf16",
                "deepspeed_config": {"deepspeed_config_file": "ds.json", "zero3_init_flag": False}}
    config.write_text(yaml.safe_dump(settings))
    out, notes = ranks.cpu_launch(["accelerate", "launch", "--config_file", str(config), "--num_processes", "8",
                                   "train.py"], tmp_path)
    copy = tmp_path / "accelerate-cpu.yaml"
    assert out == ["accelerate", "launch", "--config_file", str(copy), "--num_processes", "2", "train.py"]
    assert yaml.safe_load(copy.read_text()) == {**settings, "num_processes": 2, "num_machines": 1}
    assert notes == ["on CPU ranks: num_processes 8: 2 CPU ranks"]


def codes_of(doc: dict) -> list[str]:
    return [f["code"] for f in doc["findings"]]


def test_an_fsdp_config_launched_on_cpu_ranks_is_a_copy_with_what_a_cpu_cannot_do_replaced(tmp_path):
    import yaml

    config = tmp_path / "fsdp.yaml"
    config.write_text(yaml.safe_dump(FSDP))
    argv = ["accelerate", "launch", "--config_file", str(config), "--num_processes", "8", "train.py", "--lr", "1"]
    out, notes = ranks.cpu_launch(argv, tmp_path)
    copy = tmp_path / "accelerate-cpu.yaml"
    assert out == ["accelerate", "launch", "--config_file", str(copy), "--num_processes", "2", "train.py", "--lr", "1"]
    written = yaml.safe_load(copy.read_text())
    assert written["fsdp_config"] == {**FSDP["fsdp_config"], "fsdp_sync_module_states": False,
                                      "fsdp_cpu_ram_efficient_loading": False}
    assert written["num_processes"] == 2 and any("MULTI_CPU" in n for n in notes)
    out, _ = ranks.cpu_launch(["accelerate", "launch", f"--config_file={config}", "train.py"], tmp_path)
    assert out[2] == f"--config_file={copy}"


@pytest.mark.parametrize("argv", [["python", "train.py"], ["torchrun", "--nproc_per_node", "2", "train.py"],
                                  ["accelerate", "launch", "train.py"]])
def test_a_launch_without_an_fsdp_config_is_left_as_it_is(tmp_path, argv):
    assert ranks.cpu_launch(argv, tmp_path) == (argv, [])


def test_a_launched_config_that_is_not_fsdp_is_left_as_it_is(tmp_path):
    config = tmp_path / "ddp.yaml"
    config.write_text("distributed_type: MULTI_GPU\nnum_processes: 8\n")
    argv = ["accelerate", "launch", "--config_file", str(config), "train.py"]
    assert ranks.cpu_launch(argv, tmp_path) == (argv, [])


def test_a_crash_on_a_launched_scripts_other_rank_is_recorded_with_its_rank(tmp_path, monkeypatch):
    """Under a launcher only rank 0 spoke: a rank 1 that crashed alone was heard only as the launcher's exit status
    and last line."""
    import json

    from gemma_doctor.rehearse.hook import probe

    events = tmp_path / "events.jsonl"
    plan = {"root": str(tmp_path), "events": str(events)}
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    state = probe._State(plan)
    state.write("setup", "ok", trainer="Trainer")  # rank 0 speaks for the run
    state.error("train", RuntimeError("boom on this rank"))
    records = [json.loads(line) for line in events.read_text().splitlines()]
    assert [(r["stage"], r["status"], r["rank"], r["line"]) for r in records] == \
        [("train", "error", 1, "[rank 1] RuntimeError: boom on this rank")]


def test_a_rank_whose_in_step_stage_fails_ends_at_once_with_its_record(tmp_path):
    """On several ranks the accumulation check's and the resume's copies train in step (collectives on every step):
    before, a rank whose copy failed recorded it and went on to the next stage while the other waited in this one's
    collective, and both held until the deadline (GD952). The rank now ends, its record saying so; on one process the
    script goes on as before."""
    import json
    import subprocess
    import sys

    code = ("from gemma_doctor.rehearse.hook import probe\n"
            f"s = probe._State({{'root': {str(tmp_path)!r}, 'events': {str(tmp_path / 'events.jsonl')!r}}})\n"
            "s.in_step_failed('accumulation', RuntimeError('out of memory on this rank'))\n"
            "print('went on')\n")
    for world, status, said in (("2", 1, ""), ("1", 0, "went on\n")):
        (tmp_path / "events.jsonl").unlink(missing_ok=True)
        got = subprocess.run([sys.executable, "-c", code], env={**os.environ, "RANK": world == "2" and "1" or "0",
                                                                 "WORLD_SIZE": world},
                             capture_output=True, text=True, timeout=120)
        assert (got.returncode, got.stdout) == (status, said), got.stderr[-2000:]
        records = [json.loads(line) for line in (tmp_path / "events.jsonl").read_text().splitlines()]
        assert [(r["stage"], r["status"], r.get("ends_rank")) for r in records] == \
            [("accumulation", "error", True if world == "2" else None)]
    # the rank's own traceback in the launch's log
    assert "RuntimeError: out of memory on this rank" in \
        subprocess.run([sys.executable, "-c", code], env={**os.environ, "RANK": "1", "WORLD_SIZE": "2"},
                       capture_output=True, text=True, timeout=120).stderr


ENDED = {"stage": "accumulation", "status": "error", "rank": 1, "ends_rank": True,
         "line": "[rank 1] RuntimeError: out of memory on this rank"}
PEER = {"stage": "accumulation", "status": "error", "rank": 0, "ends_rank": True,
        "line": "[rank 0] RuntimeError: [../gloo/transport/tcp/pair.cc:553] Connection closed by peer [127.0.0.1]:1"}


def test_the_failure_that_ended_a_rank_is_the_runs_and_the_other_ranks_failure_after_it_its_consequence():
    from gemma_doctor.rehearse import invariants
    from gemma_doctor.rehearse.launch import first_failure

    records = first_failure([{"stage": "train", "status": "ok"}, dict(ENDED), dict(PEER)])
    assert [(r["stage"], r["status"], r.get("rank")) for r in records] == [("train", "ok", None),
                                                                           ("accumulation", "error", 1)]
    found = invariants.judge(records, [])
    assert [f.code for f in found] == ["GD963"]
    assert found[0].message.startswith("the rehearsal crashed at the gradient accumulation check: [rank 1] "
                                       "RuntimeError: out of memory on this rank (rank 1 ended there, out of step "
                                       "with the others: rank 0 then stopped (RuntimeError: ")
    assert "Connection closed by peer" in found[0].message
    assert (found[0].details["rank"], [t["rank"] for t in found[0].details["then"]]) == (1, [0])
    # both ranks meeting the same failure: said once
    same = first_failure([dict(ENDED), {**ENDED, "rank": 0, "line": "[rank 0] RuntimeError: out of memory on this rank"}])
    assert invariants.judge(same, [])[0].message.endswith("(rank 1 ended there, out of step with the others: rank 0 "
                                                          "met the same)")


def test_a_ranks_failure_the_run_went_on_from_folds_nothing():
    """A rank-0-only failure the script goes on from (the save stage's reload) is not the cause of a later failure of
    another rank: each is its own finding, as before."""
    from gemma_doctor.rehearse.launch import first_failure

    saved = {"stage": "save", "status": "error", "rank": 0, "line": "[rank 0] OSError: no file"}
    got = first_failure([dict(saved), {**ENDED, "stage": "resume"}])
    assert [(r["stage"], r["rank"], r.get("then")) for r in got] == [("save", 0, None), ("resume", 1, [])]
