"""FSDP transformer-based auto-wrap (GD660) shown by the installed accelerate on tiny Gemma models built here with the
installed transformers; prints one JSON object (tests/test_distributed.py).

Usage: python fsdp_wrap_cases.py OUT_DIR CLASSES_JSON
  Builds every tiny model this transformers has (gemma3_text; from 5.5: gemma4_text and a gemma4 without an audio
  tower), saves its config.json to OUT_DIR/NAME, and prepares its auto-wrap policy with accelerate's own code for
  FSDP1 (FullyShardedDataParallelPlugin.set_auto_wrap_policy) and FSDP2 (fsdp2_prepare_auto_wrap_policy).
  CLASSES_JSON maps NAME to the class list to pass (transformer_cls_names_to_wrap), or null for none.
"""

from __future__ import annotations

import json
import os
import sys
import warnings

os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
warnings.filterwarnings("ignore")

import accelerate  # noqa: E402
import torch  # noqa: E402
import transformers as T  # noqa: E402
from accelerate import FullyShardedDataParallelPlugin  # noqa: E402

TXT = dict(vocab_size=256, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
           num_key_value_heads=1, head_dim=16, max_position_embeddings=128, pad_token_id=0, eos_token_id=1,
           bos_token_id=2)
G4TXT = dict(TXT, layer_types=["sliding_attention", "full_attention"], sliding_window=8, global_head_dim=32)
G4V = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=2,
           head_dim=16, patch_size=4, pooling_kernel_size=2, position_embedding_size=64)


def models() -> dict:
    out = {"gemma3_text": lambda: T.Gemma3ForCausalLM(T.Gemma3TextConfig(**TXT))}
    if hasattr(T, "Gemma4ForCausalLM"):
        out["gemma4_text"] = lambda: T.Gemma4ForCausalLM(T.Gemma4TextConfig(**G4TXT))
        # A Gemma 4 with a vision tower and no audio tower (the 26B/31B shape).
        out["gemma4_no_audio"] = lambda: T.Gemma4ForConditionalGeneration(T.Gemma4Config(
            text_config=dict(G4TXT, model_type="gemma4_text"), vision_config=dict(G4V, model_type="gemma4_vision"),
            audio_config=None, boi_token_id=250, eoi_token_id=251, image_token_id=252, video_token_id=253))
    return out


def wrap(model: torch.nn.Module, version: int, classes: list[str] | None) -> str:
    """"ok" or the error accelerate raises while turning the policy into the callable FSDP gets."""
    try:
        # The kwargs a launcher's env (FSDP_AUTO_WRAP_POLICY, FSDP_TRANSFORMER_CLS_TO_WRAP) or the Trainer pass.
        plugin = FullyShardedDataParallelPlugin(fsdp_version=version, auto_wrap_policy="transformer_based_wrap",
                                                transformer_cls_names_to_wrap=classes)
        if version == 1:
            plugin.set_auto_wrap_policy(model)
        else:
            from accelerate.utils.fsdp_utils import fsdp2_prepare_auto_wrap_policy

            policy = fsdp2_prepare_auto_wrap_policy(plugin, model)
            # The layers the policy picks are the FSDP units: at least the decoder layers.
            if not any(policy(m) for m in model.modules()):
                return "no module wrapped"
        return "ok"
    except Exception as e:  # noqa: BLE001 - the error is the result
        return f"{type(e).__name__}: {e}"


def main() -> None:
    out_dir, classes = sys.argv[1], json.loads(sys.argv[2])
    result: dict = {"transformers": T.__version__, "accelerate": accelerate.__version__, "models": {}}
    for name, make in models().items():
        torch.manual_seed(0)
        model = make()
        model.config.save_pretrained(os.path.join(out_dir, name))
        given = classes.get(name)
        result["models"][name] = {"class": type(model).__name__, "no_split_modules": sorted(model._no_split_modules),
                                  "fsdp1": wrap(model, 1, given), "fsdp2": wrap(model, 2, given)}
    print(json.dumps(result))


if __name__ == "__main__":
    main()
