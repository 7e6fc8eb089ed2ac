"""The memory plan of one fine-tuning run: model shape + method + precision + optimizer + batch -> bytes per GPU.

Pure: plain values in, a frozen MemoryPlan out; no torch, no files. The model and its limits are explained in
docs/memory.md; every constant below was read from the library that allocates the memory (transformers, PEFT,
bitsandbytes, torch) and checked against measured peaks (benchmarks/memory.py, docs/benchmarks.md).

The peak is the largest of three moments of a training step (after the first, which creates the optimizer states):

- **loss**: weights + optimizer states + every activation saved for backward + the logits and their fp32 copies
  (Gemma's loss upcasts b*s*V logits to fp32) + the bf16 weight copies autocast saved;
- **embedding backward**: weights + optimizer states + every gradient + the tied embedding's gradient arriving a
  second time (from the input embedding after the lm_head) and its sum;
- **optimizer step**: weights + optimizer states + every gradient + the optimizer's temporaries;
- **evaluation** (only where the training config writes an evaluation batch): what stays between steps + one eval
  batch's logits at its loss + the predictions transformers' evaluation loop keeps on the GPU (docs/memory.md).
- **generation** (GRPO: run.Generation): what stays between steps + the key/value cache of the rows one generate()
  call holds + its prefill and sampling; a colocated vLLM engine's share of the GPU (docs/memory.md, "GRPO's
  generation").

What the engine offloads (DeepSpeed offload_optimizer / offload_param, FSDP offload_params) is not on the GPU, and under
DeepSpeed in bf16/fp16 the parameters are 16-bit with ZeRO's fp32 copies beside them (docs/memory.md, "Offload").

The components reported are those of the peak moment, so they add up to the total. Sharded (ZeRO-2/3, FSDP), each rank
also holds the root unit (the tied embedding / lm_head) gathered whole and its gradient whole until its reduce-scatter
(docs/memory.md, "Sharded runs").
"""

from __future__ import annotations

import functools
import math
import re
from dataclasses import dataclass, field, replace
from typing import Any, Iterable, Mapping

from gemma_doctor import frozen
# The run's settings, the plan's one input (run.Settings), and their defaults, which the plan's callers name here too.
from gemma_doctor.run import (DEFAULT_BATCH, DEFAULT_LORA_R, DEFAULT_LORA_TARGETS, DEFAULT_OPTIMIZER,  # noqa: F401
                              DEFAULT_SEQ_LEN, Settings)
from gemma_doctor.traits import PAIRED_TASKS, logits_bytes_per_logit
from gemma_doctor.traits import decoder_config as _text_config, positive_int as _int, positive_number as _num
from gemma_doctor.units import GIB, gib  # noqa: F401 (memory.GIB: the plan's callers name it here)

DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}
METHODS = ("full", "lora", "qlora")
# A run fits when its peak leaves this share of the GPU free (allocator fragmentation, spikes the model misses).
FITS_BELOW = 0.90
# CUDA context, cuBLAS workspaces and kernels loaded by torch: outside torch.cuda.max_memory_allocated(), inside
# what the GPU has to give. Not measured here (no GPU lent): from torch's documentation and common reports.
CUDA_CONTEXT_BYTES = 768 * 1024**2
# The caching allocator holds more than the live tensors (max_memory_reserved vs allocated).
CUDA_ALLOCATOR_SLACK = 0.05
# bitsandbytes NF4 with double quantization: 4 bits per weight + an 8-bit absmax per 64 weights + an fp32 absmax
# per 256 of those; 8-bit LLM.int8: 1 byte per weight + an fp32 scale per output row (ignored: < 0.1%).
NF4_BYTES = 0.5 + 1 / 64 + 4 / (64 * 256)
# Quantizers whose models PEFT's prepare_model_for_kbit_training does not upcast to fp32 (PEFT 0.21.2, utils/other.py).
KBIT_NOT_UPCAST = frozenset({"gptq", "aqlm", "eetq", "torchao", "hqq"})
INT8_BYTES = 1.0
REFERENCE_TASKS = frozenset({"dpo", "kto"})  # full fine-tuning loads a frozen reference copy of the model


# --- the model -----------------------------------------------------------------------------------

@dataclass(frozen=True)
class Linear:
    """A kind of Linear layer: its module name, in and out features, how many the model has."""

    name: str
    in_features: int
    out_features: int
    count: int
    # The full module name of each such layer (the checkpoint's tensor names, else the loaded model's layout derived
    # from config.json): what PEFT matches a regex or a suffix against. Empty: matched by ``name`` alone.
    names: tuple[str, ...] = ()
    # The layout derived from config.json instead of the names it makes: (prefix, part, first layer), the modules
    # f"{prefix}.{j}.{part}.{name}" of layers first to first + count - 1 (_named). They are spelt out only where a
    # target that is not "all-linear" is matched against them (module_names), not for every model a scan plans.
    layout: tuple[str, str, int] | None = None

    def module_names(self) -> tuple[str, ...]:
        """The full module name of each such layer (``names``, or those ``layout`` makes); ``name`` alone when
        neither is known."""
        if self.names:
            return self.names
        if self.layout is not None:
            prefix, part, first = self.layout
            return tuple(f"{prefix}.{j}.{part}.{self.name}" for j in range(first, first + self.count))
        return (self.name,) * self.count

    @property
    def params(self) -> int:
        """Weights of every such layer."""
        return self.in_features * self.out_features * self.count

    def matched(self, targets: str | tuple[str, ...]) -> int:
        """How many of these layers PEFT wraps for ``targets``: "all-linear" every one; a string, a regex that must
        match the whole module name (peft.tuners.tuners_utils.check_target_module_exists); a list, a name or a
        dotted suffix of the module name."""
        if targets == "all-linear":
            return self.count
        names = self.module_names()
        if isinstance(targets, str):
            pattern = _regex(targets)
            if isinstance(pattern, str):
                return 0  # no regex PEFT runs (or one that may never finish): GD425 says so, the plan counts nothing
            return sum(1 for n in names if pattern.fullmatch(n))
        wanted = tuple(t.strip() for t in targets)
        return sum(1 for n in names if any(n == t or n.endswith("." + t) for t in wanted))


@dataclass(frozen=True)
class ParamCounts:
    """Parameters by the part of the model they belong to (what memory treats differently)."""

    embed: int = 0  # token embeddings (tied to the lm_head in every Gemma)
    per_layer_embed: int = 0  # Gemma 3n / 4 per-layer embedding tables
    lm_head: int = 0  # an untied output layer (0 when tied)
    linear: int = 0  # the text decoder's Linear weights: LoRA targets, quantized by QLoRA
    experts: int = 0  # MoE expert weights (3-D parameters: neither LoRA targets nor quantized by bitsandbytes)
    towers: int = 0  # vision / audio encoders and projectors
    tower_linear: int = 0  # the towers' Linear weights (quantized by QLoRA, "all-linear" LoRA targets)
    other: int = 0  # norms, biases, scalars

    @property
    def text(self) -> int:
        """Parameters of the language model (what text-only training updates)."""
        return self.embed + self.per_layer_embed + self.lm_head + self.linear + self.experts + self.other

    @property
    def total(self) -> int:
        """Every parameter."""
        return self.text + self.towers


@dataclass(frozen=True)
class ModelShape:
    """What the plan needs about a model: the text decoder's dimensions and parameter counts by part."""

    hidden: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int
    params: ParamCounts
    linears: tuple[Linear, ...] = ()
    tower_linears: tuple[Linear, ...] = ()
    final_logit_softcapping: float | None = None
    attn_logit_softcapping: float | None = None
    tied_embeddings: bool = True
    source: str = "config.json"  # "safetensors headers" when the counts are exact
    model_type: str | None = None
    # The checkpoint is saved quantized (its quantization_config): (method, bits, group size), e.g. ("awq", 4, 128).
    # Its weights train only through adapters, and they take the bytes of that quantization, not of a load dtype.
    saved_quantization: tuple[str, int, int] | None = None
    # The layers that keep keys and values when the model generates (a GRPO step's completions): (key/value heads,
    # head dim, sliding window or 0 for a layer that attends to every token), one per layer that owns a cache
    # (kv_layers_of).
    kv_layers: tuple[tuple[int, int, int], ...] = ()

    def to_json(self) -> dict[str, Any]:
        """The `model` block of a memory plan."""
        return {"source": self.source, "model_type": self.model_type, "hidden_size": self.hidden,
                "num_hidden_layers": self.layers, "num_attention_heads": self.heads,
                "num_key_value_heads": self.kv_heads, "head_dim": self.head_dim,
                "intermediate_size": self.intermediate, "vocab_size": self.vocab,
                "params": {"total": self.params.total, "text": self.params.text, "embed": self.params.embed,
                           "per_layer_embed": self.params.per_layer_embed, "lm_head": self.params.lm_head,
                           "linear": self.params.linear, "experts": self.params.experts,
                           "towers": self.params.towers, "other": self.params.other}}


_TOWER_WORDS = ("vision_tower", "vision_model", "audio_tower", "audio_model", "multi_modal_projector", "embed_vision",
                "embed_audio", "vision_embed", "audio_embed", "mm_input_projection", "mm_soft_emb_norm")
_EMBED_RE = re.compile(r"(^|\.)embed_tokens\.weight$")
_PER_LAYER_RE = re.compile(r"embed_tokens_per_layer\.weight$")


@functools.lru_cache(maxsize=64)
def _regex(pattern: str) -> re.Pattern[str] | str:
    from gemma_doctor.run import target_regex

    return target_regex(pattern)


def counts_from_names(shapes: Mapping[str, Iterable[int] | int]) -> tuple[ParamCounts, tuple[Linear, ...], tuple[Linear, ...], bool]:
    """(counts, text Linear kinds, tower Linear kinds, tied) from tensor names -> shapes (or numels) of a checkpoint."""
    embed = per_layer = head = linear = experts = towers = tower_linear = other = 0
    kinds: dict[tuple[str, int, int], list[str]] = {}
    tower_kinds: dict[tuple[str, int, int], list[str]] = {}
    for name, shape in shapes.items():
        dims = (shape,) if isinstance(shape, int) else tuple(shape)
        n = math.prod(dims) if not isinstance(shape, int) else shape
        in_tower = any(w in name for w in _TOWER_WORDS)
        module = name.rsplit(".", 2)[-2] if name.count(".") >= 1 else name
        is_linear_weight = len(dims) == 2 and name.endswith(".weight") and "embed" not in name and "norm" not in module
        if in_tower:
            towers += n
            if is_linear_weight:
                tower_linear += n
                tower_kinds.setdefault((module, dims[1], dims[0]), []).append(name[:-len(".weight")])
        elif _PER_LAYER_RE.search(name):
            per_layer += n
        elif _EMBED_RE.search(name):
            embed += n
        elif name.endswith("lm_head.weight"):
            head += n
        elif len(dims) == 3 and "expert" in name:
            experts += n
        elif is_linear_weight and ".layers." in name:
            linear += n
            kinds.setdefault((module, dims[1], dims[0]), []).append(name[:-len(".weight")])
        else:
            other += n
    counts = ParamCounts(embed, per_layer, head, linear, experts, towers, tower_linear, other)
    mk = lambda d: tuple(Linear(k[0], k[1], k[2], len(v), tuple(sorted(v))) for k, v in sorted(d.items()))  # noqa: E731
    return counts, mk(kinds), mk(tower_kinds), head == 0


def _siglip_params(vision: Mapping[str, Any]) -> tuple[int, tuple[Linear, ...]]:
    """Parameters of a SigLIP vision tower (Gemma 3, PaliGemma) from its config."""
    h = _int(vision.get("hidden_size")) or 1152
    i = _int(vision.get("intermediate_size")) or 4304
    n = _int(vision.get("num_hidden_layers")) or 27
    patch = _int(vision.get("patch_size")) or 14
    image = _int(vision.get("image_size")) or 896
    ch = _int(vision.get("num_channels")) or 3
    per_layer = 4 * (h * h + h) + (h * i + i) + (i * h + h) + 4 * h
    emb = ch * patch * patch * h + h + (image // patch) ** 2 * h
    enc = "model.vision_tower.encoder.layers"  # transformers 5.x; 4.x nests it under vision_model
    linears = [_named(name, a, b, n, enc, part) for name, a, b, part in (
        ("q_proj", h, h, "self_attn"), ("k_proj", h, h, "self_attn"), ("v_proj", h, h, "self_attn"),
        ("out_proj", h, h, "self_attn"), ("fc1", h, i, "mlp"), ("fc2", i, h, "mlp"))]
    total = n * per_layer + emb + 2 * h
    if vision.get("vision_use_head", True) is not False:
        # The attention-pooling head (probe, multi-head attention, layer norm, MLP), unused by Gemma 3 but loaded.
        total += h + (3 * h * h + 3 * h) + (h * h + h) + 2 * h + (h * i + i) + (i * h + h)
        head = "model.vision_tower.head"
        linears += [Linear("out_proj", h, h, 1, (f"{head}.attention.out_proj",)),
                    Linear("fc1", h, i, 1, (f"{head}.mlp.fc1",)), Linear("fc2", i, h, 1, (f"{head}.mlp.fc2",))]
    # One Linear per kind: a kind the head shares with the encoder (its out_proj, fc1, fc2) gets both's names; any
    # other stays as _named made it (its names spelt out only where they are matched).
    merged: dict[tuple[str, int, int], Linear] = {}
    for k in linears:
        key = (k.name, k.in_features, k.out_features)
        had = merged.get(key)
        if had is None:
            merged[key] = k
        else:
            names = had.module_names() + k.module_names()
            merged[key] = Linear(k.name, k.in_features, k.out_features, len(names), names)
    return total, tuple(k for _key, k in sorted(merged.items(), key=lambda kv: kv[0]))


def _named(name: str, fan_in: int, fan_out: int, count: int, prefix: str, part: str, first: int = 0) -> Linear:
    """A Linear kind of ``count`` decoder layers from ``first`` on, named as the loaded model names them."""
    return Linear(name, fan_in, fan_out, count, layout=(prefix, part, first))


def shape_from_config(config: Mapping[str, Any], counted: tuple[ParamCounts, tuple[Linear, ...], tuple[Linear, ...], bool]
                      | None = None) -> ModelShape:
    """The model's shape from config.json; parameter counts from the checkpoint when given, else derived."""
    text = _text_config(config)
    get = lambda k, d: _int(text.get(k)) or d  # noqa: E731
    h = get("hidden_size", 2048)
    layers = get("num_hidden_layers", 18)
    heads = get("num_attention_heads", 8)
    kv = get("num_key_value_heads", heads)
    d = get("head_dim", h // heads)
    inter = text.get("intermediate_size")
    i = _int(inter) or (max(x for x in inter if _int(x)) if isinstance(inter, list) and any(_int(x) for x in inter) else 4 * h)
    vocab = get("vocab_size", 262144)
    model_type = config.get("model_type") if isinstance(config.get("model_type"), str) else None
    if counted is not None:
        counts, linears, tower_linears, tied = counted
        source = "safetensors headers"
    else:
        # The module names of the model transformers builds (>= 4.52: model.language_model.* in a multimodal one).
        nested = isinstance(config.get("vision_config"), Mapping) and text is not config
        prefix = "model.language_model.layers" if nested else "model.layers"
        linears = tuple(_named(name, a, b, layers, prefix, part) for name, a, b, part in (
            ("q_proj", h, heads * d, "self_attn"), ("k_proj", h, kv * d, "self_attn"), ("v_proj", h, kv * d, "self_attn"),
            ("o_proj", heads * d, h, "self_attn"), ("gate_proj", h, i, "mlp"), ("up_proj", h, i, "mlp"),
            ("down_proj", i, h, "mlp")))
        shared = _int(text.get("num_kv_shared_layers")) or 0
        if text.get("use_double_wide_mlp") is True and shared:
            # Gemma 4 E2B: the KV-shared layers' MLPs are twice as wide (Gemma4TextMLP, use_double_wide_mlp): the
            # same modules of the last layers, counted again for their second half.
            linears += tuple(_named(name, a, b, shared, prefix, "mlp", layers - shared) for name, a, b in (
                ("gate_proj", h, i), ("up_proj", h, i), ("down_proj", i, h)))
        per_layer = 0
        pl_h, pl_v = _int(text.get("hidden_size_per_layer_input")), _int(text.get("vocab_size_per_layer_input"))
        if pl_h and pl_v:
            per_layer = pl_v * layers * pl_h
        experts = 0
        n_exp, moe_i = _int(text.get("num_experts")), _int(text.get("moe_intermediate_size"))
        if n_exp and moe_i and (text.get("enable_moe_block") is True or n_exp > 1):
            experts = layers * n_exp * 3 * h * moe_i
        # Norms: input, post-attention, pre/post-feedforward (Gemma 2+), q/k norms (Gemma 3+), and the final one.
        text_type = str(text.get("model_type") or model_type or "")
        norms = 2 * h if text_type == "gemma" else 4 * h if text_type == "gemma2" else 4 * h + 2 * d
        other = layers * norms + h
        towers = 0
        tower_linears: tuple[Linear, ...] = ()
        vision = config.get("vision_config")
        if isinstance(vision, Mapping) and text is not config:
            towers, tower_linears = _siglip_params(vision)
            vh = _int(vision.get("hidden_size")) or 1152
            towers += vh * h + vh  # the multi-modal projector and its norm
        tied = config.get("tie_word_embeddings", text.get("tie_word_embeddings", True)) is not False
        counts = ParamCounts(embed=vocab * h, per_layer_embed=per_layer, lm_head=0 if tied else vocab * h,
                             linear=sum(x.params for x in linears), experts=experts, towers=towers,
                             tower_linear=sum(x.params for x in tower_linears), other=other)
        source = "config.json"
    return ModelShape(hidden=h, layers=layers, heads=heads, kv_heads=kv, head_dim=d, intermediate=i, vocab=vocab,
                      params=counts, linears=linears, tower_linears=tower_linears,
                      kv_layers=kv_layers_of(text, str(text.get("model_type") or model_type or ""), layers, kv, d),
                      final_logit_softcapping=_num(text.get("final_logit_softcapping")),
                      attn_logit_softcapping=_num(text.get("attn_logit_softcapping")), tied_embeddings=tied,
                      source=source, model_type=model_type)


def kv_layers_of(text: Mapping[str, Any], text_type: str, layers: int, kv: int, d: int) -> tuple[tuple[int, int, int], ...]:
    """The layers that keep a key/value cache when the model generates, as transformers 5.23.0 builds them from the
    text config: (key/value heads, head dim, sliding window or 0), one per caching layer. The layer kinds are the
    config's layer_types, else the configuration class's default pattern (Gemma 2: every second layer full; Gemma 3:
    every sliding_window_pattern-th, 6; Gemma 3n: every 5th; Gemma 4: every 6th and the last); a sliding layer keeps
    the last sliding_window tokens. Gemma 3n and Gemma 4 share the caches of their last num_kv_shared_layers layers
    (no cache of their own); Gemma 4's full layers have global_head_dim (512 unless written) and, with
    attention_k_eq_v, num_global_key_value_heads. Measured against the cache generate() returns on tiny models of
    each family (tests/test_memory_generation.py)."""
    types = text.get("layer_types")
    if not (isinstance(types, list) and len(types) == layers and all(isinstance(t, str) for t in types)):
        if text_type.startswith("gemma3n"):
            types = ["full_attention" if (i + 1) % 5 == 0 else "sliding_attention" for i in range(layers)]
        elif text_type.startswith("gemma4"):
            types = ["full_attention" if (i + 1) % 6 == 0 else "sliding_attention" for i in range(layers)]
        elif text_type.startswith("gemma3"):
            every = _int(text.get("sliding_window_pattern")) or 6
            types = ["full_attention" if (i + 1) % every == 0 else "sliding_attention" for i in range(layers)]
        elif text_type.startswith("gemma2"):
            types = ["full_attention" if i % 2 else "sliding_attention" for i in range(layers)]
        else:
            types = ["full_attention"] * layers
    types = list(types)
    gemma4 = text_type.startswith("gemma4") and not isinstance(text.get("per_layer_config"), Mapping)
    if gemma4 and types:
        types[-1] = "full_attention"  # Gemma4TextConfig forces the last layer full
    window = _int(text.get("sliding_window")) or 0
    shared = (_int(text.get("num_kv_shared_layers")) or 0) if text_type.startswith(("gemma3n", "gemma4")) else 0
    global_dim = (_int(text.get("global_head_dim")) or 512) if gemma4 else d
    global_kv = kv
    if gemma4 and text.get("attention_k_eq_v") is True:
        global_kv = _int(text.get("num_global_key_value_heads")) or kv
    # A config transformers 5.23 saved again names each full layer's own values in per_layer_config instead, keyed by
    # the layer's index written with leading zeros ("05").
    said = text.get("per_layer_config")
    per_layer = {int(k): v for k, v in said.items() if str(k).isdigit()} if isinstance(said, Mapping) else {}
    out = []
    for idx, t in enumerate(types[:max(0, layers - shared)]):
        full = t != "sliding_attention"
        heads, dim = (global_kv, global_dim) if full else (kv, d)
        own = per_layer.get(idx)
        if isinstance(own, Mapping):
            heads, dim = _int(own.get("num_key_value_heads")) or heads, _int(own.get("head_dim")) or dim
        out.append((heads, dim, 0 if full else window))
    return tuple(out)


def kv_cache_bytes(shape: ModelShape, rows: int, tokens: int, dtype_bytes: int) -> int:
    """Keys and values ``rows`` sequences of ``tokens`` tokens hold at the end of generate(): every caching layer's
    heads x head dim x tokens (a sliding layer's window at most), twice (keys, values). transformers 5.23.0 keeps one
    token less in each (the last generated token is never fed back); its 4.x static HybridCache as many: this is the
    larger."""
    per = sum(2 * k * dim * (min(tokens, w) if w else tokens) for k, dim, w in shape.kv_layers)
    return rows * per * dtype_bytes


# Published text configs of the sizes a --family plan can name (config.json of google/<id> on the Hub).
_G3_VISION = {"hidden_size": 1152, "intermediate_size": 4304, "num_hidden_layers": 27, "patch_size": 14, "image_size": 896,
              "vision_use_head": False}
PUBLISHED: dict[str, dict[str, dict[str, Any]]] = {
    "gemma": {
        "2b": {"model_type": "gemma", "hidden_size": 2048, "num_hidden_layers": 18, "num_attention_heads": 8,
               "num_key_value_heads": 1, "head_dim": 256, "intermediate_size": 16384, "vocab_size": 256000},
        "7b": {"model_type": "gemma", "hidden_size": 3072, "num_hidden_layers": 28, "num_attention_heads": 16,
               "num_key_value_heads": 16, "head_dim": 256, "intermediate_size": 24576, "vocab_size": 256000},
    },
    "gemma2": {
        "2b": {"model_type": "gemma2", "hidden_size": 2304, "num_hidden_layers": 26, "num_attention_heads": 8,
               "num_key_value_heads": 4, "head_dim": 256, "intermediate_size": 9216, "vocab_size": 256000,
               "final_logit_softcapping": 30.0, "attn_logit_softcapping": 50.0, "sliding_window": 4096},
        "9b": {"model_type": "gemma2", "hidden_size": 3584, "num_hidden_layers": 42, "num_attention_heads": 16,
               "num_key_value_heads": 8, "head_dim": 256, "intermediate_size": 14336, "vocab_size": 256000,
               "final_logit_softcapping": 30.0, "attn_logit_softcapping": 50.0, "sliding_window": 4096},
        "27b": {"model_type": "gemma2", "hidden_size": 4608, "num_hidden_layers": 46, "num_attention_heads": 32,
                "num_key_value_heads": 16, "head_dim": 128, "intermediate_size": 36864, "vocab_size": 256000,
                "final_logit_softcapping": 30.0, "attn_logit_softcapping": 50.0, "sliding_window": 4096},
    },
    "gemma3": {
        "1b": {"model_type": "gemma3_text", "hidden_size": 1152, "num_hidden_layers": 26, "num_attention_heads": 4,
               "num_key_value_heads": 1, "head_dim": 256, "intermediate_size": 6912, "vocab_size": 262144,
               "sliding_window": 512},
        "4b": {"model_type": "gemma3", "vision_config": _G3_VISION, "text_config": {
            "hidden_size": 2560, "num_hidden_layers": 34, "num_attention_heads": 8, "num_key_value_heads": 4,
            "head_dim": 256, "intermediate_size": 10240, "vocab_size": 262208, "sliding_window": 1024}},
        "12b": {"model_type": "gemma3", "vision_config": _G3_VISION, "text_config": {
            "hidden_size": 3840, "num_hidden_layers": 48, "num_attention_heads": 16, "num_key_value_heads": 8,
            "head_dim": 256, "intermediate_size": 15360, "vocab_size": 262208, "sliding_window": 1024}},
        "27b": {"model_type": "gemma3", "vision_config": _G3_VISION, "text_config": {
            "hidden_size": 5376, "num_hidden_layers": 62, "num_attention_heads": 32, "num_key_value_heads": 16,
            "head_dim": 128, "intermediate_size": 21504, "vocab_size": 262208, "sliding_window": 1024}},
    },
    # Gemma 4: the variants of transformers 5.5.0's convert_gemma4_weights.py (_VARIANTS), as Gemma4Config saves them;
    # derived parameter counts within 2.5% of the model built from them (4.80B, 7.63B, 31.27B, 25.81B). The full
    # layers' key/value heads with attention_k_eq_v (num_global_key_value_heads): 31B 4, 26B-A4B 2 (transformers 5.23's
    # configuration_gemma4.py: "num_global_key_value_heads=2 too small to partition" for google/gemma-4-26B-A4B-it).
    "gemma4": {
        "e2b": {"model_type": "gemma4", "text_config": {"model_type": "gemma4_text", "hidden_size": 1536, "num_hidden_layers": 35, "num_attention_heads": 8, "num_key_value_heads": 1, "head_dim": 256, "intermediate_size": 6144, "vocab_size": 262144, "num_kv_shared_layers": 20, "hidden_size_per_layer_input": 256, "vocab_size_per_layer_input": 262144, "use_double_wide_mlp": True, "enable_moe_block": False, "final_logit_softcapping": 30.0, "attention_k_eq_v": False, "sliding_window": 512, "global_head_dim": 512}, "vision_config": {"model_type": "gemma4_vision", "hidden_size": 768, "intermediate_size": 3072, "num_hidden_layers": 16, "patch_size": 16}},
        "e4b": {"model_type": "gemma4", "text_config": {"model_type": "gemma4_text", "hidden_size": 2560, "num_hidden_layers": 42, "num_attention_heads": 8, "num_key_value_heads": 2, "head_dim": 256, "intermediate_size": 10240, "vocab_size": 262144, "num_kv_shared_layers": 18, "hidden_size_per_layer_input": 256, "vocab_size_per_layer_input": 262144, "use_double_wide_mlp": False, "enable_moe_block": False, "final_logit_softcapping": 30.0, "attention_k_eq_v": False, "sliding_window": 512, "global_head_dim": 512}, "vision_config": {"model_type": "gemma4_vision", "hidden_size": 768, "intermediate_size": 3072, "num_hidden_layers": 16, "patch_size": 16}},
        "31b": {"model_type": "gemma4", "text_config": {"model_type": "gemma4_text", "hidden_size": 5376, "num_hidden_layers": 60, "num_attention_heads": 32, "num_key_value_heads": 16, "head_dim": 256, "intermediate_size": 21504, "vocab_size": 262144, "num_kv_shared_layers": 0, "hidden_size_per_layer_input": 0, "vocab_size_per_layer_input": 262144, "use_double_wide_mlp": False, "enable_moe_block": False, "final_logit_softcapping": 30.0, "use_bidirectional_attention": "vision", "attention_k_eq_v": True, "sliding_window": 1024, "global_head_dim": 512, "num_global_key_value_heads": 4}, "vision_config": {"model_type": "gemma4_vision", "hidden_size": 1152, "intermediate_size": 4304, "num_hidden_layers": 27, "patch_size": 16}},
        "26b-a4b": {"model_type": "gemma4", "text_config": {"model_type": "gemma4_text", "hidden_size": 2816, "num_hidden_layers": 30, "num_attention_heads": 16, "num_key_value_heads": 8, "head_dim": 256, "intermediate_size": 2112, "vocab_size": 262144, "num_kv_shared_layers": 0, "hidden_size_per_layer_input": 0, "vocab_size_per_layer_input": 262144, "use_double_wide_mlp": False, "enable_moe_block": True, "num_experts": 128, "moe_intermediate_size": 704, "top_k_experts": 8, "final_logit_softcapping": 30.0, "use_bidirectional_attention": "vision", "attention_k_eq_v": True, "sliding_window": 1024, "global_head_dim": 512, "num_global_key_value_heads": 2}, "vision_config": {"model_type": "gemma4_vision", "hidden_size": 1152, "intermediate_size": 4304, "num_hidden_layers": 27, "patch_size": 16}},
    },
}
# The size a --family plan assumes (the checkpoint advice.PLAN_MODEL_IDS names).
DEFAULT_SIZE = {"gemma": "7b", "gemma2": "2b", "gemma3": "1b", "gemma4": "e2b"}


def published_config(family: str, size: str | None = None) -> dict[str, Any] | None:
    """A copy of the published config of ``family`` at ``size`` (its default size when None); None where unknown."""
    import copy

    key = (size or DEFAULT_SIZE.get(family, "")).lower().replace(" ", "")
    cfg = PUBLISHED.get(family, {}).get(key)
    return copy.deepcopy(cfg) if cfg is not None else None


def published_shape(family: str, size: str | None = None) -> ModelShape | None:
    """The shape of a published size of ``family`` (None where gemma-doctor has no published config for it)."""
    sizes = PUBLISHED.get(family)
    if not sizes:
        return None
    key = (size or DEFAULT_SIZE.get(family, "")).lower().replace(" ", "")
    cfg = sizes.get(key)
    if cfg is None:
        return None
    shape = shape_from_config(cfg)
    return replace(shape, source=f"published config of {family} {key} (counts derived from it)")


def published_sizes(family: str) -> tuple[str, ...]:
    """The sizes --size accepts for ``family``."""
    return tuple(PUBLISHED.get(family, {}))


# --- the run -------------------------------------------------------------------------------------

def load_dtype_for(precision: str, method: str) -> str:
    """The dtype the weights load in (recommend.py's rule): bf16 -> bfloat16, fp32 -> float32, and fp16 -> float32
    master weights for full fine-tuning (GradScaler unscales fp32 gradients only) but a float16 frozen base for LoRA."""
    if precision == "bf16":
        return "bfloat16"
    if precision == "fp16":
        return "float32" if method == "full" else "float16"
    return "float32"


# Optimizer name (transformers' `optim` values and common spellings) -> (kind, state bytes per trainable element or None
# for "as the parameter dtype", temporaries at step).
_OPTIMIZERS: dict[str, str] = {
    "adamw_torch": "adamw", "adamw": "adamw", "adam": "adamw", "adamw_hf": "adamw", "adamw_torch_fused": "adamw_fused",
    "adamw_fused": "adamw_fused", "adamw_apex_fused": "adamw_fused", "adamw_torch_xla": "adamw", "adamw_torch_npu_fused":
    "adamw_fused", "adamw_anyprecision": "adamw", "adamw_bnb_8bit": "adamw_8bit", "adamw_8bit": "adamw_8bit",
    "adam8bit": "adamw_8bit", "adamw8bit": "adamw_8bit", "bnb_8bit": "adamw_8bit", "paged_adamw_8bit": "paged_adamw_8bit",
    "paged_adamw_32bit": "paged_adamw", "paged_adamw": "paged_adamw", "adafactor": "adafactor", "sgd": "sgd",
    "sgd_momentum": "sgd_momentum", "adagrad": "adagrad", "rmsprop": "rmsprop", "lion_32bit": "lion", "lion": "lion",
    "lion_8bit": "lion_8bit", "paged_lion_8bit": "lion_8bit", "paged_lion_32bit": "lion",
    "galore_adamw": "adamw", "apollo_adamw": "adamw", "schedule_free_adamw": "adamw", "muon": "sgd_momentum",
}


def optimizer_kind(name: str | None) -> tuple[str, bool]:
    """(kind, known) for a transformers `optim` value or a common spelling; unknown names plan as AdamW."""
    key = (name or DEFAULT_OPTIMIZER).strip().lower().replace("-", "_")
    if key in _OPTIMIZERS:
        return _OPTIMIZERS[key], True
    return "adamw", False


# bitsandbytes keeps 32-bit state for tensors with fewer elements (min_8bit_size) and one fp32 absmax per 256.
BNB_MIN_8BIT_SIZE = 4096
BNB_BLOCK = 256


def optimizer_state_bytes(kind: str, shapes: Iterable[tuple[int, ...]], param_bytes: int) -> int:
    """Bytes of optimizer state for trainable tensors of ``shapes`` (what the optimizer's state_dict holds after a step)."""
    shapes = tuple(shapes)
    # A model repeats a handful of shapes (338 tensors, 6 shapes for gemma-3-12b's LM): each distinct one is costed
    # once. The decision's search plans dozens of runs per model, so this is its inner loop.
    return sum(count * _state_bytes_of(kind, shape, param_bytes) for shape, count in _shape_counts(shapes).items())


@functools.lru_cache(maxsize=64)
def _shape_counts(shapes: tuple[tuple[int, ...], ...]) -> dict[tuple[int, ...], int]:
    out: dict[tuple[int, ...], int] = {}
    for shape in shapes:
        out[shape] = out.get(shape, 0) + 1
    return out


def _state_bytes_of(kind: str, shape: tuple[int, ...], param_bytes: int) -> int:
    total = 0
    for shape in (shape,):
        n = math.prod(shape)
        if kind in ("adamw", "adamw_fused", "paged_adamw"):
            total += 2 * n * param_bytes
        elif kind in ("adamw_8bit", "paged_adamw_8bit", "lion_8bit"):
            states = 1 if kind == "lion_8bit" else 2
            if n >= BNB_MIN_8BIT_SIZE:
                total += states * (n + 4 * math.ceil(n / BNB_BLOCK))
            else:
                total += states * n * 4
        elif kind in ("sgd_momentum", "lion", "adagrad", "rmsprop"):
            total += n * param_bytes
        elif kind == "adafactor":
            # transformers' Adafactor (beta1=None): row and column second moments of matrices, the full one of
            # vectors, always in fp32 (it upcasts bf16/fp16 parameters for the update).
            if len(shape) >= 2:
                rows = math.prod(shape[:-1])
                cols = math.prod(shape[:-2]) * shape[-1]
                total += (rows + cols) * 4
            else:
                total += n * 4
        # sgd without momentum keeps no state
    return total


@functools.lru_cache(maxsize=256)
def lora_shapes(shape: ModelShape, r: int, targets: str | tuple[str, ...]) -> tuple[tuple[int, int], ...]:
    """Shapes of every LoRA A and B matrix PEFT adds for ``targets`` ("all-linear", a regex, or a list of names)."""
    out: list[tuple[int, int]] = []
    # PEFT's all-linear: every nn.Linear but the output layer; a regex or a list: the module names it matches.
    for k in shape.linears + shape.tower_linears:
        out.extend([(r, k.in_features), (k.out_features, r)] * k.matched(targets))
    return tuple(out)


def lora_trainable(shape: ModelShape, r: int, targets: str | tuple[str, ...]) -> int:
    """LoRA's trainable parameters: r * (in + out) per targeted Linear (what PEFT's get_nb_trainable_parameters says)."""
    return sum(a * b for a, b in lora_shapes(shape, r, targets))


# --- activations (bytes saved for backward, per decoder layer and token) ---------------------------

def layer_activation_bytes(shape: ModelShape, run: Settings, seq: int) -> float:
    """Bytes one decoder layer saves for backward, per token (b*s tokens), without gradient checkpointing.

    Counted with torch's saved-tensor hooks on transformers' Gemma 3 decoder layer (docs/memory.md): with SDPA,
    fp32 saves 10 copies of the hidden state, 4 of q, 4 of k/v and 4 of the MLP width in fp32; autocast saves
    8 hidden / 2 q / 2 k,v copies in fp32 (the RMSNorms compute in fp32) and 5 hidden / 2 q / 2 k,v / 4 MLP in bf16.
    Eager attention adds the softmax probabilities (fp32, plus a bf16 copy under autocast) of every head over the
    whole sequence, and the repeated K/V of grouped-query attention; soft-capping two more score tensors.
    """
    h, a, k, d, i = shape.hidden, shape.heads, shape.kv_heads, shape.head_dim, shape.intermediate
    mixed = run.precision != "fp32"
    if mixed:
        per = 42 * h + 12 * a * d + 12 * k * d + 8 * i
        c = 2
    else:
        per = 4 * (10 * h + 4 * a * d + 4 * k * d + 4 * i)
        c = 4
    if run.attention == "eager":
        per += a * seq * (6 if mixed else 4) + 2 * c * (a - k) * d
        if shape.attn_logit_softcapping:
            per += a * seq * 2 * c
    return float(per)


def logits_bytes_per_token(shape: ModelShape, run: Settings) -> float:
    """Bytes of logits alive at the loss, per token: traits.logits_bytes_per_logit for each of the vocabulary."""
    return logits_bytes_per_logit(shape.final_logit_softcapping, run.precision) * shape.vocab


# TRL >= 1.15's SFTTrainer computes the log-probabilities through a fused LM head (trl/kernels/chunked_logprob.py,
# TRL 1.16): one [min(tokens, TOKEN_CHUNK_SIZE), chunk] tile of logits in fp32 at a time, chunk the vocabulary width
# trl/trainer/utils.py passes (_CHUNKED_LOGPROB_CHUNK_SIZE), and a handful of fp32 per-token accumulators (running
# max, sums, target logit, ...), never the b*s*V logits.
TRL_TOKEN_CHUNK = 4096
TRL_VOCAB_CHUNK = 32768
TRL_PER_TOKEN_ACCUMULATORS = 8


# Liger's fused DPO loss (liger-kernel 0.8.1, chunked_loss/fused_linear_preference.py, LigerFusedLinearDPOLoss's
# chunk_size 1, as TRL 1.9.0's DPOTrainer builds it for use_liger_kernel): the batch is split into chunks of this many
# chosen/rejected pairs; each chunk's logits (hidden @ lm_head.T), their fp32 log-softmax and gradient are computed
# and freed (torch.func.grad_and_value) before the next. Run on CPU (docs/memory.md): the largest tensor of a step of
# 2 pairs x 64 tokens is [126 x 262,144], one pair, where the step without it holds [256 x 262,144].
LIGER_DPO_PAIRS = 1


def chunked_logits_bytes(tokens: int) -> int:
    """Bytes of logits alive at the loss when TRL's fused LM head computes them in tiles (run.chunked_loss)."""
    return min(tokens, TRL_TOKEN_CHUNK) * TRL_VOCAB_CHUNK * 4 + tokens * TRL_PER_TOKEN_ACCUMULATORS * 4


# --- the plan ------------------------------------------------------------------------------------

@dataclass(frozen=True)
class MemoryPlan:
    """Bytes per GPU at the peak of a training step, by component, and the verdict against the GPU's memory."""

    method: str
    components: dict[str, int]
    per_gpu_bytes: int
    total_bytes: int
    gpu_bytes: int | None
    verdict: str  # fits | tight | does-not-fit | unknown
    peak: str  # loss | embedding-backward | optimizer-step | evaluation (an eval batch written) | generation (GRPO)
    trainable_params: int
    assumptions: tuple[str, ...]
    settings: Settings
    shape: ModelShape
    tensor_bytes: int = 0  # the peak without the framework overhead (what torch.cuda.max_memory_allocated measures)
    gpu_name: str | None = None
    # Every moment's components (the peak's are ``components``): what the tests hold against other estimators.
    phases: Mapping[str, Mapping[str, int]] = field(default_factory=dict, compare=False, repr=False)

    @property
    def fits(self) -> bool:
        """True when the verdict is fits or tight."""
        return self.verdict in ("fits", "tight")

    def to_json(self) -> dict[str, Any]:
        """The `memory` object of check's and recommend's JSON (docs/memory.md)."""
        return {"method": self.method, "summary": self.summary(), "total_bytes": self.total_bytes, "per_gpu_bytes": self.per_gpu_bytes,
                "gpu_bytes": self.gpu_bytes, "gpu": self.gpu_name, "verdict": self.verdict,
                "components": dict(self.components), "peak": self.peak, "tensor_bytes": self.tensor_bytes,
                "trainable_params": self.trainable_params, "run": self.settings.to_json(), "model": self.shape.to_json(),
                "assumptions": list(self.assumptions)}

    def summary(self) -> str:
        """One line: "LoRA r=16, bf16, batch 8 x 1024 tokens: 13.2 GiB of 15.0 GiB (T4): fits"."""
        r = self.settings
        how = {"full": "full fine-tuning", "lora": f"LoRA r={r.lora_r}",
               "qlora": f"QLoRA {r.quant_bits or 4}-bit r={r.lora_r}"}[self.method]
        ck = ", gradient checkpointing" if r.gradient_checkpointing else ""
        acc = f" (x{r.gradient_accumulation_steps} accumulation)" if r.gradient_accumulation_steps > 1 else ""
        gpus = f" per GPU ({r.num_gpus} GPUs, ZeRO-{r.zero_stage})" if r.num_gpus > 1 else ""
        of = f" of {gib(self.gpu_bytes)}" + (f" ({self.gpu_name})" if self.gpu_name else "") if self.gpu_bytes else ""
        # Weights the trainer loads in another dtype than the precision's (TRL's float32 default) are said: they are
        # what a reader of the line would otherwise take for bf16. Under DeepSpeed's mixed precision the engine casts
        # them to 16 bits whatever the load and keeps fp32 master copies: that is what the line says is held.
        cast = r.deepspeed_cast()
        loaded = (f" with {cast} weights and fp32 master copies" if cast is not None else
                  f" with {r.load_dtype} weights" if "load_dtype" in dict(r.sources) and self.method != "qlora"
                  and r.load_dtype != load_dtype_for(r.precision, self.method) else "")
        return (f"{how}, {r.precision}{loaded}, batch {r.batch_size}{acc} x {r.seq_len} tokens{ck}: "
                f"{gib(self.per_gpu_bytes)}{gpus}{of}: {self.verdict}")


def components_line(components: Mapping[str, int]) -> str:
    """"weights 9.2 GiB + logits 3.0 GiB + ...", largest first."""
    return " + ".join(f"{k.replace('_', ' ')} {gib(v)}" for k, v in sorted(components.items(), key=lambda kv: -kv[1]))


def verdict_for(per_gpu: int, gpu_bytes: int | None) -> str:
    """fits (below 90% of the GPU), tight (90-100%), does-not-fit, or unknown (no GPU memory known)."""
    if not gpu_bytes:
        return "unknown"
    if per_gpu <= FITS_BELOW * gpu_bytes:
        return "fits"
    if per_gpu <= gpu_bytes:
        return "tight"
    return "does-not-fit"


def plan(shape: ModelShape, run: Settings, gpu_bytes: int | None = None, gpu_name: str | None = None) -> MemoryPlan:
    """The memory plan of ``run`` on ``shape`` (per GPU), judged against ``gpu_bytes`` when known. A run is counted
    once per process (_COUNTED) by the settings its bytes are a function of: the search's candidate, check's plan of
    the candidate's training config read back and the prescription's memory block are one run under three sets of
    sources (and a full fine-tuning's LoRA targets, which it never reads), of which only the first assumption lines
    say anything (made again for ``run``: _relabelled)."""
    if run.eval_batch:  # the evaluation's notes read its sources too: counted as it is
        return _plan(shape, run, gpu_bytes, gpu_name)
    key = (shape, frozen.replace(run, sources=(), **({"lora_r": DEFAULT_LORA_R, "lora_targets": DEFAULT_LORA_TARGETS}
                                                     if run.method == "full" else {})), gpu_bytes, gpu_name)
    made = _COUNTED.get(key)
    if made is None:
        if len(_COUNTED) >= 256:
            _COUNTED.clear()
        made = _COUNTED[key] = _plan(shape, run, gpu_bytes, gpu_name)  # the first asker's, sources and all
    return made if made.settings == run else _relabelled(made, shape, run)


# A run's plan by the settings its bytes are a function of (plan(): the shape, the settings without their sources
# and a full fine-tuning's LoRA settings, the GPU): pure, relabelled for each asker; bounded, cleared when full.
_COUNTED: dict[tuple[Any, ...], MemoryPlan] = {}


def _plan(shape: ModelShape, run: Settings, gpu_bytes: int | None = None, gpu_name: str | None = None) -> MemoryPlan:
    p = shape.params
    notes: list[str] = []
    mixed = run.precision != "fp32"
    load = run.load_dtype
    # DeepSpeed in bf16/fp16 (ZeRO, not FSDP): the engine casts every parameter to that 16-bit dtype, whatever the
    # load (0.19.8 engine.py _cast_module_mixed_precision), and ZeRO keeps an fp32 copy of its partition's parameters
    # and gradients beside fp32 optimizer states: estimate_zero2/3_model_states_mem_needs' 18 bytes per parameter
    # (2 16-bit gradient + 4 fp32 gradient + 4 fp32 parameter + 8 Adam states), beside the 16-bit parameter.
    cast = run.deepspeed_cast()
    ds_mixed = cast is not None
    if cast is not None:
        load = cast
        notes.append(f"DeepSpeed {run.precision}: the engine casts the parameters to {load} and ZeRO keeps fp32 "
                     "parameters and gradients of its partition beside the optimizer states (fp32_master_copies)")
    wbytes = DTYPE_BYTES.get(load, 2)
    n = max(1, run.num_gpus)
    stage = run.zero_stage if n > 1 else 0
    paired = run.task in PAIRED_TASKS
    batch = run.batch_size * (2 if paired else 1)
    tokens = batch * run.seq_len
    towers = p.towers if run.text_only else 0

    # Weights, and what trains.
    text = p.text
    tower_bytes = p.towers * wbytes
    if run.method == "full":
        weights = text * wbytes
        trainable = text + (0 if run.text_only else p.towers)
        train_bytes = wbytes  # parameters train in their own dtype (fp32 master weights when loaded in fp32)
        trainable_shapes = _param_shapes(shape, include_towers=not run.text_only)
        adapters = 0
    else:
        shapes = lora_shapes(shape, run.lora_r, run.lora_targets)
        trainable = sum(a * b for a, b in shapes)
        trainable_shapes = shapes
        # PEFT >= 0.12 keeps adapters in fp32 (autocast_adapter_dtype=True); DeepSpeed casts them with the rest
        train_bytes = 2 if ds_mixed else 4
        adapters = trainable * train_bytes
        saved = shape.saved_quantization
        if run.method == "qlora" and saved is not None and saved[0] != "bitsandbytes":
            # Saved by another quantizer (AWQ, GPTQ...): its packed weights as saved, not bitsandbytes'.
            qmethod, bits, group = saved
            qb = bits / 8 + (2 + bits / 8) / group  # per group of weights: an fp16 scale and a packed zero point
            quantized = p.linear + p.tower_linear
            rest = p.total - quantized
            # PEFT's prepare_model_for_kbit_training casts the other bf16/fp16 parameters to fp32 except for the
            # quantizers it names (PEFT 0.21.2 utils/other.py: gptq, aqlm, eetq, torchao, hqq).
            kept = qmethod in KBIT_NOT_UPCAST
            weights = int(quantized * qb) + rest * (wbytes if kept else 4)
            tower_bytes = 0  # counted with the rest
            notes.append(f"LoRA on the checkpoint's own {qmethod} {bits}-bit quantization: {quantized:,} Linear "
                         f"weights at {qb:.3f} bytes each (an fp16 scale and a {bits}-bit zero point per {group}); the "
                         f"other {rest:,} (embeddings, norms) in " + (f"{run.load_dtype}, as loaded (PEFT's "
                         f"prepare_model_for_kbit_training leaves {qmethod} models' dtypes)" if kept else
                         "fp32, as prepare_model_for_kbit_training casts them"))
        elif run.method == "qlora":
            bits = run.quant_bits or 4
            qb = NF4_BYTES if bits == 4 else INT8_BYTES
            quantized = p.linear + p.tower_linear
            rest = p.total - quantized
            # prepare_model_for_kbit_training casts every non-quantized bf16/fp16 parameter to fp32.
            weights = int(quantized * qb) + rest * 4
            tower_bytes = 0  # quantized with the rest
            notes.append(f"QLoRA {bits}-bit: {quantized:,} Linear weights at {qb:.3f} bytes each (bitsandbytes "
                         f"{'NF4 with double quantization' if bits == 4 else 'LLM.int8'}); the other {rest:,} "
                         "(embeddings, norms) in fp32, as prepare_model_for_kbit_training casts them")
        else:
            weights = text * wbytes
    grads = trainable * train_bytes
    kind, known = optimizer_kind(run.optimizer)
    if not known:
        notes.append(f"optimizer {run.optimizer!r} is not known to gemma-doctor: planned as AdamW (two states per parameter)")
    opt_states = optimizer_state_bytes(kind, trainable_shapes, 4 if ds_mixed else train_bytes)
    master = trainable * 8 if ds_mixed else 0  # ZeRO's fp32 parameters and gradients
    # What the engine moves off the GPU. DeepSpeed's offload_optimizer: the optimizer states, ZeRO's fp32 copies and,
    # from ZeRO-2, the gradient partitions (copied to CPU as they are reduced); its offload_param (ZeRO-3 only): the
    # parameter partitions. FSDP's offload_params (CPUOffload): the parameter shards, their gradients, and so the
    # optimizer step and its states. What stays: the units being computed, gathered, and gradients until reduced.
    off_params = run.offload_params and (run.fsdp or run.zero_stage >= 3)
    off_states = run.offload_optimizer or (run.offload_params and run.fsdp)
    off_grads = (run.offload_params and run.fsdp) or (run.offload_optimizer and run.zero_stage >= 2 and not run.fsdp)
    if off_states:
        opt_states = master = 0
        notes.append("optimizer states offloaded to CPU memory (" + ("FSDP offload_params: the optimizer steps on the "
                     "CPU" if run.fsdp else "DeepSpeed offload_optimizer") + "): not on the GPU")
    if off_params:
        notes.append("parameters offloaded to CPU memory (" + ("FSDP offload_params" if run.fsdp else
                     "DeepSpeed ZeRO-3 offload_param") + "): the GPU holds the units being computed, gathered, and the "
                     "root unit" + ("; gradients are moved to the CPU as they are reduced" if off_grads else ""))
    reference = 0
    gen = run.generation
    if (run.task in REFERENCE_TASKS or (gen is not None and gen.beta > 0)) and run.method == "full":
        reference = text * wbytes
        notes.append(f"{run.task}: full fine-tuning loads a frozen reference model ({gib(reference)}); with LoRA the "
                     "reference is the base model with adapters disabled (no copy)")

    # Sharding (ZeRO / FSDP): stage 1 shards optimizer states, 2 also gradients, 3 also parameters.
    # The unit outside the decoder layers (accelerate's FSDP2 root: the tied embedding / lm_head, the per-layer
    # embeddings) is gathered whole: FSDP2 does not reshard the root after forward (FSDPState._lazy_init sets its
    # post_forward_mesh_info to None), so it stays gathered from the forward to its post-backward; its gradient is
    # produced whole by autograd and reduce-scattered only in that post-backward (FSDPParamGroup.post_backward,
    # foreach_reduce), after every layer's. Measured: benchmarks/sharded_memory.py, docs/benchmarks.md.
    sharded_grads = (stage >= 2 and n > 1) or off_grads
    root = p.embed + p.per_layer_embed + p.lm_head
    root_weights = root * (4 if run.method == "qlora" else wbytes)
    all_gathered = 0  # FSDP SHARD_GRAD_OP keeps every unit gathered from its forward to its backward
    if stage >= 1:
        opt_states //= n
        master //= n
    full_grads = grads
    if stage >= 2:
        grads //= n
    gathered = 0
    if stage >= 3 or (stage == 2 and run.fsdp and n > 1) or off_params:
        layer_params = (p.linear + p.other) // max(1, shape.layers)
        gathered = layer_params * wbytes * 2  # the layer being computed and the next one prefetched
        if stage == 2 and not off_params:  # at the loss every unit is gathered: the shards + all the weights
            all_gathered = max(0, weights - gathered - root_weights)
        weights = (0 if off_params else weights // n) + gathered
        reference //= n
    else:
        root_weights = 0  # replicated weights (ZeRO <= 2): nothing to gather

    # Activations saved for backward.
    per_layer = layer_activation_bytes(shape, run, run.seq_len)
    resid = 4 if (load == "float32" and run.method == "full") or (run.method == "qlora") else (2 if mixed else 4)
    if run.gradient_checkpointing:
        activations = tokens * (shape.layers * shape.hidden * resid + per_layer)
    else:
        activations = tokens * shape.layers * per_layer
    activations += tokens * shape.hidden * 4 * 4  # embedding scale, final norm: a few hidden-state copies
    if p.per_layer_embed:
        activations += tokens * shape.layers * (p.per_layer_embed // max(1, shape.vocab * shape.layers)) * 4 * 2
    activations = int(activations)
    # Autocast saves a half-precision copy of every fp32 weight it casts (the lm_head's too) until backward frees it.
    casts = 0
    if mixed and load == "float32" and run.method in ("full", "lora"):
        casts = (p.linear + p.embed + p.lm_head) * 2
    if run.chunked_loss:
        logits = chunked_logits_bytes(tokens)
    elif run.liger_dpo_loss:  # one chosen/rejected pair of the batch at a time
        logits = int(min(tokens, LIGER_DPO_PAIRS * 2 * run.seq_len) * logits_bytes_per_token(shape, run))
    else:
        logits = int(tokens * logits_bytes_per_token(shape, run))

    # Gradient of a tied (trainable) embedding: produced by the lm_head, then by the input embedding, then summed.
    embed_trainable = run.method == "full"
    emb_grad = (p.embed * train_bytes) // (n if stage >= 2 else 1) if embed_trainable else 0
    root_grad = 0
    if sharded_grads and embed_trainable:
        # Sharded: the root's gradient exists whole (every rank, all of it) until its reduce-scatter, the copies of
        # the tied embedding's as well; the other gradients are reduce-scattered already at the embedding's backward.
        root_grad = root * train_bytes
        emb_grad = p.embed * train_bytes
        grads = (full_grads - root_grad) // n
    if off_grads:
        grads = 0  # moved to CPU memory as they are reduced
    step_temp = 0
    step_bytes = 4 if ds_mixed else train_bytes  # ZeRO steps its fp32 partition
    if off_states:
        pass  # the optimizer steps on the CPU
    elif kind == "adamw" and run.device == "cuda":
        step_temp = trainable * step_bytes // (n if stage >= 1 else 1)  # foreach: one sqrt(v) per parameter at once
    elif kind == "adamw":
        step_temp = max((math.prod(s) for s in _shape_counts(tuple(trainable_shapes))), default=0) * step_bytes

    towers_held = 0 if off_params else tower_bytes // (n if stage >= 3 else 1)
    persistent = {"weights": weights + reference, "towers": towers_held, "lora_adapters": adapters,
                  "optimizer_states": opt_states, "fp32_master_copies": master}
    gathered_root = {"gathered_root_unit": root_weights}
    phases: dict[str, dict[str, int]] = {
        "loss": {**persistent, **gathered_root, "gathered_layers": all_gathered, "activations": activations,
                 "autocast_weight_copies": casts, "logits": logits},
        "embedding-backward": {**persistent, **gathered_root, "gradients": grads, "unsharded_root_gradient": root_grad,
                               "embedding_gradient_copies": 2 * emb_grad if p.lm_head == 0 else emb_grad},
        "optimizer-step": {**persistent, "gradients": grads + (0 if off_grads else root_grad // n),
                           "optimizer_step_temporaries": step_temp},
    }
    if run.eval_batch:
        phases["evaluation"] = {**persistent, **gathered_root, **_evaluation(shape, run, wbytes, notes)}
    if gen is not None:
        _generation(phases, shape, run, gpu_bytes, wbytes, held={**persistent, **gathered_root},
                    full_weights=text * wbytes, weights=weights, notes=notes)
    peak = max(phases, key=lambda k: sum(phases[k].values()))
    comps = {k: int(v) for k, v in phases[peak].items() if v}
    tensor = sum(comps.values())
    overhead = 0
    if run.device == "cuda":
        overhead = CUDA_CONTEXT_BYTES + int(CUDA_ALLOCATOR_SLACK * tensor)
        comps["framework_overhead"] = overhead
    per_gpu = tensor + overhead
    total = per_gpu * n
    lines = _assumptions(shape, run, towers, wbytes)
    notes[:0] = lines
    made = MemoryPlan(method=run.method, components=comps, per_gpu_bytes=per_gpu, total_bytes=total, gpu_bytes=gpu_bytes,
                      verdict=verdict_for(per_gpu, gpu_bytes), peak=peak, trainable_params=trainable,
                      assumptions=tuple(notes), settings=run, shape=shape, tensor_bytes=tensor, gpu_name=gpu_name,
                      phases=phases)
    # plan()'s own (a replace() copy has no mark): its first ``lines`` assumptions are the ones the sources change.
    object.__setattr__(made, "_source_lines", len(lines))
    return made


def _generation(phases: dict[str, dict[str, int]], shape: ModelShape, run: Settings, gpu_bytes: int | None,
                wbytes: int, *, held: Mapping[str, int], full_weights: int, weights: int, notes: list[str]) -> None:
    """A GRPO step's generation moment (run.Generation), added to ``phases``; a colocated vLLM engine's memory added
    to every moment it holds it.

    transformers' generate() in the training process (TRL 1.16 GRPOTrainer without vLLM): one call holds the process's
    generation rows (Generation.rows) with their key/value cache grown to the whole sequence (kv_cache_bytes: the run's
    seq_len is the prompt and its completion), the prefill's activations of one layer at a time (no gradient: at most
    what the layer would save for backward, layer_activation_bytes) and the last position's logits in fp32 with the
    sampler's copies (generate()'s next_token_logits, the processed scores, the probabilities). Under DeepSpeed
    ZeRO-3 TRL gathers every parameter for generation (ds3_gather_for_generation, default true). The cache is in the
    dtype the layers compute in: the load dtype (generate() runs outside autocast), fp32 for QLoRA (PEFT's
    prepare_model_for_kbit_training casts the rest of the model to fp32 and bitsandbytes returns the input's dtype).
    vLLM colocated (use_vllm, vllm_mode colocate): the engine takes vllm_gpu_memory_utilization of the GPU for the
    whole run (with vllm_enable_sleep_mode only while it generates); vLLM as a server (trl vllm-serve) runs on GPUs of
    its own."""
    gen = run.generation
    assert gen is not None
    n = max(1, run.num_gpus)
    if gen.engine == "vllm-server":
        notes.append("GRPO generation on a vLLM server (vllm_mode server): on the server's own GPUs, not planned here")
        return
    if gen.engine == "vllm-colocate":
        engine = int(gen.share * gpu_bytes) if gpu_bytes else 0
        if not gpu_bytes:
            notes.append(f"GRPO generation in a colocated vLLM engine: it takes {gen.share:.0%} of the GPU's memory "
                         "(vllm_gpu_memory_utilization), not counted without a GPU named")
            return
        if gen.sleep:
            phases["generation"] = {**held, "vllm_engine": engine}
        else:
            for moment in phases.values():
                moment["vllm_engine"] = engine
        notes.append(f"GRPO generation in a colocated vLLM engine: {gen.share:.0%} of the GPU's memory "
                     f"(vllm_gpu_memory_utilization, {gib(engine)}) " + ("while it generates (sleep mode)" if gen.sleep
                                                                         else "for the whole run"))
        return
    rows = gen.rows(run.batch_size, run.gradient_accumulation_steps, n)
    kv_bytes = 4 if run.method == "qlora" or wbytes == 4 else wbytes
    kv = kv_cache_bytes(shape, rows, run.seq_len, kv_bytes)
    prompt = max(1, run.seq_len - gen.completion)
    prefill = int(rows * prompt * layer_activation_bytes(shape, run, prompt))
    logits = rows * shape.vocab * 4 * 3
    gathered = max(0, full_weights - weights) if run.zero_stage >= 3 and not run.fsdp and n > 1 else 0
    # What stays between steps (the gradients freed by zero_grad), and what generating adds.
    phases["generation"] = {**held, "gathered_for_generation": gathered, "kv_cache": kv,
                            "generation_activations": prefill, "generation_logits": logits}
    notes.append(f"GRPO generation (transformers generate() in the training process): {rows} sequences of up to "
                 f"{run.seq_len} tokens (prompt and max_completion_length {gen.completion}) at once, their key/value "
                 f"cache {gib(kv)}" + (" with every parameter gathered (ZeRO-3 ds3_gather_for_generation)"
                                       if gathered else ""))


# The logits of one evaluation batch at its loss: the lm_head's output (2 bytes under autocast, else 4), the loss's fp32
# upcast of it (ForCausalLMLoss: logits.float(), a copy only of half-precision logits) and cross_entropy's fp32
# log-softmax; transformers 5.23.0's prediction_step computes the loss with the logits (compute_loss, return_outputs).
def _eval_logit_bytes(mixed: bool) -> int:
    return 2 + 4 + 4 if mixed else 4 + 4


def _evaluation(shape: ModelShape, run: Settings, wbytes: int, notes: list[str]) -> dict[str, int]:
    """The evaluation moment's own components: one eval batch's logits at its loss and, where predictions are kept,
    what transformers 5.23.0's evaluation_loop holds of them on the GPU (reproduced on a tiny Gemma 3, CPU):
    EvalLoopContainer concatenates each batch's logits, gathered from every rank (gather_for_metrics), until
    eval_accumulation_steps moves them to the CPU, else until the eval set ends. Under mixed precision they are fp32
    (accelerate's convert_outputs_to_fp32)."""
    paired = run.task in PAIRED_TASKS
    batch = run.eval_batch * (2 if paired else 1)
    tokens = batch * run.seq_len
    mixed = run.precision != "fp32"
    forward = tokens * shape.vocab * _eval_logit_bytes(mixed) + tokens * shape.hidden * 4 * 4
    src = dict(run.sources)
    notes.append(f"evaluation batch {run.eval_batch} ({run.source('eval_batch')}): its b*s*V logits at the loss "
                 f"({gib(forward)}); the optimizer states stay on the GPU")
    unit = tokens * shape.vocab * (4 if mixed else wbytes) * max(1, run.num_gpus)  # one batch, gathered from every rank
    if not run.keeps_predictions:
        notes.append("evaluation predictions not kept (" + (src["keeps_predictions"] if "keeps_predictions" in src
                     else "transformers' evaluate() keeps none without compute_metrics, which a config cannot show")
                     + ")")
        return {"eval_logits": forward}
    k = run.eval_accumulation
    per = f"{gib(unit)} a batch" + (f" from {run.num_gpus} ranks" if run.num_gpus > 1 else "")
    if k is None:
        # Unbounded: the moment the second batch is concatenated is counted (the first, the second and their
        # concatenation), a lower bound; every further batch adds one more.
        notes.append(f"evaluation keeps every batch's predictions on the GPU ({run.source('keeps_predictions')}; "
                     f"{per}): grows with the eval set until it ends, counted here at its second batch; "
                     "eval_accumulation_steps moves them to the CPU every that many batches")
        if 4 * unit > forward + unit:
            return {"kept_predictions": 4 * unit}
        return {"eval_logits": forward, "kept_predictions": unit}
    notes.append(f"evaluation keeps predictions on the GPU for {k} batch{'es' if k > 1 else ''} "
                 f"({run.source('eval_accumulation')}; {per}), then moves them to the CPU")
    # Before a batch's forward k-1 batches are kept; at the k-th concatenation the k-1, the new one and the k.
    concat = unit if k == 1 else 2 * k * unit
    before = forward + (k - 1) * unit
    if before >= concat:
        return {"eval_logits": forward, "kept_predictions": (k - 1) * unit}
    return {"kept_predictions": concat}


@functools.lru_cache(maxsize=64)
def _param_shapes(shape: ModelShape, include_towers: bool) -> tuple[tuple[int, ...], ...]:
    """Shapes of the trainable tensors of full fine-tuning (Linear kinds exactly, the rest as one vector each)."""
    p = shape.params
    out: list[tuple[int, ...]] = []
    for k in shape.linears:
        out.extend([(k.out_features, k.in_features)] * k.count)
    if p.embed:
        out.append((shape.vocab, p.embed // shape.vocab))
    if p.lm_head:
        out.append((shape.vocab, p.lm_head // shape.vocab))
    for n in (p.per_layer_embed, p.experts, p.other):
        if n:
            out.append((n,))
    if include_towers:
        for k in shape.tower_linears:
            out.extend([(k.out_features, k.in_features)] * k.count)
        if p.towers - p.tower_linear:
            out.append((p.towers - p.tower_linear,))
    return tuple(out)


def _sharding_line(shape: ModelShape, run: Settings, wbytes: int) -> str:
    """Ranks, nodes and what each rank holds (docs/memory.md, measured in docs/benchmarks.md)."""
    n, nodes = run.num_gpus, max(1, run.num_nodes)
    where = f"{n} GPUs" + (f" on {nodes} nodes ({-(-n // nodes)} per node)" if nodes > 1 else "")
    frac = f"1/{n}"
    p = shape.params
    root = p.embed + p.per_layer_embed + p.lm_head
    unit = "the tied embedding / lm_head" if p.lm_head == 0 else "the embedding and the lm_head"
    unit += f" unit ({gib(root * (4 if run.method == 'qlora' else wbytes))})"
    grad_whole = "; its gradient exists whole on every rank until its reduce-scatter" if run.method == "full" else ""
    if run.zero_stage >= 3:
        name = "FSDP FULL_SHARD (ZeRO-3)" if run.fsdp else "ZeRO-3 / FSDP FULL_SHARD"
        return (f"{where}, {name}: each rank holds {frac} of the weights, gradients and optimizer states, and gathers "
                f"{unit} whole from its forward to its backward{grad_whole}")
    if run.zero_stage == 2 and run.fsdp:
        return (f"{where}, FSDP SHARD_GRAD_OP (ZeRO-2): each rank holds {frac} of the weights at rest, of the gradients "
                f"and optimizer states; every unit stays gathered from its forward to its backward, {unit} "
                f"until its own{grad_whole}")
    if run.zero_stage == 2:
        return (f"{where}, ZeRO-2: each rank holds all the weights, {frac} of the gradients and optimizer states"
                + (f"; the gradient of {unit} exists whole until it is reduced" if run.method == "full" else ""))
    if run.zero_stage == 1:
        return f"{where}, ZeRO-1: each rank holds all the weights and gradients, {frac} of the optimizer states"
    return f"{where}, DDP: each rank holds all the weights, gradients and optimizer states"


def with_sources(p: MemoryPlan, shape: ModelShape, sources: tuple[tuple[str, str], ...], gpu_bytes: int | None,
                 gpu_name: str | None) -> MemoryPlan:
    """``p`` with its run's ``sources`` and the assumptions of ``plan(shape, that run, gpu_bytes, gpu_name)``, the rest
    of ``p`` kept. plan() reads the sources only for its first assumption lines (_assumptions), so for a plan as plan()
    made it (it marks how many lines those are) only they are made again; any other plan is planned anew."""
    run = frozen.replace(p.settings, sources=sources)
    if p.__dict__.get("_source_lines") is None or p.shape != shape or (run.eval_batch and any(
            run.source(k) != p.settings.source(k) for k in ("eval_batch", "keeps_predictions", "eval_accumulation"))):
        # (the evaluation's notes, after the first lines, read those three sources)
        return replace(p, settings=run, assumptions=plan(shape, run, gpu_bytes, gpu_name).assumptions)
    if sources == p.settings.sources and not p.__dict__.get("_notes"):
        return p  # plan()'s own for these very sources: nothing to make again
    return _relabelled(p, shape, run)


def _relabelled(p: MemoryPlan, shape: ModelShape, run: Settings) -> MemoryPlan:
    """``p`` (plan()'s own of ``shape``: marked) as plan() makes it for ``run``, a run of the same bytes: only its first
    assumption lines are made again (they name the run's settings and their sources); marked as plan()'s own."""
    lines = p.__dict__["_source_lines"]
    own = len(p.assumptions) - p.__dict__.get("_notes", 0)  # without the notes a caller added (with_notes)
    wbytes = DTYPE_BYTES.get(run.deepspeed_cast() or run.load_dtype, 2)  # as plan() weighs the towers
    towers = shape.params.towers if run.text_only else 0
    made = frozen.replace(p, settings=run,
                          assumptions=tuple(_assumptions(shape, run, towers, wbytes)) + p.assumptions[lines:own])
    object.__setattr__(made, "_source_lines", lines)
    return made


def with_notes(p: MemoryPlan, notes: tuple[str, ...]) -> MemoryPlan:
    """``p`` with ``notes`` after its assumptions (a caller's own, such as the GPU's note), which with_sources leaves
    out of the plan it makes again: a plan plan() made stays one whose sources are relabelled without planning."""
    made = frozen.replace(p, assumptions=p.assumptions + notes)
    if "_source_lines" in p.__dict__:
        object.__setattr__(made, "_source_lines", p.__dict__["_source_lines"])
        object.__setattr__(made, "_notes", p.__dict__.get("_notes", 0) + len(notes))
    return made


def _assumptions(shape: ModelShape, run: Settings, towers: int, wbytes: int) -> list[str]:
    out = [f"parameter counts from {shape.source}"]
    loaded = dict(run.sources).get("load_dtype") if run.method != "qlora" else None
    # A load dtype the trainer fixes (TRL's float32 default) has its own source: the precision's is not the load's.
    precision = (f"{run.precision} ({run.source('precision')}), weights loaded in {run.load_dtype}" if loaded else
                 f"{run.precision}, weights loaded in {run.load_dtype}")
    for name, what in (("method", f"method {run.method}"), ("batch_size", f"batch size {run.batch_size}"),
                       ("seq_len", f"sequence length {run.seq_len}"),
                       ("gradient_checkpointing", "gradient checkpointing " + ("on" if run.gradient_checkpointing else "off")),
                       ("optimizer", f"optimizer {run.optimizer}"), ("precision", precision)):
        src = loaded if name == "precision" and loaded else run.source(name)
        out.append(f"{what} ({src})")
    if run.method != "full":
        targets = ", ".join(run.lora_targets) if isinstance(run.lora_targets, tuple) else run.lora_targets
        out.append(f"LoRA rank {run.lora_r} on {targets} ({run.source('lora')}); adapters train in fp32 (PEFT >= 0.12)")
    if run.task in PAIRED_TASKS:
        out.append(f"{run.task}: chosen and rejected answers in one pass (twice the sequences per batch)")
    if towers and run.text_only:
        out.append(f"text-only training: the vision/audio towers ({towers:,} parameters, {gib(towers * wbytes)}) are loaded "
                   "for nothing and get no gradient; load the text model alone to save them")
    if run.liger_dpo_loss:
        out.append(f"Liger's fused DPO loss ({run.source('liger_dpo_loss')}): the logits of {LIGER_DPO_PAIRS} "
                   "chosen/rejected pair at a time, never the whole batch's")
    if run.chunked_loss:
        out.append(f"log-probs in chunks ({run.source('chunked_loss')}): one {TRL_TOKEN_CHUNK} x {TRL_VOCAB_CHUNK} fp32 "
                   "tile of logits at a time, never the b*s*V logits")
    out.append(f"attention {run.attention}" + (" (the s x s scores are materialised)" if run.attention == "eager" else
                                                 " (no s x s scores kept)"))
    if run.device == "cuda":
        out.append(f"CUDA context and kernels {gib(CUDA_CONTEXT_BYTES)} + {CUDA_ALLOCATOR_SLACK:.0%} caching-allocator slack "
                   "(not measured by gemma-doctor yet: the GPU rows of docs/benchmarks.md are pending)")
    if run.num_gpus > 1:
        out.append(_sharding_line(shape, run, wbytes))
    if run.optimizer.startswith("paged"):
        out.append("paged optimizer: states can be evicted to CPU memory under pressure; planned as resident")
    if run.task == "ppo":
        out.append(f"{run.task}: generation (KV cache, a vLLM engine) and value/reward models are not planned")
    return out


# --- choosing a run that fits --------------------------------------------------------------------

@dataclass(frozen=True)
class Choice:
    """The cheapest run that fits, how it was found, or the smallest common GPU where one does."""

    plan: MemoryPlan | None  # the chosen run (None when no GPU memory is known)
    fits: bool
    tried: tuple[MemoryPlan, ...] = ()
    smallest_gpu: str | None = None  # where nothing fits here: the smallest common GPU where a run does
    smallest_gpu_plan: MemoryPlan | None = None
    reason: str = ""

    def to_json(self) -> dict[str, Any]:
        """The `choice` block of a memory plan."""
        return {"fits": self.fits, "reason": self.reason, "smallest_gpu": self.smallest_gpu,
                "smallest_gpu_plan": self.smallest_gpu_plan.summary() if self.smallest_gpu_plan else None,
                "tried": [p.summary() for p in self.tried]}


# The largest per-device batch tried below the effective batch itself: halvings above it are skipped, so a config's
# batch of 10**60 gives a dozen candidates, not two hundred (every search is bounded whatever the numbers).
MAX_TRIED_BATCH = 1024


def batch_sizes(target: int) -> list[int]:
    """Per-device batch sizes from ``target`` down, halving (the memory search's and the decision's order); at most
    12: ``target``, then its halvings from MAX_TRIED_BATCH down."""
    target = max(1, target)
    out, b = [target], target // 2
    while b > MAX_TRIED_BATCH:
        b //= 2
    while b >= 1:
        out.append(b)
        b //= 2
    return out


def choose(shape: ModelShape, base: Settings, gpu_bytes: int | None, methods: tuple[str, ...] = METHODS,
           batch_fixed: bool = False, ckpt_fixed: bool = False, gpu_name: str | None = None,
           bf16_elsewhere: bool = True) -> Choice:
    """The cheapest method (full, then LoRA, then QLoRA) with the largest batch that fits; gradient accumulation
    keeps the effective batch. Without checkpointing first at the full batch, then with it from the full batch down.
    Where nothing fits, the smallest of COMMON_GPUS where something does (bf16 where that GPU has it)."""
    if not gpu_bytes:
        p = plan(shape, base, None, gpu_name)
        return Choice(p, False, (p,), reason="the GPU's memory is not known (pass --gpu-memory or a --gpu with one size)")
    found, tried = _search(shape, base, gpu_bytes, methods, batch_fixed, ckpt_fixed, gpu_name)
    if found is not None:
        return Choice(found, True, tuple(tried), reason=f"cheapest run that fits: {found.summary()}")
    from gemma_doctor.gpus import common_training_gpus

    for g in common_training_gpus():
        name, size, native = g.name, g.memory_bytes, g.native_bf16
        if size <= gpu_bytes:
            continue
        alt = base
        if native and bf16_elsewhere and base.precision == "fp32":
            alt = replace(base, precision="bf16", load_dtype="bfloat16")
        elif not native and base.precision == "bf16":
            # bf16 there is GD603: that GPU trains in fp32, as --gpu with its name plans it.
            alt = replace(base, precision="fp32", load_dtype=load_dtype_for("fp32", base.method))
        other, _ = _search(shape, alt, size, methods, batch_fixed, ckpt_fixed, name)
        if other is not None:
            return Choice(tried[-1] if tried else None, False, tuple(tried), smallest_gpu=name, smallest_gpu_plan=other,
                          reason=f"nothing fits in {gib(gpu_bytes)}; the smallest common GPU where a run fits: {name} "
                                 f"({other.summary()})")
    return Choice(tried[-1] if tried else None, False, tuple(tried),
                  reason=f"nothing fits in {gib(gpu_bytes)}, nor on one {common_training_gpus()[-1].name}: shard over several GPUs "
                         "(ZeRO-3 / FSDP)")


def _load_for(base: Settings, method: str) -> str:
    """The dtype ``method`` loads the weights in: the precision's (load_dtype_for), unless --precision or the trainer
    fixed it (TRL's float32 default, a config's dtype: runplan.trainer_defaults), which QLoRA's quantized load is not."""
    if base.source("precision") == "option" or (method != "qlora" and "load_dtype" in dict(base.sources)):
        return base.load_dtype
    return load_dtype_for(base.precision, method)


def _search(shape: ModelShape, base: Settings, gpu_bytes: int, methods: tuple[str, ...], batch_fixed: bool,
            ckpt_fixed: bool, gpu_name: str | None) -> tuple[MemoryPlan | None, list[MemoryPlan]]:
    tried: list[MemoryPlan] = []
    target = base.batch_size * base.gradient_accumulation_steps
    for method in methods:
        run = replace(base, method=method, quant_bits=(base.quant_bits or 4) if method == "qlora" else None,
                      load_dtype=_load_for(base, method))
        options: list[tuple[bool, int]] = []
        ckpts = (base.gradient_checkpointing,) if ckpt_fixed else (False, True)
        batches = [base.batch_size] if batch_fixed else batch_sizes(target)
        for ck in ckpts:
            for b in batches if ck or ckpt_fixed else batches[:1]:
                options.append((ck, b))
        last = None
        for ck, b in options:
            acc = base.gradient_accumulation_steps if batch_fixed else max(1, math.ceil(target / b))
            p = plan(shape, replace(run, gradient_checkpointing=ck, batch_size=b, gradient_accumulation_steps=acc),
                     gpu_bytes, gpu_name)
            last = p
            # A run the user fixed entirely is taken as it is when tight; a search wants headroom.
            if p.verdict == "fits" or (p.verdict == "tight" and len(options) == 1 and len(methods) == 1):
                tried.append(p)
                return p, tried
        if last is not None:
            tried.append(last)
    return None, tried

