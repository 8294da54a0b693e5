"""Page-locked host memory made without holding the CUDA driver.

``cudaHostAlloc`` (what CuPy's pinned pool calls) allocates and zeroes its pages
with the driver's lock held: every other CUDA call of the process waits meanwhile,
the worker's event loop among them as it frees device memory (``cudaFreeAsync``),
so each new block of a GPU worker's reads stalled the loop (docs/design.md §7,
"Stalls"). Here the pages come from ``mmap`` (transparent huge pages where the
kernel offers them), are faulted in by the allocating thread outside the driver
and the GIL (``madvise(MADV_POPULATE_WRITE)`` through ctypes), and only then
page-locked by ``cudaHostRegister``, which holds the driver briefly. Blocks are
pooled for the worker's life, in sizes rounded to huge pages, so the sites of
one run and the calls after it reuse them; a block is made outside the pool's
lock, so one thread's new block does not hold up another's reuse.

Config ``src_dask.pinned-memory: registered`` chooses this; by default (``cupy``),
elsewhere than on Linux, and where CUDA refuses to register host memory, CuPy's own
pinned pool serves (:func:`empty`).
"""

from __future__ import annotations

import ctypes
import logging
import mmap
import sys
import threading
from collections import defaultdict
from typing import Any

import numpy as np

from . import config

log = logging.getLogger("src_dask")

_MADV_HUGEPAGE = 14
_MADV_POPULATE_WRITE = 23  # Linux 5.14 and later; older kernels: touched page by page
_HOST_REGISTER_PORTABLE = 1  # cudaHostRegisterPortable: pinned for every CUDA context
#: Block sizes are rounded up to this (a transparent huge page) from this size on.
_HUGE = 2 << 20

_libc: Any = None


def _lib() -> Any:
    """The C library's mmap, munmap and madvise, typed (ctypes drops the GIL in them)."""
    global _libc
    if _libc is None:
        lib = ctypes.CDLL(None, use_errno=True)
        lib.mmap.restype = ctypes.c_void_p
        lib.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int,
                             ctypes.c_int, ctypes.c_long]
        lib.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
        lib.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
        _libc = lib
    return _libc


class Block:
    """``size`` bytes of anonymous memory at ``ptr``, faulted in, then page-locked by
    ``register`` (CUDA's ``hostRegister``; ``unregister`` undoes it when the block is
    collected)."""

    def __init__(self, size: int, register: Any, unregister: Any) -> None:
        lib = _lib()
        ptr = lib.mmap(None, size, mmap.PROT_READ | mmap.PROT_WRITE,
                       mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS, -1, 0)
        if ptr is None or ptr == ctypes.c_void_p(-1).value:
            raise MemoryError(f"could not map {size} bytes of host memory to pin")
        self.ptr, self.size, self._unregister = 0, size, None
        try:
            lib.madvise(ptr, size, _MADV_HUGEPAGE)  # a hint, ignored where THP is off
            if lib.madvise(ptr, size, _MADV_POPULATE_WRITE) != 0:
                if ctypes.get_errno() == 12:  # ENOMEM
                    raise MemoryError(f"no host memory for {size} bytes to pin")
                _touch(ptr, size)
            register(ptr, size, _HOST_REGISTER_PORTABLE)
        except BaseException:
            lib.munmap(ptr, size)
            raise
        self.ptr, self._unregister = ptr, unregister

    def __del__(self) -> None:
        if self.ptr:
            try:
                self._unregister(self.ptr)
                _lib().munmap(self.ptr, self.size)
            except Exception:  # noqa: BLE001 - the process, or CUDA, is going away
                pass
            self.ptr = 0


def _touch(ptr: int, size: int) -> None:
    """Fault in every page of ``ptr`` (where ``MADV_POPULATE_WRITE`` is not known)."""
    pages = np.frombuffer((ctypes.c_uint8 * size).from_address(ptr), np.uint8)
    pages[::mmap.PAGESIZE] = 0


class Lease:
    """A pooled block lent out (``ptr``, ``size``: what CuPy's ``PinnedMemoryPointer``
    asks of its memory); the block goes back to its pool when this is collected."""

    def __init__(self, block: Block, pool: Pool) -> None:
        self.block, self.ptr, self.size, self._pool = block, block.ptr, block.size, pool

    def __del__(self) -> None:
        self._pool.give_back(self.block)


class Pool:
    """Blocks of ``make(size)`` kept by size: a request takes a free block of its
    rounded size, or has a new one made outside the lock."""

    def __init__(self, make: Any) -> None:
        self._make = make
        self._free: dict[int, list[Block]] = defaultdict(list)
        # reentrant: a lease collected while this thread holds the lock (the cyclic
        # collector runs at any allocation, a list made here included) gives its block
        # back through the same lock; a plain Lock would deadlock the thread
        self._lock = threading.RLock()
        self.made = 0  # blocks made, for the benchmarks' and the tests' counts

    def lend(self, nbytes: int) -> Lease:
        size = _rounded(nbytes)
        with self._lock:
            free = self._free[size]
            block = free.pop() if free else None
        if block is None:
            if _available() < size + _HEADROOM:  # the spare blocks go first, as CuPy's do
                self.free_blocks()
                if _available() < size + _HEADROOM:
                    raise MemoryError(f"no host memory to pin {size} bytes (the kernel "
                                      "would kill the worker rather than refuse)")
            block = self._make(size)
            with self._lock:
                self.made += 1
        return Lease(block, self)

    def give_back(self, block: Block) -> None:
        with self._lock:
            self._free[block.size].append(block)

    def free_blocks(self) -> None:
        """Let go of the blocks not lent out (unregistered and unmapped)."""
        with self._lock:
            self._free.clear()


#: Host memory left to the rest of the system when a block is made.
_HEADROOM = 1 << 30


def _available() -> int:
    """Bytes of memory the kernel can give without swapping (``MemAvailable``): faulting
    in pages past it invokes the OOM killer, where ``cudaHostAlloc`` failed and let
    CuPy's pool free its spare blocks."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 1 << 62  # not known: not checked


def _rounded(nbytes: int) -> int:
    """``nbytes`` rounded up to pages, and to huge pages from one huge page on."""
    unit = _HUGE if nbytes >= _HUGE else mmap.PAGESIZE
    return max(unit, -(-nbytes // unit) * unit)


_pool: Pool | None = None
_pool_lock = threading.Lock()
#: Whether registering host memory failed here once (CuPy's pinned pool serves since).
_cupys = False


def pool() -> Pool:
    """This process's pool of pinned blocks (made at first use)."""
    global _pool
    with _pool_lock:
        if _pool is None:
            from cupy.cuda import runtime

            _pool = Pool(lambda size: Block(size, runtime.hostRegister,
                                            runtime.hostUnregister))
        return _pool


def empty(shape: tuple[int, ...], dtype: Any) -> np.ndarray:
    """A C-contiguous NumPy array in page-locked memory (its ``base`` a CuPy
    ``PinnedMemoryPointer``, as ``cupyx.empty_pinned`` gives)."""
    global _cupys
    if (_cupys or not sys.platform.startswith("linux")
            or config.get_choice("pinned-memory", ("cupy", "registered")) == "cupy"):
        import cupyx

        return cupyx.empty_pinned(shape, dtype)
    import cupy

    dtype = np.dtype(dtype)
    nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    try:
        lease = pool().lend(nbytes)
    except cupy.cuda.runtime.CUDARuntimeError as err:
        if err.status == getattr(cupy.cuda.runtime, "errorMemoryAllocation", 2):
            raise MemoryError(f"could not page-lock {nbytes} bytes: {err}") from err
        log.warning("src_dask: pinned buffers from CuPy's pool from now on: registering "
                    "host memory with CUDA failed (%s)", err)
        _cupys = True
        return empty(shape, dtype)
    return np.ndarray(shape, dtype, buffer=cupy.cuda.PinnedMemoryPointer(lease, 0))


def free_blocks() -> None:
    """Give the pooled blocks not in use back to the system (after an out-of-memory)."""
    if _pool is not None:
        _pool.free_blocks()
