"""cuBLAS's own Gauss product, ``cublasZgemm3m``, which CuPy does not bind.

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
    handle = cupy.cuda.device.get_cublas_handle()
    cupy.cuda.cublas.setStream(handle, cupy.cuda.get_current_stream().ptr)
    # row-major out = a b is column-major outᵀ = bᵀ aᵀ
    status = fn(handle, _OP[op_b], _OP[op_a], n, m, k, one, b.data.ptr, ldb, a.data.ptr, lda,
                zero, out.data.ptr, n)
    if status == 3:  # CUBLAS_STATUS_ALLOC_FAILED: a MemoryError, which _oom halves
        raise MemoryError(f"cublasZgemm3m could not allocate its workspace for {(m, k, n)}")
    if status != 0:
        raise RuntimeError(f"cublasZgemm3m failed with status {status} for {(m, k, n)}")
    return out
