"""Renderers turn reports and outcomes into strings; only cli.py prints."""

from __future__ import annotations

import enum


class OutputFormat(str, enum.Enum):
    """--format choices of `check`, `fix` and `restore`."""

    TEXT = "text"
    JSON = "json"
    GITHUB = "github"
