"""Verifiable Zarr arrays: how src_dask creates the arrays it writes and reads them back.

Zarr alone turns damage into plausible numbers: a chunk file that is missing
reads as the fill value (zeros), and a flipped bit in an uncompressed chunk
reads as a slightly different number. So every array src_dask writes

- carries a CRC32C checksum per chunk (Zarr 3's ``crc32c`` codec): a flipped bit
  or a truncated chunk fails to decode;
- writes every chunk, even one equal to the fill value, so that "no chunk file"
  always means "lost", never "all fill";
- has NaN as its fill value (float types), so a chunk lost despite all this
  reads as NaN rather than as zeros.

:func:`read` checks that each chunk it touches exists and decodes (and, where
asked, that the values are finite) and turns each failure into a
:class:`~src_dask.errors.DamagedDataError` that names the array.
:class:`VerifiedArray` is the array-like that Dask reads stored cores through.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable
from typing import Any

import numpy as np

from .errors import DamagedDataError


def array_options(dtype: Any) -> dict[str, Any]:
    """Keyword arguments of ``zarr.Group.create_array`` for a verifiable array."""
    from zarr.codecs import Crc32cCodec

    dtype = np.dtype(dtype)
    fill = np.nan if dtype.kind in "fc" else 0
    return {"dtype": dtype, "compressors": [Crc32cCodec()], "fill_value": fill,
            "config": {"write_empty_chunks": True}}


def create(group: Any, name: str, shape: tuple[int, ...], dtype: Any,
           chunks: tuple[int, ...], overwrite: bool = False) -> Any:
    """A new verifiable array ``name`` in ``group``."""
    return group.create_array(name, shape=tuple(shape), chunks=tuple(chunks),
                              overwrite=overwrite, **array_options(dtype))


def is_verifiable(arr: Any) -> bool:
    """Whether ``arr`` carries per-chunk checksums (written by this version)."""
    codecs = getattr(arr.metadata, "codecs", ())
    return any(type(c).__name__ == "Crc32cCodec" for c in codecs)


def _chunk_ranges(arr: Any, selection: Any) -> list[range]:
    """Per axis, the chunk indices that ``selection`` (``...`` or a tuple of slices
    and ints, as src_dask and Dask read) touches."""
    shape, chunks = arr.shape, arr.chunks
    if selection is Ellipsis:
        selection = ()
    if not isinstance(selection, tuple):
        selection = (selection,)
    selection = tuple(s for s in selection if s is not Ellipsis)
    selection += (slice(None),) * (len(shape) - len(selection))
    ranges = []
    for s, n, c in zip(selection, shape, chunks, strict=True):
        if isinstance(s, slice):
            start, stop, _ = s.indices(n)
        else:
            start = int(s) % n if n else 0
            stop = start + 1
        ranges.append(range(start // c, math.ceil(stop / c)) if stop > start else range(0))
    return ranges


def missing_chunks(arr: Any, selection: Any = Ellipsis) -> list[tuple[int, ...]]:
    """Grid coordinates of the chunks under ``selection`` that have no stored chunk."""
    from zarr.core.sync import sync

    missing = []
    for coords in itertools.product(*_chunk_ranges(arr, selection)):
        key = arr.metadata.encode_chunk_key(coords)
        if not sync((arr.store_path / key).exists()):
            missing.append(coords)
    return missing


def read(arr: Any, selection: Any = Ellipsis, *, what: str, finite: bool = True,
         out: np.ndarray | None = None) -> np.ndarray:
    """``arr[selection]``, verified: every chunk present and intact, and (``finite``)
    no NaN or inf. ``what`` names the array in errors (store, array, site).
    ``out``: a whole-array read into this preallocated host array."""
    lost = missing_chunks(arr, selection)
    if lost:
        raise DamagedDataError(f"{what}: chunk {_coords(lost[0])} is missing "
                               f"({len(lost)} missing); the file was deleted or never written")
    try:
        if out is not None:
            from zarr.core.buffer.cpu import NDBuffer

            arr.get_basic_selection(Ellipsis, out=NDBuffer.from_numpy_array(out))
            data = out
        else:
            data = np.asarray(arr[selection])
    except (MemoryError, KeyboardInterrupt):
        raise
    except Exception as err:  # noqa: BLE001 - any decode failure means damaged data
        raise DamagedDataError(f"{what}: a chunk is damaged and cannot be read "
                               f"({type(err).__name__}: {' '.join(str(err).split())})"
                               ) from err
    # a NaN or inf makes the sum non-finite: one pass, no temporary the size of the data
    # (only a non-finite or overflowing sum is looked at element by element)
    if finite and data.dtype.kind in "fc" and not np.isfinite(data.sum()) \
            and not np.isfinite(data).all():
        raise DamagedDataError(f"{what}: holds NaN or inf; stored data is never NaN, so a "
                               "chunk is damaged or was edited")
    return data


def _coords(coords: tuple[int, ...]) -> str:
    return "(" + ", ".join(str(c) for c in coords) + ")"


class VerifiedArray:
    """A stored array that Dask reads through :func:`read` (``da.from_array``).

    ``guard`` (picklable, called before every read) raises when the array's
    container was replaced since it was opened (a run store reused by another run,
    a train saved over), so a lazy result never reads someone else's data.
    """

    def __init__(self, array: Any, what: str, guard: Callable[[], None] | None = None,
                 finite: bool = True) -> None:
        self.array = array
        self.what = what
        self.guard = guard
        self.finite = finite

    shape = property(lambda self: tuple(self.array.shape))
    dtype = property(lambda self: np.dtype(self.array.dtype))
    ndim = property(lambda self: len(self.array.shape))
    chunks = property(lambda self: tuple(self.array.chunks))
    nbytes = property(lambda self: math.prod(self.shape) * self.dtype.itemsize)

    def read(self, selection: Any = Ellipsis, out: np.ndarray | None = None) -> np.ndarray:
        if self.guard is not None:
            self.guard()
        data = read(self.array, selection, what=self.what, finite=self.finite, out=out)
        if self.guard is not None:  # replaced while being read: the data may be mixed
            self.guard()
        return data

    def __getitem__(self, selection: Any) -> np.ndarray:
        return self.read(selection)

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        data = self.read()
        return data if dtype is None else data.astype(dtype)

    def __dask_tokenize__(self) -> Any:
        from dask.base import tokenize

        return ("src_dask.VerifiedArray", tokenize(self.array), self.what)

    def __repr__(self) -> str:
        return f"VerifiedArray({self.what}, shape={self.shape}, dtype={self.dtype})"


def to_dask(v: VerifiedArray) -> Any:
    """A Dask array over ``v``, chunked as it is stored."""
    import dask.array as da

    return da.from_array(v, chunks=v.chunks, asarray=False, name=f"src_read-{da.core.tokenize(v)}")
