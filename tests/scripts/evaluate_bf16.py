"""Load a Gemma 3 checkpoint by repo id from the hub cache (offline) and run Trainer.evaluate() in bf16.

Usage: python evaluate_bf16.py REPO_ID [REVISION]
Exit 0 and print EVAL-OK on success; exit 3 and print HYBRIDCACHE-CRASH on the known crash.
"""

import sys
import tempfile

import torch
from eval_batches import Batches  # sibling script: this folder is on sys.path
from transformers import Gemma3ForConditionalGeneration, Trainer, TrainingArguments


repo_id = sys.argv[1]
revision = sys.argv[2] if len(sys.argv) > 2 else "main"
model = Gemma3ForConditionalGeneration.from_pretrained(repo_id, revision=revision, torch_dtype=torch.bfloat16)
print("text_config.use_cache =", model.config.text_config.use_cache)
with tempfile.TemporaryDirectory() as out:
    args = TrainingArguments(output_dir=out, bf16=True, use_cpu=True, per_device_eval_batch_size=2, report_to=[])
    trainer = Trainer(model=model, args=args, eval_dataset=Batches())
    try:
        metrics = trainer.evaluate()
    except AttributeError as e:
        if "HybridCache" in str(e):
            print("HYBRIDCACHE-CRASH", e)
            sys.exit(3)
        raise
print("EVAL-OK", metrics["eval_loss"])
