"""Decide the model family from a parsed config.json: model_type / architectures, never the repo name."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

# model_type -> (family, nested text_config?, default text model_type when text_config omits it)
_MODEL_TYPES: dict[str, tuple[str, bool, str]] = {
    "gemma": ("gemma", False, "gemma"),
    "gemma2": ("gemma2", False, "gemma2"),
    "gemma3_text": ("gemma3", False, "gemma3_text"),
    "gemma3": ("gemma3", True, "gemma3_text"),
    "gemma3n_text": ("gemma3n", False, "gemma3n_text"),
    "gemma3n": ("gemma3n", True, "gemma3n_text"),
    # PaliGemma 1 has a Gemma text model, PaliGemma 2 a Gemma 2 one; transformers defaults to "gemma".
    "paligemma": ("paligemma", True, "gemma"),
}

# Architecture class prefixes, longest first, for configs that lack model_type.
_ARCH_PREFIXES: list[tuple[str, str]] = [
    ("Gemma3nForConditionalGeneration", "gemma3n"),
    ("Gemma3n", "gemma3n_text"),
    ("Gemma3ForConditionalGeneration", "gemma3"),
    ("Gemma3", "gemma3_text"),
    ("Gemma2", "gemma2"),
    ("PaliGemma", "paligemma"),
    ("Gemma", "gemma"),
]

# Text models whose forward pass builds a HybridCache in eval mode on transformers 4.50.x
# (facts.md section 1): these are the ones the 'HybridCache has no attribute float' crash hits.
HYBRID_CACHE_TEXT_TYPES = frozenset({"gemma2", "gemma3_text"})


@dataclass(frozen=True)
class FamilyInfo:
    """What the config says the model is, and where its text model reads use_cache."""

    family: str | None
    model_type: str | None
    nested: bool
    text_model_type: str | None

    @property
    def is_gemma(self) -> bool:
        """True for every Gemma-family model."""
        return self.family is not None

    @property
    def builds_hybrid_cache(self) -> bool:
        """True when the text model builds a HybridCache in eval mode (transformers 4.50.x)."""
        return self.text_model_type in HYBRID_CACHE_TEXT_TYPES

    @property
    def label(self) -> str | None:
        """A user-facing family name: gemma, gemma2, gemma3, gemma3n, paligemma, paligemma2."""
        if self.family == "paligemma" and self.text_model_type == "gemma2":
            return "paligemma2"
        return self.family


NOT_GEMMA = FamilyInfo(family=None, model_type=None, nested=False, text_model_type=None)


def detect(config: Mapping[str, Any]) -> FamilyInfo:
    """Classify a parsed config.json; anything unrecognised is NOT_GEMMA (with its model_type)."""
    model_type = config.get("model_type")
    if not isinstance(model_type, str) or model_type not in _MODEL_TYPES:
        arch_type = _from_architectures(config.get("architectures"))
        if arch_type is None:
            mt = model_type if isinstance(model_type, str) else None
            return FamilyInfo(family=None, model_type=mt, nested=False, text_model_type=None)
        model_type = arch_type
    family, nested, default_text = _MODEL_TYPES[model_type]
    text_type = default_text
    if nested:
        text_config = config.get("text_config")
        if isinstance(text_config, Mapping) and isinstance(text_config.get("model_type"), str):
            text_type = text_config["model_type"]
    return FamilyInfo(family=family, model_type=model_type, nested=nested, text_model_type=text_type)


def _from_architectures(architectures: Any) -> str | None:
    if not isinstance(architectures, list):
        return None
    for arch in architectures:
        if not isinstance(arch, str):
            continue
        for prefix, model_type in _ARCH_PREFIXES:
            if arch.startswith(prefix):
                return model_type
    return None
