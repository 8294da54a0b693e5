"""Dask clusters for the benchmarks: their options, how they start, and what their
workers did (CPU seconds, bytes spilled).

On a GPU, ``src_dask.cluster(gpus=n)`` (a LocalCUDACluster, one worker per GPU);
more workers than GPUs are ``dask cuda worker`` processes sharing the first GPU
(LocalCUDACluster cannot do that); on a CPU, ``src_dask.cluster(n_workers=n)``
(a LocalCluster, one thread per worker). Nothing starts a cluster on import.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from device import Device
from distributed.diagnostics.plugin import WorkerPlugin

HERE = Path(__file__).resolve().parent


def add_options(p: argparse.ArgumentParser) -> None:
    """The command-line options of :func:`bench_cluster`."""
    p.add_argument("--device-memory-limit", default="0.7",
                   help="per GPU worker before spilling to host (src_dask.cluster's "
                        "default, 0.7)")
    p.add_argument("--memory-limit", default="auto",
                   help="host memory per worker before spilling to disk")
    p.add_argument("--protocol", choices=("tcp", "ucx"), default="tcp",
                   help="between GPU workers (ucx: NVLink/CUDA IPC, needs distributed-ucxx)")
    p.add_argument("--rmm", choices=("async", "pool"), default="async",
                   help="GPU allocator, passed explicitly: RMM's async pool or a classic "
                        "RMM pool sized as src_dask.cluster sizes it under UCX (CUDA IPC "
                        "between GPUs over UCX maps it once)")
    p.add_argument("--threads-per-worker", type=int, default=None,
                   help="threads of each GPU worker (default: src_dask.cluster's, 4)")
    p.add_argument("--scheduler-file", type=Path, default=None, metavar="PATH",
                   help="use the workers already started on the scheduler of PATH (as "
                        "under Slurm: examples/slurm/two_nodes_local.sh) instead of "
                        "starting a cluster; --workers must be how many there are, the "
                        "options above are theirs to set, and they must import benchmarks/ "
                        "(PYTHONPATH)")


def host_memory() -> int:
    """Bytes of memory this machine gives its processes (distributed's own reading:
    RAM, or a cgroup's or rlimit's limit where lower)."""
    from distributed.system import MEMORY_LIMIT

    return MEMORY_LIMIT


def rmm_options(rmm: str, device_memory_limit: Any = 0.7) -> dict[str, Any]:
    """``src_dask.cluster`` options for an RMM allocator: ``"async"`` (RMM's
    stream-ordered pool) or ``"pool"`` (a classic RMM pool, which CUDA IPC between GPUs
    over UCX maps once), spelt out rather than left to ``src_dask.cluster``'s default,
    which depends on the number of GPUs and the protocol. The pool is sized as
    ``src_dask.cluster_options`` sizes its UCX pools for ``device_memory_limit``.
    Without RMM there is nothing to choose (CuPy's own pool)."""
    import importlib.util

    if importlib.util.find_spec("rmm") is None:
        return {}
    if rmm == "async":
        return {"rmm_async": True, "rmm_pool_size": None}
    size, maximum = _ucx_pool(device_memory_limit)
    return {"rmm_async": False, "rmm_pool_size": size,
            **({"rmm_maximum_pool_size": maximum} if maximum is not None else {})}


def _ucx_pool(device_memory_limit: Any) -> tuple[Any, Any]:
    """``(rmm_pool_size, rmm_maximum_pool_size)`` that ``src_dask.cluster_options``
    gives a GPU worker under UCX spilling at ``device_memory_limit`` (None: dask-cuda's
    maximum)."""
    import src_dask

    opts = src_dask.cluster_options(gpus=1, protocol="ucx",
                                    device_memory_limit=device_memory_limit)
    return opts["rmm_pool_size"], opts.get("rmm_maximum_pool_size")


def _fraction(limit: str) -> float | None:
    try:
        value = float(limit)
    except ValueError:
        return None
    return value if 0 < value <= 1 else None


@contextlib.contextmanager
def shared_gpu_workers(n_workers: int, args: argparse.Namespace, local_directory: Path):
    """``n_workers`` ``dask cuda worker`` processes sharing the first GPU, each with
    its share of the device and host memory limits (and, with ``--rmm pool``, of an
    RMM pool), talking over ``--protocol``; yields a client. On one GPU this stands
    in for several: the same graph, the same transfers (CUDA IPC within the device
    under UCX), the kernels of all workers on one device."""
    import dask
    from distributed import Client, LocalCluster

    device_limit = args.device_memory_limit
    if (f := _fraction(device_limit)) is not None:
        device_limit = str(f / n_workers)
    memory_limit = args.memory_limit
    if memory_limit == "auto":
        memory_limit = str(host_memory() // n_workers)
    visible = os.environ.get("CUDA_VISIBLE_DEVICES", "0").split(",")[0]
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": visible,  # the workers import these modules
           "PYTHONPATH": os.pathsep.join(filter(None, [str(HERE), os.environ.get("PYTHONPATH")])),
           # the length of the workers' logs (tools/transfers.py's LOG_CONFIG), as set here
           "DASK_DISTRIBUTED__ADMIN__LOW_LEVEL_LOG_LENGTH": str(
               dask.config.get("distributed.admin.low-level-log-length"))}
    command = [sys.executable, "-m", "dask", "cuda", "worker", "--device-memory-limit",
               device_limit, "--memory-limit", memory_limit,
               "--nthreads", str(args.threads_per_worker or 4)]  # as src_dask.cluster
    with contextlib.suppress(ImportError):
        import rmm  # noqa: F401 - as src_dask.cluster: RMM (async, or a pool under UCX)

        command += ["--set-rmm-allocator-for-libs", "cupy"]
        if args.rmm == "pool":  # each worker's pool its share of what one GPU's would be
            size, maximum = _ucx_pool(_fraction(args.device_memory_limit) or "default")
            command += ["--no-rmm-async", "--rmm-pool-size", str(size / n_workers),
                        "--rmm-maximum-pool-size", str(maximum / n_workers)]
        else:
            command.append("--rmm-async")
    procs = []
    with LocalCluster(n_workers=0, dashboard_address=":0", protocol=args.protocol) as scheduler:
        try:
            for i in range(n_workers):
                procs.append(subprocess.Popen(
                    [*command, "--local-directory", str(local_directory / f"w{i}"),
                     scheduler.scheduler_address], env=env))
            with Client(scheduler) as client:
                client.wait_for_workers(n_workers, timeout=300)
                yield client
        finally:
            for p in procs:
                p.terminate()
            for p in procs:
                try:
                    p.wait(60)
                except subprocess.TimeoutExpired:
                    p.kill()


@contextlib.contextmanager
def external_workers(n_workers: int, scheduler_file: Path):
    """A client of the workers already started on the scheduler of ``scheduler_file``;
    exactly ``n_workers`` of them, so that a run's name says what ran it."""
    from distributed import Client

    with Client(scheduler_file=str(scheduler_file), timeout="60s") as client:
        client.wait_for_workers(n_workers, timeout=300)
        found = len(client.scheduler_info()["workers"])
        if found != n_workers:
            raise SystemExit(f"--scheduler-file {scheduler_file}: {found} workers there, "
                             f"--workers asked for {n_workers}")
        yield client


@contextlib.contextmanager
def bench_cluster(n_workers: int, device: Device, args: argparse.Namespace, workdir: Path):
    """A client of ``n_workers`` workers on ``device`` (options of :func:`add_options`);
    yields (client, description)."""
    from distributed import Client, LocalCluster

    import src_dask

    local = workdir / "dask"
    if getattr(args, "scheduler_file", None) is not None:
        with external_workers(n_workers, args.scheduler_file) as client:
            yield client, (f"{n_workers} workers on {args.scheduler_file}, started outside "
                           "(dask cuda worker --scheduler-file, as under Slurm)")
        return
    if device.is_gpu and n_workers > device.gpus:
        with shared_gpu_workers(n_workers, args, local) as client:
            yield client, f"{n_workers} dask cuda worker processes sharing one GPU"
        return
    if device.is_gpu:
        options = rmm_options(args.rmm, args.device_memory_limit)
        allocator = ", ".join(f"{k}={v!r}" for k, v in options.items())
        if args.threads_per_worker:
            options["threads_per_worker"] = args.threads_per_worker
        cluster = src_dask.cluster(gpus=n_workers, device_memory_limit=args.device_memory_limit,
                                   memory_limit=args.memory_limit, protocol=args.protocol,
                                   local_directory=str(local), dashboard_address=":0", **options)
        what = (f"src_dask.cluster(gpus={n_workers}, protocol={args.protocol!r}, "
                f"rmm={args.rmm!r} ({allocator or 'no rmm'}), "
                f"threads_per_worker={args.threads_per_worker or 4}): LocalCUDACluster")
    elif device.gpus:  # --device cpu on a GPU machine: src_dask.cluster would use the GPUs
        cluster = LocalCluster(n_workers=n_workers, threads_per_worker=1,
                               memory_limit=args.memory_limit, local_directory=str(local),
                               dashboard_address=":0")
        what = f"LocalCluster({n_workers} workers x 1 thread)"
    else:
        cluster = src_dask.cluster(n_workers=n_workers, memory_limit=args.memory_limit,
                                   local_directory=str(local), dashboard_address=":0")
        what = f"src_dask.cluster(n_workers={n_workers}): LocalCluster, 1 thread each"
    with cluster, Client(cluster) as client:
        yield client, what


def cluster_cpu(client) -> Callable[[], float]:
    """``own_cpu`` for :func:`timing.best_of` on a cluster: CPU seconds of this process
    and of every worker process."""
    def own() -> float:
        return time.process_time() + sum(client.run(time.process_time).values())

    return own


# -- spilling in Dask workers ---------------------------------------------------------
class SpillCounters(WorkerPlugin):
    """Cumulative bytes a worker has spilled, kept by this plugin on each worker
    (registered by :func:`spill_counters`; read back through ``Worker.plugins``).

    distributed's ``SpillBuffer`` (a CPU worker with a memory limit) keeps
    ``cumulative_metrics``, read as they are; dask-cuda's ``DeviceHostFile`` does not,
    so on its zict buffers (``device_buffer``: device -> host, ``host_buffer``: host ->
    disk) :meth:`setup` adds a callback to their public ``fast_to_slow_callbacks``
    that adds up what they evict. Anything else (no memory limit: a plain dict) reports
    no spilling.
    """

    name = "bench-spill-counters"
    idempotent = True  # registered again by every reading: the first one stays

    def setup(self, worker: Any) -> None:
        self.worker = worker
        self.counters: dict[str, float] = {}
        data = worker.data
        if getattr(data, "cumulative_metrics", None) is not None:
            return
        for attr, label in (("device_buffer", "device_to_host"), ("host_buffer", "host_to_disk")):
            buf = getattr(data, attr, None)
            if buf is None or not hasattr(buf, "fast_to_slow_callbacks"):
                continue
            self.counters[label] = 0.0

            def add(key, value, *, label=label, weight=buf.weight):
                self.counters[label] += float(weight(key, value))

            buf.fast_to_slow_callbacks.append(add)

    def read(self) -> dict[str, Any]:
        """The counters so far (see the class)."""
        data = self.worker.data
        out: dict[str, Any] = {"data": type(data).__name__}
        metrics = getattr(data, "cumulative_metrics", None)
        if metrics is not None:
            out["host_to_disk"] = float(metrics.get(("disk-write", "bytes"), 0.0))
            out["disk_to_host"] = float(metrics.get(("disk-read", "bytes"), 0.0))
            return out
        out.update(self.counters)
        if not self.counters:
            out["note"] = "no spill buffer with counters on this worker"
        return out


def _read_spill_counters(dask_worker) -> dict[str, Any]:
    """On a worker (by ``client.run``): its :class:`SpillCounters`' reading."""
    return dask_worker.plugins[SpillCounters.name].read()


def spill_counters(client) -> dict[str, dict[str, Any]]:
    """Every worker's cumulative spill counters (see :class:`SpillCounters`, registered
    here on first use)."""
    client.register_plugin(SpillCounters())
    return client.run(_read_spill_counters)


#: The counters that count bytes leaving a tier (unspilling, disk -> host, is not spilling).
SPILL_OUT = ("device_to_host", "host_to_disk")


def spilled_between(before: dict[str, dict[str, Any]],
                    after: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """Bytes moved per direction, summed over workers, between two counter readings;
    ``total_bytes`` counts only spilling (device -> host, host -> disk)."""
    total: dict[str, float] = {}
    for worker, now in after.items():
        then = before.get(worker, {})
        for key, value in now.items():
            if isinstance(value, float):
                total[key] = total.get(key, 0.0) + value - then.get(key, 0.0)
    out = {key: total[key] for key in SPILL_OUT if key in total}
    return {"bytes": total, "total_bytes": sum(out.values()) if out else 0.0,
            "worker_data": sorted({v["data"] for v in after.values()})}
