"""One measured training step of the real checkpoint: peak memory, and each module's largest activation and gradient
against fp16's range.

A forward-only range check is not enough: Gemma 4's fp16 NaNs came from the backward pass with forward peaks near
350 (facts.md section 15), so every module's output gradient is measured too. torch, transformers and PEFT are
imported only inside :func:`measure_step`, which the rehearsal runs in a child process.
"""

from __future__ import annotations

import math
import os
import resource
import threading
from pathlib import Path
from typing import Any, Iterator, Mapping

from gemma_doctor.errors import DoctorError
from gemma_doctor.report import Finding, Severity

FP16_MAX = 65504.0
# LoRA targets: the text model's linear layers (a tower's projections are not trained by a text run, and PEFT refuses
# Gemma 4's clippable tower linears); the regex for models that nest a language_model, "all-linear" for the rest.
LORA_TARGETS = r".*language_model.*\.(q_proj|k_proj|v_proj|o_proj|gate_proj|up_proj|down_proj)"
_DTYPES = ("float32", "bfloat16", "float16")


class MeasureError(DoctorError):
    """The step could not be measured (no checkpoint, a dtype or device that is not there); ``str()`` is one line."""


class _RssPeak:
    """The process's resident set, sampled on a thread: its peak above the level at start (the CPU's peak memory)."""

    def __init__(self, interval: float = 0.002) -> None:
        self.interval = interval
        self.start = _rss()
        self.peak = self.start
        self._maxrss_before = _maxrss()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self.peak = max(self.peak, _rss())

    def __enter__(self) -> _RssPeak:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, _rss())
        # the kernel's own high-water mark catches a peak between two samples, when it rose above the earlier one
        maxrss = _maxrss()
        if maxrss > self._maxrss_before:
            self.peak = max(self.peak, maxrss)

    @property
    def increase(self) -> int:
        """Bytes above the resident set at start."""
        return max(0, self.peak - self.start)


def _rss() -> int:
    try:
        with open("/proc/self/statm", "rb") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return _maxrss()


def _maxrss() -> int:
    # ru_maxrss is KiB on Linux, bytes on macOS
    value = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return value if os.uname().sysname == "Darwin" else value * 1024


def _tensors(value: Any) -> Iterator[Any]:
    """Every floating tensor in a module's output (a tensor, a tuple, a ModelOutput, a cache is skipped)."""
    import torch

    if isinstance(value, torch.Tensor):
        if value.is_floating_point():
            yield value
    elif isinstance(value, (tuple, list)):
        for v in value:
            yield from _tensors(v)
    elif isinstance(value, dict):
        for v in value.values():
            yield from _tensors(v)


def _chat_rows(model_dir: Path, seq_len: int, batch: int, texts: list[str]) -> list[list[int]]:
    """Each text as a user turn and a model turn through the model's own tokenizer and chat template, repeated up to
    ``seq_len`` (the worst shape is the configured length) and cut there."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_dir)
    rows = []
    for i in range(batch):
        text = texts[i % len(texts)]
        chat = [{"role": "user", "content": text}, {"role": "assistant", "content": text}]
        try:
            ids = list(tok.apply_chat_template(chat, tokenize=True, return_dict=True)["input_ids"])
        except Exception:  # noqa: BLE001 - a tokenizer without a chat template: the plain text
            ids = list(tok(text)["input_ids"])
        if not ids:
            raise MeasureError("the tokenizer gave no tokens for the texts")
        while len(ids) < seq_len:
            ids = ids + ids
        rows.append(ids[:seq_len])
    return rows


def _inputs(model: Any, seq_len: int, batch: int, rows: list[list[int]] | None, device: Any) -> dict:
    """input_ids, attention_mask and labels: the tokenized rows, else seeded ids above Gemma's control tokens."""
    import torch

    if rows:
        input_ids = torch.tensor(rows)
    else:
        vocab = model.get_input_embeddings().weight.shape[0]
        gen = torch.Generator().manual_seed(0)
        low = min(107, max(vocab - 1, 0))
        input_ids = torch.randint(low, vocab, (batch, seq_len), generator=gen)
    input_ids = input_ids.to(device)
    return {"input_ids": input_ids, "attention_mask": torch.ones_like(input_ids), "labels": input_ids.clone()}


def _own_name(name: str) -> str:
    """A module's name in the checkpoint's model (PEFT's wrapper prefix dropped)."""
    return name.removeprefix("base_model.model.")


def measure_step(model_dir: Path, *, seq_len: int, batch: int = 1, dtype: str = "bfloat16", device: str = "auto",
                 lora: bool = True, texts: list[str] | None = None, lora_r: int = 8, lora_targets: Any = None,
                 gradient_checkpointing: bool = False, optimizer_step: bool = False) -> dict:
    """One forward + backward of the real checkpoint in ``model_dir`` at (``batch``, ``seq_len``) on ``device``; with
    ``optimizer_step`` also AdamW's step, so that the peak holds the optimizer's states as the run's first step does.
    ``lora_r`` / ``lora_targets`` (a list, a regex or "all-linear"; None: every linear of the text model) and
    ``gradient_checkpointing`` are the run's, so that the peak is the planned run's."""
    import torch
    import transformers

    model_dir = Path(model_dir)
    if not (model_dir / "config.json").is_file():
        raise MeasureError(f"{model_dir} has no config.json: not a checkpoint folder")
    if dtype not in _DTYPES:
        raise MeasureError(f"dtype {dtype!r}: one of {', '.join(_DTYPES)}")
    if seq_len < 1 or batch < 1:
        raise MeasureError(f"shape {batch} x {seq_len}: both must be at least 1")
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise MeasureError(f"device {device!r}: torch {torch.__version__} sees no CUDA device here")
    on_gpu = device.startswith("cuda")
    transformers.logging.set_verbosity_error()
    if lora:
        import peft  # noqa: F401 - imported before the meter starts: the step's memory, not the library's code
    # tokenized before the meter starts too: a 262k-token tokenizer's memory is not the training step's
    rows = _chat_rows(model_dir, seq_len, batch, texts) if texts else None

    meter = _RssPeak() if not on_gpu else None
    if on_gpu:
        torch.cuda.reset_peak_memory_stats(device)
        torch.cuda.synchronize(device)
    if meter is not None:
        meter.__enter__()
    result: dict[str, Any] = {"device": device, "dtype": dtype, "seq_len": seq_len, "batch": batch, "lora": lora,
                              "lora_r": int(lora_r) if lora else None, "gradient_checkpointing": gradient_checkpointing,
                              "optimizer_step": optimizer_step, "oom": False, "error": None}
    acts: dict[str, float] = {}
    grads: dict[str, float] = {}
    order: list[str] = []  # modules in the order their outputs were computed
    grad_order: list[str] = []
    handles = []
    try:
        try:
            model = transformers.AutoModelForCausalLM.from_pretrained(model_dir, dtype=getattr(torch, dtype))
        except ValueError:
            # encoders, classifiers, embedding models: whatever class the config names
            model = transformers.AutoModel.from_pretrained(model_dir, dtype=getattr(torch, dtype))
        model.to(device)
        if lora:
            from peft import LoraConfig, get_peft_model

            nested = any("language_model" in name for name, _ in model.named_modules())
            targets = lora_targets if lora_targets else LORA_TARGETS if nested else "all-linear"
            model = get_peft_model(model, LoraConfig(r=int(lora_r), lora_alpha=2 * int(lora_r), target_modules=targets))
        if gradient_checkpointing:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
            if lora:
                model.enable_input_require_grads()
        model.train()

        def forward_hook(name: str):
            def hook(_module: Any, _inputs: Any, output: Any) -> None:
                peak = acts.get(name, 0.0)
                for t in _tensors(output):
                    peak = _worse(peak, _absmax(t))
                    if t.requires_grad:
                        t.register_hook(grad_hook(name))
                acts[name] = peak
                order.append(name)
            return hook

        def grad_hook(name: str):
            def hook(grad: Any) -> None:
                if grad is not None:
                    grads[name] = _worse(grads.get(name, 0.0), _absmax(grad))
                    grad_order.append(name)
            return hook

        for name, module in model.named_modules():
            if name:
                handles.append(module.register_forward_hook(forward_hook(name)))
        batch_inputs = _inputs(model, seq_len, batch, rows, device)
        out = model(**batch_inputs)
        loss = out.loss
        loss.backward()
        result["loss"] = float(loss.detach().float())
        del out, loss
        if optimizer_step:
            for h in handles:  # the step's activations and gradients are measured; the optimizer's are not modules'
                h.remove()
            handles = []
            trainable = [p for p in model.parameters() if p.requires_grad]
            torch.optim.AdamW(trainable, lr=0.0).step()
        result["trainable_params"] = sum(p.numel() for p in model.parameters() if p.requires_grad)
    except torch.cuda.OutOfMemoryError as e:
        result.update(oom=True, error=str(e).strip().splitlines()[0][:300])
    finally:
        for h in handles:
            h.remove()
        if meter is not None:
            meter.__exit__(None, None, None)
    if on_gpu:
        torch.cuda.synchronize(device)
        props = torch.cuda.get_device_properties(device)
        result.update(peak_bytes=int(torch.cuda.max_memory_allocated(device)), peak_source="cuda.max_memory_allocated",
                      device_bytes=int(props.total_memory), gpu=str(props.name),
                      compute_capability=f"{props.major}.{props.minor}")
    else:
        assert meter is not None
        result.update(peak_bytes=meter.increase, peak_source="rss")
    names = list(dict.fromkeys(order + grad_order))
    result["modules"] = [{"name": _own_name(n), "act_absmax": acts.get(n), "grad_absmax": grads.get(n),
                          "nonfinite": not all(math.isfinite(v) for v in (acts.get(n, 0.0), grads.get(n, 0.0)))}
                         for n in names]
    values = list(acts.values()) + list(grads.values())
    result["act_absmax"] = max(acts.values(), default=None)
    result["grad_absmax"] = max(grads.values(), default=None)
    loss_value = result.get("loss")
    result["nonfinite"] = not all(math.isfinite(v) for v in values) or (
        loss_value is not None and not math.isfinite(loss_value))
    # the first module, in the order the step computed them (forward, then backward), past fp16's largest value (an
    # infinity or NaN counts: in fp16 an overflow shows as one)
    first = next((n for n in order if acts.get(n, 0.0) > FP16_MAX), None)
    if first is None:
        first = next((n for n in grad_order if grads.get(n, 0.0) > FP16_MAX), None)
    result["first_overflow"] = _own_name(first) if first else None
    result["fp16_overflow"] = first is not None
    top = max(values, default=0.0)
    # how many times the largest value fits in fp16's range (0 when something is not finite, None when nothing ran)
    result["fp16_headroom"] = FP16_MAX / top if top > 0 else None
    return result


def _absmax(t: Any) -> float:
    """The largest |value| of ``t``; infinity when it holds an infinity or a NaN (NaN would compare as nothing)."""
    if not t.numel():
        return 0.0
    value = float(t.detach().abs().amax())
    return value if math.isfinite(value) else math.inf


def _worse(a: float, b: float) -> float:
    return a if a >= b else b


def _gib(n: float) -> str:
    return f"{n / 2**30:.2f} GiB"


def judge(measure: Mapping[str, Any], *, plan_bytes: int | None = None, device_bytes: int | None = None,
          train_dtype: str | None = None) -> tuple[Finding, ...]:
    """Findings GD980-GD985 from one measure_step result (pure: no torch): the fp16 answer follows the measurement,
    the memory plan is held against the measured peak. ``train_dtype``: the precision the run is configured with."""
    out: list[Finding] = []
    shape = f"{measure.get('batch')} x {measure.get('seq_len')} tokens, {measure.get('dtype')}, on {measure.get('device')}"
    details = {k: measure.get(k) for k in ("device", "dtype", "seq_len", "batch", "lora", "peak_bytes", "peak_source",
                                           "act_absmax", "grad_absmax", "first_overflow", "fp16_headroom")}
    if measure.get("oom"):
        out.append(Finding("GD984", Severity.ERROR, f"one training step of the real weights ({shape}) ran out of "
                           f"device memory: {measure.get('error')}", fix="a shorter sequence, a smaller batch with "
                           "gradient accumulation, LoRA, gradient checkpointing, or a larger GPU", details=details))
        return tuple(out)
    if measure.get("nonfinite"):
        out.append(Finding("GD981", Severity.ERROR, f"the real weights give non-finite values in one training step "
                           f"({shape}), first in {measure.get('first_overflow') or 'the loss'}",
                           fix="train in bfloat16 or float32; check the checkpoint with `check --weights`",
                           details=details))
    if measure.get("fp16_overflow"):
        severity = Severity.ERROR if train_dtype in ("float16", "fp16") else Severity.WARNING
        top = max(measure.get("act_absmax") or 0.0, measure.get("grad_absmax") or 0.0)
        out.append(Finding("GD980", severity, f"measured with the real weights: {measure.get('first_overflow')} "
                           f"reaches {top:.4g}, past fp16's largest value 65504 ({shape}): fp16 training overflows",
                           fix="train in bfloat16 (or float32); not fp16", details=details))
    elif measure.get("fp16_headroom") is not None and not measure.get("nonfinite"):
        headroom = float(measure["fp16_headroom"])
        out.append(Finding("GD985", Severity.INFO, f"measured with the real weights: the largest activation or "
                           f"gradient is {65504 / headroom:.4g}, {headroom:.3g}x below fp16's largest value ({shape})",
                           details=details))
    peak = measure.get("peak_bytes")
    if isinstance(peak, int) and device_bytes and peak > device_bytes:
        out.append(Finding("GD982", Severity.ERROR, f"one training step of the real weights peaked at {_gib(peak)} "
                           f"({measure.get('peak_source')}), more than the device's {_gib(device_bytes)} ({shape})",
                           fix="a shorter sequence, a smaller batch, LoRA or QLoRA, or a larger GPU", details=details))
    elif isinstance(peak, int) and plan_bytes and peak > 1.10 * plan_bytes:
        out.append(Finding("GD983", Severity.WARNING, f"one training step of the real weights peaked at "
                           f"{_gib(peak)} ({measure.get('peak_source')}), {peak / plan_bytes:.2f}x the memory plan's "
                           f"{_gib(plan_bytes)} ({shape})", fix="trust the measurement: leave room for it, or lower the "
                           "sequence length or batch", details=details))
    return tuple(out)


__all__ = ["FP16_MAX", "MeasureError", "judge", "measure_step"]
