"""The rehearsal's parent side: plan the run from the target and the training config, start the child with the
user's own interpreter in a temporary folder (private offline hub cache, a deadline, its whole process group killed
past it), read its stage records, judge them (invariants.py), rehearse a catalogue cure where one applies.

Imports nothing heavy: torch, transformers, PEFT and TRL are imported by the child only.
"""

from __future__ import annotations

import importlib.util
import json
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

from gemma_doctor import trainers
from gemma_doctor.errors import UsageError
from gemma_doctor.readers import training_config as tc_reader
from gemma_doctor.readers.training_config import TrainingConfig, truthy
from gemma_doctor.rehearse import reward
from gemma_doctor.rehearse.grpo import ONLINE_LOOPS
from gemma_doctor.rehearse.process import Child, _environment, _records, _tail
from gemma_doctor.report import Finding, Severity
from gemma_doctor.run import trainer_of, trl_peft_off

DEFAULT_STEPS = 3
DEFAULT_TIMEOUT = 300.0
STAGES = ("load", "setup", "labels", "train", "accumulation", "eval", "generate", "save", "merge")
# A GRPO run's stages: its training step generates, scores and trains (grpo.py); no labels to read, and evaluation,
# generation, accumulation and the merge are the SFT run's stages, trainer-independent past the save.
GRPO_STAGES = ("load", "setup", "train", "save")
# The RL loops the twin runs as themselves, through TRL's own trainer (preference.py: DPO, KTO, ORPO; grpo.py: GRPO,
# RLOO, online DPO; reward.py: reward modelling): any other RL setting (PPO ...) gets GD951 and is rehearsed as the SFT
# loop its keys describe.
TWIN_LOOPS = ("trl-dpo", "trl-kto", "trl-orpo", *ONLINE_LOOPS, reward.LOOP)
# Import name -> the name a user installs.
_LIBRARIES = {"torch": "torch", "transformers": "transformers", "peft": "PEFT", "trl": "TRL", "datasets": "datasets",
              "accelerate": "accelerate"}


@dataclass
class Rehearsal:
    """What one rehearsal found: the stages reached, their figures, the findings, the stack it ran on."""

    target: str
    repo_id: str
    trainer: str
    stages: list[dict[str, Any]] = field(default_factory=list)
    findings: list[Finding] = field(default_factory=list)
    stack: dict[str, Any] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def failed(self) -> bool:
        """True when a finding is an error."""
        return any(f.severity is Severity.ERROR for f in self.findings)

    def to_json(self) -> dict[str, Any]:
        """The JSON view (`rehearse --format json`)."""
        return {"target": self.target, "repo_id": self.repo_id, "trainer": self.trainer, "stack": self.stack,
                "stages": [{k: v for k, v in s.items() if k not in ("per_sample", "frames")} for s in self.stages],
                "findings": [f.to_json() for f in self.findings], "notes": self.notes,
                "seconds": round(self.seconds, 1), "status": "failed" if self.failed else "passed"}


def _raw(path: str) -> dict[str, Any]:
    """The training config's own keys (the reader has already said the file is a mapping), bounded as its settings
    are (readers/training_config.raw_mapping); a one-line UsageError where they cannot be read."""
    try:
        return tc_reader.raw_mapping(path)
    except ValueError as e:
        raise UsageError(f"training config {path}: {e}") from None


def _setting(tc: TrainingConfig | None, name: str) -> Any:
    s = tc.get(name) if tc is not None else None
    return None if s is None else s.value


def settings_of(tc: TrainingConfig | None, raw: Mapping[str, Any], config_dir: Path | None) -> dict[str, Any]:
    """The run's settings the driver needs, through the project's reader (batch, precision, method, data...)."""
    adapter = str(_setting(tc, "adapter") or "").lower()
    targets = _setting(tc, "lora_target_modules")
    if truthy(_setting(tc, "lora_target_linear")):
        # axolotl's lora_target_linear: every linear layer added to lora_target_modules (0.19.0 loaders/adapter.py
        # _build_peft_lora_config takes the union), PEFT's "all-linear", as check's plan reads it. Ignored, PEFT fell
        # back to its own default targets for the model type, and refuses a member it has none for ("Please specify
        # `target_modules`"), a crash the real run never meets.
        targets = "all-linear"
    # A config TRL's scripts run trains every weight unless use_peft is true, whatever its lora_* keys say (TRL 1.16's
    # get_peft_config; GD612): rehearsed as it runs, as check plans it.
    peft_off = tc is not None and trl_peft_off(trainer_of(tc).value, tc.settings)
    lora_wanted = not peft_off and (adapter in ("lora", "qlora", "true") or truthy(_setting(tc, "adapter"))
                                    or _setting(tc, "lora_r") is not None or targets is not None)
    lora = None
    own = tc is not None and tc.format.own_lora_targets
    if lora_wanted and own and targets in (None, "all", ["all"]):
        # LLaMA-Factory's lora_target defaults to "all", its word for every linear layer: PEFT's "all-linear". Left
        # open, PEFT guesses per model type, and PEFT 0.11 knows no Gemma 3 (a crash the real run never meets).
        targets = "all-linear"
    elif own and isinstance(targets, str):
        # LLaMA-Factory splits lora_target at commas; PEFT would read "q_proj,v_proj" as one regular expression.
        targets = [t.strip() for t in targets.split(",") if t.strip()]
    if lora_wanted:
        lora = {"r": _setting(tc, "lora_r"), "alpha": raw.get("lora_alpha"),
                "targets": targets if isinstance(targets, (list, str)) else None,
                "modules_to_save": raw.get("lora_modules_to_save") or raw.get("modules_to_save")}
    dtype = _setting(tc, "torch_dtype")
    dataset = raw.get("dataset_name") or raw.get("dataset_path") or raw.get("train_file")
    data_path = None
    if isinstance(dataset, str):
        for candidate in (Path(dataset), (config_dir or Path.cwd()) / dataset):
            if candidate.is_file():
                data_path = str(candidate.absolute())
                break
    return {"dtype": dtype if isinstance(dtype, str) and dtype != "auto" else None, "lora": lora,
            "max_length": _setting(tc, "seq_len") if isinstance(_setting(tc, "seq_len"), int) else None,
            "completion_only": truthy(raw.get("completion_only_loss")) or truthy(_setting(tc, "assistant_only_loss")),
            "dataset": data_path, "dataset_named": dataset if isinstance(dataset, str) else None,
            "precision": "float16" if truthy(_setting(tc, "fp16")) else "bfloat16" if truthy(_setting(tc, "bf16"))
            else None,
            "accumulation": _setting(tc, "gradient_accumulation_steps"), "batch": _setting(tc, "batch_size")}


def _missing(names: list[str]) -> list[str]:
    """The libraries of ``names`` that this interpreter cannot import (looked up, not imported)."""
    return [_LIBRARIES.get(n, n) for n in names if importlib.util.find_spec(n) is None]


def _repo_id(snapshot: Any, raw: Mapping[str, Any], config: Mapping[str, Any]) -> str:
    """The repo id the user's code loads: the config's model_name_or_path, the cache's, the folder's name."""
    named = raw.get("model_name_or_path") or raw.get("base_model")
    if isinstance(named, str) and named.count("/") == 1 and not Path(named).exists():
        return named
    if snapshot.repo_id:
        return snapshot.repo_id
    name = snapshot.path.name
    return name.replace("--", "/", 1) if "--" in name else f"local/{name}"


def _gpu_parts(tc: TrainingConfig | None, raw: Mapping[str, Any]) -> list[str]:
    """What of the run needs a GPU this machine lacks (rehearsed without it, said so)."""
    parts = []
    if truthy(_setting(tc, "load_in_4bit")) or truthy(_setting(tc, "load_in_8bit")):
        parts.append("bitsandbytes quantization (QLoRA / 8-bit loading): rehearsed unquantized")
    attn = str(_setting(tc, "attn_implementation") or "")
    if "flash" in attn or truthy(_setting(tc, "flash_attention")):
        parts.append(f"attention {attn or 'flash_attention'}: rehearsed with the default attention")
    if any("unsloth" in str(v).lower() for v in raw.values() if isinstance(v, str)) or "unsloth" in raw:
        parts.append("Unsloth's kernels: rehearsed with plain transformers")
    if _setting(tc, "deepspeed") or _setting(tc, "fsdp"):
        parts.append("DeepSpeed / FSDP sharding: rehearsed on one process")
    return parts


def _run_child(plan: dict[str, Any], timeout: float, mode: str = "run") -> tuple[list[dict[str, Any]], str | None]:
    """Run one child on ``plan``; (its records, why it ended early or None)."""
    root = Path(tempfile.mkdtemp(prefix="gemma-doctor-rehearse-"))
    try:
        for sub in ("hub", "hf", "work", "tmp", "datasets"):
            (root / sub).mkdir()
        plan = {**plan, "workdir": str(root / "work"), "events": str(root / "events.jsonl")}
        (root / "plan.json").write_text(json.dumps(plan))
        log = root / "child.log"
        child = Child([sys.executable, "-m", "gemma_doctor.rehearse.child", mode, str(root / "plan.json")],
                      root / "work", _environment(root, plan.get("device") or "cpu"), log)
        status = child.wait(timeout)
        records = _records(root / "events.jsonl")
        if status is None:
            return records, f"timeout after {timeout:g} s"
        finished = {"run": "done", "real": "real-weights"}[mode]
        if not any(r.get("stage") == finished for r in records) and not any(r.get("status") == "error" for r in records):
            return records, f"the child exited with status {status}: {_tail(log)}"
        return records, None
    finally:
        shutil.rmtree(root, ignore_errors=True)


def plan_for(target: str, cache_dir: Path | None, revision: str, training_config: Path | None,
             steps: int, trainer: str | None = None, device: str = "auto") -> tuple[dict[str, Any], list[Finding], list[str], str]:
    """(the child's plan, findings before running, notes, repo id) for one target."""
    from gemma_doctor import locate

    snapshots = locate.resolve([target], cache_dir, revision)
    if not snapshots:
        raise UsageError(f"{target}: nothing to rehearse")
    snap = snapshots[0]
    if snap.problem is not None:
        raise UsageError(f"{target}: {snap.problem.message}")
    from gemma_doctor.readers.jsonfile import read_json_file

    # Read as check reads it (never blocking on a FIFO, bounded in size and nesting): a cache is not trusted.
    found = read_json_file(snap.path / "config.json")
    if found.error is not None or not found.exists:
        raise UsageError(f"{target}: config.json cannot be read ({found.error or 'it does not exist'}); "
                         "nothing to rehearse")
    config = found.data
    if not isinstance(config, dict) or not isinstance(config.get("architectures"), list) \
            or not config["architectures"] or not isinstance(config["architectures"][0], str):
        raise UsageError(f"{target}: config.json names no architecture; nothing to rehearse")
    tc = raw = None
    if training_config is not None:
        tc = tc_reader.load(str(training_config))
        if not tc.ok:
            raise UsageError(f"training config {training_config}: {tc.error}")
        raw = _raw(str(training_config))
    raw = raw or {}
    # The RL trainer is the reader's decision, the one check's rules and memory plan take (readers/training_config:
    # `rl:` / `stage:`, DPOConfig's or GRPOConfig's own keys).
    rl = trainers.rl_trainer(_setting(tc, "rl"))  # None for SFT and LLaMA-Factory's sft / pt stages
    # The twin runs under the trainer check plans the run for (trainers.decide, the reader's one decision): its own
    # loop where the driver has one, else DPO's or GRPO's for such a run, else the SFT loop the config's keys describe.
    decided = tc.trainer if tc is not None else None
    # axolotl runs its own prompt strategy over the data: where it is importable, the twin's rows are its (axolotl.py).
    axolotl_run = trainer == "axolotl" or (decided is not None and decided.value is trainers.Trainer.AXOLOTL)
    trainer = None if trainer == "axolotl" else trainer
    if trainer is None and decided is not None and decided.value.twin is not None:
        trainer = decided.value.twin
    if trainer is None and rl == "dpo" and str(raw.get("pref_loss", "")).strip().lower() == "orpo":
        # LLaMA-Factory's stage: dpo with pref_loss: orpo runs ORPO's loss (no reference model): TRL's ORPO loop
        trainer = "trl-orpo"
    if trainer is None and rl and f"trl-{rl.replace('_', '-')}" in TWIN_LOOPS:
        trainer = f"trl-{rl.replace('_', '-')}"  # `rl: online_dpo`: TRL's experimental OnlineDPOTrainer (grpo.py)
    if trainer is None and (rl in reward.NAMES or (axolotl_run and truthy(raw.get("reward_model")))):
        # LLaMA-Factory's stage: rm, axolotl's reward_model: true: a reward model (reward.py)
        trainer = reward.LOOP
    trainer = trainer or (decided.sft_loop.value if decided is not None else "transformers")
    settings = settings_of(tc, raw, training_config.parent if training_config else None)
    findings, notes = [], []
    needed = ["torch", "transformers", "accelerate"] + \
             (["datasets", "trl"] if trainer == "trl-sft" or trainer in TWIN_LOOPS else []) + \
             (["peft"] if settings["lora"] else [])
    missing = _missing(needed)
    if missing:
        findings.append(Finding("GD950", Severity.ERROR, f"not rehearsable: {', '.join(missing)} "
                                f"{'is' if len(missing) == 1 else 'are'} not installed in this environment "
                                f"({sys.executable})", key="stack",
                                fix="run the rehearsal in the environment that trains (nothing is installed for you)"))
    if rl and trainer not in TWIN_LOOPS and trainer != "script":
        findings.append(Finding("GD951", Severity.INFO, f"not rehearsable here: a {rl.upper()} run (its trainer's "
                                "generation, rewards and reference model); its model, adapter, precision and save are "
                                f"rehearsed as a {trainer} run", key="trainer",
                                fix="the RL loop itself is checked only by running it; DPO, KTO, ORPO, GRPO, RLOO, "
                                    "online DPO and reward modelling are rehearsed as themselves"))
    for part in _gpu_parts(tc, raw):
        findings.append(Finding("GD951", Severity.INFO, f"not rehearsable on this machine: {part}", key="gpu",
                                fix="rehearse on the training machine to cover this part", details={"not_here": part}))
    if settings["dataset_named"] and not settings["dataset"]:
        notes.append(f"dataset {settings['dataset_named']} is not a local file: synthetic chat rows used")
    repo_id = _repo_id(snap, raw, config)
    plan = {"target_dir": str(snap.path), "repo_id": repo_id, "architecture": config["architectures"][0],
            "model_type": str(config.get("model_type") or ""), "trainer": trainer, "settings": settings, "raw": raw,
            "steps": steps, "stages": list(GRPO_STAGES if trainer in ONLINE_LOOPS else reward.STAGES
                                           if trainer == reward.LOOP else STAGES), "device": device,
            "cwd": str(Path.cwd())}  # where a GRPO config's reward functions are imported from, as `trl grpo` does
    if trainer == reward.LOOP:
        source = "axolotl" if axolotl_run else "llama-factory" if tc is not None and tc.format.own_lora_targets \
            else "trl"
        plan["reward"], more = reward.plan_part(raw, source)
        notes += more
    if axolotl_run and trainer == "transformers":
        from gemma_doctor.rehearse import axolotl

        part, note = axolotl.plan_part(raw, training_config.parent if training_config else None,
                                       str(config.get("model_type") or ""))
        if part is not None:
            plan["axolotl"] = part
        else:
            notes.append(str(note))
    return plan, findings, notes, repo_id


def rehearse(target: str, *, cache_dir: Path | None = None, revision: str = "main",
             training_config: Path | None = None, steps: int = DEFAULT_STEPS,
             timeout: float = DEFAULT_TIMEOUT, cures: bool = True, real_weights: bool = False,
             trainer: str | None = None, script: list[str] | None = None, device: str = "auto",
             accelerate_config: Path | None = None) -> Rehearsal:
    """Rehearse ``target``'s run through the installed stack on a twin; never raises for what the run does.
    ``script``: the user's own command (rehearse --launch, gemma_doctor/rehearse/launch.py) instead of the driver.
    ``device``: ``auto`` trains the twin (and measures the real step) on the GPU where torch sees one, ``cpu`` never
    shows the child a GPU, ``cuda`` fails the load stage where there is none.
    ``accelerate_config``: the run's FSDP / DeepSpeed config, rehearsed on 2 CPU ranks (gemma_doctor/rehearse/ranks.py)."""
    from gemma_doctor import catalogue
    from gemma_doctor.rehearse import invariants

    started = time.monotonic()
    plan, findings, notes, repo_id = plan_for(target, cache_dir, revision, training_config, steps,
                                              "script" if script else trainer, device)
    # An axolotl run whose rows axolotl's own strategy makes is named so (its loop is still transformers' Trainer).
    result = Rehearsal(target, repo_id, "axolotl" if plan.get("axolotl") else plan["trainer"], findings=findings,
                       notes=notes)
    if any(f.code == "GD950" for f in findings):
        result.seconds = time.monotonic() - started
        return result
    if accelerate_config is not None:
        from gemma_doctor.rehearse import ranks

        ranks.rehearse_ranks(result, {**plan, "device": "cpu"}, accelerate_config, timeout)
        result.seconds = time.monotonic() - started
        return result
    if script:
        from gemma_doctor.rehearse.launch import first_failure, no_trainer, run_script

        records, ended, ran = run_script(plan, script, timeout)
        records = first_failure(records)
        # A script that ended by itself without a Trainer rehearsed its load and exit only: said, not passed over.
        if ended is None and not any(r.get("stage") in ("setup", "script", "load") for r in records):
            result.findings.append(no_trainer(ran))
    else:
        records, ended = _run_child(plan, timeout)
    if real_weights and ended is None:
        memory = _memory_plan(target, cache_dir, revision, training_config)
        measure, why = _measurable(memory)
        measured, ended = _run_child({**plan, "measure": measure} if measure else plan, timeout, "real")
        for r in measured:
            if r.get("stage") == "real-weights" and r.get("status") == "ok" and measure:
                r.update(plan_tensor_bytes=memory["tensor_bytes"], plan_summary=memory.get("summary"))
        if why:
            result.notes.append(f"the measured step is not the planned run ({memory.get('method')}: {why}), so its "
                                "peak is not held against the memory plan")
        records += measured
    result.stack = next((dict((k, v) for k, v in r.items() if k not in ("stage", "status", "elapsed"))
                         for r in records if r.get("stage") == "stack"), {})
    result.stages = [r for r in records if r.get("stage") not in ("stack", "done")]
    entries = catalogue.entries()
    found = [_of_another_kind(f, plan) for f in invariants.judge(result.stages, entries, plan.get("model_type"))]
    if plan.get("reward"):
        found = reward.judge(result.stages, found, plan)
    for r in result.stages:
        if r.get("status") == "ok" and r.get("notes"):
            result.notes += list(r["notes"])
    if ended is not None:
        last = result.stages[-1]["stage"] if result.stages else "start"
        code = "GD952" if ended.startswith("timeout") else "GD953"
        found.append(Finding(code, Severity.ERROR, f"the rehearsal did not finish ({ended}); last stage reached: {last}",
                             key=last, fix="raise --timeout on a slow machine; otherwise report the child's last line"))
    if cures:
        found = [_rehearse_cure(f, plan, timeout, entries, script) for f in found]
    result.findings += found
    result.seconds = time.monotonic() - started
    return result


def _memory_plan(target: str, cache_dir: Path | None, revision: str,
                 training_config: Path | None) -> dict[str, Any] | None:
    """check's memory plan of this run (the same training config, the GPU the probe finds): the plan the measured step
    is held against; None where check plans none (no GPU, an unreadable model)."""
    from gemma_doctor import api
    from gemma_doctor.errors import DoctorError

    try:
        report = api.diagnose(str(target), cache_dir=cache_dir, revision=revision,
                              training_config=str(training_config) if training_config else None)
    except DoctorError:
        return None
    memory = next((m.extra.get("memory") for m in report.models if m.extra), None)
    return memory if isinstance(memory, dict) and isinstance(memory.get("tensor_bytes"), int) else None


def _measurable(memory: dict[str, Any] | None) -> tuple[dict[str, Any] | None, str | None]:
    """(the planned run's shape for the measured step: method, batch, length, LoRA, checkpointing, load dtype; why the
    step cannot execute the plan as planned, or None). No plan: (None, None)."""
    run = (memory or {}).get("run") or {}
    if not run:
        return None, None
    if run.get("method") not in ("full", "lora"):
        return None, "the step loads the checkpoint unquantized"
    if (run.get("num_gpus") or 1) > 1:
        return None, "the step runs on one device"
    if run.get("chunked_loss"):
        # its b*s*V logits would be held against a plan that counts a tile of them
        return None, "TRL's chunked log-probs, which one forward of the model does not compute"
    if run.get("liger_dpo_loss"):
        return None, "Liger's fused DPO loss (one pair's logits at a time), which one forward of the model does not compute"
    return {k: run.get(k) for k in ("method", "batch_size", "seq_len", "lora_r", "lora_targets",
                                    "gradient_checkpointing", "load_dtype")}, None


# A member that is not a causal language model, by its role (family.py), and what trains it instead. Each was met as a
# crash of the rehearsal's LoRA SFT run on the member's tiny checkpoint with TRL 1.16.0, PEFT 0.21.2 and transformers
# 5.23.0 (benchmarks/rehearse_members.py; docs/rehearsal.md "Every member"): the embedding models, ShieldGemma 2 and
# DiffusionGemma at setup (PEFT's causal-LM wrapper: "object has no attribute 'prepare_inputs_for_generation'"),
# T5Gemma and T5Gemma 2 at the first step ("You must specify exactly one of input_ids or inputs_embeds": TRL's
# SFTTrainer passes no decoder inputs; the same without PEFT).
_OTHER_KINDS = {
    "embedding": ("an embedding model (no language-model head)",
                  "fine-tune it as an embedding model, with sentence-transformers' SentenceTransformerTrainer"),
    "classifier": ("an image classifier", "fine-tune it as a classifier (a Trainer with its classification loss)"),
    "diffusion": ("a block-diffusion language model (it denoises blocks of tokens: no next-token objective)",
                  "train it with the diffusion objective its own training recipe gives, not a causal-LM trainer"),
    "encoder-decoder": ("an encoder-decoder model",
                        "train it with transformers' Seq2SeqTrainer and DataCollatorForSeq2Seq (TRL's trainers train "
                        "decoder-only models)"),
}


def _of_another_kind(finding: Finding, plan: dict[str, Any]) -> Finding:
    """A crash at setup or at a training step of a member that is not a causal language model (an embedding model, a
    classifier, an encoder-decoder) under a trainer of causal language models: said as the run's mismatch, with what
    trains that kind, instead of "report it upstream"."""
    from dataclasses import replace

    from gemma_doctor.family import member

    m = member(plan.get("model_type"))
    kind = _OTHER_KINDS.get(m.role) if m is not None else None
    stage = (finding.details or {}).get("stage")
    if kind is None or stage not in ("setup", "train") or plan.get("trainer") == reward.LOOP:
        return finding
    what, instead = kind
    fix = (f"{m.name} ({plan.get('architecture')}) is {what}, and the rehearsed run trains it as a causal "
           f"language model ({plan.get('trainer')}): the crash is the run's, not a library's; {instead}")
    return replace(finding, fix=fix, details={**finding.details, "model_role": m.role})


# A launched script's stages that leave a record only when they crash (hook/probe.py): passed when the rerun records no
# crash there and the script ends by itself.
_SILENT_WHEN_PASSED = ("load", "script")


def _rehearse_lora_cure(finding: Finding, plan: dict[str, Any], lora: dict[str, Any], timeout: float) -> Finding:
    """A cure that is a change of the run's LoRA settings (its targets): the stages up to the failed one rerun with it."""
    from dataclasses import replace

    stage = finding.details["stage"]
    settings = {**plan["settings"], "lora": {**plan["settings"]["lora"], **lora}}
    stages = list(plan["stages"][: plan["stages"].index(stage) + 1])
    records, ended = _run_child({**plan, "settings": settings, "stages": stages}, timeout)
    again = [r for r in records if r.get("stage") == stage]
    change = ", ".join(f"target_modules: {json.dumps(v)}" if k == "targets" else f"{k}: {json.dumps(v)}"
                       for k, v in lora.items())
    if ended is None and again and all(r.get("status") == "ok" for r in again):
        verdict = f"cure verified in this stack: with {change} the {stage} stage passes"
    else:
        verdict = f"the cure did not help in this stack: with {change} the {stage} stage still fails"
    return replace(finding, fix=f"{finding.fix}; {verdict}", details={**finding.details, "cure": verdict})


def _rehearse_cure(finding: Finding, plan: dict[str, Any], timeout: float, entries: list[Any],
                   script: list[str] | None = None) -> Finding:
    """Apply the matched catalogue entry's cure to the twin and rerun up to the failed stage (a launched script: its
    whole command once more, under a deadline of its own as the first run had); say whether it helped."""
    from dataclasses import replace

    from gemma_doctor.rehearse import invariants

    if finding.code == "GD988" and plan.get("reward"):
        # its cure is the adapter's task type, rehearsed through every stage (reward.py)
        return reward.rehearse_cure(finding, plan, lambda p: _run_child(p, timeout),
                                    lambda stages: reward.judge(stages, invariants.judge(stages, entries), plan))
    entry_id = finding.details.get("catalogue") if finding.details else None
    if entry_id == invariants.AXOLOTL_EOT and plan.get("axolotl"):
        from gemma_doctor.rehearse import axolotl  # its cure is a config key of axolotl's, rehearsed on its labels

        return axolotl.rehearse_cure(finding, plan, lambda p: _run_child(p, timeout))
    lora = invariants.CURE_LORA.get(entry_id or "")
    if lora and not script and (plan.get("settings") or {}).get("lora"):
        return _rehearse_lora_cure(finding, plan, lora, timeout)
    patch = invariants.CURE_PATCHES.get(entry_id or "")
    if not patch:
        if script and entry_id:
            # The driver applies a cure to the twin or the run's config; a launched command runs with its script and
            # files unedited, and the rehearsal never installs anything: a cure there is the user's to try.
            note = ("its cure is not rehearsed: the launched command runs with its script and files as they are and "
                    "nothing is installed, so a change to them or to a library is yours to try")
            return replace(finding, fix=f"{finding.fix}; {note}", details={**finding.details, "cure": note})
        return finding
    text_only = "text_config" not in json.loads((Path(plan["target_dir"]) / "config.json").read_text())
    patch = {(k.removeprefix("text_config.") if text_only else k): v for k, v in patch.items()}
    stage = finding.details["stage"]
    if script:
        from gemma_doctor.rehearse.launch import run_script

        records, ended, _ = run_script({**plan, "config_patch": patch}, script, timeout)
    else:
        stages = list(plan["stages"][: plan["stages"].index(stage) + 1])
        records, ended = _run_child({**plan, "config_patch": patch, "stages": stages}, timeout)
    again = [r for r in records if r.get("stage") == stage]
    change = ", ".join(f"{k}: {json.dumps(v)}" for k, v in patch.items())
    reached = bool(again) or (script is not None and stage in _SILENT_WHEN_PASSED)
    if ended is None and reached and all(r.get("status") == "ok" for r in again):
        verdict = f"cure verified in this stack: with {change} in config.json the {stage} stage passes"
    elif ended is None and not reached:
        verdict = (f"the cure could not be judged in this stack: with {change} the run no longer reaches the {stage} "
                   "stage")
    else:
        verdict = f"the cure did not help in this stack: with {change} the {stage} stage still fails"
    return replace(finding, fix=f"{finding.fix}; {verdict}", details={**finding.details, "cure": verdict})
