"""Clusters and devices: where the kernels run.

:func:`cluster` starts a sensible local cluster: a ``dask_cuda.LocalCUDACluster``
with one worker per GPU when there are GPUs, a CPU ``LocalCluster`` otherwise.
``dask_cuda``, ``cupy``, ``rmm`` and ``distributed_ucxx`` are imported lazily, so
``import src_dask`` works on machines without them.

Several GPUs exchange data over UCX with an RMM pool on each GPU (see
:func:`cluster`): UCX's CUDA IPC maps a pool's memory once and then moves blocks
over NVLink, where Dask over TCP, or UCX over RMM's asynchronous allocator, is two
orders of magnitude slower (docs/design.md §6.2 has the rates).

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
  scheduler can run code as you. Except over UCX (several GPUs, by default):
  UCX listens on every network interface whatever ``host`` says (``host`` is
  only the address it advertises) and has neither TLS nor authentication, so
  other machines can reach those ports too; ``protocol="tcp"`` keeps such a
  cluster on loopback, and a ``security`` that requires encryption makes it
  use TLS (both at TCP speed).
- workers spill under the ``local_directory`` you choose, each to a fresh
  directory that only you can enter (distributed makes it with mode 0700 and
  removes it when the worker closes).
- worker processes do not take SIGINT (:func:`.interrupts.sigint_deferred`), so a Ctrl-C
  in a terminal interrupts the client (which then closes the cluster) instead
  of killing every worker with a traceback of its own.
"""

from __future__ import annotations

import importlib
import logging
import os
import shutil
import socket
from typing import TYPE_CHECKING, Any

import dask
import dask.utils

from . import _oom
from ._plan import is_ucx
from .interrupts import quiet_logs, sigint_deferred

if TYPE_CHECKING:
    from ._plan import Workers

log = logging.getLogger("src_dask")

#: Where the clusters src_dask starts listen unless told otherwise.
LOOPBACK = "127.0.0.1"


class _HostPort8787:
    """``dashboard_address`` not given: port 8787 on ``host`` (None: no dashboard)."""

    def __repr__(self) -> str:
        return "'<host>:8787'"


DEFAULT: Any = _HostPort8787()
#: The module the workers of those clusters preload (its ``dask_setup`` ignores SIGINT).
_PRELOAD = "src_dask.interrupts"


def has_gpu() -> bool:
    """True when CuPy imports and sees at least one CUDA device in this process."""
    try:
        import cupy

        return cupy.cuda.runtime.getDeviceCount() > 0
    except Exception:  # noqa: BLE001 - no cupy, no driver, no device: all mean "no"
        return False


def gpu_count() -> int:
    """How many CUDA devices this process sees (0 without CuPy or a driver)."""
    try:
        import cupy

        return int(cupy.cuda.runtime.getDeviceCount())
    except Exception:  # noqa: BLE001 - as has_gpu
        return 0


#: Under UCX, a worker's RMM pool may grow to this fraction of its GPU: the rest is
#: for what RMM does not allocate (the CUDA context, cuBLAS/cuSOLVER handles, UCX's
#: own buffers).
POOL_MAXIMUM = 0.9
#: Share of a GPU whose stored data a worker keeps before spilling to host memory, by
#: default: the rest is for the tasks' temporaries (src_dask sizes its tasks to what the
#: kept data leave, ``_plan.device_task_bytes``). Below dask-cuda's own 0.8 because
#: tasks squeezed into a fifth of the device cut the sweep into more, smaller GEMMs,
#: and above 0.5, where more of the data goes device -> host -> device (the D_M=2000
#: rows of benchmarks/README.md time the three).
DEVICE_MEMORY_LIMIT = 0.7
#: The packages of the fast path between GPUs (both come with the ``gpu`` extra).
_UCX_PACKAGES = "distributed-ucxx-cu13 and rmm-cu13"


def _cannot_import(module: str) -> str | None:
    """Why ``module`` does not import here (None: it does)."""
    try:
        importlib.import_module(module)
    except Exception as e:  # noqa: BLE001 - ImportError, or a native library that fails to load
        return f"{type(e).__name__}: {e}"
    return None


def rmm_pool(device_memory_limit: Any) -> tuple[Any, Any]:
    """``(rmm_pool_size, rmm_maximum_pool_size)`` of a GPU worker under UCX that
    spills to host memory at ``device_memory_limit``.

    The pool starts as large as what the worker keeps on the device before it
    spills (``device_memory_limit``; ``POOL_MAXIMUM`` of the device without
    spilling) and grows for the tasks' temporaries up to ``POOL_MAXIMUM`` of the
    device (or up to the limit, where that is larger). Fractions stay fractions
    of each worker's device; a limit in bytes starts a pool of that many bytes,
    which may then grow to the whole device (None: dask-cuda's default).
    """
    limit = DEVICE_MEMORY_LIMIT if device_memory_limit == "default" else device_memory_limit
    if limit in (None, 0, "0", "auto"):  # no spilling: the data may fill the device
        return POOL_MAXIMUM, POOL_MAXIMUM
    try:
        fraction = float(limit)
    except (TypeError, ValueError):  # "40GB"
        return limit, None
    if 0 < fraction <= 1:
        return min(fraction, POOL_MAXIMUM), max(fraction, POOL_MAXIMUM)
    return limit, None


def _transport(n_workers: int, protocol: str | None, security: Any, device_memory_limit: Any,
               host: str, kwargs: dict[str, Any]) -> str | None:
    """The protocol of a GPU cluster of ``n_workers`` workers (None: ``LocalCluster``'s
    choice, tcp or tls); sets the RMM options into ``kwargs`` (what the caller put
    there stays). See :func:`cluster`."""
    tls = bool(security.require_encryption)
    if is_ucx(protocol) and tls:
        raise ValueError(f"cluster: protocol={protocol!r} cannot encrypt, but security "
                         "requires encryption: use protocol='tls' (or a Security without "
                         "require_encryption)")
    rmm_missing = _cannot_import("rmm")
    if protocol is None and n_workers > 1:
        if tls:
            log.info("cluster: %d GPUs over TLS (security requires encryption, which UCX "
                     "does not offer): transfers between GPUs run at TCP speed", n_workers)
        else:
            why = {"distributed_ucxx": _cannot_import("distributed_ucxx"), "rmm": rmm_missing}
            missing = [f"{module} does not import ({w})" for module, w in why.items() if w]
            if missing:
                log.warning(
                    "cluster: %d GPUs, but %s: they exchange data over TCP (about 1 GB/s, "
                    "where UCX with an RMM pool moves tens to hundreds of GB/s: "
                    "docs/gpus.md). Install src_dask's 'gpu' extra (it brings %s), or pass "
                    "protocol='tcp' to choose TCP without this warning.",
                    n_workers, " and ".join(missing), _UCX_PACKAGES)
            else:
                protocol = "ucx"
                log.warning(
                    "cluster: %d GPUs talk over UCX (tens to hundreds of GB/s between "
                    "GPUs, against about 1 GB/s over TCP: docs/gpus.md). UCX listens on "
                    "every network interface whatever "
                    "host=%r says, without TLS or authentication: whoever can reach this "
                    "machine can connect and run code as you. Pass protocol='ucx' to choose "
                    "it knowingly (no warning), or protocol='tcp' to keep the cluster on %s.",
                    n_workers, host, host)
    if rmm_missing:
        log.info("cluster: rmm does not import (%s); CuPy uses its own memory pool",
                 rmm_missing)
        return protocol
    kwargs.setdefault("rmm_allocator_external_lib_list", ["cupy"])
    if is_ucx(protocol) and kwargs.get("rmm_async") is not True \
            and not kwargs.get("rmm_managed_memory"):
        kwargs.setdefault("rmm_async", False)
        if "rmm_pool_size" not in kwargs:
            size, maximum = rmm_pool(device_memory_limit)
            kwargs["rmm_pool_size"] = size
            if maximum is not None:
                kwargs.setdefault("rmm_maximum_pool_size", maximum)
        log.info("cluster: %d GPU%s over %s with an RMM pool on each (starting at %s, "
                 "growing to %s), which UCX moves between GPUs at NVLink speed. UCX listens "
                 "on every network interface, whatever host says: protocol='tcp' keeps the "
                 "cluster on %s", n_workers, "s" if n_workers > 1 else "", protocol,
                 kwargs["rmm_pool_size"], kwargs.get("rmm_maximum_pool_size") or "the device",
                 host)
    else:
        # RMM's asynchronous pool: memory freed by one task is reused by the next
        # without synchronizing the device (a pool the caller asked for stays a pool)
        kwargs.setdefault("rmm_async", kwargs.get("rmm_pool_size") is None
                          and not kwargs.get("rmm_managed_memory"))
    return protocol


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


def workers_info(client: Any) -> dict[str, dict[str, Any]]:
    """The scheduler's record of each of ``client``'s workers, by address, asked of it
    now. Not ``client.scheduler_info()``: that returns the client's cached identity,
    which the client's periodic refresh replaces with one that lists no worker, and can
    between that call's own refresh and its return."""
    return client.sync(client.scheduler.identity, n_workers=-1)["workers"]


def worker_facts(client: Any, device: str) -> Workers:
    """What the smallest (or busiest) worker of a run holds and may hold now
    (:class:`~src_dask._plan.Workers`), from which the plan sizes every task and the
    estimate works out the peaks: asked of every worker in one round trip; without a
    client, of this process (whose threads are the machine's CPUs, or one GPU)."""
    from ._plan import Workers

    if client is None:
        per_worker = [_facts(device)]  # one dict of _facts a worker
        threads = max(1, os.cpu_count() or 1) if device == "cpu" else 1
    else:
        per_worker = list(client.run(_facts, device, os.getpid()).values())
        threads = max(client.nthreads().values(), default=1)
    if not per_worker:
        raise RuntimeError("the cluster has no workers")

    def smallest(key: str) -> int | None:
        values = [f[key] for f in per_worker]
        return None if None in values else min(values)

    shared: dict[Any, list[dict[str, Any]]] = {}
    for f in per_worker:
        if f.get("disk_id") is not None:
            shared.setdefault(f["disk_id"], []).append(f)
    # the file system the most workers spill to: its free bytes, shared by them
    busiest = max(shared.values(), key=lambda fs: (len(fs), -fs[0]["disk_free"]), default=[])
    return Workers(count=len(per_worker), threads=max(1, threads),
                   rss=max(f["rss"] for f in per_worker), host_limit=smallest("host_limit"),
                   keep=smallest("keep"), device_limit=smallest("device_limit"),
                   device_memory=smallest("device_memory"),
                   device_pool=smallest("device_pool"), room=smallest("room"),
                   available=smallest("available"), memory=smallest("memory"),
                   in_client=all(f["in_client"] for f in per_worker),
                   disk_free=busiest[0]["disk_free"] if busiest else None,
                   disk_sharing=len(busiest),
                   spill_dir=busiest[0]["spill_dir"] if busiest else None)


def _facts(device: str, client_pid: int | None = None, dask_worker: Any = None
           ) -> dict[str, Any]:
    """One worker's (or, without ``dask_worker``, this process's) facts for
    :func:`worker_facts`; numbers that cannot be told are None."""
    import psutil

    from . import _graph  # noqa: F401 - what a run's tasks load (Dask's arrays, zarr) counts
    # in what the process holds: ``import src_dask`` loads it only when first used

    rss = psutil.Process().memory_info().rss
    cuda = _dask_cuda_config(dask_worker)
    manager = getattr(dask_worker, "memory_manager", None)
    limit = int(getattr(manager, "memory_limit", None) or 0) or None
    keep = room = available = None
    if limit:  # data beyond the target is spilled, and beyond the spill threshold of
        # the process's memory (what it holds besides counts too); dask-cuda's host
        # buffer keeps data up to the whole limit, so there only the process's memory
        # passing the spill threshold spills (down to the target)
        target = getattr(manager, "memory_target_fraction", False)
        if _device_limit(cuda, dask_worker) is not None:
            target = False
        spill = getattr(manager, "memory_spill_fraction", False)
        bounds = ([target * limit] if target else []) + ([spill * limit - rss] if spill else [])
        keep = max(0, int(min(bounds))) if bounds else None
        room = _below_pause(manager, limit, rss)
    else:
        available = int(psutil.virtual_memory().available)
    device_limit = device_memory = start = None
    if device == "gpu":
        rmm = cuda.get("[plugin] RMMSetup")
        rmm = rmm if isinstance(rmm, dict) else {}
        start = _positive(rmm.get("initial_pool_size")) if rmm.get("async_alloc") is False \
            else None  # RMM's asynchronous allocator is no pool that grows from a start
        device_memory = _memory("gpu")
        pool = _positive(rmm.get("maximum_pool_size"))
        if device_memory and pool:  # all the worker's arrays may get
            device_memory = min(device_memory, pool)
        device_limit = _device_limit(cuda, dask_worker) or device_memory
        if dask_worker is not None:  # before the run's tasks meet a full pool
            _oom.spill_on_allocation_failure(dask_worker)
            _oom.membership_without_loading(dask_worker)
    spill_dir = getattr(dask_worker, "local_directory", None)
    disk = _disk(spill_dir) if spill_dir else None
    return {"rss": rss, "host_limit": limit, "keep": keep, "room": room,
            "available": available, "spill_dir": spill_dir,
            "disk_free": None if disk is None else disk[0],
            # workers that spill to one file system share its room
            "disk_id": None if disk is None else (socket.gethostname(), disk[1]),
            # a worker in the client's process: its memory is the client's too
            "in_client": dask_worker is not None and os.getpid() == client_pid,
            "memory": device_memory if device == "gpu" else _memory("cpu", dask_worker),
            "device_limit": int(device_limit) if device_limit else None,
            "device_memory": device_memory, "device_pool": start}


def _disk(path: str) -> tuple[int, int] | None:
    """Free bytes of the file system under ``path``, and its device number."""
    try:
        return shutil.disk_usage(path).free, os.stat(path).st_dev
    except OSError:
        return None


def _dask_cuda_config(dask_worker: Any) -> dict[str, Any]:
    """What dask-cuda's ``utils.get_worker_config`` tells of a worker: its RMM setup
    (``"[plugin] RMMSetup"``: the plugin's settings), its device limit
    (``"device-memory-limit"``) and more; {} for this process or a worker that has not
    imported dask-cuda (it can then have neither)."""
    import sys

    if dask_worker is None or "dask_cuda" not in sys.modules:
        return {}
    from dask_cuda.utils import get_worker_config

    try:
        return get_worker_config(dask_worker)
    except Exception as err:  # noqa: BLE001 - read what the plan needs directly instead
        # it pickles every plugin's attributes and raises on more than a TypeError: a
        # plugin whose class was defined in a script's __main__ (a benchmark's) made
        # a capped pool's plan forget its cap, and the run sized tasks for the GPU
        log.info("src: dask_cuda.utils.get_worker_config failed on %s (%s: %s); its RMM "
                 "pool and device limit read directly", getattr(dask_worker, "address",
                                                                "a worker"),
                 type(err).__name__, err)
        return _read_cuda_config(dask_worker)


def _read_cuda_config(dask_worker: Any) -> dict[str, Any]:
    """What :func:`_dask_cuda_config` reads of a worker, taken from it directly: the
    public attributes of its ``RMMSetup`` plugin and its device buffer's limit."""
    out: dict[str, Any] = {}
    for plugin in getattr(dask_worker, "plugins", {}).values():
        if type(plugin).__name__ == "RMMSetup":
            out["[plugin] RMMSetup"] = {k: v for k, v in vars(plugin).items()
                                        if not k.startswith("_")}
    buffer = getattr(getattr(dask_worker, "data", None), "device_buffer", None)
    if hasattr(buffer, "n"):
        out["device-memory-limit"] = buffer.n
    return out


def _positive(x: Any) -> int | None:
    """``x`` as bytes if it is a positive number, else None (not told)."""
    return int(x) if isinstance(x, (int, float)) and x > 0 else None


def _device_limit(cuda: dict[str, Any], dask_worker: Any) -> int | None:
    """The device bytes a dask-cuda worker's data keep before spilling to host memory
    (``device-memory-limit`` of its :func:`_dask_cuda_config` ``cuda``; with
    JIT-unspilling, which that leaves out, its ``ProxifyHostFile``'s manager's); None
    where not told."""
    limit = _positive(cuda.get("device-memory-limit"))
    manager = getattr(getattr(dask_worker, "data", None), "manager", None)
    return limit or _positive(getattr(manager, "device_memory_limit", None))


def _below_pause(manager: Any, limit: int, rss: int) -> int:
    """What the tasks running at once may use and stay below the worker's pause
    threshold: Dask starts spilling stored data only once its process passes the
    spill fraction of the limit (and then down to the target), so stored data may
    hold the process at the spill fraction when a task starts, and the tasks run on
    top of that (or of what the process holds, if more). A worker past the
    threshold pauses, one whose tasks keep crossing it pauses and resumes ten times
    a second, and past 95 % its nanny restarts it."""
    pause = getattr(manager, "memory_pause_fraction", False) or 0.95
    target = getattr(manager, "memory_target_fraction", False)
    spill = getattr(manager, "memory_spill_fraction", False)
    settles = max([f for f in (target, spill) if f] or [0.0]) * limit
    return int(max(0.0, pause * limit - max(rss, settles)))


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


def _preloads(kwargs: dict[str, Any]) -> list[str]:
    """The workers' preloads: the caller's (or Dask config's), and
    :mod:`src_dask.interrupts` (its ``dask_setup`` ignores SIGINT)."""
    given = kwargs.pop("preload", None)
    if given is None:
        given = dask.config.get("distributed.worker.preload", None)
    given = [given] if isinstance(given, str) else list(given or [])
    return given if _PRELOAD in given else [*given, _PRELOAD]


def start_local(cls: Any, **options: Any) -> Any:
    """``cls(**options)`` (``LocalCluster`` or ``LocalCUDACluster``), its worker processes
    not taking SIGINT, and a Ctrl-C while it starts closing it again."""
    with sigint_deferred() as interrupted:
        started = cls(**options)
    if interrupted():  # Ctrl-C while it started: close it again, then interrupt
        with quiet_logs():
            started.close()
        raise KeyboardInterrupt
    return started


def local_options(*, dashboard_address: str | None = DEFAULT, **kwargs: Any) -> dict[str, Any]:
    """``kwargs`` with what keeps a local cluster private beyond ``LocalCluster``'s own
    defaults (it listens on 127.0.0.1, over TLS where ``security`` requires encryption):
    the dashboard on the cluster's host (``LocalCluster``'s listens on every
    interface), TCP or TLS in one process too (where ``LocalCluster`` would talk
    in-process, opening no port for other clients), and this module among the worker
    processes' preloads."""
    from distributed.comm.addressing import unparse_host_port

    if dashboard_address is DEFAULT:
        dashboard_address = unparse_host_port(kwargs.get("host") or LOOPBACK, 8787)
    if kwargs.get("processes", True):
        kwargs["preload"] = _preloads(kwargs)
        if kwargs.get("protocol", "") is None:
            del kwargs["protocol"]  # LocalCluster's choice
    elif kwargs.get("protocol") is None:
        kwargs["protocol"] = "tls" if _security(kwargs.get("security")).require_encryption \
            else "tcp"
    return {"dashboard_address": dashboard_address, **kwargs}


def _security(security: Any) -> Any:
    """``security``, or what Dask config (``distributed.comm.tls``) says, as LocalCluster
    reads it."""
    from distributed import Security

    return Security() if security is None else security


def _n_workers(kwargs: dict[str, Any]) -> int:
    """How many workers (GPUs) ``LocalCUDACluster(**kwargs)`` starts."""
    if kwargs.get("n_workers"):
        return int(kwargs["n_workers"])
    visible = kwargs.get("CUDA_VISIBLE_DEVICES")
    if visible is None:
        return gpu_count()
    return len(visible.split(",") if isinstance(visible, str) else list(visible))


def cluster_options(gpus: int | list[int] | None = None,
                    device_memory_limit: str | float = DEVICE_MEMORY_LIMIT,
                    memory_limit: str | float = "auto", local_directory: str | None = None,
                    protocol: str | None = None, host: str | None = None,
                    dashboard_address: str | None = DEFAULT, security: Any = None,
                    **kwargs: Any) -> dict[str, Any]:
    """The keyword arguments :func:`cluster` starts its cluster with: for
    ``dask_cuda.LocalCUDACluster`` where the workers use GPUs (the dict then has
    ``device_memory_limit``), else for ``distributed.LocalCluster`` — src_dask's
    measured choices, to start a cluster of one's own with.

    Parameters
    ----------
    gpus
        How many GPUs (an int: the first ones visible) or which ones (a list of
        device ids); all visible GPUs by default (a CPU cluster where there is none).
        0: CPU workers whatever the machine has. GPUs asked for on a machine without a
        usable one are a ``ValueError``.
    device_memory_limit
        Device memory a worker fills with stored data before spilling to host memory
        (bytes, a string such as ``"40GB"``, or a fraction of the device). 0.7 by
        default (dask-cuda's is 0.8): the rest is for the tasks, which src_dask sizes
        to fit it; less room makes smaller, slower tasks.
    memory_limit
        Host memory per worker before spilling to ``local_directory``.
    local_directory
        Under which directory workers spill to disk (each in a fresh subdirectory
        that only you can enter, removed with the worker).
    protocol
        By default ``"ucx"`` with several GPUs (needs ``distributed-ucxx`` and
        ``rmm``, both in the ``gpu`` extra; without them ``"tcp"`` and a WARNING),
        ``"tcp"`` with one GPU or none, and ``"tls"`` whenever ``security`` requires
        encryption (``"ucx"`` with such a ``security`` is a ``ValueError``).
    host
        The address scheduler and workers listen on: loopback by default (as
        ``LocalCluster`` does). UCX
        listens on every interface whatever ``host`` says, without authentication.
    dashboard_address
        ``"host:port"`` (port 0: any free one); ``host:8787`` by default, None for none.
    security
        A ``distributed.Security`` for TLS (``Security.temporary()`` for a throwaway
        one); by default what Dask config (``distributed.comm.tls``) holds.
    kwargs
        Passed on as given, e.g. ``rmm_*`` options, which replace src_dask's choice:
        CuPy allocates through RMM where ``rmm`` imports; over UCX each worker gets an
        RMM pool (:func:`rmm_pool`: it starts at ``device_memory_limit`` and may grow
        to 90 % of the device), since UCX moves a pool's blocks between GPUs at NVLink
        speed; otherwise RMM's asynchronous allocator. docs/gpus.md has the numbers.
    """
    network = {"dashboard_address": dashboard_address, "security": security,
               "protocol": protocol, "local_directory": local_directory,
               "memory_limit": memory_limit, **({} if host is None else {"host": host})}
    if gpus == 0 or (gpus is None and not has_gpu()):
        if gpus is None:
            log.info("cluster: no GPU found; starting a CPU LocalCluster")
        kwargs.setdefault("threads_per_worker", 1)
        return local_options(**network, **kwargs)
    if not has_gpu():
        raise ValueError(f"cluster: gpus={gpus!r}, but there is no usable GPU here (CuPy "
                         "and a CUDA device); gpus=0 starts CPU workers")
    # A few threads per GPU: while one launches kernels, others read and copy inputs.
    kwargs.setdefault("threads_per_worker", 4)
    if isinstance(gpus, int):  # the first ones visible, as LocalCUDACluster takes them
        kwargs["n_workers"] = gpus
    elif gpus is not None:
        kwargs["CUDA_VISIBLE_DEVICES"] = list(gpus)
    network["protocol"] = _transport(_n_workers(kwargs), protocol, _security(security),
                                     device_memory_limit, host or LOOPBACK, kwargs)
    return local_options(device_memory_limit=device_memory_limit, **network, **kwargs)


def cluster(gpus: int | list[int] | None = None, **options: Any) -> Any:
    """A local Dask cluster for src: one ``dask_cuda.LocalCUDACluster`` worker per GPU,
    or a CPU ``LocalCluster``, private by default (see the module docstring), with
    the options of :func:`cluster_options` (which takes the same arguments).

    >>> import src_dask
    >>> from distributed import Client
    >>> with src_dask.cluster(gpus=0, n_workers=1) as c, Client(c) as client:  # doctest: +SKIP
    ...     y = src_dask.src(*trains, chi_out=64, client=client)
    """
    opts = cluster_options(gpus, **options)
    if "device_memory_limit" in opts:
        from dask_cuda import LocalCUDACluster as cls
    else:
        from distributed import LocalCluster as cls
    return start_local(cls, **opts)
