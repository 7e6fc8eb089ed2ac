"""gemma-doctor: diagnose and safely fix Gemma-family checkpoints before mixed-precision training."""

from __future__ import annotations

__version__ = "0.1.0"

__all__ = ["__version__", "diagnose", "prepare", "DoctorCallback", "Report", "FailOn", "Severity", "ExitCode",
           "PrecisionMismatch", "PrecisionWarning"]

# The public API, imported on first use so that `import gemma_doctor` (and the CLI's start-up) stays light.
_LAZY = {
    "diagnose": ("gemma_doctor.api", "diagnose"),
    "prepare": ("gemma_doctor.api", "prepare"),
    "PrecisionMismatch": ("gemma_doctor.api", "PrecisionMismatch"),
    "PrecisionWarning": ("gemma_doctor.api", "PrecisionWarning"),
    "DoctorCallback": ("gemma_doctor.callback", "DoctorCallback"),  # imports transformers
    "Report": ("gemma_doctor.report", "Report"),
    "FailOn": ("gemma_doctor.report", "FailOn"),
    "Severity": ("gemma_doctor.report", "Severity"),
    "ExitCode": ("gemma_doctor.report", "ExitCode"),
}


def __getattr__(name: str) -> object:
    """Resolve the lazily imported public API (PEP 562)."""
    if name not in _LAZY:
        raise AttributeError(f"module 'gemma_doctor' has no attribute {name!r}")
    import importlib

    module_name, attr = _LAZY[name]
    module = importlib.import_module(module_name)
    return module if attr is None else getattr(module, attr)
