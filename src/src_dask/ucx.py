"""Dask's UCX comm waiting for the default CUDA stream instead of the whole device.

Public so that a benchmark or a user comparing the two waits can switch it
(:func:`ucx_waits_for_default_stream`); src_dask's runs switch it themselves.

distributed-ucxx's comm synchronizes the device (``cudaDeviceSynchronize``, on the
worker's event loop) before it sends GPU data and after it receives them, though its
own comment asks only for the default stream: a transfer then waits for every kernel
the worker's other threads queued, and so does every message of that worker meanwhile
(transfers inside a run then ran tens of times slower than over the idle link:
docs/design.md §7, "Multi-GPU over Dask", has the measurements).
While a run of several GPU workers goes on (:func:`ucx_waits_for_default_stream`),
src_dask replaces that wait on each worker by one for the default stream.

Upstream change that would retire this module: distributed-ucxx's
``synchronize_stream`` waiting for the default (or the sending task's) stream, e.g.
``cupy.cuda.Stream.null.synchronize()`` or an event recorded where the data were
made, instead of ``numba.cuda.synchronize()``.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from typing import Any

log = logging.getLogger("src_dask")


#: The workers' count of the default-stream waits made for Dask's UCX comm (the tests
#: read it to see that transfers took this path).
stream_syncs = 0


def _default_stream_sync(*_: Any) -> None:
    """Wait for the work queued on the default CUDA stream of this thread's device (and
    for nothing on non-blocking streams): what Dask's UCX comm says it needs before it
    sends GPU data and after it receives them."""
    global stream_syncs
    import cupy

    cupy.cuda.Stream.null.synchronize()
    stream_syncs += 1


def _ucx_sync(change: int) -> bool:
    """On a worker: one run more (+1) or fewer (-1) that wants Dask's UCX comm to wait
    for the default stream only; the comm's own wait (the whole device) is back once
    no run wants that. False where the worker has no UCX comm (distributed-ucxx)."""
    try:
        from distributed_ucxx import ucxx as comm
    except ImportError:
        return False
    if not hasattr(comm, "_src_dask_runs"):
        comm._src_dask_original_sync = comm.synchronize_stream
        comm._src_dask_runs = 0
    comm._src_dask_runs = max(0, comm._src_dask_runs + change)
    comm.synchronize_stream = (_default_stream_sync if comm._src_dask_runs
                               else comm._src_dask_original_sync)
    return True


@contextlib.contextmanager
def ucx_waits_for_default_stream(client: Any, on: bool) -> Iterator[None]:
    """While the block runs (``on``: ``_plan.stream_sync`` decided it), the workers'
    UCX comm waits for the default stream before it sends GPU data and after it
    receives them, instead of for the whole device.

    distributed-ucxx waits with ``cudaDeviceSynchronize`` on the worker's event loop,
    though its comment asks only for the default stream: a transfer then waits for
    every kernel the worker's other threads queued, and so does every message of that
    worker meanwhile (transfers inside a run tens of times slower than over the idle link,
    docs/design.md §7). src_dask's tasks on several GPU workers run their kernels on a
    non-blocking stream of their own and wait for them before they end, so the data
    they hand to Dask are complete; the default stream covers Dask's own (RMM's
    allocations, dask-cuda's unspilling)."""
    if not on:
        yield
        return
    client.run(_ucx_sync, 1)
    try:
        yield
    finally:
        try:
            client.run(_ucx_sync, -1, on_error="ignore")
        except Exception as err:  # noqa: BLE001 - a closed client must not hide the run's end
            log.warning("src: the workers' UCX comm keeps waiting for the default stream "
                        "only (could not reach them to undo it: %s)", err)
