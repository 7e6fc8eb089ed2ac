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
import json, tempfile
from pathlib import Path
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from datasets import Dataset
from transformers import AutoTokenizer, Gemma3ForCausalLM, Gemma3TextConfig
import trl, transformers
import axolotl
from axolotl.core.trainers.dpo.trainer import AxolotlDPOTrainer
from axolotl.core.trainers.dpo.args import AxolotlDPOConfig
from peft import LoraConfig
from gemma_doctor.rehearse.twin import synthetic_tokenizer

V = 262144
class Largest(TorchDispatchMode):
    def __init__(self):
        super().__init__(); self.most = 0; self.shape = None
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in (out if isinstance(out, (tuple, list)) else (out,)):
            if isinstance(t, torch.Tensor) and t.numel() > self.most:
                self.most, self.shape = t.numel(), tuple(t.shape)
        return out

cfg = Gemma3TextConfig(vocab_size=V, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=1,
                       num_key_value_heads=1, head_dim=32, max_position_embeddings=512, sliding_window=64,
                       layer_types=["sliding_attention", "full_attention"])
tmp = Path(tempfile.mkdtemp())
for name, data in synthetic_tokenizer(cfg.to_dict(), V).items():
    (tmp / name).write_bytes(data)
tok = AutoTokenizer.from_pretrained(tmp)
rows = [{"prompt": [{"role": "user", "content": "What is two plus two? " * 2}],
         "chosen": [{"role": "assistant", "content": "Four, it is four."}],
         "rejected": [{"role": "assistant", "content": "I would rather not say."}]}] * 4
results = {"axolotl": axolotl.__version__, "trl": trl.__version__, "transformers": transformers.__version__,
           "trainer_mro": [c.__name__ for c in AxolotlDPOTrainer.__mro__][:7],
           "overrides": sorted(k for k in vars(AxolotlDPOTrainer) if not k.startswith("__"))}
for method in ("lora", "full"):
    torch.manual_seed(0)
    model = Gemma3ForCausalLM(cfg)
    model.save_pretrained(tmp / "m"); tok.save_pretrained(tmp / "m")
    args = AxolotlDPOConfig(output_dir=str(tmp / "out"), per_device_train_batch_size=2, max_length=64, max_steps=1,
                            bf16=False, use_cpu=True, report_to=[], logging_steps=1, save_strategy="no",
                            gradient_checkpointing=False)
    peft = LoraConfig(r=4, target_modules="all-linear", task_type="CAUSAL_LM") if method == "lora" else None
    trainer = AxolotlDPOTrainer(model=str(tmp / "m"), args=args, train_dataset=Dataset.from_list(rows),
                                processing_class=tok, peft_config=peft)
    batch = next(iter(trainer.get_train_dataloader()))
    tokens = int(batch["input_ids"].numel())  # chosen and rejected, padded
    with Largest() as seen:
        trainer.train()
    results[method] = {"input_ids": list(batch["input_ids"].shape), "full_logits_numel": tokens * V,
                       "largest_tensor": seen.shape, "largest_numel": seen.most}
print(json.dumps(results, indent=1))
