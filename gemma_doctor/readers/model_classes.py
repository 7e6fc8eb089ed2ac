"""The torch module classes of each Gemma-family model_type, as transformers' modeling code defines them
(model_classes.json, written by docs/gen_model_classes.py from the installed transformers), read without importing it."""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping


@dataclass(frozen=True)
class ModelClasses:
    """Class names by model_type, and the transformers version they were read from."""

    read_from: str
    classes: Mapping[str, tuple[str, ...]]


@functools.lru_cache(maxsize=1)
def model_classes() -> ModelClasses:
    """The table, read once per process (package data)."""
    data = json.loads((Path(__file__).parent / "model_classes.json").read_text(encoding="utf-8"))
    return ModelClasses(data["read_from"]["transformers"], {k: tuple(v) for k, v in data["classes"].items()})
