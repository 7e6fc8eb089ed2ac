"""Frozen facts gathered by the readers and handed to the pure rules."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from gemma_doctor.family import FamilyInfo
from gemma_doctor.locate import Snapshot
from gemma_doctor.readers.jsonfile import JsonFile
from gemma_doctor.readers.versions import Versions
from gemma_doctor.report import FailOn


@dataclass(frozen=True)
class CheckOptions:
    """What the user asked `check` to look at."""

    fail_on: FailOn = FailOn.ERROR
    weights: bool = False
    gpu: str | None = None
    training_config: str | None = None
    task: str | None = None
    jobs: int = 1


@dataclass(frozen=True)
class UndoFacts:
    """What gemma-doctor's undo record says about a snapshot's files (relative names -> entry)."""

    entries: dict[str, dict[str, Any]] = field(default_factory=dict)
    error: str | None = None


@dataclass(frozen=True)
class ModelFacts:
    """Everything read about one snapshot."""

    snapshot: Snapshot
    config: JsonFile
    generation_config: JsonFile
    family: FamilyInfo
    undo: UndoFacts = field(default_factory=UndoFacts)
    # Facts of later features (dtype census, weight scan...) by name; rules read what they need.
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Environment:
    """The machine and libraries the training run will use."""

    versions: Versions
    extra: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        """The `environment` block of the JSON report."""
        out: dict[str, Any] = {
            "python": self.versions.python,
            "platform": self.versions.platform,
            "packages": dict(self.versions.packages),
        }
        for key, value in self.extra.items():
            out[key] = value.to_json() if hasattr(value, "to_json") else value
        return out
