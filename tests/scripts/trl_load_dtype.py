"""Print the dtype TRL's SFTTrainer loads a model id in, with and without a dtype in model_init_kwargs, on a tiny bf16
Gemma 3 text model; run inside a venv with TRL (versioning.TRL_LOADS_FP32, docs/memory.md).

Usage: python trl_load_dtype.py
Measured with TRL 1.16.0 / transformers 5.23.0: from_pretrained(path) bfloat16; SFTTrainer(model=path) float32;
model_init_kwargs {"dtype": "bfloat16"} or {"dtype": "auto"} bfloat16; SFTConfig's gradient_checkpointing True; its bf16
True where the config sets none (versioning.TRL_BF16_DEFAULT), also beside fp16=False."""

from __future__ import annotations

import json
import tempfile

import torch
import transformers
import trl
from datasets import Dataset
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import Gemma3ForCausalLM, Gemma3TextConfig, PreTrainedTokenizerFast
from trl import SFTConfig, SFTTrainer


def main() -> None:
    """Save a tiny bf16 checkpoint, hand its path to SFTTrainer three ways, print the parameters' dtype."""
    path = tempfile.mkdtemp()
    cfg = Gemma3TextConfig(vocab_size=256, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                           num_attention_heads=2, num_key_value_heads=1, head_dim=16, dtype="bfloat16")
    Gemma3ForCausalLM(cfg).to(torch.bfloat16).save_pretrained(path)
    print("saved config dtype:", json.load(open(path + "/config.json")).get("dtype"))
    vocab = {f"w{i}": i for i in range(200)} | {"<pad>": 200, "<eos>": 201}
    raw = Tokenizer(models.WordLevel(vocab, unk_token="<pad>"))
    raw.pre_tokenizer = pre_tokenizers.Whitespace()
    tok = PreTrainedTokenizerFast(tokenizer_object=raw, pad_token="<pad>", eos_token="<eos>")
    data = Dataset.from_dict({"text": ["w1 w2 w3"] * 4})
    print("trl", trl.__version__, "transformers", transformers.__version__)
    print("from_pretrained(path) default:", transformers.AutoModelForCausalLM.from_pretrained(path).dtype)
    for kwargs in (None, {"dtype": "bfloat16"}, {"dtype": "auto"}):
        args = SFTConfig(output_dir=tempfile.mkdtemp(), use_cpu=True, report_to=[], max_steps=1,
                         model_init_kwargs=kwargs)
        trainer = SFTTrainer(model=path, args=args, train_dataset=data, processing_class=tok)
        print(f"model_init_kwargs={kwargs}: parameters {next(trainer.model.parameters()).dtype}; "
              f"gradient_checkpointing={args.gradient_checkpointing}; bf16={args.bf16}")
    print("SFTConfig(fp16=False).bf16:", SFTConfig(output_dir=tempfile.mkdtemp(), use_cpu=True, fp16=False).bf16)


if __name__ == "__main__":
    main()
