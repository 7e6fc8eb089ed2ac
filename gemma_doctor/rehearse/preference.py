"""TRL's preference trainers in the rehearsal: DPO (`rehearse --launch "trl dpo --config FILE"`, `rl: dpo`), KTO
(`trl kto --config FILE`, `rl: kto`) and ORPO (`rl: orpo`, TRL's experimental ORPOTrainer); runs in the child only.

The setup stage builds the run's own TRL trainer with its config class of the user's keys (capped as the driver caps
every run), on the first rows of the user's local dataset, else synthetic rows in TRL's conversational format: prompt /
chosen / rejected message lists for DPO and ORPO, prompt / completion / label (unpaired, desirable or not) for KTO.
The other stages are the driver's (gemma_doctor/rehearse/driver.py), but labels: a preference batch holds completions
to compare, no labels to read.
"""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import Any, Callable

REJECTED = "I would rather not say."


def _pairs(rows: list[tuple[str, str]]) -> list[dict[str, Any]]:
    return [{"prompt": [{"role": "user", "content": q}], "chosen": [{"role": "assistant", "content": a}],
             "rejected": [{"role": "assistant", "content": REJECTED}]} for q, a in rows]


def _unpaired(rows: list[tuple[str, str]]) -> list[dict[str, Any]]:
    """KTO's rows: each answer once as desirable and the refusal once as undesirable, interleaved, so every batch of
    two or more holds both kinds (KTO weighs the two against each other)."""
    out = []
    for q, a in rows:
        prompt = [{"role": "user", "content": q}]
        out.append({"prompt": prompt, "completion": [{"role": "assistant", "content": a}], "label": True})
        out.append({"prompt": prompt, "completion": [{"role": "assistant", "content": REJECTED}], "label": False})
    return out


# The rehearsal's preference loops: trainer -> (TRL module, its config class, its trainer class, the synthetic rows).
LOOPS: dict[str, tuple[str, str, str, Callable[[list[tuple[str, str]]], list[dict[str, Any]]]]] = {
    "trl-dpo": ("trl", "DPOConfig", "DPOTrainer", _pairs),
    "trl-kto": ("trl", "KTOConfig", "KTOTrainer", _unpaired),
    "trl-orpo": ("trl.experimental.orpo", "ORPOConfig", "ORPOTrainer", _pairs),
}

# Loops whose loss is not a mean over rows, so b x k accumulated and one batch of b*k differ by design (the
# accumulation check would judge the method, not the run): the check is skipped with this reason. KTO 1.16 also refuses
# a micro-batch of one (kto_trainer.py: "Actual (not effective) batch size must be > 1").
NOT_ACCUMULABLE = {"trl-kto": "KTO estimates its KL term across the rows of each micro-batch: b x k and one batch of "
                              "b*k differ by design"}


def rows(run: Any) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(train rows, eval rows): the user's local dataset's first rows, else synthetic conversational rows in the
    format the run's trainer reads."""
    from gemma_doctor.rehearse.rows import ROWS, _read_rows

    path = run.s.get("dataset")
    if path:
        got = _read_rows(Path(path), 12)
        if got:
            return got[:8], got[8:] or got[:2]
    # A reward model (reward.py) compares DPO's pairs.
    made = LOOPS[run.plan["trainer"]][3](ROWS) if run.plan["trainer"] in LOOPS else _pairs(ROWS)
    return made[:6], made[6:]


def setup(run: Any) -> None:
    """The run's TRL trainer from the user's config keys, LoRA through peft_config (for DPO and KTO the base with the
    adapter off is then the reference model, as TRL does; ORPO has none)."""
    import os

    from datasets import Dataset

    # TRL warns on every import of its experimental package; the rehearsal's report says which trainer ran.
    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
    module, config_name, trainer_name, _ = LOOPS[run.plan["trainer"]]
    lib = importlib.import_module(module)
    train, evaluation = rows(run)
    args = run._args(getattr(lib, config_name), run.work / "run")
    run.trainer = getattr(lib, trainer_name)(model=run.model, args=args, train_dataset=Dataset.from_list(train),
                                             eval_dataset=Dataset.from_list(evaluation), processing_class=run.tokenizer,
                                             peft_config=run._lora())
    run.model = run.trainer.model
    trainable = sum(p.numel() for p in run.model.parameters() if p.requires_grad)
    run.events.write("setup", "ok", trainer=type(run.trainer).__name__, trainable=trainable, notes=run.notes)


def labels(run: Any) -> None:
    """The first preference batch through the trainer's own collator (a crash is the labels stage's); no labels."""
    batch = next(iter(run.trainer.get_train_dataloader()))
    run.events.write("labels", "skipped", reason="a preference batch (completions to compare): no labels to read",
                     keys=sorted(batch.keys()))
