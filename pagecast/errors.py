"""Errors that carry the exit code the command line returns for them.

Exit codes follow docs/cli (the contract): 2 for bad input the user can fix
(a missing or malformed file, a bad flag value), 1 for an internal error.
"""

from __future__ import annotations

from typing import Any


def shown(v: Any, limit: int = 60) -> str:
    """repr(v) for an error line, cut to `limit` characters (a value read from a file can be anything)."""
    try:
        r = repr(v)
    except ValueError:   # an integer too long to print
        return f"an integer of {v.bit_length()} bits"
    return r if len(r) <= limit else r[:limit - 3] + "..."


class PagecastError(Exception):
    """Base class: a one-line message for the user and an exit code."""

    exit_code = 1


class UsageError(PagecastError):
    """A bad flag value or an impossible request."""

    exit_code = 2


class InputError(PagecastError):
    """A file the user gave us is missing, unreadable or malformed."""

    exit_code = 2


class TraceError(InputError):
    """A trace directory that does not follow trace format v1."""


class ModelError(InputError):
    """A model file that is not a pagecast model this version reads."""


class PlanError(InputError):
    """A plan file that is malformed or made for another trace."""


class ProfileError(InputError):
    """A cost profile that is malformed or missing a field."""


class NoGPUError(PagecastError):
    """The command needs an NVIDIA GPU with a CUDA driver and none is usable."""

    exit_code = 2


class OutputExistsError(UsageError):
    """An output exists and --force was not given."""

    def __init__(self, path, message: str | None = None) -> None:
        super().__init__(message or f"{path} exists; pass --force to overwrite it")
