"""Clusters and devices: where the kernels run.

:func:`cluster` starts a sensible local cluster: a ``dask_cuda.LocalCUDACluster``
with one worker per GPU when there are GPUs, a CPU ``LocalCluster`` otherwise.
``dask_cuda``, ``cupy`` and ``rmm`` are imported lazily, so ``import src_dask``
works on machines without them.

The device a run uses is chosen once, on the client, for the whole graph:
``dask.config`` key ``src_dask.device`` (``"auto"``, ``"cpu"`` or ``"gpu"``);
``"auto"`` means the GPU when the inputs are CuPy arrays or every worker (the
local process, without a client) has a usable GPU.
"""

from __future__ import annotations

import logging
import os
from typing import Any

import dask

log = logging.getLogger("src_dask")


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


def cluster(gpus: int | list[int] | None = None, device_memory_limit: str | float = 0.8,
            memory_limit: str | float = "auto", local_directory: str | None = None,
            protocol: str = "tcp", **kwargs: Any):
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
        Where workers spill to disk.
    protocol
        ``"tcp"`` or ``"ucx"`` (needs ``distributed-ucxx``).
    kwargs
        Passed on to ``LocalCUDACluster`` (or ``LocalCluster``).

    CuPy allocations go through RMM's asynchronous pool when ``rmm`` is
    installed, so memory freed by one task is reused by the next without
    synchronizing the device.
    """
    if not has_gpu():
        from distributed import LocalCluster

        log.info("cluster: no GPU found; starting a CPU LocalCluster")
        kwargs.setdefault("threads_per_worker", 1)
        return LocalCluster(memory_limit=memory_limit, local_directory=local_directory,
                            protocol=f"{protocol}://", **kwargs)
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
    return LocalCUDACluster(device_memory_limit=device_memory_limit, memory_limit=memory_limit,
                            local_directory=local_directory, protocol=protocol, **kwargs)
