"""Installed library versions, read from package metadata (never by importing the library)."""

from __future__ import annotations

import functools
import os
import platform
import re
import sys
from dataclasses import dataclass, field

# The libraries whose versions decide whether a Gemma run crashes or overflows.
# timm and Pillow: Gemma 3n's vision tower is a timm model (GD110).
PACKAGES = ("transformers", "accelerate", "peft", "trl", "bitsandbytes", "unsloth", "torch", "huggingface_hub", "safetensors",
            "timm", "pillow")
# The rest of the stack a Gemma run touches (kernels, trainers, serving engines): the field catalogue
# (gemma_doctor/catalogue/field.json) judges their versions. Read from the same dist-info listing, never imported.
STACK_PACKAGES = ("unsloth_zoo", "flash_attn", "liger_kernel", "cut_cross_entropy", "deepspeed", "xformers", "axolotl",
                  "llamafactory", "ms_swift", "vllm", "sglang", "llmcompressor", "compressed_tensors", "llama_cpp_python")


@dataclass(frozen=True)
class Versions:
    """Installed versions by distribution name; None when not installed."""

    packages: dict[str, str | None] = field(default_factory=dict)
    python: str = ""
    platform: str = ""

    def get(self, name: str) -> str | None:
        """The installed version of ``name``, or None."""
        return self.packages.get(name)


def _normalise(name: str) -> str:
    """PEP 503 name normalisation, with the underscores dist-info folders use."""
    return re.sub(r"[-_.]+", "_", name).lower()


def _scan_dist_info(wanted: set[str]) -> dict[str, str]:
    """Versions from the ``name-version.dist-info`` / ``.egg-info`` folder names on sys.path, first hit wins
    (importlib.metadata's order) — a directory listing per path entry instead of parsing every METADATA file."""
    found: dict[str, str] = {}
    for entry in sys.path:
        try:
            names = os.listdir(entry or ".")
        except OSError:
            continue
        for folder in names:
            if not folder.endswith((".dist-info", ".egg-info")):
                continue
            stem = folder.rsplit(".", 1)[0]
            name, sep, version = stem.partition("-")
            key = _normalise(name)
            if sep and key in wanted and key not in found:
                found[key] = version.split("-")[0]
        if len(found) == len(wanted):
            break
    return found


@functools.lru_cache(maxsize=8)
def installed(names: tuple[str, ...] = PACKAGES + STACK_PACKAGES) -> Versions:
    """Versions of ``names`` from the running interpreter's package metadata, read once per process."""
    wanted = {_normalise(n): n for n in names}
    fast = _scan_dist_info(set(wanted))
    found: dict[str, str | None] = {name: fast.get(key) for key, name in wanted.items()}
    return Versions(found, python=platform.python_version(), platform=f"{sys.platform}-{platform.machine()}")
