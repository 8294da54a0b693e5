"""Paths on disk: what a path argument is, what is already there, and where the
data of a train is read from — the checks that keep src_dask from writing over
anything it did not make (docs/design.md §4.3)."""

from __future__ import annotations

import builtins
import json
import os
import shutil
import uuid
from typing import Any

from . import _integrity
from .errors import PathRefusedError


def as_path(path: Any, what: str = "path") -> str:
    """``path`` as a non-empty string (TypeError / ValueError otherwise)."""
    if not isinstance(path, (str, os.PathLike)):
        raise TypeError(f"{what}: expected a path (str or os.PathLike), got "
                        f"{type(path).__name__}")
    text = os.fspath(path)
    if isinstance(text, bytes):
        text = os.fsdecode(text)
    if not text.strip():
        raise ValueError(f"{what}: empty path ({text!r}); name a directory of its own")
    return text


def check_parent(path: str, what: str) -> None:
    """Refuse ``path`` (real) when the nearest existing folder above it is a file:
    nothing could be made there, and the error should say why."""
    parent = os.path.dirname(path)
    while parent and not os.path.lexists(parent):
        parent = os.path.dirname(parent)
    if parent and not os.path.isdir(parent):
        raise PathRefusedError(f"{what}: {parent} is a file, not a directory; nothing can "
                               "be written below it")


def within(inner: str, outer: str) -> bool:
    """Whether real path ``inner`` is ``outer`` or lies below it."""
    return os.path.commonpath([inner, outer]) == outer


def holds_working_directory(path: str) -> bool:
    """Whether real path ``path`` is the working directory or one of its parents."""
    return within(os.path.realpath(os.getcwd()), path)


def group_attrs(path: str) -> dict | None:
    """The attributes of the Zarr v3 group whose directory is ``path``, read straight
    from its ``zarr.json``; None where there is no readable group."""
    try:
        with builtins.open(os.path.join(path, "zarr.json"), "rb") as f:
            meta = json.load(f)
    except (OSError, ValueError):
        return None
    if not isinstance(meta, dict) or meta.get("node_type") != "group":
        return None
    attrs = meta.get("attributes", {})
    return attrs if isinstance(attrs, dict) else None


def stored_arrays(core: Any, source: Any = None) -> list[Any]:
    """The Zarr arrays a core is read from: its source (a Zarr array or a verified
    one), and the arrays a Dask core wraps (``from_array`` keeps them whole)."""
    candidates = [core] if source is None else [source, core]
    graph = getattr(core, "__dask_graph__", None)
    if graph is not None:
        candidates += [v for v in dict(graph()).values() if not hasattr(v, "__dask_graph__")]
    found = []
    for c in candidates:
        if isinstance(c, _integrity.VerifiedArray):
            c = c.array
        if type(c).__module__.startswith("zarr") and hasattr(c, "store_path"):
            found.append(c)
    return found


def train_dirs(train: Any, name: str) -> dict[str, str]:
    """The local directories (Zarr stores) a train's cores are read from, each named
    for messages (``"<name> (site j)"``)."""
    dirs: dict[str, str] = {}
    for j in range(len(train)):
        source = train.source(j) if hasattr(train, "source") else None
        for arr in stored_arrays(train[j], source):
            root = getattr(arr.store_path.store, "root", None)
            if root is not None:  # None: not on the local file system
                dirs.setdefault(os.path.realpath(os.fspath(root)), f"{name} (site {j})")
    return {label: where for where, label in dirs.items()}


def check_apart(path: str, dirs: dict[str, str], what: str, allow_same: bool = False) -> None:
    """Refuse ``path`` if it is (unless ``allow_same``), is inside, or contains one of
    ``dirs`` (label → directory), before anything is written."""
    for label, where in dirs.items():
        if path == where and allow_same:
            continue
        if within(path, where) or within(where, path):
            how = ("is" if path == where else "is inside" if within(path, where)
                   else "contains")
            raise PathRefusedError(f"{what}: {how} the directory of {label} ({where}); "
                                   "writing there would destroy data being read (choose a "
                                   "path apart from it)")


def check_space(path: str, need: int, what: str) -> None:
    """Fail early, naming ``path``, where ``what`` (e.g. "the run store") cannot be
    written or would not fit in ``need`` bytes: an ``OSError`` before anything is made."""
    parent = path
    while not os.path.exists(parent):
        parent = os.path.dirname(parent) or "."
    probe = os.path.join(parent, f".src_dask-probe-{uuid.uuid4().hex}")
    try:
        with builtins.open(probe, "wb"):
            pass
        os.remove(probe)
    except OSError as err:
        raise OSError(err.errno, f"{path}: {what} cannot be written there ({err.strerror}); "
                                 f"it needs {need} bytes") from err
    free = shutil.disk_usage(parent).free
    if free < need:
        raise OSError(28, f"{path}: {what} needs {need} bytes but only {free} are free")
