"""The HybridCache crash: use_cache where the text model reads it, generation_config, transformers 4.50.x."""

from __future__ import annotations

import shlex
from typing import Any, Iterator

from gemma_doctor.codes import emits
from gemma_doctor.facts import CheckOptions, Environment, ModelFacts
from gemma_doctor.locate import command_args
from gemma_doctor.report import MODEL_ARGS, Finding, Severity
from gemma_doctor.stack import Exposure, Stack
from gemma_doctor.traits import MISSING as _MISSING, text_use_cache, text_use_cache_key  # noqa: F401
from gemma_doctor.versioning import HYBRIDCACHE, HYBRIDCACHE_FIRST_FIXED

CRASH = "AttributeError: 'HybridCache' object has no attribute 'float'"


def fix_command(model: ModelFacts, stack: Stack | None = None) -> str:
    """The command that fixes this snapshot on disk (planning for the same machine as this run)."""
    return _fix_command(stack).replace(MODEL_ARGS, command_args(model.snapshot))


def _fix_command(stack: Stack | None) -> str:
    """fix_command() as a finding writes it: the model left for the engine to name (report.MODEL_ARGS)."""
    plan = "".join(f" {shlex.quote(a)}" for a in stack.cli_args) if stack is not None else ""
    return f"gemma-doctor fix {MODEL_ARGS}{plan} --inplace"


def _describe(value: Any) -> str:
    if value is _MISSING:
        return "is missing (defaults to true)"
    if value is True:
        return "is true"
    return f"is {value!r}, not a boolean"


@emits("GD002", "GD101", "GD102", "GD103", "GD104", model_only=True)
def check(model: ModelFacts, env: Environment, options: CheckOptions) -> Iterator[Finding]:
    """Findings for the use_cache settings of a model whose text model builds a HybridCache.

    Their severity follows the transformers that will run: 4.50.x crashes (error), a version that cannot
    be known (not installed, not named, or a range) warns, and a release without the bug gets nothing.
    """
    if not model.config.ok or not model.family.builds_hybrid_cache:
        return
    cfg = model.config.data
    fam = model.family
    key = text_use_cache_key(model)
    if fam.nested and "text_config" in cfg and cfg["text_config"] is not None and not isinstance(cfg["text_config"], dict):
        yield Finding("GD002", Severity.ERROR, f"text_config is a {type(cfg['text_config']).__name__}, not an object",
                      file="config.json", key="text_config", fix="repair config.json by hand or download it again")
        return
    value = text_use_cache(cfg, fam.nested)
    stack = env.libraries
    exposure = stack.exposure(HYBRIDCACHE)
    if value is not False and value is not True and value is not _MISSING:
        yield Finding("GD002", Severity.ERROR, f"{key} {_describe(value)}: transformers reads any non-empty value as true",
                      file="config.json", key=key,
                      fix=f"{_fix_command(stack)} (writes false)" if exposure is not Exposure.SAFE else
                      f"write a JSON boolean (true or false) for {key}")
    if exposure is Exposure.SAFE:
        return
    tf = stack.get("transformers")
    if exposure is Exposure.AFFECTED:
        where = f"{tf.describe()} crashes (fixed in transformers {HYBRIDCACHE_FIRST_FIXED})"
        sev, gen_sev = Severity.ERROR, Severity.WARNING
    else:
        where = (f"whether this run crashes depends on the transformers that will run ({tf.describe()}): 4.50.0-4.50.3 "
                 f"crash (name it with --with transformers==VERSION)")
        sev, gen_sev = Severity.WARNING, Severity.INFO
    if value is True or value is _MISSING:
        yield Finding(
            "GD101", sev,
            f"{key} {_describe(value)}: the {fam.text_model_type} text model builds a HybridCache when evaluating, and with "
            f"bf16/fp16 weights under mixed precision {where} with {CRASH}",
            file="config.json", key=key, fix=_fix_command(stack),
            details={"exposure": exposure.value, "transformers": tf.to_json()},
        )
        if fam.nested and cfg.get("use_cache") is False:
            yield Finding("GD104", Severity.INFO,
                          "use_cache is false at the top level, but the text model reads text_config.use_cache, so this does not help",
                          file="config.json", key="use_cache", fix=_fix_command(stack))
    gen = model.generation_config
    if gen.ok:
        gvalue = gen.data.get("use_cache", _MISSING)
        if gvalue is not False:
            yield Finding(
                "GD102", gen_sev,
                f"generation_config.json use_cache {_describe(gvalue)}: generate() during evaluation "
                "(predict_with_generate, TRL sampling) builds a HybridCache anyway",
                file="generation_config.json", key="use_cache", fix=_fix_command(stack),
                details={"exposure": exposure.value},
            )
    if exposure is Exposure.AFFECTED and value is False:
        yield Finding(
            "GD103", Severity.INFO,
            f"{tf.describe()} has the HybridCache crash; it is avoided because {key} is false on disk",
            file=None, key="transformers", fix=f'pip install "transformers>={HYBRIDCACHE_FIRST_FIXED}" (the crash is fixed there)',
        )
