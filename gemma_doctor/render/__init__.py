"""Renderers turn reports and outcomes into strings; only the CLI (gemma_doctor/cli) prints."""

from __future__ import annotations

import enum


class OutputFormat(str, enum.Enum):
    """--format choices of `check`, `fix` and `restore`."""

    TEXT = "text"
    JSON = "json"
    GITHUB = "github"
