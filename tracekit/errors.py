"""Errors a user can act on. The CLI prints them as one line and exits 2."""
from __future__ import annotations

import os


class TracekitError(Exception):
    """Base class: bad input or a store that cannot be used; never a bug."""


class TraceFileError(TracekitError):
    """A trace file that cannot be ingested. The message names the file."""

    def __init__(self, path: str | os.PathLike, message: str):
        self.path = os.fspath(path)
        self.reason = message
        super().__init__(f"{self.path}: {message}")


class NotATraceError(TraceFileError):
    """Valid JSON that is not a Kineto trace (run.json, execution traces, ...)."""


class StoreError(TracekitError):
    """The store is missing, locked, from another schema version, or unwritable."""
