# ruff: noqa: T201
"""One CholeskyQR round on the GPU (pass 2's basis, docs/design.md §2.4), CuPy's way and
src_dask's, side by side.

For each ``n × m`` block of sketch rows (complex128; the MPO·MPS χ=1000 site is
1000 × 2000, the D_M=1000 stack's 500 × 8000) the round ``conj(L)⁻¹ rows`` with
``L Lᴴ = conj(rows) rowsᵀ``, best of 10 after a warm-up, by CUDA events:

- ``cupy``: ``cupy.linalg.cholesky`` then ``cupyx.scipy.linalg.solve_triangular``
  (each copies its operands into the other order; cuSOLVER's upper-triangle ``potrf``);
- ``direct``: ``potrf`` of the lower triangle in place and ``trsm`` from the right
  on the arrays as they lie (what src_dask's pass 2 does on a GPU), on
  CuPy's own cuSOLVER and cuBLAS bindings;
- the pieces apart (``potrf`` upper and lower, ``trsm``, the Gram matrix) and
  cuSOLVER's Householder QR of the same block, for scale.

``direct_err``: its largest difference from ``cupy``'s, relative to the largest entry.

    PYTHONPATH=src:benchmarks python benchmarks/tools/cholesky_round.py --out F.json
"""

from __future__ import annotations

import argparse
import json
from datetime import UTC, datetime
from typing import Any

import numpy as np

SHAPES = [(1000, 2000), (1000, 8000), (500, 8000), (2000, 4000), (250, 1000)]


def main() -> None:
    import cupy as cp
    from cupy_backends.cuda.libs import cublas, cusolver
    from cupyx.scipy.linalg import solve_triangular

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default="cholesky_round.json")
    out = ap.parse_args().out
    res: dict[str, Any] = {"date": datetime.now(UTC).isoformat(timespec="seconds"),
                           "gpu": cp.cuda.runtime.getDeviceProperties(0)["name"].decode(),
                           "unit": "ms, best of 10", "shapes": []}
    solver, blas = cp.cuda.device.get_cusolver_handle(), cp.cuda.device.get_cublas_handle()
    cusolver.setStream(solver, cp.cuda.get_current_stream().ptr)
    cublas.setStream(blas, cp.cuda.get_current_stream().ptr)
    lower, upper = cublas.CUBLAS_FILL_MODE_LOWER, cublas.CUBLAS_FILL_MODE_UPPER
    one = np.ones(1, np.complex128)

    def timed(f: Any) -> float:
        f()
        cp.cuda.Device().synchronize()
        best = float("inf")
        for _ in range(10):
            start, end = cp.cuda.Event(), cp.cuda.Event()
            start.record()
            f()
            end.record()
            end.synchronize()
            best = min(best, cp.cuda.get_elapsed_time(start, end))
        return best

    rng = cp.random.default_rng(0)

    def measure(n: int, m: int) -> dict[str, Any]:
        rows = rng.standard_normal((n, m)) + 1j * rng.standard_normal((n, m))
        gram = rows.conj() @ rows.T

        def potrf(fill: int) -> Any:
            g = gram.copy()
            size = cusolver.zpotrf_bufferSize(solver, fill, n, g.data.ptr, n)
            work, info = cp.empty(size, cp.complex128), cp.empty(1, cp.int32)
            cusolver.zpotrf(solver, fill, n, g.data.ptr, n, work.data.ptr, size, info.data.ptr)
            return g

        factor = potrf(lower)

        def trsm() -> Any:
            x = rows.copy()
            cublas.ztrsm(blas, cublas.CUBLAS_SIDE_RIGHT, lower, cublas.CUBLAS_OP_T,
                         cublas.CUBLAS_DIAG_NON_UNIT, m, n, one.ctypes.data, factor.data.ptr, n,
                         x.data.ptr, m)
            return x

        cupy_factor = cp.linalg.cholesky(gram).conj()

        def cupy_solve() -> Any:
            return solve_triangular(cupy_factor, rows, lower=True, check_finite=False)

        ref = cupy_solve()
        return {"n": n, "m": m,
                "cupy": timed(lambda: solve_triangular(cp.linalg.cholesky(gram).conj(), rows,
                                                       lower=True, check_finite=False)),
                "direct": timed(lambda: (potrf(lower), trsm())),
                "cholesky_cupy": timed(lambda: cp.linalg.cholesky(gram)),
                "potrf_upper": timed(lambda: potrf(upper)),
                "potrf_lower": timed(lambda: potrf(lower)),
                "solve_cupy": timed(cupy_solve), "trsm": timed(trsm),
                "gram": timed(lambda: rows.conj() @ rows.T),
                "householder_qr": timed(lambda: cp.linalg.qr(rows.T)),
                "direct_err": float(cp.abs(trsm() - ref).max() / cp.abs(ref).max())}

    for n, m in SHAPES:
        row = measure(n, m)
        print(json.dumps(row), flush=True)
        res["shapes"].append(row)
        cp.get_default_memory_pool().free_all_blocks()
    with open(out, "w") as f:
        json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
