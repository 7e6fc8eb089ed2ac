"""Pure version arithmetic for the known-bad ranges (no imports of the libraries themselves)."""

from __future__ import annotations

from packaging.version import InvalidVersion, Version


def parse(version: str | None) -> Version | None:
    """A comparable version, or None when absent or unparseable."""
    if not version:
        return None
    try:
        return Version(version)
    except InvalidVersion:
        return None


# transformers releases whose cache classes keep `.dtype` while no longer being nn.Module, so
# accelerate's convert_to_fp32 calls `.float()` on a HybridCache (facts.md section 1).
HYBRIDCACHE_FIRST_FIXED = "4.51.0"


def transformers_has_hybridcache_bug(version: str | None) -> bool:
    """True for 4.50.0-4.50.3 and the 4.50.0.dev0 / v4.49.0-Gemma-3 previews."""
    v = parse(version)
    if v is None:
        return False
    if v.release[:2] == (4, 50):
        return True
    # The Gemma 3 preview tag installs as 4.49.0 with a local or dev suffix.
    return v.release[:2] == (4, 49) and (v.local is not None and "gemma" in v.local.lower())
