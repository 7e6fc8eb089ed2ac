"""GPU and precision findings (GD3xx): no GPU, no native bf16 for Gemma 2/3, the emulated-bf16 trap, unknown bf16."""

from __future__ import annotations

from typing import Any, Iterator

from gemma_doctor.codes import emits
from gemma_doctor.facts import CheckOptions, Environment, ModelFacts
from gemma_doctor.report import MODEL, Finding, Severity
from gemma_doctor.rules.common import LIBRARIES, RUN, written_of
from gemma_doctor.rules.dtypes import embedding_note
from gemma_doctor.stack import Exposure, Window


def recommend_command(gpu: Any) -> str:
    """The command that prints the ready-to-paste settings for this model (named by the engine) and GPU."""
    spec = getattr(gpu, "spec", None)
    flag = f" --gpu {spec!r}" if spec and " " in spec else f" --gpu {spec}" if spec else ""
    return f"gemma-doctor recommend {MODEL}{flag}"


def _precision_explicit(model: ModelFacts, env: Environment) -> bool:
    """True when the --training-config sets fp16/bf16/mixed_precision to a value, not `auto`: then nothing asks
    torch.cuda.is_bf16_supported(), and the trap GD303 warns about cannot spring (GD603/GD605 judge the value). The
    Run's switches as written (whether one says `auto`), which its one precision does not keep."""
    return written_of(model, env).switches.explicit


def _trains_in_fp32(model: ModelFacts, env: Environment) -> bool:
    """True when the --training-config sets its precision explicitly and turns neither fp16 nor bf16 on (the Run's
    switches as written: a candidate of the search writes its own), and its trainer does not turn bf16 on by its own
    default (the Run's precision, whose source names that default: TRL's configs set bf16 = not fp16, so `fp16: false`
    alone is bf16)."""
    run = model.run
    if run is not None and run.precision.value != "fp32" and run.precision.source.startswith("default of "):
        return False
    return written_of(model, env).switches.fp32


# Unsloth's "forced float32" path for Gemma 3 / 3n on GPUs without bf16 (FORCE_FLOAT32) is not fp32 throughout:
# unsloth-zoo's temporary_patches/gemma.py narrows to a hard-coded torch.float16 at the Linear boundaries up to
# 2026.8.6, so the layers compute in float16 (and full fine-tuning crashes: float16 activations meet float32 weights);
# 2026.8.7 casts to the weights' own dtype (unsloth-zoo PR #1017; the field catalogue's GD714, bisected on the
# wheels). Gemma 3n's multimodal embedder failed under it until unsloth-zoo PR #291 (2025-09).
UNSLOTH_ZOO_FP32 = Window("unsloth-zoo", "<2026.8.7", "2026.8.7")
UNSLOTH_ZOO_FP32_FIXED = UNSLOTH_ZOO_FP32.first_fixed
_UNSLOTH_FP32_TYPES = frozenset({"gemma3", "gemma3_text", "gemma3n", "gemma3n_text"})


def _quant_method(model: ModelFacts) -> str | None:
    """The checkpoint's quantization method (census of quantization_config or the tensor layout), lower case."""
    q = model.census.quantization if model.census is not None else None
    method = q.get("method") if isinstance(q, dict) else None
    return str(method).lower() if method else None


def _unsloth_fp32_note(model: ModelFacts, env: Environment) -> str | None:
    """Why fp32 through the Unsloth that will run is not fp32, or None when Unsloth is not in the stack."""
    stack = env.libraries
    if model.family.model_type not in _UNSLOTH_FP32_TYPES or (stack.get("unsloth").absent
                                                              and stack.get("unsloth-zoo").absent):
        return None
    exposure = stack.exposure(UNSLOTH_ZOO_FP32)
    if exposure is Exposure.SAFE:
        return None
    zoo = stack.get("unsloth-zoo").describe()
    return (f"through Unsloth ({zoo}) the forced-float32 path is narrowed to float16 at every Linear layer "
            f"(unsloth-zoo temporary_patches/gemma.py before {UNSLOTH_ZOO_FP32_FIXED}): the layers compute in the fp16 "
            "this model overflows, and full fine-tuning stops with \"expected mat1 and mat2 to have the same dtype\" "
            f"(GD714){'' if exposure is Exposure.AFFECTED else ', if the unsloth-zoo that runs is older'}")


@emits("GD301", "GD302", "GD303", "GD304",
       reads=("model.family", "model.census", *RUN, *LIBRARIES, "env.gpu", "env.training_config", "options.gpu",
              "options.task", "options.training_config"))
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
        method = _quant_method(model)
        if method == "awq":
            # fp32 is no advice for an AWQ checkpoint: its kernels compute in float16 whatever is asked.
            yield Finding(
                "GD302", Severity.WARNING,
                f"{gpu.label} has no native bf16 and {model.family.display_name} overflows fp16 (activations > 65504, "
                "transformers #36822), and this checkpoint is AWQ-quantized: its kernels run in float16 whatever dtype "
                "is asked (transformers' AwqQuantizer casts bfloat16 to float16 and recommends float16 for any other "
                "dtype on CUDA), so there is no fp32 path through it to train or serve",
                key="gpu", fix="start from the unquantized checkpoint the AWQ one was made from (QLoRA with "
                               "bnb_4bit_compute_dtype=float32 fits this GPU: gemma-doctor recommend ORIGINAL "
                               f"--gpu {getattr(gpu, 'spec', None) or 'NAME'} --qlora), or a GPU with compute capability 8.0+",
                details={**details, "quantization": method})
        else:
            unsloth = _unsloth_fp32_note(model, env)
            # A training config that already trains in fp32 follows this advice: what remains is a fact, not a warning.
            yield Finding(
                "GD302", Severity.INFO if _trains_in_fp32(model, env) and not unsloth else Severity.WARNING,
                f"{gpu.label} has no native bf16 and {model.family.display_name} overflows fp16 (activations > 65504, "
                "transformers #36822): train in fp32, which costs twice bf16's memory for weights and activations "
                "and runs without tensor cores" + embedding_note(model) + (f"; {unsloth}" if unsloth else ""),
                key="gpu", fix=f"{recommend_command(gpu)} (fp32 settings)"
                               + (f', without Unsloth or with "unsloth-zoo>={UNSLOTH_ZOO_FP32_FIXED}"' if unsloth else "")
                               + "; or QLoRA to cut memory; or a GPU with compute capability 8.0+ (A10G, L4, A100, H100)",
                details=details)
    if gpu.emulated_bf16_trap and not _precision_explicit(model, env):
        yield Finding(
            "GD303", Severity.WARNING,
            f"torch.cuda.is_bf16_supported() returns True on {gpu.label} through emulation, so `bf16: auto` (axolotl), "
            "transformers' is_torch_bf16_gpu_available() and LLaMA-Factory pick slow emulated bf16 here",
            key="gpu", fix="set the precision explicitly (bf16: false; fp16 or fp32 as recommended): "
                           + recommend_command(gpu), details=details)
    if gpu.native_bf16 is None:
        yield Finding("GD304", Severity.INFO,
                      f"bf16 support of {gpu.label} is unknown ({gpu.reason}); the recommendation assumes no native bf16",
                      key="gpu", fix="name the GPU with --gpu (a compute capability or a GPU name)", details=details)
