"""DoctorCallback: `prepare()` run by the Trainer itself. Importing this module imports transformers."""

from __future__ import annotations

from typing import Any

from transformers import TrainerCallback

from gemma_doctor.api import ON_MISMATCH, check_gpu, prepare


class DoctorCallback(TrainerCallback):
    """Runs gemma_doctor.prepare() on the Trainer's model when the Trainer is built and again when training begins.

    Pass it as ``Trainer(..., callbacks=[DoctorCallback()])``: its ``on_init_end`` then guards the model
    before a first ``trainer.evaluate()``. Added later with ``trainer.add_callback``, it only acts at
    ``on_train_begin``; call ``gemma_doctor.prepare(model, args)`` yourself before evaluating first.
    """

    def __init__(self, on_mismatch: str = "raise", gpu: str | None = None, text_only: bool = False) -> None:
        if on_mismatch not in ON_MISMATCH:
            raise ValueError(f"on_mismatch must be one of {', '.join(ON_MISMATCH)}, not {on_mismatch!r}")
        check_gpu(gpu)
        self.on_mismatch = on_mismatch
        self.gpu = gpu
        self.text_only = text_only  # freeze a Gemma 4's towers (text-only training data), as prepare(text_only=True)
        self._judged: set[int] = set()

    def _guard(self, args: Any, model: Any) -> None:
        if model is None:
            return
        # use_cache is switched off every time (a model_init may have built a new model); the precision
        # verdict is given once per model so a warning is not repeated at train begin.
        first = id(model) not in self._judged
        self._judged.add(id(model))
        prepare(model, args, self.on_mismatch if first else "ignore", self.gpu, self.text_only)

    def on_init_end(self, args: Any, state: Any, control: Any, model: Any = None, **kwargs: Any) -> None:
        """The Trainer is built: guard the model before any evaluate() (transformers passes the model here)."""
        self._guard(args, model)

    def on_train_begin(self, args: Any, state: Any, control: Any, model: Any = None, **kwargs: Any) -> None:
        """Training starts: guard the model (again), covering callbacks added after the Trainer was built."""
        self._guard(args, model)
