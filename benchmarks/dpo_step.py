"""One DPO training step of a tiny Gemma 3 text model with the real 262,144 vocabulary, batch 2 pairs x up to 64
tokens, on the CPU, with the largest tensor any op returns recorded (a TorchDispatchMode): what
benchmarks/trl_dpo_logits.py (TRL's DPOTrainer) and benchmarks/axolotl_dpo_logits.py (axolotl's) measure, each with
its own trainer and config class, in its own venv."""
import tempfile
from pathlib import Path
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

V = 262144


class Largest(TorchDispatchMode):
    """The largest tensor an op returns while the mode is on."""

    def __init__(self):
        super().__init__()
        self.most = 0
        self.shape = None

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in (out if isinstance(out, (tuple, list)) else (out,)):
            if isinstance(t, torch.Tensor) and t.numel() > self.most:
                self.most, self.shape = t.numel(), tuple(t.shape)
        return out


def twin_config() -> Any:
    from transformers import Gemma3TextConfig

    return Gemma3TextConfig(vocab_size=V, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                            num_attention_heads=1, num_key_value_heads=1, head_dim=32, max_position_embeddings=512,
                            sliding_window=64, layer_types=["sliding_attention", "full_attention"])


ROWS = [{"prompt": [{"role": "user", "content": "What is two plus two? " * 2}],
         "chosen": [{"role": "assistant", "content": "Four, it is four."}],
         "rejected": [{"role": "assistant", "content": "I would rather not say."}]}] * 4


def measure(trainer_class: Any, config_class: Any, results: dict[str, Any]) -> Any:
    """One step under ``trainer_class``/``config_class`` with LoRA and with full fine-tuning, into ``results``; then the
    control (the model's own forward with labels, which builds the b x s x V logits). Returns ``results``."""
    from datasets import Dataset
    from peft import LoraConfig
    from transformers import AutoTokenizer, Gemma3ForCausalLM

    from gemma_doctor.rehearse.twin import synthetic_tokenizer

    cfg = twin_config()
    tmp = Path(tempfile.mkdtemp())
    for name, data in synthetic_tokenizer(cfg.to_dict(), V).items():
        (tmp / name).write_bytes(data)
    tok = AutoTokenizer.from_pretrained(tmp)
    batch = None
    for method in ("lora", "full"):
        torch.manual_seed(0)
        model = Gemma3ForCausalLM(cfg)
        model.save_pretrained(tmp / "m")
        tok.save_pretrained(tmp / "m")
        args = config_class(output_dir=str(tmp / "out"), per_device_train_batch_size=2, max_length=64, max_steps=1,
                            bf16=False, use_cpu=True, report_to=[], logging_steps=1, save_strategy="no",
                            gradient_checkpointing=False)
        peft = LoraConfig(r=4, target_modules="all-linear", task_type="CAUSAL_LM") if method == "lora" else None
        trainer = trainer_class(model=str(tmp / "m"), args=args, train_dataset=Dataset.from_list(ROWS),
                                processing_class=tok, peft_config=peft)
        batch = next(iter(trainer.get_train_dataloader()))
        tokens = int(batch["input_ids"].numel())  # chosen and rejected, padded
        with Largest() as seen:
            trainer.train()
        results[method] = {"input_ids": list(batch["input_ids"].shape), "full_logits_numel": tokens * V,
                           "largest_tensor": seen.shape, "largest_numel": seen.most}
    m = Gemma3ForCausalLM(cfg)
    ids = batch["input_ids"]
    with Largest() as seen:
        m(input_ids=ids, labels=ids).loss.backward()
    results["control_forward_with_labels"] = {"largest_tensor": seen.shape, "largest_numel": seen.most,
                                              "full_logits_numel": int(ids.numel()) * V}
    return results
