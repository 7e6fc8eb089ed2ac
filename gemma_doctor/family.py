"""The Gemma family as data: every model_type gemma-doctor knows, where its text config lives, its towers,
its traits, and its minimum transformers. Detection reads config.json's ``model_type``; it never guesses
from a name prefix. A config without ``model_type`` is matched on exact architecture class names only.

Sources per member: docs/families.md (transformers 5.23 source, released wheels bisected for the minimums).
"""

from __future__ import annotations

from collections.abc import Mapping  # isinstance in C (typing.Mapping's checks through Python per call)
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Member:
    """One Gemma-family model_type."""

    model_type: str
    family: str  # the label reports use: gemma, gemma2, gemma3, gemma3n, gemma4, paligemma, t5gemma, ...
    name: str  # human name: "Gemma 3"
    # Where the config the text model reads sits: () = flat (the root), ("text_config",), ("decoder",), ...
    text_path: tuple[str, ...] = ()
    text_type: str | None = None  # model_type of that text config when the file does not say
    towers: tuple[str, ...] = ()  # vision / audio encoders loaded with the model
    # The text model's activations stay inside fp16's range (Gemma 1, PaliGemma 1); False = bf16 or fp32 only.
    fp16_safe: bool = False
    min_transformers: str | None = None  # first release whose registry knows this model_type
    architectures: tuple[str, ...] = ()  # exact class names, for configs without model_type
    # causal-lm | multimodal | encoder-decoder | drafter | classifier | diffusion | embedding | component
    # ("component": a sub-config type such as gemma4_vision, the root of a checkpoint only when saved on its own)
    role: str = "causal-lm"
    # attn_implementation values the model's PreTrainedModel refuses (transformers 5.23.0 source, _supports_* flags)
    unsupported_attention: tuple[str, ...] = ()
    # The root config builds its text config's class itself (T5GemmaConfig: T5GemmaModuleConfig(**decoder)), never
    # through the model_type registry: the text model_type's own first registered release does not limit loading.
    builds_text_config: bool = False


_M = Member
_NO_SDPA = ("sdpa",)  # "sdpa does not support softcapping" (modeling_gemma2/t5gemma/vaultgemma.py, 5.23.0)
_NO_FLASH = ("flash_attention_2", "flash_attention_3", "flex_attention")  # t5gemma2: "Mask creation is incompatible"
_VA = ("vision", "audio")
MEMBERS: tuple[Member, ...] = (
    _M("gemma", "gemma", "Gemma 1", fp16_safe=True, min_transformers="4.38.0", architectures=("GemmaForCausalLM",)),
    _M("gemma2", "gemma2", "Gemma 2", min_transformers="4.42.0", architectures=("Gemma2ForCausalLM",),
       unsupported_attention=_NO_SDPA),
    _M("gemma3_text", "gemma3", "Gemma 3", min_transformers="4.50.0", architectures=("Gemma3ForCausalLM",)),
    _M("gemma3", "gemma3", "Gemma 3", ("text_config",), "gemma3_text", ("vision",), min_transformers="4.50.0",
       architectures=("Gemma3ForConditionalGeneration",), role="multimodal"),
    _M("gemma3n_text", "gemma3n", "Gemma 3n", min_transformers="4.53.0", architectures=("Gemma3nForCausalLM",)),
    _M("gemma3n", "gemma3n", "Gemma 3n", ("text_config",), "gemma3n_text", _VA,
       min_transformers="4.53.0", architectures=("Gemma3nForConditionalGeneration",), role="multimodal"),
    _M("gemma3n_vision", "gemma3n", "Gemma 3n vision tower", min_transformers="4.53.0", role="component"),
    _M("gemma3n_audio", "gemma3n", "Gemma 3n audio tower", min_transformers="4.53.0", role="component"),
    # PaliGemma 1 has a Gemma text model, PaliGemma 2 a Gemma 2 one; transformers defaults text_config to "gemma".
    _M("paligemma", "paligemma", "PaliGemma 1", ("text_config",), "gemma", ("vision",), fp16_safe=True,
       min_transformers="4.41.0", architectures=("PaliGemmaForConditionalGeneration",), role="multimodal"),
    _M("recurrent_gemma", "recurrent_gemma", "RecurrentGemma", min_transformers="4.40.0",
       architectures=("RecurrentGemmaForCausalLM",)),
    _M("shieldgemma2", "shieldgemma2", "ShieldGemma 2", ("text_config",), "gemma3_text", ("vision",),
       min_transformers="4.50.0", architectures=("ShieldGemma2ForImageClassification",), role="classifier"),
    # T5Gemma: encoder-decoder adapted from Gemma 2; get_text_config() is the decoder, which holds use_cache.
    _M("t5gemma", "t5gemma", "T5Gemma", ("decoder",), "t5_gemma_module", min_transformers="4.53.0",
       architectures=("T5GemmaForConditionalGeneration", "T5GemmaEncoderModel", "T5GemmaModel"),
       role="encoder-decoder", unsupported_attention=_NO_SDPA, builds_text_config=True),
    _M("t5_gemma_module", "t5gemma", "T5Gemma encoder/decoder", min_transformers="5.6.0", role="component",
       unsupported_attention=_NO_SDPA),
    # T5Gemma 2: encoder-decoder adapted from Gemma 3, with a vision tower inside the encoder.
    _M("t5gemma2", "t5gemma2", "T5Gemma 2", ("decoder",), "t5gemma2_decoder", ("vision",), min_transformers="5.0.0",
       architectures=("T5Gemma2ForConditionalGeneration", "T5Gemma2Model"), role="encoder-decoder",
       unsupported_attention=_NO_FLASH, builds_text_config=True),
    _M("t5gemma2_encoder", "t5gemma2", "T5Gemma 2 encoder", ("text_config",), "t5gemma2_text", ("vision",),
       min_transformers="5.1.0", role="component", unsupported_attention=_NO_FLASH),
    _M("t5gemma2_decoder", "t5gemma2", "T5Gemma 2 decoder", min_transformers="5.6.0", role="component",
       unsupported_attention=_NO_FLASH),
    _M("t5gemma2_text", "t5gemma2", "T5Gemma 2 text encoder", min_transformers="5.6.0", role="component",
       unsupported_attention=_NO_FLASH),
    _M("vaultgemma", "vaultgemma", "VaultGemma", min_transformers="4.57.1", architectures=("VaultGemmaForCausalLM",),
       unsupported_attention=_NO_SDPA),
    _M("gemma4_text", "gemma4", "Gemma 4", min_transformers="5.5.0", architectures=("Gemma4ForCausalLM",)),
    _M("gemma4", "gemma4", "Gemma 4", ("text_config",), "gemma4_text", _VA, min_transformers="5.5.0",
       architectures=("Gemma4ForConditionalGeneration",), role="multimodal"),
    _M("gemma4_vision", "gemma4", "Gemma 4 vision tower", min_transformers="5.5.0", role="component"),
    # Gemma4AudioModel: "The chunked local attention is only implemented in eager" (5.23.0).
    _M("gemma4_audio", "gemma4", "Gemma 4 audio tower", min_transformers="5.5.0", role="component",
       unsupported_attention=("sdpa",) + _NO_FLASH),
    # Speculative-decoding drafters (E-series assistants): Gemma 4 text models that share KV.
    _M("gemma4_assistant", "gemma4", "Gemma 4 assistant", ("text_config",), "gemma4_text", min_transformers="5.8.0",
       architectures=("Gemma4AssistantForCausalLM",), role="drafter"),
    # gemma-4-12B: one model for text, vision and audio ("unified").
    _M("gemma4_unified", "gemma4", "Gemma 4 unified", ("text_config",), "gemma4_unified_text", _VA,
       min_transformers="5.10.1", architectures=("Gemma4UnifiedForConditionalGeneration",), role="multimodal"),
    _M("gemma4_unified_text", "gemma4", "Gemma 4 unified", min_transformers="5.10.1",
       architectures=("Gemma4UnifiedForCausalLM",)),
    _M("gemma4_unified_vision", "gemma4", "Gemma 4 unified vision tower", min_transformers="5.10.1", role="component"),
    _M("gemma4_unified_audio", "gemma4", "Gemma 4 unified audio tower", min_transformers="5.10.1", role="component"),
    _M("gemma4_unified_assistant", "gemma4", "Gemma 4 unified assistant", ("text_config",), "gemma4_unified_text",
       min_transformers="5.10.1", architectures=("Gemma4UnifiedAssistantForCausalLM",), role="drafter"),
    _M("embedding_gemma2", "embedding_gemma2", "EmbeddingGemma 2", ("text_config",), "embedding_gemma2_text", _VA,
       min_transformers="5.19.0", architectures=("EmbeddingGemma2Model",), role="embedding"),
    _M("embedding_gemma2_text", "embedding_gemma2", "EmbeddingGemma 2", min_transformers="5.19.0",
       architectures=("EmbeddingGemma2TextModel",), role="embedding"),
    _M("diffusion_gemma", "diffusion_gemma", "DiffusionGemma", ("text_config",), "diffusion_gemma_text", ("vision",),
       min_transformers="5.11.0", architectures=("DiffusionGemmaForBlockDiffusion",), role="diffusion"),
    _M("diffusion_gemma_text", "diffusion_gemma", "DiffusionGemma", min_transformers="5.11.0", role="component"),
)

# A LoRA target naming Gemma 4's language model only (its towers' projections are Gemma4ClippableLinear, which PEFT
# refuses, and adapters there are unused by text-only training); PEFT >= 0.19's own gemma4 default has this shape.
LANGUAGE_MODEL_REGEX = r".*language_model.*\.(q_proj|k_proj|v_proj|o_proj|gate_proj|up_proj|down_proj)"

_BY_TYPE: dict[str, Member] = {m.model_type: m for m in MEMBERS}
_BY_ARCH: dict[str, Member] = {a: m for m in MEMBERS for a in m.architectures}
# Text model types whose forward pass builds a HybridCache in eval mode on transformers 4.50.x
# (facts.md section 1): these are the ones the 'HybridCache has no attribute float' crash hits.
HYBRID_CACHE_TEXT_TYPES = frozenset({"gemma2", "gemma3_text"})


# Family labels for --family and reports; PaliGemma 2 is PaliGemma with a Gemma 2 text model.
# The first member of a family names it (gemma4 -> "Gemma 4", not its assistant or a tower).
FAMILY_NAMES: dict[str, str] = {**{m.family: m.name for m in reversed(MEMBERS)}, "paligemma2": "PaliGemma 2"}
# The model_type whose defaults a --family plan assumes (a flat text model where the family has one).
FAMILY_TEXT_TYPE: dict[str, str] = {**{m.family: (m.text_type or m.model_type) for m in reversed(MEMBERS)},
                                    "paligemma": "gemma", "paligemma2": "gemma2"}
# Spellings --family accepts besides the labels and model types themselves.
_ALIASES = {"gemma1": "gemma", "codegemma": "gemma", "embeddinggemma": "gemma3", "paligemma1": "paligemma",
            "recurrentgemma": "recurrent_gemma", "shieldgemma": "shieldgemma2", "embeddinggemma2": "embedding_gemma2",
            "diffusiongemma": "diffusion_gemma"}

# --family spellings that name one model, not a family a plan can assume: EmbeddingGemma is gemma3_text with
# bidirectional attention (facts.md), detected as Gemma 3 once downloaded, but its one checkpoint is a 300M
# embedding model trained for embeddings, not a Gemma 3 causal LM: a --family plan would plan another model.
NOT_PLANNED: Mapping[str, str] = {
    "embeddinggemma": "EmbeddingGemma (google/embeddinggemma-300m) is an embedding model (Gemma 3 text with "
                      "bidirectional attention); recommend --family plans causal-LM fine-tuning of a published Gemma "
                      "and cannot plan it: check a downloaded copy instead (gemma-doctor check google/embeddinggemma-300m)",
}


def not_planned(text: str) -> str | None:
    """Why --family ``text`` cannot be planned without a download (EmbeddingGemma), or None."""
    return NOT_PLANNED.get("".join(ch for ch in text.lower() if ch.isalnum()))


def family_from_name(text: str) -> str | None:
    """A --family spelling (``Gemma-3``, ``gemma3_text``, ``EmbeddingGemma``) -> family label, or None."""
    key = "".join(ch for ch in text.lower() if ch.isalnum())
    for label in FAMILY_NAMES:
        if key == label.replace("_", ""):
            return label
    for m in MEMBERS:
        if key == m.model_type.replace("_", ""):
            return m.family
    return _ALIASES.get(key)


def fp16_unsafe_family(label: str | None) -> bool:
    """For a family label (a --family plan): True unless its text model fits fp16 (Gemma 1, PaliGemma 1)."""
    text = member(FAMILY_TEXT_TYPE.get(label or ""))
    return not (text is not None and text.fp16_safe)


def member(model_type: str | None) -> Member | None:
    """The registry entry of ``model_type``, or None."""
    return _BY_TYPE.get(model_type or "")


def known_model_types() -> tuple[str, ...]:
    """Every model_type gemma-doctor classifies."""
    return tuple(_BY_TYPE)


@dataclass(frozen=True)
class FamilyInfo:
    """What the config says the model is, and where its text model reads its settings."""

    family: str | None
    model_type: str | None
    nested: bool
    text_model_type: str | None
    text_path: tuple[str, ...] = ()
    # Traits read from the config's values (not from the type): MoE, KV sharing, per-layer embeddings...
    traits: tuple[tuple[str, Any], ...] = ()

    @property
    def member(self) -> Member | None:
        """The registry entry (None for models that are not Gemma-family)."""
        return member(self.model_type)

    @property
    def is_gemma(self) -> bool:
        """True for every Gemma-family model."""
        return self.family is not None

    @property
    def unknown_gemma(self) -> bool:
        """True when model_type names a Gemma (it contains "gemma") that gemma-doctor does not classify."""
        return self.family is None and "gemma" in (self.model_type or "").lower()

    @property
    def builds_hybrid_cache(self) -> bool:
        """True when the text model builds a HybridCache in eval mode (transformers 4.50.x)."""
        return self.text_model_type in HYBRID_CACHE_TEXT_TYPES

    @property
    def fp16_unsafe(self) -> bool:
        """True when the text model's activations exceed fp16's range (every member but Gemma 1 / PaliGemma 1)."""
        if not self.is_gemma:
            return False
        text = member(self.text_model_type)
        return not (text.fp16_safe if text is not None else self.member is not None and self.member.fp16_safe)

    @property
    def label(self) -> str | None:
        """A user-facing family name: gemma, gemma2, gemma3, gemma3n, gemma4, paligemma, paligemma2, ..."""
        if self.family == "paligemma" and self.text_model_type == "gemma2":
            return "paligemma2"
        return self.family

    @property
    def display_name(self) -> str:
        """"Gemma 3", "PaliGemma 2"; "this model" when unknown."""
        if self.label == "paligemma2":
            return "PaliGemma 2"
        m = self.member
        return m.name if m is not None else "this model"

    def trait(self, name: str) -> Any:
        """A trait read from the config (None when absent)."""
        return dict(self.traits).get(name)


NOT_GEMMA = FamilyInfo(family=None, model_type=None, nested=False, text_model_type=None)


def _at(config: Mapping[str, Any], path: tuple[str, ...]) -> Mapping[str, Any] | None:
    node: Any = config
    for key in path:
        if not isinstance(node, Mapping):
            return None
        node = node.get(key)
    return node if isinstance(node, Mapping) else None


def detect(config: Mapping[str, Any]) -> FamilyInfo:
    """Classify a parsed config.json by model_type; anything unrecognised is not Gemma (with its model_type)."""
    model_type = config.get("model_type")
    m = member(model_type) if isinstance(model_type, str) else None
    if m is None and not isinstance(model_type, str):
        m = _from_architectures(config.get("architectures"))
    if m is None:
        return FamilyInfo(family=None, model_type=model_type if isinstance(model_type, str) else None, nested=False,
                          text_model_type=None)
    text_type = m.text_type or m.model_type
    text = _at(config, m.text_path) if m.text_path else config
    if m.text_path and isinstance(text, Mapping) and isinstance(text.get("model_type"), str):
        text_type = text["model_type"]
    return FamilyInfo(family=m.family, model_type=m.model_type, nested=bool(m.text_path), text_model_type=text_type,
                      text_path=m.text_path, traits=_traits(text if isinstance(text, Mapping) else {}))


def _from_architectures(architectures: Any) -> Member | None:
    """Exact class names only (a config saved without model_type); never a prefix match."""
    if not isinstance(architectures, list):
        return None
    for arch in architectures:
        if isinstance(arch, str) and arch in _BY_ARCH:
            return _BY_ARCH[arch]
    return None


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _traits(text: Mapping[str, Any]) -> tuple[tuple[str, Any], ...]:
    """Architecture traits from the text config's values."""
    out: dict[str, Any] = {}
    bidirectional = text.get("use_bidirectional_attention")
    if bidirectional is True or isinstance(bidirectional, str):
        out["bidirectional"] = bidirectional  # True (EmbeddingGemma) or "vision" (Gemma 4 31B / 26B-A4B)
    if text.get("attention_k_eq_v") is True:
        out["attention_k_eq_v"] = True  # full-attention layers have no v_proj
    if text.get("enable_moe_block") is True or (_int(text.get("num_experts")) or 0) > 1:
        out["moe_experts"] = _int(text.get("num_experts"))
    shared = _int(text.get("num_kv_shared_layers"))
    if shared:
        out["kv_shared_layers"] = shared
    if _int(text.get("hidden_size_per_layer_input")) and _int(text.get("vocab_size_per_layer_input")):
        out["per_layer_embeddings"] = True
    heads = [_int(text.get("head_dim")), _int(text.get("global_head_dim"))]
    per_layer = text.get("per_layer_config")
    if isinstance(per_layer, Mapping):
        per_layer = list(per_layer.values())
    if isinstance(per_layer, list):
        heads += [_int(e.get("head_dim")) for e in per_layer if isinstance(e, Mapping)]
    widest = max((h for h in heads if h), default=None)
    if widest:
        out["max_head_dim"] = widest
    if isinstance(text.get("attn_logit_softcapping"), (int, float)) and not isinstance(text.get("attn_logit_softcapping"), bool):
        out["attn_logit_softcapping"] = text["attn_logit_softcapping"]
    return tuple(sorted(out.items()))


# The checkpoints Google publishes on the Hub for each (family, --size) gemma-doctor plans without a download
# (plan/memory.py's published shapes), as the Hub spells them: Gemma 1 is named without -it, Gemma 4 with capitals
# (google/gemma-4-E4B-it, google/gemma-4-26B-A4B-it). Never built from the family's name: a plan's snippets load it.
# Gemma 3n and PaliGemma have no published config here (plan/memory.py): their sizes are known, their shapes are not.
PUBLISHED_IDS: Mapping[tuple[str, str], str] = {
    ("gemma", "2b"): "google/gemma-2b", ("gemma", "7b"): "google/gemma-7b",
    ("gemma2", "2b"): "google/gemma-2-2b-it", ("gemma2", "9b"): "google/gemma-2-9b-it",
    ("gemma2", "27b"): "google/gemma-2-27b-it",
    ("gemma3", "270m"): "google/gemma-3-270m-it", ("gemma3", "1b"): "google/gemma-3-1b-it",
    ("gemma3", "4b"): "google/gemma-3-4b-it", ("gemma3", "12b"): "google/gemma-3-12b-it",
    ("gemma3", "27b"): "google/gemma-3-27b-it",
    ("gemma3n", "e2b"): "google/gemma-3n-E2B-it", ("gemma3n", "e4b"): "google/gemma-3n-E4B-it",
    ("gemma4", "e2b"): "google/gemma-4-E2B-it", ("gemma4", "e4b"): "google/gemma-4-E4B-it",
    ("gemma4", "31b"): "google/gemma-4-31B-it", ("gemma4", "26b-a4b"): "google/gemma-4-26B-A4B-it",
    # PaliGemma: the 224-pixel pretrained checkpoint of each size (also -448/-896 and -mix- on the Hub)
    ("paligemma", "3b"): "google/paligemma-3b-pt-224",
    ("paligemma2", "3b"): "google/paligemma2-3b-pt-224", ("paligemma2", "10b"): "google/paligemma2-10b-pt-224",
    ("paligemma2", "28b"): "google/paligemma2-28b-pt-224",
}


def published_sizes(family: str) -> tuple[str, ...]:
    """The sizes Google publishes of ``family`` that gemma-doctor knows the checkpoint of (PUBLISHED_IDS)."""
    return tuple(s for f, s in PUBLISHED_IDS if f == family)


def published_id(family: str, size: str) -> str | None:
    """The Hub repo id of ``family`` at ``size`` (as --size spells it, any case), or None when not in the table."""
    return PUBLISHED_IDS.get((family, size.lower()))

