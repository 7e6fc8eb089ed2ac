"""The catalogue of finding codes: one stable code per kind of finding, documented in docs/findings.md.

Every code a rule emits must be listed here (a test checks it, and that docs/findings.md documents
each one). Codes are never renumbered; a retired code stays reserved.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Code:
    """A finding code with its short name and one-line title."""

    code: str
    name: str
    title: str


_CODES = [
    # GD0xx: reading the model folder
    Code("GD001", "config-unreadable", "config.json is missing, unreadable or not valid JSON"),
    Code("GD002", "config-invalid", "config.json parses but has the wrong shape (not an object, wrong type for a key)"),
    Code("GD003", "not-gemma", "the model is not a Gemma-family model; gemma-doctor leaves it alone"),
    Code("GD004", "generation-config-invalid", "generation_config.json is unreadable, not JSON or has the wrong shape"),
    Code("GD005", "link-escapes-repo", "a snapshot file is a link that points outside its repo folder; it is not read or written"),
    Code("GD006", "fixed-by-doctor", "files of this snapshot were rewritten by gemma-doctor fix; restore brings back the originals"),
    # GD1xx: the HybridCache crash and use_cache
    Code("GD101", "use-cache-enabled", "use_cache is not disabled where the text model reads it"),
    Code("GD102", "generation-use-cache", "generation_config.json lacks \"use_cache\": false"),
    Code("GD103", "transformers-hybridcache-bug", "installed transformers 4.50.0-4.50.3 crashes bf16/fp16 evaluation of this model"),
    Code("GD104", "top-level-use-cache-only", "use_cache is false at the top level only, which the text model does not read"),
]

CODES: dict[str, Code] = {c.code: c for c in _CODES}

