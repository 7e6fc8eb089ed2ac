"""Where a non-finite loss or gradient of the rehearsal comes from, and which cure removes it in this stack.

Run in the child when the train stage saw a non-finite loss or gradient norm (docs/rehearsal.md, "A non-finite
gradient, taken apart"). A fresh twin (the training may have written NaN into the weights already) steps the run's own
first batches, one forward and backward each, until one is non-finite. That batch is then stepped again under each
cure that can be tried here:

- SDPA without its cuDNN kernel (on CUDA): torch's default kernel on Hopper turns a query row that attends to no key
  into NaN in the backward; transformers >= 4.53 passes such rows (a left pad before any real token) fully masked.
  Measured on an H200 (benchmarks/gpu_nan_window.py): transformers 4.52.4 clean, 4.53.0-5.17.0 NaN, cuDNN only.
- the same rows padded on the right (where the batch is padded on the left);
- eager attention.

The record says whether a fresh model reproduces it, on which batch, and which cure gave finite values: the parent
(invariants.judge_train) turns that into GD967's cure, "verified in this stack". No cure is applied to the user's run.
"""

from __future__ import annotations

import math
from typing import Any, Callable

# The model inputs of a collated batch (a collator's extra keys, e.g. TRL's completion_mask, are not the model's).
_INPUTS = ("input_ids", "attention_mask", "labels", "token_type_ids", "position_ids", "pixel_values")
LIMIT = 8  # batches of the run stepped on the fresh twin


def _step(model: Any, batch: dict[str, Any], context: Callable[[], Any] | None = None) -> dict[str, Any]:
    """One forward + backward: the loss and the squared gradient norm, or the error's line."""
    import contextlib

    import torch

    model.zero_grad(set_to_none=True)
    try:
        with (context() if context else contextlib.nullcontext()):
            loss = model(**batch, use_cache=False).loss
            loss.backward()
    except Exception as e:  # noqa: BLE001 - a cure that cannot run here is a result, not the rehearsal's crash
        return {"finite": None, "error": f"{type(e).__name__}: {(str(e).strip().splitlines() or [''])[0][:200]}"}
    sq = sum(float(p.grad.detach().float().pow(2).sum()) for p in model.parameters() if p.grad is not None)
    value = float(loss.detach().float())
    return {"finite": math.isfinite(value) and math.isfinite(sq), "loss": value,
            "grad_norm": math.sqrt(sq) if math.isfinite(sq) else sq}


def left_padded(mask: Any) -> bool:
    """A row whose first position is a pad while a later one is real: the collator padded on the left."""
    return bool(((mask[:, 0] == 0) & (mask.sum(dim=1) > 0)).any())


def right_padded(batch: dict[str, Any]) -> dict[str, Any]:
    """The same rows with their pads moved to the end (each row's real tokens in order)."""
    import torch

    mask = batch["attention_mask"]
    out = {k: v.clone() for k, v in batch.items()}
    for r in range(mask.shape[0]):
        order = torch.cat([torch.nonzero(mask[r] != 0).flatten(), torch.nonzero(mask[r] == 0).flatten()])
        for k in ("input_ids", "attention_mask", "labels", "token_type_ids"):
            if k in out and out[k].dim() == 2 and out[k].shape == mask.shape:
                out[k][r] = batch[k][r][order]
    return out


def _no_cudnn() -> Any:
    from torch.nn.attention import SDPBackend, sdpa_kernel

    return sdpa_kernel([SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH])


def diagnose(batches: list[dict[str, Any]], fresh: Callable[[str | None], Any], device: str) -> dict[str, Any]:
    """Step ``batches`` on ``fresh(None)`` (a new twin as the run loads it) until one is non-finite, then that batch
    under each cure (``fresh("eager")``: the twin with eager attention)."""
    model = fresh(None)
    model.train()
    attention = getattr(model.config, "_attn_implementation", None)
    found, first, error = None, None, None
    for i, batch in enumerate(batches[:LIMIT]):
        got = _step(model, batch)
        error = error or got.get("error")
        if got["finite"] is False:
            found, first = i, got
            break
    record: dict[str, Any] = {"device": device, "attention": attention, "stepped": min(len(batches), LIMIT),
                              "reproduced": found is not None}
    if error:  # a batch the fresh twin could not step: the diagnosis is then no evidence either way
        record["error"] = error
    if found is None:
        return record
    batch = batches[found]
    mask = batch.get("attention_mask")
    left = mask is not None and left_padded(mask)
    record.update(batch=found, as_run=first, left_padded=left,
                  pads=int((mask == 0).sum()) if mask is not None else 0, dtype=str(next(model.parameters()).dtype))
    cures: dict[str, dict[str, Any]] = {}
    if device == "cuda" and attention == "sdpa":
        cures["SDPA without the cuDNN kernel"] = _step(model, batch, _no_cudnn)
    if left:
        cures["padding on the right"] = _step(model, right_padded(batch))
    del model
    if attention != "eager":
        eager = fresh("eager")
        eager.train()
        cures["eager attention"] = _step(eager, batch)
    record["cures"] = cures
    return record


def of_run(run: Any) -> dict[str, Any]:
    """diagnose() for a driver Run whose train stage met a non-finite value: its trainer's own first batches, a fresh
    twin loaded as the run loads it (``run._load_model``), its device."""
    import torch

    batches = []
    for i, b in enumerate(run.trainer.get_train_dataloader()):
        if i >= LIMIT:
            break
        batches.append({k: v.to(run.device) for k, v in b.items() if k in _INPUTS and torch.is_tensor(v)})
    return diagnose(batches, lambda attn: run._load_model(run.plan["repo_id"], attn).to(run.device), run.device)
