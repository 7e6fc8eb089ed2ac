"""The HybridCache crash: use_cache where the text model reads it, generation_config, transformers 4.50.x."""

from __future__ import annotations

from typing import Any, Iterator

from gemma_doctor.facts import CheckOptions, Environment, ModelFacts
from gemma_doctor.locate import command_args
from gemma_doctor.report import Finding, Severity
from gemma_doctor.versioning import HYBRIDCACHE_FIRST_FIXED, transformers_has_hybridcache_bug

CRASH = "AttributeError: 'HybridCache' object has no attribute 'float'"
_MISSING = object()


def fix_command(model: ModelFacts) -> str:
    """The command that fixes this snapshot on disk."""
    return f"gemma-doctor fix {command_args(model.snapshot)} --inplace"


def text_use_cache_key(model: ModelFacts) -> str:
    """The JSON path the text model reads use_cache from: text_config.use_cache or use_cache."""
    return "text_config.use_cache" if model.family.nested else "use_cache"


def text_use_cache(config: dict[str, Any], nested: bool) -> Any:
    """The raw value the text model reads (``_MISSING`` when the key is absent, i.e. true)."""
    if nested:
        text_config = config.get("text_config")
        if not isinstance(text_config, dict):
            return _MISSING
        return text_config.get("use_cache", _MISSING)
    return config.get("use_cache", _MISSING)


def _describe(value: Any) -> str:
    if value is _MISSING:
        return "is missing (defaults to true)"
    if value is True:
        return "is true"
    return f"is {value!r}, not a boolean"


def check(model: ModelFacts, env: Environment, options: CheckOptions) -> Iterator[Finding]:
    """Findings for the use_cache settings of a model whose text model builds a HybridCache."""
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
    if value is not False and value is not True and value is not _MISSING:
        yield Finding("GD002", Severity.ERROR, f"{key} {_describe(value)}: transformers reads any non-empty value as true",
                      file="config.json", key=key, fix=f"{fix_command(model)} (writes false)")
    elif value is not False:
        yield Finding(
            "GD101", Severity.ERROR,
            f"{key} {_describe(value)}: the {fam.text_model_type} text model builds a HybridCache when evaluating, and with "
            f"bf16/fp16 weights under mixed precision transformers 4.50.x crashes with {CRASH}",
            file="config.json", key=key, fix=fix_command(model),
        )
        if fam.nested and cfg.get("use_cache") is False:
            yield Finding("GD104", Severity.INFO,
                          "use_cache is false at the top level, but the text model reads text_config.use_cache, so this does not help",
                          file="config.json", key="use_cache", fix=fix_command(model))
    gen = model.generation_config
    if gen.ok:
        gvalue = gen.data.get("use_cache", _MISSING)
        if gvalue is not False:
            yield Finding(
                "GD102", Severity.WARNING,
                f"generation_config.json use_cache {_describe(gvalue)}: generate() during evaluation "
                "(predict_with_generate, TRL sampling) builds a HybridCache anyway",
                file="generation_config.json", key="use_cache", fix=fix_command(model),
            )
    tver = env.versions.get("transformers")
    if transformers_has_hybridcache_bug(tver):
        disabled = value is False
        yield Finding(
            "GD103", Severity.INFO if disabled else Severity.ERROR,
            (f"transformers {tver} is installed; its HybridCache crash is avoided because {key} is false on disk"
             if disabled else
             f"transformers {tver} is installed: bf16/fp16 evaluation of this model crashes with {CRASH} "
             f"(fixed in {HYBRIDCACHE_FIRST_FIXED})"),
            file=None, key="transformers",
            fix=f'pip install "transformers>={HYBRIDCACHE_FIRST_FIXED}"' + ("" if disabled else f", or {fix_command(model)}"),
        )
