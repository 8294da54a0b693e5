# ruff: noqa: T201
"""One complex128 product on the GPU, each way src_dask can make it, side by side.

For each ``m k n`` (the shapes of one D_M=1000 stack site and one MPO·MPS χ=1000 site,
and 8192³) two random operands are multiplied, median of 5 after a warm-up, timed by
CUDA events (issue 31, items 1 and 5):

- ``native``: ``cupy.matmul`` (ZGEMM);
- ``zgemm3m``: cuBLAS's own Gauss product, ``cublasZgemm3m`` (``src_dask._cublas``);
- ``realview``: one real GEMM of ``a``'s interleaved parts
  (``src_dask._kernels._interleaved_product``, what thin products are made as);
- ``lib3m``: src_dask's three real products from planes
  (``src_dask._kernels._three_real_product``).

Each way's largest difference from ZGEMM is relative to the result's largest entry.
Then ``cublasZgemm3m`` runs once more on the piece's shape with all but 2 GB and all but
256 MB of the device taken (``little_memory``): whether it allocates device memory of
its own, outside RMM's and CuPy's pools, which the plan could not count.

    python benchmarks/tools/complex_products.py --out complex_products.json
"""

from __future__ import annotations

import argparse
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


def main() -> None:
    import cupy as cp

    from src_dask import _cublas, _kernels

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default="complex_products.json")
    out = ap.parse_args().out
    ways = {"native": cp.matmul, "zgemm3m": _cublas.gemm3m,
            "realview": lambda a, b: _kernels._interleaved_product(cp, a, b, False, None),
            "lib3m": lambda a, b: _kernels._three_real_product(cp, a, b, False, None)}
    res: dict[str, Any] = {"date": datetime.now(UTC).isoformat(timespec="seconds"),
                           "gpu": cp.cuda.runtime.getDeviceProperties(0)["name"].decode(),
                           "has_zgemm3m": _cublas.available(), "shapes": []}

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
    res["little_memory"] = little_memory(cp, _cublas) if _cublas.available() else None
    print(json.dumps(res["little_memory"]), flush=True)
    with open(out, "w") as f:
        json.dump(res, f, indent=1)


def little_memory(cp: Any, cublas: Any, m: int = 500, k: int = 64000, n: int = 8000) -> dict:
    """``cublasZgemm3m`` of ``m k n`` with 2 GB, then 256 MB of the device left free:
    whether it ran and was right, by how much it left."""
    a, b = cp.ones((m, k), cp.complex128), cp.ones((k, n), cp.complex128)
    out = {}
    for left in (2 << 30, 256 << 20):
        cp.get_default_memory_pool().free_all_blocks()
        free, _ = cp.cuda.runtime.memGetInfo()
        taken = cp.cuda.runtime.malloc(free - left)
        try:
            c = cublas.gemm3m(a, b)
            out[str(left)] = {"ok": bool(abs(complex(c[0, 0]) - k) < 1e-6)}
        except Exception as err:  # noqa: BLE001 - what failed is the answer
            out[str(left)] = {"error": repr(err)[:200]}
        finally:
            cp.cuda.Device().synchronize()
            cp.cuda.runtime.free(taken)
    return out


if __name__ == "__main__":
    main()
