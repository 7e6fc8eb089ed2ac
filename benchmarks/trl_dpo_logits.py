"""Does TRL's DPOTrainer hold the b x s x V logits in a training step (trainers.CHUNKING_TRAINERS)? A tiny Gemma 3 text
model with the real 262,144 vocabulary, LoRA and full fine-tuning, batch 2 pairs x up to 64 tokens, one step on the CPU;
every tensor an op returns is seen by a TorchDispatchMode and the largest recorded. Control: the model's own forward
with labels (a plain Trainer's loss), which builds them. Run in the test venv (TRL 1.16.0):

    python benchmarks/trl_dpo_logits.py

Result (2026-11, TRL 1.16.0, transformers 5.23.0; docs/memory.md): 4 x 64 tokens, whose logits are 67,108,864 values;
the largest tensor of DPO's step is a [252 x 32,768] tile (LoRA) or the [262,144 x 64] embedding (full fine-tuning);
the control's is [256 x 262,144]."""
import json, sys, tempfile
from pathlib import Path
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from datasets import Dataset
from transformers import AutoTokenizer, Gemma3ForCausalLM, Gemma3TextConfig
import trl
from trl import DPOConfig, DPOTrainer
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
results = {"trl": trl.__version__}
for method in ("lora", "full"):
    torch.manual_seed(0)
    model = Gemma3ForCausalLM(cfg)
    model.save_pretrained(tmp / "m"); tok.save_pretrained(tmp / "m")
    args = DPOConfig(output_dir=str(tmp / "out"), per_device_train_batch_size=2, max_length=64, max_steps=1,
                     bf16=False, use_cpu=True, report_to=[], logging_steps=1, save_strategy="no",
                     gradient_checkpointing=False)
    peft = LoraConfig(r=4, target_modules="all-linear", task_type="CAUSAL_LM") if method == "lora" else None
    trainer = DPOTrainer(model=str(tmp / "m"), args=args, train_dataset=Dataset.from_list(rows), processing_class=tok,
                         peft_config=peft)
    batch = next(iter(trainer.get_train_dataloader()))
    tokens = int(batch["input_ids"].numel())  # chosen and rejected, padded
    with Largest() as seen:
        trainer.train()
    results[method] = {"input_ids": list(batch["input_ids"].shape), "full_logits_numel": tokens * V,
                       "largest_tensor": seen.shape, "largest_numel": seen.most}
# Control: the model's own loss over the same tokens builds the b x s x V logits (and the mode sees them).
m = Gemma3ForCausalLM(cfg)
ids = batch["input_ids"]
with Largest() as seen:
    m(input_ids=ids, labels=ids).loss.backward()
results["control_forward_with_labels"] = {"largest_tensor": seen.shape, "largest_numel": seen.most,
                                          "full_logits_numel": int(ids.numel()) * V}
print(json.dumps(results, indent=1))
