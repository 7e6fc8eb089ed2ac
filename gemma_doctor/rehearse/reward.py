"""Reward modelling in the rehearsal: `--launch "trl reward --config FILE"`, axolotl's `reward_model: true`,
LLaMA-Factory's `stage: rm`; docs/rehearsal.md, "Reward modelling".

The twin is loaded as `trl reward` loads the model: a sequence classifier with one score
(`AutoModelForSequenceClassification`, `num_labels=1`: driver.Run._load_model), its score head new. TRL's own
RewardTrainer trains it with a RewardConfig of the user's keys (capped as every run is) on the first rows of the
user's local preference dataset, else synthetic prompt / chosen / rejected rows; LoRA with the run's task type (TRL's
ModelConfig `lora_task_type`, CAUSAL_LM unless set, which is what `trl reward` hands PEFT). A probe records whether the
score head trains and the chosen/rejected margin and accuracy TRL computes. Save and merge reload the folder as a
sequence classifier: the same scores, the score head kept.

The parent side (``plan_part``, ``judge``) is pure: the runner imports it without torch.
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Any, Callable, Mapping

from gemma_doctor.report import Finding, Severity

LOOP = "trl-reward"
# A reward run's stages: no generation (a sequence classifier scores, it does not generate).
STAGES = ("load", "setup", "labels", "train", "accumulation", "eval", "save", "merge")
# The `rl:` / `stage:` values and launch words that name reward modelling (LLaMA-Factory: rm; TRL: `trl reward`).
NAMES = ("rm", "reward")
# PEFT's task type for a sequence classifier: PeftModelForSequenceClassification adds the score head to
# modules_to_save (["classifier", "score"]), so it trains and is saved with the adapter.
SEQ_CLS = "SEQ_CLS"
# Field reports of the same mechanism (a CAUSAL_LM adapter on a classification model) on other models.
CAUSAL_ON_CLASSIFIER = "mll-lab-nu/RAGEN#100, verl-project/verl#4620"


# -- the parent side (pure) -------------------------------------------------------------------------------------------
def plan_part(raw: Mapping[str, Any], source: str) -> tuple[dict[str, Any], list[str]]:
    """(the plan's reward part: the LoRA task type the run hands PEFT, where the run comes from; notes).
    ``source``: "trl" (`trl reward` and TRL configs), "axolotl" or "llama-factory"."""
    notes: list[str] = []
    named = raw.get("lora_task_type")
    if isinstance(named, str) and named.strip():
        task = named.strip().upper()
    elif source == "trl":
        task = "CAUSAL_LM"  # TRL's ModelConfig default, which `trl reward` passes to LoraConfig unchanged
    else:
        # axolotl picks SEQ_CLS for a sequence classifier (axolotl/loaders/adapter.py _get_peft_task_type)
        task = SEQ_CLS
    if source == "llama-factory":
        notes.append("LLaMA-Factory's rm stage trains a value head on the causal LM (its PairwiseTrainer); rehearsed "
                     "through TRL's RewardTrainer on a sequence classifier: the load, LoRA, precision, pairwise loss, "
                     "save and reload are rehearsed, not LLaMA-Factory's own code")
    return {"task_type": task, "source": source}, notes


def _finite(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def judge(stages: list[Mapping[str, Any]], found: list[Finding], plan: Mapping[str, Any]) -> list[Finding]:
    """A reward run's findings: the ordinary ones (``found``), a setup crash PEFT's causal-LM adapter makes on a
    sequence classifier as GD988, a model with no sequence-classification class as GD997, and the score head's
    invariant (GD989)."""
    out: list[Finding] = []
    part = plan.get("reward") or {}
    for f in found:
        line = str((f.details or {}).get("line", ""))
        if f.code == "GD956" and "prepare_inputs_for_generation" in line and part.get("task_type") != SEQ_CLS:
            out.append(Finding(
                "GD988", Severity.ERROR,
                f"the reward model's LoRA is PEFT's causal-LM kind (task_type {part.get('task_type')}) on a sequence "
                f"classifier, and PEFT fails building it: {line}", key="setup",
                fix=("set lora_task_type: SEQ_CLS (TRL's ModelConfig; its default CAUSAL_LM is what `trl reward` hands "
                     "PEFT): PEFT then trains the score head and saves it with the adapter (modules_to_save "
                     f"classifier/score); the same mechanism on other models: {CAUSAL_ON_CLASSIFIER}"),
                details={**(f.details or {}), "task_type": part.get("task_type")}))
        elif f.code == "GD955" and "Unrecognized configuration class" in line and "SequenceClassification" in line:
            # transformers' message goes on to list every model type it has a class for: not what the reader needs
            said = line.split(" Model type should be one of")[0]
            out.append(Finding(
                "GD997", Severity.ERROR,
                f"the installed transformers has no sequence-classification class for this model, so no reward "
                f"model of it can be built the way TRL's RewardTrainer builds one: {said}", key="load",
                fix=("a value head on the causal LM instead (LLaMA-Factory's rm stage), or a head of your own on the "
                     "text model; check whether a later transformers adds <Model>ForSequenceClassification"),
                details=dict(f.details or {})))
        else:
            out.append(f)
    train = next((s for s in stages if s.get("stage") == "train" and s.get("status") == "ok"), None)
    score = (train or {}).get("score") if train else None
    if isinstance(score, Mapping):
        rates = train.get("learning_rates") or []
        if not score.get("trainable"):
            # A frozen head is not saved with the adapter, so the reload draws another (measured: lora_task_type
            # FEATURE_EXTRACTION, scores 0.309 -> 0.168): the save stage's GD975 is this, not a library's bug.
            out = [replace(f, fix="the score head was frozen, so the adapter was saved without it and the reload drew "
                                  "another random head (GD989): lora_task_type: SEQ_CLS")
                   if f.code == "GD975" else f for f in out]
            out.append(Finding(
                "GD989", Severity.ERROR,
                f"the reward model's score head is frozen ({', '.join(score.get('names') or []) or 'no score tensor'}):"
                " it keeps its random initial weights, and an adapter saved without it reloads with another random "
                "head", key="train",
                fix="LoRA with lora_task_type: SEQ_CLS (PEFT adds the score head to modules_to_save), or "
                    "lora_modules_to_save: [score]", details=dict(score)))
        elif not score.get("moved") and not (rates and all(r == 0 for r in rates)):
            out.append(Finding(
                "GD989", Severity.ERROR,
                f"the reward model's score head did not move in {len(train.get('losses') or [])} steps "
                f"({', '.join(score.get('trainable') or [])})", key="train",
                fix="check the learning rate and that the loss reaches the score head", details=dict(score)))
    return out


def summary(stages: list[Mapping[str, Any]]) -> str:
    """One line of a reward run's figures: losses, margins, whether the score head moved, the reload's difference."""
    got = {s.get("stage"): s for s in stages if s.get("status") == "ok"}
    train = got.get("train") or {}
    parts = []
    if train.get("losses"):
        parts.append("loss " + ", ".join(f"{x:.4g}" for x in train["losses"] if _finite(x)))
    if train.get("margins"):
        parts.append("margin " + ", ".join(f"{x:.3g}" for x in train["margins"] if _finite(x)))
    score = train.get("score") or {}
    if score:
        parts.append("the score head moved" if score.get("moved") else "the score head did not move")
    save = got.get("save") or {}
    if save.get("max_abs_diff") is not None:
        parts.append(f"scores after reload differ by {save['max_abs_diff']:.3g}")
    return "; ".join(parts)


def rehearse_cure(finding: Finding, plan: dict[str, Any], run: Callable[[dict[str, Any]], tuple[list, Any]],
                  judge_all: Callable[[list[Mapping[str, Any]]], list[Finding]]) -> Finding:
    """GD988's cure on the twin: the same run with lora_task_type SEQ_CLS, every stage (a setup crash leaves none
    rehearsed); verified when it ends with no error finding."""
    records, ended = run({**plan, "reward": {**plan["reward"], "task_type": SEQ_CLS}})
    stages = [r for r in records if r.get("stage") not in ("stack", "done")]
    errors = [f for f in judge_all(stages) if f.severity is Severity.ERROR]
    if ended is None and not errors and any(r.get("stage") == "done" for r in records):
        verdict = (f"cure verified in this stack: with lora_task_type: SEQ_CLS every stage passes "
                   f"({len(stages)} stages; {summary(stages)})")
    else:
        why = ended or "; ".join(f"{f.code} {f.message}" for f in errors) or "it did not finish"
        verdict = f"the cure did not help in this stack: with lora_task_type: SEQ_CLS {why}"
    ran = {"stages": [[r.get("stage"), r.get("status")] for r in stages], "findings": [f.code for f in errors]}
    return replace(finding, fix=f"{finding.fix}; {verdict}",
                   details={**finding.details, "cure": verdict, "cure_run": ran})


# -- the child side ---------------------------------------------------------------------------------------------------
def _is_score(name: str) -> bool:
    """A tensor of the score head (PEFT's frozen original copy of a saved module excluded: it never trains)."""
    return ".score." in f".{name}" and "original_module" not in name


def setup(run: Any) -> None:
    """TRL's RewardTrainer on the twin loaded as a sequence classifier, the user's RewardConfig keys, LoRA of the
    run's task type; the probe of the score head and the margins."""
    import transformers
    from datasets import Dataset
    from trl import RewardConfig, RewardTrainer

    from gemma_doctor.rehearse import preference

    part = run.plan.get("reward") or {}
    train, evaluation = preference.rows(run)
    args = run._args(RewardConfig, run.work / "run")
    lora = run._lora()
    if lora is not None:
        lora.task_type = part.get("task_type") or "CAUSAL_LM"
    run.trainer = RewardTrainer(model=run.model, args=args, train_dataset=Dataset.from_list(train),
                                eval_dataset=Dataset.from_list(evaluation), processing_class=run.tokenizer,
                                peft_config=lora)
    run.model = run.trainer.model
    model, extra = run.model, run.train_extra
    before: dict[str, Any] = {}

    class Probe(transformers.TrainerCallback):
        def on_train_begin(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            before.update({n: p.detach().clone() for n, p in model.named_parameters() if _is_score(n)})

        def on_log(self, args: Any, state: Any, control: Any, logs: Any = None, **kw: Any) -> None:
            if logs and "loss" in logs and "margin" in logs:
                extra.setdefault("margins", []).append(float(logs["margin"]))
                extra.setdefault("accuracy", []).append(float(logs.get("accuracy", float("nan"))))

        def on_train_end(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            params = dict(model.named_parameters())
            trainable = [n for n in before if params[n].requires_grad]
            moved = [n for n in trainable if float((params[n].detach().float() - before[n].float()).abs().max()) > 0]
            extra["score"] = {"names": sorted(before), "trainable": trainable, "moved": moved}

    run.trainer.add_callback(Probe())
    trainable = sum(p.numel() for p in run.model.parameters() if p.requires_grad)
    run.events.write("setup", "ok", trainer=type(run.trainer).__name__, trainable=trainable, notes=run.notes,
                     task_type=getattr(lora, "task_type", None) and str(getattr(lora.task_type, "value", lora.task_type)))
