"""`rehearse TARGET --launch "python train.py ..."`: the user's own script, run as it is against the twin, with the
Trainer probe armed through the child's sitecustomize (gemma_doctor/rehearse/hook/). Real scripts
(tests/scripts/launch/), a real transformers Trainer and a real TRL SFTTrainer on the pinned stack, the tiny twin of
tests/test_rehearse.py's Gemma 3 text model, loaded by its repo id from the private cache.

The launch-line parsing and the argument caps are tested without a child; each rehearsal is a child that imports
the stack (most of its seconds), so they are few and marked slow. The twin is built once for the module, in this
process, by the rehearsal's own builder (tests/kept_twins.py, which tests/test_rehearse_ranks.py shares: this process
has imported transformers for the caps' test already, where a build child imported it again), and kept
(GEMMA_DOCTOR_TWIN_CACHE, gemma_doctor/rehearse/kept.py): each launched script gets a copy of it in its own private
cache. What a build child writes and run_script keeps is asserted where a build child runs anyway, in the LEGACY
venv's launch below.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from gemma_doctor.rehearse import kept
from gemma_doctor.rehearse.launch import argv_of, script_of
from tests.kept_twins import kept_twin
from tests.test_rehearse import CONFIGS, model_folder

SCRIPTS = Path(__file__).resolve().parent / "scripts" / "launch"
REPO = "google/tiny-gemma3_text"  # model_folder's folder google--tiny-gemma3_text names this repo id


@pytest.fixture(scope="module")
def twins(tmp_path_factory) -> Path:
    """The module's twin folder, with the twin of model_folder's gemma3_text in it (tests/kept_twins.py)."""
    return kept_twin(tmp_path_factory, model_folder(tmp_path_factory.mktemp("target"), "gemma3_text"), 3)


@pytest.fixture(autouse=True)
def _kept_twin(request, monkeypatch):
    """Every rehearsal of the module's slow tests finds the module's twin kept (their own launched scripts still run)."""
    if request.node.get_closest_marker("slow"):
        monkeypatch.setenv(kept.ENV, str(request.getfixturevalue("twins")))


def launch(cli, tmp_path: Path, line: str, *extra: str) -> tuple[int, dict]:
    got = cli("rehearse", model_folder(tmp_path, "gemma3_text"), "--launch", line, "--format", "json", *extra)
    return got.code, got.json()["rehearsals"][0]


def stages(doc: dict) -> list[tuple[str, str]]:
    return [(s["stage"], s["status"]) for s in doc["stages"]]


# -- the launch line --------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("line, script", [
    ("python train.py --bf16", 1),
    ("python3 -u train.py", 2),
    ("accelerate launch --num_processes 1 --cpu train.py --lr 1e-4", 5),
    ("torchrun --nproc-per-node 1 train.py", 3),
    ("torchrun --standalone --nproc_per_node=1 train.py", 3),
])
def test_the_script_of_a_launch_line_is_found_past_the_launchers_options(line, script):
    assert script_of(line.split()) == script


@pytest.mark.parametrize("line", ["python -m trl sft", "python -c 'print(1)'", "vllm serve google/gemma-3-1b-it",
                                  "accelerate env", "python"])
def test_a_line_that_runs_no_script_file_is_no_script(line):
    assert script_of(line.split()) is None


def test_the_command_runs_this_interpreter_and_the_words_naming_files_become_absolute(tmp_path):
    import sys

    (tmp_path / "train.py").write_text("")
    (tmp_path / "cfg.yaml").write_text("")
    argv, script = argv_of("python train.py --config cfg.yaml --out=cfg.yaml --name run1", tmp_path)
    assert argv == [sys.executable, str(tmp_path / "train.py"), "--config", str(tmp_path / "cfg.yaml"),
                    f"--out={tmp_path / 'cfg.yaml'}", "--name", "run1"]
    assert script == tmp_path / "train.py"


def test_a_word_no_file_system_can_hold_is_passed_on_as_it_is(tmp_path):
    """A 5,000-character argument (ENAMETOOLONG) once ended the rehearsal in an OSError traceback."""
    (tmp_path / "train.py").write_text("")
    long = "x" * 5000
    argv, script = argv_of(f"python train.py --name {long} --tag=a{long}", tmp_path)
    assert argv[-3:] == ["--name", long, f"--tag=a{long}"]
    assert script == tmp_path / "train.py"


def test_a_launch_line_whose_script_is_missing_or_that_runs_no_script_is_one_line(tmp_path, cli, monkeypatch):
    monkeypatch.chdir(tmp_path)
    for line in ("python missing.py", "vllm serve x", "python -m mymodule"):
        got = cli("rehearse", model_folder(tmp_path, "gemma3_text"), "--launch", line)
        assert got.code == 2 and got.out == "" and got.err.count("\n") == 1, (line, got.err)


def test_the_caps_on_a_real_trainingarguments(tmp_path):
    """A few steps, evaluation and saving every step where configured, outputs under the rehearsal's folder."""
    import transformers

    from gemma_doctor.rehearse.hook.probe import cap

    args = transformers.TrainingArguments(output_dir=str(tmp_path / "elsewhere"), eval_strategy="epoch",
                                          save_strategy="epoch", num_train_epochs=50, report_to="all", use_cpu=True)
    root = tmp_path / "root"
    notes = cap(args, 3, root / "out", root)
    assert (args.max_steps, args.eval_strategy.value, args.eval_steps, args.save_strategy.value, args.save_steps) == \
        (3, "steps", 1, "steps", 1)
    assert args.output_dir == str(root / "out") and args.report_to == [] and "outside" in notes[0]
    plain = transformers.TrainingArguments(output_dir=str(root / "kept"), use_cpu=True)
    assert cap(plain, 2, root / "out", root) == [] and plain.output_dir == str(root / "kept")
    assert plain.eval_strategy.value == "no" and plain.save_strategy.value == "steps" and plain.save_steps == 1


# -- the user's scripts, rehearsed ------------------------------------------------------------------------------------
@pytest.mark.slow
@pytest.mark.parametrize("line, trainer", [
    (f"python train_hf.py {REPO} --resume", "Trainer"),  # train(resume_from_checkpoint=True)
    (f"python train_trl.py {REPO}", "SFTTrainer"),  # bf16, written for a GPU: rehearsed on the CPU
])
def test_a_healthy_script_rehearses_without_a_finding(tmp_path, cli, monkeypatch, line, trainer):
    monkeypatch.chdir(SCRIPTS)
    code, doc = launch(cli, tmp_path, line)
    assert doc["findings"] == [] and code == 0
    resumes = [("resume", "ok")] if "--resume" in line else []
    assert stages(doc) == [("twin", "ok"), ("setup", "ok"), ("labels", "ok"), ("eval", "ok"), ("train", "ok"),
                           ("save", "ok"), ("generate", "ok"), ("merge", "ok"), ("accumulation", "ok"), *resumes]
    setup, train, generate, merge, acc = (doc["stages"][i] for i in (1, 4, 6, 7, 8))
    assert setup["trainer"] == trainer
    assert len(train["losses"]) == 3 and train["moved"] == train["trainable"] > 0  # 50 epochs capped at 3 steps
    # After train(), on the checkpoint the save stage reloaded: generation with and without the KV cache, the adapter
    # merged, saved and reloaded from the merged folder.
    assert generate["cached"] == generate["uncached"] and len(generate["cached"]) > generate["prompt"]
    assert merge["merged"]["max_abs_diff"] < 0.05 * merge["merged"]["scale"]
    assert merge["reloaded"]["max_abs_diff"] < 0.05 * merge["reloaded"]["scale"]
    # The script's own trainer built again (its collator, compute_loss and model): 1 x 2 and one batch of 2 agree.
    assert acc["k"] == 2 and acc["accumulated_loss"] == pytest.approx(acc["whole_loss"], rel=1e-3), acc
    assert acc["accumulated_grad_norm"] == pytest.approx(acc["whole_grad_norm"], rel=1e-3), acc
    if resumes:
        # A copy of the script's trainer resumed from checkpoint-2 and trained step 3 as the uninterrupted run did:
        # its optimizer's state restored, the same rate and loss, the same parameters at the end.
        resume = doc["stages"][9]
        assert (resume["checkpoint"], resume["steps"], resume["losses"], resume["learning_rates"]) == \
            (2, [3], resume["expected_losses"], resume["expected_rates"]), resume
        restored = resume["optimizer_restored"]
        assert restored["with_state"] == restored["uninterrupted"] == restored["params"] > 0, restored
        assert resume["params_max_abs_diff"] == 0.0 and resume["params_compared"] > 0, resume
    assert not Path("/tmp/gemma-doctor-launch-test-never-written").exists()


@pytest.mark.slow
def test_a_resume_from_checkpoints_saved_without_the_optimizer_restarts_it_silently(tmp_path, cli, monkeypatch):
    """save_only_model: the checkpoints hold the weights only, and transformers (5.23.0 here) resumes from one without a
    word: a fresh optimizer and the learning-rate schedule from its start (the loss of the resumed step is still the
    same: the weights were restored). Before the resume was rehearsed, resume_from_checkpoint was dropped unchecked."""
    monkeypatch.chdir(SCRIPTS)
    code, doc = launch(cli, tmp_path, f"python train_hf.py {REPO} --resume --save-only-model")
    assert code == 1 and [f["code"] for f in doc["findings"]] == ["GD999"], doc["findings"]
    [f] = doc["findings"]
    assert "the optimizer held a state for 0 of its 8 parameters" in f["message"], f["message"]
    assert "the learning rate at step 3 was 0.001 against 0.0003333" in f["message"], f["message"]
    assert "save_only_model: false" in f["fix"] and "optimizer.pt" not in f["details"]["files"]
    assert f["details"]["losses"] == f["details"]["expected_losses"]


@pytest.mark.slow
def test_a_collator_that_masks_every_label_is_caught_by_the_invariants_under_accelerate_launch(tmp_path, cli,
                                                                                                monkeypatch):
    monkeypatch.chdir(SCRIPTS)
    code, doc = launch(cli, tmp_path, f"accelerate launch --num_processes 1 --cpu train_hf.py {REPO} --mask-all")
    codes = [f["code"] for f in doc["findings"]]
    assert code == 1 and codes[0] == "GD971" and {"GD966", "GD968"} <= set(codes), doc["findings"]


@pytest.mark.slow
def test_a_crashing_script_gives_the_stage_and_its_last_exception_line(tmp_path, cli, monkeypatch):
    monkeypatch.chdir(SCRIPTS)
    code, doc = launch(cli, tmp_path, f"python train_hf.py {REPO} --bad-labels")
    [f] = doc["findings"]
    assert code == 1 and f["code"] == "GD957" and f["key"] == "train", f
    assert f["details"]["exception"] == "ValueError" and "not in the catalogue" in f["fix"]
    assert stages(doc)[-1] == ("train", "error")


@pytest.mark.slow
def test_a_script_that_fails_to_load_its_model_gives_the_load_stage(tmp_path, cli, monkeypatch):
    """Raised outside the Trainer and uncaught: the child's excepthook names the stage from the traceback."""
    monkeypatch.chdir(SCRIPTS)
    code, doc = launch(cli, tmp_path, "python load_only.py google/not-the-target")
    [f] = doc["findings"]
    assert code == 1 and f["code"] == "GD955" and f["key"] == "load", f
    assert f["details"]["exception"] == "OSError"  # offline, and the private cache holds the twin's repo id only


@pytest.mark.slow
def test_a_script_that_builds_no_trainer_is_reported(tmp_path, cli, monkeypatch):
    monkeypatch.chdir(SCRIPTS)
    code, doc = launch(cli, tmp_path, f"python load_only.py {REPO}")
    [f] = doc["findings"]
    assert code == 0 and f["code"] == "GD979" and f["severity"] == "warning"
    assert "built no Trainer: only load/exit were rehearsed" in f["message"]


@pytest.mark.slow
def test_a_script_that_never_ends_is_killed_at_the_deadline_in_one_finding(tmp_path, cli, monkeypatch):
    monkeypatch.chdir(SCRIPTS)
    pid_file = tmp_path / "pid"
    # The twin is kept (the module's fixture), so the deadline covers the kept twin's copy and the script's start, not a
    # build child: an interpreter start with the probe's sitecustomize (0.1 s at load 4 here), which imports nothing
    # heavy. 10 s leaves CI's load a wide margin; the pid file below still proves the script started within it.
    code, doc = launch(cli, tmp_path, f"python forever.py {pid_file}", "--timeout", "10")
    assert code == 1 and [f["code"] for f in doc["findings"]] == ["GD952"], doc["findings"]
    assert "timeout after 10 s" in doc["findings"][0]["message"]
    pid = int(pid_file.read_text())  # the script did start within the deadline
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)


# -- each rank's compute threads --------------------------------------------------------------------------------------
@pytest.mark.parametrize("line, ranks", [
    ("python train.py", 1), ("torchrun train.py", 1), ("torchrun --nproc_per_node 2 train.py", 2),
    ("torchrun --standalone --nnodes 1 --nproc-per-node=3 train.py", 3),
    ("torchrun --nproc_per_node auto train.py", None),
    ("python -m torch.distributed.run --standalone --nproc_per_node=2 -m gemma_doctor.rehearse.ranks", 2),
    ("accelerate launch --num_processes 2 train.py", 2), ("accelerate launch train.py", None),
    ("accelerate launch --config_file fsdp.yaml train.py", 2),
])
def test_the_processes_a_launch_line_starts_are_its_launchers_count(line, ranks, tmp_path):
    from gemma_doctor.rehearse.launch import ranks_of

    (tmp_path / "fsdp.yaml").write_text("distributed_type: FSDP\nnum_processes: 2\n")
    assert ranks_of([str(tmp_path / w) if w == "fsdp.yaml" else w for w in line.split()]) == ranks


@pytest.mark.slow
def test_each_rank_of_a_launched_run_gets_its_share_of_the_rehearsals_threads(tmp_path, cli, monkeypatch):
    """torch 2.13's launcher gives each of its ranks OMP_NUM_THREADS=1 only where the variable is unset; the
    rehearsal's child environment sets it (min(4, cores)), and the launcher passed that to every rank: on 8 cores 2
    ranks ran 4 threads each, on this 2-core machine 2 each. Each rank now gets its share of the 4. The caller's own
    OMP_NUM_THREADS (the suite's 1) would be kept, so none is set here."""
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setattr(os, "cpu_count", lambda: 8)
    monkeypatch.chdir(SCRIPTS)
    code, doc = launch(cli, tmp_path, f"torchrun --nproc_per_node 2 threads.py {tmp_path}")
    assert code == 0 and [f["code"] for f in doc["findings"]] == ["GD979"], doc["findings"]
    seen = {p.name: json.loads(p.read_text()) for p in sorted(tmp_path.glob("rank*.json"))}
    assert {name: rank["omp"] for name, rank in seen.items()} == {"rank0.json": "2", "rank1.json": "2"}, seen
    # torch runs that many intra-op threads, or fewer where the machine has fewer cores (2 cores here: 2 each).
    assert all(1 <= rank["torch"] <= 2 for rank in seen.values()), seen


@pytest.mark.parametrize("line, caller, threads", [
    ("python train.py", None, "4"),  # one process: the rehearsal's default, as before
    ("torchrun --nproc_per_node 1 train.py", None, "4"),
    ("torchrun --nproc_per_node 2 train.py", None, "2"),
    ("accelerate launch --num_processes 3 train.py", None, "1"),
    ("torchrun --nproc_per_node 16 train.py", None, "1"),  # at least 1
    ("torchrun --nproc_per_node auto train.py", None, None),  # unsaid: the launcher's own choice
    ("torchrun --nproc_per_node 2 train.py", "3", "3"),  # the caller's, as it is
])
def test_a_launched_commands_ranks_share_the_rehearsals_threads_and_a_callers_choice_is_kept(
        line, caller, threads, monkeypatch, tmp_path):
    from gemma_doctor.rehearse.launch import rank_threads
    from gemma_doctor.rehearse.process import _environment

    monkeypatch.setattr(os, "cpu_count", lambda: 8)
    if caller is None:
        monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    else:
        monkeypatch.setenv("OMP_NUM_THREADS", caller)
    assert rank_threads(_environment(tmp_path), line.split()).get("OMP_NUM_THREADS") == threads


# -- after train(): the reloaded copy generated from and merged; a catalogue cure rerun -------------------------------
def launch_in(python: Path, tmp_path: Path, line: str, *extra: str, folder: Path | None = None) -> tuple[int, dict]:
    """`rehearse --launch LINE` by ``python`` (a reproduction venv's: its stack runs the script), from SCRIPTS, on
    ``folder`` (the gemma3_text model by default); twins kept in tmp_path/twins."""
    import subprocess

    from tests.venvs import subprocess_env

    folder = folder or model_folder(tmp_path, "gemma3_text")
    done = subprocess.run([str(python), "-m", "gemma_doctor", "rehearse", str(folder),
                           "--launch", line, "--format", "json", *extra], cwd=SCRIPTS, capture_output=True, text=True,
                          timeout=900, env=subprocess_env(**{kept.ENV: str(tmp_path / "twins")}))
    assert done.returncode in (0, 1), done.stderr[-3000:]
    return done.returncode, json.loads(done.stdout)["rehearsals"][0]


@pytest.mark.slow
def test_a_scripts_modules_to_save_adapter_merged_on_peft_0171_loses_the_head(tmp_path):
    """PEFT 0.17.1 (facts.md section 13): LoRA with modules_to_save [embed_tokens, lm_head] on tied embeddings. The
    script saves and trains as it is; the merge stage, on the checkpoint the rehearsal reloaded, finds the merged folder
    reloading as another model (the head tied back). Before the merge stage existed a launched script passed clean."""
    from tests.venvs import V4_LATE, ensure_venv

    code, doc = launch_in(ensure_venv(V4_LATE), tmp_path, f"python train_hf.py {REPO} --modules-to-save", "--steps", "5")
    assert doc["stack"]["peft"] == "0.17.1" and doc["stack"]["transformers"] == "4.57.6"
    assert code == 1 and [f["code"] for f in doc["findings"]] == ["GD977"], doc["findings"]
    assert stages(doc)[-4:] == [("save", "ok"), ("generate", "ok"), ("merge", "ok"), ("accumulation", "ok")]
    [merge] = [s for s in doc["stages"] if s["stage"] == "merge"]
    assert merge["merged"]["max_abs_diff"] < 0.05 * merge["merged"]["scale"]  # the merge itself is base + adapter


@pytest.mark.slow
def test_a_scripts_hybridcache_crash_is_cured_by_the_catalogues_config_change_rerun_once(tmp_path):
    """transformers 4.50.0 (facts.md section 1): the script's bf16 evaluation of Gemma 3 crashes in accelerate's
    convert_to_fp32. Its catalogue cure is a change of config.json (use_cache false on a text-only model): the command
    runs once more on the twin so changed, and its evaluation passes. The rerun's twin is the first run's, kept, with
    the change made to its copy: one twin built."""
    from tests.venvs import LEGACY, ensure_venv

    code, doc = launch_in(ensure_venv(LEGACY), tmp_path, f"python train_hf.py {REPO} --bf16")
    assert doc["stack"]["transformers"] == "4.50.0"
    [f] = doc["findings"]
    assert code == 1 and f["code"] == "GD958" and f["details"]["catalogue"] == "hybridcache-float", f
    assert f["details"]["cure"] == "cure verified in this stack: with use_cache: false in config.json the eval stage " \
                                   "passes", f
    assert stages(doc)[-1] == ("eval", "error")
    # The one twin a build child wrote, kept by run_script (the rerun found it: no second entry).
    assert_kept_as_built(tmp_path / "twins")


@pytest.mark.slow
def test_a_scripts_loss_scaled_by_accumulation_on_transformers_450_is_caught_on_its_own_trainer(tmp_path):
    """GD739's window (Gemma 3's multimodal class under the Trainer, transformers before 4.57) in a launched script:
    after its train(), the script's own Trainer is built again from its constructor arguments, at 1 x 2 and at one
    batch of 2, learning rate 0. The loss and gradient norm of 1 x 2 are twice those of the batch. Before the check
    ran for launched scripts this script rehearsed without a finding. fp32: no HybridCache crash at its evaluation."""
    from tests.venvs import LEGACY, ensure_venv

    folder = model_folder(tmp_path, "gemma3")
    code, doc = launch_in(ensure_venv(LEGACY), tmp_path, "python train_hf.py google/tiny-gemma3 --image-text",
                          folder=folder)
    assert doc["stack"]["transformers"] == "4.50.0"
    assert code == 1 and [f["code"] for f in doc["findings"]] == ["GD978", "GD978"], doc["findings"]
    assert stages(doc)[-4:] == [("save", "ok"), ("generate", "ok"), ("merge", "ok"), ("accumulation", "ok")]
    [acc] = [s for s in doc["stages"] if s["stage"] == "accumulation"]
    assert acc["k"] == 2  # the script's own gradient_accumulation_steps
    assert acc["accumulated_loss"] / acc["whole_loss"] == pytest.approx(2.0, rel=0.01), acc
    assert acc["accumulated_grad_norm"] / acc["whole_grad_norm"] == pytest.approx(2.0, rel=0.05), acc


def test_a_catalogue_cure_a_launched_script_cannot_take_is_said_not_rehearsed(tmp_path):
    """A cure that is not a change of the twin (token_type_ids: a collator change or an upgrade) is not applied to a
    launched script, and the report says so; the driver's run says nothing more, as before. No child runs."""
    from gemma_doctor.rehearse.runner import _rehearse_cure
    from gemma_doctor.report import Finding, Severity

    found = Finding("GD957", Severity.ERROR, "the rehearsal crashed at training", key="train", fix="catalogue X",
                    details={"stage": "train", "catalogue": "token-type-ids-required"})
    plan = {"target_dir": str(model_folder(tmp_path, "gemma3_text")), "stages": ["train"]}
    said = _rehearse_cure(found, plan, 1, [], ["python", "train.py"])
    assert said.details["cure"].startswith("its cure is not rehearsed: the launched command runs with its script")
    assert said.fix.startswith("catalogue X; its cure is not rehearsed")
    assert _rehearse_cure(found, plan, 1, []) is found


# -- gradient accumulation (the driver's accumulation stage) ---------------------------------------------------------
@pytest.mark.parametrize("given, k", [(None, 2), (1, 2), (3, 3), (16, 4), (True, 2), ("8", 2)])
def test_the_accumulation_steps_checked_are_the_runs_own_at_least_two_at_most_four(given, k):
    from gemma_doctor.rehearse.accumulation import steps_of

    assert steps_of(given) == k


def test_a_loss_scaled_by_the_accumulation_steps_is_two_findings_and_rounding_is_none():
    from gemma_doctor.rehearse import invariants

    scaled = {"micro": 1, "k": 2, "accumulated_loss": 12.9, "whole_loss": 6.45, "accumulated_grad_norm": 2.1,
              "whole_grad_norm": 1.05}
    found = invariants.judge([{"stage": "accumulation", "status": "ok", **scaled}], [])
    assert [f.code for f in found] == ["GD978", "GD978"] and "ratio 2" in found[0].message
    rounding = {**scaled, "accumulated_loss": 6.46, "accumulated_grad_norm": 1.07}
    assert invariants.judge_accumulation(rounding) == []


@pytest.mark.slow
def test_accumulation_on_the_pinned_stack_is_equivalent(tmp_path):
    """The run of test_rehearse_venvs.py's transformers 4.50 case (Gemma 3's multimodal class under the plain
    Trainer, bf16, LoRA), on the pinned transformers: b x k and one batch of b*k agree (no false alarm). Only the
    stages the check needs run in the child."""
    from gemma_doctor.rehearse import invariants
    from gemma_doctor.rehearse.runner import _run_child, plan_for
    from tests.test_rehearse_venvs import PLAIN_LORA

    config = tmp_path / "t.yaml"
    config.write_text(PLAIN_LORA)
    plan, findings, _, _ = plan_for(str(model_folder(tmp_path, "gemma3")), None, "main", config, 1)
    records, ended = _run_child({**plan, "stages": ["load", "setup", "accumulation"]}, 600)
    assert ended is None and findings == []
    [acc] = [r for r in records if r["stage"] == "accumulation"]
    assert acc["status"] == "ok" and acc["k"] == 2, acc
    assert invariants.judge_accumulation(acc) == []
    for what in ("loss", "grad_norm"):
        assert acc[f"accumulated_{what}"] == pytest.approx(acc[f"whole_{what}"], rel=0.02), acc


# -- resume_from_checkpoint (hook/probe.py: resume) ------------------------------------------------------------------
RESUMED = {"checkpoint": 2, "last": 3, "files": ["adapter_model.safetensors", "optimizer.pt", "scheduler.pt"],
           "steps": [3], "losses": [5.6], "expected_losses": [5.6], "learning_rates": [3.3e-4],
           "expected_rates": [3.3e-4], "optimizer_restored": {"params": 8, "with_state": 8},
           "params_max_abs_diff": 0.0, "params_scale": 0.18}


@pytest.mark.parametrize("change, said", [
    ({"steps": [1, 2, 3]}, "it trained steps [1, 2, 3] where the steps after checkpoint-2 are [3]"),
    ({"losses": [12.4]}, "the loss at step 3 was 12.4 against 5.6 without the stop"),
    ({"params_max_abs_diff": 0.01}, "differ from the uninterrupted run's by 0.01"),
])
def test_a_resume_that_does_not_continue_the_run_is_one_finding_naming_what_broke(change, said):
    from gemma_doctor.rehearse import invariants

    assert invariants.judge([{"stage": "resume", "status": "ok", **RESUMED}], []) == []
    # LoRA on Gemma 3's vision tower, which text rows never run: no gradient, no optimizer state without the stop
    # either (pinned stack, the multimodal class: 8 of 12). Once judged against all 12: a false GD999.
    towers = {**RESUMED, "optimizer_restored": {"params": 12, "with_state": 8, "uninterrupted": 8}}
    assert invariants.judge([{"stage": "resume", "status": "ok", **towers}], []) == []
    [f] = invariants.judge([{"stage": "resume", "status": "ok", **RESUMED, **change}], [])
    assert f.code == "GD999" and said in f.message and f.fix.startswith("not in the catalogue"), f.message
    crash = invariants.judge([{"stage": "resume", "status": "error", "line": "ValueError: x"}], [])
    assert [(c.code, c.key) for c in crash] == [("GD998", "resume")]


# -- trl dpo --config (the driver, TRL's DPOTrainer) ------------------------------------------------------------------
@pytest.mark.parametrize("line, found", [
    ("trl dpo --config d.yaml", (Path("d.yaml"), "trl-dpo")),
    ("accelerate launch -m trl sft --config=s.yaml", (Path("s.yaml"), "trl-sft")),
    ("python train.py --config d.yaml", None),
])
def test_a_trl_line_names_its_config_and_its_trainer(line, found):
    from gemma_doctor.rehearse import trl_launch

    assert trl_launch(line) == found


@pytest.mark.slow
def test_a_dpo_config_rehearses_on_synthetic_preference_rows_without_a_finding(tmp_path, cli):
    """No dataset file: conversational prompt / chosen / rejected rows; LoRA, so the reference is the base with the
    adapter off. At the first step policy = reference, so the loss is log 2 exactly: the train invariants and the
    accumulation check's gradient norm still judge it."""
    import math

    config = tmp_path / "dpo.yaml"
    config.write_text("bf16: true\nper_device_train_batch_size: 2\nlearning_rate: 0.001\nmax_length: 128\nbeta: 0.1\n"
                      "use_peft: true\nlora_r: 8\nlora_target_modules: [q_proj, k_proj, v_proj, o_proj]\n")
    code, doc = launch(cli, tmp_path, f"trl dpo --config {config}")
    assert doc["findings"] == [] and code == 0 and doc["trainer"] == "trl-dpo"
    assert stages(doc) == [("twin", "ok"), ("load", "ok"), ("setup", "ok"), ("labels", "skipped"), ("train", "ok"),
                           ("accumulation", "ok"), ("eval", "ok"), ("generate", "ok"), ("save", "ok"), ("merge", "ok")]
    train, acc = doc["stages"][4], doc["stages"][5]
    assert doc["stages"][2]["trainer"] == "DPOTrainer"
    assert train["losses"][0] == pytest.approx(math.log(2), abs=1e-3) and train["moved"] == train["trainable"]
    assert acc["accumulated_grad_norm"] == pytest.approx(acc["whole_grad_norm"], rel=0.05), acc


# -- the kept twin (gemma_doctor/rehearse/kept.py) --------------------------------------------------------------------
def test_a_kept_twin_is_named_by_its_inputs_not_by_the_folder_they_are_in(tmp_path):
    """Two folders holding the same config.json name one twin; a change of the config, the repo id, a cure's patch or
    the tokenizer beside it names another."""
    def key(folder: Path, **plan) -> str | None:
        return kept.key({"target_dir": str(folder), "repo_id": REPO, **plan})

    one = model_folder(tmp_path / "a", "gemma3_text")
    same = model_folder(tmp_path / "b", "gemma3_text")
    wider = model_folder(tmp_path / "c", "gemma3_text", dict(CONFIGS["gemma3_text"], hidden_size=64))
    assert key(one) == key(same) is not None
    assert len({key(one), key(wider), key(one, repo_id="google/other"),
                key(one, config_patch={"final_logit_softcapping": None})}) == 4
    (same / "tokenizer_config.json").write_text('{"chat_template": "{{ messages }}"}')
    assert key(same) != key(one)
    (same / "model.safetensors").write_bytes(b"not a safetensors file")
    assert key(same) is None  # unreadable: nothing is kept under it, and the build runs and says why


def assert_kept_as_built(twins: Path) -> Path:
    """The one twin kept in ``twins`` holds the files a build wrote (the links of the hub layout kept relative), and its
    records are the build's stack and twin records; its snapshot folder."""
    [entry] = list(twins.iterdir())
    records = {r["stage"]: r for r in json.loads((entry / "records.json").read_text())}
    assert set(records) == {"stack", "twin"} and records["twin"]["status"] == "ok"
    snapshot = entry / "hub" / records["twin"]["snapshot"]
    names = {p.name for p in snapshot.iterdir()}
    assert {"config.json", "model.safetensors", "tokenizer.json"} <= names
    assert all(p.is_symlink() and not os.path.isabs(os.readlink(p)) for p in snapshot.iterdir())
    return snapshot


@pytest.mark.slow
def test_a_kept_twin_is_the_twin_the_build_child_writes(twins, tmp_path):
    """The kept copy holds the very files the build wrote, and a rehearsal's private cache gets a copy of them (the
    kept twin that a build child writes and run_script keeps: the LEGACY launch below)."""
    [entry] = list(twins.iterdir())
    snapshot = assert_kept_as_built(twins)
    found = kept.find(twins, entry.name, tmp_path / "hub")
    assert found is not None
    copied = Path({r["stage"]: r for r in found}["twin"]["snapshot"])
    assert copied.is_relative_to(tmp_path / "hub")
    assert (copied / "model.safetensors").read_bytes() == (snapshot / "model.safetensors").read_bytes()


def test_a_cures_rerun_takes_the_kept_twin_less_the_cure_with_the_change_made_to_its_copy(tmp_path):
    """kept.find_patched: the twin kept under the inputs without the cure, copied, its config.json changed as the build
    child changes it; the kept twin itself unchanged. Nothing kept: None (the rerun builds its twin)."""
    folder = model_folder(tmp_path, "gemma3_text")
    plan = {"target_dir": str(folder), "repo_id": REPO}
    hub = tmp_path / "hub"
    snapshot = hub / "models--google--tiny-gemma3_text" / "snapshots" / "abc"
    blobs = hub / "models--google--tiny-gemma3_text" / "blobs"
    snapshot.mkdir(parents=True)
    blobs.mkdir()
    (blobs / "c0").write_text(json.dumps({"model_type": "gemma3_text", "use_cache": True}))
    (snapshot / "config.json").symlink_to(os.path.relpath(blobs / "c0", snapshot))
    twins = tmp_path / "twins"
    kept.keep(twins, kept.key(plan), hub, [{"stage": "twin", "status": "ok", "snapshot": str(snapshot)}])
    cured = {**plan, "config_patch": {"use_cache": False, "text_config.x": 1}}
    assert kept.find_patched(tmp_path / "none", cured, tmp_path / "empty") is None
    records = kept.find_patched(twins, cured, tmp_path / "copy")
    [twin] = records
    assert twin["patched"] == {"use_cache": False, "text_config.x": 1}
    assert json.loads((Path(twin["snapshot"]) / "config.json").read_text()) == \
        {"model_type": "gemma3_text", "use_cache": False, "text_config": {"x": 1}}
    [entry] = twins.iterdir()
    assert json.loads((entry / "hub" / "models--google--tiny-gemma3_text" / "blobs" / "c0").read_text())["use_cache"]


def test_a_twin_folder_that_cannot_be_used_is_passed_over(tmp_path):
    """GEMMA_DOCTOR_TWIN_CACHE naming a file, or a kept entry cut short: nothing found, nothing kept, no exception (the
    twin is then built as without the folder)."""
    hub = tmp_path / "hub"
    hub.mkdir()
    (hub / "models--x").mkdir()
    records = [{"stage": "twin", "status": "ok", "snapshot": str(hub / "models--x")}]
    a_file = tmp_path / "not-a-folder"
    a_file.write_text("")
    kept.keep(a_file, "d" * 64, hub, records)
    assert a_file.read_text() == "" and kept.find(a_file, "d" * 64, tmp_path / "copy") is None
    half = tmp_path / "twins" / ("e" * 64)
    (half / "hub").mkdir(parents=True)  # no records.json: not a kept twin
    assert kept.find(tmp_path / "twins", "e" * 64, tmp_path / "copy") is None
    assert list((tmp_path / "copy").iterdir()) == []
    kept.keep(tmp_path / "twins", "f" * 64, hub, records)
    assert [r["snapshot"] for r in kept.find(tmp_path / "twins", "f" * 64, tmp_path / "copy")] == \
        [str(tmp_path / "copy" / "models--x")]
