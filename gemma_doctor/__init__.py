"""gemma-doctor: diagnose and safely fix Gemma-family checkpoints before mixed-precision training."""

from __future__ import annotations

__version__ = "0.1.0"

__all__ = ["__version__"]
