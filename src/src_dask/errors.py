"""Exceptions src_dask raises about paths and stored data.

Each also inherits the builtin exception that code written before it caught
(``ValueError`` for refused stores and damaged data, ``FileExistsError`` for a
path that will not be replaced), so ``except ValueError`` keeps working while
new code, and the command line, can tell the cases apart by type.
"""

from __future__ import annotations


class SrcDaskError(Exception):
    """Base class of src_dask's own exceptions."""


class StoreError(SrcDaskError, ValueError):
    """A train or run store on disk cannot be used as asked: not one of ours,
    of another format version, or with metadata that does not add up."""


class PathRefusedError(StoreError, FileExistsError):
    """A path will not be written: something that src_dask did not write is there,
    or it is (inside, or contains) one of the run's own inputs."""


class DamagedDataError(StoreError):
    """Stored data is missing, fails its checksum, or reads back as NaN/inf."""


class StoreLockedError(StoreError, RuntimeError):
    """Another process is running on this run store (one writer per store)."""


class OverwriteNeededError(StoreError):
    """A run store holds another run (other inputs or options), or its metadata is
    damaged: only ``overwrite`` (the command line's ``--overwrite-store``) replaces it.

    ``reason`` is the message without the hint, so that each front end can name
    its own option.
    """

    def __init__(self, reason: str, hint: str = "pass overwrite=True to replace it") -> None:
        super().__init__(f"{reason}; {hint}")
        self.reason = reason


class PlanError(SrcDaskError, MemoryError):
    """A problem that cannot fit: one sketch column or one row of a projected core
    needs more memory than a task may use. Raised by the plan, before any work."""
