"""GPU and precision findings (GD3xx): no GPU, no native bf16 for Gemma 2/3, the emulated-bf16 trap, unknown bf16."""

from __future__ import annotations

from typing import Any, Iterator

from gemma_doctor.facts import CheckOptions, Environment, ModelFacts
from gemma_doctor.report import Finding, Severity
from gemma_doctor.rules.dtypes import embedding_note


def recommend_command(model: ModelFacts, gpu: Any) -> str:
    """The command that prints the ready-to-paste settings for this model and GPU."""
    spec = getattr(gpu, "spec", None)
    flag = f" --gpu {spec!r}" if spec and " " in spec else f" --gpu {spec}" if spec else ""
    return f"gemma-doctor recommend {model.snapshot.target}{flag}"


def _precision_explicit(env: Environment) -> bool:
    """True when the --training-config sets fp16/bf16/mixed_precision to a value, not `auto`: then nothing asks
    torch.cuda.is_bf16_supported(), and the trap GD303 warns about cannot spring (GD603/GD605 judge the value)."""
    tc = env.training_config
    if tc is None or not tc.ok:
        return False
    values = [tc.get(k).value for k in ("fp16", "bf16", "mixed_precision") if tc.get(k) is not None]
    return bool(values) and not any(isinstance(v, str) and v.strip().lower() == "auto" for v in values)


def _trains_in_fp32(env: Environment) -> bool:
    """True when the --training-config sets its precision explicitly and turns neither fp16 nor bf16 on."""
    tc = env.training_config
    if not _precision_explicit(env) or tc is None:
        return False
    from gemma_doctor.readers.training_config import truthy

    mixed = tc.get("mixed_precision")
    if mixed is not None and str(mixed.value).strip().lower() not in ("no", "fp32", "none", "false"):
        return False
    return not any(tc.get(k) is not None and truthy(tc.get(k).value) for k in ("fp16", "bf16"))


def check(model: ModelFacts, env: Environment, options: CheckOptions) -> Iterator[Finding]:
    """Findings about the GPU the run will use, for a Gemma model."""
    gpu = env.gpu
    if gpu is None or not model.family.is_gemma:
        return
    details = {"gpu": gpu.label, "source": gpu.source, "native_bf16": gpu.native_bf16}
    if gpu.backend == "none":
        # Only when the question is about precision: on a CPU runner a plain `check` of a fixed model stays
        # "no findings" (environment.gpu and the precision line still say there is no GPU).
        if not (options.task or options.training_config or gpu.source == "--gpu"):
            return
        yield Finding("GD301", Severity.INFO,
                      f"{gpu.reason}; the recommendation is for CPU training (fp32)",
                      key="gpu", fix="plan for the training GPU: add --gpu NAME or compute capability (T4, A100, 8.0, sm_75)",
                      details=details)
        return
    if gpu.native_bf16 is False and model.family.fp16_unsafe:
        # A training config that already trains in fp32 follows this advice: what remains is a fact, not a warning.
        yield Finding(
            "GD302", Severity.INFO if _trains_in_fp32(env) else Severity.WARNING,
            f"{gpu.label} has no native bf16 and {model.family.display_name} overflows fp16 (activations > 65504, "
            "transformers #36822): train in fp32, which costs twice bf16's memory for weights and activations "
            "and runs without tensor cores" + embedding_note(model),
            key="gpu", fix=f"{recommend_command(model, gpu)} (fp32 settings); or QLoRA to cut memory; or a GPU with compute "
                           "capability 8.0+ (A10G, L4, A100, H100)", details=details)
    if gpu.emulated_bf16_trap and not _precision_explicit(env):
        yield Finding(
            "GD303", Severity.WARNING,
            f"torch.cuda.is_bf16_supported() returns True on {gpu.label} through emulation, so `bf16: auto` (axolotl), "
            "transformers' is_torch_bf16_gpu_available() and LLaMA-Factory pick slow emulated bf16 here",
            key="gpu", fix="set the precision explicitly (bf16: false; fp16 or fp32 as recommended): "
                           + recommend_command(model, gpu), details=details)
    if gpu.native_bf16 is None:
        yield Finding("GD304", Severity.INFO,
                      f"bf16 support of {gpu.label} is unknown ({gpu.reason}); the recommendation assumes no native bf16",
                      key="gpu", fix="name the GPU with --gpu (a compute capability or a GPU name)", details=details)
