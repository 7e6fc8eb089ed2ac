"""Write a random-weight checkpoint of a real Gemma configuration, for measuring memory where no weights can be
downloaded (a lent GPU machine reaches no network): the real shapes, dtypes and key layout, random values.

    python benchmarks/random_checkpoint.py gemma-3-1b OUT_DIR [--dtype bfloat16]

Its activations are those of random weights, not of the trained model: figures of memory are real, the activation
maxima are not the checkpoint's (docs/rehearsal.md says which is which).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

# The published configurations (facts.md section 2), text model only where the checkpoint is text-only.
CONFIGS = {
    "gemma-3-1b": {
        "architectures": ["Gemma3ForCausalLM"], "model_type": "gemma3_text", "hidden_size": 1152,
        "intermediate_size": 6912, "num_hidden_layers": 26, "num_attention_heads": 4, "num_key_value_heads": 1,
        "head_dim": 256, "vocab_size": 262144, "sliding_window": 512, "max_position_embeddings": 32768,
        "rope_scaling": None, "rope_theta": 1000000, "query_pre_attn_scalar": 256, "torch_dtype": "bfloat16",
        "bos_token_id": 2, "eos_token_id": [1, 106], "pad_token_id": 0},
    "gemma-3-4b": {
        "architectures": ["Gemma3ForConditionalGeneration"], "model_type": "gemma3", "torch_dtype": "bfloat16",
        "boi_token_index": 255999, "eoi_token_index": 256000, "image_token_index": 262144, "mm_tokens_per_image": 256,
        "text_config": {"hidden_size": 2560, "intermediate_size": 10240, "model_type": "gemma3_text",
                        "num_hidden_layers": 34, "num_attention_heads": 8, "num_key_value_heads": 4,
                        "rope_scaling": {"factor": 8.0, "rope_type": "linear"}, "sliding_window": 1024},
        "vision_config": {"hidden_size": 1152, "image_size": 896, "intermediate_size": 4304, "model_type": "siglip_vision_model",
                          "num_attention_heads": 16, "num_hidden_layers": 27, "patch_size": 14, "vision_use_head": False}},
}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("name", choices=sorted(CONFIGS))
    ap.add_argument("out", type=Path)
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--layers", type=int, default=None, help="fewer layers (a dry run of a script that uses it)")
    args = ap.parse_args()
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoModelForImageTextToText

    args.out.mkdir(parents=True, exist_ok=True)
    config = json.loads(json.dumps(CONFIGS[args.name]))
    if args.layers:
        for part in (config, config.get("text_config"), config.get("vision_config")):
            if part and "num_hidden_layers" in part:
                part["num_hidden_layers"] = args.layers
    (args.out / "config.json").write_text(json.dumps(config, indent=2))
    config = AutoConfig.from_pretrained(args.out)
    auto = AutoModelForImageTextToText if "text_config" in CONFIGS[args.name] else AutoModelForCausalLM
    device = "cuda" if torch.cuda.is_available() else "cpu"
    torch.manual_seed(0)
    with torch.device(device):
        model = auto.from_config(config, torch_dtype=getattr(torch, args.dtype))
    model.save_pretrained(args.out)
    (args.out / "generation_config.json").write_text(json.dumps(
        {"bos_token_id": 2, "eos_token_id": [1, 106], "pad_token_id": 0}))
    n = sum(p.numel() for p in model.parameters())
    print(json.dumps({"name": args.name, "params": n, "out": str(args.out)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
