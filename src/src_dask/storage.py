"""Trains on disk: one Zarr v3 group per train, one array per site.

Layout of a saved train::

    path/                   zarr group, attributes:
        format   "src_dask.train"   version  1
        kind     "mps" | "mpo"      sites    n
        layout   "lrp" | "lrud"     (end sites drop the missing bond)
    path/site_0 … site_{n-1}        the cores, chunked so no chunk exceeds
                                    ``max_chunk_bytes`` (default 256 MiB)

:func:`open` gives a TensorTrain of Dask arrays over these arrays: nothing is
read until a core is computed, so opening a 50 GB train costs no memory.
"""

from __future__ import annotations

import math
import os
from typing import Any

import dask.array as da
import numpy as np

from .trains import TensorTrain, _to_numpy, as_train

FORMAT = "src_dask.train"
VERSION = 1
MAX_CHUNK_BYTES = 256 * 2**20


def _zarr():
    import zarr

    return zarr


def chunks_for(shape: tuple[int, ...], itemsize: int,
               max_bytes: int = MAX_CHUNK_BYTES) -> tuple[int, ...]:
    """Chunk shape for ``shape`` that keeps a chunk under ``max_bytes``.

    Halves the longest axis until the chunk fits; in a core that is a bond
    axis, so the (small) physical legs stay whole in every chunk.
    """
    chunks = list(shape)
    while math.prod(chunks) * itemsize > max_bytes and max(chunks) > 1:
        i = chunks.index(max(chunks))
        chunks[i] = math.ceil(chunks[i] / 2)
    return tuple(chunks)


def save(train: Any, path: str | os.PathLike, chunks: tuple[int, ...] | None = None, *,
         max_chunk_bytes: int = MAX_CHUNK_BYTES, overwrite: bool = False) -> None:
    """Write ``train`` to a Zarr v3 group at ``path`` (see the module docstring).

    ``chunks`` fixes the chunk shape of every middle site (end sites drop the
    missing bond axis); by default each core is chunked to stay under
    ``max_chunk_bytes``. Dask cores are written block by block without being
    gathered in memory.
    """
    zarr = _zarr()
    tt = as_train(train)
    path = os.fspath(path)
    if not overwrite and os.path.exists(path) and (not os.path.isdir(path) or os.listdir(path)):
        raise FileExistsError(f"{path}: already exists; pass overwrite=True to replace it")
    group = zarr.open_group(path, mode="w")
    n = len(tt)
    group.attrs.update({"format": FORMAT, "version": VERSION, "kind": tt.kind, "sites": n,
                        "layout": "lrp" if tt.kind == "mps" else "lrud"})
    for j, core in enumerate(tt):
        dtype = np.dtype(core.dtype)
        if chunks is not None:
            c = list(chunks)
            if j == n - 1:
                c.pop(1)
            if j == 0:
                c.pop(0)
            c = tuple(min(a, b) for a, b in zip(c, core.shape, strict=True))
        else:
            c = chunks_for(tuple(core.shape), dtype.itemsize, max_chunk_bytes)
        arr = group.create_array(f"site_{j}", shape=core.shape, dtype=dtype, chunks=c,
                                 compressors=None)
        if isinstance(core, da.Array):
            # into a pre-created array: da.to_zarr with shards can lose data
            da.store(core.rechunk(c), arr, lock=False)
        else:
            arr[...] = _to_numpy(core)


def open(path: str | os.PathLike) -> TensorTrain:  # noqa: A001 - mirrors zarr.open
    """The train saved at ``path`` as a TensorTrain of lazy Dask arrays."""
    zarr = _zarr()
    path = os.fspath(path)
    try:
        group = zarr.open_group(path, mode="r")
    except (FileNotFoundError, zarr.errors.GroupNotFoundError) as err:
        raise FileNotFoundError(f"{path}: no saved train here") from err
    attrs = dict(group.attrs)
    if attrs.get("format") != FORMAT:
        raise ValueError(f"{path}: not a src_dask train (format {attrs.get('format')!r})")
    if attrs.get("version", 0) > VERSION:
        raise ValueError(f"{path}: train format version {attrs['version']} is newer than "
                         f"this src_dask understands ({VERSION})")
    arrays = [group[f"site_{j}"] for j in range(attrs["sites"])]
    return TensorTrain([da.from_zarr(a) for a in arrays], attrs["kind"], name=path,
                       sources=arrays)
