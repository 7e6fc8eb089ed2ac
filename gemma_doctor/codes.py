"""The catalogue of finding codes: one stable code per kind of finding, documented in docs/findings.md.

Every code a rule emits must be listed here (a test checks it, and that docs/findings.md documents
each one). Codes are never renumbered; a retired code stays reserved. What a finding *is* (where it points, what
cures it, whether the model could be read, whether it is a verdict of the memory plan) is data on its entry, read by
every view (list's status, `--format github`'s annotation, the prescription's search), as ruff's codes table maps
each code to its rule and group in one place.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Callable, Iterable, TypeVar

F = TypeVar("F", bound=Callable[..., object])


class Site(str, enum.Enum):
    """Where a finding of a code points."""

    MODEL = "model"  # a file of the model's snapshot (or adapter folder), named relative to it
    RUN = "run"  # a setting of the training config, as the user named the file (key and line); without one, the
    #              model's config.json or nothing
    NONE = "none"  # the stack or the GPU: no file


class Cure(str, enum.Enum):
    """What cures a finding of a code."""

    FIX = "fix"  # `gemma-doctor fix` rewrites the model's config files, reading nothing else
    REDOWNLOAD = "redownload"  # files no fix repairs (missing, truncated, from another revision): download them again
    OTHER = "other"  # the run's settings, the stack, or the user's hands: what the finding's own text says


@dataclass(frozen=True)
class Code:
    """A finding code with its short name, one-line title, and what a finding of it is."""

    code: str
    name: str
    title: str
    site: Site = Site.MODEL
    cure: Cure = Cure.OTHER
    unreadable: bool = False  # the model (or its repo) could not be read: nothing else about it was judged
    memory: bool = False  # a verdict of the memory plan: memory changes answer it (a larger GPU, a shorter sequence)
    outside_scope: bool = False  # the model is not one gemma-doctor judges (not a Gemma): reported, nothing else said
    # Its findings name the transformers window (or minimum) they need: where the stack does not say which transformers
    # will run, a version pin in the prescription resolves them (plan/search._pin; "transformers>=5.6.0" for GD105).
    pins: bool = False
    # Its findings are about the run's gradient accumulation: the same run without accumulation does not meet them, so
    # where every accumulating run is refused for one, the search prescribes the run without it and says why
    # (plan/search._on_accumulation; GD739). Generated for the catalogue's codes from their conditions.
    accumulation: bool = False
    # Its findings are about the command line's own input, not the run (a misspelt --with name): no run the search
    # could prescribe answers them, so they never reject one, and the run planned is the one without the typo.
    about_input: bool = False

    @property
    def blocks_prescription(self) -> bool:
        """At warning or error it rejects a prescribed run: what `fix` cures on disk is done first, not prescribed, and
        a finding about the command line's input is answered by correcting it, not by another run."""
        return self.cure is not Cure.FIX and not self.about_input

    def at_training_config(self, file: str | None, training_config: str | None) -> bool:
        """Whether a finding of this code naming ``file`` points at the training config ``training_config``."""
        return self.site is Site.RUN and file is not None and training_config is not None and file == training_config


_CODES = [
    # GD0xx: reading the model folder
    Code("GD001", "config-unreadable", "config.json is missing, unreadable or not valid JSON", unreadable=True),
    Code("GD002", "config-invalid", "config.json parses but has the wrong shape (not an object, wrong type for a key)", unreadable=True),
    Code("GD003", "not-gemma", "the model is not a Gemma-family model; gemma-doctor leaves it alone", outside_scope=True),
    Code("GD004", "generation-config-invalid", "generation_config.json is unreadable, not JSON or has the wrong shape", unreadable=True),
    Code("GD005", "link-escapes-repo", "a snapshot file is a link that points outside its repo folder; it is not read or written", unreadable=True),
    Code("GD006", "fixed-by-doctor", "files of this snapshot were rewritten by gemma-doctor fix; restore brings back the originals"),
    Code("GD007", "unknown-gemma-type", "model_type names a Gemma that gemma-doctor does not know; nothing is guessed from the name"),
    Code("GD020", "repo-unreadable", "a cached repo folder cannot be read safely (unreadable, a link, not a folder, or not named like a repo); not checked", unreadable=True),
    Code("GD021", "ref-invalid", "a ref of a cached repo does not hold a commit hash (or is a link, or names a missing snapshot); the repo is not read", unreadable=True),
    Code("GD022", "snapshot-entry-invalid", "an entry of a repo's snapshots/ folder is a link or not named by a commit hash; not read", unreadable=True),
    Code("GD080", "config-too-large", "config.json is larger than 16 MiB: not a config, and not read", unreadable=True),
    # GD1xx: the HybridCache crash and use_cache
    Code("GD101", "use-cache-enabled", "use_cache is not disabled where the text model reads it", cure=Cure.FIX),
    Code("GD102", "generation-use-cache", "generation_config.json lacks \"use_cache\": false", cure=Cure.FIX),
    Code("GD103", "transformers-hybridcache-bug", "installed transformers 4.50.0-4.50.3 crashes bf16/fp16 evaluation of this model", site=Site.NONE),
    Code("GD104", "top-level-use-cache-only", "use_cache is false at the top level only, which the text model does not read", cure=Cure.FIX),
    Code("GD105", "token-type-ids-required", "multimodal Gemma 3 / PaliGemma: text-only training raises 'token_type_ids is required' on transformers 5.0-5.5 (PaliGemma: 5.0-5.8)", pins=True),
    Code("GD106", "mm-token-type-ids-required", "Gemma 4 with vision-bidirectional attention: text-only training raises 'mm_token_type_ids is required' on transformers 5.5.x", pins=True),
    Code("GD107", "kv-sharing-without-cache", "Gemma 4 KV sharing is skipped without a cache on transformers 5.5.0-5.5.1: wrong loss with use_cache=False", site=Site.RUN, pins=True),
    Code("GD108", "model-type-unknown-to-transformers", "the transformers that will run is older than the first release that knows this model_type", pins=True),
    Code("GD109", "rope-parameters-unread", "RoPE scaling saved by transformers 5.x as rope_parameters is silently ignored by transformers 4.x", pins=True),
    Code("GD110", "gemma3n-needs-timm", "Gemma 3n's vision tower needs timm and Pillow, which are not installed"),
    # GD12x: the knowledge horizon
    Code("GD120", "newer-than-verified", "a library that will run is newer than the newest release the findings were verified on", site=Site.NONE),
    # GD13x: member-specific training traps (Gemma 4 and the other new members)
    Code("GD130", "reentrant-checkpointing-kv-shared", "reentrant gradient checkpointing on a KV-shared Gemma 4 silently corrupts its gradients", site=Site.RUN),
    Code("GD131", "flash-attention-head-dim", "FlashAttention asked for a model whose global attention heads are wider than 256", site=Site.RUN),
    Code("GD132", "attention-backend-unsupported", "the training config asks for an attention implementation the model does not support", site=Site.RUN),
    Code("GD133", "ddp-unused-towers", "multi-GPU DDP on Gemma 4 with towers that text-only batches leave without gradients", site=Site.RUN),
    # GD2xx: saved dtypes, safetensors shards, quantization
    Code("GD201", "dtype-mismatch", "the dtype config.json declares differs from the dtype the weights are saved in"),
    Code("GD202", "fp16-gemma", "Gemma 2/3 weights, declared dtype or quantized compute dtype is float16, whose range they overflow"),
    Code("GD203", "shard-missing", "a safetensors file the model needs is missing (or a dangling link)", cure=Cure.REDOWNLOAD),
    Code("GD204", "shard-corrupt", "a safetensors file has an invalid header or a truncated/oversized data section", cure=Cure.REDOWNLOAD),
    Code("GD205", "quantized", "the checkpoint is quantized (bitsandbytes, GPTQ, AWQ...); its compute dtype is reported"),
    Code("GD206", "index-invalid", "model.safetensors.index.json is unreadable or disagrees with the shards", cure=Cure.REDOWNLOAD),
    # GD3xx: the GPU and precision
    Code("GD301", "no-cuda-device", "no GPU is visible (or --gpu none): the recommendation is for CPU training", site=Site.NONE),
    Code("GD302", "no-native-bf16", "the GPU has no native bf16 and the model (Gemma 2/3/3n, PaliGemma 2) overflows fp16: train in fp32", site=Site.NONE),
    Code("GD303", "emulated-bf16-trap", "torch.cuda.is_bf16_supported() says True on this GPU through emulation, so bf16: auto picks slow bf16", site=Site.NONE),
    Code("GD304", "bf16-capability-unknown", "the GPU's bf16 support is unknown; the recommendation assumes no native bf16", site=Site.NONE),
    # GD4xx: library combinations
    Code("GD401", "peft-adapters-half-precision", "PEFT < 0.12 keeps LoRA adapters in the base model's half precision (NaN risk)", site=Site.NONE),
    Code("GD402", "bnb-compute-bf16-not-native", "the checkpoint's bitsandbytes 4-bit compute dtype is bfloat16 on a GPU without native bf16", site=Site.NONE),
    Code("GD420", "lora-no-default-targets", "LoRA on a multimodal Gemma 3/3n/PaliGemma checkpoint without target_modules: PEFT has no default for it", site=Site.RUN),
    Code("GD421", "lora-targets-hit-towers", "LoRA targets (all-linear, bare names) on a multimodal checkpoint also wrap its vision/audio towers", site=Site.RUN),
    Code("GD422", "peft-embed-scale-ignored", "PEFT < 0.18 ignores the scaled embedding when embed_tokens is a LoRA target or has trainable tokens", site=Site.RUN),
    Code("GD423", "bidirectional-ignored", "use_bidirectional_attention (EmbeddingGemma) is not read by transformers < 4.57: the model runs causal", pins=True),
    Code("GD424", "sliding-window-halved", "transformers 4.57-5.15 halve a bidirectional config's sliding_window at every load + save"),
    Code("GD425", "lora-targets-match-nothing", "the training config's LoRA targets match no linear layer of a text-only Gemma: PEFT refuses the model", site=Site.RUN),
    Code("GD440", "peft-targets-clippable-linear", "plain LoRA target names match Gemma 4's tower projections (Gemma4ClippableLinear), which PEFT refuses", site=Site.RUN),
    Code("GD441", "peft-all-linear-towers", "all-linear LoRA on Gemma 4 puts adapters in the vision/audio towers", site=Site.RUN),
    Code("GD442", "peft-moe-experts-untargeted", "the MoE experts are 3-D parameters no target_modules reaches (target_parameters needed)", site=Site.RUN),
    Code("GD443", "peft-kv-shared-no-kv-proj", "KV-shared Gemma 4 layers have no k_proj/v_proj, so they get no adapters there", site=Site.RUN),
    Code("GD480", "package-name-unknown", "a package named in --with or the requirements file is not one gemma-doctor knows (a misspelling is an error, with the name it most likely means)", site=Site.NONE, about_input=True),
    # GD5xx: the weights scan (check --weights)
    Code("GD501", "weights-nan-inf", "tensors hold NaN or Inf values"),
    Code("GD502", "weights-beyond-fp16", "tensors hold finite values beyond fp16's range (|x| > 65504)"),
    Code("GD503", "zero-embedding-rows", "an embedding or lm_head matrix has all-zero rows (a NaN risk when fine-tuning)"),
    Code("GD504", "weights-not-scanned", "tensors of other dtypes than F32/F16/BF16, or unreadable shards, were not scanned"),
    Code("GD505", "embedding-shorter-than-tokenizer", "the tokenizer has token ids beyond the embedding's rows (tokens added, model not resized)"),
    # GD6xx: training-config lint (--training-config)
    Code("GD601", "training-config-unreadable", "the training config is unreadable, not JSON/YAML, or not a mapping of settings", site=Site.RUN),
    Code("GD602", "fp16-on-gemma", "fp16 mixed precision on a Gemma 2/3 model, whose activations exceed fp16's range", site=Site.RUN),
    Code("GD603", "bf16-not-native", "bf16 is enabled on a GPU without native bf16 (compute capability < 8.0)", site=Site.RUN),
    Code("GD604", "fp16-and-bf16", "fp16 and bf16 are both enabled", site=Site.RUN),
    Code("GD605", "bf16-auto-emulated", "bf16: auto would resolve to emulated bf16 on this GPU", site=Site.RUN),
    Code("GD606", "training-use-cache", "the training config turns use_cache on (gradient checkpointing conflict, HybridCache crash)", site=Site.RUN),
    Code("GD607", "dpo-no-grad-clipping", "DPO on Gemma without max_grad_norm (gradient clipping)", site=Site.RUN),
    Code("GD608", "qlora-compute-dtype", "the 4-bit QLoRA compute dtype does not suit the GPU or the model", site=Site.RUN),
    Code("GD609", "no-mixed-precision", "the training config sets no mixed precision: the run trains in fp32", site=Site.RUN),
    Code("GD610", "fp16-load-dtype", "the training config loads a Gemma 2/3 model in float16 (torch_dtype/dtype), whose range its activations overflow", site=Site.RUN),
    Code("GD611", "fp16-float16-trainable-weights", "full fine-tuning in fp16 mixed precision of weights loaded in float16 (a torch_dtype, or axolotl's fp16): the Trainer's GradScaler refuses float16 gradients at the first step", site=Site.RUN),
    Code("GD612", "trl-lora-without-use-peft", "a TRL config writes LoRA keys (lora_*, use_dora, use_rslora) or 4-bit / 8-bit loading without use_peft: true: TRL trains every weight, or refuses a quantized model without adapters", site=Site.RUN),
    Code("GD620", "kv-sharing-gradient-checkpointing", "gradient checkpointing on a KV-shared Gemma 4 with transformers 5.5.0-5.5.1: the sharing is skipped, the loss is wrong", site=Site.RUN),
    Code("GD683", "flash-attention-needs-ampere", "FlashAttention-2 on a GPU before Ampere (T4, V100): flash-attn 2 refuses it at the first forward", site=Site.RUN),
    Code("GD684", "flash-attention-fp32", "FlashAttention-2 on fp32 weights without mixed precision: flash-attn refuses fp32 inputs", site=Site.RUN),
    Code("GD680", "training-config-key-unknown", "a key of a TRL / TrainingArguments or LLaMA-Factory config is no setting of its trainer but close to one (a misspelling): the trainer refuses it", site=Site.RUN),
    Code("GD986", "axolotl-config-key-unknown", "a key of an axolotl config is no field of axolotl's schema but close to one (a misspelling): axolotl drops it and trains with the default", site=Site.RUN),
    Code("GD681", "training-config-value-not-boolean", "a boolean setting of a TRL / TrainingArguments or axolotl config holds a value its parser does not read as one (bf16: ture), or of a LLaMA-Factory config a string, which it reads as true", site=Site.RUN),
    Code("GD640", "gemma2-softcap-dropped", "Gemma 2 on a backend that drops attn_logit_softcapping (SDPA, or flash-attn < 2.6)", site=Site.RUN),
    Code("GD641", "fa2-head-dim-backward", "FlashAttention-2 < 2.5.5 refuses the backward of head_dim > 192 outside A100/H100", site=Site.RUN),
    Code("GD645", "packing-contamination", "packing / padding-free without a backend or versions that keep packed sequences apart", site=Site.RUN),
    Code("GD650", "logits-fp32-memory", "the fp32 logits of Gemma's large vocabulary take gigabytes at this batch x sequence", site=Site.RUN),
    # BEGIN field catalogue: generated by `python docs/gen_catalogue.py`, do not edit
    # GD7xx: the field catalogue (gemma_doctor/catalogue/field.json)
    Code("GD701", "assistant-mask-empty-gemma", "assistant_only_loss on a Gemma 1/2 chat template without {% generation %} markers: an all-zero assistant mask"),
    Code("GD702", "assistant-mask-empty-gemma3", "assistant_only_loss on Gemma 3's chat template, which has no {% generation %} markers: an all-zero assistant mask"),
    Code("GD703", "assistant-mask-unsupported-gemma4", "assistant_only_loss on Gemma 4: its template has no {% generation %} markers and no TRL release has a training template for it"),
    Code("GD704", "raw-text-without-bos", "Gemma 4's tokenizer has add_bos_token false: raw-text (completion / continued pre-training) data is tokenized without <bos>"),
    Code("GD705", "bnb-load-defaults-fp16", "8-/4-bit bitsandbytes loading with no dtype: transformers 4.x overrides it to float16, which Gemma 2/3 overflow", site=Site.RUN),
    Code("GD706", "tgi-vlm-prefix-caching", "TGI 3.x refuses multimodal Gemma 3 with its default prefix caching", site=Site.NONE),
    Code("GD707", "vllm-too-old-for-gemma3", "vLLM before 0.8.0 does not know Gemma 3", site=Site.NONE),
    Code("GD708", "vllm-too-old-for-gemma4", "vLLM before 0.19.0 does not know Gemma 4", site=Site.NONE),
    Code("GD709", "vllm-gemma4-new-transformers", "vLLM up to 0.27.1 with transformers 5.15 or later fails to load Gemma 4", site=Site.NONE),
    Code("GD710", "liger-kernel-lacks-gemma3", "Liger Kernel before 0.5.7 has no Gemma 3 patch", site=Site.RUN),
    Code("GD711", "llamafactory-liger-skips-gemma3", "LLaMA-Factory before 0.9.3 does not apply Liger Kernel to Gemma 3: the switch is silently a no-op", site=Site.RUN),
    Code("GD712", "multimodal-template-on-text-gemma3", "LLaMA-Factory's gemma3 template is multimodal: on a text-only Gemma 3 (270M, 1B) it asks for a processor the checkpoint does not have", site=Site.RUN),
    Code("GD713", "padding-free-without-packing", "TRL 1.x refuses padding_free without packing while max_length is set (its default is 1024)", site=Site.RUN),
    Code("GD714", "unsloth-forced-fp32-full-finetune", "Unsloth's forced-float32 Gemma 3 path (GPUs without bf16) crashes full fine-tuning: float16 activations meet float32 weights", site=Site.RUN),
    Code("GD715", "fp8-quantized-vision-tower", "An FP8 (compressed-tensors) Gemma 3 whose recipe also quantized the SigLIP tower does not load in vLLM"),
    Code("GD716", "fp8-quantized-moe-router", "An FP8 Gemma 4 MoE whose recipe quantized the router projections does not load in vLLM"),
    Code("GD717", "ollama-too-old-for-gemma3", "Ollama before 0.6.0 cannot run Gemma 3", site=Site.NONE),
    Code("GD718", "gemma4-sdpa-batched-nan", "Gemma 4 with SDPA attention, bf16 and a batch of 2 or more: NaN loss after a few steps (reported on H100)", site=Site.RUN),
    Code("GD719", "gemma4-fp16-rl-overflow", "Gemma 4 GRPO in float16 overflows in the first MLP down_proj: inf residuals, NaN logits, a device-side assert", site=Site.RUN),
    Code("GD720", "rl-logit-softcap-formula", "Unsloth's RL log-probabilities apply Gemma's final logit softcap with the wrong formula: the cap does nothing", site=Site.RUN),
    Code("GD721", "ollama-too-old-for-gemma2", "Ollama before 0.1.47 cannot run Gemma 2", site=Site.NONE),
    Code("GD722", "ollama-too-old-for-gemma", "Ollama before 0.1.26 cannot run Gemma", site=Site.NONE),
    Code("GD723", "vllm-gemma3-transformers-skew", "vLLM up to 0.8.5.post1 with transformers 4.53 or later cannot read Gemma 3's config", site=Site.NONE),
    Code("GD724", "vllm-too-old-for-gemma2", "vLLM before 0.5.1 does not know Gemma 2", site=Site.NONE),
    Code("GD725", "vllm-gemma2-needs-flashinfer", "vLLM 0.5.1-0.5.3 refuses Gemma 2 unless the FlashInfer backend is chosen: its other backends had no logit soft-capping", site=Site.NONE),
    Code("GD726", "tgi-too-old-for-gemma", "TGI before 1.4.2 cannot serve Gemma", site=Site.NONE),
    Code("GD727", "sglang-too-old-for-gemma3", "SGLang before 0.4.4.post2 has no Gemma 3 model: with the transformers Gemma 3 needs, it does not even start", site=Site.NONE),
    Code("GD728", "ollama-too-old-for-gemma3n", "Ollama before 0.9.3 cannot run Gemma 3n", site=Site.NONE),
    Code("GD729", "lora-no-default-targets-gemma2", "LoRA through TRL (use_peft, no target_modules) on Gemma 2 with PEFT before 0.13.0: PEFT has no default targets for gemma2", site=Site.RUN),
    Code("GD730", "lora-targets-pre-452-layout", "A LoRA target regex written for the module names before transformers 4.52 (language_model.model.layers...) matches nothing in a multimodal Gemma on 4.52 or later", site=Site.RUN),
    Code("GD731", "lora-targets-post-452-layout", "A LoRA target regex written for the module names of transformers 4.52 and later (model.language_model.layers...) matches nothing in a multimodal Gemma on an older transformers", site=Site.RUN),
    Code("GD732", "tgi-gemma3-needs-flash-attn-2", "TGI serves Gemma 3's sliding-window layers only with FlashAttention 2: on a GPU without it (pre-Ampere) generation fails", site=Site.NONE),
    Code("GD733", "liger-kernel-skips-gemma4-unified", "Liger Kernel has no patch for Gemma 4 unified (12B): the switch is a no-op and the full logits are materialised", site=Site.RUN),
    Code("GD734", "llama-cpp-python-lacks-embeddinggemma", "llama-cpp-python before 0.3.17 does not know EmbeddingGemma's GGUF architecture"),
    Code("GD735", "unsloth-too-old-for-gemma3", "Unsloth before 2025.3.10 does not know Gemma 3", site=Site.NONE),
    Code("GD736", "llama-cpp-python-lacks-gemma3", "llama.cpp builds before Gemma 3 support (llama-cpp-python before 0.3.8) reject its GGUF", site=Site.NONE),
    Code("GD737", "llama-cpp-python-lacks-gemma3n", "llama.cpp bindings with an older vendored llama.cpp (llama-cpp-python before 0.3.10) do not know Gemma 3n", site=Site.NONE),
    Code("GD738", "llama-cpp-python-lacks-gemma4", "llama.cpp builds before Gemma 4 support (llama-cpp-python before 0.3.20) reject its GGUF", site=Site.NONE),
    Code("GD739", "gemma3-grad-accum-loss-scaled", "Gemma 3's multimodal class under the Trainer with gradient accumulation: the logged loss, the gradients and the update are multiplied by the accumulation steps (transformers before 4.57)", site=Site.RUN, accumulation=True),
    Code("GD780", "axolotl-gemma-turn-end-untrained", "axolotl's chat_template strategy on Gemma without eot_tokens: the turn terminator (<end_of_turn>, Gemma 4's <turn|>) is masked, so the model never learns to stop", site=Site.RUN),
    # END field catalogue

    # GD8xx: memory (the plan of gemma_doctor/plan/memory.py against the GPU's memory)
    # GD74x-GD77x: after training (adapters, checkpoints, merged models)
    Code("GD741", "adapter-unreadable", "a PEFT adapter folder whose adapter_config.json or adapter_model.safetensors cannot be read"),
    Code("GD742", "adapter-base-not-found", "the adapter's base model (base_model_name_or_path) is not named, or not here: base checks skipped"),
    Code("GD743", "adapter-base-not-gemma", "the adapter's base model is not a Gemma-family model; the adapter is left alone"),
    Code("GD750", "tied-head-saved-apart", "a model folder saves lm_head.weight apart from embed_tokens while its config ties them: transformers 4.x discards the head at load"),
    Code("GD751", "adapter-unties-embeddings", "modules_to_save trains embed_tokens / lm_head apart without ensure_weight_tying: a PEFT < 0.19 merge loses the head"),
    Code("GD752", "adapter-modules-to-save-vllm", "the adapter saves full modules (modules_to_save), which vLLM refuses to load as a LoRA adapter"),
    Code("GD760", "adapter-key-layout", "the adapter's keys use transformers >= 4.52's multimodal layout, which the transformers that will run does not have"),
    Code("GD761", "adapter-key-layout-old", "the adapter's keys use the pre-4.52 multimodal layout and the PEFT that will load it (< 0.16) does not map them"),
    Code("GD770", "processor-config-missing", "a saved multimodal Gemma folder lacks preprocessor_config.json: AutoProcessor and vLLM cannot load it"),
    Code("GD771", "gguf-tokenizer-model-missing", "a saved Gemma 1/2 folder has tokenizer.json but no tokenizer.model, which llama.cpp's GGUF converter reads"),
    Code("GD772", "vllm-gemma4-lora-unsupported", "a LoRA adapter on Gemma4ForConditionalGeneration: vLLM serves Gemma 4 LoRA from 0.20.0 (0.19.x has no LoRA for it)"),
    Code("GD773", "vllm-gemma3n-lora-unsupported", "a LoRA adapter on Gemma 3n: no vLLM release (0.9.2-0.33.0) declares LoRA support for Gemma 3n"),
    Code("GD774", "vllm-gemma4-lora-tower-keys", "a Gemma 4 adapter trains modules in the vision/audio towers, which vLLM's LoRA loader rejects"),
    Code("GD775", "vllm-gemma3-causal-language-model-keys", "config.json names Gemma3ForCausalLM but the weights keep language_model.* keys: vLLM cannot load them"),
    Code("GD660", "fsdp-wrap-class-absent", "FSDP transformer-based auto-wrap without a class list names layer classes this checkpoint lacks: accelerate stops", site=Site.RUN),
    Code("GD661", "zero3-gemma4-clip-buffers", "DeepSpeed ZeRO-3 on a Gemma 4 with towers on transformers 5.5.x: the clip buffers are not loaded", site=Site.RUN),
    Code("GD662", "fsdp2-tied-embeddings", "FSDP2 on a tied-embedding Gemma with accelerate 1.14.0 and torch >= 2.13: the shared parameter is refused", site=Site.RUN),
    Code("GD663", "deepspeed-batch-mismatch", "the DeepSpeed JSON writes a micro batch, accumulation or global batch that differs from TrainingArguments': the Trainer stops at start-up", site=Site.RUN),
    Code("GD664", "grpo-generation-batch-indivisible", "a GRPO run's generation batch is not a multiple of num_generations (or of the global batch): TRL's GRPOConfig stops at start-up", site=Site.RUN),
    Code("GD682", "fsdp-wrap-class-unknown", "the FSDP wrap class list names a class this model does not have (another Gemma's layer, a typo): accelerate stops", site=Site.RUN),
    # GD8xx: memory (the plan of gemma_doctor/memory.py against the GPU's memory)
    Code("GD801", "run-does-not-fit", "the training run as configured needs more memory than the GPU has", site=Site.RUN, memory=True),
    Code("GD802", "run-tight", "the planned run fits in the GPU's memory with less than 10% to spare", site=Site.RUN, memory=True),
    Code("GD803", "nothing-fits", "no fine-tuning method (full, LoRA, QLoRA) fits this GPU; a larger one is named", site=Site.RUN, memory=True),
    Code("GD804", "towers-loaded-for-nothing", "text-only training of a multimodal checkpoint loads its vision/audio towers", site=Site.RUN),
    # GD9xx: BOS/EOS and generation
    Code("GD901", "eos-lacks-end-of-turn", "a chat checkpoint's eos_token_id lacks <end_of_turn>: generate() never stops"),
    Code("GD902", "pad-is-eos", "the pad token is the EOS token: the language-modelling collator masks EOS out of the loss"),
    Code("GD903", "double-bos", "the chat template writes <bos> and the tokenizer adds another to re-tokenized rendered text"),
    # GD95x-GD97x: the rehearsal (gemma_doctor/rehearse/, docs/rehearsal.md): a run's stages on a twin of the model
    Code("GD950", "not-rehearsable", "a library the run needs is not installed where the rehearsal runs: nothing is rehearsed"),
    Code("GD951", "part-needs-gpu", "a part of the run needs a GPU this machine lacks (bitsandbytes, flash-attention, Unsloth, sharding): rehearsed without it"),
    Code("GD952", "rehearsal-timeout", "the rehearsal's child passed its deadline and was killed with its process group"),
    Code("GD953", "rehearsal-died", "the rehearsal's child ended without finishing its stages (killed, out of memory, a crash in native code)"),
    Code("GD954", "twin-crashed", "the installed stack could not build the model's twin"),
    Code("GD955", "load-crashed", "the rehearsal crashed loading the model through the installed stack"),
    Code("GD956", "setup-crashed", "the rehearsal crashed building the trainer from the training config (LoRA targets, arguments), or the launched script crashed outside the Trainer"),
    Code("GD957", "train-crashed", "the rehearsal crashed in a training step"),
    Code("GD958", "eval-crashed", "the rehearsal crashed in evaluation"),
    Code("GD959", "generate-crashed", "the rehearsal crashed generating with the trained model"),
    Code("GD960", "save-crashed", "the rehearsal crashed saving or reloading the checkpoint"),
    Code("GD961", "merge-crashed", "the rehearsal crashed merging the adapter or reloading the merged folder"),
    Code("GD962", "labels-crashed", "the rehearsal crashed collating the first batch of the training data"),
    Code("GD963", "accumulation-crashed", "the rehearsal crashed in the gradient accumulation check"),
    Code("GD964", "real-weights-crashed", "--real-weights: the measured training step of the real checkpoint could not run"),
    Code("GD965", "loss-not-finite", "a rehearsed training step gave a NaN or infinite loss"),
    Code("GD966", "loss-zero", "the rehearsed training loss is 0 at every step: nothing is learned"),
    Code("GD967", "grad-norm-not-finite", "a rehearsed training step gave a NaN or infinite gradient norm"),
    Code("GD968", "grad-norm-zero", "the rehearsed gradient norm is 0 at every step: no parameter receives a gradient"),
    Code("GD969", "parameters-unchanged", "no trainable parameter changed over the rehearsed steps"),
    Code("GD970", "lora-b-unchanged", "no LoRA B matrix moved over the rehearsed steps: the adapter stays an identity"),
    Code("GD971", "sample-trains-nothing", "a sample of the first batch trains no token (every label masked)"),
    Code("GD972", "end-of-turn-not-trained", "samples hold the end-of-turn token without training it: the model never learns to stop"),
    Code("GD973", "prompt-not-masked", "a completion-only run trains the prompt tokens too"),
    Code("GD974", "generation-cache-mismatch", "greedy generation with the KV cache gives other tokens than without it"),
    Code("GD975", "reload-differs", "the saved checkpoint reloads with other logits than the model that was saved"),
    Code("GD976", "merge-differs", "the merged model's logits are not those of base + adapter"),
    Code("GD977", "merged-reload-differs", "the merged folder reloads as another model (a head or weights lost at save or load)"),
    Code("GD978", "accumulation-not-equivalent", "b x k accumulated micro-batches give another loss or gradient than one batch of b*k"),
    Code("GD979", "launch-no-trainer", "the launched script ran to its end and built no Trainer: only its load and exit were rehearsed"),
    # GD98x: the rehearsal's real-weights step (gemma_doctor/rehearse/realweights.py, docs/rehearsal.md)
    Code("GD980", "real-fp16-overflow", "one training step of the real weights passes fp16's range (65504): fp16 training overflows"),
    Code("GD981", "real-step-not-finite", "one training step of the real weights gives NaN or infinite values in its precision"),
    Code("GD982", "real-peak-over-device", "one training step of the real weights needs more memory than the device has"),
    Code("GD983", "real-peak-over-plan", "one training step of the real weights needs more than 1.1x the memory plan"),
    Code("GD984", "real-step-oom", "one training step of the real weights ran out of device memory"),
    Code("GD985", "real-fp16-headroom", "measured with the real weights: every activation and gradient fits fp16's range, by the figure given"),
    # GD988-GD989, GD997: the rehearsal's reward modelling loop (gemma_doctor/rehearse/reward.py, docs/rehearsal.md)
    Code("GD988", "reward-lora-causal-task", "the reward model's LoRA is PEFT's causal-LM kind on a sequence classifier: PEFT fails building it (TRL's default lora_task_type)"),
    Code("GD989", "reward-score-head-untrained", "the rehearsed reward model's score head is frozen or did not move: it keeps its random weights"),
    # GD990-GD994: the rehearsal on 2 CPU ranks (gemma_doctor/rehearse/ranks.py, docs/rehearsal.md)
    Code("GD990", "rank-did-not-finish", "a rank of the 2-rank rehearsal crashed (its own last line) or did not finish its stages before the deadline"),
    Code("GD991", "rank-loss-not-finite", "the loss is NaN or infinite on a rank of the 2-rank rehearsal"),
    Code("GD992", "ranks-disagree", "after the steps the full state gathered on each rank differs between the ranks"),
    Code("GD993", "sharded-checkpoint-reload", "the checkpoint the sharded run saves (its state-dict type) does not reload on one process as the trained model"),
    Code("GD994", "fsdp-wrap-class-matches-nothing", "the FSDP wrap classes match no module of the model: accelerate stops, or the run would not shard by layer"),
    # GD995-GD996: the rehearsal's GRPO loop (gemma_doctor/rehearse/grpo.py, docs/rehearsal.md)
    Code("GD995", "grpo-reward-not-finite", "a reward of the rehearsed GRPO run is infinite: TRL zeroes the advantages it poisons and the run learns nothing"),
    Code("GD996", "grpo-zero-advantages", "in every group of the rehearsed GRPO run the rewards are equal: every advantage is 0 and the run learns nothing"),
    Code("GD997", "reward-no-classifier-class", "the installed transformers has no sequence-classification class for this model: no reward model of it can be built as TRL builds one"),
    # GD998-GD999: a launched script's resume (gemma_doctor/rehearse/hook/probe.py, docs/rehearsal.md)
    Code("GD998", "resume-crashed", "the rehearsal crashed resuming from the checkpoint the first steps saved"),
    Code("GD999", "resume-not-continued", "the run resumed from a checkpoint does not continue the uninterrupted run: step counter, optimizer state, learning rate, loss or parameters differ"),
]

CODES: dict[str, Code] = {c.code: c for c in _CODES}


def emits(*codes: str, more: Callable[[], Iterable[str]] | None = None, costly: bool = False,
          model_only: bool = False, model_part: Callable[..., object] | None = None,
          reads: tuple[str, ...] | None = None) -> Callable[[F], F]:
    """Declare, on a rule, the codes its findings have (``more``: those it reads from data, asked for only when wanted)
    and whether it is one of the costly rules (the search tries a candidate with the cheap ones first). What a rule
    emits is then data the search reads (which rules can give a finding a pin resolves), never a list of rule names;
    tests/test_codes_data.py holds every rule's declaration to the codes in its module.

    What a rule reads is declared here too. ``model_only``: its findings are a function of the model's facts, the
    stack, the GPU and the options that describe no run; never of the Run on the facts, the training config or the
    memory options (--method, --batch-size ...). ``model_part``: a rule that reads both, judged in two parts:
    ``model_part(model, env, options)`` reads what a model-only rule reads, and the rule is handed its value as
    ``part=``. Either is judged once per model and stack and shared by check and every candidate of its search
    (rules.Shared); tests/test_rules_model_part.py holds each declaration over random runs.

    ``reads``: for a rule that reads the run, every field it reads, as paths of dataclass fields from its arguments
    (``"model.family"``, ``"model.run.written"``, ``"env.training_config"``, ``"options.task"``), a mapping's keys in
    brackets (``"model.config.data[text_config][pad_token_id]"``): two judgements
    equal on those fields have the same findings, so a judgement takes them from an earlier one of equal fields
    (rules.judge) instead of running the rule again. A path that meets None or a missing key stops there.
    tests/test_rules_reads.py holds each declaration over random runs: a run given another run's values at exactly
    those paths finds what that run finds."""

    def declare(rule: F) -> F:
        def declared() -> frozenset[str]:
            return frozenset(codes) | (frozenset(more()) if more is not None else frozenset())

        rule.codes = declared  # type: ignore[attr-defined]
        rule.costly = costly  # type: ignore[attr-defined]
        rule.model_only = model_only  # type: ignore[attr-defined]
        rule.model_part = model_part  # type: ignore[attr-defined]
        rule.reads = None if reads is None else tuple(_path(p) for p in reads)  # type: ignore[attr-defined]
        return rule

    return declare


_ROOTS = ("model", "env", "options")


def _path(text: str) -> tuple[int, str, tuple[str, ...]]:
    """A declared read, ``"model.run.written"`` or ``"model.config.data[text_config][pad_token_id]"``: the index of its
    root among the rule's three arguments, the dataclass fields below it (dotted) and the mapping keys below those."""
    attrs, _, rest = text.partition("[")
    names = attrs.split(".")
    keys = tuple(rest[:-1].split("][")) if rest else ()
    if names[0] not in _ROOTS or len(names) < 2 or not all(n.isidentifier() for n in names) \
            or rest and not rest.endswith("]") or not all(keys):
        raise ValueError(f"a rule reads a field of {', '.join(_ROOTS)} (and keys below it): {text!r}")
    return _ROOTS.index(names[0]), ".".join(names[1:]), keys


def codes_of(rule: Callable[..., object]) -> frozenset[str]:
    """The codes a rule declared (emits); none for a function that is no declared rule."""
    declared = getattr(rule, "codes", None)
    return declared() if callable(declared) else frozenset()

