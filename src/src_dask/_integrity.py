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
import os
import sys
from collections.abc import Callable
from typing import Any

import numpy as np

from .errors import DamagedDataError

#: Largest chunk of an array src_dask writes (a core, an environment), in bytes.
MAX_CHUNK_BYTES = 256 * 2**20


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


def array_options(dtype: Any) -> dict[str, Any]:
    """Keyword arguments of ``zarr.Group.create_array`` for a verifiable array."""
    from zarr.codecs import Crc32cCodec

    dtype = np.dtype(dtype)
    fill = np.nan if dtype.kind in "fc" else 0
    return {"dtype": dtype, "compressors": [Crc32cCodec()], "fill_value": fill,
            "config": {"write_empty_chunks": True}}


def create(group: Any, name: str, shape: tuple[int, ...], dtype: Any,
           chunks: tuple[int, ...], overwrite: bool = False,
           dimension_names: tuple[str, ...] | None = None) -> Any:
    """A new verifiable array ``name`` in ``group``, its axes named (Zarr's
    ``dimension_names``: what xarray reads as dimensions) — by default
    ``{name}_dim_{i}``, so that every array src_dask writes has them."""
    if dimension_names is None:
        base = name.replace("/", "_")
        dimension_names = tuple(f"{base}_dim_{i}" for i in range(len(shape)))
    return group.create_array(name, shape=tuple(shape), chunks=tuple(chunks),
                              overwrite=overwrite, dimension_names=tuple(dimension_names),
                              **array_options(dtype))


def consolidate(path: str, group: str | None = None) -> None:
    """Consolidate the metadata of the group at ``path`` (or its subgroup ``group``), so
    that it opens in one read (xarray looks for it). Zarr warns that consolidated
    metadata is not in the v3 spec yet, and about files of ours (a run store's lock)
    in the hierarchy: neither concerns the reader, so both are silenced here."""
    import warnings

    import zarr

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        zarr.consolidate_metadata(path, path=group)


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
    if selection is Ellipsis and _chunk_dir(arr) is not None:
        return _checked(_read_files(arr, what, out), what, finite)
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
    return _checked(data, what, finite)


def _checked(data: np.ndarray, what: str, finite: bool) -> np.ndarray:
    """``data``, once (``finite``) it is known to hold no NaN or inf."""
    # a NaN or inf makes the sum non-finite: one pass, no temporary the size of the data
    # (only a non-finite or overflowing sum is looked at element by element)
    if finite and data.dtype.kind in "fc" and not np.isfinite(data.sum()) \
            and not np.isfinite(data).all():
        raise DamagedDataError(f"{what}: holds NaN or inf; stored data is never NaN, so a "
                               "chunk is damaged or was edited")
    return data


# -- whole arrays straight from their chunk files -------------------------------------------
# Zarr's reader decodes on its own event loop and copies every chunk into the output on
# that one thread, which bounds pass 1 on a GPU (docs/design.md §6 has the rates). The
# arrays src_dask writes have the simplest layout Zarr has (raw little-endian bytes and a
# CRC32C per chunk file), so a whole array on a local file system is read here instead, in
# the calling thread, with the same checks: several threads then read side by side.
def _chunk_dir(arr: Any) -> str | None:
    """The directory of ``arr``'s chunk files when it can be read from them directly:
    config ``direct-reads``, a local store, a regular grid, and exactly the codecs
    src_dask writes (bytes, little-endian, then crc32c). None otherwise."""
    from . import config

    if not config.get("direct-reads"):
        return None
    try:
        # judged by the metadata's JSON (the Zarr v3 format), not by zarr-python's classes,
        # which change between releases (3.4 renamed the chunk grid's, and direct reads
        # silently stopped on the GPU machine)
        meta = arr.metadata.to_dict()
        codecs = [c if isinstance(c, dict) else c.to_dict() for c in meta["codecs"]]
        grid = meta["chunk_grid"]
        grid = grid if isinstance(grid, dict) else grid.to_dict()
        endian = (codecs[0].get("configuration") or {}).get("endian") if codecs else None
        root = getattr(arr.store, "root", None)
        if (type(arr.store).__name__ != "LocalStore" or root is None
                or [c["name"] for c in codecs] != ["bytes", "crc32c"]
                or endian not in ("little", None) or grid.get("name") != "regular"
                or np.dtype(arr.dtype).byteorder == ">" or sys.byteorder != "little"):
            return None
        return os.path.join(os.fspath(root), arr.store_path.path)
    except Exception:  # noqa: BLE001 - any other kind of array: Zarr reads it
        return None


def _read_files(arr: Any, what: str, out: np.ndarray | None) -> np.ndarray:
    """The whole of ``arr`` from its chunk files, each checked against its CRC32C; a
    missing, short or altered file is a :class:`DamagedDataError`."""
    base = _chunk_dir(arr)
    shape, chunks = tuple(arr.shape), tuple(arr.chunks)
    dtype = np.dtype(arr.dtype).newbyteorder("=")
    if out is None or out.shape != shape or out.dtype != dtype or not out.flags.c_contiguous:
        out = np.empty(shape, dtype)
    nbytes = math.prod(chunks) * dtype.itemsize
    buffer = None
    grid = [range(math.ceil(n / c)) for n, c in zip(shape, chunks, strict=True)]
    for coords in itertools.product(*grid):
        path = os.path.join(base, arr.metadata.encode_chunk_key(coords))
        if chunks == shape:  # one chunk: straight into the output
            _read_chunk(path, out.reshape(-1).view(np.uint8), what, coords)
            continue
        if buffer is None:
            buffer = np.empty(nbytes, np.uint8)
        _read_chunk(path, buffer, what, coords)
        region = tuple(slice(i * c, min((i + 1) * c, n))
                       for i, c, n in zip(coords, chunks, shape, strict=True))
        inner = tuple(slice(0, r.stop - r.start) for r in region)
        out[region] = buffer.view(dtype).reshape(chunks)[inner]
    return out


#: Bytes checksummed per call by google_crc32c, which holds the GIL while it runs (tens of
#: milliseconds for a whole core): a few MB a call let the worker's event loop and the
#: threads launching kernels in between.
_CRC_STEP = 4 << 20


def _crc32c_gil_free() -> Any:
    """``crc32c.crc32c`` where the ``crc32c`` package is installed (the ``gpu`` extra):
    it releases the GIL while it checksums, so a worker's reading threads check their
    chunks side by side; None otherwise (google_crc32c, which Zarr brings, holds it:
    one thread's checksum at a time, seconds of every pass 1 of the reference stacks,
    docs/design.md §7, "Reads")."""
    try:
        from crc32c import crc32c
    except ImportError:
        return None
    return crc32c


def _crc32c(data: np.ndarray) -> int:
    """The CRC32C of ``data``'s bytes."""
    flat = data.reshape(-1).view(np.uint8)
    gil_free = _crc32c_gil_free()
    if gil_free is not None:
        return int(gil_free(flat))
    import google_crc32c

    crc = 0
    for start in range(0, flat.size, _CRC_STEP):
        crc = google_crc32c.extend(crc, flat[start:start + _CRC_STEP])
    return crc


def _read_chunk(path: str, target: np.ndarray, what: str, coords: tuple[int, ...]) -> None:
    """Chunk file ``path`` into ``target`` (its bytes without the checksum), checked."""
    try:
        with open(path, "rb", buffering=0) as f:
            view, got = memoryview(target), 0
            while got < len(view):
                n = f.readinto(view[got:])
                if not n:
                    break
                got += n
            tail = f.read(5)
    except FileNotFoundError:
        raise DamagedDataError(f"{what}: chunk {_coords(coords)} is missing; the file was "
                               "deleted or never written") from None
    except OSError as err:
        raise DamagedDataError(f"{what}: a chunk is damaged and cannot be read (chunk "
                               f"{_coords(coords)}: {err})") from err
    if got != len(target) or len(tail) != 4:
        raise DamagedDataError(f"{what}: a chunk is damaged and cannot be read (chunk "
                               f"{_coords(coords)} has {got + len(tail)} bytes, expected "
                               f"{len(target) + 4})")
    if _crc32c(target) != int.from_bytes(tail, "little"):
        raise DamagedDataError(f"{what}: a chunk is damaged and cannot be read (chunk "
                               f"{_coords(coords)}: its CRC32C checksum does not match)")


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
