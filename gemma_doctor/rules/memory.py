"""Memory findings (GD8xx): the planned run against the GPU's memory (gemma_doctor/plan/memory.py, docs/memory.md)."""

from __future__ import annotations

from typing import Iterator

from gemma_doctor.facts import CheckOptions, Environment, ModelFacts
from gemma_doctor.plan.memory import gib
from gemma_doctor.report import Finding, Severity


def _where(env: Environment, fixed_by_config: bool) -> tuple[str | None, str | None]:
    tc = env.training_config
    return (tc.path, None) if tc is not None and fixed_by_config else (None, None)


def check(model: ModelFacts, env: Environment, options: CheckOptions) -> Iterator[Finding]:
    """GD801 the configured run does not fit; GD802 it is tight; GD803 nothing fits this GPU; GD804 towers unused."""
    mem = model.memory
    if mem is None:
        return
    plan = mem.plan
    details = {"per_gpu_bytes": plan.per_gpu_bytes, "gpu_bytes": plan.gpu_bytes, "components": dict(plan.components)}
    by_config = any(str(dict(plan.run.sources).get(k, "")).startswith("training config") for k in mem.fixed)
    file, key = _where(env, by_config)
    if plan.gpu_bytes and not mem.choice.fits and mem.fixed:
        alt = mem.unconstrained
        fix = (f"it would fit as: {alt.plan.summary()}" if alt is not None and alt.fits and alt.plan is not None else
               f"use a larger GPU: {alt.smallest_gpu} ({alt.smallest_gpu_plan.summary()})"
               if alt is not None and alt.smallest_gpu and alt.smallest_gpu_plan is not None else
               "shard over several GPUs (ZeRO-3 / FSDP) or use a larger GPU")
        yield Finding("GD801", Severity.ERROR,
                      f"the training run as configured ({', '.join(mem.fixed)} fixed) needs {gib(plan.per_gpu_bytes)} per "
                      f"GPU, more than {plan.gpu_name or 'the GPU'} has ({gib(plan.gpu_bytes)}): {plan.summary()}",
                      file=file, key=key, fix=fix, details=details)
    elif plan.verdict == "tight" and mem.choice.fits:
        yield Finding("GD802", Severity.WARNING,
                      f"the run fits only tightly: {plan.summary()} (above {90}% of the GPU: allocator fragmentation or a "
                      "longer batch can run out of memory)", file=file, key=key,
                      fix="lower the batch size (raise gradient_accumulation_steps), turn on gradient checkpointing, or "
                          "shorten the sequences", details=details)
    elif plan.gpu_bytes and not mem.choice.fits:
        c = mem.choice
        # A GPU someone named (--gpu, the probe, --gpu-memory) that no run fits is a run that cannot start: an error.
        named = env.gpu is not None and env.gpu.source in ("--gpu", "probe") or bool(options.memory and options.memory.gpu_memory)
        yield Finding("GD803", Severity.ERROR if named else Severity.WARNING,
                      f"no fine-tuning method fits {plan.gpu_name or 'this GPU'} ({gib(plan.gpu_bytes)}): even "
                      f"{plan.summary()}", fix=(f"train on a {c.smallest_gpu} or larger ({c.smallest_gpu_plan.summary()})"
                                                if c.smallest_gpu and c.smallest_gpu_plan else c.reason),
                      details={**details, "smallest_gpu": c.smallest_gpu})
    towers = plan.shape.params.towers
    # Only for a run the user describes (a training config, a method or batch): a bare check is not a training plan.
    described = env.training_config is not None or bool(mem.fixed)
    if towers and described and plan.run.text_only and plan.method == "full":
        wb = {"float32": 4}.get(plan.run.load_dtype, 2)
        yield Finding("GD804", Severity.INFO,
                      f"text-only training of a multimodal checkpoint loads its vision/audio towers for nothing: "
                      f"{towers:,} parameters, {gib(towers * wb)} in {plan.run.load_dtype}",
                      fix="load the language model alone (e.g. Gemma3ForCausalLM from the checkpoint) when no images "
                          "are trained on", details={"tower_params": towers})
