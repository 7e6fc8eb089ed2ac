"""Does TRL's DPOTrainer hold the b x s x V logits in a training step (trainers.CHUNKING_TRAINERS)? A tiny Gemma 3 text
model with the real 262,144 vocabulary, LoRA and full fine-tuning, batch 2 pairs x up to 64 tokens, one step on the CPU;
every tensor an op returns is seen by a TorchDispatchMode and the largest recorded. Control: the model's own forward
with labels (a plain Trainer's loss), which builds them. Run in the test venv (TRL 1.16.0):

    python benchmarks/trl_dpo_logits.py

Result (2026-11, TRL 1.16.0, transformers 5.23.0; docs/memory.md): 4 x 64 tokens, whose logits are 67,108,864 values;
the largest tensor of DPO's step is a [252 x 32,768] tile (LoRA) or the [262,144 x 64] embedding (full fine-tuning);
the control's is [256 x 262,144]."""
import json

import trl
from trl import DPOConfig, DPOTrainer

from dpo_step import measure  # benchmarks/: the twin, its rows and the step measured, shared with axolotl's

print(json.dumps(measure(DPOTrainer, DPOConfig, {"trl": trl.__version__}), indent=1))
