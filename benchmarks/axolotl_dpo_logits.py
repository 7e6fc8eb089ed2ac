"""Does axolotl's DPO trainer hold the b x s x V logits in a training step, or inherit TRL's chunking
(trainers.CHUNKING_TRAINERS)? axolotl 0.19.0's AxolotlDPOTrainer (core/trainers/dpo/trainer.py) subclasses TRL's
DPOTrainer and overrides only _tokenize, training_step (gc + empty_cache) and push_to_hub: the log-probs are TRL's.
axolotl 0.19.0 requires trl==1.9.0, whose DPOTrainer._compute_loss takes `outputs.logits` whole (the fused LM head is
TRL 1.15's). The same tiny Gemma 3 text model as benchmarks/trl_dpo_logits.py (262,144 vocabulary, batch 2 pairs x up
to 64 tokens, one CPU step), trained by AxolotlDPOTrainer with AxolotlDPOConfig; every tensor an op returns is seen by
a TorchDispatchMode and the largest recorded. Run in a venv with axolotl 0.19.0 and its pins (trl 1.9.0, transformers
5.16.1), gemma_doctor on PYTHONPATH:

    PYTHONPATH=. python benchmarks/axolotl_dpo_logits.py

Result (2026-11-29, axolotl 0.19.0, TRL 1.9.0, transformers 5.16.1, torch 2.13.0 CPU; docs/memory.md): the class
overrides ['_tokenize', 'push_to_hub', 'tag_names', 'training_step']; 4 x 64 tokens, whose logits are 67,108,864
values; the largest tensor of the step is [256 x 262,144] = 67,108,864 with LoRA and with full fine-tuning: the whole
logits (TRL 1.16.0's own DPOTrainer: a [252 x 32,768] tile, benchmarks/trl_dpo_logits.py). The same venv with TRL
1.16.0 stops at `from trl.experimental.prm import PRMConfig` (axolotl/core/training_args.py): axolotl 0.19.0 does not
run on a TRL that chunks."""
import json

import axolotl
import transformers
import trl
from axolotl.core.trainers.dpo.args import AxolotlDPOConfig
from axolotl.core.trainers.dpo.trainer import AxolotlDPOTrainer

from dpo_step import measure  # benchmarks/: the twin, its rows and the step measured, shared with TRL's

results = {"axolotl": axolotl.__version__, "trl": trl.__version__, "transformers": transformers.__version__,
           "trainer_mro": [c.__name__ for c in AxolotlDPOTrainer.__mro__][:7],
           "overrides": sorted(k for k in vars(AxolotlDPOTrainer) if not k.startswith("__"))}
print(json.dumps(measure(AxolotlDPOTrainer, AxolotlDPOConfig, results), indent=1))
