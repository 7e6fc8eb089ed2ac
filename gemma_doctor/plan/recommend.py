"""The precision decision: family, saved dtype, GPU, quantization and task -> bf16 | fp16 | fp32, with
reasons and ready-to-paste settings for transformers, TRL, PEFT/bitsandbytes, Unsloth, axolotl, accelerate.

Pure: plain inputs in, a frozen Recommendation out; no torch, no files. The sources of every rule are
in docs/precision.md (facts.md section 3).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, ClassVar, Mapping

from gemma_doctor.errors import UsageError
from gemma_doctor.versioning import PEFT_ADAPTER_FP32, PEFT_CAST_HELPER, parse  # noqa: F401 (named here too)

from gemma_doctor.family import FAMILY_NAMES, LANGUAGE_MODEL_REGEX, family_from_name, fp16_unsafe_family, not_planned
from gemma_doctor.readers.training_config import AXOLOTL_DEEPSPEED_FILES
from gemma_doctor.run import Settings

TASKS = ("sft", "full", "lora", "qlora", "dpo", "orpo", "kto", "grpo", "ppo")
# Preference and RL trainers get seed 003's stable setting (TRL #3236).
RL_TASKS = frozenset({"dpo", "orpo", "kto", "grpo", "ppo"})
QUANTIZATIONS = ("4bit", "8bit", "none")
STABLE_RL_SETTINGS: dict[str, Any] = {"gradient_checkpointing": True, "optim": "adamw_torch_fused", "max_grad_norm": 1.0}
TRANSFORMERS_DTYPE_KWARG = "4.56.0"  # from_pretrained(dtype=...) replaces torch_dtype= (PR #39782)
# TrainingArguments.activation_checkpointing(_kwargs) replace gradient_checkpointing(_kwargs) (FutureWarning on the old
# names): first in the 5.23.0 wheel's training_args.py, absent from 5.22.0's.
TRANSFORMERS_ACTIVATION_CHECKPOINTING = "5.23.0"
OUTPUT_DIR = "outputs"


def normalise_family(text: str) -> str:
    """A --family value -> family label (gemma, gemma2, gemma3, gemma3n, gemma4, paligemma, paligemma2...); UsageError otherwise."""
    why = not_planned(text)
    if why is not None:
        raise UsageError(f"--family {text!r}: {why}")
    label = family_from_name(text)
    if label is None:
        raise UsageError(f"--family {text!r} is not a Gemma family; use one of: {', '.join(sorted(FAMILY_NAMES))}")
    return label


def normalise_task(text: str | None) -> str:
    """A --task value -> one of TASKS (default sft); UsageError otherwise."""
    if text is None:
        return "sft"
    task = text.strip().lower()
    if task not in TASKS:
        raise UsageError(f"--task {text!r} is not known; use one of: {', '.join(TASKS)}")
    return task


def normalise_quantization(text: str | None) -> str | None:
    """A --quantization value -> "4bit" | "8bit" | None (none); UsageError otherwise."""
    if text is None:
        return None
    q = text.strip().lower().replace("-", "")
    q = {"4": "4bit", "nf4": "4bit", "qlora": "4bit", "8": "8bit", "int8": "8bit", "no": "none"}.get(q, q)
    if q not in QUANTIZATIONS:
        raise UsageError(f"--quantization {text!r} is not known; use one of: {', '.join(QUANTIZATIONS)}")
    return None if q == "none" else q


# The trainers whose config a prescription is written in (recommend --trainer), by trainers.ConfigKind name: the
# format check's reader recognises in it, and the trainer that executes it (trainers.ConfigKind.decide).
# axolotl: its YAML (`axolotl train`); trl: a `trl sft --config` YAML of SFTConfig / ModelConfig keys, which TRL's
# SFTTrainer runs; transformers: a TrainingArguments YAML (with TRL's ModelConfig keys for the model and LoRA), which a
# plain transformers Trainer script reads (HfArgumentParser / TrlParser).
# llama-factory: LLaMA-Factory 0.9.5's YAML (`llamafactory-cli train`), its own SFT trainer and loader.
# trl with --task dpo: a `trl dpo --config` YAML of DPOConfig / ModelConfig keys, which TRL's DPOTrainer runs (TRL_TASKS).
TRAINER_FORMATS = ("axolotl", "trl", "transformers", "llama-factory")
_TRAINER_ALIASES = {"axolotl": "axolotl", "trl": "trl", "trl-sft": "trl", "sft": "trl", "sfttrainer": "trl",
                    "transformers": "transformers", "trainer": "transformers", "hf": "transformers",
                    "trainingarguments": "transformers", "huggingface": "transformers",
                    "llama-factory": "llama-factory", "llamafactory": "llama-factory", "lf": "llama-factory"}


def normalise_trainer(text: str | None) -> str | None:
    """A --trainer value -> one of TRAINER_FORMATS (None for none given); UsageError, with the nearest name, otherwise."""
    if text is None:
        return None
    key = text.strip().lower().replace("_", "-").replace(" ", "-")
    name = _TRAINER_ALIASES.get(key) or _TRAINER_ALIASES.get(key.replace("-", ""))
    if name is None:
        import difflib

        near = difflib.get_close_matches(key, list(_TRAINER_ALIASES), n=1, cutoff=0.6)
        hint = f" (did you mean {_TRAINER_ALIASES[near[0]]!r}?)" if near else ""
        raise UsageError(f"--trainer {text!r} is not known{hint}; use one of: {', '.join(TRAINER_FORMATS)}")
    return name


def trainer_format(chosen: Any) -> str | None:
    """The TRAINER_FORMATS name of a training config's trainer (trainers.Chosen's value), None where recommend
    writes no config of it (TRL's GRPO and other RL trainers, a launcher's script)."""
    value = getattr(chosen, "value", None)
    return {"axolotl": "axolotl", "trl-sft": "trl", "trl-dpo": "trl", "transformers": "transformers",
            "llama-factory": "llama-factory"}.get(getattr(value, "value", ""))


# The `trl` format's TRL command per task (`trl sft`, `trl dpo`); the tasks each format writes are FORMAT_TASKS (from
# FORMATS: axolotl's YAML writes every task, its `rl:`).
TRL_TASKS = {"sft": "sft", "full": "sft", "lora": "sft", "qlora": "sft", "dpo": "dpo"}
# TRL's DPOConfig defaults the `trl dpo` YAML states (TRL 1.16.0 trl/trainer/dpo_config.py: beta 0.1, loss_type
# ["sigmoid"]): written so the file says the run, and so that check's reader knows it for TRL's DPOConfig
# (trainers.rl_named_by_keys: beta with DPO's loss types) without `rl:`.
TRL_DPO_KEYS: dict[str, Any] = {"beta": 0.1, "loss_type": ("sigmoid",)}


def trl_command(rec: "Recommendation") -> str:
    """The `trl` subcommand that runs the prescription's TRL config (sft | dpo)."""
    return TRL_TASKS.get(str(rec.inputs.get("task") or "sft"), "sft")


def _stated_targets(s: Settings) -> str | tuple[str, ...] | None:
    """The LoRA targets the run's config writes: those the user or the search named (all-linear included), as named;
    None for PEFT's own default the settings hold unnamed, and for full fine-tuning. (A user's all-linear was dropped
    once, and the prescription wrote the language-model regex in its place without a word.)"""
    return s.lora_targets if s.method != "full" and s.source("lora") != "default" else None


def _stated_optimizer(s: Settings) -> str | None:
    """The optimizer the run's config writes: one the user or the search named; None for the one transformers picks."""
    return s.optimizer if s.source("optimizer") != "default" else None


def _stated_attention(s: Settings) -> str | None:
    """The attention the run's config writes: None for the transformers default (sdpa); eager where the model needs it."""
    return s.attention if s.attention != "sdpa" else None


@dataclass(frozen=True)
class Inputs:
    """Everything the decision depends on, as plain values."""

    family: str | None  # family label; None = not known (treated like Gemma 2/3: the safe side)
    gpu_native_bf16: bool | None  # None = unknown
    gpu_backend: str = "cuda"  # cuda | rocm | mps | none
    gpu_label: str = "the GPU"
    gpu_trap: bool = False
    saved_dtype: str | None = None  # bfloat16 | float16 | float32
    saved_dtype_source: str | None = None  # "safetensors" | "config.json" | "assumed"
    quantization: str | None = None  # "4bit" | "8bit" | None
    quant_method: str | None = None  # bitsandbytes, gptq, awq...: the checkpoint is already quantized
    checkpoint_compute_dtype: str | None = None
    task: str = "sft"
    versions: Mapping[str, str | None] = field(default_factory=dict)
    model_id: str = "google/gemma-3-1b-it"
    nested: bool = False  # multimodal config with text_config (Gemma 3 4B+, PaliGemma, Gemma 3n)
    # Activations beyond fp16's range; None = from the family label (a --family plan).
    fp16_unsafe: bool | None = None
    # The prescribed run's settings, as its memory plan planned them (plan.memory.MemoryPlan.settings): the method,
    # batch, accumulation, checkpointing, sequence, LoRA, GPUs, sharding, optimizer and attention every view writes.
    # None where no plan states them (the GPU's memory unknown and nothing fixed by the user).
    settings: Settings | None = None
    # Whether the text model builds a HybridCache (Gemma 2/3) and whether the transformers that will run crashes on
    # it (affected | safe | unknown): what `gemma-doctor fix` would write on disk follows from both.
    builds_hybrid_cache: bool = True
    hybridcache: str = "unknown"
    # A KV-shared Gemma 4 on transformers 5.5.0-5.5.1 (or a version that cannot be told): use_cache=False and
    # gradient checkpointing skip the sharing and give a wrong loss (GD107, GD620), so the cache stays on.
    keep_use_cache: bool = False
    # The trainer whose config the prescription is written in and judged as (TRAINER_FORMATS; recommend --trainer).
    trainer: str = "axolotl"


@dataclass(frozen=True)
class Recommendation:
    """A precision decision with its reasons and ready-to-use settings per framework."""

    precision: str  # bf16 | fp16 | fp32
    reasons: tuple[str, ...]
    frameworks: dict[str, Any]
    load_dtype: str  # the dtype to load the weights in: bfloat16 | float16 | float32
    summary: str
    inputs: dict[str, Any]
    notes: tuple[str, ...] = ()
    method: str = "full"  # full | lora | qlora
    # The precision decision alone (precision, flags, GPU, quantization, task): the summary without the run's part,
    # which check's text view renders from check's own Run (run_clause).
    head: str = ""
    adapters: bool = True  # the run trains LoRA adapters, or may (False only where full fine-tuning is decided)
    trainer: str = "axolotl"  # the trainer format the run is written in (TRAINER_FORMATS): its config is the run
    # TrainingArguments' name of gradient checkpointing on the stack (checkpointing_keys): a TRL config writes it off.
    checkpointing_key: str = "gradient_checkpointing"
    # What the decision was made from: the plan's run.Settings (given.settings), which each trainer's format renders
    # directly (FORMATS), with the model id (named per model where a judgement is shared: pipeline).
    given: Inputs | None = field(default=None, compare=False, repr=False)

    @property
    def training_arguments(self) -> dict[str, Any]:
        """The TrainingArguments keywords (also valid for TRL configs)."""
        return dict(self.frameworks["transformers"]["training_arguments"])

    def to_json(self) -> dict[str, Any]:
        """The `recommendation` object of check's and recommend's JSON (docs/precision.md)."""
        return {"precision": self.precision, "load_dtype": self.load_dtype, "summary": self.summary,
                "method": self.method, "reasons": list(self.reasons), "notes": list(self.notes), "inputs": dict(self.inputs),
                "frameworks": json.loads(json.dumps(self.frameworks))}


def _at_least(version: str | None, minimum: str) -> bool | None:
    v = parse(version)
    return None if v is None else v >= parse(minimum)


def _family_name(family: str | None) -> str:
    return FAMILY_NAMES.get(family or "", "this model")


def _use_cache_reason(i: Inputs, fam: str) -> str:
    """Why use_cache=False, and who sets it: on disk only where `gemma-doctor fix` would (as `fix` itself decides)."""
    head = "use_cache=False for training (a KV cache only helps generation"
    snippet = "the loading snippet sets it in memory on every sub-model config"
    if not i.builds_hybrid_cache:
        return f"{head}, and gradient checkpointing turns it off anyway): {snippet}; {fam} builds no HybridCache, " \
               "so there is nothing for `gemma-doctor fix` to write on disk"
    crash = "transformers 4.50.0-4.50.3 crash bf16/fp16 evaluation with the HybridCache error"
    version = i.versions.get("transformers")
    if i.hybridcache == "affected":
        return f"{head}; with it on, {crash}, and transformers {version or '4.50.x'} will run): " \
               f"`gemma-doctor fix` sets it on disk, {snippet}"
    if i.hybridcache == "safe":
        return f"{head}; {crash}, transformers {version or 'that will run'} does not): {snippet}; nothing to fix " \
               "on disk (`gemma-doctor fix --with transformers==4.50.3` would, for such a machine)"
    return f"{head}; with it on, {crash}, and the transformers that will run is unknown): {snippet}; " \
           "`gemma-doctor fix --with transformers==VERSION` sets it on disk for a machine that runs 4.50.x"


def decide(i: Inputs) -> Recommendation:
    """The decision table (docs/precision.md), row by row."""
    reasons: list[str] = []
    notes: list[str] = []
    fam = _family_name(i.family)
    unsafe = i.fp16_unsafe if i.fp16_unsafe is not None else fp16_unsafe_family(i.family)
    rl = i.task in RL_TASKS
    quant = _quantization(i)
    run = i.settings
    lora = quant is not None or i.task in ("lora", "qlora") or (run is not None and run.method in ("lora", "qlora"))
    # Full fine-tuning decided (by the memory plan's method, or --task full): no adapter in the run, so neither the
    # adapters' precision reason nor the PEFT snippet belongs to it.
    full = not lora and ((run is not None and run.method == "full") or i.task == "full")

    # 1. The GPU decides whether bf16 is on the table at all.
    if i.gpu_backend == "none":
        precision = "fp32"
        reasons.append(f"no GPU ({i.gpu_label}): on a CPU, train in fp32; pass --gpu to plan for the training machine")
    elif i.gpu_native_bf16 is True and not (i.gpu_backend == "mps" and i.trainer == "axolotl"):
        precision = "bf16"
        reasons.append(f"{i.gpu_label} has native bf16"
                       + (" (compute capability >= 8.0)" if i.gpu_backend == "cuda" else "")
                       + ": bf16 mixed precision keeps fp32's range, so Gemma's large activations cannot overflow")
    else:
        what = "has no native bf16 (needs compute capability 8.0+; bf16 there is emulated through fp32, slowly)" \
            if i.gpu_native_bf16 is False and i.gpu_backend == "cuda" else \
            ("has native bf16, but the prescription's axolotl YAML runs none on Apple MPS (axolotl 0.19.0's "
             "resolve_dtype turns bf16 into fp16 there; --trainer trl keeps bf16)") if i.gpu_native_bf16 is True else \
            "has no native bf16" if i.gpu_native_bf16 is False else "has unknown bf16 support (treated as none)"
        reasons.append(f"{i.gpu_label} {what}")
        if unsafe:
            precision = "fp32"
            reasons.append(f"{fam} activations exceed fp16's largest value 65504, so fp16 gives inf/NaN "
                           "(transformers #36822; TRL #3236: DPO in fp16 gives loss=0, reward=nan); clipping costs accuracy "
                           f"(PRs #36831/#36832 rejected). Unsloth's rule: without bf16, {fam} trains in fp32, never fp16")
            reasons.append("fp32 costs twice bf16's memory for weights and activations and runs without tensor cores "
                           "(a T4 does ~8 TFLOPS in fp32 vs ~65 in fp16); "
                           + ("a GPU with compute capability 8.0+ avoids it" if quant else
                              "consider QLoRA (--qlora) or a GPU with compute capability 8.0+"))
        else:
            precision = "fp16"
            reasons.append(f"{fam} fits fp16's range: fp16 mixed precision with loss scaling (fp16=True turns on the "
                           "GradScaler); keep the trainable weights in fp32")
    if i.gpu_trap and precision != "bf16":
        notes.append("torch.cuda.is_bf16_supported() says True on this GPU (emulation), so `bf16: auto` (axolotl), "
                     "transformers' is_torch_bf16_gpu_available() and LLaMA-Factory would pick slow emulated bf16: set precision explicitly")

    # 2. The dtype the weights are loaded in.
    if precision == "bf16":
        load = "bfloat16"
    elif precision == "fp32":
        load = "float32"
    else:
        # fp16 AMP unscales fp32 gradients only ("Attempting to unscale FP16 gradients"): full fine-tuning needs fp32
        # master weights; with LoRA the frozen base may stay in fp16 while the adapters train in fp32.
        load = "float16" if lora else "float32"
    saved = i.saved_dtype
    src = f" ({i.saved_dtype_source})" if i.saved_dtype_source else ""
    if saved == "float16" and unsafe:
        reasons.append(f"weights are saved in float16{src}: {fam} was trained in bf16, so this copy may already hold inf "
                       "where values overflowed (gemma-doctor check --weights scans them)")
    elif saved:
        verb = "halves memory" if saved == "float32" and load != "float32" else "keeps them as saved" if saved == load else "converts them"
        reasons.append(f"weights are saved in {saved}{src}; loading them in {load} {verb}")

    # 3. Quantization (QLoRA) and adapters.
    compute = None
    if quant == "4bit" and (i.quant_method in (None, "bitsandbytes")):
        compute = "bfloat16" if precision == "bf16" else ("float32" if unsafe else "float16")
        why = "bf16 is native" if precision == "bf16" else \
            "bf16 is not native and fp16 overflows Gemma 2/3 activations" if unsafe else "bf16 is not native"
        reasons.append(f"4-bit QLoRA: bnb_4bit_compute_dtype={compute} because {why}")
        if i.checkpoint_compute_dtype and i.checkpoint_compute_dtype != compute:
            # A checkpoint saved quantized keeps its own quantization_config: transformers' merge_quantization_configs
            # (5.23.0, reproduced) and axolotl 0.19.0 (BitsAndBytesConfig(**model_config.quantization_config)) ignore
            # the run's BitsAndBytesConfig / bnb_config_kwargs, so the loading snippet sets it on the layers instead.
            notes.append(f"the checkpoint's quantization_config says bnb_4bit_compute_dtype={i.checkpoint_compute_dtype}, "
                         "which transformers and axolotl keep whatever a BitsAndBytesConfig or bnb_config_kwargs says: "
                         f"the loading snippet sets {compute} on every 4-bit layer after loading (axolotl has no key "
                         "for it)")
    elif quant and i.quant_method:
        reasons.append(f"the checkpoint is already quantized ({i.quant_method}): its quantization_config is read from config.json")
    peft_version = i.versions.get("peft")
    peft_ok = _at_least(peft_version, PEFT_ADAPTER_FP32)
    cast_needed = precision != "fp32" and peft_ok is False
    if lora or (precision != "fp32" and not full):
        if peft_ok:
            reasons.append(f"LoRA adapter weights train in fp32: PEFT {peft_version} (>= 0.12) upcasts them by default "
                           "(autocast_adapter_dtype=True)")
        elif peft_ok is False:
            reasons.append(f"LoRA adapter weights must train in fp32, but PEFT {peft_version} (< 0.12) leaves them in the "
                           "base model's half precision (NaN risk): cast them (snippet below) or upgrade PEFT")
        else:
            reasons.append("LoRA adapter weights must train in fp32: PEFT >= 0.12 does it by default; older PEFT needs the cast loop")

    # 4. Task: the stable DPO setting (TRL #3236) for preference/RL trainers.
    if rl:
        reasons.append(f"{i.task}: the stable setting from TRL #3236: gradient_checkpointing=True, "
                       "optim=\"adamw_torch_fused\", max_grad_norm=1.0, with the precision above")
    if i.keep_use_cache and run is not None and run.gradient_checkpointing:
        reasons.append("the memory plan fits only with gradient checkpointing, which this model cannot use on "
                       "transformers 5.5.0-5.5.1 (GD620): upgrade to transformers >= 5.5.2 for that plan")
    if i.keep_use_cache:
        reasons.append("use_cache stays on (use_cache=True in TrainingArguments, which Trainer writes onto the model "
                       "config) and gradient checkpointing off: transformers 5.5.0-5.5.1 share this model's K/V only "
                       "through the cache, so without it the loss is wrong (GD107, GD620); transformers >= 5.5.2 "
                       "needs neither")
    else:
        reasons.append(_use_cache_reason(i, fam))

    # 5. Memory: the plan of the prescribed run is its own line in every view (docs/memory.md), not a reason.

    frameworks = _frameworks(i, precision, load, quant, compute, rl, cast_needed, peft_ok)
    head = f"{precision}: " + {
        "bf16": "bf16=True, fp16=False" + (", tf32=True" if "tf32" in frameworks["transformers"]["training_arguments"] else ""),
        "fp16": "fp16=True (loss scaling), bf16=False",
        "fp32": "bf16=False, fp16=False (no mixed precision)",
    }[precision] + f" on {i.gpu_label}" + (
        f", LoRA on the {i.quant_method} {quant.replace('bit', '-bit')} checkpoint" if _saved_by_another(i, quant)
        else f", {quant} {'QLoRA' if quant == '4bit' else 'quantized'}" if quant else "") \
        + (f", {i.task}" if i.task != "sft" else "")
    summary = head if run is None else head + run_clause(run.method, run.batch_size, run.gradient_accumulation_steps,
                                                         run.gradient_checkpointing)
    inputs = {"family": i.family, "saved_dtype": saved, "gpu": i.gpu_label, "gpu_backend": i.gpu_backend,
              "native_bf16": i.gpu_native_bf16, "quantization": quant, "quant_method": i.quant_method, "task": i.task}
    method = run.method if run is not None else ("qlora" if quant else "lora" if lora else "full")
    frameworks["serving"] = serving(i, unsafe, fam)
    return Recommendation(precision, tuple(reasons), frameworks, load, summary, inputs, tuple(notes), method, head,
                          adapters=not full, trainer=i.trainer,
                          checkpointing_key=checkpointing_keys(i.versions.get("transformers"))[0], given=i)


def _quantization(i: Inputs) -> str | None:
    """The run's quantization ("4bit" | "8bit" | None): --quantization, --task qlora, else the plan's QLoRA bits."""
    quant = i.quantization or ("4bit" if i.task == "qlora" else None)
    if quant is None and i.settings is not None and i.settings.method == "qlora":
        quant = "8bit" if i.settings.quant_bits == 8 else "4bit"
    return quant


def run_clause(method: str, batch: int, accumulation: int, checkpointing: bool) -> str:
    """The run's part of the precision line: ", LoRA, batch 2 x4 accumulation, gradient checkpointing" (QLoRA is said
    by the precision decision's own part, with its quantization)."""
    what = {"full": ", full fine-tuning", "lora": ", LoRA", "qlora": ""}.get(method, "")
    acc = f" x{accumulation} accumulation" if accumulation > 1 else ""
    return f"{what}, batch {batch}{acc}" + (", gradient checkpointing" if checkpointing else "")


# vLLM refuses float16 for these model types ("does not support float16. Reason: Numerical instability"), and its
# `--dtype auto` then falls back to float32 on a GPU without bf16: vllm/config/model.py _FLOAT16_NOT_SUPPORTED_MODELS
# and _resolve_auto_dtype (0.33.0); the list has gemma2 and gemma3 since 0.10.0 (vllm/config.py), gemma3_text only
# later (0.10.0's list lacks it, so `auto` picks float16 for Gemma 3 1B on a T4 there). 0.8.0 has no list and
# picks the saved dtype. By family label: Gemma 2 and Gemma 3 (gemma3 and gemma3_text).
VLLM_NO_FLOAT16 = frozenset({"gemma2", "gemma3"})


def serving(i: Inputs, unsafe: bool, fam: str) -> dict[str, Any]:
    """The dtype to serve the trained model in on the GPU named, per engine: bf16 where the GPU has it natively,
    else float16 only for a member whose activations fit fp16, else float32 (the training rule, for the same reason)."""
    if i.gpu_backend == "none":
        return {"dtype": None, "gpu": i.gpu_label,
                "reason": "no GPU named: serve in bfloat16 on a GPU with native bf16 (compute capability 8.0+); "
                          + ("float16 on one without" if not unsafe else f"{fam} in float32 on one without (never float16)")}
    if i.gpu_native_bf16 is True:
        dtype, why = "bfloat16", f"{i.gpu_label} has native bf16"
    elif not unsafe:
        dtype, why = "float16", f"{i.gpu_label} has no native bf16, and {fam}'s activations fit float16"
    else:
        dtype, why = "float32", (f"{i.gpu_label} has no native bf16, and {fam}'s activations exceed float16's 65504 "
                                 "(inf/NaN, empty or <pad> replies: vllm #18733, #20740)")
    if i.gpu_native_bf16 is None:
        why = f"{i.gpu_label}'s bf16 support is unknown: bfloat16 if it has it (compute capability 8.0+), else " + \
              ("float16" if not unsafe else "float32")
        dtype = "bfloat16"
    vllm = f"--dtype {dtype}"
    if dtype == "float32" and i.family in VLLM_NO_FLOAT16:
        vllm += (" (vLLM refuses float16 for Gemma 2/3; its --dtype auto falls back to float32 only where its list "
                 "holds the model type, gemma3_text not in 0.10.0's: say it)")
    elif dtype == "float32":
        vllm += " (vLLM's --dtype auto would pick float16 on this GPU: say it)"
    elif i.saved_dtype == "float16" and dtype != "float16":
        vllm += " (the checkpoint is saved in float16, which --dtype auto would keep)"
    return {"dtype": dtype, "gpu": i.gpu_label, "reason": why,
            "transformers": {"dtype": dtype}, "vllm": vllm}


# LoRA on a multimodal checkpoint: the language model's linear layers only (PEFT has no default targets for gemma3,
# gemma3n and paligemma, and "all-linear" or bare names also wrap the vision tower: findings GD420/GD421).
LM_ONLY_TARGETS = r".*language_model.*\.(q_proj|k_proj|v_proj|o_proj|gate_proj|up_proj|down_proj)"
# The text-only class of a multimodal family, and whether transformers 5.x needs key_mapping to find its weights in the
# multimodal checkpoint (Gemma3ForCausalLM loads none without it on 5.0-5.23; Gemma3nForCausalLM maps them itself).
TEXT_ONLY_CLASSES = {"gemma3": ("Gemma3ForCausalLM", True), "gemma3n": ("Gemma3nForCausalLM", False)}
GEMMA3_KEY_MAPPING = {r"^language_model\.model\.": "model.", r"^model\.language_model\.": "model.",
                      r"^language_model\.lm_head\.": "lm_head."}


def lora_targets(family: str | None, nested: bool) -> str:
    """PEFT target_modules for this family: the language model only on a multimodal checkpoint, else all-linear."""
    if nested and family == "gemma4":
        return LANGUAGE_MODEL_REGEX  # Gemma 4's towers are Gemma4ClippableLinear (GD440/GD441)
    return LM_ONLY_TARGETS if nested and family in ("gemma3", "gemma3n", "paligemma", "paligemma2") else "all-linear"


def text_only_loading(family: str | None, nested: bool, transformers_version: str | None) -> dict[str, Any] | None:
    """How to load a multimodal checkpoint's language model alone: the class, and key_mapping where it is needed
    (transformers >= 5.0 for Gemma 3; on 4.51-4.57 the same key_mapping loads nothing). None when not multimodal."""
    if not nested or family not in TEXT_ONLY_CLASSES:
        return None
    cls, needs_mapping = TEXT_ONLY_CLASSES[family]
    v5 = _at_least(transformers_version, "5.0.0") is not False  # not installed: plan for the current transformers
    return {"class": cls, "key_mapping": dict(GEMMA3_KEY_MAPPING) if needs_mapping and v5 else None}


def auto_class(family: str | None, nested: bool) -> str:
    """The transformers Auto class that loads this family (multimodal checkpoints: image-text-to-text)."""
    return "AutoModelForImageTextToText" if nested else "AutoModelForCausalLM"


def trl_config_class(task: str, trl_version: str | None) -> tuple[str, str] | None:
    """(module, class) of the TRL config for ``task``; None where the installed TRL has none (PPO in TRL >= 1.0)."""
    new = _at_least(trl_version, "1.0.0") is not False  # not installed: plan for the current TRL
    if task == "orpo":
        return ("trl.experimental.orpo" if new else "trl", "ORPOConfig")
    if task == "ppo":
        return None if new else ("trl", "PPOConfig")
    return ("trl", {"dpo": "DPOConfig", "kto": "KTOConfig", "grpo": "GRPOConfig"}.get(task, "SFTConfig"))


def checkpointing_keys(transformers_version: str | None) -> tuple[str, str]:
    """TrainingArguments' names for gradient checkpointing and its kwargs: transformers 5.23.0 renamed them
    activation_checkpointing(_kwargs) and warns (FutureWarning) on the old ones; earlier releases know only those."""
    if _at_least(transformers_version, TRANSFORMERS_ACTIVATION_CHECKPOINTING):
        return "activation_checkpointing", "activation_checkpointing_kwargs"
    return "gradient_checkpointing", "gradient_checkpointing_kwargs"


def _tf32(i: Inputs, precision: str) -> bool:
    """tf32 is written on: bf16 on NVIDIA Ampere+ (it exists there only; transformers refuses tf32=True elsewhere)."""
    return precision == "bf16" and i.gpu_backend == "cuda"


def _checkpointing(i: Inputs) -> bool:
    """Gradient checkpointing: the prescribed run's; without a plan, the stable RL setting's (on for RL tasks)."""
    return i.settings.gradient_checkpointing if i.settings is not None else i.task in RL_TASKS


def _attention(i: Inputs) -> str | None:
    """The attention every format writes (_stated_attention of the run); None for the default."""
    return _stated_attention(i.settings) if i.settings is not None else None


def _adapter(i: Inputs, quant: str | None) -> str | None:
    """The adapter the run trains (axolotl's `adapter` value): "qlora" on a bitsandbytes 4-bit load, "lora" on an
    8-bit one, on a checkpoint another quantizer saved, or for a LoRA task / plan; None for full fine-tuning."""
    run = i.settings
    if _saved_by_another(i, quant):
        return "lora"
    if quant == "4bit":
        return "qlora"
    if quant == "8bit" or i.task in ("lora", "qlora") or (run is not None and run.method in ("lora", "qlora")):
        return "lora"
    return None


def _loads_in(i: Inputs, quant: str | None) -> int | None:
    """The bits bitsandbytes quantizes the weights to at load (4 | 8), None where it quantizes nothing (no
    quantization, or a checkpoint saved quantized by another quantizer)."""
    if quant is None or _saved_by_another(i, quant):
        return None
    return 4 if quant == "4bit" else 8 if quant == "8bit" else None


def _lora_r(i: Inputs) -> int:
    """The LoRA rank: the run's, else 16."""
    run = i.settings
    return run.lora_r if run is not None and run.method != "full" and run.lora_r else 16


def _targets(i: Inputs) -> str | list[str]:
    """PEFT's target_modules: those the run names (a list, or a regex PEFT matches whole names with), else this
    family's (lora_targets)."""
    named = _stated_targets(i.settings) if i.settings is not None else None
    if named is not None:
        return list(named) if isinstance(named, tuple) else named
    return lora_targets(i.family, i.nested)


def _rl_optimizer(i: Inputs) -> str | None:
    """The optimizer axolotl's and LLaMA-Factory's keys write: the stable RL setting's for an RL task, else the one
    the run names (None: the trainer's own)."""
    if i.task in RL_TASKS:
        return STABLE_RL_SETTINGS["optim"]
    return _stated_optimizer(i.settings) if i.settings is not None else None


def training_arguments(i: Inputs, precision: str) -> dict[str, Any]:
    """The run's TrainingArguments keywords (valid for TRL's configs too): precision, the stable RL setting, batch,
    accumulation, optimizer, checkpointing (non-reentrant), use_cache where it must stay on."""
    args: dict[str, Any] = {"bf16": precision == "bf16", "fp16": precision == "fp16"}
    if _tf32(i, precision):
        args["tf32"] = True
    run = i.settings
    if i.task in RL_TASKS:
        args.update((k, v) for k, v in STABLE_RL_SETTINGS.items() if k != "gradient_checkpointing")
    ckpt_key, ckpt_kwargs_key = checkpointing_keys(i.versions.get("transformers"))
    if run is not None:
        args.update({"per_device_train_batch_size": run.batch_size, "gradient_accumulation_steps": run.gradient_accumulation_steps})
        optimizer = _stated_optimizer(run)
        if optimizer and "optim" not in args:
            args["optim"] = optimizer
    if _checkpointing(i):
        # Non-reentrant: the reentrant kind corrupts the gradients of KV-shared Gemma 4 layers (GD130).
        args[ckpt_key] = True
        args[ckpt_kwargs_key] = {"use_reentrant": False}
    if i.keep_use_cache:
        args["use_cache"] = True
    return args


def trl_config(i: Inputs, precision: str) -> dict[str, Any] | None:
    """The keywords of the task's TRL config (training_arguments and the run's max_length); None where the TRL that
    will run has no config for the task (trl_config_class)."""
    if trl_config_class(i.task, i.versions.get("trl")) is None:
        return None
    config = training_arguments(i, precision)
    gen = i.settings.generation if i.settings is not None else None
    if gen is not None:
        # GRPOConfig has no max_length (TRL 1.16: GRPOConfig(max_length=...) is a TypeError): its sequence is the
        # prompt and up to max_completion_length, which it states.
        config["max_completion_length"] = gen.completion
    elif i.settings is not None and i.settings.seq_len:
        config["max_length"] = i.settings.seq_len
    return config


def _frameworks(i: Inputs, precision: str, load: str, quant: str | None, compute: str | None, rl: bool,
                cast_needed: bool, peft_ok: bool | None) -> dict[str, Any]:
    bf16, fp16 = precision == "bf16", precision == "fp16"
    tf32 = _tf32(i, precision)
    run = i.settings
    args = training_arguments(i, precision)
    ckpt = _checkpointing(i)
    dtype_key = "dtype" if _at_least(i.versions.get("transformers"), TRANSFORMERS_DTYPE_KWARG) else "torch_dtype"
    load_kwargs: dict[str, Any] = {dtype_key: load}
    attention = _attention(i)
    if attention:
        load_kwargs["attn_implementation"] = attention
    bnb: dict[str, Any] | None = None
    if quant == "4bit" and i.quant_method in (None, "bitsandbytes"):
        bnb = {"load_in_4bit": True, "bnb_4bit_quant_type": "nf4", "bnb_4bit_use_double_quant": True,
               "bnb_4bit_compute_dtype": compute}
    elif quant == "8bit" and i.quant_method in (None, "bitsandbytes"):
        bnb = {"load_in_8bit": True}
    trl_cls = trl_config_class(i.task, i.versions.get("trl"))
    trl_keys = trl_config(i, precision)
    targets = _targets(i)
    lora_r = _lora_r(i)
    adapter = _adapter(i, quant)
    axolotl: dict[str, Any] = {"base_model": i.model_id, "bf16": bf16, "fp16": fp16, "tf32": tf32}
    # Only keys of axolotl's schema (readers/axolotl_keys.json): it drops any other without a word (GD986). No dtype
    # key: axolotl loads in the dtype bf16 / fp16 / load_in_8bit say (normalize_config), which is always explicit, so
    # transformers 4.x's float16 default for bitsandbytes loading (GD705) never applies; the reader derives it alike.
    if _saved_by_another(i, quant):
        # Saved by another quantizer (AWQ, GPTQ): loaded as saved, LoRA on top; bitsandbytes must not quantize it
        # again (axolotl's qlora adapter requires load_in_4bit; its GPTQ loading is `gptq: true`).
        axolotl["adapter"] = "lora"
        if i.quant_method == "gptq":
            axolotl["gptq"] = True
    elif quant == "4bit":
        axolotl.update({"adapter": "qlora", "load_in_4bit": True})
        # axolotl's compute dtype is its torch_dtype unless bnb_config_kwargs says, except on a checkpoint saved in
        # bitsandbytes 4-bit: axolotl 0.19.0 then loads with the checkpoint's own quantization_config and never reads
        # bnb_config_kwargs (loaders/model.py _set_quantization_config), so writing it would state what does not run.
        if compute and i.quant_method != "bitsandbytes":
            axolotl["bnb_config_kwargs"] = {"bnb_4bit_compute_dtype": compute}
    elif quant == "8bit":
        axolotl.update({"adapter": "lora", "load_in_8bit": True})
    elif adapter:
        axolotl["adapter"] = adapter
    if axolotl.get("adapter"):
        axolotl.update({"lora_r": lora_r, "lora_alpha": 2 * lora_r})
        if targets == "all-linear":
            axolotl["lora_target_linear"] = True
        else:
            axolotl["lora_target_modules"] = targets
    if run is not None:
        if run.seq_len:
            axolotl["sequence_len"] = run.seq_len
        axolotl.update({"micro_batch_size": run.batch_size, "gradient_accumulation_steps": run.gradient_accumulation_steps})
    axolotl["gradient_checkpointing"] = ckpt
    if ckpt:
        axolotl["gradient_checkpointing_kwargs"] = {"use_reentrant": False}
    if attention:
        axolotl["attn_implementation"] = attention
    # No use_cache key where the cache must stay on (keep_use_cache): axolotl's schema has none, and check_model_config
    # (0.19.0) switches it off on the model and its text config after overrides_of_model_config, so no YAML keeps it:
    # under axolotl such a run is GD107, which the search rejects (its way out: a transformers outside the window).
    if rl:
        if i.task != "ppo":  # axolotl has no PPO trainer
            axolotl["rl"] = i.task
        if run is not None and run.generation is not None:
            # axolotl 0.19.0 hands GRPOConfig trl.max_completion_length even where unset (None): stated, the
            # completion the plan generates (core/trainers/grpo/__init__.py)
            axolotl["trl"] = {"max_completion_length": run.generation.completion}
        axolotl.update({"optimizer": _rl_optimizer(i), "max_grad_norm": STABLE_RL_SETTINGS["max_grad_norm"]})
    elif _rl_optimizer(i):
        axolotl["optimizer"] = _rl_optimizer(i)
    sharding: dict[str, Any] | None = None
    if run is not None and run.num_gpus > 1:
        sharding = {"num_processes": run.num_gpus, "zero_stage": run.zero_stage}
        # axolotl's own name for the process count; it takes the value from the launcher's WORLD_SIZE
        # (normalize_config), so the YAML states the run the launcher must start (the accelerate line below)
        axolotl["world_size"] = run.num_gpus
        if run.zero_stage:
            # A file axolotl ships (readers/training_config.AXOLOTL_DEEPSPEED_FILES, `axolotl fetch
            # deepspeed_configs`): zero3_bf16.json for bf16, else the file whose bf16 / fp16 "auto" copy the YAML's
            # switches (zero{1,2,3}_bf16 / _fp16 beside them do not exist). zero2.json offloads the optimizer to the CPU.
            name = "zero3_bf16.json" if run.zero_stage == 3 and precision == "bf16" else f"zero{run.zero_stage}.json"
            axolotl["deepspeed"] = f"deepspeed_configs/{name}"
            # The launch line states the same engine as that file: its optimizer offload too (accelerate launch's
            # --offload_optimizer_device), else the script it starts would hold the states a GPU the plan freed.
            offload = AXOLOTL_DEEPSPEED_FILES[name].get("offload_optimizer")
            if offload:
                sharding["offload_optimizer_device"] = offload
    return {
        "transformers": {"training_arguments": args, "auto_class": auto_class(i.family, i.nested),
                         "from_pretrained": load_kwargs, "use_cache": i.keep_use_cache,
                         "text_only": text_only_loading(i.family, i.nested, i.versions.get("transformers"))},
        "trl": {"config_class": trl_cls[1] if trl_cls else None, "module": trl_cls[0] if trl_cls else None,
                "config": trl_keys},
        "peft": {"bitsandbytes_config": bnb,
                 "prepare_model_for_kbit_training": bnb is not None or _saved_by_another(i, quant),
                 "adapter_dtype": "float32", "autocast_adapter_dtype": True, "cast_adapters_to_fp32": cast_needed,
                 "target_modules": targets, "r": lora_r, "lora_alpha": 2 * lora_r},
        "axolotl": axolotl,
        "accelerate": {"mixed_precision": {"bf16": "bf16", "fp16": "fp16", "fp32": "no"}[precision],
                       **({"num_processes": sharding["num_processes"]} if sharding else {}),
                       **({"zero_stage": sharding["zero_stage"]} if sharding and sharding["zero_stage"] else {}),
                       **({"offload_optimizer_device": sharding["offload_optimizer_device"]}
                          if sharding and sharding.get("offload_optimizer_device") else {})},
        "unsloth": {"from_pretrained": {"dtype": load, "load_in_4bit": quant == "4bit" and not _saved_by_another(i, quant),
                                        "load_in_8bit": quant == "8bit" and not _saved_by_another(i, quant)}},
    }


# The script the launch line starts (a placeholder: the user's own training script).
LAUNCH_SCRIPT = "train.py"


def launch_line(rec: Recommendation) -> str | None:
    """The accelerate launch line of a prescribed run on several processes (frameworks["accelerate"]: the processes,
    the ZeRO stage, the mixed precision), which `check --launch` reads back as the same distributed run; None for one
    process. Without it the Python settings, run as one script per GPU, are a DDP run the plan never judged."""
    acc = rec.frameworks["accelerate"]
    n = acc.get("num_processes")
    if not n or n < 2:
        return None
    stage = acc.get("zero_stage")
    engine = ["--use_deepspeed", "--zero_stage", str(stage)] if stage else ["--multi_gpu"]
    if stage and acc.get("offload_optimizer_device"):
        engine += ["--offload_optimizer_device", acc["offload_optimizer_device"]]
    return " ".join(["accelerate", "launch", "--num_processes", str(n), *engine, "--mixed_precision",
                     acc["mixed_precision"], LAUNCH_SCRIPT])


def _saved_by_another(i: Inputs, quant: str | None) -> bool:
    """The checkpoint is saved quantized by another quantizer than bitsandbytes (AWQ, GPTQ...): LoRA trains on its
    weights as saved, and nothing may quantize them again."""
    return bool(quant and i.quant_method and i.quant_method != "bitsandbytes")


# --- snippets ----------------------------------------------------------------------------------

def _py(value: Any) -> str:
    if isinstance(value, str) and value in ("bfloat16", "float16", "float32"):
        return f"torch.{value}"
    return repr(value)


def _kwargs(d: Mapping[str, Any], dtypes: bool = False) -> str:
    return ", ".join(f"{k}={_py(v) if dtypes else repr(v)}" for k, v in d.items())


def other_trainers_run(rec: Recommendation) -> bool:
    """TRL's config snippet would state another run than the prescription: its SFTTrainer computes chunked log-probs
    (TRL >= 1.15), so an SFTConfig beside an axolotl or plain-Trainer prescription is a run of other memory, shown
    only as that trainer's own prescription (--trainer trl). TRL's preference trainers' configs are the same run as
    axolotl's `rl:` (axolotl runs them)."""
    return rec.trainer != "trl" and rec.frameworks["trl"]["config_class"] == "SFTConfig"


# The file the run's command reads: what `recommend --format yaml` printed, saved.
RUN_FILE = "run.yaml"


def run_command(rec: Recommendation) -> str | None:
    """The command that starts the prescribed run from its YAML (saved as RUN_FILE), as its trainer's own CLI takes it:
    `axolotl train`, `trl sft|dpo --config`, `llamafactory-cli train` (LLaMA-Factory merges `key=value` words over the
    file: hparams/parser.py read_args, OmegaConf.from_cli); None for the TrainingArguments format, which the user's own
    script reads. A run on several GPUs is started by its launch line (launch_line)."""
    return FORMATS[rec.trainer].command(rec)


def llamafactory_snippets(rec: Recommendation, model_id: str) -> dict[str, str]:
    """LLaMA-Factory's own run of the prescription: it loads, quantizes, wraps LoRA and trains from its keys alone, so
    the one Python that states this run is its API over the same keys as the YAML (llamafactory.train.tuner.run_exp,
    which takes the mapping `llamafactory-cli train` reads from the file); transformers' or PEFT's code would be another
    trainer's run."""
    keys = {**_lf_mapping(rec), "model_name_or_path": model_id, "dataset": "YOUR_DATASET"}
    body = ",\n".join(f"    {k}={v!r}" for k, v in keys.items())
    return {"llama-factory": (
        "# LLaMA-Factory 0.9.5 runs it: its own loader, LoRA / quantization and SFT trainer, from these keys alone (the\n"
        f"# YAML of --format yaml, started as: {run_command(rec)}).\n"
        "from llamafactory.train.tuner import run_exp\n\n"
        f"run_exp(dict(\n{body},\n))\n")}


def python_snippets(rec: Recommendation, model_id: str) -> dict[str, str]:
    """Paste-able, self-contained Python per stack: transformers, trl, loading (+bitsandbytes), peft, unsloth; for a
    LLaMA-Factory prescription, LLaMA-Factory's own (llamafactory_snippets)."""
    if rec.trainer == "llama-factory":
        return llamafactory_snippets(rec, model_id)
    fw = rec.frameworks
    tr = fw["transformers"]
    out: dict[str, str] = {}
    if rec.trainer != "trl":  # a plain Trainer holds the full logits: not the run TRL's SFTTrainer prescribes
        seq = told_seq_len(rec)
        out["transformers"] = (
            "from transformers import TrainingArguments\n\n"
            + (f"# The sequence length is your script's (TrainingArguments has no key for it): tokenize to {seq} tokens,\n"
               f"# tokenizer(text, truncation=True, max_length={seq}); check it: check --training-config {RUN_FILE} "
               f"--seq-len {seq}\n" if seq else "")
            + f"training_arguments = dict({_kwargs(tr['training_arguments'])})\n"
            f"args = TrainingArguments(output_dir={OUTPUT_DIR!r}, **training_arguments)\n")
    trl = fw["trl"]
    if trl["config_class"] and not other_trainers_run(rec):
        out["trl"] = (f"from {trl['module']} import {trl['config_class']}\n\n"
                      f"config = {trl['config_class']}(output_dir={OUTPUT_DIR!r}, {_kwargs(trl['config'])})\n")
    bnb = fw["peft"]["bitsandbytes_config"]
    load = dict(tr["from_pretrained"])
    lines = ["import torch", f"from transformers import {tr['auto_class']}" + (", BitsAndBytesConfig" if bnb else ""), ""]
    saved_bnb = rec.inputs.get("quant_method") == "bitsandbytes"  # transformers keeps its quantization_config
    if bnb and not saved_bnb:
        lines.append(f"bnb_config = BitsAndBytesConfig({_kwargs(bnb, dtypes=True)})")
    else:
        lines[1] = f"from transformers import {tr['auto_class']}"
    extra = ", quantization_config=bnb_config" if bnb and not saved_bnb else ""
    lines.append(f"model = {tr['auto_class']}.from_pretrained({model_id!r}, {_kwargs(load, dtypes=True)}{extra})")
    compute = (bnb or {}).get("bnb_4bit_compute_dtype")
    if saved_bnb and compute:
        lines += ["# Saved in bitsandbytes 4-bit: from_pretrained keeps the checkpoint's quantization_config (a",
                  "# BitsAndBytesConfig passed here is ignored), so set the compute dtype on the layers themselves.",
                  "import bitsandbytes",
                  "for module in model.modules():",
                  "    if isinstance(module, bitsandbytes.nn.Linear4bit):",
                  f"        module.compute_dtype = torch.{compute}"]
    if tr["use_cache"]:
        lines.append("# Keep use_cache on: transformers 5.5.0-5.5.1 share this model's K/V only through the cache.")
    else:
        lines += [
            "# Training needs no KV cache: switch it off on every sub-model config a forward pass reads",
            "# (model.config alone is not enough for multimodal Gemma 3 on transformers 4.50.x).",
            "for module in model.modules():",
            "    sub_config = getattr(module, \"config\", None)",
            "    if sub_config is not None and hasattr(sub_config, \"use_cache\"):",
            "        sub_config.use_cache = False",
            "model.generation_config.use_cache = False",
        ]
    out["loading"] = "\n".join(lines) + "\n"
    text_only = tr.get("text_only")
    if text_only:
        mapping = f", key_mapping={text_only['key_mapping']!r}" if text_only["key_mapping"] else ""
        out["loading_text_only"] = "\n".join([
            "# Text-only training of this multimodal checkpoint: load the language model alone (no vision/audio",
            "# tower in memory, none for LoRA to wrap). Check that every weight was found: a missing key means random",
            "# weights (transformers 5.x needs key_mapping for Gemma 3; 4.51-4.57 must load without it).",
            "import torch",
            f"from transformers import {text_only['class']}",
            "",
            f"model, loading_info = {text_only['class']}.from_pretrained({model_id!r}, {_kwargs(load, dtypes=True)}"
            f"{extra}{mapping}, output_loading_info=True)",
            "assert not loading_info[\"missing_keys\"], loading_info[\"missing_keys\"]",
            "model.config.use_cache = False",
            *(["# LoRA on this model: target_modules=\"all-linear\" reaches the language model only (no tower is "
               "loaded)."] if rec.adapters else []),
        ]) + "\n"
    peft = ["from peft import LoraConfig, get_peft_model" + (", prepare_model_for_kbit_training" if bnb else ""), ""]
    if bnb:
        peft.append("model = prepare_model_for_kbit_training(model)")
    targets = fw["peft"].get("target_modules", "all-linear")
    if rec.inputs.get("family") == "gemma4" and tr["auto_class"] == "AutoModelForImageTextToText":
        # Gemma 4's towers are Gemma4ClippableLinear: all-linear adapts them too (GD441), plain names fail (GD440).
        peft.append("# the language model only: the vision/audio towers would get adapters text-only training never uses")
    elif targets != "all-linear" and not isinstance(targets, list):
        peft.append("# Multimodal checkpoint: LoRA on the language model only (PEFT has no default targets for it, and")
        peft.append("# \"all-linear\" or bare names like q_proj would also wrap the vision tower).")
    target = repr(targets) if isinstance(targets, list) else f"r\"{targets}\"" if targets != "all-linear" else "\"all-linear\""
    if text_only and isinstance(targets, str) and "language_model" in targets:
        # The language model loaded alone names its modules model.layers.N...: the regex would match none of them
        # (PEFT stops with "Target modules ... not found in the base model"), and all-linear reaches it only.
        peft += ["# Loaded the language model alone (the section above)? Its modules have no language_model in their",
                 "# names: all-linear reaches them, and only them.",
                 f"target_modules = {target} if any(\"language_model\" in name for name, _ in model.named_modules()) "
                 "else \"all-linear\""]
        target = "target_modules"
    r = fw["peft"].get("r", 16)
    peft += [f"lora_config = LoraConfig(r={r}, lora_alpha={fw['peft'].get('lora_alpha', 2 * r)}, target_modules={target}, "
             "task_type=\"CAUSAL_LM\")",
             "model = get_peft_model(model, lora_config)  # PEFT >= 0.12: adapter weights in fp32 (autocast_adapter_dtype=True)"]
    cast = ["for param in model.parameters():", "    if param.requires_grad:", "        param.data = param.data.float()"]
    if fw["peft"]["cast_adapters_to_fp32"]:
        peft += ["# The installed PEFT is older than 0.12: adapters stay in half precision unless cast to fp32.", *cast]
    elif rec.precision != "fp32":
        peft += ["# PEFT < 0.12 only: cast the trainable (adapter) weights to fp32", *("# " + c for c in cast)]
    if rec.adapters:  # a full fine-tuning prescription wraps no adapter
        out["peft"] = "\n".join(peft) + "\n"
    launch = launch_line(rec)
    if launch is not None:
        acc = fw["accelerate"]
        how = f"DeepSpeed ZeRO-{acc['zero_stage']}" if acc.get("zero_stage") else "DDP"
        out["launch"] = (f"# The run is planned on {acc['num_processes']} GPUs with {how}: start the training script with\n"
                         f"#   {launch}\n"
                         "# (gemma-doctor check --launch reads this line back as the same run"
                         + (";\n# without DeepSpeed every GPU would hold the whole model, a run this plan is not)\n"
                            if acc.get("zero_stage") else ")\n"))
    u = fw["unsloth"]["from_pretrained"]
    out["unsloth"] = ("import torch\nfrom unsloth import FastModel\n\n"
                      f"model, tokenizer = FastModel.from_pretrained({model_id!r}, dtype={_py(u['dtype'])}, "
                      f"load_in_4bit={u['load_in_4bit']!r}, load_in_8bit={u['load_in_8bit']!r})\n")
    return out


def _yaml_scalar(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return "null"
    if isinstance(value, (int, float)):
        return repr(value)
    return json.dumps(str(value))  # a JSON string is a valid YAML scalar


def _yaml_value(value: Any) -> str:
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k}: {_yaml_value(v)}" for k, v in value.items()) + "}"
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_yaml_value(v) for v in value) + "]"
    return _yaml_scalar(value)


# The trainer format training_config_yaml writes by default (trainers.REGISTRY's name): the kind check's reader
# recognises in it. A Recommendation names its own (Recommendation.trainer, TRAINER_FORMATS).
TRAINING_CONFIG_KIND = "axolotl"

_YAML_HEAD = ("# axolotl: precision set explicitly. Never `bf16: auto`: axolotl resolves it with torch.cuda.is_bf16_supported(),\n"
              "# which says true on a T4/V100 (emulated, slow) and false on a CPU runner, so the run's precision would\n"
              "# depend on the machine that reads the file.\n")
_TRL_HEAD = ("# trl sft --config THIS_FILE --dataset_name YOUR_DATASET: TRL's SFTConfig and ModelConfig keys. TRL's\n"
             "# SFTTrainer runs it (chunked log-probs from TRL 1.15: no batch x sequence x vocabulary logits held).\n"
             "# Precision, dtype and gradient checkpointing set explicitly (TRL's own defaults differ: bf16 = not fp16,\n"
             "# weights loaded in float32, checkpointing on).\n")
_TRANSFORMERS_HEAD = ("# A plain transformers Trainer: TrainingArguments keys, with TRL's ModelConfig keys for the model\n"
                      "# and LoRA (your script reads them: TrlParser((TrainingArguments, ModelConfig)) or your own).\n"
                      "# The full logits are held at the loss (no chunking). The sequence length is your script's:\n")


_LF_HEAD = ("# llamafactory-cli train THIS_FILE dataset=YOUR_DATASET: LLaMA-Factory 0.9.5's keys, its own SFT trainer.\n"
            "# Precision set explicitly (LLaMA-Factory with no switch trains in fp32), and what its own defaults would\n"
            "# change: it loads the checkpoint's dtype and upcasts full fine-tuning's weights to fp32 unless pure_bf16,\n"
            "# checkpoints unless disable_gradient_checkpointing, with use_reentrant_gc true unless told.\n")
# LLaMA-Factory 0.9.5's chat template of each family (data/template.py register_template names), by whether the
# checkpoint is multimodal: its gemma3 template asks for a processor a text-only Gemma 3 has not (GD712), and its
# text template `gemma` writes the same turns. Gemma 4 is left to the user (gemma4 or gemma4n: not told apart here).
LF_TEMPLATES = {("gemma", False): "gemma", ("gemma2", False): "gemma2", ("gemma3", False): "gemma",
                ("gemma3", True): "gemma3", ("gemma3n", True): "gemma3n"}
# The targets LLaMA-Factory's `lora_target: all` states: every linear layer, and the language model's alone on a
# multimodal checkpoint (it leaves the towers out while freeze_vision_tower, its default, is on).
LF_ALL_TARGETS = ("all-linear", LM_ONLY_TARGETS, LANGUAGE_MODEL_REGEX)
# transformers' attention names -> LLaMA-Factory's flash_attn (hparams/model_args.py AttentionFunction).
_LF_ATTENTION = {"eager": "disabled", "sdpa": "sdpa", "flash_attention_2": "fa2", "flash_attention_3": "fa3"}


_TRL_DPO_HEAD = ("# trl dpo --config THIS_FILE --dataset_name YOUR_PREFERENCE_DATASET: TRL's DPOConfig and ModelConfig keys.\n"
                 "# TRL's DPOTrainer runs it: chosen and rejected answers in one pass, each up to max_length tokens;\n"
                 "# the reference model is the base with the adapters disabled under LoRA, a frozen copy otherwise.\n"
                 "# Precision, dtype and gradient checkpointing set explicitly (TRL's own defaults differ: bf16 = not fp16,\n"
                 "# weights loaded in float32, checkpointing on).\n")


def told_seq_len(rec: Recommendation) -> int | None:
    """The sequence length check must be told beside the prescription's config (`check --training-config FILE
    --seq-len N`): the TrainingArguments format has no key for it (the user's script tokenizes to it), so its YAML's
    head, the text view and the Python snippet name N, and the search judges each candidate as check reads its YAML
    with that option. None for the formats that state it (axolotl's sequence_len, TRL's max_length, LLaMA-Factory's
    cutoff_len)."""
    if rec.trainer != "transformers":
        return None
    return (rec.frameworks["trl"].get("config") or {}).get("max_length")


def _head(rec: Recommendation) -> str:
    return FORMATS[rec.trainer].head(rec)


def _given(rec: Recommendation) -> Inputs:
    """What the recommendation was decided from (its run.Settings, model id, stack): what every format renders."""
    if rec.given is None:
        raise ValueError("a Recommendation made without its Inputs has no trainer format (plan.recommend.decide makes one)")
    return rec.given


def _trl_mapping(rec: Recommendation) -> dict[str, Any]:
    """The keys of a `trl sft|dpo --config` YAML (rec.trainer "trl") or of a TrainingArguments YAML with ModelConfig's
    (rec.trainer "transformers") for the prescribed run, rendered from its run.Settings: TRL 1.16's ModelConfig names
    (dtype, attn_implementation, use_peft, lora_*, load_in_4bit / load_in_8bit, bnb_4bit_quant_type,
    use_bnb_nested_quant: readers/trainer_keys.json) and the TrainingArguments / SFTConfig / DPOConfig settings
    (training_arguments, trl_config). Every setting whose trainer default differs from the run is written: TRL loads in
    float32, checkpoints and trains in bf16 by default."""
    i = _given(rec)
    trl = rec.trainer == "trl"
    quant = _quantization(i)
    out: dict[str, Any] = {}
    if trl:
        out["model_name_or_path"] = i.model_id
    # ModelConfig.dtype is both the load dtype and bitsandbytes' compute dtype (TRL's get_quantization_config).
    out["dtype"] = rec.load_dtype
    attention = _attention(i)
    if attention:
        out["attn_implementation"] = attention
    if rec.adapters and _adapter(i, quant):
        r = _lora_r(i)
        out.update({"use_peft": True, "lora_r": r, "lora_alpha": 2 * r, "lora_target_modules": _targets(i)})
        bits = _loads_in(i, quant)
        if bits == 4:
            out.update({"load_in_4bit": True, "bnb_4bit_quant_type": "nf4", "use_bnb_nested_quant": True})
        elif bits == 8:
            out["load_in_8bit"] = True
    args = (trl_config(i, rec.precision) if trl else None) or training_arguments(i, rec.precision)
    ckpt_key = next((k for k in ("activation_checkpointing", "gradient_checkpointing") if k in args), None)
    if ckpt_key is None:
        # TRL's SFTConfig checkpoints by default: "off" must be written (TrainingArguments' default, said all the same)
        args[rec.checkpointing_key] = False
    out.update(args)
    if trl and trl_command(rec) == "dpo":
        out.update(TRL_DPO_KEYS)
    out["output_dir"] = OUTPUT_DIR
    return out


def _lf_mapping(rec: Recommendation) -> dict[str, Any]:
    """The keys of LLaMA-Factory 0.9.5's YAML (ModelArguments, DataArguments, FinetuningArguments and its
    Seq2SeqTrainingArguments: hparams/*.py) for the prescribed run, rendered from its run.Settings: one SFT process.
    Where LLaMA-Factory's own default differs from the run it is written: bf16 / fp16 (it trains in fp32 otherwise),
    pure_bf16 for bf16 full fine-tuning (init_adapter upcasts the trainable weights to float32 unless it is set),
    gradient checkpointing off (disable_gradient_checkpointing; it checkpoints by default) or on without reentrancy
    (use_reentrant_gc: false)."""
    i = _given(rec)
    run = i.settings
    quant = _quantization(i)
    out: dict[str, Any] = {"model_name_or_path": i.model_id, "stage": "sft", "do_train": True}
    lora = bool(rec.adapters and _adapter(i, quant))
    out["finetuning_type"] = "lora" if lora else "full"
    if lora:
        targets = _targets(i)
        # "all": every linear layer but the head (and, on a multimodal checkpoint, but the vision tower LLaMA-Factory
        # freezes by default: freeze_vision_tower), LLaMA-Factory's own LM-only set; a list as its comma-separated names.
        # (a pattern of the user's is refused before: search._for_trainer)
        target = ",".join(targets) if isinstance(targets, (list, tuple)) else "all"
        r = _lora_r(i)
        out.update({"lora_rank": r, "lora_alpha": 2 * r, "lora_target": target})
        bits = _loads_in(i, quant)
        if bits == 4:
            # bitsandbytes nf4 with double quantization: LLaMA-Factory's defaults for 4 bits, written all the same
            out.update({"quantization_bit": 4, "quantization_method": "bnb", "quantization_type": "nf4",
                        "double_quantization": True})
        elif bits == 8:
            out.update({"quantization_bit": 8, "quantization_method": "bnb"})
    template = LF_TEMPLATES.get((str(i.family or ""), i.nested))
    if template:
        out["template"] = template
    if run is not None and run.seq_len:
        out["cutoff_len"] = run.seq_len
    attention = _attention(i)
    if attention in _LF_ATTENTION:
        out["flash_attn"] = _LF_ATTENTION[attention]
    out.update({"bf16": rec.precision == "bf16", "fp16": rec.precision == "fp16"})
    if rec.precision == "bf16" and not lora:
        out["pure_bf16"] = True
    out["tf32"] = _tf32(i, rec.precision)
    if run is not None:
        out["per_device_train_batch_size"] = run.batch_size
        out["gradient_accumulation_steps"] = run.gradient_accumulation_steps
    if _checkpointing(i):
        out["use_reentrant_gc"] = False
    else:
        out["disable_gradient_checkpointing"] = True
    if _rl_optimizer(i):
        out["optim"] = _rl_optimizer(i)
    out["output_dir"] = OUTPUT_DIR
    return out


class TrainerFormat:
    """One trainer's config format of a prescription (recommend --trainer; TRAINER_FORMATS): the YAML's head, its keys
    rendered from the run's Settings, and the command that starts it. The interface every format implements, as
    pip-audit's formats: the views and the search ask the format (FORMATS[rec.trainer]), never compare its name."""

    name: ClassVar[str]
    kind: ClassVar[str]  # the kind check's reader recognises in the file (trainers.REGISTRY's name)
    tasks: ClassVar[frozenset[str]]  # the tasks the format writes (others fall back to axolotl's YAML: search)

    def head(self, rec: Recommendation) -> str:
        """The YAML's comment lines: which trainer runs it and what its defaults would change."""
        raise NotImplementedError

    def mapping(self, rec: Recommendation) -> dict[str, Any]:
        """The run as the trainer's config keys, in the order the YAML writes them."""
        raise NotImplementedError

    def command(self, rec: Recommendation) -> str | None:
        """The command that starts the run from its YAML (RUN_FILE); None where the user's script reads it."""
        return None

    def tail(self, rec: Recommendation) -> str:
        """Comment lines after the keys."""
        return ""


class AxolotlFormat(TrainerFormat):
    """axolotl's YAML (`axolotl train`): every task (its `rl:`), several processes (its launch line)."""

    name, kind, tasks = "axolotl", "axolotl", frozenset(TASKS)

    def head(self, rec: Recommendation) -> str:
        return _YAML_HEAD

    def mapping(self, rec: Recommendation) -> dict[str, Any]:
        return rec.frameworks["axolotl"]

    def command(self, rec: Recommendation) -> str | None:
        return None if launch_line(rec) is not None else f"axolotl train {RUN_FILE}"

    def tail(self, rec: Recommendation) -> str:
        acc = rec.frameworks["accelerate"]
        return ("# accelerate (accelerate config / accelerate launch): "
                + ", ".join(f"{k}: {_yaml_scalar(v)}" for k, v in acc.items()) + "\n")


class TrlFormat(TrainerFormat):
    """A `trl sft|dpo --config` YAML of SFTConfig / DPOConfig and ModelConfig keys, which TRL's trainer runs."""

    name, kind, tasks = "trl", "transformers", frozenset(TRL_TASKS)

    def head(self, rec: Recommendation) -> str:
        return _TRL_DPO_HEAD if trl_command(rec) == "dpo" else _TRL_HEAD

    def mapping(self, rec: Recommendation) -> dict[str, Any]:
        return _trl_mapping(rec)

    def command(self, rec: Recommendation) -> str | None:
        data = "YOUR_PREFERENCE_DATASET" if trl_command(rec) == "dpo" else "YOUR_DATASET"
        return f"trl {trl_command(rec)} --config {RUN_FILE} --dataset_name {data}"


class TransformersFormat(TrainerFormat):
    """A TrainingArguments YAML (with TRL's ModelConfig keys), which a plain transformers Trainer script reads."""

    name, kind, tasks = "transformers", "transformers", frozenset({"sft", "full", "lora", "qlora"})

    def head(self, rec: Recommendation) -> str:
        seq = told_seq_len(rec)
        return _TRANSFORMERS_HEAD + (f"# tokenize to {seq} tokens (check --training-config THIS_FILE --seq-len {seq}).\n"
                                     if seq else "# check --training-config THIS_FILE --seq-len N with your length.\n")

    def mapping(self, rec: Recommendation) -> dict[str, Any]:
        return _trl_mapping(rec)


class LlamaFactoryFormat(TrainerFormat):
    """LLaMA-Factory 0.9.5's YAML (`llamafactory-cli train`), its own SFT trainer and loader."""

    name, kind, tasks = "llama-factory", "llama-factory", frozenset({"sft", "full", "lora", "qlora"})

    def head(self, rec: Recommendation) -> str:
        return _LF_HEAD

    def mapping(self, rec: Recommendation) -> dict[str, Any]:
        return _lf_mapping(rec)

    def command(self, rec: Recommendation) -> str | None:
        return f"llamafactory-cli train {RUN_FILE} dataset=YOUR_DATASET"


# Every trainer format by its TRAINER_FORMATS name (tests/test_trainer_formats.py holds the two equal).
FORMATS: dict[str, TrainerFormat] = {f.name: f for f in (AxolotlFormat(), TrlFormat(), TransformersFormat(),
                                                          LlamaFactoryFormat())}
# The kind check's reader recognises in each format, and the tasks each writes (from FORMATS).
FORMAT_KINDS = {name: f.kind for name, f in FORMATS.items()}
FORMAT_TASKS = {name: f.tasks for name, f in FORMATS.items()}


def format_mapping(rec: Recommendation) -> dict[str, Any]:
    """The prescribed run as its trainer's config keys (rec.trainer): axolotl's, TRL's / TrainingArguments', or
    LLaMA-Factory's."""
    return FORMATS[rec.trainer].mapping(rec)


def training_config_data(rec: Recommendation) -> tuple[dict[str, Any], dict[str, int]]:
    """What `check --training-config` reads from training_config_yaml(rec), without printing or parsing it: the mapping
    of the trainer's keys (tuples as the lists YAML gives) and each dotted key's 1-based line in that YAML (a nested
    mapping is written on its parent's line). tests/test_run_roundtrip.py proves both equal to the YAML read back."""
    first = _head(rec).count("\n") + 1
    data: dict[str, Any] = {}
    lines: dict[str, int] = {}
    for n, (k, v) in enumerate(format_mapping(rec).items(), start=first):
        data[k] = _as_yaml_reads(v)
        lines[k] = n
        if isinstance(v, dict):  # the reader records keys three levels deep; a flow mapping keeps them on one line
            for k2, v2 in v.items():
                lines.setdefault(f"{k}.{k2}", n)
                if isinstance(v2, dict):
                    for k3 in v2:
                        lines.setdefault(f"{k}.{k2}.{k3}", n)
    return data, lines


def _as_yaml_reads(value: Any) -> Any:
    """``value`` as YAML reads back what _yaml_value writes: a sequence is a list."""
    if isinstance(value, dict):
        return {k: _as_yaml_reads(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_as_yaml_reads(v) for v in value]
    return value


def training_config_yaml(rec: Recommendation) -> str:
    """The prescribed run as one YAML document in its trainer's format (rec.trainer): axolotl's keys, a `trl sft
    --config` file, or TrainingArguments', which `gemma-doctor check --training-config` reads back as the same run
    (method, batch x accumulation, sequence length, checkpointing, attention, sharding; the memory plan its trainer
    makes)."""
    fmt = FORMATS[rec.trainer]
    body = "".join(f"{k}: {_yaml_value(v)}\n" for k, v in fmt.mapping(rec).items())
    return fmt.head(rec) + body + fmt.tail(rec)
