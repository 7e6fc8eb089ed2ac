"""The run that will execute, as one frozen, typed value: what is trained, on what, and how, each field with its source.

The run's settings are one value, ``Settings`` (method, precision, load dtype, batch, accumulation, sequence,
checkpointing, LoRA, quantization, GPUs, sharding, offload, evaluation, attention, loss, task; each with its source),
resolved before anything is computed from them (plan/runplan.request_spec: the options, the training config, the
defaults, then the search for what the user left open). The memory plan is computed from them
(``plan.memory.plan(shape, settings, ...)``), and the Run keeps those very settings (``Run.settings``) beside the
plan's figures (``Memory``): its method, batch, precision ... are read from them, never copied. ``resolve`` builds
the Run once from the memory plan, the model's shape (LoRA targets resolved against its module names), the GPU
(parsed once, by readers/gpu.py), the stack (each version with its source; a prescription's pins are part of it) and
the trainer that reads the config.
The prescription is a Run (``Decision.run``); its JSON view is ``prescription.run``. check's own run (the one the user
asked about: options, training config, launch line, stack, GPU) is a Run too, resolved the same way from the memory plan
check made of it, with the trainer the readers decided (``trainer_of``); it is ``ModelFacts.run``, the one value the
rules read the run from (its memory verdict and figures included: ``Memory``), and its JSON view is each model's ``run``.
Beside the resolved settings the Run keeps the settings as the training config writes them (``Written``: the precision
switches, tf32, the backend as named, packing, evaluation, LoRA's targets and modules_to_save), read once by
``written`` from the config the plan was made from, for the findings that judge the file's own words.

Pure: no files, no torch; imports nothing of plan/ or above (docs/architecture.md, "Layers"): the plan's objects it is
resolved from are read by their fields.
"""

from __future__ import annotations

import enum
import math
import re
from dataclasses import dataclass
from typing import Any, Generic, Mapping, TypeVar

from gemma_doctor.readers.training_config import truthy
from gemma_doctor.trainers import Trainer

T = TypeVar("T")
# The source of a GPU count no input states: the GPUs the probe sees (runplan's), which a launcher would run as DDP and
# a plain `python train.py` as one process (the Trainer's DataParallel).
GPUS_VISIBLE = "GPUs visible"
# The source of a setting a training config sets: "training config KEY", the key as the file writes it (runplan's).
FROM_CONFIG = "training config "


class Method(str, enum.Enum):
    """How the weights train."""

    FULL = "full"
    LORA = "lora"
    QLORA = "qlora"


@dataclass(frozen=True)
class Sourced(Generic[T]):
    """A value and where it came from: "option", "training config KEY", "default", "chosen by the search",
    "relaxed from --batch-size 4", "prescription", "installed", "--with"..."""

    value: T
    source: str

    @property
    def config_key(self) -> str | None:
        """The training-config key the value was read from, as the file writes it (the source "training config
        micro_batch_size", plan/runplan.run_request's), None where no key of a training config set it (an option, a
        trainer's default, the search)."""
        if not self.source.startswith(FROM_CONFIG):
            return None
        key = self.source[len(FROM_CONFIG):].split(" (", 1)[0].strip()  # "deepspeed (stage read from the file name)"
        return key if key and not key.startswith("(") else None

    def to_json(self) -> dict[str, Any]:
        """``{"value": ..., "source": ...}``."""
        value = self.value.value if isinstance(self.value, enum.Enum) else self.value
        return {"value": list(value) if isinstance(value, tuple) else value, "source": self.source}


# Defaults where neither the options nor the training config say: TRL SFTConfig's max_length and the
# TrainingArguments defaults (per_device_train_batch_size 8, optim adamw_torch_fused), PEFT LoRA as the
# recommendation's snippet writes it (r=16, all linear layers).
DEFAULT_SEQ_LEN = 1024
DEFAULT_BATCH = 8
DEFAULT_OPTIMIZER = "adamw_torch_fused"
DEFAULT_LORA_R = 16
DEFAULT_LORA_TARGETS = "all-linear"


@dataclass(frozen=True)
class Generation:
    """What a GRPO step generates before it trains, as TRL 1.16's GRPOConfig writes it (its defaults where the config
    says nothing): the memory plan's generation moment (plan/memory.py) and the reference model.

    TRL's GRPOTrainer generates the whole generation batch of a process in one ``generate()`` call: generation_batch_size
    / processes rows, by default per_device_train_batch_size x steps_per_generation, and steps_per_generation defaults
    to gradient_accumulation_steps (GRPOConfig.__post_init__; measured: 4 x 3 accumulation -> one call of 12 rows)."""

    completion: int = 512  # max_completion_length (GRPOConfig's default 512)
    steps: int | None = None  # steps_per_generation; None: the gradient accumulation (GRPOConfig's default)
    batch: int | None = None  # generation_batch_size (every process's rows together), where the config writes one
    engine: str = "transformers"  # transformers (generate() in the training process) | vllm-colocate | vllm-server
    share: float = 0.3  # vllm_gpu_memory_utilization: the GPU memory a colocated vLLM engine takes (default 0.3)
    sleep: bool = False  # vllm_enable_sleep_mode: the colocated engine releases its memory outside generation
    beta: float = 0.0  # the KL coefficient: above 0 a full fine-tuning loads a frozen reference model (default 0.0)
    groups: int = 8  # num_generations: the completions of one prompt (GRPOConfig's default 8)

    def rows(self, batch_size: int, accumulation: int, processes: int) -> int:
        """The sequences one generate() call of one process holds."""
        if self.batch is not None:
            return max(1, self.batch // max(1, processes))
        return max(1, batch_size * (self.steps if self.steps is not None else max(1, accumulation)))

    def indivisible(self, batch_size: int, accumulation: int, processes: int) -> str | None:
        """Why TRL 1.16's GRPOConfig.__post_init__ refuses this generation batch (a ValueError before the first step),
        or None: generation_batch_size must be a multiple of the global batch (per-device batch x processes) and of
        num_generations (every prompt's group whole)."""
        world = max(1, batch_size) * max(1, processes)
        if self.batch is not None and self.steps is not None:
            return "generation_batch_size and steps_per_generation can not be both configured at the same time"
        if self.batch is not None and self.batch % world:
            return f"generation_batch_size ({self.batch}) must be divisible by the global batch size ({world})"
        total = self.batch if self.batch is not None else world * (self.steps if self.steps is not None
                                                                     else max(1, accumulation))
        if total % self.groups:
            return f"generation_batch_size ({total}) must be divisible by num_generations ({self.groups})"
        if self.groups < 2:
            return f"GRPO requires at least 2 generations per prompt (num_generations {self.groups})"
        return None

    def whole_batch(self, batch_size: int, accumulation: int, processes: int) -> int | None:
        """The smallest per-process batch (per-device batch x accumulation) from this one up whose generation batch
        holds whole groups of num_generations, where that alone decides (neither generation_batch_size nor
        steps_per_generation written, num_generations >= 2): the ``--batch-size`` that cures indivisible()'s refusal.
        None where the batch is not the cause."""
        if self.batch is not None or self.steps is not None or self.groups < 2:
            return None
        n, per = max(1, processes), max(1, batch_size) * max(1, accumulation)
        step = self.groups // math.gcd(self.groups, n)  # per-process batches whose n-fold is a multiple of groups
        return -(-per // step) * step

    def to_json(self) -> dict[str, Any]:
        """The `run.generation` block of a memory plan."""
        return {"max_completion_length": self.completion, "steps_per_generation": self.steps,
                "generation_batch_size": self.batch, "engine": self.engine,
                "vllm_gpu_memory_utilization": self.share if self.engine == "vllm-colocate" else None,
                "vllm_enable_sleep_mode": self.sleep if self.engine == "vllm-colocate" else None, "beta": self.beta,
                "num_generations": self.groups}


@dataclass(frozen=True)
class Settings:
    """The run's settings, resolved once before anything is computed from them (plan/runplan.request_spec: the
    options, the training config, the launch line, the trainer's defaults, the task; the search then fills in what the
    user left open): the memory plan's one input (``plan.memory.plan(shape, settings, ...)``), kept whole by the Run
    (``Run.settings``), which states each as a ``Sourced`` (``sourced``). Each value has its source in ``sources``
    ("option", "training config KEY", "default of ...", "chosen by the search", ...; "default" where none is named):
    one table beside plain values, because the plan's arithmetic reads the values and the search varies them
    (``frozen.replace(settings, batch_size=b, ...)``), and the sources are relabelled as a whole where the search
    chose (``plan.memory.with_sources``)."""

    method: str = "full"  # full | lora | qlora
    precision: str = "bf16"  # bf16 | fp16 | fp32: the mixed precision (autocast) of the run
    load_dtype: str = "bfloat16"  # the dtype the weights are loaded in
    optimizer: str = DEFAULT_OPTIMIZER
    batch_size: int = DEFAULT_BATCH
    seq_len: int = DEFAULT_SEQ_LEN
    gradient_checkpointing: bool = False
    gradient_accumulation_steps: int = 1
    lora_r: int = DEFAULT_LORA_R
    lora_targets: str | tuple[str, ...] = DEFAULT_LORA_TARGETS
    quant_bits: int | None = None  # 4 | 8 for QLoRA
    num_gpus: int = 1
    zero_stage: int = 0  # 0 (DDP) | 1 | 2 | 3; FSDP FULL_SHARD = 3, SHARD_GRAD_OP = 2
    fsdp: bool = False  # the stage is FSDP's (parameters sharded at rest at stage 2 too), not DeepSpeed's
    num_nodes: int = 1  # machines the GPUs are spread over (accelerate num_machines), for the assumptions
    offload_optimizer: bool = False
    offload_params: bool = False
    # Evaluation (transformers' Trainer.evaluation_loop): the per-device eval batch where the config writes one (None:
    # no evaluation moment planned), whether predictions are kept (prediction_loss_only written false), and
    # eval_accumulation_steps (kept predictions move to the CPU every that many batches; None: at the end).
    eval_batch: int | None = None
    keeps_predictions: bool = False
    eval_accumulation: int | None = None
    device: str = "cuda"  # cuda | cpu: what the overhead is
    attention: str = "sdpa"  # sdpa | eager | flash_attention_2
    chunked_loss: bool = False  # the trainer computes log-probs in tiles (TRL >= 1.15 SFT): no b*s*V logits held
    # Liger's fused DPO loss (axolotl's dpo_use_liger_kernel, TRL 1.9.0's DPOTrainer): the logits of one chosen/rejected
    # pair at a time, never the whole batch's (plan/memory.LIGER_DPO_PAIRS)
    liger_dpo_loss: bool = False
    task: str = "sft"
    text_only: bool = True
    generation: Generation | None = None  # a GRPO step's generation (None: the task generates nothing)
    # Where each setting came from ("option", "training config", "recommended", "default"), for the assumptions.
    sources: tuple[tuple[str, str], ...] = ()

    def source(self, name: str) -> str:
        """Where the setting ``name`` came from (the last entry naming it, as a dict of ``sources`` would keep)."""
        for key, source in reversed(self.sources):  # no dict made per question: a view asks six a model
            if key == name:
                return source
        return "default"

    def sourced(self, name: str) -> Sourced[Any]:
        """The setting ``name`` (a field) with its source."""
        return Sourced(getattr(self, name), self.source(name))

    def deepspeed_cast(self) -> str | None:
        """The 16-bit dtype DeepSpeed's engine casts the parameters to (ZeRO in bf16/fp16, full or LoRA, not FSDP),
        whatever the load dtype, keeping fp32 master copies of its partition; None where the weights stay as loaded."""
        if self.zero_stage >= 1 and not self.fsdp and self.precision != "fp32" and self.method in ("full", "lora"):
            return "float16" if self.precision == "fp16" else "bfloat16"
        return None

    def to_json(self) -> dict[str, Any]:
        """The `run` block of a memory plan."""
        return {"method": self.method, "precision": self.precision, "load_dtype": self.load_dtype,
                "optimizer": self.optimizer, "batch_size": self.batch_size, "seq_len": self.seq_len,
                "gradient_checkpointing": self.gradient_checkpointing,
                "gradient_accumulation_steps": self.gradient_accumulation_steps,
                "lora_r": self.lora_r if self.method != "full" else None,
                "lora_targets": (list(self.lora_targets) if isinstance(self.lora_targets, tuple) else self.lora_targets)
                if self.method != "full" else None,
                "quant_bits": self.quant_bits, "num_gpus": self.num_gpus, "zero_stage": self.zero_stage,
                "offload_optimizer": self.offload_optimizer, "offload_params": self.offload_params,
                "eval_batch": self.eval_batch, "keeps_predictions": self.keeps_predictions,
                "eval_accumulation": self.eval_accumulation, "attention": self.attention, "task": self.task,
                "chunked_loss": self.chunked_loss, "liger_dpo_loss": self.liger_dpo_loss,
                "generation": self.generation.to_json() if self.generation is not None else None,
                "sources": dict(self.sources)}


@dataclass(frozen=True)
class Hardware:
    """The GPUs the run uses: the kind (as parsed once from --gpu or the probe), its memory, how many, on how many
    machines."""

    gpu: str | None  # None: no GPU (CPU training, or not named)
    memory_bytes: int | None
    count: Sourced[int]
    nodes: Sourced[int]

    def to_json(self) -> dict[str, Any]:
        """JSON view."""
        return {"gpu": self.gpu, "memory_bytes": self.memory_bytes, "count": self.count.to_json(),
                "nodes": self.nodes.to_json()}


class Engine(str, enum.Enum):
    """What runs the processes together: nothing (one process), DDP, FSDP (version 1 or 2) or DeepSpeed."""

    NONE = "none"
    DDP = "ddp"
    FSDP1 = "fsdp1"
    FSDP2 = "fsdp2"
    DEEPSPEED = "deepspeed"

    @property
    def fsdp(self) -> bool:
        """FSDP, either version."""
        return self in (Engine.FSDP1, Engine.FSDP2)


@dataclass(frozen=True)
class WrapClass:
    """One class of an FSDP wrap list as written, and whether the model's modeling code has it (None: the class table
    holds no classes of this model_type, so nothing to compare with)."""

    name: str
    in_model: bool | None

    def to_json(self) -> dict[str, Any]:
        """JSON view."""
        return {"name": self.name, "in_model": self.in_model}


class AutoWrap(str, enum.Enum):
    """FSDP's auto-wrap policy: by transformer layer class, by parameter count, or none (accelerate's words, lower
    case)."""

    TRANSFORMER = "transformer_based_wrap"
    SIZE = "size_based_wrap"
    NONE = "no_wrap"


@dataclass(frozen=True)
class Distributed:
    """How the processes run together, each field with its source: the engine; DeepSpeed's own ZeRO stage (None
    unless the engine is DeepSpeed; FSDP's sharding is not a ZeRO stage here, whatever the memory plan counts it as);
    what is offloaded and where ("cpu" / "nvme"); the FSDP wrap classes as written, each checked against the model's
    classes (None unless the engine is FSDP and a list is written); the processes per node; FSDP's auto-wrap policy
    (None unless the engine is FSDP; a word accelerate does not know is kept as written) and whether the config states
    it or leaves it to the default of what sets FSDP up (GD660); whether the config states FSDP's version or leaves it
    to that default (GD662)."""

    engine: Sourced[Engine]
    zero_stage: Sourced[int] | None
    offload_optimizer: Sourced[str] | None
    offload_params: Sourced[str] | None
    wrap_classes: Sourced[tuple[WrapClass, ...]] | None
    processes_per_node: Sourced[int]
    auto_wrap: Sourced[AutoWrap | str] | None = None
    auto_wrap_stated: bool = False
    version_stated: bool = False

    def to_json(self) -> dict[str, Any]:
        """JSON view: each field as {value, source}, null where it does not apply; the two `stated` flags null unless
        the engine is FSDP."""
        def j(x: Sourced[Any] | None) -> dict[str, Any] | None:
            return x.to_json() if x is not None else None

        wraps = None if self.wrap_classes is None else {
            "value": [w.to_json() for w in self.wrap_classes.value], "source": self.wrap_classes.source}
        fsdp = self.engine.value.fsdp
        return {"engine": self.engine.to_json(), "zero_stage": j(self.zero_stage),
                "offload_optimizer": j(self.offload_optimizer), "offload_params": j(self.offload_params),
                "wrap_classes": wraps, "processes_per_node": self.processes_per_node.to_json(),
                "auto_wrap": j(self.auto_wrap), "auto_wrap_stated": self.auto_wrap_stated if fsdp else None,
                "fsdp_version_stated": self.version_stated if fsdp else None}


@dataclass(frozen=True)
class Lora:
    """LoRA's rank and targets ("all-linear", a regex over module names, or a list of names), and the trainable
    parameters they come to on this model's real modules."""

    r: int
    targets: str | tuple[str, ...]
    trainable: int
    targets_source: str = "default"  # where the targets came from (the rank may come from elsewhere)

    def to_json(self) -> dict[str, Any]:
        """JSON view."""
        return {"r": self.r, "targets": list(self.targets) if isinstance(self.targets, tuple) else self.targets,
                "trainable_params": self.trainable}


@dataclass(frozen=True)
class Alternative:
    """A run the memory search weighed for this run's GPU (plan.memory.Choice, as the rules judge it): whether it
    fits, its plan's line, and where nothing fits the smallest common GPU where one does, or why not."""

    fits: bool
    summary: str | None  # its plan's line (None: no plan, no GPU memory known)
    smallest_gpu: str | None
    smallest_gpu_summary: str | None  # the plan's line on smallest_gpu
    reason: str
    checkpointing: bool | None = None  # whether its plan checkpoints gradients (None: no plan)
    batch: int | None = None  # its plan's batch per device (None: no plan)
    accumulation: int | None = None  # its plan's gradient accumulation steps (None: no plan)

    @classmethod
    def of(cls, choice: Any) -> Alternative:
        """The figures of a plan.memory.Choice."""
        small, plan = choice.smallest_gpu_plan, choice.plan
        return cls(choice.fits, plan.summary() if plan is not None else None, choice.smallest_gpu,
                   small.summary() if small is not None else None, choice.reason,
                   plan.settings.gradient_checkpointing if plan is not None else None,
                   plan.settings.batch_size if plan is not None else None,
                   plan.settings.gradient_accumulation_steps if plan is not None else None)


@dataclass(frozen=True)
class Memory:
    """The memory plan of the run against its GPU: the verdict and the figures every view states and the rules
    judge (GD80x, GD650), taken once from the plan (plan.runplan.MemoryFacts) so no rule reaches into plan/."""

    summary: str  # "LoRA r=16, bf16, batch 8 x 1024 tokens: 13.2 GiB of 15.0 GiB (T4): fits"
    verdict: str  # fits | tight | does-not-fit | unknown
    per_gpu_bytes: int
    gpu_bytes: int | None
    gpu_name: str | None
    components: tuple[tuple[str, int], ...]  # bytes per GPU by component, in the plan's order
    fixed: tuple[str, ...]  # what the user fixed of method, batch_size, gradient_checkpointing (the search kept them)
    choice: Alternative  # the search for this GPU with those fixed
    unconstrained: Alternative | None  # the search with nothing fixed, where the fixed run does not fit
    trainable: int  # the parameters that train (every one, or LoRA's on the targets resolved against the model)


@dataclass(frozen=True)
class Shape:
    """What the memory plan counted of the model (plan.memory.ModelShape), as the rules read it."""

    vocab: int
    final_logit_softcapping: float | None
    towers: int  # vision / audio tower parameters
    linear_names: tuple[str, ...]  # the kinds of linear layer (q_proj, ...), sorted: what LoRA targets must match


# What a training config calls each attention backend -> transformers' attn_implementation (None: `auto`, the
# trainer's own choice). A name that is none of these (a kernels-hub repo) is kept as written.
BACKENDS = {"eager": "eager", "disabled": "eager", "sdpa": "sdpa", "sdp": "sdpa",
            "flash_attention_2": "flash_attention_2", "fa2": "flash_attention_2", "flash_attention_3": "flash_attention_3",
            "fa3": "flash_attention_3", "flex_attention": "flex_attention", "flex": "flex_attention", "auto": None}
# The precision switches' words that turn them off (accelerate's mixed_precision `no`, a config's `fp32`).
_SWITCH_OFF = ("no", "fp32", "none", "false")


@dataclass(frozen=True)
class Switches:
    """The precision switches (bf16, fp16, accelerate's mixed_precision) as the run's inputs write them: what the
    Run's one precision cannot keep. Two autocasts on at once is a run transformers refuses to start (GD604), `auto`
    leaves the choice to the machine (GD605, GD303), and switches that are all off say fp32 in the file's own words
    (GD302, GD609). Each entry's value is an autocast (``on``) or a setting's name (the rest), its source the key."""

    on: tuple[Sourced[str], ...] = ()  # bf16 | fp16, each switch that turns one on (bf16 before mixed_precision)
    auto: tuple[Sourced[str], ...] = ()  # the settings written `auto`
    off: tuple[Sourced[str], ...] = ()  # the settings written off (false, no, fp32...)
    other: tuple[Sourced[str], ...] = ()  # a mixed_precision that is neither (fp8...): not fp32 by the switches

    @property
    def stated(self) -> bool:
        """Some switch is written, whatever its value."""
        return bool(self.on or self.auto or self.off or self.other)

    @property
    def explicit(self) -> bool:
        """The switches set the precision to a value: written, and none says `auto` (nothing asks the machine)."""
        return self.stated and not self.auto

    @property
    def conflict(self) -> bool:
        """Both fp16 and bf16 are turned on (GD604)."""
        return {s.value for s in self.on} >= {"bf16", "fp16"}

    @property
    def fp32(self) -> bool:
        """The switches are set, to off every one: the file says fp32 (a trainer's own default may still differ)."""
        return self.explicit and not self.on and not self.other

    def setting(self, autocast: str) -> str | None:
        """The setting (bf16 | fp16 | mixed_precision) that turns ``autocast`` on, None where none does."""
        found = next((s for s in self.on if s.value == autocast), None)
        if found is None:
            return None
        return "mixed_precision" if found.config_key == "mixed_precision" else autocast

    def is_auto(self, name: str) -> bool:
        """``name`` (bf16 | fp16 | mixed_precision) is written `auto`."""
        return any(s.value == name for s in self.auto)


@dataclass(frozen=True)
class LoraWritten:
    """LoRA as the training config writes it, beside the Run's resolved targets: the findings that name the file's own
    words (GD420/GD421's PEFT default where none is written, GD44x's tower projections) judge these."""

    enabled: bool = False  # the config trains adapters (TRL use_peft, axolotl adapter, finetuning_type; else targets/r)
    targets: Sourced[str | tuple[str, ...]] | None = None  # a list of names, or one string (regex, all-linear)
    all_linear: Sourced[bool] | None = None  # axolotl's lora_target_linear, where written
    modules_to_save: Sourced[tuple[str, ...]] | None = None  # PEFT modules_to_save, axolotl lora_modules_to_save...
    quant_bits: Sourced[int] | None = None  # the bitsandbytes loading written (4: load_in_4bit, adapter qlora; 8)

    @property
    def given(self) -> bool:
        """Targets are written (a list, a string, or lora_target_linear: true)."""
        return self.targets is not None or (self.all_linear is not None and self.all_linear.value)


@dataclass(frozen=True)
class Written:
    """The run's settings as its training config writes them, where the findings judge the file's own words rather
    than the resolved value: the precision switches and tf32, the attention backend as named (axolotl's switches, fa3,
    a kernels-hub name), packing, the evaluation batch and whether predictions are kept, LoRA's targets and
    modules_to_save. Empty where no training config is read. Resolved once (``written``) from the config."""

    switches: Switches = Switches()
    tf32: Sourced[bool | str] | None = None  # TrainingArguments / axolotl tf32 where written: true, false or "auto"
    attention: Sourced[str] | None = None  # the backend as named (the word, lower case; a switch: its backend), its key
    packing: Sourced[str] | None = None  # the setting that packs sequences (packing | padding_free), where one is on
    eval_batch: Sourced[int] | None = None  # per_device_eval_batch_size / eval_batch_size, where written
    keeps_predictions: Sourced[bool] | None = None  # False: prediction_loss_only; True: written false
    eval_accumulation: Sourced[int] | None = None  # eval_accumulation_steps: predictions moved off the GPU every N
    lora: LoraWritten = LoraWritten()

    @property
    def backend(self) -> str | None:
        """The backend the written attention names, in transformers' words (fa2 -> flash_attention_2; a kernels-hub
        name as written); None where none is named or it is `auto`."""
        return BACKENDS.get(self.attention.value, self.attention.value) if self.attention is not None else None

    @property
    def attention_setting(self) -> str | None:
        """The setting that names the backend: attn_implementation (TRL, TrainingArguments, LLaMA-Factory's flash_attn)
        or one of axolotl's switches (flash_attention, flex_attention, sdp_attention)."""
        if self.attention is None:
            return None
        key = self.attention.config_key
        return key if key in ("flash_attention", "flex_attention", "sdp_attention") else "attn_implementation"


def _switches(tc: Any) -> Switches:
    groups: dict[str, list[Sourced[str]]] = {"on": [], "auto": [], "off": [], "other": []}
    for name in ("fp16", "bf16", "mixed_precision"):
        setting = tc.get(name)
        if setting is None:
            continue
        v, src = setting.value, FROM_CONFIG + setting.key
        text = v.strip().lower() if isinstance(v, str) else None
        if text == "auto":
            groups["auto"].append(Sourced(name, src))
        elif name != "mixed_precision":
            groups["on" if truthy(v) else "off"].append(Sourced(name, src))
        elif str(v).strip().lower() in ("bf16", "fp16"):
            groups["on"].append(Sourced(str(v).strip().lower(), src))
        else:
            groups["off" if str(v).strip().lower() in _SWITCH_OFF else "other"].append(Sourced(name, src))
    return Switches(**{k: tuple(v) for k, v in groups.items()})


def _attention_written(tc: Any) -> Sourced[str] | None:
    setting = tc.get("attn_implementation")
    if setting is not None and isinstance(setting.value, str) and setting.value.strip():
        return Sourced(setting.value.strip().lower(), FROM_CONFIG + setting.key)
    for name, backend in (("flash_attention", "flash_attention_2"), ("flex_attention", "flex_attention"),
                          ("sdp_attention", "sdpa")):
        s = tc.get(name)
        if s is not None and truthy(s.value):  # axolotl's schema reads "true" as true (a pydantic bool)
            return Sourced(backend, FROM_CONFIG + s.key)
    return None


def _targets_written(value: Any) -> str | tuple[str, ...] | None:
    """LoRA target modules as written: a list of names, one string (a regex, "all-linear", or LLaMA-Factory's
    comma-separated names, which become a list), or None."""
    if isinstance(value, list):
        return tuple(str(v) for v in value)
    if isinstance(value, str):
        text = value.strip()
        if "," in text and not any(ch in text for ch in "()[]*|\\"):
            return tuple(part.strip() for part in text.split(",") if part.strip())
        return text
    return None


# A LoRA target regex is matched with re.fullmatch against every module name (PEFT does the same), and Python's
# backtracking has no time limit: a repeated group that itself repeats or alternates (`(a+)+$`, `(.*)*x`) is
# exponential in the name's length, and each unbounded repetition past a few adds a power (`.*` six times: a second a
# name). Refused before it is run (GD425 says why): reproduced, `(.*)*Z` took 10 s on 24 characters of a module name.
MAX_TARGET_REPEATS = 4
MAX_TARGET_REGEX = 4096


_COUNT = re.compile(r"\{(\d*,?\d*)\}")  # a counted repetition: {m}, {m,}, {,n}, {m,n}


def _shortened(text: str) -> str:
    return text if len(text) <= 80 else text[:77] + "..."


def _repeats_a_repetition(pattern: str) -> str | None:
    """Why ``pattern`` may backtrack exponentially on a module name (a group repeated by `*`, `+`, `{m,}` or `{m,n}` whose
    body repeats or alternates, or more than MAX_TARGET_REPEATS unbounded repetitions), None where it cannot. A scan
    of the text (escapes and character classes skipped), not a proof: a regex it names may still be linear."""
    groups: list[tuple[int, bool]] = []  # each open group: where it starts, whether its body repeats or alternates
    closed: tuple[int, bool] | None = None  # the group that ends just before the current character
    unbounded = 0
    i, n = 0, len(pattern)
    while i < n:
        c = pattern[i]
        count = _COUNT.match(pattern, i) if c == "{" else None  # at i: no copy of the rest (a long text of `{`)
        if (c in "*+" or count is not None) and not (count is not None and count.group(1) in ("0", "1", ",1", "0,1")):
            end = count.end() if count is not None else i + 1
            upper = count.group(1).rpartition(",")[2] if count is not None else ""
            endless = count is None or upper == ""
            unbounded += endless
            # (a|b){2}: 4 ways, not a blow-up; over 8 (two digits or more) is
            if closed is not None and closed[1] and (endless or len(upper) > 1 or int(upper) > 8):
                return f"repeats a repetition ({_shortened(pattern[closed[0]:end])})"
            if groups:
                groups[-1] = (groups[-1][0], True)
            closed = None
            i = end
            continue
        closed = None
        if c == "\\":
            i += 2
            continue
        if c == "[":  # a character class: nothing in it is a group or a quantifier
            j = i + 1 + (pattern[i + 1:i + 2] == "^")
            j += pattern[j:j + 1] == "]"
            while j < n and pattern[j] != "]":
                j += 2 if pattern[j] == "\\" else 1
            i = j + 1
            continue
        if c == "(":
            groups.append((i, False))
        elif c == ")" and groups:
            closed = groups.pop()
            if groups and closed[1]:
                groups[-1] = (groups[-1][0], True)
        elif c == "|" and groups:
            groups[-1] = (groups[-1][0], True)
        elif c == "?" and i > 0 and pattern[i - 1] == "(":
            pass  # (?:, (?=, (?P<...>: the group's kind, not a quantifier
        i += 1
    if unbounded > MAX_TARGET_REPEATS:
        return f"has {unbounded} unbounded repetitions (more than {MAX_TARGET_REPEATS})"
    return None


class Declined(str):
    """Why gemma-doctor does not run a LoRA target as a regex, where it may well be one PEFT runs: it may backtrack
    exponentially (a text scan, not a proof) or it is longer than any regex of module names."""

    crashes = False  # PEFT itself raises on it (GD425 is then an error, not a warning)


class NotARegex(Declined):
    """A LoRA target that is no regex Python compiles: PEFT raises on it."""

    crashes = True


def target_regex(text: str) -> re.Pattern[str] | Declined:
    """A LoRA target string as the regex PEFT fullmatches against module names, or why it cannot be one: it does not
    compile (re.error, and what re.compile raises besides: a repetition count too large, groups nested too deeply), it
    may backtrack exponentially (``_repeats_a_repetition``) or it is longer than MAX_TARGET_REGEX: gemma-doctor does
    not run those."""
    if len(text) > MAX_TARGET_REGEX:  # re.compile takes ~30 µs a character: a 1 MB config's regex, half a minute
        return Declined(f"is {len(text):,} characters long, longer than any regex of module names (at most "
                        f"{MAX_TARGET_REGEX:,}), so gemma-doctor does not run it")
    why = _repeats_a_repetition(text)
    if why is not None:
        return Declined(f"{why}: re.fullmatch may backtrack exponentially on a module name (PEFT matches with it and "
                        "may never finish), so gemma-doctor does not run it")
    try:
        return re.compile(text)
    except re.error as e:
        return NotARegex(f"is not a valid regular expression: PEFT raises re.error ({e})")
    except (OverflowError, RecursionError) as e:
        return NotARegex(f"is not a regular expression Python compiles ({type(e).__name__}: {str(e)[:100]})")


def _positive(setting: Any) -> Sourced[int] | None:
    v = setting.value if setting is not None else None
    if isinstance(v, int) and not isinstance(v, bool) and v > 0:
        return Sourced(v, FROM_CONFIG + setting.key)
    return None


def written(tc: Any) -> Written:
    """The settings a training config writes (``Written``), nothing where none is read or it cannot be read."""
    if tc is None or not getattr(tc, "ok", False):
        return Written()
    packing = next((Sourced(n, FROM_CONFIG + s.key) for n in ("packing", "padding_free")
                    for s in (tc.get(n),) if s is not None and truthy(s.value)), None)
    tf32 = tc.get("tf32")
    plo = tc.get("prediction_loss_only")
    adapter = tc.get("adapter")
    targets, linear, save = tc.get("lora_target_modules"), tc.get("lora_target_linear"), tc.get("modules_to_save")
    shown = _targets_written(targets.value) if targets is not None else None
    saved = save.value if save is not None else None
    saved = (saved,) if isinstance(saved, str) else saved
    q4, q8 = tc.get("load_in_4bit"), tc.get("load_in_8bit")
    if q4 is not None and (truthy(q4.value) or q4.value == 4):
        bits: Sourced[int] | None = Sourced(4, FROM_CONFIG + q4.key)
    elif adapter is not None and str(adapter.value).lower() == "qlora":
        bits = Sourced(4, FROM_CONFIG + adapter.key)
    elif q4 is not None and q4.value == 8:
        bits = Sourced(8, FROM_CONFIG + q4.key)  # LLaMA-Factory's quantization_bit: 8
    else:
        bits = Sourced(8, FROM_CONFIG + q8.key) if q8 is not None and truthy(q8.value) else None
    lora = LoraWritten(
        quant_bits=bits,
        enabled=(str(adapter.value).strip().lower() in ("lora", "qlora", "true") if adapter is not None
                 else targets is not None or tc.get("lora_r") is not None),
        targets=Sourced(shown, FROM_CONFIG + targets.key) if shown is not None else None,
        all_linear=Sourced(truthy(linear.value), FROM_CONFIG + linear.key) if linear is not None else None,
        modules_to_save=(Sourced(tuple(str(m) for m in saved), FROM_CONFIG + save.key)
                         if isinstance(saved, (list, tuple)) and saved else None))
    return Written(
        switches=_switches(tc),
        tf32=None if tf32 is None or tf32.value is None else Sourced(
            "auto" if str(tf32.value).strip().lower() == "auto" else truthy(tf32.value), FROM_CONFIG + tf32.key),
        attention=_attention_written(tc), packing=packing, eval_batch=_positive(tc.get("eval_batch_size")),
        keeps_predictions=Sourced(not truthy(plo.value), FROM_CONFIG + plo.key) if plo is not None else None,
        eval_accumulation=_positive(tc.get("eval_accumulation_steps")), lora=lora)


@dataclass(frozen=True)
class Run:
    """One training run, every field with its source: its settings (``settings``, the memory plan's very input, each
    stated as a ``Sourced`` by the properties below: method, batch, precision, ...), the memory plan's figures of
    them (``memory``), and what no plan counts (the model, the stack, the trainer, how the processes run together, the
    settings as the training config writes them). No setting is kept twice: a property reads ``settings``."""

    model: str | None  # the model_type (the repo name is filled in by the views, never kept in a judgement)
    stack: tuple[Sourced[str], ...]  # "transformers 5.23.0" / "transformers>=5.6.0", each with its source
    trainer: Sourced[Trainer]  # the trainer that executes it (trainers.decide: plain Trainer, TRL SFT, axolotl...)
    settings: Settings  # what the memory plan was computed from, each value with its source
    distributed: Distributed  # the engine, DeepSpeed's own stage, offload, wrap classes, processes per node
    memory: Memory  # the memory plan of this very run: its line (as every view prints it), verdict and figures
    quantization: str | None  # the checkpoint's or the prescription's quantization (4bit, 8bit, awq...), None: none
    shape: Shape
    written: Written = Written()  # the settings as the training config writes them (the file's own words)

    @property
    def hardware(self) -> Hardware:
        """The GPU the plan was judged against (``memory``), and how many GPUs on how many machines (``settings``)."""
        s = self.settings
        return Hardware(self.memory.gpu_name, self.memory.gpu_bytes, s.sourced("num_gpus"), s.sourced("num_nodes"))

    @property
    def method(self) -> Sourced[Method]:
        """Full fine-tuning, LoRA or QLoRA."""
        return Sourced(Method(self.settings.method), self.settings.source("method"))

    @property
    def lora(self) -> Sourced[Lora] | None:
        """LoRA's rank and targets with the trainable parameters the plan counted on this model (None: full)."""
        s = self.settings
        if s.method == Method.FULL.value:
            return None
        lora = Lora(s.lora_r, s.lora_targets, self.memory.trainable, s.source("lora_targets"))
        return Sourced(lora, s.source("lora"))

    @property
    def precision(self) -> Sourced[str]:
        """bf16 | fp16 | fp32 (the autocast of the run)."""
        return self.settings.sourced("precision")

    @property
    def load_dtype(self) -> Sourced[str]:
        """The dtype the weights load in: a config key, the trainer's default, or the plan's."""
        return self.settings.sourced("load_dtype")

    @property
    def batch(self) -> Sourced[int]:
        """The batch per device."""
        return self.settings.sourced("batch_size")

    @property
    def accumulation(self) -> Sourced[int]:
        """Gradient accumulation steps."""
        return self.settings.sourced("gradient_accumulation_steps")

    @property
    def seq_len(self) -> Sourced[int]:
        """Tokens per sequence."""
        return self.settings.sourced("seq_len")

    @property
    def attention(self) -> Sourced[str]:
        """The attention backend (sdpa | eager | flash_attention_2 ...)."""
        return self.settings.sourced("attention")

    @property
    def checkpointing(self) -> Sourced[bool]:
        """Gradient checkpointing."""
        return self.settings.sourced("gradient_checkpointing")

    @property
    def zero_stage(self) -> Sourced[int]:
        """The memory plan's sharding: ZeRO's stage, or FSDP's counted as the stage it equals; 0 on one GPU."""
        s = self.settings
        return Sourced(s.zero_stage if s.num_gpus > 1 else 0, s.source("zero_stage"))

    @property
    def loss(self) -> Sourced[str]:
        """"full logits" | "chunked log-probs" (TRL >= 1.15 SFTTrainer) | "one pair's logits" (Liger's fused DPO loss)."""
        if self.settings.chunked_loss:
            return Sourced("chunked log-probs", self.settings.source("chunked_loss"))
        if self.settings.liger_dpo_loss:
            return Sourced("one pair's logits", self.settings.source("liger_dpo_loss"))
        return Sourced("full logits", "the trainer upcasts b*s*V logits (transformers' ForCausalLMLoss)")

    @property
    def task(self) -> str:
        """sft | dpo | orpo | ...: what the trainer optimises (a paired task holds two sequences per example)."""
        return self.settings.task

    @property
    def text_only(self) -> bool:
        """No image or audio input trained on."""
        return self.settings.text_only

    @property
    def effective_batch(self) -> int:
        """Sequences per optimizer step on one GPU."""
        return self.settings.batch_size * self.settings.gradient_accumulation_steps

    def to_json(self) -> dict[str, Any]:
        """The `run` block of a prescription: each field as {value, source}."""
        return {"model": self.model, "stack": [s.to_json() for s in self.stack], "hardware": self.hardware.to_json(),
                "trainer": self.trainer.to_json(), "method": self.method.to_json(),
                "lora": ({"value": self.lora.value.to_json(), "source": self.lora.source}
                         if self.lora is not None else None),
                "precision": self.precision.to_json(), "load_dtype": self.load_dtype.value, "batch": self.batch.to_json(),
                "gradient_accumulation_steps": self.accumulation.to_json(), "seq_len": self.seq_len.to_json(),
                "attention": self.attention.to_json(), "gradient_checkpointing": self.checkpointing.to_json(),
                "zero_stage": self.zero_stage.to_json(), "distributed": self.distributed.to_json(),
                "loss": self.loss.to_json(), "memory": self.memory.summary}


# The trainer of a run that no training config or launch line describes: what the memory plan counts (a plain
# transformers Trainer, its loss upcasting the full logits; runplan.chunking_trainer_config), said as an assumption.
ASSUMED_TRAINER = "assumed: no training config or launch line names one (the memory plan counts a plain Trainer's logits)"
# The prescription's trainer: the training config recommend prints (axolotl's YAML, a `trl sft --config` YAML or a
# TrainingArguments YAML: `recommend --trainer`) is the prescribed run, as check reads it back.
PRESCRIBED_TRAINER = "prescription (the YAML recommend --format yaml prints)"


def trainer_of(training_config: Any) -> Sourced[Trainer]:
    """The trainer of check's own run: the one decision the readers took (``TrainingConfig.trainer``, from the file's
    keys or the launch line), else the plain Trainer the memory plan assumes."""
    chosen = getattr(training_config, "trainer", None)
    if chosen is None:
        return Sourced(Trainer.TRANSFORMERS, ASSUMED_TRAINER)
    return Sourced(chosen.value, chosen.source)


# --- how the processes run together: one reading of every input, for the memory plan, the Run and the rules ---

# A TrainingArguments `fsdp` / `deepspeed` value that turns nothing on (its defaults, as a saved config writes them).
_ENGINE_OFF = frozenset({"", "false", "no", "none", "null", "0"})


def _on(value: Any) -> bool:
    """A TrainingArguments `fsdp` / `deepspeed` setting that turns its engine on (`fsdp: ''`, `deepspeed: null`, the
    defaults a saved config writes, do not)."""
    if value is None or value is False or value == [] or value == 0:
        return False
    return _words(value).strip().lower() not in _ENGINE_OFF


def _words(value: Any) -> str:
    """A TrainingArguments option as one string: its words joined where it is written as a list (`fsdp: [full_shard,
    auto_wrap]`)."""
    return " ".join(map(str, value)) if isinstance(value, (list, tuple)) else str(value)


def wrap_class_names(value: Any) -> list[str]:
    """The class names of a wrap list as written: a list, or accelerate's comma-separated string."""
    items = value if isinstance(value, (list, tuple)) else str(value).split(",")
    return [str(c).strip() for c in items if str(c).strip()]


@dataclass(frozen=True)
class ConfigSharding:
    """What a training config (with its launch line and the DeepSpeed JSON it names) says of how its processes run
    together: the engine (None: it names none, so the process count decides between one process and DDP), DeepSpeed's
    own ZeRO stage, the sharding the memory plan counts (ZeRO's stage, or FSDP's strategy as the stage it equals), what
    is offloaded and where, the FSDP wrap classes as written, FSDP's auto-wrap policy and whether the policy and the
    version are written or left to the default of what sets FSDP up. Made by ``config_sharding``, the one reading that
    plan/runplan.py (the plan's zero_stage, fsdp and offload) and ``resolve`` (the Run's ``distributed``) both take."""

    engine: Sourced[Engine] | None = None
    zero_stage: Sourced[int] | None = None
    sharding: Sourced[int] | None = None
    offload_optimizer: Sourced[str] | None = None
    offload_params: Sourced[str] | None = None
    wrap_classes: Sourced[tuple[str, ...]] | None = None
    auto_wrap: Sourced[AutoWrap | str] | None = None  # FSDP's auto-wrap policy (``_auto_wrap``)
    auto_wrap_stated: bool = False  # the config writes the policy (not the default of what sets FSDP up)
    version_stated: bool = False  # the config writes FSDP's version (not that default)


def config_sharding(tc: Any, stack: Any = None) -> ConfigSharding:
    """How ``tc`` (readers/training_config.TrainingConfig) runs its processes together, in one precedence:
    accelerate's distributed_type decides where it is set (accelerate ignores fsdp_config unless it is FSDP and
    deepspeed_config unless it is DEEPSPEED); else a DeepSpeed config (TrainingArguments' `deepspeed`, a ZeRO stage, a
    DeepSpeed JSON itself) before `fsdp` (TrainingArguments sets up DeepSpeed's state whenever `deepspeed` is set:
    transformers 5.23 training_args.py, use_deepspeed). ``stack``: what FSDP version TrainingArguments defaults to."""
    if tc is None or not getattr(tc, "ok", False):
        return ConfigSharding()
    s: Mapping[str, Any] = tc.settings

    def at(name: str, why: str = "") -> str:
        return FROM_CONFIG + s[name].key + why

    dist = s.get("distributed_type")
    kind = str(dist.value).strip().upper() if dist is not None else None
    ref, fsdp, stage = s.get("deepspeed"), s.get("fsdp"), s.get("zero_stage")
    engine: Sourced[Engine] | None = None
    base = ""  # the source of FSDP's engine: the setting that turns it on
    if kind is not None:
        if kind == "DEEPSPEED":
            engine = Sourced(Engine.DEEPSPEED, at("distributed_type"))
        elif kind == "FSDP":
            base = at("distributed_type")
            engine = _fsdp_version(tc, base, stack)
        elif kind == "NO":
            engine = Sourced(Engine.NONE, at("distributed_type"))
        elif kind.startswith("MULTI_"):
            engine = Sourced(Engine.DDP, at("distributed_type"))
    elif ref is not None and _on(ref.value):
        engine = Sourced(Engine.DEEPSPEED, at("deepspeed"))
    elif stage is not None:
        engine = Sourced(Engine.DEEPSPEED, at("zero_stage"))
    elif tc.format.name == "deepspeed":
        engine = Sourced(Engine.DEEPSPEED, FROM_CONFIG.rstrip() + " (a DeepSpeed JSON)")
    elif fsdp is not None and _on(fsdp.value):
        base = at("fsdp")
        engine = _fsdp_version(tc, base, stack)
    if engine is None:
        return ConfigSharding()
    if engine.value is Engine.DEEPSPEED:
        zero = _deepspeed_stage(s)
        sharding = _deepspeed_stage(s, by_name=True)
        off_opt, off_par = (_device(s, name) for name in ("offload_optimizer", "offload_param"))
        return ConfigSharding(engine, zero, sharding, off_opt, off_par)
    if engine.value.fsdp:
        par = s.get("fsdp_offload_params")
        offload = Sourced("cpu", at("fsdp_offload_params")) if par is not None and truthy(par.value) else None
        fsdp_words = _words(fsdp.value).lower().split() if fsdp is not None and _on(fsdp.value) else []
        if offload is None and "offload" in fsdp_words:
            # TrainingArguments' `fsdp: "full_shard offload"` (FSDPOption.OFFLOAD): accelerate's
            # FSDP_OFFLOAD_PARAMS, the same CPUOffload(offload_params=True) as fsdp_offload_params.
            offload = Sourced("cpu", at("fsdp"))
        wraps = s.get("fsdp_wrap_classes")
        names = tuple(wrap_class_names(wraps.value)) if wraps is not None and wraps.value not in (None, "", []) else ()
        stated = s.get("fsdp_version") is not None  # as _fsdp_version takes it: written, whatever its value
        policy, policy_stated = _auto_wrap(tc, base, stack)
        return ConfigSharding(engine, None, _fsdp_sharding(s, engine), None, offload,
                              Sourced(names, at("fsdp_wrap_classes")) if names else None, policy, policy_stated, stated)
    return ConfigSharding(engine)


# accelerate's names of the auto-wrap policies (FullyShardedDataParallelPlugin's auto_wrap_policy), upper case.
_POLICIES = {"TRANSFORMER_BASED_WRAP": AutoWrap.TRANSFORMER, "SIZE_BASED_WRAP": AutoWrap.SIZE, "NO_WRAP": AutoWrap.NONE}


def _auto_wrap(tc: Any, base: str, stack: Any) -> tuple[Sourced[AutoWrap | str], bool]:
    """FSDP's auto-wrap policy, and whether the config states it: fsdp_auto_wrap_policy where written (a word accelerate
    does not know kept as written); else accelerate's plugin default, NO_WRAP, where a launcher's plugin sets FSDP up;
    else TrainingArguments' (TRL, axolotl, LLaMA-Factory), by the stack's transformers (versioning.
    TRAINER_FSDP2_DEFAULTS): from 5.10 any `fsdp` wraps transformer-based, fsdp_config's min_num_params read only
    beside auto_wrap_policy SIZE_BASED_WRAP; before it only an `fsdp` option naming auto_wrap wraps, by size where
    min_num_params > 0 (training_args.py; run on 4.57.6, 5.9.0, 5.10.1 and 5.23.0). Where the stack cannot tell,
    5.10's reading, its source saying what an older one does. ``base``: the source of FSDP's engine."""
    s: Mapping[str, Any] = tc.settings
    policy = s.get("fsdp_auto_wrap_policy")
    if policy is not None:
        word = str(policy.value).strip()
        return Sourced(_POLICIES.get(word.upper(), word), FROM_CONFIG + policy.key), True
    if not tc.format.fsdp_by_training_arguments:
        return Sourced(AutoWrap.NONE, base + " (accelerate's FSDP plugin: NO_WRAP unless fsdp_auto_wrap_policy names "
                                              "one)"), False
    fsdp, minimum = s.get("fsdp"), s.get("fsdp_min_num_params")
    if fsdp is None:  # FSDP set up by the launcher's plugin, not by TrainingArguments' `fsdp`
        return Sourced(AutoWrap.NONE, base + " (accelerate's FSDP plugin: NO_WRAP; no `fsdp` option names auto_wrap)"), \
            False
    by_size = minimum is not None and isinstance(minimum.value, int) and not isinstance(minimum.value, bool) \
        and minimum.value > 0
    named = "auto_wrap" in _words(fsdp.value).lower()
    default = _trainer_fsdp2_default(stack)
    if default is False:
        if named and by_size:
            return Sourced(AutoWrap.SIZE, FROM_CONFIG + minimum.key + " (TrainingArguments before transformers 5.10: "
                                                                      "auto_wrap with min_num_params > 0)"), True
        if named:
            return Sourced(AutoWrap.TRANSFORMER, FROM_CONFIG + fsdp.key), True
        return Sourced(AutoWrap.NONE, FROM_CONFIG + fsdp.key + " (TrainingArguments before transformers 5.10: no "
                                                               "wrapping without auto_wrap)"), False
    ignored = f"; {minimum.key} is read only beside auto_wrap_policy: SIZE_BASED_WRAP" if by_size else ""
    older = ""
    if default is None:
        older = ("; the stack's transformers may be older: by size (min_num_params)" if named and by_size else
                 "" if named else "; the stack's transformers may be older: no wrapping")
    if named and not by_size:
        return Sourced(AutoWrap.TRANSFORMER, FROM_CONFIG + fsdp.key), True
    # Transformer-based by TrainingArguments' default: with min_num_params beside auto_wrap only from 5.10 (not stated:
    # GD660 weighs it against that window, as it does `fsdp` without auto_wrap).
    return Sourced(AutoWrap.TRANSFORMER, FROM_CONFIG + fsdp.key + " (TrainingArguments' default from transformers 5.10: "
                   "TRANSFORMER_BASED_WRAP" + ignored + older + ")"), False


def _trainer_fsdp2_default(stack: Any) -> bool | None:
    """Whether the stack's transformers is one whose TrainingArguments default to FSDP2 with transformer-based wrapping
    (versioning.TRAINER_FSDP2_DEFAULTS, from 5.10): True, False, or None where the stack (or its absence) cannot tell."""
    from gemma_doctor.stack import Exposure
    from gemma_doctor.versioning import TRAINER_FSDP2_DEFAULTS

    exposure = stack.exposure(TRAINER_FSDP2_DEFAULTS) if stack is not None else Exposure.UNKNOWN
    return {Exposure.AFFECTED: True, Exposure.SAFE: False}.get(exposure)


def _fsdp_version(tc: Any, source: str, stack: Any) -> Sourced[Engine]:
    """FSDP's version: the config's fsdp_version (2: FSDP2; any other value written: FSDP1), else accelerate's plugin
    default (1), else TrainingArguments' (2 from transformers 5.10: versioning.TRAINER_FSDP2_DEFAULTS, weighed against
    the stack)."""
    version = tc.settings.get("fsdp_version")
    if version is not None and str(version.value).strip() in ("1", "2"):
        return Sourced(Engine.FSDP2 if str(version.value).strip() == "2" else Engine.FSDP1,
                       FROM_CONFIG + version.key)
    if version is not None:  # written, neither 1 nor 2: accelerate's plugin takes FSDP2's path for version 2 alone
        return Sourced(Engine.FSDP1, FROM_CONFIG + version.key + " (not 2: accelerate's plugin runs FSDP2 for version 2 "
                                                                 "alone)")
    if not tc.format.fsdp_by_training_arguments:
        return Sourced(Engine.FSDP1, source + " (accelerate's FSDP plugin: version 1 unless fsdp_version says 2)")
    default = _trainer_fsdp2_default(stack)
    if default is False:
        return Sourced(Engine.FSDP1, source + " (TrainingArguments before transformers 5.10: FSDP1)")
    return Sourced(Engine.FSDP2, source + " (TrainingArguments' default from transformers 5.10: FSDP2"
                   + ("" if default else "; the stack's transformers may be older: FSDP1") + ")")


def _deepspeed_stage(s: Mapping[str, Any], by_name: bool = False) -> Sourced[int] | None:
    """DeepSpeed's ZeRO stage: the config's (or its DeepSpeed JSON's) stage, else, ``by_name``, the stage a named
    file's name says (`ds_z3.json`, for the memory plan only: the file was not read)."""
    z = s.get("zero_stage")
    if z is not None and not isinstance(z.value, bool):
        text = str(z.value).strip()
        if text.isascii() and text.isdigit() and len(text) <= 2:
            return Sourced(int(text), FROM_CONFIG + z.key)
    d = s.get("deepspeed")
    if by_name and d is not None and isinstance(d.value, str):
        m = re.search(r"(?:zero|z)_?([0-3])", d.value.lower())
        if m:
            return Sourced(int(m.group(1)), FROM_CONFIG + d.key + " (stage read from the file name)")
    return None


def _device(s: Mapping[str, Any], name: str) -> Sourced[str] | None:
    """DeepSpeed's offload device for ``name`` ("cpu" / "nvme"), None where nothing is offloaded."""
    off = s.get(name)
    if off is None or str(off.value).strip().lower() not in ("cpu", "nvme"):
        return None
    return Sourced(str(off.value).strip().lower(), FROM_CONFIG + off.key)


def _fsdp_sharding(s: Mapping[str, Any], engine: Sourced[Engine]) -> Sourced[int]:
    """FSDP's sharding as the ZeRO stage the memory plan counts: FSDP2's fsdp_reshard_after_forward (true, its
    default: FULL_SHARD = 3; false: SHARD_GRAD_OP = 2), else the sharding strategy named, else FULL_SHARD (the default
    of accelerate's plugin and of FSDP2)."""
    version = s.get("fsdp_version")
    reshard = s.get("fsdp_reshard_after_forward")
    f = s.get("fsdp")
    named = f is not None and _on(f.value)
    if version is not None and str(version.value).strip() == "2":
        if reshard is not None:
            text = str(reshard.value).strip().lower()
            return Sourced(2 if text in ("false", "no", "0", "shard_grad_op", "2") else 3, FROM_CONFIG + reshard.key)
        if not named:
            return Sourced(3, FROM_CONFIG + version.key + " (FSDP2: fsdp_reshard_after_forward defaults to true)")
    if named:
        low = _words(f.value).lower()
        if "full_shard" in low or "hybrid_shard" in low or low.strip() in ("1", "full_shard"):
            return Sourced(3, FROM_CONFIG + f.key)
        if "shard_grad_op" in low or low.strip() == "2":
            return Sourced(2, FROM_CONFIG + f.key)
    return Sourced(3, engine.source + " (FSDP's default sharding: FULL_SHARD)")


def distributed(sharding: ConfigSharding, *, processes: Sourced[int], nodes: Sourced[int],
                plan_stage: Sourced[int] | None = None, model_type: str | None = None) -> Distributed:
    """The Run's ``distributed``: the config's engine (``sharding``: config_sharding's), else DeepSpeed where the plan
    shards a run of several processes that no config describes (``plan_stage``: the search's ZeRO stage, which the
    prescription's YAML writes as `deepspeed: zero3.json`), else DDP for several processes and none for one; the wrap
    classes checked against the model's classes (readers/model_classes.py, package data read once)."""
    engine, zero = sharding.engine, sharding.zero_stage
    n = processes.value
    if engine is None:
        if plan_stage is not None and plan_stage.value > 0 and n > 1:
            engine, zero = Sourced(Engine.DEEPSPEED, plan_stage.source), plan_stage
        elif n > 1:
            engine = Sourced(Engine.DDP, processes.source)
        else:
            engine = Sourced(Engine.NONE, "one process")
    wraps = None
    if sharding.wrap_classes is not None:
        from gemma_doctor.readers.model_classes import model_classes

        ours = model_classes().classes.get(model_type or "")
        wraps = Sourced(tuple(WrapClass(c, (c in ours) if ours else None) for c in sharding.wrap_classes.value),
                        sharding.wrap_classes.source)
    per = max(1, -(-n // max(1, nodes.value)))
    per_source = processes.source if nodes.value <= 1 else \
        f"{n} processes ({processes.source}) over {nodes.value} nodes ({nodes.source})"
    return Distributed(engine, zero, sharding.offload_optimizer, sharding.offload_params, wraps,
                       Sourced(per, per_source), sharding.auto_wrap, sharding.auto_wrap_stated, sharding.version_stated)


def libraries(stack: Any) -> tuple[Sourced[str], ...]:
    """The libraries of a stack (stack.Stack) as a Run states them: each version, or a prescription's pin, with its
    source, by name."""
    return tuple(Sourced(f"{p.name} {p.version}" if p.version else f"{p.name}{p.specifier}", p.source)
                 for p in sorted(stack.packages.values(), key=lambda p: p.name) if p.version or p.specifier)


def resolve(memory: Any, *, model: str | None, stack: Any, trainer: Sourced[Trainer],
            quantization: str | None = None, stated: tuple[Sourced[str], ...] | None = None,
            training_config: Any = None) -> Run:
    """The Run of a memory plan (plan.runplan.MemoryFacts): the settings the plan was computed from (its ``run``,
    kept whole), the GPU it was judged against, its verdict and figures (the LoRA targets' trainable parameters
    resolved against the shape), and the stack's libraries (``stated``: ``libraries(stack)``, where the caller made it
    once for the many runs it resolves on one stack); how its processes run together from ``training_config`` (the
    one the plan was made of: config_sharding), else from the settings' own count and stage (the prescription's); and
    the settings as that training config writes them (``written``)."""
    plan = memory.plan
    settings: Settings = plan.settings
    shape = plan.shape
    figures = Memory(plan.summary(), plan.verdict, plan.per_gpu_bytes, plan.gpu_bytes, plan.gpu_name,
                     tuple(plan.components.items()), memory.fixed, Alternative.of(memory.choice),
                     Alternative.of(memory.unconstrained) if memory.unconstrained is not None else None,
                     plan.trainable_params)
    return Run(
        model=model, stack=stated if stated is not None else libraries(stack), trainer=trainer, settings=settings,
        distributed=distributed(config_sharding(training_config, stack), processes=settings.sourced("num_gpus"),
                                nodes=settings.sourced("num_nodes"), plan_stage=settings.sourced("zero_stage"),
                                model_type=model),
        memory=figures, quantization=quantization,
        shape=Shape(shape.vocab, shape.final_logit_softcapping, shape.params.towers,
                    tuple(sorted({k.name for k in shape.linears}))), written=written(training_config))


# Setting (readers.training_config.KEYS) -> its key in TRL 1.16.0's ModelConfig, for every field get_peft_config reads
# into the LoraConfig (trl/trainer/utils.py: lora_task_type, lora_r, lora_target_modules, lora_alpha, lora_dropout,
# use_rslora, use_dora, lora_modules_to_save, lora_target_parameters; test_training_lint runs it to list them).
# Without use_peft: true each is unused. A lora_* key of another format's spelling (lora_rank, lora_target,
# lora_exclude_modules: no field of ModelConfig, `trl sft` drops it) is named too: the file reads like LoRA all the same.
TRL_PEFT_KEYS = {"lora_r": "lora_r", "lora_alpha": "lora_alpha", "lora_dropout": "lora_dropout",
                 "lora_target_modules": "lora_target_modules", "lora_target_parameters": "lora_target_parameters",
                 "modules_to_save": "lora_modules_to_save", "lora_task_type": "lora_task_type",
                 "use_rslora": "use_rslora", "use_dora": "use_dora", "lora_exclude_modules": "lora_exclude_modules"}


def trl_peft_off(trainer: Trainer, s: Mapping[str, Any]) -> bool:
    """A config run by TRL's scripts whose use_peft is not true (unset: ModelConfig's default false): TRL 1.16.0's
    get_peft_config then returns None and the trainer gets no adapters (reproduced with trl/scripts/sft.py's
    make_parser)."""
    peft = s.get("adapter")
    return trainer.runs_trl and not (peft is not None and truthy(peft.value))


def trl_unused_lora_keys(trainer: Trainer, s: Mapping[str, Any]) -> tuple[str, ...]:
    """The settings (KEYS names) whose TRL spelling is a ModelConfig LoRA key that the run never reads: `trl sft
    --config` trains every weight whatever lora_r / lora_alpha / use_dora... say unless use_peft is true. Empty where
    use_peft is true, or the config is not run by TRL's scripts (a TrainingArguments script reads the keys its own
    way)."""
    if not trl_peft_off(trainer, s):
        return ()
    return tuple(name for name, key in TRL_PEFT_KEYS.items()
                 if name in s and (s[name].key == key or str(s[name].key).startswith("lora_")))
