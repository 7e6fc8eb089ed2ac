"""Pure version arithmetic for the known-bad ranges (no imports of the libraries themselves)."""

from __future__ import annotations

from packaging.version import InvalidVersion, Version

from gemma_doctor.stack import Window, version_of

PEFT_ADAPTER_FP32 = "0.12.0"  # PEFT upcasts adapter weights to fp32 by default (autocast_adapter_dtype=True)
PEFT_CAST_HELPER = "0.8.0"  # peft.cast_mixed_precision_params


def parse(version: str | None) -> Version | None:
    """A comparable version, or None when absent or unparseable."""
    if not version:
        return None
    try:
        return version_of(version)
    except InvalidVersion:
        return None


# transformers releases whose cache classes keep `.dtype` while no longer being nn.Module, so
# accelerate's convert_to_fp32 calls `.float()` on a HybridCache (facts.md section 1): 4.50.0-4.50.3,
# 4.50.0.dev0, and the v4.49.0-Gemma-3 preview tag (4.49.0 with a "gemma" local label).
HYBRIDCACHE_FIRST_FIXED = "4.51.0"
HYBRIDCACHE = Window("transformers", ">=4.50.0.dev0,<4.51.0", HYBRIDCACHE_FIRST_FIXED,
                     preview_spec="==4.49.*", preview_local="gemma")


def transformers_has_hybridcache_bug(version: str | None) -> bool:
    """True for 4.50.0-4.50.3 and the 4.50.0.dev0 / v4.49.0-Gemma-3 previews."""
    return version is not None and HYBRIDCACHE.contains(version)


# Multimodal Gemma 3 / PaliGemma in train mode with a text-only batch (no token_type_ids) raise
# "ValueError: `token_type_ids` is required as a model input when training" (create_causal_mask_mapping).
# Bisected on every PyPI release 4.50.0-5.23.0 (research/token_type_ids: static scan + runs): Gemma 3 raises
# 5.0.0-5.5.4 (fixed 5.6.0, transformers #45454); PaliGemma keeps the check until 5.8.1 (fixed 5.9.0).
TOKEN_TYPE_IDS_GEMMA3 = Window("transformers", ">=5.0.0,<5.6.0", "5.6.0")
TOKEN_TYPE_IDS_PALIGEMMA = Window("transformers", ">=5.0.0,<5.9.0", "5.9.0")
# Gemma 4 with text_config.use_bidirectional_attention == "vision" (31B, 26B-A4B) raises "`mm_token_type_ids` is
# required as a model input when training" on 5.5.0-5.5.4 (transformers #45200, fixed by PR #45454 in 5.6.0).
GEMMA4_MM_TOKEN_TYPE_IDS = Window("transformers", ">=5.5.0,<5.6.0", "5.6.0")
# Gemma 4 KV sharing (num_kv_shared_layers > 0) is skipped when no cache is passed (use_cache=False, gradient
# checkpointing): shared layers compute their own K/V, the loss is wrong (transformers #45242, PR #45312 in 5.5.2).
GEMMA4_KV_SHARE_NO_CACHE = Window("transformers", ">=5.5.0,<5.5.2", "5.5.2")
# transformers 5.0.0 writes RoPE settings only as `rope_parameters`; 4.x reads only `rope_scaling` / `rope_theta`
# and silently falls back to the class defaults (research/loading item 3b, measured on 4.50.0 and 4.57.6).
ROPE_PARAMETERS_READER = Window("transformers", "<5.0.0", "5.0.0")


def older_than(minimum: str) -> Window:
    """The releases of transformers before ``minimum`` (a model_type's first release): they cannot load it."""
    # Development builds of the first release already carry the model (4.50.0.dev0 is Gemma 3's launch build).
    return Window("transformers", f"<{minimum}.dev0", minimum)


# --- the pitfall catalogue (docs/findings.md; measured in /work/research/{loading,attn_tokens}) -------------

# PEFT ignores a scaled embedding's embed_scale when embed_tokens is a LoRA target or has trainable tokens
# (peft #2809, fixed by PR #2825 in 0.18.0; 0.17.1 measured unscaled, 0.18.0 scaled).
PEFT_EMBED_SCALE = Window("peft", "<0.18.0", "0.18.0")
# LoraConfig(ensure_weight_tying=...) exists from PEFT 0.18.0 (absent from 0.17.1's source). Without it
# modules_to_save=["embed_tokens"] trains a copy apart from Gemma's tied lm_head, and the merged, saved model reloads
# with another head (tests/scripts/tied_modules_to_save.py, transformers 4.57.6: max |logit diff| 0.43 on 0.17.1 and
# 0.18.0; 0.0 with ensure_weight_tying=True on 0.18.0 and 0.21.2; ["embed_tokens", "lm_head"] with it: 1.22 on 0.18.0).
PEFT_WEIGHT_TYING = Window("peft", "<0.18.0", "0.18.0")
# transformers reads use_bidirectional_attention (EmbeddingGemma) from 4.57.0; older releases run it causal.
BIDIRECTIONAL_IGNORED = Window("transformers", "<4.57.0", "4.57.0")
# Each load + save of a bidirectional gemma3_text config halves sliding_window again (4.57.0-5.15.x; 5.16.0 fixed).
SLIDING_WINDOW_HALVED = Window("transformers", ">=4.57.0,<5.16.0", "5.16.0")
# Gemma 2's default attention is SDPA (which drops attn_logit_softcapping) in 4.42-4.44 and 4.48-5.20.
GEMMA2_SDPA_DEFAULT = (Window("transformers", ">=4.42.0,<4.45.0"), Window("transformers", ">=4.48.0,<5.21.0", "5.21.0"))
# From 5.21.0 SDPA refuses softcapping (ValueError) instead of dropping it.
SDPA_SOFTCAP_RAISES = Window("transformers", ">=5.21.0")
# masking_utils turns reset position_ids into a block-diagonal mask (eager/sdpa packing) from 4.53.1.
PACKED_MASK_MISSING = Window("transformers", "<4.53.1", "4.53.1")
# TRL's collator drops position_ids unless the backend is flash_attention_2 and keeps an all-ones attention_mask.
TRL_PACKING_NO_POSITION_IDS = Window("trl", ">=0.19.0,<0.20.0", "0.20.0")
# TRL's SFTTrainer and DPOTrainer compute per-token log-probs in chunks, never materialising b*s*V logits (1.15.0;
# trainers.CHUNKING_TRAINERS).
TRL_CHUNKED_LOGPROBS = Window("trl", ">=1.15.0")
# GRPOConfig's max_completion_length defaults to 512 from TRL 1.10.0, 256 before (1.9.2's and 0.24.0's grpo_config.py;
# 1.10.0-1.16.0's read): the completion a GRPO run generates where its config writes none (run.Generation).
TRL_GRPO_COMPLETION_512 = Window("trl", ">=1.10.0")
# TRL adds a second <bos> to a conversational dataset before 0.17.0 (TRL PR #3328).
TRL_CONVERSATIONAL_DOUBLE_BOS = Window("trl", "<0.17.0", "0.17.0")
# TRL's trainers load a model id in float32 unless model_init_kwargs (or `trl <command>`'s ModelConfig) gives a dtype:
# create_model_from_path's `kwargs.get("dtype", "float32")` and ModelConfig.dtype's default "float32" from 0.27.0 (read
# from the wheels: 0.24.0 and 0.25.1 pass None, 0.26.2 "auto"; 0.27.0-1.16.0 "float32"; reproduced with TRL 1.16.0 on a
# tiny bf16 Gemma 3: float32 parameters, bfloat16 with dtype: bfloat16 or auto). Before 0.27 the load follows
# from_pretrained's own default, which is float32 before transformers 5.0 (5.x reads the checkpoint's dtype).
TRL_LOADS_FP32 = Window("trl", ">=0.27.0")
FROM_PRETRAINED_FP32 = Window("transformers", "<5.0.0", "5.0.0")
# TRL's configs turn gradient checkpointing on unless told otherwise (TrainingArguments: off), read from the wheels:
# SFTConfig from 0.21.0 (0.20.0 keeps TrainingArguments' False), DPOConfig and GRPOConfig from 0.22 (read on 0.22.2;
# 0.21.0 has no override), every trainer's config from 0.29.0 (trl/trainer/base_config.py _BaseConfig).
TRL_CHECKPOINTING_DEFAULT = {"trl-sft": Window("trl", ">=0.21.0"), "trl-dpo": Window("trl", ">=0.22.0"),
                             "trl-grpo": Window("trl", ">=0.22.0"), "trl-rl": Window("trl", ">=0.29.0")}
# TRL's configs train in bf16 unless told otherwise (TrainingArguments: fp32): their __post_init__ sets
# `self.bf16 = not (self.fp16) if self.bf16 is None else self.bf16`, so a config that sets no bf16 trains in bf16, and
# one that sets only `fp16: false` too. Read from the wheels: SFTConfig, DPOConfig, GRPOConfig, KTOConfig, ORPOConfig and
# RewardConfig from 0.19.0 (0.18.2's keep TrainingArguments' False), RLOOConfig from 0.22 (rewritten), every trainer's
# config from 0.29.0 (trl/trainer/base_config.py _BaseConfig). Reproduced on TRL 1.16.0: SFTConfig(), DPOConfig(),
# GRPOConfig() have bf16 True, SFTConfig(fp16=False) too (tests/scripts/trl_load_dtype.py).
TRL_BF16_DEFAULT = {"trl-sft": Window("trl", ">=0.19.0"), "trl-dpo": Window("trl", ">=0.19.0"),
                    "trl-grpo": Window("trl", ">=0.19.0"), "trl-rl": Window("trl", ">=0.29.0")}


# --- distributed runs (rules/distributed.py; docs/findings.md GD66x) -----------------------------------------------

# FSDP transformer-based auto-wrap without a class list wraps `model._no_split_modules`, and accelerate raises "Could
# not find the transformer layer class X in the model" for a class the model lacks. Read from every released wheel's
# modeling_gemma3.py: Gemma3PreTrainedModel lists the three Siglip tower classes from 4.50.0 to 5.14.1 (a text-only
# Gemma3ForCausalLM has none of them) and only Gemma3DecoderLayer from 5.15.0. Gemma4PreTrainedModel lists
# Gemma4VisionEncoderLayer and Gemma4AudioLayer in every release from 5.5.0 (and Gemma4VisionPatchEmbedder from
# 5.10), still in 5.24.0: no fixed release yet. Reproduced with accelerate 1.10.1 and 1.15.0 (tests/test_distributed.py).
FSDP_WRAP_GEMMA3_TOWERS = Window("transformers", ">=4.50.0.dev0,<5.15.0", "5.15.0")
FSDP_WRAP_GEMMA4_TOWERS = Window("transformers", ">=5.5.0.dev0")
# Under DeepSpeed ZeRO-3, transformers loads parameters through _load_state_dict_into_zero3_model, which skipped
# buffers until 5.6.0 ("Buffers are not partitioned by ZeRO-3, load them directly", absent from the 5.5.0-5.5.4 wheels'
# integrations/deepspeed.py): Gemma 4's Gemma4ClippableLinear clip bounds (input_min/max, output_min/max buffers of the
# towers) stay at +-inf (transformers #45397, PR #45402; LLaMA-Factory #10355; ms-swift #9078).
ZERO3_GEMMA4_CLIP_BUFFERS = Window("transformers", ">=5.5.0.dev0,<5.6.0", "5.6.0")
# accelerate 1.14.0's fsdp2_prepare_model puts a tied input embedding in a tail group fully_shard([final_norm,
# input_embed]) and leaves lm_head (the same parameter) to the root group; torch >= 2.13 refuses a parameter seen by two
# FSDP groups ("Parameter 'model.embed_tokens.weight' is shared with a parameter already managed by another FSDP
# group"). 1.13.0 has no tail group; 1.15.0 adds output_embed to it (accelerate PR #4171). Read from the three wheels;
# reproduced on CPU with 2 gloo processes (tests/scripts/fsdp2_tied.py): 1.14.0 raises, 1.15.0 trains.
FSDP2_TIED_TAIL_GROUP = Window("accelerate", "==1.14.0", "1.15.0")
FSDP2_SHARED_PARAM_CHECK = Window("torch", ">=2.13.0.dev0")
# TrainingArguments' FSDP defaults (training_args.py of every 5.x wheel): up to 5.9.0 the `fsdp` option needs
# "auto_wrap" for transformer-based wrapping and FSDP defaults to version 1; from 5.10.1 (the next release) any `fsdp`
# wraps TRANSFORMER_BASED_WRAP unless fsdp_config names another auto_wrap_policy, and the version defaults to 2.
TRAINER_FSDP2_DEFAULTS = Window("transformers", ">=5.10.0")
