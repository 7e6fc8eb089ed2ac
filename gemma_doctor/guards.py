"""Guards prepare() applies to a loaded Gemma 4 model: non-reentrant checkpointing where KV is shared, frozen towers
for text-only training. torch/transformers are never imported here; the model brings them along."""

from __future__ import annotations

import functools
from typing import Any

# Why reentrant checkpointing is refused on KV-shared models (docs/findings.md GD130): from transformers 5.5.2 the
# producer layers hand their K/V to the shared layers through a side dict; under reentrant checkpointing the first
# forward runs under no_grad and the consumers read detached tensors, so no gradient from the shared layers reaches
# the producers' k_proj/v_proj or anything below them (loss unchanged; gradient cosine 0.83-0.89 on a tiny model,
# 0.14-0.55 on gemma-4-E2B-it per unsloth-zoo #813).


def kv_shared_layers(model: Any) -> int:
    """num_kv_shared_layers of the model's text config (0 when it has none)."""
    cfg = getattr(model, "config", None)
    for c in (getattr(cfg, "text_config", None), cfg):
        value = getattr(c, "num_kv_shared_layers", None)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    return 0


def _arg(training_args: Any, key: str) -> Any:
    if isinstance(training_args, dict):
        return training_args.get(key)
    return getattr(training_args, key, None)


def non_reentrant_checkpointing(model: Any, training_args: Any = None) -> tuple[str, ...]:
    """On a KV-shared model, turn every reentrant checkpointing setting non-reentrant; returns what it changed.

    Both places are mended: the training arguments (the Trainer enables checkpointing from them when train()
    starts) and the model's layers, if checkpointing is already on (the partial transformers stores keeps its
    other arguments, so offloading and every_n_layers stay as they were).
    """
    if not kv_shared_layers(model):
        return ()
    changed: list[str] = []
    # transformers 5.23 renamed gradient_checkpointing_kwargs to activation_checkpointing_kwargs (the old name is a
    # deprecated alias of the same value): both are read and mended.
    for key in ("activation_checkpointing_kwargs", "gradient_checkpointing_kwargs"):
        kwargs = _arg(training_args, key)
        if isinstance(kwargs, dict) and kwargs.get("use_reentrant") is True:
            new = {**kwargs, "use_reentrant": False}
            if isinstance(training_args, dict):
                training_args[key] = new
            else:
                setattr(training_args, key, new)
            changed.append(f"training_args.{key}.use_reentrant")
    named = getattr(model, "named_modules", None)
    layers = 0
    for _, module in (named() if callable(named) else ()):
        func = module.__dict__.get("_gradient_checkpointing_func")
        if isinstance(func, functools.partial) and func.keywords.get("use_reentrant") is True:
            module._gradient_checkpointing_func = functools.partial(func.func, *func.args,
                                                                    **{**func.keywords, "use_reentrant": False})
            layers += 1
    if layers:
        changed.append(f"model: {layers} checkpointed modules use_reentrant=False")
    return tuple(changed)


# The Gemma 4 modules a text-only batch never reaches (every one of their parameters has grad None after backward,
# transformers 5.5.0-5.23.0, research/gemma4 repro_e): the towers and their projections into the text model.
TOWER_MODULES = ("vision_tower", "audio_tower", "embed_vision", "embed_audio")


def freeze_towers(model: Any) -> tuple[str, ...]:
    """Stop gradients to the vision/audio towers of a Gemma 4 model; returns the modules frozen (with counts).

    Safe only for text-only training, which is why prepare() does it only when asked (text_only=True): such a batch
    gives those parameters no gradient anyway, so freezing changes no update, and DDP no longer waits for them.
    """
    counts: dict[str, int] = {}
    named = getattr(model, "named_parameters", None)
    for name, param in (named() if callable(named) else ()):
        parts = name.split(".")
        hit = next((p for p in parts if p in TOWER_MODULES), None)
        if hit is not None and getattr(param, "requires_grad", False):
            param.requires_grad_(False)
            counts[hit] = counts.get(hit, 0) + 1
    return tuple(f"{k}: {n} parameters frozen" for k, n in counts.items())
