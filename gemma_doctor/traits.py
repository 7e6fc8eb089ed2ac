"""Model traits that several layers read: where the text config lives, whether the head is tied, K/V sharing, the key
use_cache is read from, the class a config builds, and the logits alive at the loss. Pure; below the rules, the plan
and fixes, so that none of them has to import another for these (docs/architecture.md, "Layers")."""

from __future__ import annotations

from collections.abc import Mapping  # isinstance in C (typing.Mapping's checks through Python per call)
from typing import TYPE_CHECKING, Any

from gemma_doctor import family as family_mod
from gemma_doctor.readers.adapter import head_pair
from gemma_doctor.stack import Exposure, Stack
from gemma_doctor.versioning import GEMMA4_KV_SHARE_NO_CACHE

if TYPE_CHECKING:  # annotations only: the plan imports this module and needs none of the facts' readers
    from gemma_doctor.facts import ModelFacts

# A key that is absent (the library's default applies): distinct from every JSON value, None included.
MISSING = object()
# Preference tasks that score a chosen and a rejected sequence: the batch the loss sees is doubled.
PAIRED_TASKS = frozenset({"dpo", "orpo", "cpo", "simpo", "ipo"})


def text_config(model: ModelFacts) -> Mapping[str, Any]:
    """The mapping the text model reads its settings from (text_config for multimodal checkpoints)."""
    if not model.config.ok:
        return {}
    node: Any = model.config.data
    for key in model.family.text_path:
        node = node.get(key) if isinstance(node, Mapping) else None
    return node if isinstance(node, Mapping) else {}


def text_key(model: ModelFacts, key: str) -> str:
    """``text_config.key`` for a nested config, ``key`` otherwise."""
    return ".".join((*model.family.text_path, key))


def decoder_config(config: Mapping[str, Any]) -> Mapping[str, Any]:
    """The part of a config.json that describes the text decoder (text_config, decoder, else the whole), by shape
    rather than by family: the memory plan reads any config this way."""
    for key in ("text_config", "decoder"):
        sub = config.get(key)
        if isinstance(sub, Mapping):
            return sub
    return config


def positive_int(value: Any) -> int | None:
    """``value`` when it is a positive int (not a bool), else None."""
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def positive_number(value: Any) -> float | None:
    """``value`` as a float when it is a positive number (not a bool), else None."""
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0 else None


# --- the tied head ---------------------------------------------------------------------------------------------

def ties_embeddings(config: Mapping[str, Any], text: Mapping[str, Any], text_prefix: str) -> tuple[bool, str | None]:
    """Whether transformers will tie lm_head to embed_tokens at load, and the key that says so (None: the default,
    which is true for every Gemma config class).

    A multimodal config ties when either level does: for Gemma3ForConditionalGeneration transformers 4.x reads
    text_config's flag (get_text_config(decoder=True), modeling_utils.py:2994 in 4.57.6) and 5.x the top level's
    (get_expanded_tied_weights_keys, modeling_utils.py:2483 in 5.23.0); measured: each release ties the pair with the
    other level alone set false (tests/test_after_training.py, docs/after-training.md).
    """
    unset = False
    for scope, prefix in ((text, text_prefix), (config, "")):
        value = scope.get("tie_word_embeddings") if isinstance(scope, Mapping) else None
        if value is True:
            return True, prefix + "tie_word_embeddings"
        unset |= value is not False
    if unset:
        return True, None
    return False, (text_prefix if text is not config else "") + "tie_word_embeddings"


def config_ties(model: ModelFacts) -> tuple[bool, str | None]:
    """ties_embeddings() of the model's own config.json."""
    prefix = text_key(model, "") if model.family.text_path else ""
    return ties_embeddings(model.config.data if model.config.ok else {}, text_config(model), prefix)


def head_saved_apart(model: ModelFacts) -> tuple[str, str, str | None] | None:
    """(head, embedding, the key that ties them or None for the default) when the safetensors save lm_head.weight
    beside embed_tokens.weight while config.json ties them: GD750's condition, and what `fix` unties."""
    census = model.census
    if census is None:
        return None
    head, embed = head_pair(census.headers)
    if head is None or embed is None:
        return None
    tied, key = config_ties(model)
    return (head[1].name, embed[1].name, key) if tied else None


# --- K/V sharing and use_cache ---------------------------------------------------------------------------------

def kv_shared_layers(info: family_mod.FamilyInfo) -> int:
    """How many layers reuse another layer's K/V (Gemma 4 E2B/E4B and the assistants); 0 when none."""
    shared = info.trait("kv_shared_layers")
    return shared if isinstance(shared, int) and not isinstance(shared, bool) and shared > 0 else 0


def use_cache_off_breaks(info: family_mod.FamilyInfo, stack: Stack) -> Exposure:
    """Whether writing or setting use_cache=False breaks this model with ``stack``'s transformers (KV sharing)."""
    if not kv_shared_layers(info):
        return Exposure.SAFE
    return stack.exposure(GEMMA4_KV_SHARE_NO_CACHE)


def text_use_cache_key(model: ModelFacts) -> str:
    """The JSON path the text model reads use_cache from: text_config.use_cache or use_cache."""
    return "text_config.use_cache" if model.family.nested else "use_cache"


def text_use_cache(config: dict[str, Any], nested: bool) -> Any:
    """The raw value the text model reads (``MISSING`` when the key is absent, i.e. true)."""
    if nested:
        sub = config.get("text_config")
        if not isinstance(sub, dict):
            return MISSING
        return sub.get("use_cache", MISSING)
    return config.get("use_cache", MISSING)


# --- the class a config builds ---------------------------------------------------------------------------------

# The architecture vLLM builds when config.json names none (each model_type's class in transformers).
BY_TYPE = {"gemma4": "Gemma4ForConditionalGeneration", "gemma4_text": "Gemma4ForCausalLM",
           "gemma3n": "Gemma3nForConditionalGeneration", "gemma3n_text": "Gemma3nForCausalLM"}


def architecture(config: Mapping[str, Any] | None, model_type: str | None) -> str | None:
    """The class vLLM builds for a config: its first `architectures` entry, else the model_type's class."""
    archs = config.get("architectures") if isinstance(config, Mapping) else None
    if isinstance(archs, list) and archs and isinstance(archs[0], str):
        return archs[0]
    return BY_TYPE.get(model_type or "")


def language_model_keys(model: ModelFacts) -> list[str]:
    """Weight keys under a ``language_model`` module (either transformers layout) in a model folder."""
    census = model.census
    if census is None:
        return []
    return [t.name for h in census.headers for t in h.tensors
            if t.name.startswith(("language_model.", "model.language_model."))]


# --- the logits at the loss ------------------------------------------------------------------------------------

def logits_bytes_per_logit(final_logit_softcapping: float | None, precision: str) -> float:
    """Bytes alive per logit at the loss: the loss upcasts b*s*V logits to fp32 (facts.md section 7).

    At its peak (the log-softmax backward) the fp32 log-probabilities, their gradient and the incoming gradient
    are alive: 12 bytes per logit in fp32 and under autocast; Gemma 2's final soft-capping keeps its tanh output.
    """
    per = 12.0
    if final_logit_softcapping:
        per += 4 if precision == "fp32" else 2
    return per
