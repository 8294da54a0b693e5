# ruff: noqa: T201
"""One complex128 product on the GPU, each way src_dask can make it, side by side.

For each ``m k n`` (the shapes of one D_M=1000 stack site and one MPO·MPS χ=1000 site,
and 8192³) two random operands are multiplied, median of 5 after a warm-up, timed by
CUDA events (issue 31, items 1 and 5):

- ``native``: ``cupy.matmul`` (ZGEMM);
- ``zgemm3m``: cuBLAS's own Gauss product, ``cublasZgemm3m`` (what src_dask's
  ``complex-products: 3m`` makes products with a short side with);
- ``realview``: one real GEMM of ``a``'s interleaved parts (``profile_kernels.interleaved``,
  what thin products are made as);
- ``three``: three real products from planes in their textbook form
  (``profile_kernels.three_real``; src_dask fuses the split and the combining passes,
  so its own are faster: the H100 record's ``lib3m`` column timed those).

Each way's largest difference from ZGEMM is relative to the result's largest entry.
Then ``cublasZgemm3m`` runs once more on the piece's shape with all but 2 GB and all but
256 MB of the device taken (``little_memory``): whether it allocates device memory of
its own, outside RMM's and CuPy's pools, which the plan could not count.

    PYTHONPATH=src:benchmarks python benchmarks/tools/complex_products.py --out F.json
"""

from __future__ import annotations

import argparse
import ctypes
import json
from datetime import UTC, datetime
from typing import Any

import numpy as np

SHAPES = [("dm1000 pass1 wide", 16000, 1000, 8192), ("dm1000 project wide", 32000, 1000, 16000),
          ("dm1000 project thin", 32000000, 16, 16), ("dm1000 piece", 500, 64000, 8000),
          ("dm1000 update", 500, 8000, 64000), ("dm1000 pass1 512000", 512000, 256, 16),
          ("chi1000 pass1", 2000, 1000, 4000), ("chi1000 project", 4000, 1000, 2000),
          ("chi1000 piece", 1000, 4000, 2000), ("chi1000 thin", 1000000, 8, 8),
          ("8192^3", 8192, 8192, 8192)]


def cublas_3m() -> Any:
    """``f(a, b) = a @ b`` by ``cublasZgemm3m`` for C-contiguous complex128 CuPy matrices,
    on the cuBLAS CuPy has loaded (its handle and stream); None without one."""
    import cupy as cp

    cp.cuda.device.get_cublas_handle()
    with open("/proc/self/maps") as maps:
        found = sorted({ln.split()[-1] for ln in maps if "/libcublas.so" in ln})
    if not found or not hasattr(ctypes.CDLL(found[0]), "cublasZgemm3m"):
        return None
    fn = ctypes.CDLL(found[0]).cublasZgemm3m
    fn.argtypes = [ctypes.c_void_p, *[ctypes.c_int] * 5, *[ctypes.c_void_p] * 2, ctypes.c_int,
                   ctypes.c_void_p, ctypes.c_int, *[ctypes.c_void_p] * 2, ctypes.c_int]
    alpha, beta = (ctypes.c_double * 2)(1, 0), (ctypes.c_double * 2)(0, 0)

    def product(a: Any, b: Any) -> Any:
        (m, k), n = a.shape, b.shape[1]
        c = cp.empty((m, n), cp.complex128)
        handle = cp.cuda.device.get_cublas_handle()
        cp.cuda.cublas.setStream(handle, cp.cuda.get_current_stream().ptr)
        status = fn(handle, 0, 0, n, m, k, alpha, b.data.ptr, n, a.data.ptr, k, beta,
                    c.data.ptr, n)  # column-major: cᵀ = bᵀ aᵀ
        if status:
            raise RuntimeError(f"cublasZgemm3m: status {status}")
        return c

    return product


def main() -> None:
    import cupy as cp

    from tools.profile_kernels import interleaved, three_real

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default="complex_products.json")
    out = ap.parse_args().out
    gemm3m = cublas_3m()
    ways = {"native": cp.matmul, "zgemm3m": gemm3m,
            "realview": lambda a, b: interleaved(cp, a, b, False),
            "three": lambda a, b: three_real(cp, a, b, False)}
    ways = {way: f for way, f in ways.items() if f is not None}
    res: dict[str, Any] = {"date": datetime.now(UTC).isoformat(timespec="seconds"),
                           "gpu": cp.cuda.runtime.getDeviceProperties(0)["name"].decode(),
                           "has_zgemm3m": gemm3m is not None, "shapes": []}

    def timed(f: Any, *args: Any) -> float:
        f(*args)
        cp.cuda.Device().synchronize()
        times = []
        for _ in range(5):
            start, end = cp.cuda.Event(), cp.cuda.Event()
            start.record()
            f(*args)
            end.record()
            end.synchronize()
            times.append(cp.cuda.get_elapsed_time(start, end) / 1e3)
        return float(np.median(times))

    rng = cp.random.default_rng(0)
    for name, m, k, n in SHAPES:
        a = rng.standard_normal((m, k)) + 1j * rng.standard_normal((m, k))
        b = rng.standard_normal((k, n)) + 1j * rng.standard_normal((k, n))
        ref = a @ b
        scale = float(cp.abs(ref).max())
        row: dict[str, Any] = {"name": name, "mkn": [m, k, n]}
        for way, f in ways.items():
            try:
                row[way + "_s"] = timed(f, a, b)
                row[way + "_err"] = float(cp.abs(f(a, b) - ref).max()) / scale
            except Exception as err:  # noqa: BLE001 - recorded, the others go on
                row[way + "_error"] = repr(err)[:200]
            cp.get_default_memory_pool().free_all_blocks()
        row["native_tflops"] = 8.0 * m * k * n / row["native_s"] / 1e12
        print(json.dumps(row), flush=True)
        res["shapes"].append(row)
        del a, b, ref
        cp.get_default_memory_pool().free_all_blocks()
    res["little_memory"] = little_memory(cp, gemm3m) if gemm3m is not None else None
    print(json.dumps(res["little_memory"]), flush=True)
    with open(out, "w") as f:
        json.dump(res, f, indent=1)


def little_memory(cp: Any, gemm3m: Any, m: int = 500, k: int = 64000, n: int = 8000) -> dict:
    """``cublasZgemm3m`` of ``m k n`` with 2 GB, then 256 MB of the device left free:
    whether it ran and was right, by how much it left."""
    a, b = cp.ones((m, k), cp.complex128), cp.ones((k, n), cp.complex128)
    out = {}
    for left in (2 << 30, 256 << 20):
        cp.get_default_memory_pool().free_all_blocks()
        free, _ = cp.cuda.runtime.memGetInfo()
        taken = cp.cuda.runtime.malloc(free - left)
        try:
            c = gemm3m(a, b)
            out[str(left)] = {"ok": bool(abs(complex(c[0, 0]) - k) < 1e-6)}
        except Exception as err:  # noqa: BLE001 - what failed is the answer
            out[str(left)] = {"error": repr(err)[:200]}
        finally:
            cp.cuda.Device().synchronize()
            cp.cuda.runtime.free(taken)
    return out


if __name__ == "__main__":
    main()
