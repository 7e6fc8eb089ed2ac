"""`rehearse TARGET --training-config T --accelerate-config fsdp.yaml`: the twin trained on 2 CPU (gloo) ranks by
torch's launcher, sharded by torch's FSDP as accelerate's own launcher and plugin read the config
(gemma_doctor/rehearse/ranks.py); a launched 2-rank script whose rank hangs, killed with its process group; and the
user's own Trainer script asking for FSDP under `torchrun --nproc-per-node 2` (gemma_doctor/rehearse/hook/probe.py),
its accumulation check and resume on both ranks, healthy and broken (checkpoints that hold no optimizer
state, a wrap class the model lacks), and a rank that fails alone in the accumulation check's copy.

Each 2-rank run is a child of two processes importing the stack (most of its seconds), so there are six, marked
slow; a launched run is made once per module (a module-scoped fixture) and its tests read it. The twin is built once
for the module, in this process, and kept (GEMMA_DOCTOR_TWIN_CACHE): every run copies it.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
from pathlib import Path

import pytest

from gemma_doctor.rehearse import kept
from tests.kept_twins import kept_twin
from tests.test_rehearse import model_folder

pytestmark = pytest.mark.slow
SCRIPTS = Path(__file__).resolve().parent / "scripts" / "ranks"
LAUNCH = Path(__file__).resolve().parent / "scripts" / "launch"
REPO = "google/tiny-gemma3_text"  # model_folder's folder google--tiny-gemma3_text names this repo id
LORA = """\
learning_rate: 0.001
per_device_train_batch_size: 2
use_peft: true
lora_r: 8
lora_target_modules: [q_proj, v_proj]
"""
FSDP = """\
compute_environment: LOCAL_MACHINE
distributed_type: FSDP
mixed_precision: bf16
num_machines: 1
num_processes: 8
fsdp_config:
  fsdp_version: {version}
  fsdp_auto_wrap_policy: TRANSFORMER_BASED_WRAP
  fsdp_transformer_layer_cls_to_wrap: {wrap}
  fsdp_state_dict_type: {state}
  fsdp_offload_params: false
  fsdp_cpu_ram_efficient_loading: true
  fsdp_sync_module_states: true
  fsdp_activation_checkpointing: {checkpointing}
  fsdp_use_orig_params: true
"""


@pytest.fixture(scope="module")
def target(tmp_path_factory) -> Path:
    return model_folder(tmp_path_factory.mktemp("target"), "gemma3_text")


@pytest.fixture(scope="module", autouse=True)
def twins(tmp_path_factory, target) -> Path:
    """The module's twin folder with the twin of ``target`` kept in it, built here by the rehearsal's own builder
    (tests/kept_twins.py)."""
    folder = kept_twin(tmp_path_factory, target, 2)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(kept.ENV, str(folder))
        yield folder


def rehearse(cli, target: Path, tmp_path: Path, *, version: int = 1, wrap: str = "Gemma3DecoderLayer",
             state: str = "FULL_STATE_DICT", checkpointing: str = "false", lora: bool = True) -> tuple[int, dict]:
    (tmp_path / "lora.yaml").write_text(LORA if lora else LORA.split("use_peft")[0])
    (tmp_path / "fsdp.yaml").write_text(FSDP.format(version=version, wrap=wrap, state=state,
                                                    checkpointing=checkpointing))
    got = cli("rehearse", target, "--training-config", tmp_path / "lora.yaml", "--accelerate-config",
              tmp_path / "fsdp.yaml", "--steps", "2", "--device", "cpu", "--format", "json")
    return got.code, got.json()["rehearsals"][0]


def test_a_healthy_fsdp2_config_rehearses_on_two_ranks_without_a_finding(cli, target, tmp_path):
    code, doc = rehearse(cli, target, tmp_path, version=2, checkpointing="true", lora=False)
    assert doc["findings"] == [] and code == 0, doc["findings"]
    by_rank = {r: [s["stage"] for s in doc["stages"] if s.get("rank") == r and s["status"] == "ok"] for r in (0, 1)}
    assert by_rank == {0: ["load", "wrap", "train", "agree", "save", "reload"],
                       1: ["load", "wrap", "train", "agree", "save"]}
    wrap = next(s for s in doc["stages"] if s["stage"] == "wrap")
    # the user's settings kept: FSDP2, the wrap class (both decoder layers of the twin), checkpointing, state-dict type
    assert (wrap["version"], wrap["classes"], wrap["wrapped"], wrap["activation_checkpointing"]) == \
        (2, ["Gemma3DecoderLayer"], 2, True) and wrap["state_dict_type"].endswith("FULL_STATE_DICT")
    assert len({s["digest"] for s in doc["stages"] if s["stage"] == "agree"}) == 1
    reload = next(s for s in doc["stages"] if s["stage"] == "reload")
    assert reload["adapter_tensors"] is None and reload["max_abs_diff"] <= 0.05 * reload["scale"]
    # what a CPU cannot do is replaced and said
    assert any("sync_module_states needs an accelerator device" in n for n in doc["notes"])
    assert any("num_processes 8: 2 CPU ranks" in n for n in doc["notes"])


def test_an_fsdp1_lora_run_that_saves_an_empty_adapter_is_found(cli, target, tmp_path):
    """Reproduced on the pinned stack: under FSDP1 (TRL 1.16's own accelerate_configs/fsdp1.yaml) the adapter's module
    names hold _fsdp_wrapped_module. inside them, and PEFT 0.21.2 (tuners_utils._get_tuner_state_dict_key_prefixes)
    strips it only at the front, so save_pretrained(state_dict=full state), as the Trainer saves, writes an
    adapter_model.safetensors without a tensor, silently; the reloaded adapter is a fresh one. (FSDP2 with
    fsdp_activation_checkpointing does the same through _checkpoint_wrapped_module.; FSDP2 without it saves all.)"""
    code, doc = rehearse(cli, target, tmp_path, version=1)
    assert code == 1 and [f["code"] for f in doc["findings"]] == ["GD993"], doc["findings"]
    assert "the adapter saved holds no tensor" in doc["findings"][0]["message"]
    assert "_fsdp_wrapped_module" in doc["findings"][0]["message"] and "FSDP2" in doc["findings"][0]["fix"]


def test_a_launched_fsdp_config_runs_on_two_cpu_ranks_and_a_rank_that_hangs_is_killed_at_the_deadline(
        cli, target, tmp_path, monkeypatch):
    """`accelerate launch --config_file fsdp.yaml --num_processes 8`: the config's device-only settings made
    accelerate stop in every rank's Accelerator() ("no available devices") and 8 ranks were started; the copy for CPU
    ranks replaces them (said in the notes). Rank 1 then hangs: the deadline kills every process of the run."""
    (tmp_path / "fsdp.yaml").write_text(FSDP.format(version=1, wrap="Gemma3DecoderLayer", state="FULL_STATE_DICT",
                                                    checkpointing="false"))
    monkeypatch.chdir(SCRIPTS)
    pids = tmp_path / "pids"
    pids.mkdir()
    got = cli("rehearse", target, "--launch", f"accelerate launch --config_file {tmp_path / 'fsdp.yaml'} "
              f"--num_processes 8 hang.py {pids} --accelerator", "--device", "cpu", "--timeout", "30",
              "--format", "json")
    doc = got.json()["rehearsals"][0]
    assert got.code == 1 and [f["code"] for f in doc["findings"]] == ["GD952"], doc["findings"]
    assert sorted(p.name for p in pids.iterdir()) == ["rank0.pid", "rank1.pid"]
    assert any("sync_module_states needs an accelerator device" in n for n in doc["notes"])
    assert any("MULTI_CPU" in n for n in doc["notes"])
    # torchrun starts each rank in a session of its own: before the child's mark, the hung rank outlived the
    # deadline (an orphan of init, still sleeping)
    assert [p.name for p in pids.iterdir() if running(int(p.read_text()))] == []


def running(pid: int) -> bool:
    """Whether ``pid`` is a live process (a zombie left to init to reap has ended)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in ("Z", "X")


# -- the user's own Trainer on 2 ranks (torchrun) -----------------------------------------------------------------------
def launched(target: Path, line: str) -> tuple[int, dict]:
    """One `rehearse --launch LINE` in this process, from tests/scripts/launch/ (the cli fixture is per test: a
    module-scoped run cannot take it)."""
    from gemma_doctor.cli import main
    from tests.conftest import INTERNAL_ERROR

    out, err, here = io.StringIO(), io.StringIO(), os.getcwd()
    os.chdir(LAUNCH)
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                main(["rehearse", str(target), "--launch", line, "--steps", "2", "--device", "cpu", "--format", "json"])
                code = 0
            except SystemExit as e:
                code = int(e.code or 0)
    finally:
        os.chdir(here)
    assert code != INTERNAL_ERROR, err.getvalue()[-3000:]
    return code, json.loads(out.getvalue())["rehearsals"][0]


@pytest.fixture(scope="module")
def fsdp_script(target, twins) -> tuple[int, dict]:
    """The LoRA Trainer script with `fsdp="full_shard auto_wrap"` of Gemma3DecoderLayer, resumed
    (train(resume_from_checkpoint=True)), on 2 ranks."""
    return launched(target, f"torchrun --nproc-per-node 2 train_hf.py {REPO} --fsdp --resume")


@pytest.fixture(scope="module")
def fsdp_script_broken(target, twins) -> tuple[int, dict]:
    """The same broken twice in one child: save_only_model=True (checkpoints without the optimizer's and scheduler's
    state) and Gemma2DecoderLayer as the FSDP wrap class of a Gemma 3 model."""
    return launched(target, f"torchrun --nproc-per-node 2 train_hf.py {REPO} --fsdp --resume --save-only-model "
                            "--wrap Gemma2DecoderLayer")


def by_stage(doc: dict) -> dict:
    return {s["stage"]: s for s in doc["stages"]}


def test_the_users_trainer_asking_for_fsdp_rehearses_every_stage_on_two_cpu_ranks(fsdp_script):
    code, doc = fsdp_script
    assert doc["findings"] == [] and code == 0, doc["findings"]
    by = by_stage(doc)
    assert [by[name]["status"] for name in ("setup", "labels", "train", "eval", "save", "generate", "merge",
                                            "accumulation", "resume")] == ["ok"] * 9, doc["stages"]
    assert by["setup"]["ranks"] == 2 and by["setup"]["trainer"] == "Trainer"
    # accelerate 1.15 turns FSDP on for accelerator devices only: the Trainer trained every CPU rank a whole replica,
    # and the report says so instead of calling the run sharded
    assert by["setup"]["sharding"] is None
    assert any("asks for FSDP" in n and "MULTI_CPU" in n for n in by["setup"]["notes"]), by["setup"]["notes"]
    train = by["train"]
    assert train["steps"] == 2 and train["lora_b"] == {"count": 4, "moved": 4} and train["moved"] == train["trainable"]
    assert by["save"]["max_abs_diff"] <= 0.05 * by["save"]["scale"]


def test_the_accumulation_check_runs_on_both_ranks_each_on_its_own_rows(fsdp_script):
    """Before: `skipped` ("the check runs on one process") on every run of several ranks."""
    _, doc = fsdp_script
    acc = by_stage(doc)["accumulation"]
    assert (acc["ranks"], acc["micro"], acc["k"]) == (2, 1, 2)
    # exact as on one process: 2 ranks x 1 x 2 against 2 ranks x one batch of 2, the same 4 rows
    assert acc["accumulated_loss"] == pytest.approx(acc["whole_loss"], rel=1e-4)
    assert acc["accumulated_grad_norm"] == pytest.approx(acc["whole_grad_norm"], rel=1e-3)


def test_the_resume_runs_on_both_ranks_and_continues_the_run(fsdp_script):
    """Before: `skipped` ("the resume runs on one process")."""
    _, doc = fsdp_script
    resume = by_stage(doc)["resume"]
    assert (resume["checkpoint"], resume["last"], resume["steps"]) == (1, 2, [2])
    assert resume["optimizer_restored"]["with_state"] == resume["optimizer_restored"]["uninterrupted"] == 8
    assert resume["losses"] == pytest.approx(resume["expected_losses"], rel=1e-6)
    assert resume["params_max_abs_diff"] == 0.0


def test_a_resume_from_weights_only_checkpoints_is_found_on_two_ranks(fsdp_script_broken):
    """Reproduced on the pinned stack (docs/rehearsal.md, "resume_from_checkpoint"): transformers 5.23 resumes from a
    save_only_model checkpoint with a fresh optimizer and the schedule from its start, without a word; on 2 ranks the
    rehearsal skipped the resume before and said nothing."""
    code, doc = fsdp_script_broken
    assert code == 1 and sorted(f["code"] for f in doc["findings"]) == ["GD994", "GD999"], doc["findings"]
    message = next(f["message"] for f in doc["findings"] if f["code"] == "GD999")
    assert "the optimizer held a state for 0 of its 8 parameters" in message and "learning rate at step 2" in message


def test_an_fsdp_wrap_class_the_model_lacks_is_found_on_cpu_ranks_that_do_not_shard(fsdp_script_broken):
    """accelerate 1.15 stops a GPU run at prepare ("Could not find the transformer layer class Gemma2DecoderLayer in
    the model.", reproduced by --accelerate-config's ranks); on CPU ranks the Trainer never turns FSDP on, so the run
    trained clean as DDP and the rehearsal said nothing of the class before."""
    _, doc = fsdp_script_broken
    found = next(f for f in doc["findings"] if f["code"] == "GD994")
    assert "Gemma2DecoderLayer" in found["message"] and "Could not find the transformer layer class" in found["message"]
    assert "Gemma3DecoderLayer" in found["fix"]
    # the rest of the run went on (the wrap is judged beside it, not instead of it)
    assert by_stage(doc)["train"]["status"] == "ok" and by_stage(doc)["accumulation"]["status"] == "ok"


@pytest.fixture(scope="module")
def rank_fails_in_step(target, twins, tmp_path_factory) -> tuple[int, dict, Path]:
    """The LoRA Trainer script, resumed, on 2 ranks, whose loss raises on rank 1 alone in a Trainer other than its own
    (the accumulation check's first copy); each rank writes its pid."""
    pids = tmp_path_factory.mktemp("pids")
    code, doc = launched(target, f"torchrun --nproc-per-node 2 train_hf.py {REPO} --resume --rank1-fails-copy "
                                 f"--pids {pids}")
    return code, doc, pids


def test_a_rank_that_fails_alone_in_the_accumulation_check_ends_the_rehearsal_at_once(rank_fails_in_step):
    """Before: rank 1 recorded its crash and went on to the resume while rank 0 waited in the check's all-reduce; both
    held until the deadline (GD963 and GD952 after --timeout). Now rank 1 ends there, its launcher stops rank 0, and
    the one finding names the rank, the stage and its line, rank 0's own line ("Connection closed by peer") folded
    into it as its consequence."""
    code, doc, pids = rank_fails_in_step
    assert code == 1 and [f["code"] for f in doc["findings"]] == ["GD963"], doc["findings"]
    found = doc["findings"][0]
    assert found["message"].startswith("the rehearsal crashed at the gradient accumulation check: [rank 1] "
                                       "RuntimeError: a failure rank 1 meets alone (rank 1 ended there")
    assert found["details"]["rank"] == 1 and found["details"]["stage"] == "accumulation"
    assert all(t["rank"] == 0 for t in found["details"]["then"])
    # the run stopped at the check: no resume was attempted, no stage recorded after it
    assert doc["stages"][-1]["stage"] == "accumulation" and "resume" not in by_stage(doc)
    assert [s["stage"] for s in doc["stages"] if s["status"] == "error"] == ["accumulation"]
    # every stage before it rehearsed as usual, and no rank outlived the rehearsal
    assert [by_stage(doc)[n]["status"] for n in ("setup", "train", "save")] == ["ok"] * 3
    assert sorted(p.name for p in pids.iterdir()) == ["rank0.pid", "rank1.pid"]
    assert [p.name for p in pids.iterdir() if running(int(p.read_text()))] == []
