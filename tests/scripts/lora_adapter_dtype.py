"""Print the dtypes of the trainable LoRA parameters PEFT creates on a tiny bf16 Gemma 3 text model; run inside a venv.

Usage: python lora_adapter_dtype.py
Prints one line: ``ADAPTER-DTYPES peft=<version> <dtype>[,<dtype>...]``.
"""

import peft
import torch
from peft import LoraConfig, get_peft_model
from transformers import Gemma3ForCausalLM, Gemma3TextConfig

torch.manual_seed(0)
cfg = Gemma3TextConfig(vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
                       num_key_value_heads=1, head_dim=16, sliding_window=8, max_position_embeddings=64)
model = Gemma3ForCausalLM(cfg).to(torch.bfloat16)
model = get_peft_model(model, LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"]))
dtypes = sorted({str(p.dtype).replace("torch.", "") for p in model.parameters() if p.requires_grad})
print(f"ADAPTER-DTYPES peft={peft.__version__} {','.join(dtypes)}")
