"""From facts to a memory plan: the run the options and the training config describe, the rest filled in by a
search for the cheapest run that fits (memory.choose). Pure: no files, no torch.

What the user fixed (an option, a training-config setting, a task that implies a method) is never changed by the
search; what they left open is chosen. The recommendation then carries the chosen method and batch.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from typing import Any, Callable, Mapping

from gemma_doctor.plan import memory
from gemma_doctor.facts import MemoryRequest  # noqa: F401 (the options' memory request, read here)
from gemma_doctor.plan.memory import Choice, MemoryPlan, ModelShape
from gemma_doctor.readers import dtypes
from gemma_doctor.readers.training_config import (DEEPSPEED_BATCH, axolotl_load_dtype, axolotl_on_mps, is_auto,
                                                  truthy)
from gemma_doctor.run import (FROM_CONFIG, GPUS_VISIBLE, Generation, Settings, config_sharding, trl_unused_lora_keys,
                              written)
from gemma_doctor.trainers import (CHUNKING_LOOPS, CHUNKING_TRAINERS, TRAINING_ARGUMENTS_BATCH,  # noqa: F401 (also read here)
                                   Trainer)
from gemma_doctor.units import positive_int

# Recommendation tasks that name a method; the preference/RL trainers leave it open.
TASK_METHODS = {"full": "full", "lora": "lora", "qlora": "qlora"}
# Training-config "adapter" values (axolotl adapter, LLaMA-Factory finetuning_type, TRL use_peft).
# A lora_target_modules string with one of these is a regex (PEFT's reading), not a comma list (LLaMA-Factory's lora_target).
_REGEX_CHARS = re.compile(r"[*+?()\[\]|^$\\]")
_ADAPTERS = {"lora": "lora", "qlora": "qlora", "full": "full", "freeze": "full", "true": "lora", "false": "full"}


@dataclass(frozen=True)
class MemoryFacts:
    """The plan of the run (what check reports and judges) and the choice behind it."""

    plan: MemoryPlan
    choice: Choice
    fixed: tuple[str, ...]  # settings the user fixed: method, batch_size, gradient_checkpointing...
    unconstrained: Choice | None = None  # the search with nothing fixed, when the fixed run does not fit

    def to_json(self) -> dict[str, Any]:
        """check's and recommend's per-model `memory` object (docs/memory.md)."""
        out = self.plan.to_json()
        out["fixed"] = list(self.fixed)
        out["choice"] = self.choice.to_json()
        if self.unconstrained is not None:
            out["would_fit"] = self.unconstrained.to_json()
        return out


def shape_for(config: Mapping[str, Any] | None, census: Any | None) -> ModelShape | None:
    """The model's shape: exact counts from the census's safetensors headers, else derived from config.json."""
    if not isinstance(config, Mapping):
        return None
    headers = getattr(census, "headers", ()) if census is not None else ()
    quantized = census is not None and isinstance(getattr(census, "quantization", None), Mapping)
    shapes = {t.name: t.shape for h in headers for t in h.tensors}
    if shapes and not quantized:
        return memory.shape_from_config(config, memory.counts_from_names(shapes))
    shape = memory.shape_from_config(config)
    why = "a quantized checkpoint's packed headers" if shapes else "no safetensors headers"
    return replace(shape, source=f"config.json (derived; {why})",
                   saved_quantization=saved_quantization(config, getattr(census, "quantization", None)))


def saved_quantization(config: Mapping[str, Any], found: Any) -> tuple[str, int, int] | None:
    """(method, bits, group size) of a checkpoint saved quantized: the census's finding (``found``), else config.json's
    quantization_config (readers/dtypes.quantization); None where it is not quantized. Bits default to 4 and the
    group to 128 (AWQ's and GPTQ's usual) where the config does not say."""
    q = found if isinstance(found, Mapping) else dtypes.quantization(config, [], None)
    if not isinstance(q, Mapping) or not q.get("method"):
        return None
    qc = config.get("quantization_config")
    qc = qc if isinstance(qc, Mapping) else {}
    bits, group = q.get("bits"), qc.get("group_size", qc.get("q_group_size"))
    bits = bits if isinstance(bits, int) and not isinstance(bits, bool) and bits > 0 else 4
    group = group if isinstance(group, int) and not isinstance(group, bool) and group > 0 else 128
    return str(q["method"]), bits, group


def _on_saved_quantization(req: RunRequest, shape: ModelShape) -> RunRequest:
    """A checkpoint saved quantized trains through adapters on its quantized weights, whatever the config's `adapter`
    says (LoRA on an AWQ checkpoint is QLoRA in the plan: the weights are the quantizer's, not the load dtype's).
    Full fine-tuning the user asked for is left as asked (transformers refuses it: not this plan's to change)."""
    saved = shape.saved_quantization
    base = req.base
    if saved is None or base.method == "full" and "method" in req.fixed:
        return req
    where = f"the checkpoint's quantization_config ({saved[0]} {saved[1]}-bit)"
    sources = dict(base.sources)
    if base.method != "qlora" or "method" not in sources:
        sources["method"] = where
    sources.setdefault("quant_bits", where)
    base = replace(base, method="qlora", quant_bits=saved[1], sources=tuple(sorted(sources.items())))
    return replace(req, base=base, fixed=req.fixed if "method" in req.fixed else req.fixed + ("method",))


def run_request(tc: Any | None, request: MemoryRequest, task: str) -> tuple[dict[str, Any], dict[str, str]]:
    """The settings fixed by the options (first) and the training config: values and where each came from."""
    values: dict[str, Any] = {}
    src: dict[str, str] = {}

    def put(name: str, value: Any, where: str) -> None:
        if value is not None and name not in values:
            values[name] = value
            src[name] = where

    put("method", request.method, "option")
    put("batch_size", request.batch_size, "option")
    put("seq_len", request.seq_len, "option")
    put("gradient_checkpointing", request.gradient_checkpointing, "option")
    put("num_gpus", request.num_gpus, "option")
    if tc is not None and getattr(tc, "ok", False):
        s = tc.settings
        where = lambda name: FROM_CONFIG + s[name].key  # noqa: E731
        q4, q8, adapter = s.get("load_in_4bit"), s.get("load_in_8bit"), s.get("adapter")
        if q4 is not None and (truthy(q4.value) or q4.value == 4):
            put("method", "qlora", where("load_in_4bit"))
            put("quant_bits", 4, where("load_in_4bit"))
        elif q4 is not None and q4.value == 8 or (q8 is not None and truthy(q8.value)):
            put("method", "qlora", where("load_in_8bit" if q8 is not None else "load_in_4bit"))
            put("quant_bits", 8, where("load_in_8bit" if q8 is not None else "load_in_4bit"))
        if adapter is not None:
            put("method", _ADAPTERS.get(str(adapter.value).strip().lower()), where("adapter"))
        elif getattr(tc, "trainer", None) is not None:
            # A config that names no adapter runs its trainer's default method: it fixes the method as much as
            # `adapter: lora` does, for check and for the search alike (the search's own request takes no
            # trainer_defaults: a default batch or checkpointing stays the search's to choose, a method does not).
            default = _method_default(tc.trainer.value, s)
            if default is not None:
                put("method", default[1], default[2])
        for name in ("batch_size", "seq_len", "gradient_accumulation_steps", "lora_r", "num_processes"):
            if name in s and positive_int(s[name].value):
                put("num_gpus" if name == "num_processes" else name, positive_int(s[name].value),
                    where(name) + deepspeed_auto(s, name))
        if "gradient_checkpointing" in s and getattr(tc.trainer, "value", None) is not Trainer.LLAMA_FACTORY:
            # (LLaMA-Factory's key does not decide alone: trainer_defaults reads it with disable_gradient_checkpointing)
            put("gradient_checkpointing", truthy(s["gradient_checkpointing"].value), where("gradient_checkpointing"))
        if "optimizer" in s and isinstance(s["optimizer"].value, str):
            put("optimizer", s["optimizer"].value, where("optimizer"))
        attn = s.get("attn_implementation")
        # LLaMA-Factory's flash_attn names them disabled (eager: the s x s scores held), sdpa, fa2, fa3
        lf_names = {"fa2": "flash_attention_2", "fa3": "flash_attention_3", "disabled": "eager"}
        if attn is not None and isinstance(attn.value, str) and attn.value.strip().lower() in (
                "eager", "sdpa", "flash_attention_2", "flash_attention_3", *lf_names):
            v = attn.value.strip().lower()
            put("attention", lf_names.get(v, v), where("attn_implementation"))
        targets = s.get("lora_target_modules")
        if targets is not None:
            v = targets.value
            if isinstance(v, str) and v.strip().lower() in ("all", "all-linear", "all_linear"):
                put("lora_targets", "all-linear", where("lora_target_modules"))
            elif isinstance(v, str) and _REGEX_CHARS.search(v):
                # PEFT reads a string target_modules as a regex over whole module names (memory.Linear.matched).
                put("lora_targets", v.strip(), where("lora_target_modules"))
            elif isinstance(v, str):
                put("lora_targets", tuple(t.strip() for t in v.split(",") if t.strip()), where("lora_target_modules"))
            elif isinstance(v, list) and all(isinstance(t, str) for t in v):
                put("lora_targets", tuple(v), where("lora_target_modules"))
        if "lora_target_linear" in s and truthy(s["lora_target_linear"].value):
            put("lora_targets", "all-linear", where("lora_target_linear"))
        switch = _config_precision(s)
        if switch is not None:
            put("precision", switch[0], where(switch[1]))
        # How the processes run together: the Run's own reading (run.config_sharding), so the plan shards what the
        # Run's engine says (FSDP's strategy counted as the ZeRO stage it equals) and offloads what it offloads.
        sharding = config_sharding(tc)
        if sharding.sharding is not None:
            put("zero_stage", sharding.sharding.value, sharding.sharding.source)
            if sharding.engine is not None and sharding.engine.value.fsdp:
                put("fsdp", True, sharding.sharding.source)
        if "num_machines" in s and positive_int(s["num_machines"].value):
            put("num_nodes", positive_int(s["num_machines"].value), where("num_machines"))
        if sharding.offload_optimizer is not None:
            put("offload_optimizer", True, sharding.offload_optimizer.source)
        if sharding.offload_params is not None:
            put("offload_params", True, sharding.offload_params.source)
        # Evaluation as the Run reads it written (run.written): its batch, kept predictions, and how often they leave
        # the GPU.
        said = written(tc)
        for name, setting in (("eval_batch", said.eval_batch), ("keeps_predictions", said.keeps_predictions),
                              ("eval_accumulation", said.eval_accumulation)):
            if setting is not None:
                put(name, setting.value, setting.source)
    put("method", TASK_METHODS.get(task), f"--task {task}")
    if task in ("dpo", "orpo", "kto", "grpo", "ppo") and getattr(tc, "task", None) != task:
        # The stable RL setting the recommendation writes (TRL #3236) turns checkpointing on. Not over a config that
        # names the task itself: its trainer runs it, and what the config leaves open is that trainer's default.
        put("gradient_checkpointing", True, f"--task {task} (the stable setting)")
    return values, src


_OFF = ("false", "no", "0", "off", "none", "fp32")


def _config_precision(s: Mapping[str, Any]) -> tuple[str, str] | None:
    """(autocast, setting) where the training config's own switches set the run's precision (transformers' Trainer
    reads bf16/fp16, accelerate mixed_precision): fp32 where they are set and all off. None where the config leaves it
    to the launcher (no switch: GD609's "unless the launcher adds it"; `auto`: the machine decides), sets a value the
    trainer refuses (GD681: the run does not start), or turns both on (GD604)."""
    names = [n for n in ("bf16", "fp16", "mixed_precision") if n in s]
    if not names:
        return None
    on: list[tuple[str, str]] = []
    for name in names:
        v = s[name].value
        text = v.strip().lower() if isinstance(v, str) else None
        if name == "mixed_precision":
            if text in ("bf16", "fp16"):
                on.append((text, name))
            elif text not in _OFF:
                return None
        elif isinstance(v, bool) or v in (0, 1) or text in ("true", "yes", "1", "on") or text in _OFF:
            if truthy(v):
                on.append((name, name))
        else:
            return None  # `auto`, or a value the trainer refuses
    if len({p for p, _ in on}) > 1:
        return None
    return on[0] if on else ("fp32", names[0])


# The dtype words TRL's create_model_from_path takes (a config's dtype / torch_dtype / model_init_kwargs.dtype).
_LOAD_DTYPES = {"bfloat16": "bfloat16", "bf16": "bfloat16", "float16": "float16", "fp16": "float16",
                "float32": "float32", "fp32": "float32"}


def _load_dtype_word(word: Any) -> str | None:
    """A dtype as a config or a checkpoint writes it ("bf16", "torch.float32", ...) in the plan's words, None where it
    is none the plan counts."""
    return _LOAD_DTYPES.get(word.strip().lower().replace("torch.", "")) if isinstance(word, str) else None


# The config class whose defaults each of TRL's trainers reads (for the source of a default).
_TRL_CONFIGS = {Trainer.TRL_SFT: "SFTConfig", Trainer.TRL_DPO: "DPOConfig", Trainer.TRL_GRPO: "GRPOConfig",
                Trainer.TRL_RL: "trainer config"}
Default = tuple[str, Any, str]  # (setting, the trainer's default value, where that default comes from)



def _llamafactory_checkpointing(s: Mapping[str, Any]) -> Default:
    """Whether LLaMA-Factory checkpoints, and why: it checkpoints the model itself unless disable_gradient_checkpointing
    (model_utils/checkpointing.py prepare_model_for_training), so its TrainingArguments' `gradient_checkpointing:
    false` does not turn that off, and `true` turns it on whatever disable says (the Trainer enables it itself)."""
    on, off = s.get("gradient_checkpointing"), s.get("disable_gradient_checkpointing")
    if on is not None and truthy(on.value):
        return "gradient_checkpointing", True, FROM_CONFIG + on.key
    if off is not None:
        return "gradient_checkpointing", not truthy(off.value), FROM_CONFIG + off.key
    return ("gradient_checkpointing", True, "default of LLaMA-Factory (disable_gradient_checkpointing: false"
            + ("; its gradient_checkpointing: false does not turn it off)" if on is not None else ")"))


def deepspeed_auto(s: Mapping[str, Any], name: str) -> str:
    """What a source adds where the DeepSpeed JSON the config names writes "auto" for this setting (batch_size,
    gradient_accumulation_steps): the Trainer's integration copies TrainingArguments' value into it
    (HfTrainerDeepSpeedConfig.trainer_config_process), so the run's value is the config's, and the source says so."""
    kept = next((k for k, own in DEEPSPEED_BATCH.items() if own == name), None)
    ds = s.get(kept) if kept is not None else None
    if ds is None or not is_auto(ds.value):
        return ""
    return f" (DeepSpeed's {ds.key}: auto copies it)"


def checkpoint_dtype(census: Any | None) -> str | None:
    """The dtype `from_pretrained(dtype="auto")` loads a checkpoint in: config.json's dtype, else its weights' most
    common floating dtype; None where neither is a dtype the plan counts."""
    if census is None:
        return None
    return next((d for d in map(_load_dtype_word, (census.declared, census.dominant)) if d is not None), None)


def trainer_defaults(tc: Any | None, stack: Any | None, checkpoint: str | None = None,
                     backend: str | None = None) -> tuple[Default, ...]:
    """The settings a training config leaves open that the trainer executing it fixes by its own default, each with
    that default's source: gradient checkpointing (TrainingArguments and axolotl: off; TRL's configs and LLaMA-Factory:
    on) and the dtype the weights load in where the config names none: TRL's trainers load a model id in float32
    (versioning.TRL_LOADS_FP32), a plain Trainer's script loads through from_pretrained, whose default is float32
    before transformers 5 and ``checkpoint`` (the checkpoint's own dtype: ``checkpoint_dtype``) from 5.0. check plans
    the run that will execute: an open setting is the trainer's default, not the search's choice. Where the stack's
    TRL or transformers version is unknown, what depends on it stays open."""
    if tc is None or not getattr(tc, "ok", False) or getattr(tc, "trainer", None) is None:
        return ()
    from gemma_doctor import versioning
    from gemma_doctor.stack import Exposure

    def affected(window: Any) -> Exposure:
        return stack.exposure(window) if stack is not None else Exposure.UNKNOWN

    trainer, s = tc.trainer.value, tc.settings
    out: list[Default] = []
    if trainer is Trainer.LLAMA_FACTORY:
        out.append(_llamafactory_checkpointing(s))
    elif "gradient_checkpointing" not in s:
        if trainer is Trainer.TRANSFORMERS:
            out.append(("gradient_checkpointing", False, "default of transformers TrainingArguments"))
        elif trainer is Trainer.AXOLOTL:
            out.append(("gradient_checkpointing", False, "default of axolotl (0.19.0 schema: gradient_checkpointing "
                                                         "false)"))
        elif trainer.runs_trl:
            window = versioning.TRL_CHECKPOINTING_DEFAULT[trainer.value]
            seen = affected(window)
            if seen is not Exposure.UNKNOWN:
                on = seen is Exposure.AFFECTED
                out.append(("gradient_checkpointing", on, f"default of TRL {_TRL_CONFIGS[trainer]} ({window.describe()})"
                            if on else f"default of transformers TrainingArguments (TRL {_TRL_CONFIGS[trainer]} "
                                       f"before {window.spec.lstrip('>=')})"))
    if (trainer.runs_trl or trainer is Trainer.TRANSFORMERS) and "batch_size" not in s and not (
            "auto_find_batch_size" in s and truthy(s["auto_find_batch_size"].value)):
        # TrainingArguments' per_device_train_batch_size is 8 (transformers 5.23.0, 5.6.0), and TRL's configs keep it
        # (SFT/DPO/GRPO/KTO/Reward configs of TRL 1.16.0 and 0.24.0 read): a config that leaves the batch open trains 8
        # per device with its own accumulation, not a batch chosen to fit (which also rewrote that accumulation).
        # auto_find_batch_size starts there and halves on OOM: the search's choice stands for it.
        out.append(("batch_size", TRAINING_ARGUMENTS_BATCH, "default of transformers TrainingArguments "
                                                            f"(per_device_train_batch_size {TRAINING_ARGUMENTS_BATCH})"
                    + deepspeed_auto(s, "batch_size")))
    if tc.bf16_by_trainer(stack) is Exposure.AFFECTED:
        # TRL's config sets `bf16 = not fp16` where bf16 is unset: bf16, also beside an `fp16: false`.
        window = versioning.TRL_BF16_DEFAULT[trainer.value]
        out.append(("precision", "bf16", f"default of TRL {_TRL_CONFIGS[trainer]} ({window.describe()}: bf16 = not "
                                         "fp16)"))
    elif (trainer.runs_trl or trainer is Trainer.TRANSFORMERS) and not any(
            n in s for n in ("bf16", "fp16", "mixed_precision")) and tc.bf16_by_trainer(stack) is Exposure.SAFE:
        # No switch at all: TrainingArguments' bf16 and fp16 default to false, so the Trainer runs no autocast (GD609's
        # fp32). The run that executes is fp32, not the recommendation (issue 32: the precision line said bf16 beside
        # GD609's fp32); a launcher's mixed precision (--launch) reaches the settings as mixed_precision. TRL whose
        # version is unknown stays open (GD609 says both).
        who = "default of transformers TrainingArguments" if trainer is Trainer.TRANSFORMERS else \
            (f"default of transformers TrainingArguments (TRL {_TRL_CONFIGS[trainer]} before "
               f"{versioning.TRL_BF16_DEFAULT[trainer.value].spec.lstrip('>=')})")
        out.append(("precision", "fp32", f"{who}: the config sets no bf16/fp16, both false (no autocast)"))
    if trainer.runs_trl or trainer is Trainer.TRANSFORMERS:
        given = s.get("torch_dtype")
        word = _load_dtype_word(given.value) if given is not None else None
        if word is not None:
            out.append(("load_dtype", word, FROM_CONFIG + given.key))
        elif given is None:
            windows = ((versioning.TRL_LOADS_FP32, versioning.FROM_PRETRAINED_FP32) if trainer.runs_trl else
                       (versioning.FROM_PRETRAINED_FP32,))
            seen = [affected(w) for w in windows]
            why = next((w for w, e in zip(windows, seen) if e is Exposure.AFFECTED), None)
            if why is not None and trainer.runs_trl:
                out.append(("load_dtype", "float32", f"default of TRL's trainers with {why.describe()}: no dtype in "
                                                     "model_init_kwargs; `dtype: bfloat16` (trl CLI) or "
                                                     "`model_init_kwargs: {dtype: bfloat16}` loads them in bf16"))
            elif why is not None:
                out.append(("load_dtype", "float32", f"default of from_pretrained with {why.describe()}: float32 "
                                                     "where the script passes no dtype"))
            elif checkpoint is not None and all(e is Exposure.SAFE for e in seen):
                # Reproduced on transformers 5.23.0: a tiny bf16 Gemma 3 loads as torch.bfloat16 with no dtype given.
                tf = stack.get("transformers").describe()
                out.append(("load_dtype", checkpoint, f"default of from_pretrained with {tf} (>=5.0.0: the "
                                                      "checkpoint's dtype where the script passes none)"))
    elif trainer is Trainer.AXOLOTL and backend == "mps":
        # ``backend``: the GPU's (readers/gpu.py); on Apple MPS axolotl runs no bf16 (axolotl_on_mps).
        autocast, load, why = axolotl_on_mps(s)
        who = f"default of {trainer_release(trainer, stack)}: resolve_dtype on MPS, {why}"
        out.append(("precision", autocast, who))
        if "torch_dtype" not in s:
            out.append(("load_dtype", load, who))
    elif trainer in (Trainer.AXOLOTL, Trainer.LLAMA_FACTORY):
        own = _own_precision(trainer, s, stack)
        if own is not None:
            out.append(own)
        own = _own_load_dtype(trainer, s, stack, checkpoint) if "torch_dtype" not in s else None
        if own is not None:
            out.append(own)
    if getattr(tc, "task", None) == "grpo" and "max_completion_length" not in s:
        # GRPOConfig's completion: 512 from TRL 1.10.0, 256 before; axolotl 0.19.0 requires trl==1.9.0 (256).
        window = versioning.TRL_GRPO_COMPLETION_512
        seen = affected(window)
        axolotl = stack.get("axolotl") if stack is not None else None
        if trainer is Trainer.AXOLOTL and (axolotl is None or axolotl.absent):  # the TRL axolotl brings, not this one
            out.append(("grpo_completion", 256, "axolotl 0.19.0 hands GRPOConfig no trl.max_completion_length "
                                                "(None: generate()'s own max_length decides): planned as TRL "
                                                "1.9.0's default 256 (axolotl requires trl==1.9.0)"))
        elif seen is not Exposure.UNKNOWN:
            on = seen is Exposure.AFFECTED
            out.append(("grpo_completion", 512 if on else 256,
                        f"default of TRL GRPOConfig ({window.describe()}: max_completion_length 512)" if on else
                        f"default of TRL GRPOConfig before {window.spec.lstrip('>=')}: max_completion_length 256"))
    return tuple(out)


# The releases whose source the trainers' own defaults below were read (and run) in: what is assumed where the stack
# does not name the trainer. The config's format names the trainer that executes it, whatever the machine that checks
# it has installed (an axolotl YAML is run by axolotl).
TRAINER_RELEASES = {Trainer.AXOLOTL: ("axolotl", "0.19.0"), Trainer.LLAMA_FACTORY: ("llamafactory", "0.9.5")}


def trainer_release(trainer: Trainer, stack: Any | None) -> str:
    """The trainer release whose behaviour applies, as a source says it: the stack's (installed, --with, a pin), else
    the release read here, said as assumed."""
    name, version = TRAINER_RELEASES[trainer]
    pkg = stack.get(name) if stack is not None else None
    if pkg is not None and not pkg.absent:
        return pkg.describe()
    return f"{name} {version} (assumed: {name} is not installed here)"


# Keys by which a TrainingArguments config says it trains adapters or loads quantized weights (besides `adapter`:
# TRL's use_peft, axolotl's adapter, LLaMA-Factory's finetuning_type): where it names one, its method is not left to
# the trainer's full fine-tuning default (run_request reads the adapter and the quantization; a script's LoRA keys
# without use_peft stay open: the script decides). TRL's own scripts read use_peft alone (run.trl_unused_lora_keys).
_PEFT_KEYS = ("adapter", "load_in_4bit", "load_in_8bit", "lora_r", "lora_target_modules", "lora_target_linear",
              "lora_target_parameters")
def _method_default(trainer: Trainer, s: Mapping[str, Any]) -> Default | None:
    """The method the trainer runs where its config names none (issue 32: `recommend --trainer trl --method full` wrote
    a YAML without use_peft, which check planned as QLoRA "chosen to fit"): full fine-tuning for TRL's trainers (TRL
    1.16's ModelConfig.use_peft defaults to false, and get_peft_config then gives no peft_config: `trl sft` trains
    every weight), for a plain Trainer (it trains the model it is given; the config names no PEFT) and for axolotl
    (no `adapter`: 0.19.0 trains every weight); LoRA for LLaMA-Factory (0.9.5's FinetuningArguments.finetuning_type
    defaults to "lora"). A TRL config with lora_* keys but no use_peft: true is full fine-tuning too (its keys unused:
    run.trl_unused_lora_keys; GD612). None where the config names the method, or a launched script decides. (Read by
    run_request: the release named is the one read, whatever the stack holds.)"""
    if "adapter" in s:
        return None
    unused = trl_unused_lora_keys(trainer, s)
    if unused:  # (load_in_4bit / 8bit true: run_request planned the quantized run first; GD612 says TRL refuses it)
        return ("method", "full", f"default of TRL's ModelConfig (use_peft false unless set): "
                                  f"{', '.join(s[n].key for n in unused)} "
                                  "unused (get_peft_config gives no peft_config without use_peft: true), every weight "
                                  "trains")
    if trainer is Trainer.AXOLOTL:
        return "method", "full", "default of axolotl (0.19.0: no adapter, every weight trains)"
    if trainer is Trainer.LLAMA_FACTORY:
        return "method", "lora", "default of LLaMA-Factory (0.9.5's finetuning_type: lora unless set)"
    if any(k in s for k in _PEFT_KEYS):
        return None
    if trainer.runs_trl:
        return ("method", "full", "default of TRL's ModelConfig (use_peft false unless set): the trainer gets no "
                                  "peft_config and trains every weight")
    if trainer is Trainer.TRANSFORMERS:
        return ("method", "full", "default of transformers Trainer: the config names no PEFT (use_peft, lora_*, "
                                  "load_in_4bit/8bit), so every weight of the model trains")
    return None


def _own_precision(trainer: Trainer, s: Mapping[str, Any], stack: Any | None) -> Default | None:
    """The precision axolotl's or LLaMA-Factory's own defaults give a config whose switches leave it open. axolotl
    0.19.0: its schema's `bf16` defaults to `auto`, and resolve_dtype (normalize_config) turns `auto` off beside
    `fp16: true`, else on wherever transformers' is_torch_bf16_gpu_available() says so, which is
    torch.cuda.is_bf16_supported() counting emulation: every CUDA GPU (validate_config + normalize_config run here:
    no switch -> bf16 and torch.bfloat16 with bf16 support, fp16 and torch.float16 without). LLaMA-Factory 0.9.5:
    its TrainingArguments' bf16 / fp16 default to false and nothing turns them on (hparams/parser.py only warns "We
    recommend enable mixed precision training"): no autocast, fp32, unless pure_bf16."""
    bf16, fp16 = s.get("bf16"), s.get("fp16")
    who = trainer_release(trainer, stack)
    if trainer is Trainer.AXOLOTL:
        auto = bf16 is None or is_auto(bf16.value)
        if not auto:
            return None  # bf16 written true / false: the switches say it
        said = "bf16 unset is its schema's auto" if bf16 is None else f"{bf16.key}: auto"
        if fp16 is not None and truthy(fp16.value):
            return "precision", "fp16", f"default of {who}: {said}, off beside {fp16.key}: true"
        return ("precision", "bf16", f"default of {who}: {said}, on wherever torch.cuda.is_bf16_supported() says so "
                                     "(counting emulation): every CUDA GPU")
    pure = s.get("pure_bf16")
    if pure is not None and truthy(pure.value) and not (fp16 is not None and truthy(fp16.value)):
        # hparams/parser.py sets compute_dtype bfloat16 for pure_bf16 and leaves TrainingArguments' bf16 as written;
        # init_adapter casts nothing to fp32: the weights train in bfloat16 with or without autocast.
        return ("precision", "bf16", f"default of {who}: {pure.key}: true trains the weights, gradients and optimizer "
                                     "states in bfloat16" + ("" if bf16 is not None and truthy(bf16.value) else
                                                             " without autocast (bf16 is off)"))
    if bf16 is None and fp16 is None and "mixed_precision" not in s and not (pure is not None and truthy(pure.value)):
        return ("precision", "fp32", f"default of {who}: bf16 and fp16 false unless set (no autocast; it only "
                                     "recommends mixed precision)")
    return None


def _own_load_dtype(trainer: Trainer, s: Mapping[str, Any], stack: Any | None, checkpoint: str | None) -> Default | None:
    """The dtype axolotl's or LLaMA-Factory's own loader gives the weights (never a library's default), by the
    config's format (the trainer that runs it; its release ``trainer_release``, assumed where the stack does not name
    it) where the config fixes it: axolotl's normalize_config passes from_pretrained torch_dtype from its switches
    (readers.training_config.axolotl_load_dtype; bf16 `auto`, its default, is bfloat16 on a CUDA GPU: _own_precision,
    float32 only with bf16 and fp16 off); LLaMA-Factory loads torch_dtype="auto" (the checkpoint's dtype)
    and its init_adapter upcasts the trainable weights to float32 unless pure_bf16 (read in the 0.9.5 wheel: full
    fine-tuning then holds float32 weights; a LoRA base stays in the checkpoint's dtype). Quantized loads,
    LLaMA-Factory without finetuning_type, freeze tuning (some layers upcast) and DeepSpeed (ZeRO-3
    keeps its own float32 copy) stay open."""
    who = trainer_release(trainer, stack)
    quantized = any(k in s and (truthy(s[k].value) or s[k].value in (4, 8)) for k in ("load_in_4bit", "load_in_8bit"))
    if quantized:
        return None
    if trainer is Trainer.AXOLOTL:
        derived = axolotl_load_dtype(s)
        if derived is None:
            # bf16 `auto` (written, or its schema's default): resolve_dtype turns it on on every CUDA GPU
            # (_own_precision), and torch_dtype follows it.
            return ("load_dtype", "bfloat16", f"default of {who}: normalize_config's torch_dtype, bfloat16 with bf16: "
                                              "auto on a CUDA GPU")
        word, key = derived
        why = f"with {s[key].key}: {s[key].value}" if key is not None else "with bf16 and fp16 off"
        return "load_dtype", word, f"default of {who}: normalize_config's torch_dtype, {word} {why}"
    adapter, pure = s.get("adapter"), s.get("pure_bf16")
    kind = str(adapter.value).strip().lower() if adapter is not None else None
    if "deepspeed" in s:
        return None
    if pure is not None and truthy(pure.value):
        return ("load_dtype", checkpoint, f"default of {who}: from_pretrained(torch_dtype=\"auto\") loads the "
                                          "checkpoint's dtype, which pure_bf16 trains as it is (no fp32 upcast)") \
            if checkpoint is not None and kind in ("full", "lora", "oft", "freeze") else None
    if kind == "full":
        return ("load_dtype", "float32", f"default of {who}: init_adapter upcasts a full fine-tuning's "
                                         "weights to float32 without pure_bf16")
    if kind in ("lora", "oft") and checkpoint is not None:
        return ("load_dtype", checkpoint, f"default of {who}: from_pretrained(torch_dtype=\"auto\") "
                                          "loads the checkpoint's dtype, which a LoRA base keeps")
    return None


def trl_chunks(stack: Any) -> bool:
    """The TRL that will run computes SFT and DPO log-probs in chunks (every version it may be is in
    TRL_CHUNKED_LOGPROBS)."""
    from gemma_doctor.stack import Exposure
    from gemma_doctor.versioning import TRL_CHUNKED_LOGPROBS

    return stack is not None and stack.exposure(TRL_CHUNKED_LOGPROBS) is Exposure.AFFECTED


def chunking_trainer_config(tc: Any) -> bool:
    """TRL's SFTTrainer or DPOTrainer executes the training config (the reader's trainers.decide, which
    rules/attention.py's GD650 and the rehearsal's twin take too): a trainer whose fused LM head computes log-probs in
    chunks from TRL 1.15 on (trainers.CHUNKING_TRAINERS)."""
    chosen = getattr(tc, "trainer", None)
    return chosen is not None and chosen.value in CHUNKING_TRAINERS


def gpu_memory(gpu: Any, override: int | None) -> tuple[int | None, str | None, int, str | None]:
    """(bytes per GPU, name, GPUs seen, note): --gpu-memory, else the probe's smallest device, else --gpu's size (as
    readers/gpu.py parsed it once: the GPU fact carries the note and the size assumed, never parsed again here)."""
    # The GPU value's count (readers/gpu.py: --num-gpus, the training config, else the devices visible).
    count = getattr(gpu, "count", None) or max(1, len(getattr(gpu, "devices", ()) or ()))
    name = getattr(gpu, "label", None)
    if override is not None:
        return override, name, count, f"--gpu-memory {override / memory.GIB:g} GiB"
    if getattr(gpu, "backend", "none") == "none":
        return None, None, 1, "no GPU: the plan is not judged against a GPU's memory"
    sizes = [d.memory_bytes for d in gpu.devices if d.memory_bytes]
    note = getattr(gpu, "memory_note", "") or None
    assumed = getattr(gpu, "assumed_memory_bytes", None)
    if sizes:
        return min(sizes), name, count, note
    if assumed:
        return assumed, name, count, note
    return None, name, count, note or f"{name}: memory size unknown (pass --gpu-memory)"


@dataclass(frozen=True)
class RunRequest:
    """The run the user described: its settings (run.Settings: theirs, defaults for the rest), what they fixed, and the
    GPU."""

    base: Settings
    fixed: tuple[str, ...]  # settings the user fixed: method, batch_size, gradient_checkpointing, zero_stage, seq_len...
    gpu_bytes: int | None
    gpu_name: str | None
    gpu_note: str | None


def request_spec(*, precision: str, gpu: Any, request: MemoryRequest,
                 training_config: Any | None, task: str, lora_targets: str | tuple[str, ...] | None = None,
                 trl_chunks: bool = False, config_precision: bool = True,
                 defaults: tuple[Default, ...] = (), precision_source: str = "recommended") -> RunRequest:
    """The options and the training config as the run's base settings (run.Settings: what they fix, defaults for the
    rest) and the GPU's memory. ``lora_targets``: the targets the recommendation writes for this model, where the user
    named none; ``trl_chunks``: the stack's TRL computes SFT log-probs in chunks (versioning.TRL_CHUNKED_LOGPROBS);
    ``config_precision``: the precision the training config sets is the run's (check's plan of the user's run), not
    ``precision`` (False: the search, whose candidates each write their own); ``defaults``: trainer_defaults, what
    the trainer fixes where the options and the config leave a setting open; ``precision_source``: where ``precision``
    comes from where the run takes it ("recommended": check's run of a config that sets none; "prescription": a
    candidate of the search, whose config writes the precision it is planned in)."""
    values, src = _with_defaults(run_request(training_config, request, task), defaults)
    if config_precision and "precision" in values:
        precision = values["precision"]
    else:
        src.pop("precision", None)
    tc = training_config
    if trl_chunks and tc is not None and getattr(tc, "ok", False) and chunking_trainer_config(tc):
        # The same condition as GD650's "does not apply here": the plan then holds no b*s*V logits either.
        values["chunked_loss"] = True
        src["chunked_loss"] = (f"TRL >= 1.15 {CHUNKING_LOOPS[tc.trainer.value][1]} "
                               "(the training config's trainer and the stack's TRL)")
    liger = tc.get("liger_dpo_loss") if tc is not None and getattr(tc, "ok", False) else None
    if (liger is not None and truthy(liger.value) and task == "dpo" and not values.get("chunked_loss")
            and tc.trainer.value is Trainer.AXOLOTL):
        values["liger_dpo_loss"] = True
        src["liger_dpo_loss"] = (f"{FROM_CONFIG}{liger.key}: TRL's DPOTrainer (1.9.0, axolotl 0.19.0's pin) computes "
                                 "the loss with Liger's LigerFusedLinearDPOLoss, one chosen/rejected pair's logits at "
                                 "a time")
    if lora_targets is not None:
        values.setdefault("lora_targets", lora_targets)
    generation = None
    if task == "grpo":
        generation, src["generation"] = grpo_generation(tc, values.get("grpo_completion"), src.get("grpo_completion"))
        if "seq_len" not in values:
            # The sequence a step trains on and generates is the prompt and its completion. TRL 1.x's GRPOConfig has no
            # prompt length (it never truncates a prompt): planned with a prompt of GRPO_PROMPT tokens; a config of
            # TRL <= 0.24 writes max_prompt_length.
            said = tc.get("max_prompt_length") if tc is not None and getattr(tc, "ok", False) else None
            prompt = positive_int(said.value) if said is not None else None
            values["seq_len"] = (prompt or GRPO_PROMPT) + generation.completion
            src["seq_len"] = ((f"{FROM_CONFIG}{said.key} {prompt}" if prompt else f"a {GRPO_PROMPT}-token prompt "
                               "(assumed: GRPOConfig has no prompt length; --seq-len for the whole)")
                              + f" + max_completion_length {generation.completion}")
    gpu_bytes, gpu_name, seen, gpu_note = gpu_memory(gpu, request.gpu_memory)
    device = "cuda" if getattr(gpu, "backend", "none") in ("cuda", "rocm") else "cpu"
    method = values.get("method", "full")
    num = values.get("num_gpus") or seen
    sources = dict(src)
    sources.setdefault("precision", precision_source)
    if "num_gpus" not in src and seen > 1:
        sources["num_gpus"] = GPUS_VISIBLE
    processes = tc.get("num_processes") if tc is not None and getattr(tc, "ok", False) else None
    if "num_gpus" not in src and processes is not None and is_auto(processes.value):
        # `torchrun --nproc-per-node auto|gpu` (readers/launch.py): one process per GPU visible when the run starts.
        sources["num_gpus"] = f"{FROM_CONFIG}{processes.key} auto: one process per GPU visible ({seen})"
    if "lora_r" in src or "lora_targets" in src:
        sources["lora"] = src.get("lora_targets") or src.get("lora_r", "default")
    # The dtype the trainer loads the weights in (TRL's float32 default, a config's dtype), except for QLoRA, whose
    # plan counts quantized weights.
    load = values["load_dtype"] if "load_dtype" in values and method != "qlora" else memory.load_dtype_for(
        precision, method)
    if method == "qlora":
        sources.pop("load_dtype", None)
    base = Settings(method=method, precision=precision, load_dtype=load,
                   optimizer=values.get("optimizer", memory.DEFAULT_OPTIMIZER),
                   batch_size=values.get("batch_size", memory.DEFAULT_BATCH),
                   seq_len=values.get("seq_len", memory.DEFAULT_SEQ_LEN),
                   gradient_checkpointing=values.get("gradient_checkpointing", False),
                   gradient_accumulation_steps=values.get("gradient_accumulation_steps", 1),
                   lora_r=values.get("lora_r", memory.DEFAULT_LORA_R),
                   lora_targets=values.get("lora_targets", memory.DEFAULT_LORA_TARGETS),
                   quant_bits=values.get("quant_bits"), num_gpus=num, zero_stage=values.get("zero_stage", 0),
                   fsdp=values.get("fsdp", False), num_nodes=values.get("num_nodes", 1),
                   offload_optimizer=values.get("offload_optimizer", False),
                   offload_params=values.get("offload_params", False), eval_batch=values.get("eval_batch"),
                   keeps_predictions=values.get("keeps_predictions", False),
                   eval_accumulation=values.get("eval_accumulation"), device=device, task=task,
                   attention=values.get("attention", "sdpa"), chunked_loss=values.get("chunked_loss", False),
                   liger_dpo_loss=values.get("liger_dpo_loss", False), generation=generation,
                   sources=tuple(sorted(sources.items())))
    return RunRequest(base, _fixed_of(values, src), gpu_bytes, gpu_name, gpu_note)


# TRL 1.16's GRPOConfig: the defaults of the keys run.Generation reads (trl/trainer/grpo_config.py).
GRPO_DEFAULTS = "TRL 1.16 GRPOConfig's defaults"
# The prompt a GRPO plan assumes where nothing gives the sequence: GRPOConfig's max_prompt_length default while it had
# one (TRL 0.24.0's grpo_config.py; gone from 1.0.0).
GRPO_PROMPT = 512


def grpo_generation(tc: Any | None, completion_default: int | None = None,
                    completion_source: str | None = None) -> tuple[Generation, str]:
    """What a GRPO run generates, as its GRPOConfig writes it (TRL 1.16's defaults for what it does not, except the
    completion the trainer's TRL defaults to: ``completion_default``, trainer_defaults'), and the source: the keys the
    config writes, else the defaults."""
    # A config that names no task of its own is the GRPO run `--task grpo` says it is: its GRPOConfig keys count (a
    # GRPOConfig YAML need write none of GRPO_ONLY_KEYS; its use_vllm and max_completion_length were dropped before).
    s = tc.settings if tc is not None and getattr(tc, "ok", False) and getattr(tc, "task", None) in ("grpo", None) \
        else {}
    said: list[str] = []

    def value(name: str) -> Any:
        setting = s.get(name)
        if setting is None:
            return None
        said.append(setting.key)
        return setting.value

    completion = positive_int(value("max_completion_length"))
    steps = positive_int(value("steps_per_generation"))
    batch = positive_int(value("generation_batch_size"))
    groups = positive_int(value("num_generations"))
    use_vllm = value("use_vllm")
    mode = value("vllm_mode")
    share = value("vllm_gpu_memory_utilization")
    sleep = value("vllm_enable_sleep_mode")
    beta = value("beta")
    engine = "transformers"
    if use_vllm is not None and truthy(use_vllm):
        engine = "vllm-server" if isinstance(mode, str) and mode.strip().lower() == "server" else "vllm-colocate"
    if getattr(getattr(tc, "trainer", None), "value", None) is Trainer.AXOLOTL and engine == "vllm-colocate":
        # axolotl 0.19.0 passes vllm.gpu_memory_utilization (its default 0.9) only where trl.vllm_mode names colocate;
        # else TRL's own default (0.3) applies
        named = isinstance(mode, str) and mode.strip().lower() == "colocate"
        share = (share if share is not None else 0.9) if named else None
    trainer_default = ""
    if completion is None and completion_default is not None:
        completion = completion_default
        trainer_default = f"{completion_source}; "
    default = Generation()  # TRL 1.16 GRPOConfig's defaults
    made = Generation(completion=completion or default.completion, steps=steps, batch=batch, engine=engine,
                      share=min(1.0, _non_negative(share, default.share)), sleep=sleep is not None and truthy(sleep),
                      beta=_non_negative(beta, default.beta), groups=groups or default.groups)
    rest = f"{trainer_default}{GRPO_DEFAULTS} for the rest" if said else f"{trainer_default}{GRPO_DEFAULTS}"
    source = FROM_CONFIG + ", ".join(said) + f" ({rest})" if said else rest
    return made, source


def _non_negative(v: Any, default: float) -> float:
    """A non-negative number as TRL's parser takes it, else ``default``: YAML's numbers, and strings of one (TrlParser
    hands them to argparse, whose float type converts them: beta '0.04' is 0.04, read with TRL 1.16.0)."""
    if isinstance(v, str):
        try:
            v = float(v.strip())
        except ValueError:
            return default
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) and 0 <= v else default


def _with_defaults(request: tuple[dict[str, Any], dict[str, str]],
                   defaults: tuple[Default, ...]) -> tuple[dict[str, Any], dict[str, str]]:
    """run_request's values and sources with the trainer's ``defaults`` (trainer_defaults) where they are open."""
    values, src = request
    for name, value, where in defaults:
        # A trainer's precision default is its own rule over the config's switches (TRL: bf16 = not fp16 where bf16
        # is unset), so it stands over what the switches alone say (`fp16: false` alone is bf16 under TRL, not fp32).
        if name not in values or name == "precision":
            values[name] = value
            src[name] = where
    return values, src


def _fixed_of(values: Mapping[str, Any], src: Mapping[str, str]) -> tuple[str, ...]:
    """The settings of a request the user fixed (RunRequest.fixed). A preference (the stable RL setting) is not the
    user's choice: the search may drop it."""
    return tuple(k for k in ("method", "batch_size", "gradient_checkpointing", "seq_len", "zero_stage", "attention")
                 if k in values and not str(src.get(k, "")).endswith("(the stable setting)"))


def remembered(cache: dict[tuple[Any, ...], Any], key: tuple[Any, ...], make: Callable[[], Any], most: int = 1024) -> Any:
    """``make()`` (a pure function of the values in ``key``) remembered in ``cache``, per process; a key that cannot be
    hashed is made as it is, every time."""
    try:
        hit = cache.get(key)
    except TypeError:
        return make()
    if hit is None:
        hit = make()
        if len(cache) >= most:
            cache.clear()
        cache[key] = hit
    return hit


_REQUESTS: dict[tuple[Any, ...], Any] = {}


def _request_spec(precision: str, gpu: Any, request: MemoryRequest, training_config: Any | None,
                  task: str, lora_targets: str | tuple[str, ...] | None, trl_chunks: bool = False,
                  config_key: str | None = None, config_precision: bool = True,
                  defaults: tuple[Default, ...] = (), precision_source: str = "recommended") -> RunRequest:
    """request_spec (a pure function of its arguments; it reads no shape), remembered per process when ``config_key``
    stands for the training config's content (the search's candidates: the text their config is made from): the search
    plans check's memory of each candidate's training config for every model, and models of other shapes ask for the
    same requests. The user's own config (no key) is read afresh."""
    def make() -> RunRequest:
        return request_spec(precision=precision, gpu=gpu, request=request, training_config=training_config, task=task,
                            lora_targets=lora_targets, trl_chunks=trl_chunks, config_precision=config_precision,
                            defaults=defaults, precision_source=precision_source)

    if config_key is None:
        return make()
    return remembered(_REQUESTS, (precision, gpu, request, task, lora_targets, trl_chunks, config_key,
                                  config_precision, defaults, precision_source), make)


def _fixed(req: RunRequest) -> tuple[str, ...]:
    """The settings of ``req`` a memory plan reports as the user's (MemoryFacts.fixed)."""
    return tuple(k for k in ("method", "batch_size", "gradient_checkpointing") if k in req.fixed)


def fixed_settings(shape: ModelShape, *, precision: str = "fp32", gpu: Any, request: MemoryRequest,
                   training_config: Any | None, task: str, lora_targets: str | tuple[str, ...] | None = None,
                   trl_chunks: bool = False, defaults: tuple[Default, ...] = ()) -> tuple[str, ...]:
    """``plan_memory(...).fixed`` for the same arguments, without the plan (no run is chosen or counted): whether the
    user fixed a setting decides whether check plans their run at all (pipeline.decide). What is fixed reads none of
    ``precision``, ``lora_targets`` and ``trl_chunks`` (the run's values, not whether the user chose them): the same
    answer whichever are given, so check asks before it has its recommendation; nor the GPU: no run's settings are
    made for it (request_spec's values and sources, and _on_saved_quantization's rule)."""
    values, src = _with_defaults(run_request(training_config, request, task), defaults)
    fixed = _fixed_of(values, src)
    if shape.saved_quantization is not None and "method" not in fixed:  # LoRA or QLoRA on it: its method is fixed
        fixed += ("method",)
    return tuple(k for k in ("method", "batch_size", "gradient_checkpointing") if k in fixed)


def plan_memory(shape: ModelShape, *, precision: str, gpu: Any, request: MemoryRequest, training_config: Any | None, task: str,
                lora_targets: str | tuple[str, ...] | None = None, trl_chunks: bool = False,
                config_key: str | None = None, config_precision: bool = True,
                defaults: tuple[Default, ...] = (), precision_source: str = "recommended") -> MemoryFacts:
    """The memory plan of the run the user described, its open settings chosen so that it fits where possible
    (``lora_targets``: what the recommendation writes for this model where the user named none; ``trl_chunks``: the
    stack's TRL computes SFT log-probs in chunks; ``config_key``: a text the training config is a function of;
    ``config_precision``, ``defaults`` and ``precision_source``: request_spec's)."""
    req = _on_saved_quantization(_request_spec(precision, gpu, request, training_config, task, lora_targets,
                                               trl_chunks, config_key, config_precision, defaults,
                                               precision_source), shape)
    base, gpu_bytes, gpu_name, gpu_note = req.base, req.gpu_bytes, req.gpu_name, req.gpu_note
    values = {k for k in req.fixed}
    fixed = _fixed(req)
    methods = (base.method,) if "method" in values else memory.METHODS
    choice = memory.choose(shape, base, gpu_bytes, methods, batch_fixed="batch_size" in values,
                           ckpt_fixed="gradient_checkpointing" in values or base.source("gradient_checkpointing").endswith(
                               "(the stable setting)"), gpu_name=gpu_name)
    unconstrained = None
    if not choice.fits and fixed and gpu_bytes and not base.gradient_checkpointing \
            and base.source("gradient_checkpointing").startswith("default of"):
        # Checkpointing is off only as the trainer's default: the way out that names the setting is the same run with
        # it on (GD801 then says to set it), before one that changes what the user wrote.
        on = memory.choose(shape, replace(base, gradient_checkpointing=True), gpu_bytes, methods,
                           batch_fixed="batch_size" in values, ckpt_fixed=True, gpu_name=gpu_name)
        unconstrained = on if on.fits else None
    if not choice.fits and fixed and gpu_bytes and unconstrained is None:
        unconstrained = memory.choose(shape, replace(base, method="full"), gpu_bytes, memory.METHODS, gpu_name=gpu_name)
    plan = choice.plan if choice.plan is not None else memory.plan(shape, base, gpu_bytes, gpu_name)
    return _finish(shape, plan, choice, fixed, unconstrained, gpu_bytes, gpu_name, gpu_note)


def _finish(shape: ModelShape, plan: MemoryPlan, choice: Choice, fixed: tuple[str, ...], unconstrained: Choice | None,
            gpu_bytes: int | None, gpu_name: str | None, gpu_note: str | None) -> MemoryFacts:
    # Where the chosen settings came from, for the assumptions: what the user left open was chosen to fit.
    chosen = dict(plan.settings.sources)
    for k in ("method", "batch_size", "gradient_checkpointing"):
        chosen.setdefault(k, "chosen to fit" if gpu_bytes else "default")
    if "lora" not in chosen and plan.settings.method != "full" and any(v == "chosen by the search" for v in chosen.values()):
        chosen["lora"] = "chosen by the search"
    extra = (gpu_note,) if gpu_note else ()
    plan = memory.with_sources(plan, shape, tuple(sorted(chosen.items())), gpu_bytes, gpu_name)
    # The GPU's note after plan()'s own lines, as a note (memory.with_notes): the plan can be relabelled again
    # (memory_facts with new sources) without planning it anew.
    return MemoryFacts(plan=memory.with_notes(plan, extra), choice=choice, fixed=fixed, unconstrained=unconstrained)


def memory_facts(shape: ModelShape, plan: MemoryPlan, req: RunRequest, reason: Callable[[MemoryPlan], str],
                 sources: tuple[tuple[str, str], ...] | None = None) -> MemoryFacts:
    """MemoryFacts of a run the search chose (it fits: ``plan``; a MemoryFacts' own plan, the search's check of the
    run, relabelled with ``sources`` where given: memory.with_sources), and ``reason(plan)`` as the choice's reason."""
    if sources is not None:
        plan = memory.with_sources(plan, shape, sources, req.gpu_bytes, req.gpu_name)
    reason = reason(plan)
    fixed = _fixed(req)
    choice = Choice(plan, plan.fits if req.gpu_bytes else False, (plan,), reason=reason)
    return _finish(shape, plan, choice, fixed, None, req.gpu_bytes, req.gpu_name, req.gpu_note)
