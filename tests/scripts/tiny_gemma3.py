"""Build a tiny Gemma 3 multimodal checkpoint (bf16) with the running transformers; run inside a venv.

Usage: python tiny_gemma3.py OUT_DIR
The text_config is made sparse like the Hub's gemma-3 configs: no use_cache key (default true).
"""

import json
import sys

import torch
from transformers import Gemma3Config, Gemma3ForConditionalGeneration

out = sys.argv[1]
cfg = Gemma3Config(
    text_config=dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
                     num_key_value_heads=1, head_dim=16, vocab_size=300, sliding_window=8,
                     max_position_embeddings=128),
    vision_config=dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                       image_size=28, patch_size=14),
    mm_tokens_per_image=4, image_token_index=299, boi_token_index=297, eoi_token_index=298,
)
torch.manual_seed(0)
Gemma3ForConditionalGeneration(cfg).to(torch.bfloat16).save_pretrained(out)
path = f"{out}/config.json"
with open(path) as f:
    config = json.load(f)
config["text_config"].pop("use_cache", None)
with open(path, "w") as f:
    f.write(json.dumps(config, indent=2, sort_keys=True) + "\n")
