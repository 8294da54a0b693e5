"""cuBLAS's own Gauss product, ``cublasZgemm3m``, which CuPy does not bind, and a
Cholesky round on CuPy's cuSOLVER and cuBLAS bindings without CuPy's copies.

It makes a complex128 product as three real ones inside cuBLAS, on CuPy's handle and
current stream, straight into an interleaved result: no planes of the operands, no
combining pass. Where the result is small against the operands (the sketch pieces
and environment updates: a few hundred rows) that beats src_dask's own planes
(``_kernels._three_real_product``); where the result is large, the planes win
(benchmarks/README.md, "Complex products").

The library is the ``libcublas`` CuPy has loaded (found in ``/proc/self/maps``), so
no second copy of cuBLAS is loaded; where it is not found, or has no such function,
:func:`available` is False and the callers make the product another way.
"""

from __future__ import annotations

import ctypes
import threading
from typing import Any

_OP = {"N": 0, "T": 1, "C": 2}  # cublasOperation_t
_fn: Any = None
_looked = False
_lock = threading.Lock()


def _find() -> Any:
    """``cublasZgemm3m`` of the cuBLAS CuPy uses, typed; None where there is none."""
    global _fn, _looked
    with _lock:
        if _looked:
            return _fn
        _looked = True
        try:
            import cupy

            cupy.cuda.device.get_cublas_handle()  # loads cuBLAS
            with open("/proc/self/maps") as maps:
                paths = {line.split()[-1] for line in maps if "/libcublas.so" in line}
            (path,) = paths
            fn = ctypes.CDLL(path).cublasZgemm3m
        except (ImportError, OSError, ValueError, AttributeError):
            return None
        fn.restype = ctypes.c_int
        fn.argtypes = [ctypes.c_void_p] + [ctypes.c_int] * 5 + [
            ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int, ctypes.c_void_p, ctypes.c_int,
            ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int]
        _fn = fn
        return fn


def available() -> bool:
    """Whether :func:`gemm3m` can run here."""
    return _find() is not None


def _operand(x: Any, conj: bool) -> tuple[Any, str, int]:
    """``x`` (2-D, row-major ``m × k``) as cuBLAS sees it (column-major): the array, its
    operation and leading dimension; a copy where no operation reads it in place."""
    import cupy

    if x.flags.c_contiguous and not conj:
        return x, "N", x.shape[1]
    if x.flags.f_contiguous:  # xᵀ is row-major: cuBLAS transposes (and conjugates) it
        return x, "C" if conj else "T", x.shape[0]
    x = cupy.ascontiguousarray(x.conj() if conj else x)
    return x, "N", x.shape[1]


def gemm3m(a: Any, b: Any, conj_a: bool = False) -> Any:
    """``conj(a) @ b`` or ``a @ b`` for 2-D complex128 CuPy arrays, by ``cublasZgemm3m``."""
    import cupy

    fn = _find()
    m, k = a.shape
    n = b.shape[1]
    out = cupy.empty((m, n), dtype=cupy.complex128)
    if 0 in (m, k, n):
        out.fill(0)
        return out
    if max(m, k, n) >= 2**31:
        raise ValueError(f"cublasZgemm3m takes 32-bit dimensions, not {(m, k, n)}")
    a, op_a, lda = _operand(a, conj_a)
    b, op_b, ldb = _operand(b, False)
    one, zero = (ctypes.c_double * 2)(1.0, 0.0), (ctypes.c_double * 2)(0.0, 0.0)
    handle = _cublas_handle()
    # row-major out = a b is column-major outᵀ = bᵀ aᵀ
    status = fn(handle, _OP[op_b], _OP[op_a], n, m, k, one, b.data.ptr, ldb, a.data.ptr, lda,
                zero, out.data.ptr, n)
    if status == 3:  # CUBLAS_STATUS_ALLOC_FAILED: a MemoryError, which _oom halves
        raise MemoryError(f"cublasZgemm3m could not allocate its workspace for {(m, k, n)}")
    if status != 0:
        raise RuntimeError(f"cublasZgemm3m failed with status {status} for {(m, k, n)}")
    return out


_BLAS = {"f": "s", "d": "d", "F": "c", "D": "z"}  # a dtype's letter in BLAS's names


def _cublas_handle() -> int:
    """CuPy's cuBLAS handle of this thread and device, set to its current stream (the
    handle is shared with CuPy's own calls, which set their stream each time too)."""
    import cupy
    from cupy_backends.cuda.libs import cublas

    handle = cupy.cuda.device.get_cublas_handle()
    cublas.setStream(handle, cupy.cuda.get_current_stream().ptr)
    return handle


def cholesky_round(rows: Any, gram: Any) -> Any:
    """``conj(L)⁻¹ rows`` with ``L Lᴴ = gram`` for 2-D CuPy arrays: cuSOLVER's ``potrf``
    in place on ``gram`` (a temporary of the caller's: overwritten) and cuBLAS's
    ``trsm`` on a copy of ``rows``, each reading the row-major arrays as they lie.

    CuPy's ``cholesky`` and ``solve_triangular`` copy both arrays into the other
    order and factor with the upper triangle, which cuSOLVER does at less than half
    the speed of the lower one (benchmarks/README.md, "CholeskyQR"). Read
    column-major, ``gram`` is ``conj(gram)``, whose lower Cholesky factor is
    ``conj(L)``, and ``rows`` is ``rowsᵀ``: ``conj(L)⁻¹ rows`` is the solve
    ``X conj(L)ᵀ = rowsᵀ`` from the right. A ``gram`` that is not positive definite
    leaves the factor partly made, without an error here: the rows that come back
    are then not orthonormal, which the caller measures."""
    import cupy
    import numpy as np
    from cupy_backends.cuda.libs import cublas, cusolver

    n, m = rows.shape
    kind = _BLAS[np.dtype(rows.dtype).char]
    gram = cupy.ascontiguousarray(gram, dtype=rows.dtype)
    out = cupy.array(rows, order="C", copy=True)
    if n == 0 or m == 0:
        return out
    stream = cupy.cuda.get_current_stream().ptr
    solver = cupy.cuda.device.get_cusolver_handle()
    cusolver.setStream(solver, stream)
    lower = cublas.CUBLAS_FILL_MODE_LOWER
    size = getattr(cusolver, f"{kind}potrf_bufferSize")(solver, lower, n, gram.data.ptr, n)
    work = cupy.empty(max(size, 1), dtype=rows.dtype)
    info = cupy.empty(1, dtype=np.int32)
    getattr(cusolver, f"{kind}potrf")(solver, lower, n, gram.data.ptr, n, work.data.ptr,
                                      size, info.data.ptr)
    one = np.ones(1, dtype=rows.dtype)
    getattr(cublas, f"{kind}trsm")(_cublas_handle(), cublas.CUBLAS_SIDE_RIGHT, lower,
                                   cublas.CUBLAS_OP_T, cublas.CUBLAS_DIAG_NON_UNIT, m, n,
                                   one.ctypes.data, gram.data.ptr, n, out.data.ptr, m)
    return out
