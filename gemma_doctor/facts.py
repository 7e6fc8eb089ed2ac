"""Frozen facts gathered by the readers and handed to the pure rules.

Every fact has a typed field; what is not known (not asked for, or not read yet) is None. The order in
which the fields are filled is code, in pipeline.gather.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from gemma_doctor.family import FamilyInfo
from gemma_doctor.locate import Snapshot
from gemma_doctor.readers.adapter import Kind
from gemma_doctor.readers.jsonfile import JsonFile
from gemma_doctor.readers.versions import Versions
from gemma_doctor.report import FailOn
from gemma_doctor import frozen, horizon
from gemma_doctor.errors import UsageError
from gemma_doctor.run import Method, Run
from gemma_doctor.stack import Stack

if TYPE_CHECKING:  # annotations only: the readers import this module
    from gemma_doctor.readers.adapter import AdapterFacts, BaseFacts, HeadComparison
    from gemma_doctor.readers.dtypes import DtypeCensus
    from gemma_doctor.readers.gpu import GpuFacts
    from gemma_doctor.readers.tokenizer import TokenizerFacts
    from gemma_doctor.readers.training_config import TrainingConfig
    from gemma_doctor.readers.weights import WeightsScan
    from gemma_doctor.source import ModelSource


@dataclass(frozen=True)
class MemoryRequest:
    """What the command line asks of the memory plan (None = not said): part of the options, read by plan/runplan.py."""

    method: str | None = None
    batch_size: int | None = None
    seq_len: int | None = None
    gradient_checkpointing: bool | None = None
    gpu_memory: int | None = None  # bytes, --gpu-memory
    num_gpus: int | None = None
    size: str | None = None  # --size for a --family plan

    def __post_init__(self) -> None:
        methods = tuple(m.value for m in Method)
        if self.method is not None and self.method not in methods:
            raise UsageError(f"--method {self.method!r} is not known; use one of: {', '.join(methods)}")


@dataclass(frozen=True)
class CheckOptions:
    """What the user asked `check` to look at."""

    fail_on: FailOn = FailOn.ERROR
    weights: bool = False
    gpu: str | None = None
    training_config: str | None = None
    # How the run is launched: an `accelerate launch` / `torchrun` / `deepspeed` / `python` command line (--launch).
    launch: str | None = None
    task: str | None = None
    jobs: int = 1
    # Packages of the training machine when it is not this one: pip requirement strings (--with).
    with_packages: tuple[str, ...] = ()
    # A requirements / pip freeze / lock file describing the training machine (--requirements).
    requirements: str | None = None
    # Read named repos from the Hub even when they are cached (--remote).
    remote: bool = False
    # The memory plan's options (--method, --batch-size, --seq-len, --gradient-checkpointing, --gpu-memory, --num-gpus).
    memory: MemoryRequest | None = None
    # The trainer whose config `recommend` writes and judges its prescription as (recommend --trainer: one of
    # plan/recommend.TRAINER_FORMATS); None: the training config's trainer, else axolotl.
    trainer: str | None = None


@dataclass(frozen=True)
class UndoFacts:
    """What gemma-doctor's undo record says about a snapshot's files (relative names -> entry)."""

    entries: dict[str, dict[str, Any]] = field(default_factory=dict)
    error: str | None = None


@dataclass(frozen=True)
class ModelFacts:
    """Everything read about one snapshot; later fields stay None until pipeline.gather fills them."""

    snapshot: Snapshot
    config: JsonFile
    generation_config: JsonFile
    family: FamilyInfo
    undo: UndoFacts = field(default_factory=UndoFacts)
    source: ModelSource | None = field(default=None, compare=False)
    census: DtypeCensus | None = None
    weights_scan: WeightsScan | None = None
    # check's run of this model (run.resolve: the options, the training config, the launch line, the stack, the GPU,
    # what the search chose, the memory plan's verdict and figures), the one value the rules read it from. The
    # precision decision and the memory plan it was resolved from travel beside the facts (pipeline.Judgement).
    run: Run | None = None
    tokenizer: TokenizerFacts | None = None
    # What the folder is (readers/adapter.py: model | adapter | checkpoint); an adapter's files and its base.
    kind: Kind = Kind.MODEL
    adapter: AdapterFacts | None = None
    base: BaseFacts | None = None
    # Which of readers/adapter.NOTED_FILES the folder has (processor configs, tokenizer files, training marks).
    files: frozenset[str] = frozenset()
    # check --weights: whether a saved lm_head.weight differs from embed_tokens (readers/adapter.compare_head).
    head_differs: HeadComparison | None = None

    def with_(self, **changes: Any) -> ModelFacts:
        """A copy with some fields filled in."""
        return frozen.replace(self, **changes)


@dataclass(frozen=True)
class Environment:
    """The machine and libraries the training run will use."""

    versions: Versions
    stack: Stack | None = None
    gpu: GpuFacts | None = None
    training_config: TrainingConfig | None = None

    @property
    def libraries(self) -> Stack:
        """The libraries that will run: the planned stack, else what is installed here."""
        return self.stack if self.stack is not None else Stack.installed(self.versions)

    def to_json(self) -> dict[str, Any]:
        """The `environment` block of the JSON report."""
        out: dict[str, Any] = {
            "python": self.versions.python,
            "platform": self.versions.platform,
            "packages": dict(self.versions.packages),
            "stack": self.libraries.to_json(),
            "horizon": horizon.to_json(self.libraries),
        }
        if self.training_config is not None:
            out["training_config"] = self.training_config.to_json()
        if self.gpu is not None:
            out["gpu"] = self.gpu.to_json()
        return out
