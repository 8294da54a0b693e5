"""Clusters and devices: where the kernels run.

:func:`cluster` starts a sensible local cluster: a ``dask_cuda.LocalCUDACluster``
with one worker per GPU when there are GPUs, a CPU ``LocalCluster`` otherwise.
``dask_cuda``, ``cupy`` and ``rmm`` are imported lazily, so ``import src_dask``
works on machines without them.

The device a run uses is chosen once, on the client, for the whole graph:
``dask.config`` key ``src_dask.device`` (``"auto"``, ``"cpu"`` or ``"gpu"``);
``"auto"`` means the GPU when the inputs are CuPy arrays or every worker (the
local process, without a client) has a usable GPU.

The clusters src_dask starts (:func:`cluster`, and the command line's
``--workers``/``--gpus``/``demo``) are private by default:

- scheduler, workers and dashboard listen on the loopback interface only
  (``host="127.0.0.1"``), so other machines cannot reach them. Other users of
  this machine still can (a shared login node): there, and wherever ``host=``
  (and ``dashboard_address=``) opens them, pass ``security=`` (a
  ``distributed.Security``) for TLS: anyone who can reach a plain-TCP
  scheduler can run code as you.
- workers spill to a fresh directory that only you can enter (mode 0700,
  :func:`private_directory`) under the ``local_directory`` you choose;
  it is removed with the cluster.
- worker processes do not take SIGINT (:func:`sigint_deferred`), so a Ctrl-C
  in a terminal interrupts the client (which then closes the cluster) instead
  of killing every worker with a traceback of its own.
"""

from __future__ import annotations

import contextlib
import logging
import multiprocessing
import os
import shutil
import signal
import tempfile
import threading
import weakref
from collections.abc import Callable, Iterator
from typing import Any

import dask

log = logging.getLogger("src_dask")

#: Where the clusters src_dask starts listen unless told otherwise.
LOOPBACK = "127.0.0.1"


class _HostPort8787:
    """``dashboard_address`` not given: port 8787 on ``host`` (None: no dashboard)."""

    def __repr__(self) -> str:
        return "'<host>:8787'"


DEFAULT: Any = _HostPort8787()
#: The module the workers of those clusters preload (its ``dask_setup`` ignores SIGINT).
_PRELOAD = __name__


def has_gpu() -> bool:
    """True when CuPy imports and sees at least one CUDA device in this process."""
    try:
        import cupy

        return cupy.cuda.runtime.getDeviceCount() > 0
    except Exception:  # noqa: BLE001 - no cupy, no driver, no device: all mean "no"
        return False


def choose_device(client: Any, cores: list[Any]) -> str:
    """``"gpu"`` or ``"cpu"`` for a run (see the module docstring)."""
    want = dask.config.get("src_dask.device", "auto")
    if want not in ("auto", "cpu", "gpu"):
        raise ValueError(f"dask config src_dask.device: expected auto, cpu or gpu, got {want!r}")
    if want == "cpu":
        return "cpu"
    if want == "auto" and any(type(c).__module__.startswith("cupy") for c in cores):
        return "gpu"
    gpus = {"local": has_gpu()} if client is None else client.run(has_gpu)
    everywhere = bool(gpus) and all(gpus.values())
    if want == "gpu" and not everywhere:
        missing = sorted(w for w, ok in gpus.items() if not ok)
        raise RuntimeError(f"dask config src_dask.device is 'gpu' but {', '.join(missing)} "
                           "has no usable GPU (CuPy and a CUDA device)")
    return "gpu" if everywhere else "cpu"


def worker_memory(client: Any, device: str) -> int | None:
    """Bytes of memory the smallest worker of a run has for its arrays: the GPU's
    (``device="gpu"``), else the worker's memory limit (the machine's memory
    without a client or without a limit); None where that cannot be told."""
    sizes = [_memory(device)] if client is None else list(client.run(_memory, device).values())
    return min(sizes) if sizes and None not in sizes else None


def _memory(device: str, dask_worker: Any = None) -> int | None:
    try:
        if device == "gpu":
            import cupy

            return int(cupy.cuda.Device().mem_info[1])
        limit = getattr(getattr(dask_worker, "memory_manager", None), "memory_limit", None)
        if limit:
            return int(limit)
        import psutil

        return int(psutil.virtual_memory().total)
    except Exception:  # noqa: BLE001 - no device or no psutil: unknown
        return None


def address(host: str, port: int) -> str:
    """``host:port`` (an IPv6 host in brackets), e.g. a ``dashboard_address``."""
    if ":" in host and not host.startswith("["):
        host = f"[{host}]"
    return f"{host}:{port}"


def private_directory(parent: str | None = None) -> str:
    """A fresh directory that only this user can enter (mode 0700, made by
    ``tempfile.mkdtemp``) under ``parent``: by default Dask's
    ``temporary-directory`` or the system's temporary directory. Workers spill
    there, so other users of the machine cannot read the data they spill."""
    if parent is None:
        parent = dask.config.get("temporary-directory", None) or tempfile.gettempdir()
    os.makedirs(parent, exist_ok=True)
    return tempfile.mkdtemp(prefix="src-dask-", dir=parent)


@contextlib.contextmanager
def sigint_deferred() -> Iterator[Callable[[], bool]]:
    """SIGINT held back while the block starts worker processes; yields a function
    that says, after the block, whether one came meanwhile.

    SIGINT is blocked in this (the main) thread, so the threads Dask creates
    meanwhile (its event loop, and the ones that start worker processes, now or
    later in place of a dead worker) block it too, and so do the worker
    processes they start: the signal mask is inherited across fork and exec,
    and Python leaves it as it is. A terminal's Ctrl-C, sent to the whole
    process group, then interrupts only this process. A SIGINT that arrives
    during the block is recorded, not lost. A no-op outside the main thread or
    without POSIX signal masks.
    """
    if (threading.current_thread() is not threading.main_thread()
            or not hasattr(signal, "pthread_sigmask")
            # not set from Python, or ignored (a background job): leave it be
            or signal.getsignal(signal.SIGINT) in (None, signal.SIG_IGN)):
        yield lambda: False
        return
    with contextlib.suppress(Exception):
        # started now, or its start (which unblocks SIGINT in the thread that
        # starts it, for the tracker's sake) would undo the block in Dask's loop thread
        from multiprocessing import resource_tracker

        resource_tracker.ensure_running()
    came: list[int] = []
    handler = signal.signal(signal.SIGINT, lambda signum, frame: came.append(signum))
    mask = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        yield lambda: bool(came)
    finally:
        if signal.SIGINT in signal.sigpending():
            signal.sigwait({signal.SIGINT})  # take it off the pending set; it is recorded
            came.append(signal.SIGINT)
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)
        signal.signal(signal.SIGINT, handler)


@contextlib.contextmanager
def quiet_logs() -> Iterator[None]:
    """Dask's loggers (and tornado's, asyncio's, bokeh's) silent while the block
    runs; as they were afterwards. For closing a cluster after a Ctrl-C, whose
    warnings (lost tasks, closed connections) are what an interrupt means."""
    roots = ("distributed", "tornado", "asyncio", "bokeh")
    names = {n for n in list(logging.root.manager.loggerDict) if n.split(".")[0] in roots}
    loggers = [logging.getLogger(n) for n in names | set(roots)]
    saved = [(logger, logger.disabled) for logger in loggers]
    for logger in loggers:
        logger.disabled = True
    try:
        yield
    finally:
        for logger, disabled in saved:
            logger.disabled = disabled


def dask_setup(worker: Any) -> None:
    """Preload of the workers src_dask starts (Dask calls it as the worker starts):
    in a worker process of its own (not in the client's process), ignore SIGINT.
    A second line behind :func:`sigint_deferred`, for worker processes started
    from threads that did not inherit its mask (a cluster on an event loop that
    was running before)."""
    if (multiprocessing.parent_process() is not None
            and threading.current_thread() is threading.main_thread()):
        signal.signal(signal.SIGINT, signal.SIG_IGN)


def _preloads(kwargs: dict[str, Any]) -> list[str]:
    """The workers' preloads: the caller's (or Dask config's), and this module."""
    given = kwargs.pop("preload", None)
    if given is None:
        given = dask.config.get("distributed.worker.preload", None)
    given = [given] if isinstance(given, str) else list(given or [])
    return given if _PRELOAD in given else [*given, _PRELOAD]


def start_local(cls: Any, *, local_directory: str | None = None, host: str | None = LOOPBACK,
                dashboard_address: str | None = DEFAULT, security: Any = None,
                protocol: str | None = None, **kwargs: Any) -> Any:
    """``cls(**kwargs)`` (``LocalCluster`` or ``LocalCUDACluster``), private by
    default (see the module docstring): listening on ``host`` (loopback), the
    dashboard on ``dashboard_address`` (``host:8787`` by default), TLS where
    ``security`` requires encryption (protocol ``tls``), spilling to a fresh 0700
    directory under ``local_directory`` (removed with the cluster), worker
    processes that do not take SIGINT."""
    from distributed import Security

    host = host or LOOPBACK
    if dashboard_address is DEFAULT:
        dashboard_address = address(host, 8787)
    if security is None:
        security = Security()  # what Dask config (distributed.comm.tls) says
    if protocol is None:
        protocol = "tls" if security.require_encryption else "tcp"
    if kwargs.get("processes", True):
        kwargs["preload"] = _preloads(kwargs)
    spill = private_directory(local_directory)
    try:
        with sigint_deferred() as interrupted:
            started = cls(host=host, dashboard_address=dashboard_address, security=security,
                          protocol=protocol, local_directory=spill, **kwargs)
        if interrupted():  # Ctrl-C while it started: close it again, then interrupt
            with quiet_logs():
                started.close()
            raise KeyboardInterrupt
    except BaseException:
        shutil.rmtree(spill, ignore_errors=True)
        raise
    # the spill directory goes with the cluster: when it closes (or is collected, or
    # at exit, whichever comes first)
    remove = weakref.finalize(started, shutil.rmtree, spill, True)
    close = started._close

    async def _close() -> None:
        try:
            await close()
        finally:
            remove()

    started._close = _close
    started._src_dask_spill = remove
    return started


def cluster(gpus: int | list[int] | None = None, device_memory_limit: str | float = 0.8,
            memory_limit: str | float = "auto", local_directory: str | None = None,
            protocol: str | None = None, host: str = LOOPBACK,
            dashboard_address: str | None = DEFAULT, security: Any = None, **kwargs: Any):
    """A local Dask cluster for src: one worker per GPU, or a CPU cluster.

    Parameters
    ----------
    gpus
        How many GPUs (an int) or which ones (a list of device ids); all
        visible GPUs by default.
    device_memory_limit
        Device memory a worker fills before spilling to host memory (bytes,
        a string such as ``"40GB"``, or a fraction of the device).
    memory_limit
        Host memory per worker before spilling to ``local_directory``.
    local_directory
        Under which directory workers spill to disk: they get a fresh
        subdirectory of it that only you can enter (mode 0700), removed with
        the cluster. Dask's ``temporary-directory`` or the system's temporary
        directory by default.
    protocol
        ``"tcp"`` (the default), ``"tls"`` (the default with a ``security``
        that requires encryption) or ``"ucx"`` (needs ``distributed-ucxx``).
    host
        The address scheduler and workers listen on: the loopback interface by
        default, so nothing outside this machine can connect (other users of
        this machine can); ``"0.0.0.0"`` (or an interface's address) opens them
        — with ``security=``, since anyone who can reach a plain-TCP scheduler
        can run code as you.
    dashboard_address
        Where the dashboard listens (``"host:port"``; port 0 for any free
        one); ``host:8787`` by default, None for no dashboard.
    security
        A ``distributed.Security`` for TLS between client, scheduler and workers
        (``Security.temporary()`` for a throwaway one); by default what Dask
        config (``distributed.comm.tls``) holds.
    kwargs
        Passed on to ``LocalCUDACluster`` (or ``LocalCluster``).

    CuPy allocations go through RMM's asynchronous pool when ``rmm`` is
    installed, so memory freed by one task is reused by the next without
    synchronizing the device.
    """
    network = {"host": host, "dashboard_address": dashboard_address, "security": security,
               "protocol": protocol, "local_directory": local_directory}
    if not has_gpu():
        from distributed import LocalCluster

        log.info("cluster: no GPU found; starting a CPU LocalCluster")
        kwargs.setdefault("threads_per_worker", 1)
        return start_local(LocalCluster, memory_limit=memory_limit, **network, **kwargs)
    from dask_cuda import LocalCUDACluster

    # A few threads per GPU: while one launches kernels, others read and copy inputs.
    kwargs.setdefault("threads_per_worker", 4)

    if isinstance(gpus, int):
        visible = os.environ.get("CUDA_VISIBLE_DEVICES")
        ids = visible.split(",")[:gpus] if visible else [str(i) for i in range(gpus)]
        kwargs["CUDA_VISIBLE_DEVICES"] = ",".join(ids)
    elif gpus is not None:
        kwargs["CUDA_VISIBLE_DEVICES"] = ",".join(str(g) for g in gpus)
    try:
        import rmm  # noqa: F401

        kwargs.setdefault("rmm_async", True)
        kwargs.setdefault("rmm_allocator_external_lib_list", ["cupy"])
    except ImportError:
        log.info("cluster: rmm is not installed; CuPy uses its own memory pool")
    return start_local(LocalCUDACluster, device_memory_limit=device_memory_limit,
                       memory_limit=memory_limit, **network, **kwargs)
