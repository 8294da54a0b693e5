# ruff: noqa: T201
"""The device a benchmark runs on and its complex128 GEMM rate.

:class:`Device` is the GPU (CuPy arrays) when CuPy is importable and sees a
CUDA device, else the CPU (NumPy arrays); it synchronizes, copies quimb
networks to itself and frees CuPy's pool. :func:`run_gemm` measures the GEMM
rate that a run's "of GEMM" fractions refer to (see :mod:`flops`).
"""

from __future__ import annotations

import importlib.util
import time
from typing import Any

import numpy as np


def gpu_count() -> int:
    """CUDA devices CuPy sees in this process (0 without CuPy or a driver)."""
    try:
        import cupy

        return int(cupy.cuda.runtime.getDeviceCount())
    except Exception:  # noqa: BLE001 - no cupy, no driver, no device: all mean 0
        return 0


class Device:
    """Where a benchmark runs: ``"gpu"`` (CuPy arrays) or ``"cpu"`` (NumPy arrays).

    ``"auto"`` means the GPU when CuPy sees one (and, with ``cluster``, dask_cuda
    is importable too: the GPU cluster needs it).
    """

    def __init__(self, want: str = "auto", cluster: bool = False):
        if want not in ("auto", "cpu", "gpu"):
            raise ValueError(f"device: expected auto, cpu or gpu, got {want!r}")
        gpus = gpu_count()
        missing = ("CuPy is not importable or sees no CUDA device" if not gpus else
                   "dask_cuda is not importable" if cluster
                   and importlib.util.find_spec("dask_cuda") is None else None)
        if want == "gpu" and missing:
            raise RuntimeError(f"--device gpu: {missing}")
        self.name = "gpu" if want != "cpu" and not missing else "cpu"
        self.gpus = gpus  # visible GPUs, even when the benchmark runs on the CPU

    @property
    def is_gpu(self) -> bool:
        return self.name == "gpu"

    @property
    def xp(self):
        if self.is_gpu:
            import cupy

            return cupy
        return np

    def sync(self) -> None:
        """Wait for the device's queued work (a no-op on the CPU)."""
        if self.is_gpu:
            import cupy

            cupy.cuda.Device().synchronize()

    def to_device(self, tn):
        """A quimb tensor network with its arrays on this device (a copy)."""
        tn = tn.copy()
        if self.is_gpu:
            import cupy

            tn.apply_to_arrays(cupy.asarray)
        return tn

    def free_pool(self) -> None:
        """Return CuPy's cached blocks to the driver, so a run's peak starts from zero."""
        if self.is_gpu:
            import cupy

            self.sync()
            cupy.get_default_memory_pool().free_all_blocks()

    def describe(self) -> dict[str, Any]:
        out: dict[str, Any] = {"name": self.name}
        if self.is_gpu:
            import cupy

            props = cupy.cuda.runtime.getDeviceProperties(0)
            name = props["name"]
            out.update(gpu_count=self.gpus,
                       gpu=name.decode(errors="replace") if isinstance(name, bytes) else name,
                       memory_bytes=int(props["totalGlobalMem"]),
                       cuda_runtime=cupy.cuda.runtime.runtimeGetVersion(),
                       cuda_driver=cupy.cuda.runtime.driverGetVersion())
        return out


def gemm_rate(n: int, repeats: int, device: Device | None = None) -> dict[str, Any]:
    """Best-of-``repeats`` complex128 ``n x n`` matmul rate on ``device``, 8 n^3 flop each."""
    device = device or Device("cpu")
    xp = device.xp
    rng = np.random.default_rng(0)
    a = xp.asarray(rng.standard_normal((n, n)) + 1j * rng.standard_normal((n, n)))
    b = xp.asarray(rng.standard_normal((n, n)) + 1j * rng.standard_normal((n, n)))
    c = a @ b  # warm-up
    device.sync()
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        c = a @ b
        device.sync()
        best = min(best, time.perf_counter() - t0)
    del a, b, c
    device.free_pool()
    flops = 8.0 * n**3
    return {"n": n, "repeats": repeats, "best_s": best, "gflops": flops / best / 1e9,
            "tflops": flops / best / 1e12, "device": device.name}


def run_gemm(n: int | None, quick: bool, device: Device) -> dict[str, Any]:
    """The GEMM rate a run's fractions refer to, printed: ``n`` x ``n`` (default 8192
    on a GPU, 2048 on a CPU; a quarter of that with ``quick``), best of 5."""
    if n is None:
        n = (8192 if device.is_gpu else 2048) // (4 if quick else 1)
    gemm = gemm_rate(n, repeats=5, device=device)
    device.free_pool()  # the matrices' 3 GiB would otherwise stay cached beside the workers
    print(f"complex128 GEMM {n}^3 on the {device.name.upper()}: {gemm['tflops']:.3f} TFLOP/s",
          flush=True)
    return gemm
