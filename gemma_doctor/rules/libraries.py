"""Library combinations known to break mixed-precision Gemma fine-tuning (GD4xx), from package metadata only."""

from __future__ import annotations

from collections.abc import Mapping  # isinstance in C (typing.Mapping's checks through Python per call)
from typing import Any, Iterator

from gemma_doctor.codes import emits
from gemma_doctor import horizon
from gemma_doctor.facts import CheckOptions, Environment, ModelFacts
from gemma_doctor.report import Finding, Severity
from gemma_doctor.versioning import PEFT_ADAPTER_FP32, PEFT_CAST_HELPER, parse

_HALF = ("bfloat16", "float16")


@emits("GD401", "GD402")
def check(model: ModelFacts, env: Environment, options: CheckOptions) -> Iterator[Finding]:
    """PEFT < 0.12 on a half-precision base; bitsandbytes bf16 compute on a GPU without native bf16."""
    if not model.family.is_gemma:
        return
    run = model.run
    gpu = env.gpu
    peft = env.libraries.version("peft")
    pv = parse(peft)
    if pv is not None and pv < parse(PEFT_ADAPTER_FP32) and run is not None and (
            run.load_dtype.value in _HALF or run.quantization):
        helper = "peft.cast_mixed_precision_params(model, dtype)" if pv >= parse(PEFT_CAST_HELPER) else \
            "for p in model.parameters(): if p.requires_grad: p.data = p.data.float()"
        yield Finding(
            "GD401", Severity.WARNING,
            f"peft {peft} is installed: LoRA adapters created on this {run.load_dtype.value} base stay in half precision "
            "(PEFT < 0.12 does not upcast them), which gives NaN losses or 'Attempting to unscale FP16 gradients'",
            key="peft", fix=f'pip install "peft>={PEFT_ADAPTER_FP32}", or after get_peft_model: {helper}',
            details={"peft": peft})
    # A training config's compute dtype (a BitsAndBytesConfig, TRL's bnb_4bit_compute_dtype, axolotl's
    # bnb_config_kwargs) does not reach a checkpoint saved quantized: transformers keeps the checkpoint's own
    # quantization_config (merge_quantization_configs, reproduced on 5.23.0: it warns and loads bfloat16), and axolotl
    # 0.19.0 builds BitsAndBytesConfig(**model_config.quantization_config) there, never reading bnb_config_kwargs.
    q = _bnb_quantization(model)
    if q is not None and gpu is not None and gpu.native_bf16 is False and gpu.backend != "none":
        compute = q.get("compute_dtype")
        if isinstance(compute, str) and compute.replace("torch.", "") in ("bfloat16", "bf16"):
            target = "float32" if model.family.fp16_unsafe else "float16"
            yield Finding(
                "GD402", Severity.WARNING,
                f"the checkpoint's bitsandbytes 4-bit compute dtype is bfloat16 but {gpu.label} has no native bf16: "
                "every dequantized matmul runs emulated (slow)",
                file="config.json", key="quantization_config.bnb_4bit_compute_dtype",
                fix=f"after loading, set it on every 4-bit layer: for m in model.modules(): if isinstance(m, "
                    f"bitsandbytes.nn.Linear4bit): m.compute_dtype = torch.{target} (Linear4bit casts its input to "
                    "compute_dtype; a BitsAndBytesConfig or axolotl's bnb_config_kwargs does not change a checkpoint "
                    f"saved quantized); or QLoRA from the unquantized checkpoint with bnb_4bit_compute_dtype={target}",
                details={"compute_dtype": compute, "gpu": gpu.label})


def _bnb_quantization(model: ModelFacts) -> Mapping[str, Any] | None:
    q = model.census.quantization if model.census is not None else None
    if isinstance(q, Mapping):
        return q if q.get("method") == "bitsandbytes" and q.get("bits") == 4 else None
    qc = model.config.data.get("quantization_config") if model.config.ok else None
    if isinstance(qc, Mapping) and qc.get("load_in_4bit"):
        return {"method": "bitsandbytes", "bits": 4, "compute_dtype": qc.get("bnb_4bit_compute_dtype")}
    return None


@emits("GD120", costly=True, model_only=True)
def beyond_horizon(model: ModelFacts, env: Environment, options: CheckOptions) -> Iterator[Finding]:
    """GD120: a library that will run is newer than the newest release the findings were verified on."""
    if not model.family.is_gemma:
        return
    for b in horizon.beyond(env.libraries):
        yield Finding(
            "GD120", Severity.INFO,
            f"{b.describe()} is newer than {b.name} {b.verified}, the newest release gemma-doctor's findings were "
            f"verified on ({horizon.VERIFIED_ON}): a failure it introduced or fixed is not known here, and the "
            f"{b.name} windows still open are assumed to go on",
            key=b.name,
            fix=f'for a verified stack: pip install "{b.name}=={b.verified}"; or a newer gemma-doctor, whose horizon '
                f"may include {b.name} {b.package.version or b.package.specifier or ''}".rstrip(),
            details={"package": b.name, "version": b.package.version, "specifier": b.package.specifier,
                     "verified": b.verified, "verified_on": horizon.VERIFIED_ON})


@emits("GD480", model_only=True)
def unknown_names(model: ModelFacts, env: Environment, options: CheckOptions) -> Iterator[Finding]:
    """GD480: a package in --with or the requirements file that gemma-doctor does not know, most likely misspelt: the
    version meant for the known package is not used, and the run is judged with another one."""
    if not model.family.is_gemma:
        return
    for u in env.libraries.unknown:
        where = "--with" if u.source == "--with" else u.source
        if u.suggestion is not None:
            meant = env.libraries.get(u.suggestion)
            yield Finding(
                "GD480", Severity.ERROR,
                f"{where} {u.text!r}: no package {u.name!r} is known; did you mean {u.suggestion}? The run is judged "
                f"with {meant.describe()} instead",
                key=u.name, fix=f"write {u.suggestion} for {u.name} in {where}",
                details={**u.to_json(), "judged_with": meant.to_json()})
        else:
            yield Finding(
                "GD480", Severity.WARNING,
                f"--with {u.text!r}: no rule reads a version of {u.name!r}, so naming it changes nothing",
                key=u.name, fix="name only the packages the run's findings depend on (docs/usage.md lists them), or "
                                "drop it", details=u.to_json())
