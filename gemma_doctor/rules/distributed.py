"""Distributed-run lint (GD66x): how the training config shards the run (FSDP / FSDP2 through accelerate or the
Trainer, DeepSpeed ZeRO), judged against the model's classes and the libraries that will run."""

from __future__ import annotations

from typing import Any, Iterator

from gemma_doctor.codes import emits
from gemma_doctor.facts import CheckOptions, Environment, ModelFacts
from gemma_doctor.readers.training_config import DEEPSPEED_BATCH, TrainingConfig, is_auto, truthy
from gemma_doctor.report import Finding, Severity
from gemma_doctor.rules.common import located, run_distributed, run_trainer
from gemma_doctor.rules.training import setting_finding
from gemma_doctor.run import AutoWrap, Distributed, Engine, Sourced
from gemma_doctor.stack import Exposure
from gemma_doctor.stack import Window
from gemma_doctor.trainers import TRAINING_ARGUMENTS_BATCH, Trainer
from gemma_doctor.units import positive_int
from gemma_doctor.versioning import (FSDP2_SHARED_PARAM_CHECK, FSDP2_TIED_TAIL_GROUP, FSDP_WRAP_GEMMA3_TOWERS,
                                     FSDP_WRAP_GEMMA4_TOWERS, TRAINER_FSDP2_DEFAULTS, ZERO3_GEMMA4_CLIP_BUFFERS)

GEMMA3_TOWER_CLASSES = ("SiglipVisionEmbeddings", "SiglipEncoderLayer", "SiglipMultiheadAttentionPoolingHead")
GEMMA4_VISION_CLASSES = ("Gemma4VisionEncoderLayer", "Gemma4VisionPatchEmbedder")
GEMMA4_AUDIO_CLASSES = ("Gemma4AudioLayer",)


@emits("GD660", "GD661", "GD662", "GD663", "GD682")
def check(model: ModelFacts, env: Environment, options: CheckOptions) -> Iterator[Finding]:
    """Lint how the run's processes run together (the Run's ``distributed``: engine, DeepSpeed's stage, wrap classes)
    against this model and the libraries; each finding points at the training config's key."""
    tc = env.training_config
    if tc is None or not tc.ok or not model.family.is_gemma:
        return
    run = run_distributed(model, env)
    yield from _fsdp_wrap(model, env, tc, run)
    yield from _fsdp_wrap_named(model, tc, run)
    yield from _zero3_clip_buffers(model, env, tc, run)
    yield from _fsdp2_tied(model, env, tc, run)
    yield from _deepspeed_batch(model, env, tc, run)


def _wrap_without_classes(run: Distributed) -> tuple[Sourced[Any], bool] | None:
    """The Run's auto-wrap policy where it is transformer-based with no class list (the Run's wrap classes), and
    whether only by default: TrainingArguments' `fsdp` without auto_wrap wraps so only on the transformers releases
    whose TrainingArguments wrap by default (TRAINER_FSDP2_DEFAULTS); None where nothing wraps by class unlisted."""
    if run.wrap_classes is not None or run.auto_wrap is None or run.auto_wrap.value is not AutoWrap.TRANSFORMER:
        return None
    return run.auto_wrap, not run.auto_wrap_stated


def _config(model: ModelFacts) -> dict[str, Any]:
    return model.config.data if model.config.ok and isinstance(model.config.data, dict) else {}


def _absent_and_cure(model: ModelFacts) -> tuple[tuple[str, ...], tuple[str, ...], Any] | None:
    """(listed classes the model lacks, the classes to wrap instead, the window in which they are listed)."""
    fam = model.family
    data = _config(model)
    if fam.model_type == "gemma3_text":
        return GEMMA3_TOWER_CLASSES, ("Gemma3DecoderLayer",), FSDP_WRAP_GEMMA3_TOWERS
    if fam.model_type in ("gemma4", "gemma4_text"):
        vision = fam.model_type == "gemma4" and isinstance(data.get("vision_config"), dict)
        audio = fam.model_type == "gemma4" and isinstance(data.get("audio_config"), dict)
        absent = (() if vision else GEMMA4_VISION_CLASSES) + (() if audio else GEMMA4_AUDIO_CLASSES)
        cure = ("Gemma4TextDecoderLayer",) + (("Gemma4VisionEncoderLayer",) if vision else ()) \
            + (("Gemma4AudioLayer",) if audio else ())
        return (absent, cure, FSDP_WRAP_GEMMA4_TOWERS) if absent else None
    return None


def _fsdp_wrap(model: ModelFacts, env: Environment, tc: TrainingConfig, run: Distributed) -> Iterator[Finding]:
    if not run.engine.value.fsdp:
        return
    trigger = _wrap_without_classes(run)
    known = _absent_and_cure(model)
    if trigger is None or known is None:
        return
    policy, by_default = trigger
    absent, cure, window = known
    if by_default:  # both must hold: the Trainer wraps by default, and it lists the absent classes
        window = Window(window.package, f"{window.spec},{TRAINER_FSDP2_DEFAULTS.spec}", window.first_fixed)
    exposure = env.libraries.exposure(window)
    if exposure is Exposure.SAFE:
        return
    who = env.libraries.get("transformers").describe()
    since = f"transformers {window.spec.replace(',', ', ')}"
    when = "" if exposure is Exposure.AFFECTED else f" if the run uses {since} (it will use {who})"
    paste = ",".join(cure)
    yield Finding(
        "GD660", Severity.ERROR if exposure is Exposure.AFFECTED else Severity.WARNING,
        f"FSDP transformer-based auto-wrap without a class list wraps the model's _no_split_modules, which on "
        f"{model.family.display_name} name {', '.join(absent)}: classes this checkpoint does not have, so accelerate "
        f"stops before training with \"Could not find the transformer layer class ... in the model\" naming the "
        f"first of them it meets{when} "
        f"(reproduced on CPU with accelerate's FullyShardedDataParallelPlugin"
        + ("; verl #4950)" if model.family.model_type.startswith("gemma4") else ")"),
        fix=f"name the layers to wrap: fsdp_transformer_layer_cls_to_wrap: {paste} (accelerate config; "
        f"TrainingArguments: fsdp_config: {{transformer_layer_cls_to_wrap: [{', '.join(cure)}]}})"
        + (f"; or pip install \"transformers>={window.first_fixed}\"" if window.first_fixed else ""),
        **located(policy, tc, classes_to_wrap=list(cure), classes_absent=list(absent)))


def _fsdp_wrap_named(model: ModelFacts, tc: TrainingConfig, run: Distributed) -> Iterator[Finding]:
    """GD682: a wrap class the model does not have (another Gemma's layer, a typo): accelerate stops, as for GD660.
    The Run checked each class of the list against the model's classes (readers/model_classes.py)."""
    from gemma_doctor.readers.model_classes import model_classes

    if run.wrap_classes is None or not run.engine.value.fsdp:
        return
    # in_model None: a model_type the table does not hold, nothing to compare with
    absent = [w.name for w in run.wrap_classes.value if w.in_model is False]
    table = model_classes()
    ours = table.classes.get(model.family.model_type or "", ())
    if not absent:
        return
    import difflib

    text_layers = [c for c in ours if c.endswith("DecoderLayer") and not c.startswith(("Siglip", "T5"))] or \
        [c for c in ours if c.endswith("DecoderLayer")]
    others = {c for t, cs in table.classes.items() if t != model.family.model_type for c in cs}
    lines = []
    for c in absent:
        close = difflib.get_close_matches(c, ours, n=1, cutoff=0.8)
        lines.append(f"{c} (did you mean {close[0]}?)" if close else
                     f"{c} (a class of another model)" if c in others else c)
    # Another Gemma's class or a misspelling is certainly absent; a name the table has nowhere may be a class of a
    # transformers release other than the one the table was read from.
    sure = all(c in others or difflib.get_close_matches(c, ours, n=1, cutoff=0.8) for c in absent)
    yield setting_finding(
        "GD682", Severity.ERROR if sure else Severity.WARNING,
        f"FSDP wraps {', '.join(lines)}: {model.family.display_name}'s modeling code has no such class "
        f"(read from transformers {table.read_from}), so accelerate stops before training with \"Could not find the "
        "transformer layer class ... in the model\"",
        f"fsdp_transformer_layer_cls_to_wrap: {','.join(sorted(text_layers))} (the text model's decoder layer"
        + (", plus the towers' layers if they are trained" if model.family.nested else "") + ")",
        tc, "fsdp_wrap_classes", classes_absent=absent, classes_to_wrap=sorted(text_layers))


def _zero3_clip_buffers(model: ModelFacts, env: Environment, tc: TrainingConfig, run: Distributed
                        ) -> Iterator[Finding]:
    data = _config(model)
    towers = model.family.model_type == "gemma4" and any(isinstance(data.get(k), dict) for k in ("vision_config", "audio_config"))
    # DeepSpeed's own ZeRO-3 loading path (the engine's, also on one process), not FSDP's sharding counted as stage 3
    zero3 = run.engine.value is Engine.DEEPSPEED and run.zero_stage is not None and run.zero_stage.value == 3
    if not towers or not zero3:
        return
    exposure = env.libraries.exposure(ZERO3_GEMMA4_CLIP_BUFFERS)
    if exposure is Exposure.SAFE:
        return
    when = "" if exposure is Exposure.AFFECTED else \
        f" if the run uses transformers 5.5.0-5.5.4 (it will use {env.libraries.get('transformers').describe()})"
    yield setting_finding(
        "GD661", Severity.ERROR if exposure is Exposure.AFFECTED else Severity.WARNING,
        f"DeepSpeed ZeRO-3 on {model.family.display_name} with vision/audio towers{when}: transformers 5.5.0-5.5.4 "
        "load ZeRO-3 models without their buffers, so the towers' Gemma4ClippableLinear clip bounds (input_min/max, "
        "output_min/max) are reported missing and stay at +-inf: garbled outputs, a loss that never converges "
        "(transformers #45397, fixed by PR #45402 in 5.6.0; LLaMA-Factory #10355)",
        f"pip install \"transformers>={ZERO3_GEMMA4_CLIP_BUFFERS.first_fixed}\" (or train with ZeRO-2 / FSDP)",
        tc, "zero_stage")


def _tied(model: ModelFacts) -> bool:
    """Gemma ties lm_head to embed_tokens unless a config says tie_word_embeddings: false."""
    data = _config(model)
    for node in (data, data.get("text_config")):
        if isinstance(node, dict) and node.get("tie_word_embeddings") is False:
            return False
    return True


def _fsdp2_tied(model: ModelFacts, env: Environment, tc: TrainingConfig, run: Distributed) -> Iterator[Finding]:
    # The Run's engine: FSDP2 as written (fsdp_version: 2), or TrainingArguments' default, a version window
    # (TRAINER_FSDP2_DEFAULTS) weighed here; accelerate's plugin defaults to FSDP1.
    if run.engine.value is not Engine.FSDP2 or not _tied(model):
        return
    windows = [FSDP2_TIED_TAIL_GROUP, FSDP2_SHARED_PARAM_CHECK]
    if not run.version_stated:
        windows.append(TRAINER_FSDP2_DEFAULTS)  # TrainingArguments' FSDP version is 2 by default from 5.10
    exposures = [env.libraries.exposure(w) for w in windows]
    if Exposure.SAFE in exposures:
        return
    affected = all(e is Exposure.AFFECTED for e in exposures)
    libs = ", ".join(env.libraries.get(w.package).describe() for w in windows)
    yield Finding(
        "GD662", Severity.ERROR if affected else Severity.WARNING,
        "FSDP2" + ("" if run.version_stated else " (TrainingArguments' default from transformers 5.10)")
        + f" on {model.family.display_name}, whose lm_head shares embed_tokens' weight, "
        + ("with" if affected else "if the run uses") + " accelerate 1.14.0 and torch >= 2.13"
        + ("" if affected else f" (it will use {libs})")
        + ": accelerate 1.14.0 puts the tied embedding in a group of its own and lm_head in the root group, which torch "
        "2.13 refuses at the first forward: \"Parameter 'model.embed_tokens.weight' is shared with a parameter already "
        "managed by another FSDP group\" (reproduced on CPU with 2 gloo processes; accelerate PR #4171, fixed in 1.15.0)",
        fix=f"pip install \"accelerate>={FSDP2_TIED_TAIL_GROUP.first_fixed}\" (or \"accelerate<1.14\")",
        **located(run.engine, tc))


def _trainingarguments_batch(tc: TrainingConfig, trainer: Trainer) -> tuple[int | None, int | None]:
    """(per_device_train_batch_size, gradient_accumulation_steps) that TrainingArguments holds for the run the training
    config describes: the config's own values, else, for a plain Trainer or one of TRL's (whose configs keep
    TrainingArguments' defaults), the defaults 8 and 1; None where neither says. Read from the config itself, not from
    the memory plan's Run (whose batch an option or the search may set): the DeepSpeed integration compares the files
    as they will run, whether or not a plan is made."""
    s = tc.settings
    batch = positive_int(s["batch_size"].value) if "batch_size" in s else None
    accumulation = positive_int(s["gradient_accumulation_steps"].value) if "gradient_accumulation_steps" in s else None
    if trainer.runs_trl or trainer is Trainer.TRANSFORMERS:
        batch = batch if "batch_size" in s else TRAINING_ARGUMENTS_BATCH
        accumulation = accumulation if "gradient_accumulation_steps" in s else 1
    return batch, accumulation


def _deepspeed_batch(model: ModelFacts, env: Environment, tc: TrainingConfig, run: Distributed) -> Iterator[Finding]:
    """GD663: the DeepSpeed JSON the config names writes a batch that differs from TrainingArguments' (the config's
    own batch and accumulation, or the trainer's defaults). The Trainer's integration fills an "auto" from
    TrainingArguments and refuses a number that differs: HfTrainerDeepSpeedConfig.fill_match collects each mismatch
    and trainer_config_finalize raises one ValueError at start-up (transformers >= 4.7.0; 4.5 refused the keys
    outright, 4.6 set "auto" only; reproduced with transformers 5.23.0). Under auto_find_batch_size the micro batch and
    the global batch are not checked."""
    s = tc.settings
    if not any(name in s for name in DEEPSPEED_BATCH):
        return
    finder = "auto_find_batch_size" in s and truthy(s["auto_find_batch_size"].value)
    batch, accumulation = _trainingarguments_batch(tc, run_trainer(model, env).value)
    # DeepSpeed's train_batch_size is world_size x micro batch x accumulation: checked where the processes are written.
    nodes = positive_int(s["num_machines"].value) if "num_machines" in s else 1
    world = run.processes_per_node.value * nodes if run.processes_per_node.source != "default" and nodes else None
    total = batch * accumulation * world if batch and accumulation and world else None
    hf_keys = {"deepspeed_batch_size": ("per_device_train_batch_size", None if finder else batch),
               "deepspeed_accumulation": ("gradient_accumulation_steps", accumulation),
               "deepspeed_train_batch_size": ("train_batch_size (calculated)", None if finder else total)}
    lines, first = [], None
    for name, (hf_key, hf_val) in hf_keys.items():
        ds = s.get(name)
        if ds is None or hf_val is None or is_auto(ds.value):
            continue
        if ds.value != hf_val:
            json_key = ds.key.rsplit(": ", 1)[-1].rstrip(")")
            lines.append(f"- ds {json_key}={ds.value} vs hf {hf_key}={hf_val}")
            first = first or ds
    if first is None:
        return
    yield Finding(
        "GD663", Severity.ERROR,
        "the DeepSpeed config writes a batch that TrainingArguments does not: the Trainer stops at start-up "
        "(transformers >= 4.7.0, HfTrainerDeepSpeedConfig.trainer_config_finalize): \"Please correct the following "
        "DeepSpeed config values that mismatch TrainingArguments values:\n" + "\n".join(lines)
        + "\nThe easiest method is to set these DeepSpeed config values to 'auto'.\"",
        fix="write \"auto\" for train_micro_batch_size_per_gpu, gradient_accumulation_steps and train_batch_size in the "
            "DeepSpeed JSON (the Trainer fills them from TrainingArguments), or set per_device_train_batch_size / "
            "gradient_accumulation_steps in the training config to what the JSON writes",
        file=tc.path, key=first.key, details={"mismatches": lines})
