"""The run that will execute, as one frozen, typed value: what is trained, on what, and how, each field with its source.

``resolve`` builds it once from what the layers below have already resolved: the memory plan's RunSpec (whose
settings the options, the training config, the defaults and the search filled in, each with its source), the
model's shape (LoRA targets resolved against its module names), the GPU (parsed once, by readers/gpu.py), the
stack (each version with its source; a prescription's pins are part of it) and the trainer that reads the config.
The prescription is a Run (``Decision.run``); its JSON view is ``prescription.run``. check's own run (the one the user
asked about: options, training config, launch line, stack, GPU) is a Run too, resolved the same way from the memory plan
check made of it, with the trainer the readers decided (``trainer_of``); it is ``ModelFacts.run``, the one value the
rules read the run from (its memory verdict and figures included: ``Memory``), and its JSON view is each model's ``run``.

Pure: no files, no torch; imports nothing of plan/ or above (docs/architecture.md, "Layers"): the plan's objects it is
resolved from are read by their fields.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from gemma_doctor.trainers import Trainer

T = TypeVar("T")
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

    @classmethod
    def of(cls, choice: Any) -> Alternative:
        """The figures of a plan.memory.Choice."""
        small, plan = choice.smallest_gpu_plan, choice.plan
        return cls(choice.fits, plan.summary() if plan is not None else None, choice.smallest_gpu,
                   small.summary() if small is not None else None, choice.reason,
                   plan.run.gradient_checkpointing if plan is not None else None)


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


@dataclass(frozen=True)
class Shape:
    """What the memory plan counted of the model (plan.memory.ModelShape), as the rules read it."""

    vocab: int
    final_logit_softcapping: float | None
    towers: int  # vision / audio tower parameters
    linear_names: tuple[str, ...]  # the kinds of linear layer (q_proj, ...), sorted: what LoRA targets must match


@dataclass(frozen=True)
class Run:
    """One training run, every field with its source."""

    model: str | None  # the model_type (the repo name is filled in by the views, never kept in a judgement)
    stack: tuple[Sourced[str], ...]  # "transformers 5.23.0" / "transformers>=5.6.0", each with its source
    hardware: Hardware
    trainer: Sourced[Trainer]  # the trainer that executes it (trainers.decide: plain Trainer, TRL SFT, axolotl...)
    method: Sourced[Method]
    lora: Sourced[Lora] | None
    precision: Sourced[str]  # bf16 | fp16 | fp32 (the autocast of the run)
    load_dtype: Sourced[str]  # the dtype the weights load in: a config key, the trainer's default, or the plan's
    batch: Sourced[int]
    accumulation: Sourced[int]
    seq_len: Sourced[int]
    attention: Sourced[str]
    checkpointing: Sourced[bool]
    zero_stage: Sourced[int]
    loss: Sourced[str]  # "full logits" | "chunked log-probs" (TRL >= 1.15 SFTTrainer)
    memory: Memory  # the memory plan of this very run: its line (as every view prints it), verdict and figures
    task: str  # sft | dpo | orpo | ...: what the trainer optimises (a paired task holds two sequences per example)
    text_only: bool  # no image or audio input trained on
    quantization: str | None  # the checkpoint's or the prescription's quantization (4bit, 8bit, awq...), None: none
    shape: Shape

    @property
    def effective_batch(self) -> int:
        """Sequences per optimizer step on one GPU."""
        return self.batch.value * self.accumulation.value

    def to_json(self) -> dict[str, Any]:
        """The `run` block of a prescription: each field as {value, source}."""
        return {"model": self.model, "stack": [s.to_json() for s in self.stack], "hardware": self.hardware.to_json(),
                "trainer": self.trainer.to_json(), "method": self.method.to_json(),
                "lora": ({"value": self.lora.value.to_json(), "source": self.lora.source}
                         if self.lora is not None else None),
                "precision": self.precision.to_json(), "load_dtype": self.load_dtype.value, "batch": self.batch.to_json(),
                "gradient_accumulation_steps": self.accumulation.to_json(), "seq_len": self.seq_len.to_json(),
                "attention": self.attention.to_json(), "gradient_checkpointing": self.checkpointing.to_json(),
                "zero_stage": self.zero_stage.to_json(), "loss": self.loss.to_json(), "memory": self.memory.summary}


# The trainer of a run that no training config or launch line describes: what the memory plan counts (a plain
# transformers Trainer, its loss upcasting the full logits; runplan.sft_trainer_config), said as an assumption.
ASSUMED_TRAINER = "assumed: no training config or launch line names one (the memory plan counts a plain Trainer's logits)"
# The prescription's trainer: the axolotl YAML recommend prints is the prescribed run, as check reads it back.
PRESCRIBED_TRAINER = "prescription (the YAML recommend --format yaml prints)"


def trainer_of(training_config: Any) -> Sourced[Trainer]:
    """The trainer of check's own run: the one decision the readers took (``TrainingConfig.trainer``, from the file's
    keys or the launch line), else the plain Trainer the memory plan assumes."""
    chosen = getattr(training_config, "trainer", None)
    if chosen is None:
        return Sourced(Trainer.TRANSFORMERS, ASSUMED_TRAINER)
    return Sourced(chosen.value, chosen.source)


def libraries(stack: Any) -> tuple[Sourced[str], ...]:
    """The libraries of a stack (stack.Stack) as a Run states them: each version, or a prescription's pin, with its
    source, by name."""
    return tuple(Sourced(f"{p.name} {p.version}" if p.version else f"{p.name}{p.specifier}", p.source)
                 for p in sorted(stack.packages.values(), key=lambda p: p.name) if p.version or p.specifier)


def resolve(memory: Any, *, model: str | None, stack: Any, trainer: Sourced[Trainer],
            quantization: str | None = None, stated: tuple[Sourced[str], ...] | None = None) -> Run:
    """The Run of a memory plan (plan.runplan.MemoryFacts): its RunSpec's settings with their sources, the shape's LoRA
    targets resolved, the GPU the plan was judged against, its verdict and figures, and the stack's libraries
    (``stated``: ``libraries(stack)``, where the caller made it once for the many runs it resolves on one stack)."""
    plan = memory.plan
    spec = plan.run
    sources = dict(spec.sources)  # RunSpec.source's own lookup, made once for the fields below

    def src(name: str) -> str:
        return sources.get(name, "default")

    method = Method(spec.method)
    lora = None
    if method is not Method.FULL:
        lora = Sourced(Lora(spec.lora_r, spec.lora_targets, plan.trainable_params, src("lora_targets")), src("lora"))
    shape = plan.shape
    figures = Memory(plan.summary(), plan.verdict, plan.per_gpu_bytes, plan.gpu_bytes, plan.gpu_name,
                     tuple(plan.components.items()), memory.fixed, Alternative.of(memory.choice),
                     Alternative.of(memory.unconstrained) if memory.unconstrained is not None else None)
    return Run(
        model=model, stack=stated if stated is not None else libraries(stack),
        hardware=Hardware(plan.gpu_name, plan.gpu_bytes, Sourced(spec.num_gpus, src("num_gpus")),
                          Sourced(spec.num_nodes, src("num_nodes"))),
        trainer=trainer, method=Sourced(method, src("method")), lora=lora,
        precision=Sourced(spec.precision, src("precision")), load_dtype=Sourced(spec.load_dtype, src("load_dtype")),
        batch=Sourced(spec.batch_size, src("batch_size")),
        accumulation=Sourced(spec.gradient_accumulation_steps, src("gradient_accumulation_steps")),
        seq_len=Sourced(spec.seq_len, src("seq_len")), attention=Sourced(spec.attention, src("attention")),
        checkpointing=Sourced(spec.gradient_checkpointing, src("gradient_checkpointing")),
        zero_stage=Sourced(spec.zero_stage if spec.num_gpus > 1 else 0, src("zero_stage")),
        loss=Sourced("chunked log-probs", src("chunked_loss")) if spec.chunked_loss else
        Sourced("full logits", "the trainer upcasts b*s*V logits (transformers' ForCausalLMLoss)"),
        memory=figures, task=spec.task, text_only=spec.text_only, quantization=quantization,
        shape=Shape(shape.vocab, shape.final_logit_softcapping, shape.params.towers,
                    tuple(sorted({k.name for k in shape.linears}))))
