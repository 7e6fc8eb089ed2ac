"""Does Liger's fused DPO loss hold the b x s x V logits in a training step? axolotl 0.19.0's `dpo_use_liger_kernel`
becomes DPOConfig's `use_liger_kernel` (core/trainers/dpo/__init__.py), and TRL 1.9.0 (axolotl 0.19.0's pin) then
computes the DPO loss with liger-kernel's LigerFusedLinearDPOLoss (dpo_trainer.py `_compute_loss_liger`: the
backbone's hidden states and lm_head.weight, never the model's logits). liger-kernel 0.8.1's
chunked_loss/fused_linear_preference.py splits the batch into chunks of chunk_size (1) chosen/rejected pairs and
computes each chunk's logits, log-softmax and gradient (torch.func.grad_and_value) before the next: plain torch,
which runs on a CPU. Liger's layer kernels (RMSNorm, RoPE, GeGLU: Triton, a GPU) are switched off here through
liger_kernel_config; they do not touch the logits. The same tiny Gemma 3 and rows as benchmarks/trl_dpo_logits.py
(benchmarks/dpo_step.py), TRL's own DPOTrainer and DPOConfig. Run with TRL 1.9.0 and liger-kernel 0.8.1 ahead of
the test stack (transformers 5.23.0, torch 2.13.0), gemma_doctor on PYTHONPATH:

    pip install --no-deps --target /tmp/pk trl==1.9.0 liger-kernel==0.8.1
    PYTHONPATH=/tmp/pk:. python benchmarks/liger_dpo_logits.py on    # and `off` for the control

Result (2026-11-29, TRL 1.9.0, liger-kernel 0.8.1, transformers 5.23.0, torch 2.13.0 CPU; docs/memory.md): 4 x 64
tokens (2 pairs), whose logits are 67,108,864 values; with `on` the largest tensor of the step is [126 x 262,144]
(one pair: 2 x 63 shifted tokens), LoRA and full fine-tuning alike; with `off` the step holds the whole logits, as
the control (the model's own loss over the same tokens: [256 x 262,144])."""
import functools
import json
import sys
from importlib.metadata import version

import torch
import transformers
import trl
from trl import DPOConfig, DPOTrainer

from dpo_step import measure  # benchmarks/: the twin, its rows and the step measured

liger = sys.argv[1:] == ["on"]
# Liger's layer kernels off (Triton needs a GPU); the fused DPO loss TRL builds for use_liger_kernel is plain torch.
OFF = {"rope": False, "cross_entropy": False, "fused_linear_cross_entropy": False, "rms_norm": False, "geglu": False}
results = {"trl": trl.__version__, "transformers": transformers.__version__, "liger_kernel": version("liger-kernel"),
           "torch": torch.__version__, "use_liger_kernel": liger}
config = functools.partial(DPOConfig, use_liger_kernel=liger, liger_kernel_config=OFF if liger else None)
print(json.dumps(measure(DPOTrainer, config, results), indent=1))
