"""Read a training config (TrainingArguments/TRL JSON or YAML, axolotl, LLaMA-Factory, accelerate, DeepSpeed)
into the precision settings the run will use, as a frozen fact. Never raises for a bad file."""

from __future__ import annotations

import errno
import functools
import json
import os
import re
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, Mapping

from gemma_doctor import trainers
from gemma_doctor.errors import UsageError

# Training configs are a few KiB; anything larger is not one and is not read whole (PyYAML parses ~1 MB/s).
MAX_BYTES = 1024 * 1024
# A user's YAML is read by PyYAML's pure-Python loader, as every launcher reads it (yaml.safe_load), at some 4 us a
# byte (a 1 MiB file of 100,000 keys: 24 s of check). The largest YAML in axolotl's repository is 20.8 KiB (its
# examples: at most 12.2 KiB), LLaMA-Factory's 4.6 KiB (2026 snapshots): a YAML config over this is not read.
MAX_YAML_BYTES = 128 * 1024
# A setting's value, once aliases are expanded: far more than any real value (a list of target modules...).
MAX_VALUE_ITEMS = 10_000
MAX_VALUE_DEPTH = 32

# Normalised setting -> the keys (dotted paths) that hold it in the formats we know, first found wins.
# TRL's ModelConfig builds BitsAndBytesConfig(bnb_4bit_compute_dtype=torch_dtype), hence torch_dtype below.
KEYS: dict[str, tuple[str, ...]] = {
    "fp16": ("fp16", "fp16.enabled"),
    "bf16": ("bf16", "bf16.enabled", "bfloat16.enabled"),
    "mixed_precision": ("mixed_precision",),
    "use_cache": ("use_cache", "model_init_kwargs.use_cache", "model_kwargs.use_cache"),
    # transformers 5.23.0 renamed it activation_checkpointing (gradient_checkpointing is its deprecated alias), and
    # recommend's TrainingArguments / TRL snippets write the new name on that stack (plan/recommend.checkpointing_keys).
    "gradient_checkpointing": ("gradient_checkpointing", "activation_checkpointing"),
    "max_grad_norm": ("max_grad_norm", "gradient_clipping"),
    "rl": ("rl", "stage"),
    "adapter": ("adapter", "finetuning_type", "use_peft"),
    # LLaMA-Factory's pure bf16 (no float32 upcast of the trainable weights, model/adapter.py init_adapter).
    "pure_bf16": ("pure_bf16",),
    "load_in_4bit": ("load_in_4bit", "quantization_config.load_in_4bit", "model_init_kwargs.quantization_config.load_in_4bit",
                     "quantization_bit"),
    "compute_dtype": ("bnb_4bit_compute_dtype", "bnb_config_kwargs.bnb_4bit_compute_dtype",  # axolotl's own key
                      "quantization_config.bnb_4bit_compute_dtype",
                      "model_init_kwargs.quantization_config.bnb_4bit_compute_dtype"),
    "torch_dtype": ("torch_dtype", "dtype", "model_init_kwargs.torch_dtype", "model_init_kwargs.dtype"),
    "use_cpu": ("use_cpu", "no_cuda"),
    # The memory plan's inputs (gemma_doctor/plan/memory.py): batch, sequence, optimizer, LoRA, sharding.
    "batch_size": ("per_device_train_batch_size", "micro_batch_size", "train_micro_batch_size_per_gpu"),
    "seq_len": ("max_seq_length", "max_length", "sequence_len", "cutoff_len", "max_seq_len", "model_max_length"),
    "optimizer": ("optim", "optimizer", "optimizer.type"),
    "gradient_accumulation_steps": ("gradient_accumulation_steps",),
    "train_batch_size": ("train_batch_size",),  # a DeepSpeed JSON's global batch (DEEPSPEED_BATCH)
    # TrainingArguments' batch finder: it starts at the batch and halves on OOM (plan/runplan.trainer_defaults), and
    # the DeepSpeed integration then leaves the micro and global batch unchecked (GD663).
    "auto_find_batch_size": ("auto_find_batch_size",),
    "lora_r": ("lora_r", "lora_rank", "peft_config.r"),
    "lora_target_modules": ("lora_target_modules", "lora_target", "target_modules", "peft_config.target_modules"),
    "lora_target_linear": ("lora_target_linear",),
    # The rest of the LoRA keys TRL's get_peft_config reads (run.TRL_PEFT_KEYS): read only to say they are unused
    # without use_peft: true (GD612); the memory plan does not depend on them.
    "lora_alpha": ("lora_alpha",),
    "lora_dropout": ("lora_dropout",),
    "lora_task_type": ("lora_task_type",),
    "use_rslora": ("use_rslora",),
    "use_dora": ("use_dora",),
    "load_in_8bit": ("load_in_8bit", "quantization_config.load_in_8bit", "model_init_kwargs.quantization_config.load_in_8bit"),
    "zero_stage": ("zero_optimization.stage", "deepspeed_config.zero_stage", "zero_stage"),
    "offload_optimizer": ("zero_optimization.offload_optimizer.device", "deepspeed_config.offload_optimizer_device"),
    # TrainingArguments' --deepspeed ds.json; a DeepSpeed script's --deepspeed_config ds.json (deepspeed's own
    # add_config_arguments). accelerate's deepspeed_config is a mapping, which is not a setting (skipped).
    "deepspeed": ("deepspeed", "deepspeed_config"),
    "fsdp": ("fsdp", "fsdp_config.fsdp_sharding_strategy", "fsdp_config.sharding_strategy", "fsdp_sharding_strategy"),
    # axolotl's world_size (its schema has no num_processes; the launcher's WORLD_SIZE sets it at run time)
    "num_processes": ("num_processes", "world_size"),
    # How the run is sharded (rules/distributed.py): accelerate's fsdp_config (fsdp_-prefixed keys), TrainingArguments'
    # / TRL's / axolotl's fsdp_config (prefix optional: transformers strips it), DeepSpeed's offload, the node count.
    "num_machines": ("num_machines",),
    "fsdp_version": ("fsdp_config.fsdp_version", "fsdp_config.version", "fsdp_version"),
    "fsdp_reshard_after_forward": ("fsdp_config.fsdp_reshard_after_forward", "fsdp_config.reshard_after_forward",
                                   "fsdp_reshard_after_forward"),
    "fsdp_auto_wrap_policy": ("fsdp_config.fsdp_auto_wrap_policy", "fsdp_config.auto_wrap_policy", "fsdp_auto_wrap_policy"),
    "fsdp_wrap_classes": ("fsdp_config.fsdp_transformer_layer_cls_to_wrap", "fsdp_config.transformer_layer_cls_to_wrap",
                          "fsdp_transformer_layer_cls_to_wrap"),
    "fsdp_min_num_params": ("fsdp_config.fsdp_min_num_params", "fsdp_config.min_num_params"),
    "fsdp_offload_params": ("fsdp_config.fsdp_offload_params", "fsdp_config.offload_params", "fsdp_config.cpu_offload"),
    "offload_param": ("zero_optimization.offload_param.device", "deepspeed_config.offload_param_device"),
    "deepspeed_config_file": ("deepspeed_config.deepspeed_config_file",),
    # The pitfall catalogue (docs/findings.md GD42x, GD64x): attention backend, packing, LoRA targets.
    # LLaMA-Factory spells the backend flash_attn (auto | disabled | sdpa | fa2).
    "attn_implementation": ("attn_implementation", "model_init_kwargs.attn_implementation",
                            "model_kwargs.attn_implementation", "flash_attn"),
    "flash_attention": ("flash_attention",),  # axolotl's legacy switches
    "sdp_attention": ("sdp_attention",),
    "flex_attention": ("flex_attention",),
    "packing": ("packing", "sample_packing", "neat_packing"),
    # The Run's as-written settings (run.Written): tf32, the evaluation batch and whether predictions are kept,
    # modules_to_save (PEFT / TRL's ModelConfig lora_modules_to_save / axolotl / LLaMA-Factory's additional_target).
    "tf32": ("tf32",),
    "eval_batch_size": ("per_device_eval_batch_size", "eval_batch_size"),
    "prediction_loss_only": ("prediction_loss_only",),
    "eval_accumulation_steps": ("eval_accumulation_steps",),
    "modules_to_save": ("modules_to_save", "lora_modules_to_save", "additional_target", "peft_config.modules_to_save"),
    "padding_free": ("padding_free",),
    "lora_exclude_modules": ("exclude_modules", "lora_exclude_modules", "peft_config.exclude_modules"),
    "trainable_token_indices": ("trainable_token_indices", "peft_config.trainable_token_indices"),
    "pad_token": ("pad_token", "special_tokens.pad_token"),  # TRL SFTConfig.pad_token; axolotl special_tokens
    # Gemma 4 traps (rules/gemma4.py). LLaMA-Factory's use_reentrant_gc defaults to true (hparams/model_args.py).
    "use_reentrant": ("activation_checkpointing_kwargs.use_reentrant", "gradient_checkpointing_kwargs.use_reentrant",
                      "use_reentrant_gc"),
    "disable_gradient_checkpointing": ("disable_gradient_checkpointing",),
    "distributed_type": ("distributed_type",),
    "ddp_find_unused_parameters": ("ddp_find_unused_parameters",),
    "freeze_vision_tower": ("freeze_vision_tower",),
    # The run trains on images (GD804 does not apply): axolotl's processor_type / image_size, LLaMA-Factory's
    # image_max_pixels / image_min_pixels / video_max_pixels, TRL's VLM recipe (dataset_kwargs.skip_prepare_dataset).
    "vision_data": ("processor_type", "image_size", "image_resize_algorithm", "image_max_pixels", "image_min_pixels",
                    "video_max_pixels", "dataset_kwargs.skip_prepare_dataset"),
    "lora_target_parameters": ("lora_target_parameters", "target_parameters", "peft_config.target_parameters"),
    # The field catalogue (gemma_doctor/catalogue/field.json): loss masking, kernels, trainer templates, data format.
    "assistant_only_loss": ("assistant_only_loss",),
    "liger_kernel": ("use_liger_kernel", "enable_liger_kernel", "liger_rms_norm", "liger_fused_linear_cross_entropy"),
    # axolotl's Liger fused DPO loss (0.19.0 core/trainers/dpo/__init__.py: DPOConfig's use_liger_kernel): the memory
    # plan's logits term (run.Settings.liger_dpo_loss).
    "liger_dpo_loss": ("dpo_use_liger_kernel",),
    "template": ("template",),  # LLaMA-Factory's chat template name
    "dataset_text_field": ("dataset_text_field",),
    "max_length": ("max_length",),
    # axolotl: the tokens that end a turn in its chat_template strategy (eos_token when unset), and the first
    # dataset's prompt strategy (`type: chat_template`) and template (`chat_template: gemma3`, tokenizer_default).
    "eot_tokens": ("eot_tokens",),
    # What a GRPO step generates (run.Generation, the memory plan's generation moment): TRL's GRPOConfig keys.
    # axolotl 0.19.0 nests them under trl: (TRLConfig; rl_beta its own name for beta) and passes vllm.gpu_memory_utilization
    # (default 0.9) where trl.vllm_mode is colocate (core/trainers/grpo/__init__.py).
    "max_completion_length": ("max_completion_length", "trl.max_completion_length"),
    "max_prompt_length": ("max_prompt_length",),  # TRL <= 0.24's GRPOConfig
    "steps_per_generation": ("steps_per_generation",),
    "num_generations": ("num_generations", "trl.num_generations"),
    "generation_batch_size": ("generation_batch_size", "trl.generation_batch_size"),
    "use_vllm": ("use_vllm", "trl.use_vllm"),
    "vllm_mode": ("vllm_mode", "trl.vllm_mode"),
    "vllm_gpu_memory_utilization": ("vllm_gpu_memory_utilization", "vllm.gpu_memory_utilization"),
    "vllm_enable_sleep_mode": ("vllm_enable_sleep_mode", "trl.vllm_enable_sleep_mode"),
    "beta": ("beta", "trl.beta", "rl_beta"),
    "dataset_type": ("datasets.0.type",),
    "chat_template": ("datasets.0.chat_template", "chat_template"),
}

@dataclass(frozen=True)
class Setting:
    """One setting as written in the training config: its dotted key, value and (1-based) line."""

    key: str
    value: Any
    line: int | None = None

    def to_json(self) -> dict[str, Any]:
        """JSON view (NaN and infinities, which JSON cannot hold, as the strings "nan", "inf", "-inf")."""
        return {"key": self.key, "value": _json_value(self.value), "line": self.line}


@dataclass(frozen=True)
class KeyProblem:
    """A top-level key of a TRL / TrainingArguments config that its trainer refuses: a key no dataclass field has
    (``unknown-key``, with the field it most likely misspells) or a boolean field's value no parser reads as one
    (``not-boolean``, with true or false when it is a misspelling of one)."""

    # "unknown-key" | "not-boolean" | "deepspeed-file" (a `deepspeed:` path the run stops at: GD601) |
    # "deepspeed-unplanned" (a `deepspeed:` file the run reads but this reader does not: GD601, a warning)
    kind: str
    key: str
    value: Any
    line: int | None
    suggestion: str | None
    why: str | None = None  # deepspeed-file: why the run stops there (_deepspeed_file)

    def to_json(self) -> dict[str, Any]:
        """JSON view."""
        out = {"kind": self.kind, "key": self.key, "value": _json_value(self.value), "line": self.line,
               "suggestion": self.suggestion}
        return {**out, "why": self.why} if self.why is not None else out


@dataclass(frozen=True)
class TrainingConfig:
    """The precision-relevant settings of one training config file, or why it could not be read."""

    path: str
    kind: str = "unknown"
    settings: dict[str, Setting] = field(default_factory=dict)
    error: str | None = None
    # Keys and values the trainer refuses (TRL / TrainingArguments configs only; trainer_keys.json): GD680, GD681.
    problems: tuple[KeyProblem, ...] = ()
    # The trainer that executes the run (trainers.decide: made once, by the reader from the file's keys, or by the
    # launch reader from the command line); a config built without one gets its kind's decision from its settings.
    trainer: trainers.Chosen | None = None

    def __post_init__(self) -> None:
        if self.trainer is None and self.error is None:
            rl = self.settings.get("rl")
            chosen = trainers.decide(self.format, {}, rl.value if rl is not None else None)
            object.__setattr__(self, "trainer", chosen)  # a frozen dataclass's own field, set once at construction

    @property
    def ok(self) -> bool:
        """True when the file was read and parsed to a mapping."""
        return self.error is None

    @property
    def format(self) -> trainers.ConfigKind:
        """The kind of config this is (trainers.REGISTRY), the object the rules ask instead of comparing names."""
        return trainers.kind_named(self.kind)

    def get(self, name: str) -> Setting | None:
        """The setting called ``name`` (a key of KEYS), or None when the file does not set it."""
        return self.settings.get(name)

    @property
    def task(self) -> str | None:
        """The preference / RL task the config names (trainers.task_named: `rl: dpo`, `stage: dpo`, TRL's DPOConfig or
        GRPOConfig keys), None for an SFT config: what check plans where --task names none."""
        if self.error is not None:
            return None
        rl = self.settings.get("rl")
        return trainers.task_named(rl.value if rl is not None else None, self.trainer)

    def bf16_by_trainer(self, stack: Any) -> Any:
        """Whether the run trains in bf16 by its trainer's default, as a stack.Exposure: a config that sets no bf16, no
        mixed_precision and no fp16 on, run by one of TRL's trainers (their configs set `bf16 = not fp16` where bf16 is
        unset: Trainer.bf16_by_default); SAFE where the config sets its precision or the trainer keeps fp32."""
        from gemma_doctor.stack import Exposure

        s = self.settings
        if self.trainer is None or "bf16" in s or "mixed_precision" in s or ("fp16" in s and truthy(s["fp16"].value)):
            return Exposure.SAFE
        return self.trainer.value.bf16_by_default(stack)

    def to_json(self) -> dict[str, Any]:
        """The `environment.training_config` block of the JSON report."""
        out = {"path": self.path, "kind": self.kind, "error": self.error,
               "settings": {k: v.to_json() for k, v in self.settings.items()}}
        if self.trainer is not None:  # the one decision the memory plan, the rules and the rehearsal take
            out["trainer"] = {"value": self.trainer.value.value, "source": self.trainer.source}
        if self.problems:
            out["problems"] = [p.to_json() for p in self.problems]
        return out


# The counts a memory plan is made from, and a bound far past any real run for each (a million GPUs, a per-device batch
# of a million, a sequence of 128 Mi tokens). A config past one is not a run: it is refused here, before any plan is
# made from it (issue 33: 10^60 for the batch and sequence made the plans' search take 85 s; 5,000 digits, exit 70).
RUN_BOUNDS: dict[str, int] = {"batch_size": 1 << 20, "gradient_accumulation_steps": 1 << 20, "seq_len": 1 << 27,
                              "num_processes": 1 << 20, "num_machines": 1 << 20, "lora_r": 1 << 20,
                              # a GRPO step's generation (run.Generation): rows and tokens as the batch and sequence
                              "max_completion_length": 1 << 27, "max_prompt_length": 1 << 27,
                              "steps_per_generation": 1 << 20, "num_generations": 1 << 20,
                              "generation_batch_size": 1 << 40}


def _beyond_any_run(name: str, value: Any) -> str | None:
    """What ``value`` of the count ``name`` is when it is past RUN_BOUNDS (``2^200``-like text for huge integers),
    else None. Only what a plan would take as a count is judged: an integer, or a string of digits."""
    bound = RUN_BOUNDS[name]
    if isinstance(value, bool):
        return None
    if isinstance(value, str):
        text = value.strip()
        if not (text.isascii() and text.isdigit()):
            return None
        if len(text) > 18:  # not converted: Python refuses integers of over 4,300 digits
            return f"a number of {len(text)} digits"
        value = int(text)
    if isinstance(value, int) and value > bound:
        return f"an integer of {value.bit_length()} bits" if value.bit_length() > 63 else f"{value:,}"
    return None


class _Unusable(ValueError):
    """A setting's value that is not plain data: an alias bomb, a recursive alias, or too deep."""


def plain_value(value: Any) -> Any:
    """A setting's value as plain JSON-able data: YAML dates become ISO strings, binary a description, sets sorted
    lists, keys strings, integers too large to print a description; _Unusable when it expands past
    MAX_VALUE_ITEMS (YAML aliases share nodes, so a 700-byte file can name billions of items), recurses into
    itself, or nests deeper than MAX_VALUE_DEPTH."""
    import datetime

    budget = [MAX_VALUE_ITEMS]
    active: set[int] = set()

    def walk(v: Any, depth: int) -> Any:
        budget[0] -= 1
        if budget[0] < 0:
            raise _Unusable(f"expands to more than {MAX_VALUE_ITEMS} items (YAML aliases?)")
        if depth > MAX_VALUE_DEPTH:
            raise _Unusable(f"nests deeper than {MAX_VALUE_DEPTH} levels")
        if v is None or isinstance(v, (bool, str)):
            return v
        if isinstance(v, int):
            # str() of an int over 4300 digits raises; YAML's 0x... and 1:2:3 forms are not bound by that limit.
            return v if v.bit_length() <= 256 else f"<an integer of {v.bit_length()} bits>"
        if isinstance(v, float):
            return v
        if isinstance(v, (datetime.date, datetime.datetime, datetime.time)):
            return v.isoformat()
        if isinstance(v, (bytes, bytearray)):
            return f"<{len(v)} bytes of binary data>"
        if id(v) in active:
            raise _Unusable("refers to itself (a recursive YAML alias)")
        if isinstance(v, dict):
            active.add(id(v))
            out = {(k if isinstance(k, str) else str(walk(k, depth + 1))): walk(x, depth + 1) for k, x in v.items()}
            active.discard(id(v))
            return out
        if isinstance(v, (list, tuple, set, frozenset)):
            active.add(id(v))
            items = sorted(v, key=repr) if isinstance(v, (set, frozenset)) else v
            out_list = [walk(x, depth + 1) for x in items]
            active.discard(id(v))
            return out_list
        return str(v)

    return walk(value, 0)


def _json_value(v: Any) -> Any:
    if isinstance(v, float) and (v != v or v in (float("inf"), float("-inf"))):
        return "nan" if v != v else ("inf" if v > 0 else "-inf")
    if isinstance(v, dict):
        return {k: _json_value(x) for k, x in v.items()}
    if isinstance(v, list):
        return [_json_value(x) for x in v]
    return v


# Kind name -> why a config of that kind (vLLM, SGLang, NeMo: trainers.REGISTRY) is refused in one line.
NOT_TRAINING = trainers.not_training()


def _lookup(data: dict[str, Any], dotted: str) -> tuple[bool, Any]:
    """The value at ``dotted`` (a number is a list index: ``datasets.0.type``), and whether it is there."""
    node: Any = data
    for part in dotted.split("."):
        if isinstance(node, list) and part.isdigit() and int(part) < len(node):
            node = node[int(part)]
            continue
        if not isinstance(node, dict) or part not in node:
            return False, None
        node = node[part]
    return True, node


_UNSET: Any = object()


def _yaml_lines(text: str, root: Any = _UNSET) -> dict[str, int]:
    """Dotted key -> 1-based line of every mapping key up to three levels deep (YAML node marks); ``root``: the
    document's node when it is already composed (walked before it is constructed, which flattens merge keys)."""
    import yaml

    out: dict[str, int] = {}

    def walk(node: Any, prefix: str, depth: int) -> None:
        if depth > 3 or not isinstance(node, yaml.MappingNode):
            return
        for k, v in node.value:
            if isinstance(k, yaml.ScalarNode):
                dotted = prefix + str(k.value)
                out.setdefault(dotted, k.start_mark.line + 1)
                walk(v, dotted + ".", depth + 1)

    try:
        walk(yaml.compose(text, Loader=yaml.SafeLoader) if root is _UNSET else root, "", 1)
    except yaml.YAMLError:
        pass
    return out


def _json_line(text: str, dotted: str) -> int | None:
    """Line of the last key of ``dotted``: the first ``"key":`` after its parents' keys (cheap, good enough)."""
    pos = 0
    for part in dotted.split("."):
        m = re.compile(r'"' + re.escape(part) + r'"\s*:').search(text, pos)
        if m is None:
            return None
        pos = m.start()
    return text.count("\n", 0, pos) + 1


# PyYAML's pure-Python scanner keeps a possible simple key per open flow collection and walks them all at every token:
# quadratic in the nesting of `[` / `{` (2,000 of them, a 4 kB file, took 5-15 s before the composer's recursion limit
# stopped it). No training config nests a tenth of this; a value deeper than MAX_VALUE_DEPTH is refused anyway.
MAX_FLOW_NESTING = 100
_BRACKETS = re.compile(r"[\[\]{}]")


def _flow_nesting_over(text: str, limit: int) -> bool:
    """Whether the text's `[` / `{` ever stand more than ``limit`` deep (counted everywhere, quotes and comments too:
    a bound, not a parse; a real config's brackets in strings are balanced and few)."""
    depth = 0
    for m in _BRACKETS.finditer(text):
        depth = depth + 1 if m.group() in "[{" else max(0, depth - 1)
        if depth > limit:
            return True
    return False


def _yaml_too_large(size: int) -> str:
    return (f"a YAML file of {size // 1024:,} KiB, larger than any training config (axolotl's and LLaMA-Factory's are "
            f"under 21 KiB); not read (at most {MAX_YAML_BYTES // 1024} KiB)")


def parse(text: str, path: str, yaml_first: bool, c_yaml: bool = False) -> TrainingConfig:
    """Parse training-config text (JSON or YAML) into settings; never raises. ``c_yaml``: compose with libyaml's parser
    where PyYAML has it (for the YAML gemma-doctor prints itself; a user's file is read by the pure-Python one)."""
    data: Any = None
    is_json = False
    lines: dict[str, int] = {}
    if not yaml_first:
        try:
            data = json.loads(text)
            is_json = True
        except json.JSONDecodeError as e:
            if path.endswith(".json"):
                return TrainingConfig(path, error=f"not valid JSON: {e.msg} at line {e.lineno} column {e.colno}")
        except RecursionError:
            return TrainingConfig(path, error="nested too deeply to be a training config")
        except ValueError as e:
            # Integers over 4300 digits: Python refuses to convert them with a plain ValueError.
            return TrainingConfig(path, error=f"not a training config: {e}".splitlines()[0])
    if not is_json:
        if _flow_nesting_over(text, MAX_FLOW_NESTING):
            return TrainingConfig(path, error="nested too deeply to be a training config")
        if not c_yaml and len(text) > MAX_YAML_BYTES:
            return TrainingConfig(path, error=_yaml_too_large(len(text)))
        try:
            import yaml
        except ImportError:
            return TrainingConfig(path, error="pyyaml is not installed, so YAML cannot be read (pip install pyyaml)")
        try:
            # yaml.safe_load, with the document composed once: its key lines are read from the same nodes, before
            # they are constructed (the constructor flattens merge keys in place).
            loader = (yaml.CSafeLoader if c_yaml and getattr(yaml, "__with_libyaml__", False) else yaml.SafeLoader)(text)
            try:
                root = loader.get_single_node()
                lines = {} if root is None else _yaml_lines(text, root)
                data = loader.construct_document(root) if root is not None else None
            finally:
                loader.dispose()
        except yaml.MarkedYAMLError as e:
            mark = e.problem_mark or e.context_mark
            where = f" at line {mark.line + 1} column {mark.column + 1}" if mark is not None else ""
            return TrainingConfig(path, error=f"not valid YAML: {e.problem or e.context}{where}")
        except (yaml.YAMLError, RecursionError, ValueError) as e:
            return TrainingConfig(path, error=f"not valid YAML: {e}".splitlines()[0])
    if data is None:
        return TrainingConfig(path, error="empty file")
    if not isinstance(data, dict):
        return TrainingConfig(path, error=f"top level is a {type(data).__name__}, not a mapping of settings")
    return from_data(data, path, lambda key: _json_line(text, key) if is_json else lines.get(key))


def from_data(data: dict[str, Any], path: str, line_of: Callable[[str], int | None]) -> TrainingConfig:
    """The settings of a training config already parsed to a mapping (``line_of``: a dotted key's 1-based line, or
    None), with its misspelt keys (GD680/GD681/GD986). ``parse`` reads a file's text with it; the search builds its
    candidates' directly (``of_rendering``)."""
    fmt = trainers.recognise(data)
    kind = fmt.name
    if not fmt.trains:
        return TrainingConfig(path, kind=kind)  # no setting of it is a training run's
    settings: dict[str, Setting] = {}
    # LLaMA-Factory hands a string to its boolean fields unconverted (HfArgumentParser.parse_dict), where any non-empty
    # one is true: `bf16: "false"` trains in bf16 (0.9.5, run here). Its run is read as it runs (GD681 says so).
    as_python = frozenset(key_table(fmt.key_table)["booleans"]) if fmt.key_table == "llamafactory_keys" else frozenset()
    for name, keys in KEYS.items():
        for key in keys:
            found, value = _lookup(data, key)
            # DeepSpeed writes "bf16": {"enabled": ...}: the mapping itself is not the setting.
            if found and not isinstance(value, dict):
                try:
                    value = plain_value(value)
                except (_Unusable, RecursionError) as e:
                    return TrainingConfig(path, error=f"the value of {key} {e}; not a training config")
                if name in RUN_BOUNDS and (what := _beyond_any_run(name, value)) is not None:
                    return TrainingConfig(path, error=f"{key} is {what}, beyond any real run (at most "
                                                      f"{RUN_BOUNDS[name]:,}); not a training config")
                if key in as_python and isinstance(value, str):
                    value = bool(value)
                line = line_of(key)
                settings[name] = Setting(key, value, line)
                break
    problems = _key_problems(data, line_of, fmt.key_table) if fmt.key_table else ()
    return _config(data, path, fmt, settings, line_of, problems)


def _config(data: dict[str, Any], path: str, fmt: trainers.ConfigKind, settings: dict[str, Setting],
            line_of: Callable[[str], int | None], problems: tuple[KeyProblem, ...] = ()) -> TrainingConfig:
    """The training config of ``settings`` found in ``data`` (by ``from_data`` or ``of_rendering``): what both state
    beyond the keys found (the RL trainer a TRL config's own keys name), and the trainer ``fmt`` decides. One place, so
    what the reader adds to a user's file it adds to the search's candidates too."""
    if fmt.load_dtype_from_precision and "torch_dtype" not in settings:
        derived = _derived_load_dtype(settings)
        if derived is not None:
            settings["torch_dtype"] = derived
    named = trainers.rl_named_by_keys(data) if "rl" not in settings else None
    if named is not None:  # TRL's DPOConfig's or GRPOConfig's own keys, without rl / stage
        settings["rl"] = Setting(named[0], named[1], line_of(named[0]))
    rl = settings.get("rl")
    trainer = trainers.decide(fmt, data, rl.value if rl is not None else None)
    if trainer is not None and trainer.value is trainers.Trainer.AXOLOTL:
        settings.update(_bundled_deepspeed_settings(settings))
    return TrainingConfig(path, kind=fmt.name, settings=settings, problems=problems, trainer=trainer)


def _derived_load_dtype(settings: dict[str, Setting]) -> Setting | None:
    """The dtype axolotl loads a quantized model in where its config names none (``axolotl_load_dtype``), stated at
    the key it follows from. Quantized loading only: it is where a rule asks whether the dtype is named (GD705:
    transformers 4.x's float16 default), and axolotl always names it; an unquantized load is the Run's load dtype, the
    trainer's default (plan/runplan.trainer_defaults), not a key of the file. None where bf16 is `auto` (the GPU
    decides) or nothing is quantized."""
    quantized = [k for k in ("load_in_4bit", "load_in_8bit") if k in settings and truthy(settings[k].value)]
    derived = axolotl_load_dtype(settings) if quantized else None
    if derived is None:
        return None
    word, key = derived
    at = settings[key] if key is not None else settings.get("bf16") or settings.get("fp16") or settings[quantized[0]]
    return Setting(at.key, word, at.line)


def axolotl_load_dtype(settings: Mapping[str, Setting]) -> tuple[str, str | None] | None:
    """(dtype, the setting it follows from or None) axolotl passes from_pretrained as torch_dtype: resolve_dtype in
    normalize_config (axolotl 0.19.0 utils/config/__init__.py) sets bf16 -> bfloat16, else load_in_8bit or fp16 ->
    float16, else float32 (fp16 with bf16 `auto` turns auto off). None where bf16 is `auto` and fp16 is not on: the
    GPU decides (is_torch_bf16_gpu_available). An unset bf16 is `auto`: its schema's default, which validate_config
    fills in before normalize_config (both run here on 0.19.0: no switch loads torch.bfloat16 where the GPU has bf16,
    torch.float16 where not; float32 only with bf16 off)."""
    bf16, fp16, eight = settings.get("bf16"), settings.get("fp16"), settings.get("load_in_8bit")
    auto = bf16 is None or is_auto(bf16.value)
    if bf16 is not None and not auto and truthy(bf16.value):
        return "bfloat16", "bf16"
    if fp16 is not None and truthy(fp16.value):
        return "float16", "fp16"
    if auto:
        return None
    if eight is not None and truthy(eight.value):
        return "float16", "load_in_8bit"
    return "float32", None


def axolotl_on_mps(settings: Mapping[str, Setting]) -> tuple[str, str, str]:
    """(autocast, load dtype, why) of an axolotl config run on Apple MPS: axolotl 0.19.0's resolve_dtype
    (utils/config/__init__.py, in normalize_config), where choose_device picked "mps", turns bf16 off and fp16 on
    beside a bf16 that is on or `auto` (its schema's default; auto resolves either way on a Mac: on, then fp16; off,
    then fp16 where fp16 is unset), unless fp16 is written false; fp16 then loads the weights in float16, else float32
    (load_in_8bit is switched off there). Run here on the real modules with the device it picks on a Mac
    (tests/scripts/axolotl_precision.py)."""
    bf16, fp16 = settings.get("bf16"), settings.get("fp16")
    written_off = fp16 is not None and not truthy(fp16.value)
    bf16_on = bf16 is None or is_auto(bf16.value) or truthy(bf16.value)
    if fp16 is not None and truthy(fp16.value):
        return "fp16", "float16", f"{fp16.key}: true on MPS: fp16 with float16 weights"
    if bf16_on and not written_off:
        said = "bf16 unset (its schema's auto)" if bf16 is None else f"{bf16.key}: {bf16.value}"
        return "fp16", "float16", f"{said} turned into fp16 on MPS (bf16 off, fp16 on), float16 weights"
    why = f"{fp16.key}: false" if written_off else f"{bf16.key}: {bf16.value}" if bf16 is not None else "no switch"
    return "fp32", "float32", f"{why} on MPS: no mixed precision, float32 weights"


def _settings_of_key() -> dict[str, tuple[tuple[str, int], ...]]:
    """Dotted key -> (setting, rank) for every key of KEYS: the settings that key states, and how far down each
    setting's list of keys it stands (the lowest rank present wins, as in ``from_data``)."""
    out: dict[str, tuple[tuple[str, int], ...]] = {}
    for name, keys in KEYS.items():
        for rank, key in enumerate(keys):
            out[key] = out.get(key, ()) + ((name, rank),)
    return out


# Made once at import from KEYS (a constant, never changed): what of_rendering looks each key up in.
_SETTINGS_OF_KEY = _settings_of_key()
_KEY_DEPTH = max(key.count(".") + 1 for keys in KEYS.values() for key in keys)


def _dotted(data: Any, prefix: str, depth: int, found: dict[str, tuple[int, str, Any]]) -> None:
    """Every (dotted key, value) of ``data`` that ``_lookup`` finds, down to KEYS' deepest key, but for mappings
    (``from_data`` takes no mapping as a setting's value; a number is a list index, as in ``datasets.0.type``), into
    ``found``: setting -> (rank, key, value) of the lowest rank seen."""
    named = isinstance(data, dict)
    for k, v in (data.items() if named else enumerate(data)):
        if named and not (isinstance(k, str) and "." not in k):
            continue  # _lookup splits a key at its dots and compares strings: it never finds such a key
        dotted = prefix + k if named else f"{prefix}{k}"
        if isinstance(v, dict):
            if depth < _KEY_DEPTH:
                _dotted(v, dotted + ".", depth + 1, found)
            continue
        for name, rank in _SETTINGS_OF_KEY.get(dotted, ()):
            if name not in found or rank < found[name][0]:
                found[name] = (rank, dotted, v)
        if isinstance(v, list) and depth < _KEY_DEPTH and any(isinstance(x, dict) for x in v):
            _dotted(v, dotted + ".", depth + 1, found)


def of_rendering(data: dict[str, Any], path: str, kind: trainers.ConfigKind,
                 lines: dict[str, int]) -> TrainingConfig:
    """The training config `check --training-config` reads from a file gemma-doctor renders itself of ``kind`` (the
    prescription's axolotl YAML), built directly from the mapping it is rendered from and the line of each dotted key
    (recommend.training_config_data): each setting from the key ``from_data`` would take for it, with its value and
    line, the trainer ``kind`` decides. No recognising, bounds or key lint: the renderer writes plain values of a known
    kind and no misspelt key (the prescription grid checks the printed YAML with all three). Each key of the mapping
    is looked up once, where ``from_data`` walks every key of KEYS: the search builds one for every candidate it
    judges. tests/test_run_roundtrip.py proves it equal to the rendered YAML read back, and the Run planned from it
    equal to the one planned from the YAML."""
    found: dict[str, tuple[int, str, Any]] = {}
    _dotted(data, "", 1, found)
    settings = {name: Setting(found[name][1], found[name][2], lines.get(found[name][1])) for name in KEYS
                if name in found}
    return _config(data, path, kind, settings, lines.get)


def trainer_keys() -> dict[str, Any]:
    """trainer_keys.json (docs/gen_trainer_keys.py): the fields TRL's trainers accept in a config file, its booleans,
    and the TRL / transformers versions they were read from."""
    return key_table("trainer_keys")


@functools.lru_cache(maxsize=4)
def key_table(name: str) -> dict[str, Any]:
    """readers/<name>.json: the keys a trainer accepts in its config file, its booleans, and the release they were read
    from (trainer_keys: TRL's, docs/gen_trainer_keys.py; axolotl_keys: axolotl's schema, docs/gen_axolotl_keys.py;
    llamafactory_keys: LLaMA-Factory's argument classes, docs/gen_llamafactory_keys.py).
    Read once per process: it is package data."""
    return json.loads((Path(__file__).parent / f"{name}.json").read_text(encoding="utf-8"))


# How close an unknown key must be to a field to be taken for its misspelling (difflib's ratio):
# per_device_train_batch_sze is 0.98 from per_device_train_batch_size; a script's own keys (model_path, lr) are far.
MISSPELT_KEY_RATIO = 0.85
# The most keys of one config that no field has which are matched against the table (about a millisecond each): a
# config is some tens of keys; a 1 MiB file of a hundred thousand took minutes. Those past it are not judged.
MAX_KEYS_MATCHED = 1000
# transformers' string_to_bool (hf_argparser.py): what TRL's parser and HfArgumentParser read as a boolean.
_BOOLEAN_WORDS = frozenset({"yes", "no", "true", "false", "t", "f", "y", "n", "1", "0"})
# pydantic 2's bool parsing (axolotl 0.19.0's schema, run here): these words in any case, nothing stripped.
_PYDANTIC_BOOLEAN_WORDS = _BOOLEAN_WORDS | {"on", "off"}


def _not_boolean(value: Any, table_name: str, literals: tuple[str, ...]) -> bool:
    """Whether a string value of a boolean setting is one its trainer's parser refuses: TRL's string_to_bool (stripped,
    any case; `auto` left to GD605), or axolotl's pydantic (any case, unstripped; a `Literal[...] | bool` field's
    words exactly: bf16's "auto"); or, for LLaMA-Factory, which refuses none, one whose truth (any non-empty string)
    is not what it says."""
    if not isinstance(value, str):
        return False
    if table_name == "trainer_keys":
        return value.strip().lower() not in _BOOLEAN_WORDS and value.strip().lower() != "auto"
    if table_name == "llamafactory_keys":  # read as bool(value): wrong unless it says true
        return value.strip().lower() not in ("true", "yes", "y", "t", "1", "on")
    return value.lower() not in _PYDANTIC_BOOLEAN_WORDS and value not in literals


def _key_problems(data: dict[str, Any], line_of: Any, table_name: str = "trainer_keys") -> tuple[KeyProblem, ...]:
    """The unknown keys and the non-boolean values of boolean settings of a config, against its trainer's key table
    (trainer_keys.json, axolotl_keys.json).

    A key no field has is reported only when it is close to one (a misspelling): a config may carry a script's own
    keys, and keys of older releases that the table (read from one release) no longer lists. Keys gemma-doctor
    reads itself (KEYS) are never unknown, except where the table is axolotl's (its keys are all it reads). The first
    MAX_KEYS_MATCHED keys no field has are matched, no more (a file of 100,000 keys is no trainer's config)."""
    import difflib

    table = key_table(table_name)
    fields = frozenset(table["keys"])
    # axolotl's booleans are pydantic's, which refuses `bf16: ture` at start-up (a ValidationError, 0.19.0 run here);
    # a Literal["auto"] | bool field (bf16, tf32) takes its literal words too.
    literal_booleans: dict[str, list[str]] = table.get("literal_booleans", {})
    booleans = frozenset(table["booleans"]) | frozenset(literal_booleans)
    # LLaMA-Factory hands the YAML's values to its dataclasses as they are (HfArgumentParser.parse_dict): no string is
    # refused as a boolean there, but any non-empty one is true, so a string that does not say true is judged.
    # gemma-doctor's own keys of other formats (micro_batch_size in a TRL config) are no typo; axolotl's table is whole.
    own = {k.split(".", 1)[0] for keys in KEYS.values() for k in keys} if table_name == "trainer_keys" else set()
    out: list[KeyProblem] = []
    names = sorted(fields)
    matched = 0
    for key, value in data.items():
        if not isinstance(key, str):
            continue
        literals = tuple(literal_booleans.get(key, ()))
        if key in booleans and _not_boolean(value, table_name, literals):
            close = difflib.get_close_matches(value.strip().lower(), ["true", "false", *literals], n=1, cutoff=0.5)
            out.append(KeyProblem("not-boolean", key, value, line_of(key), close[0] if close else None))
        elif key not in fields and key not in own and matched < MAX_KEYS_MATCHED:
            matched += 1
            close = difflib.get_close_matches(key, names, n=1, cutoff=MISSPELT_KEY_RATIO)
            if close:
                out.append(KeyProblem("unknown-key", key, None, line_of(key), close[0]))
    return tuple(out)


def read(path: str, follow: bool = True) -> TrainingConfig:
    """Read the training config at ``path``; a file that cannot be used becomes a fact with ``error``.

    With ``follow``, a DeepSpeed JSON the config names adds its ZeRO stage and offload (one level, never further).

    Opened without blocking and checked to be a regular file first: a FIFO or device is refused, never waited on.
    """
    from gemma_doctor import fsafe

    try:
        raw = fsafe.read_user_file(path, MAX_BYTES)
    except fsafe.Refused as e:
        folder = str(e).startswith("is a folder")
        return TrainingConfig(path, error="is a folder, not a training config file" if folder else str(e))
    except (OSError, ValueError) as e:
        return TrainingConfig(path, error=f"cannot read: {getattr(e, 'strerror', None) or e}")
    if len(raw) > MAX_BYTES:
        return TrainingConfig(path, error=f"larger than {MAX_BYTES // (1024 * 1024)} MiB, not a training config (not read whole)")
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        return TrainingConfig(path, error=f"not UTF-8 text (byte 0x{raw[e.start]:02x} at offset {e.start})")
    if not text.strip():
        return TrainingConfig(path, error="empty file")
    yaml_first = Path(path).suffix.lower() in (".yaml", ".yml")
    tc = parse(text, path, yaml_first)
    return _with_deepspeed_file(tc) if follow else tc


# The settings a referenced DeepSpeed JSON adds: its ZeRO stage and offload targets, and its precision
# ("bf16": {"enabled": true}); "auto" copies TrainingArguments' own value, so it adds nothing.
_DEEPSPEED_FILE_SETTINGS = ("zero_stage", "offload_optimizer", "offload_param", "bf16", "fp16")
# The batch a referenced DeepSpeed JSON writes, kept beside the config's own (never in its place): the Trainer's
# integration fills an "auto" from TrainingArguments and refuses a number that differs (transformers >= 4.7.0,
# HfTrainerDeepSpeedConfig.fill_match; rules/distributed.py GD663), so the run's batch stays TrainingArguments'.
# {the name it is kept under: the name the JSON's own reading gives it}; "auto" is kept, to be said in a source.
DEEPSPEED_BATCH = {"deepspeed_batch_size": "batch_size", "deepspeed_accumulation": "gradient_accumulation_steps",
                   "deepspeed_train_batch_size": "train_batch_size"}


# The DeepSpeed JSONs axolotl ships in its repository's deepspeed_configs/ (what `axolotl fetch deepspeed_configs`
# downloads from main; read at 067b021, Jul 2026): the settings each adds, in _DEEPSPEED_FILE_SETTINGS' names. Their
# bf16 / fp16 are "auto" (copying TrainingArguments) but for the zero3_bf16* files' `bf16: {enabled: true}`; zero2.json
# offloads the optimizer to the CPU.
AXOLOTL_DEEPSPEED_FILES: dict[str, dict[str, Any]] = {
    "zero1.json": {"zero_stage": 1}, "zero1_torch_compile.json": {"zero_stage": 1},
    "zero2.json": {"zero_stage": 2, "offload_optimizer": "cpu"},
    "zero2_torch_compile.json": {"zero_stage": 2, "offload_optimizer": "cpu"},
    "zero3.json": {"zero_stage": 3}, "zero3_bf16.json": {"zero_stage": 3, "bf16": True},
    "zero3_bf16_cpuoffload_all.json": {"zero_stage": 3, "offload_optimizer": "cpu", "offload_param": "cpu", "bf16": True},
    "zero3_bf16_cpuoffload_params.json": {"zero_stage": 3, "offload_param": "cpu", "bf16": True},
}
# Where a bundled file's settings are said to come from (each setting's key names the file and its own key).
_BUNDLED = "axolotl's deepspeed_configs/"
_BUNDLED_KEYS = {"zero_stage": "zero_optimization.stage", "offload_optimizer": "zero_optimization.offload_optimizer.device",
                 "offload_param": "zero_optimization.offload_param.device", "bf16": "bf16.enabled"}


def _with_deepspeed_file(tc: TrainingConfig) -> TrainingConfig:
    """Add the ZeRO stage and offload of the DeepSpeed JSON a config names (TrainingArguments / TRL / axolotl /
    LLaMA-Factory `deepspeed: ds_z3.json`, accelerate's `deepspeed_config.deepspeed_config_file`) when the config
    itself does not state them. The path is tried as written (relative to the working folder, as the launchers read
    it), then next to the config, and the file found is read once (``_deepspeed_file``); it replaces what an axolotl
    config's bundled file of that name was taken to say (``_bundled_deepspeed_settings``). A path here that
    transformers would stop at (a folder, a FIFO, a dangling link, text that is not JSON) is a problem of the config
    (GD601, ``KeyProblem`` "deepspeed-file") beside its own settings, which stand and are planned; a file not here, or
    one that is JSON but no DeepSpeed config, adds nothing."""
    if not tc.ok:
        return tc
    ref = tc.get("deepspeed") or tc.get("deepspeed_config_file")
    if ref is None or not isinstance(ref.value, str):
        return tc
    problem, found, text = _deepspeed_file(ref.value, tc.path)
    if problem is not None:
        shown = _shown_path(ref.value.strip())
        kind = "deepspeed-unplanned" if problem == _DS_TOO_LARGE else "deepspeed-file"
        return replace(tc, problems=(*tc.problems, KeyProblem(kind, ref.key, shown, ref.line, None, problem)))
    if found is None or text is None or all(tc.get(name) is not None and _BUNDLED not in tc.get(name).key
                                            for name in (*_DEEPSPEED_FILE_SETTINGS, *DEEPSPEED_BATCH)):
        return tc
    ds = parse(text, found, yaml_first=False)
    if not ds.ok or not isinstance(ds.format, trainers.DeepSpeed):
        return tc
    written = Path(ref.value.strip())
    # The file on disk replaces what axolotl's bundled file of that name was taken to say.
    own = {name: v for name, v in tc.settings.items() if _BUNDLED not in v.key}
    added = {name: Setting(f"{ref.key} ({written.name}: {ds.settings[name].key})", ds.settings[name].value)
             for name in _DEEPSPEED_FILE_SETTINGS if name in ds.settings and name not in own
             and not is_auto(ds.settings[name].value)}
    added.update({name: Setting(f"{ref.key} ({written.name}: {ds.settings[own_name].key})", ds.settings[own_name].value)
                  for name, own_name in DEEPSPEED_BATCH.items() if own_name in ds.settings and name not in own})
    return replace(tc, settings={**own, **added}) if added or len(own) < len(tc.settings) else tc


# What transformers 5.23.0's TrainingArguments (accelerate 1.15.0's HfDeepSpeedConfig, which accelerate's own
# DeepSpeedPlugin uses too) does with a `deepspeed` path, run here with DeepSpeed 0.19.8 installed: a path that
# exists is opened and read with json.load (a folder: IsADirectoryError; a FIFO: open() waits for a writer; text that is not JSON:
# JSONDecodeError); one that does not (a missing file, a dangling link) is tried as JSON text, then base64 ("Expected a
# string path to an existing deepspeed config, ..."). Each stops the run before training starts.
_DS_SOURCE = "TrainingArguments stops at start-up"


# A `deepspeed:` file over MAX_BYTES: the run reads it whole and starts (a warning, KeyProblem "deepspeed-unplanned"),
# but what it says is not planned here.
_DS_TOO_LARGE = (f"is larger than {MAX_BYTES >> 20} MiB, which no DeepSpeed config is: not read here, so its ZeRO stage, "
                 "offload and batch are not planned")


def _deepspeed_file(value: str, config_path: str) -> tuple[str | None, str | None, str | None]:
    """(why the run stops, the JSON file found, its text) for the DeepSpeed config a `deepspeed:` setting names, each
    file read once: tried as written, then next to the config; the first that is a JSON file is the one (its path and
    text, no problem). A path that names no file here (inline JSON or base64, which transformers also reads, or a file
    the training machine may hold) is (None, None, None), and so is one that exists but this user cannot read or that
    is too large to be read whole: that is the file as named, not judged, and the other place is not tried. Where
    neither place holds a JSON file, the first place's problem (a folder, a FIFO, a dangling link, text that is not
    JSON) is why the run stops. Never opened blocking (fsafe: a FIFO is refused, not read)."""
    from gemma_doctor import fsafe

    text = value.strip()
    if not text or text.startswith(("{", "[")) or len(text) > 4096 or "\0" in text:
        return None, None, None
    written = Path(text)
    problems = []
    for candidate in (written, Path(config_path).parent / written):
        try:
            os.lstat(candidate)
        except (OSError, ValueError):
            continue  # not there (or a name no file system holds): nothing known here
        try:
            raw = fsafe.read_user_file(candidate, MAX_BYTES)
        except fsafe.Refused as e:
            folder = str(e).startswith("is a folder")
            problems.append(f"is a folder, not a DeepSpeed JSON file ({_DS_SOURCE}: IsADirectoryError)" if folder else
                            f"is not a regular file (a pipe, socket or device): {_DS_SOURCE} (it opens the path and "
                            "waits or fails)")
            continue
        except OSError as e:
            if isinstance(e, FileNotFoundError) and os.path.islink(candidate):
                target = _shown_path(os.readlink(candidate))
                problems.append(f"is a link to {target}, which does not exist ({_DS_SOURCE}: "
                                "\"Expected a string path to an existing deepspeed config\")")
                continue
            if e.errno == errno.ELOOP:  # os.path.exists is False there, as for a dangling link (accelerate 1.15.0)
                problems.append(f"is a link loop ({_DS_SOURCE}: \"Expected a string path to an existing deepspeed "
                                "config\")")
                continue
            if e.errno == errno.ENXIO:  # a socket: open() fails (accelerate 1.15.0's HfDeepSpeedConfig, run here)
                problems.append(f"is not a regular file (a pipe, socket or device): {_DS_SOURCE} (it opens the path "
                                "and waits or fails)")
                continue
            if isinstance(e, FileNotFoundError):
                continue  # gone since the lstat: nothing known here
            break  # unreadable to this user (the training machine's may read it): the file named, not judged
        if len(raw) > MAX_BYTES:
            # The run reads it whole (json.load: a 2 MiB one ran, ZeRO stage and all); no DeepSpeed config is near this
            # size, and what it says is not planned: say so, rather than plan the run without its stage in silence.
            return _DS_TOO_LARGE, None, None
        try:
            decoded = raw.decode("utf-8")
            top = json.loads(decoded)
        except (UnicodeDecodeError, ValueError, RecursionError) as e:
            why = "not UTF-8" if isinstance(e, UnicodeDecodeError) else (
                f"{e.msg} at line {e.lineno}" if isinstance(e, json.JSONDecodeError) else "not JSON")
            problems.append(f"is not a JSON file ({why}): {_DS_SOURCE} (json.load: JSONDecodeError)")
            continue
        if not isinstance(top, dict):
            # HfDeepSpeedConfig looks its ZeRO stage up with .get on the top level (accelerate 1.15.0, run here).
            kind = {list: "an array", str: "a string", bool: "a boolean", type(None): "null"}.get(type(top), "a number")
            problems.append(f"is JSON but {kind}, not an object of DeepSpeed settings: {_DS_SOURCE} "
                            f"(HfDeepSpeedConfig: AttributeError: '{type(top).__name__}' object has no attribute 'get')")
            continue
        return None, str(candidate), decoded
    else:
        return (problems[0] if problems else None), None, None
    return None, None, None


def _shown_path(text: str) -> str:
    return text if text.isprintable() and len(text) <= 200 else repr(text[:200])


def _bundled_deepspeed_settings(settings: Mapping[str, Setting]) -> dict[str, Setting]:
    """The settings an axolotl config's `deepspeed` adds where it names one of axolotl's own deepspeed_configs/ files
    (`deepspeed_configs/zero3_bf16.json`), by the name: the training machine fetches that file (`axolotl fetch
    deepspeed_configs`), the checking one seldom has it. Read wherever the config is (a user's file, the prescription's
    YAML); a file of that path on disk here replaces them (``_with_deepspeed_file``)."""
    ref = settings.get("deepspeed")
    if ref is None or not isinstance(ref.value, str):
        return {}
    written = Path(ref.value.strip())
    bundled = AXOLOTL_DEEPSPEED_FILES.get(written.name)
    if bundled is None or written.parent.name not in ("deepspeed_configs", ""):
        return {}
    return {name: Setting(f"{ref.key} ({_BUNDLED}{written.name}: {_BUNDLED_KEYS[name]})", value, ref.line)
            for name, value in bundled.items() if name not in settings}


def raw_mapping(path: str) -> dict[str, Any]:
    """A config file's own mapping of keys, for what reads more of it than its settings (the rehearsal's twin run,
    accelerate's plugin on the CPU ranks): read as ``read`` reads the file (never blocking, at most MAX_BYTES) and
    made plain data within the same bounds (YAML aliases share nodes: a key no setting reads can still name billions
    of items, which a str() or a dump expands). ValueError with the one-line reason where it cannot."""
    import yaml

    from gemma_doctor import fsafe

    try:
        text = fsafe.read_user_file(path, MAX_BYTES)[:MAX_BYTES].decode("utf-8-sig")
        is_json = not path.endswith((".yaml", ".yml")) and text.lstrip().startswith("{")
        if not is_json and len(text) > MAX_YAML_BYTES:
            raise ValueError(_yaml_too_large(len(text)))
        data = json.loads(text) if is_json else yaml.safe_load(text)
        data = plain_value(data)
    except (fsafe.Refused, OSError, UnicodeDecodeError) as e:
        raise ValueError(f"cannot read: {getattr(e, 'strerror', None) or e}") from None
    except (ValueError, RecursionError, yaml.YAMLError) as e:
        raise ValueError(" ".join(str(e).split())[:200]) from None
    if not isinstance(data, dict):
        raise ValueError("not a mapping of settings")
    return data


def _is_file(path: Path) -> bool:
    """Whether ``path`` is a regular file; a name no file system holds (too long: ENAMETOOLONG, which Path.is_file
    raises) or a folder that cannot be entered names none."""
    try:
        return path.is_file()
    except (OSError, ValueError):
        return False


def load(path: str) -> TrainingConfig:
    """Read --training-config once per run; a path that does not exist is a usage error, anything else a fact."""
    if not os.path.lexists(path):
        raise UsageError(f"training config {path} does not exist")
    tc = read(path)
    if tc.kind in NOT_TRAINING:
        raise UsageError(f"--training-config {path}: {NOT_TRAINING[tc.kind]}")
    return tc


def is_auto(value: Any) -> bool:
    """A setting written "auto" (any case, spaces around): left to what reads it (DeepSpeed copies TrainingArguments'
    value, axolotl's bf16 asks the GPU)."""
    return isinstance(value, str) and value.strip().lower() == "auto"


def truthy(value: Any) -> bool:
    """A setting that turns a feature on: true, "true", "yes", 1 (how YAML/JSON/CLI configs spell it).

    Only 1 among numbers: LLaMA-Factory's quantization_bit (read as load_in_4bit) is 4 or 8, not a switch.
    """
    if isinstance(value, str):
        return value.strip().lower() in ("true", "yes", "1", "on")
    return value == 1  # True == 1; False, 0, 2, None, lists and mappings are not 1
