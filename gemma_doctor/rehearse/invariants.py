"""The rehearsal's judgement: the child's stage records in, findings out (codes GD950-GD979; a GRPO run's
GD995-GD996 in grpo.py; a reward model's GD988-GD989, GD997 in reward.py; a launched script's resume GD998-GD999).
Pure: no torch, no file system; the thresholds of every invariant are here.

A stage that raised becomes a finding naming the stage and the exception's last line, with the field catalogue's
entry when its symptom matches (gemma_doctor/catalogue/field.json), else "not in the catalogue" and what to report
upstream. A probe's figures that break an invariant become a finding quoting them.
"""

from __future__ import annotations

import math
import re
from typing import Any, Iterable, Mapping

from gemma_doctor.family import LANGUAGE_MODEL_REGEX
from gemma_doctor.report import Finding, Severity

# Stage -> the code of its crash.
CRASH_CODES = {"twin": "GD954", "load": "GD955", "setup": "GD956", "labels": "GD962", "train": "GD957",
               "eval": "GD958", "generate": "GD959", "save": "GD960", "merge": "GD961", "accumulation": "GD963",
               "real-weights": "GD964", "script": "GD956", "resume": "GD998"}
STAGE_TEXT = {"twin": "building the twin", "load": "loading the model", "setup": "building the trainer",
              "labels": "collating the first batch", "train": "training", "eval": "evaluation",
              "generate": "generation", "save": "saving and reloading the checkpoint", "merge": "merging the adapter",
              "accumulation": "the gradient accumulation check",
              "real-weights": "the measured step of the real checkpoint",
              "script": "the launched script, outside the Trainer",
              "resume": "resuming from the checkpoint the first steps saved"}
# Logits of a reloaded or merged model against the one in memory: equal up to rounding of the saved dtype. bf16 keeps
# 8 bits of mantissa (relative step 2**-8 = 0.4%); a merge adds a rounded delta to every weight, so the tolerance is a
# few steps of the logits' own scale. A lost head or a dropped delta moves logits by their whole scale.
LOGITS_RTOL = 0.05
# Loss and gradient norm of b x k micro-batches against one batch of b*k: the same up to rounding; the accumulation
# bug of GD739 scales them by k (at least 2).
ACCUMULATION_RTOL = 0.10
# A resumed step against the same step of the uninterrupted run (hook/probe.py: resume): the same weights, rows, random
# state, optimizer and scheduler give the same loss and rate (on the CPU, exactly); an optimizer or scheduler started
# afresh changes the rate and the parameters the step leaves (a fresh Adam moves each by about the learning rate).
RESUME_RTOL = 0.01
# A checkpoint written with the weights only (save_only_model): what a resume from it then starts afresh.
_WEIGHTS_ONLY_FIX = ("save the optimizer and scheduler with each checkpoint (save_only_model: false) or do not resume "
                     "from these checkpoints: transformers resumes from a checkpoint without optimizer.pt and "
                     "scheduler.pt without a word, with a fresh optimizer and the learning-rate schedule from its start")
# The field record of axolotl's untrained turn end (gemma_doctor/rehearse/axolotl.py rehearses its cure).
AXOLOTL_EOT = "axolotl-gemma-eot-untrained"
# Catalogue entry -> the change to the twin's config.json that its cure claims fixes the failure (rehearsed).
CURE_PATCHES: dict[str, dict[str, Any]] = {
    "hybridcache-float": {"text_config.use_cache": False},
}
# Catalogue entry -> the change to the run's LoRA settings that its cure claims fixes the failure (rehearsed by the
# driver's runs; a launched script's own config is not edited). GD440's cure: the language model's projections only.
CURE_LORA: dict[str, dict[str, Any]] = {
    "peft-gemma4-clippable-linear": {"targets": LANGUAGE_MODEL_REGEX},
}


def _norm(text: str) -> str:
    return re.sub(r"[\s`'\"]+", " ", text).strip().lower()


def catalogue_match(line: str, stage: str, entries: Iterable[Mapping[str, Any]],
                    model_type: str | None = None) -> Mapping[str, Any] | None:
    """The catalogue entry whose symptom is this exception line (the symptom's text before any '...' holds in it). An
    entry that names the members it is about (``model_types``) matches those only: one library message (PEFT's refusal
    of a module it cannot wrap) has a cause per member."""
    got = _norm(line)
    for e in entries:
        scope = e.get("model_types")
        if model_type and isinstance(scope, list) and model_type not in scope:
            continue
        symptom = _norm(str(e.get("symptom", "")).split("...")[0])
        if len(symptom) >= 12 and (symptom in got or (len(got) >= 12 and got in symptom)):
            return e
    return None


def _finite(x: Any) -> bool:
    return isinstance(x, (int, float)) and math.isfinite(x)


def crash(record: Mapping[str, Any], entries: Iterable[Mapping[str, Any]], cure: str | None = None,
          model_type: str | None = None) -> Finding:
    """The finding of a stage that raised (``model_type``: the rehearsed model's, which scopes the catalogue match)."""
    stage = record["stage"]
    line = str(record.get("line", record.get("exception", "error")))
    entry = catalogue_match(line, stage, entries, model_type)
    details: dict[str, Any] = {"stage": stage, "exception": record.get("exception"), "line": line,
                               "frames": record.get("frames", [])}
    if entry is not None:
        details["catalogue"] = entry.get("id")
        fix = f"catalogue {entry.get('code') or entry.get('id')}: {entry.get('cure')}"
    elif record.get("refused"):
        fix = ("not in the catalogue: the library refuses this setting by a check of its own "
               f"({', '.join(record.get('frames', [])[-1:])}): change what its message names; if the setting should "
               "work, report it upstream with the versions in `stack` and this line")
    else:
        fix = ("not in the catalogue: report it upstream to the library of the innermost frame "
               f"({', '.join(record.get('frames', [])[-1:]) or 'see the traceback'}), with the versions in `stack` "
               "and this line")
    if cure:
        details["cure"] = cure
        fix += f" ({cure})"
    return Finding(CRASH_CODES.get(stage, "GD957"), Severity.ERROR,
                   f"the rehearsal crashed at {STAGE_TEXT.get(stage, stage)}: {line}{_ended_rank(record, details)}",
                   key=stage, fix=fix, details=details)


def _ended_rank(record: Mapping[str, Any], details: dict[str, Any]) -> str:
    """What a crash that ended its rank (a stage every rank runs in step, launch.first_failure) did to the others:
    each stopped with it, told by its own line where it wrote one (the same failure, or a consequence of this one)."""
    if not record.get("ends_rank"):
        return ""
    then = list(record.get("then") or [])
    details.update(rank=record.get("rank"), then=then)
    own = re.sub(r"^\[rank \d+\] ", "", str(record.get("line", "")))
    told = []
    for t in then:
        line = re.sub(r"^\[rank \d+\] ", "", str(t.get("line", "")))
        told.append(f"rank {t.get('rank')} met the same" if line == own else
                    f"rank {t.get('rank')} then stopped ({line if len(line) <= 120 else line[:117] + '...'})")
    others = "; ".join(told) or "the other ranks were stopped with it"
    return f" (rank {record.get('rank')} ended there, out of step with the others: {others})"


def judge_labels(record: Mapping[str, Any]) -> list[Finding]:
    """Each sample trains some tokens; the end-of-turn token is trained; the prompt is masked when completion-only."""
    rows = record.get("per_sample") or []
    out: list[Finding] = []
    empty = [i for i, r in enumerate(rows) if r["trained"] == 0]
    if empty:
        out.append(Finding("GD971", Severity.ERROR,
                           f"{len(empty)} of {len(rows)} samples of the first batch train no token (all labels -100): "
                           "the loss and gradients of those samples are 0", key="labels",
                           fix="check the collator and the completion-only / assistant-only masking (a prompt longer "
                               "than max_length leaves no completion token)", details={"rows": rows}))
    missed = [i for i, r in enumerate(rows) if r["trained"] and r["eot_present"] and not r["eot_trained"]]
    if missed:
        fix, details = ("train the turn terminator (<end_of_turn> / eos): axolotl eot_tokens, or a template whose "
                        "generation block includes it"), {"rows": rows}
        axolotl = record.get("axolotl")
        if isinstance(axolotl, Mapping):
            # The rows are axolotl's own prompt strategy's (rehearse/axolotl.py): its setting is the cure.
            end = axolotl.get("terminator") or "<end_of_turn>"
            if axolotl.get("eot_missing"):
                details["catalogue"] = AXOLOTL_EOT
                fix = (f"catalogue {AXOLOTL_EOT} (GD780): axolotl {axolotl.get('version')} labels the turn end only "
                       f"for the tokens in eot_tokens (default: the eos token, which Gemma's template never emits): "
                       f"set eot_tokens: [\"{end}\"]")
            else:
                fix = (f"eot_tokens names {end}, yet axolotl {axolotl.get('version')} leaves it untrained: check the "
                       "dataset's train_on_eot / train_on_eos (\"none\" masks every turn end)")
        out.append(Finding("GD972", Severity.WARNING,
                           f"{len(missed)} of {len(rows)} samples hold the end-of-turn token but do not train it: "
                           "the model never learns to stop", key="labels", fix=fix, details=details))
    if record.get("completion_only"):
        open_ = [i for i, r in enumerate(rows) if r["trained"] and r["prompt_masked"] == 0]
        if open_:
            out.append(Finding("GD973", Severity.ERROR,
                               f"the run is completion-only but {len(open_)} of {len(rows)} samples train their prompt "
                               "(no token masked)", key="labels",
                               fix="give the dataset prompt/completion fields, or a template with generation markers",
                               details={"rows": rows}))
    return out


# The field record of the mechanism a left-padded batch meets in SDPA's cuDNN kernel (gemma_doctor/rehearse/nonfinite.py).
LEFT_PAD_SDPA = "gemma4-sdpa-left-padding-nan"


def _worked(diagnosis: Mapping[str, Any]) -> list[str]:
    """The cures that gave finite values on the fresh twin."""
    return [name for name, got in (diagnosis.get("cures") or {}).items() if got.get("finite") is True]


def _left_pad_sdpa(diagnosis: Mapping[str, Any] | None) -> bool:
    """The diagnosis is LEFT_PAD_SDPA's mechanism: a left-padded batch cured by the kernel or by the padding."""
    if not diagnosis or diagnosis.get("error") or not diagnosis.get("reproduced") or not diagnosis.get("left_padded"):
        return False
    worked = _worked(diagnosis)
    return "SDPA without the cuDNN kernel" in worked or "padding on the right" in worked


def nonfinite_cure(diagnosis: Mapping[str, Any] | None, default: str) -> str:
    """The cure of a non-finite loss or gradient, from the child's diagnosis on a fresh twin (rehearse/nonfinite.py):
    the cures that gave finite values in this stack, else where the non-finite values come from."""
    if not diagnosis or diagnosis.get("error"):
        return default
    if not diagnosis.get("reproduced"):
        return (f"a fresh twin steps the run's first {diagnosis.get('stepped')} batches with finite values: the "
                f"non-finite values grew during training, not from the data or a kernel ({default})")
    cures = diagnosis.get("cures") or {}
    worked = _worked(diagnosis)
    where = (f"a fresh twin reproduces it on batch {diagnosis.get('batch')} "
             f"({diagnosis.get('pads', 0)} pad tokens{', padded on the left' if diagnosis.get('left_padded') else ''})")
    if not worked:
        tried = ", ".join(cures) or "none could be tried here"
        return f"{where}; no cure tried gave finite values ({tried}): {default}"
    text = f"{where}; cure verified in this stack: {' or '.join(worked)} gives finite values"
    if _left_pad_sdpa(diagnosis):
        text += (" (catalogue " + LEFT_PAD_SDPA + ": a left pad's query row attends to no key, and SDPA's cuDNN kernel "
                 "turns it into NaN in the backward; tokenizer.padding_side = \"right\", attn_implementation=\"eager\", "
                 "or torch.backends.cuda.enable_cudnn_sdp(False))")
    return text


def judge_train(record: Mapping[str, Any]) -> list[Finding]:
    """Loss finite and not 0; gradient norm finite and > 0; trainable parameters change; LoRA B matrices move."""
    out: list[Finding] = []
    losses, norms = record.get("losses") or [], record.get("grad_norms") or []
    figures: dict[str, Any] = {"losses": losses, "grad_norms": norms}
    diagnosis = record.get("nonfinite")
    if diagnosis:
        figures["nonfinite"] = diagnosis
        if _left_pad_sdpa(diagnosis):
            figures["catalogue"] = LEFT_PAD_SDPA
    if any(not _finite(x) for x in losses):
        out.append(Finding("GD965", Severity.ERROR, f"the training loss is not finite: {losses}", key="train",
                           fix=nonfinite_cure(diagnosis, "bf16 instead of fp16, gradient clipping, a lower learning "
                                                         "rate"), details=figures))
    elif losses and all(x == 0 for x in losses):
        out.append(Finding("GD966", Severity.ERROR, f"the training loss is 0 at every step ({len(losses)} steps): "
                           "nothing is being learned", key="train",
                           fix="check the labels (GD971) and the loss masking", details=figures))
    if any(not _finite(x) for x in norms):
        out.append(Finding("GD967", Severity.ERROR, f"the gradient norm is not finite: {norms}", key="train",
                           fix=nonfinite_cure(diagnosis, "bf16 instead of fp16; find the module that overflows with "
                                                         "--real-weights"), details=figures))
    elif norms and all(x == 0 for x in norms):
        out.append(Finding("GD968", Severity.ERROR, f"the gradient norm is 0 at every step ({len(norms)} steps): "
                           "no parameter receives a gradient", key="train",
                           fix="check the labels (GD971), frozen parameters and the LoRA targets", details=figures))
    # A learning rate of 0 at every rehearsed step (a warm-up from 0 over them, recorded by the launch probe) moves
    # nothing in any correct stack: unchanged parameters say nothing then, and the record's note says so.
    rates = record.get("learning_rates") or []
    if rates and all(r == 0 for r in rates):
        return out
    trainable, moved = record.get("trainable", 0), record.get("moved", 0)
    if trainable and moved == 0:
        out.append(Finding("GD969", Severity.ERROR, f"none of the {trainable} trainable tensors changed after "
                           f"{len(losses) or 'the'} steps", key="train",
                           fix="check the learning rate, the optimizer and the gradients", details=dict(record)))
    lora = record.get("lora_b") or {}
    if lora.get("count") and lora.get("moved", 0) == 0:
        out.append(Finding("GD970", Severity.ERROR, f"no LoRA B matrix moved ({lora['count']} of them): the adapter "
                           "stays an identity", key="train", fix="check the gradients reach the adapter",
                           details=dict(lora)))
    return out


def _rel(diff: Mapping[str, Any]) -> float | None:
    if diff.get("max_abs_diff") is None:
        return None
    return float(diff["max_abs_diff"]) / max(float(diff.get("scale") or 0.0), 1e-6)


def _logits_finding(code: str, diff: Mapping[str, Any], what: str, fix: str, key: str) -> list[Finding]:
    rel = _rel(diff)
    if rel is None:
        return [Finding(code, Severity.ERROR, f"{what}: the logits changed shape {diff.get('shapes')}", key=key,
                        fix=fix, details=dict(diff))]
    if not math.isfinite(rel) or rel > LOGITS_RTOL:
        return [Finding(code, Severity.ERROR, f"{what}: logits differ by {diff['max_abs_diff']:.4g} "
                        f"(largest logit {diff['scale']:.4g}; tolerance {LOGITS_RTOL:.0%} of it)", key=key, fix=fix,
                        details=dict(diff))]
    return []


def judge(records: list[Mapping[str, Any]], entries: Iterable[Mapping[str, Any]],
          model_type: str | None = None) -> list[Finding]:
    """Every finding of one rehearsal's records (a crash ends the records, so it comes last)."""
    entries = list(entries)
    out: list[Finding] = []
    for r in records:
        stage, status = r.get("stage"), r.get("status")
        if status == "error":
            out.append(crash(r, entries, r.get("cure"), model_type))
            continue
        if status != "ok":
            continue
        if stage == "labels":
            out += judge_labels(r)
        elif stage == "wrap" and r.get("missing"):
            # A launched script's FSDP wrap classes, resolved as accelerate resolves them (hook/probe.py _wrap_check)
            out.append(Finding("GD994", Severity.ERROR, "the FSDP wrap classes "
                               f"{', '.join(r.get('classes') or []) or '(none)'} match no module of the model: on a GPU "
                               f"accelerate stops there before sharding ({r.get('line')}); on these CPU ranks the "
                               "Trainer ran without FSDP", key="fsdp_config.transformer_layer_cls_to_wrap",
                               fix=f"name the model's decoder layer class: {r.get('suggest') or 'see the model'}",
                               details=dict(r)))
        elif stage == "train" and "rollouts" in r:
            from gemma_doctor.rehearse import grpo  # its judgement is pure; its child side imports TRL lazily

            out += grpo.judge_train(r, judge_train)
        elif stage == "train":
            out += judge_train(r)
        elif stage == "generate" and r.get("cached") != r.get("uncached"):
            out.append(Finding("GD974", Severity.ERROR, "greedy generation with the KV cache gives other tokens than "
                               "without it", key="generate", fix="report it upstream with the versions in `stack`",
                               details={"cached": r.get("cached"), "uncached": r.get("uncached")}))
        elif stage == "save":
            out += _logits_finding("GD975", r, "the checkpoint reloaded is not the model that was saved",
                                   "report it upstream (transformers / PEFT) with the versions in `stack`", "save")
        elif stage == "merge":
            out += _logits_finding("GD976", r.get("merged", {}), "the merged model is not base + adapter",
                                   "merge in float32, or keep serving the adapter", "merge")
            out += _logits_finding("GD977", r.get("reloaded", {}), "the merged folder reloads as another model "
                                   "(a head or weights lost at save or load)",
                                   "pip install \"peft>=0.18.0\" and set ensure_weight_tying=True with modules_to_save on "
                                   "tied embeddings, or untie (tie_word_embeddings: false)", "merge")
        elif stage == "accumulation":
            out += judge_accumulation(r)
        elif stage == "resume":
            out += judge_resume(r)
        elif stage == "real-weights":
            from gemma_doctor.rehearse.realweights import judge as judge_real  # pure; imports no torch

            out += judge_real(r, train_dtype=r.get("train_dtype"), plan_bytes=r.get("plan_tensor_bytes"),
                              device_bytes=r.get("device_bytes"))
    return out


def judge_accumulation(record: Mapping[str, Any]) -> list[Finding]:
    """b x k against bk x 1: the same loss and gradient norm."""
    out = []
    for what in ("loss", "grad_norm"):
        a, b = record.get(f"accumulated_{what}"), record.get(f"whole_{what}")
        if _finite(a) and _finite(b) and abs(a - b) > ACCUMULATION_RTOL * max(abs(b), 1e-8):
            out.append(Finding("GD978", Severity.ERROR,
                               f"gradient accumulation changes the {what.replace('_', ' ')}: {a:.4g} with "
                               f"{record.get('micro')} x {record.get('k')} against {b:.4g} with one batch of "
                               f"{record.get('micro', 0) * record.get('k', 0)} (ratio {a / b if b else math.inf:.3g})",
                               key="accumulation", fix="see the catalogue (GD739): upgrade transformers",
                               details=dict(record)))
    return out


def judge_resume(record: Mapping[str, Any]) -> list[Finding]:
    """The resumed run continues the first: it trains the steps after the checkpoint, with the optimizer's state
    restored, each step's rate and loss those of the uninterrupted run, and ends at its parameters."""
    start, last = record.get("checkpoint"), record.get("last")
    broken = []
    steps = list(record.get("steps") or [])
    if isinstance(start, int) and isinstance(last, int) and steps != list(range(start + 1, last + 1)):
        broken.append(f"it trained steps {steps} where the steps after checkpoint-{start} are "
                      f"{list(range(start + 1, last + 1))} (the step counter was not restored)")
    restored = record.get("optimizer_restored") or {}
    # Against the parameters the uninterrupted run's optimizer held a state for (one never given a gradient has none).
    want = restored.get("uninterrupted", restored.get("params"))
    if isinstance(want, int) and isinstance(restored.get("with_state"), int) and restored["with_state"] < want:
        broken.append(f"the optimizer held a state for {restored['with_state']} of its {restored.get('params')} "
                      f"parameters when training resumed, against {want} without the stop (its state was not "
                      "restored)")
    for what, got, want in (("learning rate", "learning_rates", "expected_rates"),
                            ("loss", "losses", "expected_losses")):
        for step, a, b in zip(steps, record.get(got) or [], record.get(want) or []):
            if _finite(a) and _finite(b) and abs(a - b) > RESUME_RTOL * max(abs(b), 1e-12):
                broken.append(f"the {what} at step {step} was {a:.4g} against {b:.4g} without the stop")
                break
    diff, scale = record.get("params_max_abs_diff"), record.get("params_scale")
    if _finite(diff) and _finite(scale) and diff > RESUME_RTOL * scale:
        broken.append(f"the parameters at step {last} differ from the uninterrupted run's by {diff:.3g} (largest "
                      f"{scale:.3g})")
    if not broken:
        return []
    files = record.get("files")
    weights_only = isinstance(files, list) and not any(str(f).startswith("optimizer.") for f in files)
    fix = _WEIGHTS_ONLY_FIX if weights_only else ("not in the catalogue: report it upstream (transformers' Trainer) "
                                                  "with the versions in `stack` and these figures")
    return [Finding("GD999", Severity.ERROR, "resume_from_checkpoint does not continue the run from "
                    f"checkpoint-{start}: " + "; ".join(broken), key="resume", fix=fix, details=dict(record))]
