"""Installed library versions, read from package metadata (never by importing the library)."""

from __future__ import annotations

import platform
import sys
from dataclasses import dataclass, field
from importlib import metadata

# The libraries whose versions decide whether a Gemma run crashes or overflows.
PACKAGES = ("transformers", "accelerate", "peft", "trl", "bitsandbytes", "unsloth", "torch", "huggingface_hub", "safetensors")


@dataclass(frozen=True)
class Versions:
    """Installed versions by distribution name; None when not installed."""

    packages: dict[str, str | None] = field(default_factory=dict)
    python: str = ""
    platform: str = ""

    def get(self, name: str) -> str | None:
        """The installed version of ``name``, or None."""
        return self.packages.get(name)


def installed(names: tuple[str, ...] = PACKAGES) -> Versions:
    """Read versions of ``names`` from the running interpreter's package metadata."""
    found: dict[str, str | None] = {}
    for name in names:
        try:
            found[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            found[name] = None
        except Exception:  # a broken dist-info must not break the doctor
            found[name] = None
    return Versions(found, python=platform.python_version(), platform=f"{sys.platform}-{platform.machine()}")
