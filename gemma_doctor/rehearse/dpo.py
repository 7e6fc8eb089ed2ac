"""A TRL DPO run in the rehearsal (`rehearse --launch "trl dpo --config FILE"`): runs in the child only.

The setup stage builds TRL's DPOTrainer with a DPOConfig of the user's keys (capped as the driver caps every run), on
the first rows of the user's local preference dataset, else synthetic preference rows in TRL's conversational format
(prompt / chosen / rejected message lists). The other stages are the driver's (gemma_doctor/rehearse/driver.py), but
labels: a preference batch holds chosen and rejected completions, no labels to read.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

REJECTED = "I would rather not say."


def rows(run: Any) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(train rows, eval rows): the user's local dataset's first rows, else synthetic conversational preferences."""
    from gemma_doctor.rehearse.rows import ROWS, _read_rows

    path = run.s.get("dataset")
    if path:
        got = _read_rows(Path(path), 12)
        if got:
            return got[:8], got[8:] or got[:2]
    made = [{"prompt": [{"role": "user", "content": q}], "chosen": [{"role": "assistant", "content": a}],
             "rejected": [{"role": "assistant", "content": REJECTED}]} for q, a in ROWS]
    return made[:6], made[6:]


def setup(run: Any) -> None:
    """DPOTrainer from the user's DPOConfig keys, LoRA through peft_config (the base with the adapter off is then
    the reference model, as TRL does)."""
    from datasets import Dataset
    from trl import DPOConfig, DPOTrainer

    train, evaluation = rows(run)
    args = run._args(DPOConfig, run.work / "run")
    run.trainer = DPOTrainer(model=run.model, args=args, train_dataset=Dataset.from_list(train),
                             eval_dataset=Dataset.from_list(evaluation), processing_class=run.tokenizer,
                             peft_config=run._lora())
    run.model = run.trainer.model
    trainable = sum(p.numel() for p in run.model.parameters() if p.requires_grad)
    run.events.write("setup", "ok", trainer=type(run.trainer).__name__, trainable=trainable, notes=run.notes)


def labels(run: Any) -> None:
    """The first preference batch through the trainer's own collator (a crash is the labels stage's); no labels."""
    batch = next(iter(run.trainer.get_train_dataloader()))
    run.events.write("labels", "skipped", reason="a preference batch (chosen / rejected): no labels to read",
                     keys=sorted(batch.keys()))
