"""Lazy array-likes as input cores: ``numpy.memmap``, h5py datasets, xarray
variables and any object with ``shape``, ``dtype``, ``ndim`` and ``__getitem__``
or ``__array__``. Each core is read whole by a task of its own, as Zarr cores
are (``_graph.tasks.read_whole``), once per pass or once for both: never all at
once and never into the graph, whose tasks carry only a picklable :func:`source`.
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np


class MemmapSource:
    """A ``numpy.memmap`` by file, offset, shape and dtype: pickled as those (not as
    its data, which is what pickling the memmap itself would send to a worker) and
    mapped again, read-only, where it is read."""

    def __init__(self, m: np.memmap) -> None:
        self.filename = os.fspath(m.filename)
        self.offset = int(m.offset)
        self.shape = tuple(int(s) for s in m.shape)
        self.dtype = np.dtype(m.dtype)
        self.ndim = len(self.shape)
        self.order = "F" if m.flags.f_contiguous and not m.flags.c_contiguous else "C"

    def __getitem__(self, selection: Any) -> np.ndarray:
        m = np.memmap(self.filename, dtype=self.dtype, mode="r", offset=self.offset,
                      shape=self.shape, order=self.order)
        return np.array(m[selection])

    def __dask_tokenize__(self) -> Any:
        return ("src_dask.MemmapSource", self.filename, _mtime(self.filename), self.offset,
                self.shape, self.dtype.str, self.order)


class H5Source:
    """An h5py dataset by file and dataset name (an open dataset cannot be pickled),
    opened again, read-only, where it is read."""

    def __init__(self, d: Any) -> None:
        self.filename = os.path.abspath(d.file.filename)
        self.name = d.name
        self.shape = tuple(int(s) for s in d.shape)
        self.dtype = np.dtype(d.dtype)
        self.ndim = len(self.shape)

    def __getitem__(self, selection: Any) -> np.ndarray:
        import h5py

        with h5py.File(self.filename, "r") as f:
            return np.asarray(f[self.name][selection])

    def __dask_tokenize__(self) -> Any:
        return ("src_dask.H5Source", self.filename, _mtime(self.filename), self.name,
                self.shape, self.dtype.str)


class ArraySource:
    """An object with ``shape``, ``dtype`` and ``__array__`` but no ``__getitem__``,
    made sliceable (it is read whole)."""

    def __init__(self, x: Any) -> None:
        self.x = x
        self.shape = tuple(int(s) for s in x.shape)
        self.dtype = np.dtype(x.dtype)
        self.ndim = len(self.shape)

    def __getitem__(self, selection: Any) -> np.ndarray:
        return np.asarray(self.x)[selection]


def readable(x: Any) -> bool:
    """Whether ``x`` can be read as an input core: it has ``__getitem__`` or
    ``__array__`` besides its shape and dtype."""
    return hasattr(x, "__getitem__") or hasattr(x, "__array__")


def source(x: Any) -> Any:
    """``x`` as something a read task reads whole and that travels to workers
    cheaply."""
    if isinstance(x, np.memmap):
        return MemmapSource(x)
    if _is_h5py(x):
        return H5Source(x)
    if not hasattr(x, "__getitem__"):
        return ArraySource(x)
    return x


def token(x: Any) -> str:
    """A token that stays the same for the same stored data: a memmap or an h5py
    dataset by its file (path and modification time), dataset name, shape and
    dtype (tokenizing the object itself gives a new token each time); anything
    else as Dask tokenizes it."""
    from dask.base import tokenize

    if isinstance(x, np.memmap) or _is_h5py(x):
        return tokenize(source(x))
    return tokenize(x)


def _is_h5py(x: Any) -> bool:
    return type(x).__module__.startswith("h5py")


def _mtime(path: str) -> int | None:
    try:
        return os.stat(path).st_mtime_ns
    except OSError:
        return None
