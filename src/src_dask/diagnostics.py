"""What a run says about itself: its plan on described GPU workers, for sizing a machine
one does not have, and its log on a stream for a block.

:func:`src_dask.plan` asks the workers of a running cluster what they hold; a machine
that is not lent yet cannot be asked. :func:`described_plan` gives the same
:class:`~src_dask.RunPlan` for GPU workers described by hand (their count, device
memory, the host's memory), with ``src_dask.cluster``'s defaults for what is not said
(device limit, threads per worker). ``benchmarks/tools/plan_reference.py`` sizes the
reference stacks with it on described machines of one, two and four GPUs
(benchmarks/README.md).

:func:`log_to` shows the ``src_dask`` logger's messages (docs/monitoring.md) while a
block runs and leaves the logger as it was (``src-dask run -v``). :func:`memory_events`
counts what running out of memory cost a process (halved steps, spilled bytes, waits,
rescheduled tasks).
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from typing import Any, TextIO

from ._estimate import RunPlan

#: A dask-cuda worker's own resident host memory (CUDA context, libraries), in bytes.
GPU_WORKER_RSS = 3 * 2**30


def described_plan(*trains: Any, chi_out: int, gpus: int, device_memory: int,
                   host_memory: int, device_memory_limit: float | None = None,
                   threads: int = 4, worker_rss: int = GPU_WORKER_RSS) -> RunPlan:
    """The plan of ``src(*trains, chi_out=chi_out)`` on ``gpus`` GPU workers of
    ``device_memory`` bytes each, sharing ``host_memory`` bytes of host memory.

    ``device_memory_limit``: the share of a device at which dask-cuda spills stored
    data to the host (``src_dask.cluster``'s default when None); ``threads``: tasks a
    worker runs at once (also its default). Each worker may keep 60 % of its share of
    the host before spilling to disk, as distributed's ``memory.target``.
    """
    from . import _api, _estimate, _graph, _plan, _runstore
    from ._cluster import DEVICE_MEMORY_LIMIT
    from ._stack import make_stack

    stack = make_stack(tuple(trains))
    host = host_memory // gpus
    fraction = DEVICE_MEMORY_LIMIT if device_memory_limit is None else device_memory_limit
    facts = _plan.Workers(count=gpus, threads=threads, rss=worker_rss, host_limit=host,
                          keep=int(0.6 * host), device_limit=int(fraction * device_memory),
                          device_memory=device_memory, memory=device_memory)
    plan = _api.decide_plan(stack, chi_out, 0, 0.0, None, device="gpu", facts=facts,
                            slots=gpus)
    addresses = [f"ucx://gpu{i}" for i in range(gpus)]
    return _estimate.estimate(
        stack, _plan.SweepPlan.decide(stack, plan, addresses), facts, store=False,
        tasks=_graph.task_count(_graph.build(stack, plan, addresses)),
        store_bytes=_runstore.planned_bytes(stack, plan.sketch),
        product=stack.describe(),
        where=f"{gpus} x GPU of {device_memory / 2**30:.0f} GiB")


def memory_events(reset: bool = False) -> dict[str, float]:
    """What running out of memory has cost in this process (a worker's, through
    ``client.run(memory_events)``): ``halved`` — steps computed in two halves;
    ``spilled_bytes`` — stored data a dask-cuda worker moved to host memory for an
    allocation that met a full device; ``waited_s`` — seconds allocations and copies
    slept waiting for other tasks to free memory; ``turns`` — rows tried again one at
    a time; ``rescheduled`` — tasks that gave all their memory back to run again
    later. Kinds that never happened are absent. ``reset`` starts the counts again.

    A run far below what its plan would like completes, slower; these say where the
    time went (docs/out-of-core.md).

    >>> import src_dask
    >>> from src_dask.diagnostics import memory_events
    >>> _ = memory_events(reset=True)
    >>> mpo, mps = src_dask.problems.random_mpo(6, 2), src_dask.problems.random_mps(6, 3)
    >>> y = src_dask.apply(mpo, mps, chi_out=4, seed=0)
    >>> memory_events()
    {}
    """
    from . import _oom

    return _oom.events(reset)


@contextlib.contextmanager
def log_to(stream: TextIO, prefix: str = "", level: int = logging.INFO) -> Iterator[None]:
    """The ``src_dask`` logger's messages from ``level`` up (at INFO: what each run does)
    on ``stream`` while the block runs, each line ``prefix`` first. After the block the
    logger is as it was, its level restored and no handler left behind (on a stream
    that may since be closed), so the block can be entered again and again."""
    logger, handler = logging.getLogger("src_dask"), logging.StreamHandler(stream)
    handler.setFormatter(logging.Formatter(prefix.replace("%", "%%") + "%(message)s"))
    before = logger.level
    logger.addHandler(handler)
    logger.setLevel(level)
    try:
        yield
    finally:
        logger.removeHandler(handler)
        logger.setLevel(before)
