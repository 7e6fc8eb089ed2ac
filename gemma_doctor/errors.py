"""The project's own error types; the CLI maps each to a one-line message and an exit code."""

from __future__ import annotations


class DoctorError(Exception):
    """Base class of every error gemma-doctor raises on purpose."""


class UsageError(DoctorError):
    """The command line names something that does not exist or cannot be used (exit code 2)."""


class ReadError(DoctorError):
    """A file could not be read or parsed; carries a one-line reason."""


class WriteError(DoctorError):
    """A fix or restore could not be written; nothing was changed for that file (exit code 3)."""


class LockTimeout(WriteError):
    """Another gemma-doctor process held the cache lock for longer than the timeout."""
