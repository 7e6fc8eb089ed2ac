"""The gradient accumulation check (issue 34; docs/rehearsal.md, "Gradient accumulation"): runs in the child only.

One optimizer step of the user's trainer, built as the driver builds it (gemma_doctor/rehearse/driver.py), twice on a
fresh twin each time: b x k accumulated micro-batches, then one batch of b*k, the same rows, the same seed, learning
rate 0 (nothing moves), no dropout (the driver's LoRA has none; the twins' configs have none). The trainer's own
logged loss and gradient norm (before clipping) of the two steps go to the events file as the "accumulation" stage;
invariants.judge_accumulation compares them (ACCUMULATION_RTOL). A loss scaled by the accumulation steps, as in
GD739's window (Gemma 3's multimodal class under the Trainer, transformers before 4.57), shows as a ratio of k.
"""

from __future__ import annotations

from typing import Any, Callable

MICRO = 1  # b: one row per micro-batch, the cheapest split that accumulation changes
MAX_K = 4


class _Quiet:
    """Events that go nowhere: the two probe runs' own load and setup are not stages of the rehearsal."""

    def write(self, stage: str, status: str, **data: Any) -> None:
        """Drop the record."""


def steps_of(accumulation: Any) -> int:
    """k: the run's own accumulation steps, at least 2 (else nothing is accumulated) and at most MAX_K."""
    k = accumulation if isinstance(accumulation, int) and not isinstance(accumulation, bool) else 0
    return min(max(k, 2), MAX_K)


def _one_step(run: Any, micro: int, k: int, setup: Callable[[Any], None]) -> dict[str, Any] | None:
    """The logged loss and gradient norm of one optimizer step of micro x k rows through the run's trainer; None
    when the run's data has fewer rows."""
    import torch

    raw = {**(run.plan.get("raw") or {}), "per_device_train_batch_size": micro, "gradient_accumulation_steps": k,
           "learning_rate": 0.0, "warmup_steps": 0, "warmup_ratio": 0.0, "seed": 0}
    sub = type(run)({**run.plan, "raw": raw, "steps": 1, "workdir": str(run.work / f"accumulation-{micro}x{k}")}, _Quiet())
    # A head the checkpoint lacks (a reward model's score head) is drawn at load: the same in both runs too.
    torch.manual_seed(0)
    sub.load()
    torch.manual_seed(0)  # the LoRA matrices the trainer (or the driver) creates are the same in both runs
    setup(sub)
    return logged_step(sub.trainer, micro * k)


def logged_step(trainer: Any, n: int) -> dict[str, Any] | None:
    """The logged loss and gradient norm (before clipping) of ``trainer``'s one optimizer step over the first ``n`` of
    its training rows; None when it has fewer rows."""
    import transformers

    rows = trainer.train_dataset
    if rows is None or not hasattr(rows, "__len__") or len(rows) < n:
        return None
    trainer.train_dataset = rows.select(range(n)) if hasattr(rows, "select") else rows[:n]
    logged: dict[str, Any] = {}

    class Log(transformers.TrainerCallback):
        def on_log(self, args: Any, state: Any, control: Any, logs: Any = None, **kw: Any) -> None:
            if logs and "loss" in logs and not logged:
                logged.update(loss=float(logs["loss"]), grad_norm=logs.get("grad_norm"))

    trainer.add_callback(Log())
    trainer.train()
    return logged


def record(events: Any, k: int, accumulated: dict[str, Any] | None, whole: dict[str, Any] | None,
           ranks: int = 1) -> None:
    """The "accumulation" stage's record of the two steps (judged by the parent: invariants.judge_accumulation)."""
    if accumulated is None or whole is None:
        # Too few rows is the data's size, not a failure of the run: said, not judged.
        on = f" ({MICRO * k} on each of {ranks} ranks)" if ranks > 1 else ""
        events.write("accumulation", "skipped", reason=f"the check needs {MICRO * k * ranks} training rows{on}")
        return
    grad = {f"{name}_grad_norm": float(got["grad_norm"]) if got.get("grad_norm") is not None else None
            for name, got in (("accumulated", accumulated), ("whole", whole))}
    extra = {"ranks": ranks} if ranks > 1 else {}
    events.write("accumulation", "ok", micro=MICRO, k=k, accumulated_loss=accumulated.get("loss"),
                 whole_loss=whole.get("loss"), **grad, **extra)


def check_launched(trainer: Any, copy: Callable[[int, int], Any], events: Any, ranks: int = 1) -> None:
    """b x k against one batch of b*k on a launched script's own Trainer (hook/probe.py): ``copy(micro, k)`` builds
    the script's trainer again, from its own constructor arguments and model, at that batch and accumulation.

    On ``ranks`` processes that each hold the whole model (DDP) every rank runs this in step: each optimizer step
    takes b*k rows on every rank (its own, as the run's sampler deals them), so both steps see the same b*k*ranks rows;
    the gradient is averaged over the ranks and the loss the Trainer logs is the mean over them, in both steps alike."""
    k = steps_of(getattr(trainer.args, "gradient_accumulation_steps", None))
    n = MICRO * k * ranks
    accumulated = logged_step(copy(MICRO, k), n)
    whole = logged_step(copy(MICRO * k, 1), n) if accumulated is not None else None
    record(events, k, accumulated, whole, ranks)


def check(run: Any, setup: Callable[[Any], None]) -> None:
    """b x k against one batch of b*k: the "accumulation" stage's record (judged by the parent)."""
    from gemma_doctor.rehearse.preference import NOT_ACCUMULABLE

    if run.plan["trainer"] in NOT_ACCUMULABLE:
        run.events.write("accumulation", "skipped", reason=NOT_ACCUMULABLE[run.plan["trainer"]])
        return
    k = steps_of(run.s.get("accumulation"))
    accumulated = _one_step(run, MICRO, k, setup)
    whole = _one_step(run, MICRO * k, 1, setup) if accumulated is not None else None
    record(run.events, k, accumulated, whole)
