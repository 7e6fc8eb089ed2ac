"""Tiny real checkpoints of every Gemma-family member, built and saved by the installed transformers (5.23 in the
main venv): hidden 32, 2-4 layers, towers of one layer, bf16 weights. Imports torch and transformers.

Two members cannot be built from a config here, so they get the config transformers saves plus the weights of
their text model: gemma3n (its vision tower is a timm model, and timm is not a test dependency) and the Gemma 4
assistants (transformers 5.23.0's Gemma4AssistantForCausalLM / Gemma4UnifiedAssistantForCausalLM raise "The set of
layer types producing a cache is different than the set of layer types using them" when built from a config,
because their validator requires every layer to be KV-shared).
"""

from __future__ import annotations

import os
import warnings
from pathlib import Path
from typing import Any, Callable

os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

import torch  # noqa: E402
import transformers as T  # noqa: E402

TXT: dict[str, Any] = dict(vocab_size=256, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                           num_attention_heads=2, num_key_value_heads=1, head_dim=16, max_position_embeddings=128,
                           pad_token_id=0, eos_token_id=1, bos_token_id=2)
SLIDING = dict(layer_types=["sliding_attention", "full_attention"], sliding_window=8)
SIGLIP = dict(model_type="siglip_vision_model", hidden_size=32, intermediate_size=64, num_hidden_layers=1,
              num_attention_heads=2, image_size=28, patch_size=14)
# Gemma 4 E-series shape: 4 layers [sliding, full] x 2, the last 2 KV-shared, per-layer embeddings, global heads twice
# as wide as local ones (stands in for 512 vs 256).
G4TXT = dict(TXT, num_hidden_layers=4, layer_types=["sliding_attention", "full_attention"] * 2, sliding_window=8,
             global_head_dim=32, num_kv_shared_layers=2, vocab_size_per_layer_input=256, hidden_size_per_layer_input=8)
G4DENSE = dict(G4TXT, num_kv_shared_layers=0, hidden_size_per_layer_input=0, vocab_size_per_layer_input=0)
G4V = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=2,
           head_dim=16, patch_size=4, pooling_kernel_size=2, position_embedding_size=64)
G4A = dict(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, subsampling_conv_channels=[8, 4],
           output_proj_dims=32, conv_kernel_size=3)
G4IDS = dict(boi_token_id=250, eoi_token_id=251, image_token_id=252, video_token_id=253, boa_token_id=254,
             eoa_token_index=255, audio_token_id=249)
G3IDS = dict(mm_tokens_per_image=4, image_token_index=255, boi_token_index=253, eoi_token_index=254)
G3N_TXT = dict(TXT, vocab_size_per_layer_input=256, hidden_size_per_layer_input=8, laurel_rank=4, altup_num_inputs=2,
               num_kv_shared_layers=0, activation_sparsity_pattern=[0.0, 0.0], **SLIDING)
EMB2 = dict(TXT, hidden_size_per_layer_input=8, embedding_dim=16, **SLIDING)

# model_type -> (class built, config factory, class whose weights stand in when the first cannot be built here)
Spec = tuple[str, Callable[[], Any], "str | None"]
SPECS: dict[str, Spec] = {
    "gemma": ("GemmaForCausalLM", lambda: T.GemmaConfig(**TXT), None),
    "gemma2": ("Gemma2ForCausalLM", lambda: T.Gemma2Config(**TXT), None),
    "gemma3_text": ("Gemma3ForCausalLM", lambda: T.Gemma3TextConfig(**TXT), None),
    "gemma3": ("Gemma3ForConditionalGeneration", lambda: T.Gemma3Config(text_config=TXT, vision_config=SIGLIP, **G3IDS), None),
    "gemma3n_text": ("Gemma3nForCausalLM", lambda: T.Gemma3nTextConfig(**G3N_TXT), None),
    "gemma3n": ("Gemma3nForConditionalGeneration", lambda: T.Gemma3nConfig(text_config=G3N_TXT), "Gemma3nForCausalLM"),
    "paligemma": ("PaliGemmaForConditionalGeneration", lambda: T.PaliGemmaConfig(
        text_config=dict(TXT, model_type="gemma2"), vision_config=SIGLIP, image_token_index=255, projection_dim=32), None),
    "recurrent_gemma": ("RecurrentGemmaForCausalLM", lambda: T.RecurrentGemmaConfig(
        **TXT, lru_width=32, attention_window_size=8, block_types=["recurrent", "attention"]), None),
    "shieldgemma2": ("ShieldGemma2ForImageClassification", lambda: T.ShieldGemma2Config(
        text_config=dict(TXT, model_type="gemma3_text"), vision_config=SIGLIP, **G3IDS), None),
    "t5gemma": ("T5GemmaForConditionalGeneration", lambda: T.T5GemmaConfig(encoder=TXT, decoder=TXT, vocab_size=256), None),
    "t5gemma2": ("T5Gemma2ForConditionalGeneration", lambda: T.T5Gemma2Config(
        encoder=dict(text_config=TXT, vision_config=SIGLIP, mm_tokens_per_image=4), decoder=TXT, vocab_size=256), None),
    "vaultgemma": ("VaultGemmaForCausalLM", lambda: T.VaultGemmaConfig(**TXT), None),
    "gemma4_text": ("Gemma4ForCausalLM", lambda: T.Gemma4TextConfig(**G4TXT), None),
    "gemma4": ("Gemma4ForConditionalGeneration", lambda: T.Gemma4Config(
        text_config=G4TXT, vision_config=G4V, audio_config=G4A, **G4IDS), None),
    "gemma4_assistant": ("Gemma4AssistantForCausalLM", lambda: T.Gemma4AssistantConfig(
        text_config=dict(G4DENSE, num_kv_shared_layers=4), backbone_hidden_size=32, num_centroids=16,
        centroid_intermediate_top_k=4), "Gemma4ForCausalLM"),
    "gemma4_unified": ("Gemma4UnifiedForConditionalGeneration", lambda: T.Gemma4UnifiedConfig(
        text_config=G4DENSE, vision_config=dict(G4V, mm_embed_dim=32, mm_posemb_size=16, output_proj_dims=32),
        audio_config=dict(G4A, audio_embed_dim=32), **G4IDS), None),
    "gemma4_unified_text": ("Gemma4UnifiedForCausalLM", lambda: T.Gemma4UnifiedTextConfig(**G4DENSE), None),
    "gemma4_unified_assistant": ("Gemma4UnifiedAssistantForCausalLM", lambda: T.Gemma4UnifiedAssistantConfig(
        text_config=dict(G4DENSE, model_type="gemma4_unified_text", num_kv_shared_layers=4), backbone_hidden_size=32,
        num_centroids=16, centroid_intermediate_top_k=4), "Gemma4UnifiedForCausalLM"),
    "embedding_gemma2_text": ("EmbeddingGemma2TextModel", lambda: T.EmbeddingGemma2TextConfig(**EMB2), None),
    "embedding_gemma2": ("EmbeddingGemma2Model", lambda: T.EmbeddingGemma2Config(
        text_config=EMB2, vision_config=dict(G4V, model_type="gemma4_vision"),
        audio_config=dict(G4A, model_type="gemma4_audio"), **G4IDS), None),
    "diffusion_gemma": ("DiffusionGemmaForBlockDiffusion", lambda: T.DiffusionGemmaConfig(
        text_config=dict(TXT, num_experts=2, top_k_experts=1, moe_intermediate_size=16, **SLIDING),
        vision_config=dict(G4V, model_type="gemma4_vision"), boi_token_id=250, eoi_token_id=251, image_token_id=252,
        canvas_length=8), None),
}


def save(model_type: str, folder: Path) -> Path:
    """Build the tiny ``model_type`` checkpoint with random bf16 weights and save it to ``folder`` (as save_pretrained)."""
    arch, make, stand_in = SPECS[model_type]
    config = make()
    torch.manual_seed(0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if stand_in is None:
            getattr(T, arch)(config).to(torch.bfloat16).save_pretrained(folder)
            return folder
        text = config.get_text_config()
        if model_type.startswith("gemma4") and model_type.endswith("assistant"):
            text = type(text)(**{**text.to_dict(), "num_kv_shared_layers": 0})
        getattr(T, stand_in)(text).to(torch.bfloat16).save_pretrained(folder)
        config.architectures = [arch]
        config.dtype = torch.bfloat16
        config.save_pretrained(folder)  # the member's own config.json replaces the stand-in's
    return folder


def save_all(root: Path) -> dict[str, Path]:
    """Every member in SPECS saved under ``root/<model_type>``."""
    torch.set_num_threads(1)
    return {t: save(t, root / t) for t in SPECS}
