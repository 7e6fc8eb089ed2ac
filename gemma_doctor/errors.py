"""The project's own error types; the CLI maps each to a one-line message and an exit code."""

from __future__ import annotations


class DoctorError(Exception):
    """Base class of every error gemma-doctor raises on purpose."""


class UsageError(DoctorError):
    """The command line names something that does not exist or cannot be used (exit code 2)."""


class InvalidArgument(UsageError, ValueError):
    """A Python API argument the CLI would refuse as an option (``prepare(gpu="T5")``): the CLI's message."""


class ReadError(DoctorError):
    """A file could not be read or parsed; carries a one-line reason."""


class WriteError(DoctorError):
    """A fix or restore could not be written; nothing was changed for that file (exit code 3)."""


class LockTimeout(WriteError):
    """Another gemma-doctor process held the cache lock for longer than the timeout."""


class HubAccessError(DoctorError):
    """The Hub refused the files of a gated (or private) repo to this token (exit code 4)."""


class HubUnreachable(DoctorError):
    """The Hub could not be asked: offline mode, no network, a timeout, a server error (exit code 5)."""


class HubOffline(HubUnreachable):
    """HF_HUB_OFFLINE is set, so the Hub is never asked."""
