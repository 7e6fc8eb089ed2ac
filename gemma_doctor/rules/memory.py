"""Memory findings (GD8xx): check's Run against the GPU's memory, its plan's verdict and figures (run.Memory, made by
gemma_doctor/plan/memory.py; docs/memory.md)."""

from __future__ import annotations

from typing import Iterator

from gemma_doctor.codes import emits
from gemma_doctor.facts import CheckOptions, Environment, ModelFacts
from gemma_doctor.report import Finding, Severity
from gemma_doctor.run import Method
from gemma_doctor.units import gib


def _where(env: Environment, fixed_by_config: bool) -> tuple[str | None, str | None]:
    tc = env.training_config
    return (tc.path, None) if tc is not None and fixed_by_config else (None, None)


@emits("GD801", "GD802", "GD803", "GD804")
def check(model: ModelFacts, env: Environment, options: CheckOptions) -> Iterator[Finding]:
    """GD801 the configured run does not fit; GD802 it is tight; GD803 nothing fits this GPU; GD804 towers unused."""
    run = model.run
    if run is None:
        return
    mem = run.memory
    details = {"per_gpu_bytes": mem.per_gpu_bytes, "gpu_bytes": mem.gpu_bytes, "components": dict(mem.components)}
    setting = {"method": run.method, "batch_size": run.batch, "gradient_checkpointing": run.checkpointing}
    by_config = any(setting[k].source.startswith("training config") for k in mem.fixed)
    file, key = _where(env, by_config)
    if mem.gpu_bytes and not mem.choice.fits and mem.fixed:
        alt = mem.unconstrained
        ckpt = run.checkpointing.source
        # Checkpointing off, or the batch, by the trainer's default and otherwise in the run that fits: the way out
        # names each setting it changes (the config never wrote them).
        settings = []
        if ckpt.startswith("default of") and not run.checkpointing.value and alt is not None and alt.checkpointing:
            settings.append(f"gradient_checkpointing: true (off by the {ckpt})")
        batch = run.batch.source
        if batch.startswith("default of") and alt is not None and alt.fits and alt.batch is not None \
                and alt.batch != run.batch.value:
            settings.append(f"per_device_train_batch_size: {alt.batch} and gradient_accumulation_steps: "
                            f"{alt.accumulation} (by the {batch})")
        turn_on = "set " + "; ".join(settings) + "; " if settings else ""
        fix = (f"{turn_on}it would fit as: {alt.summary}" if alt is not None and alt.fits and alt.summary is not None else
               f"use a larger GPU: {alt.smallest_gpu} ({alt.smallest_gpu_summary})"
               if alt is not None and alt.smallest_gpu and alt.smallest_gpu_summary is not None else
               "shard over several GPUs (ZeRO-3 / FSDP) or use a larger GPU")
        fix = _evaluation_first(details["components"]) + fix
        # A tight plan is within the GPU's memory, above the 90% that leaves room for fragmentation.
        than = "above 90% of what" if mem.verdict == "tight" else "more than"
        yield Finding("GD801", Severity.ERROR,
                      f"the training run as configured ({', '.join(mem.fixed)} fixed) needs {gib(mem.per_gpu_bytes)} per "
                      f"GPU, {than} {mem.gpu_name or 'the GPU'} has ({gib(mem.gpu_bytes)}): {mem.summary}",
                      file=file, key=key, fix=fix, details=details)
    elif mem.verdict == "tight" and mem.choice.fits:
        yield Finding("GD802", Severity.WARNING,
                      f"the run fits only tightly: {mem.summary} (above {90}% of the GPU: allocator fragmentation or a "
                      "longer batch can run out of memory)", file=file, key=key,
                      fix=_evaluation_first(details["components"]) + "lower the batch size (raise "
                          "gradient_accumulation_steps), turn on gradient checkpointing, or shorten the sequences",
                      details=details)
    elif mem.gpu_bytes and not mem.choice.fits:
        c = mem.choice
        # A GPU someone named (--gpu, the probe, --gpu-memory) that no run fits is a run that cannot start: an error.
        named = env.gpu is not None and env.gpu.source in ("--gpu", "probe") or bool(options.memory and options.memory.gpu_memory)
        yield Finding("GD803", Severity.ERROR if named else Severity.WARNING,
                      f"no fine-tuning method fits {mem.gpu_name or 'this GPU'} ({gib(mem.gpu_bytes)}): even "
                      f"{mem.summary}", fix=(f"train on a {c.smallest_gpu} or larger ({c.smallest_gpu_summary})"
                                             if c.smallest_gpu and c.smallest_gpu_summary else c.reason),
                      details={**details, "smallest_gpu": c.smallest_gpu})
    towers = run.shape.towers
    # Only for a run the user describes (a training config, a method or batch): a bare check is not a training plan.
    described = env.training_config is not None or bool(mem.fixed)
    tc = env.training_config
    images = tc is not None and tc.ok and tc.get("vision_data") is not None
    if towers and described and run.text_only and run.method.value is Method.FULL and not images:
        wb = {"float32": 4}.get(run.load_dtype.value, 2)
        yield Finding("GD804", Severity.INFO,
                      f"text-only training of a multimodal checkpoint loads its vision/audio towers for nothing: "
                      f"{towers:,} parameters, {gib(towers * wb)} in {run.load_dtype.value}",
                      fix=_text_only_cure(model.family.family), details={"tower_params": towers})


def _evaluation_first(components: dict[str, int]) -> str:
    """Where the evaluation moment is the peak (its components only exist there: docs/memory.md "Evaluation"), what
    lowers it, first: the training settings the search varies do not."""
    if "kept_predictions" in components:
        return ("the peak is evaluation's kept predictions: set eval_accumulation_steps (they move to the CPU every that "
                "many batches), lower per_device_eval_batch_size, or prediction_loss_only: true; else ")
    if "eval_logits" in components:
        return "the peak is an evaluation batch's logits: lower per_device_eval_batch_size; else "
    return ""


# The class that loads a multimodal checkpoint's language model alone, per family: Gemma3ForCausalLM reads a gemma3
# checkpoint (with key_mapping on transformers 5.x), Gemma3nForCausalLM a gemma3n one (it maps the keys itself); the
# loading snippet of `recommend` (plan/recommend.py TEXT_ONLY_CLASSES) names the same. No text-only class is known to
# load a Gemma 4 or PaliGemma checkpoint: its towers can only be frozen.
TEXT_ONLY_CLASSES = {"gemma3": "Gemma3ForCausalLM", "gemma3n": "Gemma3nForCausalLM"}


def _text_only_cure(family: str | None) -> str:
    """GD804's cure for this family: the text-only class where one loads the checkpoint, else frozen towers."""
    cls = TEXT_ONLY_CLASSES.get(family or "")
    if cls is not None:
        return (f"load the language model alone ({cls}.from_pretrained on the checkpoint; `recommend` prints the "
                "snippet) when no images are trained on")
    return ("freeze the towers when no images are trained on (gemma_doctor.prepare(model, args, text_only=True), or "
            "requires_grad_(False) on the vision/audio towers): no text-only class loads this checkpoint")
