"""Host↔device copies that run beside the kernels instead of stalling them.

A plain ``cupy.asarray(numpy_array)`` or ``.get()`` copies pageable memory on
the stream the kernels use, at a fraction of the link's rate (docs/design.md §6), and
the GPU waits for it. Here each worker thread copies through a pinned staging buffer
on a stream of its own; the kernels' stream waits only for the
copy it needs (a device-side event), so reading site ``j+1`` overlaps the
contractions of site ``j`` and results leave the GPU while pass 2 goes on.
"""

from __future__ import annotations

import contextlib
import os
import sys
import tempfile
import threading
import time
from typing import Any, NamedTuple

import dask
import numpy as np

from . import _pinned

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


#: How often :func:`wait_for` asks whether the GPU has got there: every ``_POLL_S[0]`` s
#: for the first ``_FINE_S`` s of a wait, then less and less often, down to every
#: ``_POLL_S[1]`` s (a short wait costs little latency — a site of a small run waits a
#: few times for a few ms — and a long one its threads' neighbours few wake-ups).
_POLL_S = (2e-5, 1e-3)
_FINE_S = 2e-3


def wait_for(stream: Any = None, event: Any = None) -> None:
    """Return once the work queued so far on ``stream`` (this thread's current one by
    default) has run, or, given ``event``, the work queued before it was recorded.
    Beside a Dask worker's event loop, by asking a CUDA event (:data:`_POLL_S`)
    instead of a blocking wait (``cudaStreamSynchronize``, a synchronous copy); the
    asks grow sparser once the wait has lasted ``_FINE_S``. This thread then holds
    neither the GIL nor the CUDA driver in the wait, whatever the driver's scheduling
    flags: the loop, which frees device memory as data are released, goes on
    meanwhile (docs/design.md §7, "Stalls"). With no worker in the process (an
    in-process run) nothing waits for the driver but the run's own threads, and a
    blocking wait returns soonest."""
    import cupy

    stream = stream or cupy.cuda.get_current_stream()
    if not _beside_an_event_loop():
        (stream if event is None else event).synchronize()
        return
    event = event or stream.record()
    delay, longest = _POLL_S
    fine_until = time.perf_counter() + _FINE_S
    while not event.done:
        time.sleep(delay)
        if time.perf_counter() > fine_until:
            delay = min(2 * delay, longest)


#: Runs that are one task of this process's worker (:func:`alone_on_the_worker`).
_alone = 0
_alone_lock = threading.Lock()


@contextlib.contextmanager
def alone_on_the_worker() -> Any:
    """While a whole run is one task here (``_graph.compute_here``): its data never
    leave the task, so the worker's event loop frees none of its device memory, and
    its waits block (:func:`wait_for`), as an in-process run's do."""
    global _alone
    with _alone_lock:
        _alone += 1
    try:
        yield
    finally:
        with _alone_lock:
            _alone -= 1


def _beside_an_event_loop() -> bool:
    """Whether a Dask worker lives in this process (its event loop, which blocking
    waits in the driver would hold up: :func:`wait_for`) and is not given over to a
    run that is one task (:func:`alone_on_the_worker`)."""
    distributed = sys.modules.get("distributed")
    return (not _alone and distributed is not None
            and bool(getattr(distributed.Worker, "_instances", True)))


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
    """A NumPy array in page-locked memory from this process's pool of pinned blocks
    (:mod:`._pinned`), to read into and then hand to :func:`to_device` without another
    copy. The buffers whose copies have run go back to the pool first
    (:func:`_keep_until`), so that this one reuses them rather than pinning more."""
    _release_copied()
    return _pinned.empty(shape, dtype)


def _is_pinned(x: np.ndarray) -> bool:
    """Whether ``x`` is C-contiguous in page-locked memory from :func:`empty_pinned`
    (the array itself or a view of it)."""
    import cupy

    return isinstance(x.base, cupy.cuda.PinnedMemoryPointer) and x.flags.c_contiguous


#: Staging buffers and the events of their copies (:func:`_keep_until`), the worker's
#: threads' together: any thread's next pinned allocation or copy lets go of those
#: copied (a list per thread kept each thread's last one until that thread copied again).
_pending: list[tuple[Any, np.ndarray]] = []
_pending_lock = threading.Lock()


def _keep_until(event: Any, staging: np.ndarray) -> None:
    """Hold ``staging`` until ``event`` (its copy) has happened: a pageable copy,
    or a host synchronisation, would stall the kernels' stream instead."""
    with _pending_lock:
        _pending.append((event, staging))
    _release_copied()


def _release_copied() -> None:
    """Let go of the staging buffers whose copies have run (back to the pool of ``_pinned``)."""
    with _pending_lock:
        _pending[:] = [(e, s) for e, s in _pending if not e.done]


def to_host(x: Any) -> np.ndarray:
    """``x`` (NumPy or CuPy) as a NumPy array; a large CuPy array is copied on
    this thread's copy stream through pinned memory, after the kernels that
    produce it and without holding up the ones queued after them."""
    if isinstance(x, np.ndarray) or not is_cupy(x):
        return np.asarray(x)
    if x.nbytes < _SMALL:
        return x.get()
    return np.array(_pinned_copy(x))


def staged(x: Any) -> np.ndarray:
    """``x`` in host memory, C-contiguous, to be written elsewhere from there: a large
    CuPy array in a pinned staging buffer (no pageable copy), a NumPy one as it is."""
    if is_cupy(x) and x.nbytes >= _SMALL:
        return _pinned_copy(x)
    return np.ascontiguousarray(to_host(x))


def _pinned_copy(x: Any) -> np.ndarray:
    """A CuPy array's copy in pinned host memory, made on this thread's copy stream after
    the kernels that produce it (this thread waits for it; the queued kernels do not)."""
    import cupy

    x = cupy.ascontiguousarray(x)
    stream = _copy_stream()
    stream.wait_event(cupy.cuda.get_current_stream().record())
    staging = empty_pinned(x.shape, x.dtype)
    try:
        x.get(stream=stream, out=staging, blocking=False)
    except TypeError:  # CuPy before 13 has no ``blocking``: the copy blocks this thread
        x.get(stream=stream, out=staging)
    wait_for(stream)  # this thread waits for the copy; the queued kernels do not
    return staging


# -- disk ------------------------------------------------------------------------------
# Environments that neither the device nor the worker's host memory keeps
# (``Plan.disk_envs``) go to a file of the worker's own directory, written by the
# thread of the task that made them and read back by the thread of the task that
# fetches them ahead of use: Dask's spilling would move them on the worker's
# event loop, where no other transfer or task start happens meanwhile.

#: Prefix of the files written here, with the run's token: what :func:`remove_run`
#: deletes, and nothing else.
_PREFIX = "src_dask-env-"


class OnDisk(NamedTuple):
    """An array written to ``path`` by :func:`to_disk`, read once by :func:`from_disk`."""

    path: str
    shape: tuple[int, ...]
    dtype: str
    nbytes: int


def _directory() -> str:
    """Where this process writes: its Dask worker's own directory (mode 0700, removed
    with the worker), or, under Dask's local scheduler, the temporary directory."""
    try:
        from distributed import get_worker

        return get_worker().local_directory
    except (ImportError, ValueError):
        return dask.config.get("temporary-directory", None) or tempfile.gettempdir()


def to_disk(x: Any, run: str, name: str) -> OnDisk:
    """``x`` (NumPy or CuPy) written to a file of this worker's directory, named after
    the ``run`` token and ``name``; written to a temporary name and renamed, so a file
    under the final name is complete."""
    path = os.path.join(_directory(), f"{_PREFIX}{run}-{name}")
    host = staged(x)
    with _metered("disk-write", host.nbytes), open(path + ".part", "wb") as f:
        f.write(host.reshape(-1).view(np.uint8).data)
    os.replace(path + ".part", path)
    return OnDisk(path, tuple(host.shape), host.dtype.str, host.nbytes)


@contextlib.contextmanager
def _metered(label: str, nbytes: int) -> Any:
    """Time and bytes of a task's own disk traffic in Dask's fine performance metrics
    (the labels of Dask's spilling): the dashboard and ``Worker.digests_total`` count
    them with the task's prefix."""
    from distributed.metrics import context_meter

    with context_meter.meter(label):
        yield
    context_meter.digest_metric(label, nbytes, "bytes")


def from_disk(d: OnDisk, device: bool) -> Any:
    """The array of ``d``, on the device (read into pinned memory, copied on this
    thread's copy stream) or in host memory; the file is removed once read. A missing
    or short file is an error, never zeros."""
    host = empty_pinned(d.shape, d.dtype) if device else np.empty(d.shape, d.dtype)
    view, got = host.reshape(-1).view(np.uint8).data, 0
    try:
        with _metered("disk-read", d.nbytes), open(d.path, "rb") as f:
            while got < d.nbytes and (n := f.readinto(view[got:])):
                got += n
    except FileNotFoundError:
        raise FileNotFoundError(f"{d.path}: an environment written to disk is missing (was "
                                "the worker's directory cleaned during the run?)") from None
    if got != d.nbytes:
        raise OSError(f"{d.path}: an environment written to disk has {got} bytes of "
                      f"{d.nbytes}: it was cut short")
    out = to_device(host) if device else host
    os.remove(d.path)
    return out


def remove_run(run: str, dask_worker: Any = None) -> int:
    """Remove the files :func:`to_disk` wrote in this process's directory for ``run``
    (a run that failed or was cancelled before reading them back); their count.
    ``dask_worker``: the worker, as ``Client.run`` passes it (outside a task there is
    no current worker to ask)."""
    directory = dask_worker.local_directory if dask_worker is not None else _directory()
    removed = 0
    for name in os.listdir(directory):
        if name.startswith(f"{_PREFIX}{run}-"):
            with contextlib.suppress(FileNotFoundError):
                os.remove(os.path.join(directory, name))
                removed += 1
    return removed
