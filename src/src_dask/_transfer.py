"""Host↔device copies that run beside the kernels instead of stalling them.

A plain ``cupy.asarray(numpy_array)`` or ``.get()`` copies pageable memory on
the stream the kernels use (2–7 GB/s on the H200, docs/design.md §6), and the GPU
waits for it. Here each worker thread copies through a pinned staging buffer
(25–55 GB/s) on a stream of its own; the kernels' stream waits only for the
copy it needs (a device-side event), so reading site ``j+1`` overlaps the
contractions of site ``j`` and results leave the GPU while pass 2 goes on.
"""

from __future__ import annotations

import threading
from typing import Any

import numpy as np

#: Below this size a plain device-to-host copy is cheaper than a stream and a staging buffer.
_SMALL = 1 << 20

_local = threading.local()


def is_cupy(x: Any) -> bool:
    """Whether ``x`` is a CuPy array (without importing CuPy)."""
    return type(x).__module__.startswith("cupy")


def _copy_stream() -> Any:
    """This thread's copy stream (non-blocking: it never waits for the kernels' stream)."""
    import cupy

    stream = getattr(_local, "stream", None)
    if stream is None:
        stream = _local.stream = cupy.cuda.Stream(non_blocking=True)
    return stream


def task_stream() -> Any:
    """This thread's stream for the kernels of tasks that must not be waited for by
    others' synchronisations of the default stream (non-blocking, see
    ``SweepPlan.own_streams``)."""
    import cupy

    stream = getattr(_local, "kernels", None)
    if stream is None:
        stream = _local.kernels = cupy.cuda.Stream(non_blocking=True)
    return stream


def to_device(x: Any) -> Any:
    """``x`` as a CuPy array; a NumPy array goes through pinned memory on this
    thread's copy stream, and nothing waits on the host for the copy."""
    import cupy

    if not isinstance(x, np.ndarray):
        return cupy.asarray(x)
    kernels = cupy.cuda.get_current_stream()
    out = cupy.empty(x.shape, x.dtype)  # from the kernels' stream's pool
    if _is_pinned(x):  # read into pinned memory already (``empty_pinned``)
        staging = x
    else:
        staging = empty_pinned(x.shape, x.dtype)
        np.copyto(staging, x)
    stream = _copy_stream()
    # ``out`` may reuse memory that queued kernels still read: copy after them
    stream.wait_event(kernels.record())
    out.set(staging, stream=stream)
    done = stream.record()
    kernels.wait_event(done)
    _keep_until(done, staging)
    return out


def empty_pinned(shape: tuple[int, ...], dtype: Any) -> np.ndarray:
    """A NumPy array in page-locked memory from CuPy's pinned pool, to read into
    and then hand to :func:`to_device` without another copy."""
    import cupyx

    return cupyx.empty_pinned(shape, dtype)


def _is_pinned(x: np.ndarray) -> bool:
    """Whether ``x`` is C-contiguous in page-locked memory from :func:`empty_pinned`
    (the array itself or a view of it)."""
    import cupy

    return isinstance(x.base, cupy.cuda.PinnedMemoryPointer) and x.flags.c_contiguous


def _keep_until(event: Any, staging: np.ndarray) -> None:
    """Hold ``staging`` until ``event`` (its copy) has happened: a pageable copy,
    or a host synchronisation, would stall the kernels' stream instead."""
    pending = getattr(_local, "pending", None)
    if pending is None:
        pending = _local.pending = []
    pending[:] = [(e, s) for e, s in pending if not e.done]
    pending.append((event, staging))


def to_host(x: Any) -> np.ndarray:
    """``x`` (NumPy or CuPy) as a NumPy array; a large CuPy array is copied on
    this thread's copy stream through pinned memory, after the kernels that
    produce it and without holding up the ones queued after them."""
    if isinstance(x, np.ndarray) or not is_cupy(x):
        return np.asarray(x)
    import cupy

    if x.nbytes < _SMALL:
        return x.get()
    x = cupy.ascontiguousarray(x)
    stream = _copy_stream()
    stream.wait_event(cupy.cuda.get_current_stream().record())
    staging = empty_pinned(x.shape, x.dtype)
    x.get(stream=stream, out=staging)  # blocks this thread until the copy is done
    return np.array(staging)
