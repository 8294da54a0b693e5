"""Per-site contractions of SRC as functions of NumPy or CuPy blocks.

Index names follow docs/design.md §1 for a ket stack of depth ``k`` padded to rank 4:
core ``T_i[a_i, b_i, x_{i-1}, x_i]``, sketch environment ``C[s, a_1..a_k]``,
Gaussian block ``Ω[s, x_0, x_k]``, right environment ``S[r, b_1..b_k]``.

Pass 2 forms the *projected core* ``Z[a.., r, x_0, x_k] = Π_i T_i · S`` once per
site; the sketch ``M = C·Z`` and the next environment ``S' = conj(η)·Z`` are
then two plain GEMMs. That costs about 25% fewer FLOPs than contracting ``M``
and ``S'`` separately and keeps the big products in BLAS/cuBLAS.

Every kernel is written once against the array namespace of its inputs
(``numpy`` or ``cupy``); contraction orders are planned by opt_einsum once per
shape and executed as batched matrix products (:func:`matmul`), complex ones made
from real products where that is faster (config ``complex-products``).
"""

from __future__ import annotations

from collections.abc import Callable
from functools import lru_cache
from math import prod
from typing import Any

import numpy as np
import opt_einsum as oe

from . import _cublas, _oom, config
from ._layout import pad
from ._layout import unpad as unpad
from ._transfer import is_cupy, to_device, wait_for


# -- array namespace ----------------------------------------------------------
def is_in_memory(x: Any) -> bool:
    """True for NumPy and CuPy arrays; not for lazy ones (Dask, Zarr, h5py, other
    array-likes) nor for a ``numpy.memmap``, whose data stays in its file until a
    site reads it."""
    return (isinstance(x, np.ndarray) and not isinstance(x, np.memmap)) or is_cupy(x)


def nbytes(x: Any) -> int:
    """Bytes of ``x``'s data, from its shape and dtype (array-likes need not have
    ``nbytes``)."""
    return prod(int(s) for s in x.shape) * np.dtype(x.dtype).itemsize


def xp_of(x: Any):
    """``numpy`` or ``cupy``, whichever ``x`` belongs to."""
    if is_cupy(x):
        import cupy

        return cupy
    return np


def on_device(x: Any, device: str) -> Any:
    """``x`` as a CuPy array for ``device="gpu"``, unchanged otherwise."""
    if device == "gpu":
        return to_device(x)
    return x


def all_finite(x: Any) -> bool:
    """Whether ``x`` holds no NaN or inf. A NaN or inf makes the sum non-finite, so a
    finite sum settles it in one read without a temporary the size of ``x``; only a
    non-finite sum (or an overflowing one) is checked element by element."""
    if np.dtype(x.dtype).kind not in "fc":
        return True
    xp = xp_of(x)
    total = x.sum()
    if xp is not np:
        wait_for()  # then the reads below do not wait
    return bool(xp.isfinite(total)) or bool(xp.isfinite(x).all())


def all_finite_each(xs: list[Any]) -> list[bool]:
    """:func:`all_finite` of each of ``xs``, waiting for a GPU once: every array's sum
    queued, then their verdicts read together (a wait an array, each after a pass over
    it, leaves the device idle between). Arrays of several devices (or NumPy ones) are
    tested one by one."""
    xp = xp_of(xs[0]) if xs else np
    if xp is np or len({x.device.id for x in xs}) > 1:
        return [all_finite(x) for x in xs]
    floats = [np.dtype(x.dtype).kind in "fc" for x in xs]
    with xs[0].device:
        totals = [xp.isfinite(x.sum()) for x, f in zip(xs, floats, strict=True) if f]
        wait_for()
        sums = iter(xp.stack(totals).get().tolist() if totals else [])
        return [not f or next(sums) or bool(xp.isfinite(x).all())
                for x, f in zip(xs, floats, strict=True)]


# -- complex products from real ones -------------------------------------------
def three_real(dtype: Any, device: str) -> bool:
    """Whether wide complex products of ``dtype`` on ``device`` are made as three real
    ones: complex128 ones where config ``complex-products`` is ``3m``, or ``auto`` on a
    GPU (faster there on whole stacks; slower on the CPU's BLAS: benchmarks/README.md)."""
    if np.dtype(dtype) != np.complex128:  # before the config: every product asks
        return False
    way = _complex_products()
    return way == "3m" or (way == "auto" and device == "gpu")


def interleaved(dtype: Any) -> bool:
    """Whether thin complex products of ``dtype`` are made as one real product of
    interleaved parts (:func:`_interleaved_product`): complex ones unless config
    ``complex-products`` is ``native``."""
    if np.dtype(dtype).kind != "c":
        return False
    return _complex_products() != "native"


def _complex_products() -> str:
    """Config ``complex-products``, checked against its settings."""
    return config.get_choice("complex-products", ("native", "3m", "auto"))


def product_way(a_dtype: Any, b_dtype: Any, dims: tuple[int, int, int], device: str,
                batched: bool = False) -> str:
    """How :func:`matmul` makes a product of ``(m, k, n) = dims``: ``"interleaved"``
    (thin: ``k`` and ``n`` at most :data:`THIN_MAX`, ``a`` of at least
    :data:`THIN_MIN_ELEMENTS`); with :func:`three_real`,
    ``"cublas"`` (on a GPU, one product with a short side: ``k`` at least
    :data:`THREE_REAL_MIN`, the lesser of ``m`` and ``n`` from 256 to
    :data:`CUBLAS_3M_SIDE`, by ``cublasZgemm3m``) or ``"three"`` (wide: all three at
    least :data:`THREE_REAL_MIN`, src_dask's planes, but not in a piece of a step cut
    to fit memory: ``_oom.in_piece``); else ``"native"``."""
    if np.dtype(a_dtype) != np.dtype(b_dtype):
        return "native"
    m, k, n = dims
    if max(k, n) <= THIN_MAX and m * k >= THIN_MIN_ELEMENTS and interleaved(a_dtype):
        return "interleaved"
    if not three_real(a_dtype, device):
        return "native"
    if (device == "gpu" and not batched and k >= THREE_REAL_MIN
            and 256 <= min(m, n) <= CUBLAS_3M_SIDE and _cublas.available()):
        return "cublas"
    if _oom.in_piece():
        return "native"
    return "three" if min(dims) >= THREE_REAL_MIN else "native"


def matmul(a: Any, b: Any, *, conj_a: bool = False,
           shapes: tuple[tuple[int, ...], tuple[int, ...]] | None = None,
           gauss: bool = False) -> Any:
    """``conj(a) @ b`` (``conj_a``) or ``a @ b``, batched over leading axes, the
    operands reshaped to ``shapes`` first (when given).

    Complex products are made the way :func:`product_way` picks. A *thin* one
    (a few columns of ``b``) is one real product of ``a``'s interleaved parts
    (:func:`_interleaved_product`): the complex GEMM's own multiplications and
    sums, at the memory-bound speed that BLAS's complex kernels miss at these shapes.
    A *wide* complex128 one may be three real ones (Gauss's trick): ``t1 = a_r b_r``,
    ``t2 = a_i b_i``, ``t3 = (a_r + a_i)(b_r + b_i)``, real part ``t1 - t2``,
    imaginary ``t3 - t1 - t2``; 3/4 of the FLOPs at the real GEMM's rate, with
    rounding errors of the size of the native product's relative to the norms of
    the operands. ``a`` and ``b`` may be strided views: a transposed operand is
    split straight into its real planes, which are then reshaped and replace the
    copy a native product's reshape makes. The planes and the three products take
    ``a``, ``b`` and 1.5 times the result in memory besides the result
    (:func:`three_real_elements`); a product that runs out of memory that way is
    made natively instead. ``gauss``: such a product comes back as its three real
    products, not summed (a :class:`Gauss`).
    """
    xp = xp_of(a)
    sb = b.shape if shapes is None else shapes[1]
    batched = len(sb) > 2 and prod(sb[:-2]) > 1
    way = product_way(a.dtype, b.dtype, _gemm_dims(a, b, shapes),
                      "gpu" if xp is not np else "cpu", batched)
    if way == "interleaved":
        return _interleaved_product(xp, a, b, conj_a, shapes)
    if way == "three":
        from ._oom import is_oom

        try:
            return _three_real_product(xp, a, b, conj_a, shapes, combine=not gauss)
        except Exception as err:  # noqa: BLE001 - only out-of-memory falls back
            if not is_oom(err):
                raise
    if shapes is not None:
        a, b = a.reshape(shapes[0]), b.reshape(shapes[1])
    if way == "cublas":  # one product (batched is never "cublas"): its 2-D operands
        out = _cublas.gemm3m(a.reshape(a.shape[-2:]), b.reshape(b.shape[-2:]), conj_a)
        return out.reshape(tuple(sb[:-2]) + out.shape)
    return xp.matmul(a.conj() if conj_a else a, b)


#: The most inner dimension and columns of a *thin* complex product, made as one real
#: product of interleaved parts: BLAS's complex kernels run such memory-bound products
#: well below the memory's speed (one H100: 32 M×16×16 in 13.0 ms as ZGEMM, 6.5 ms so;
#: benchmarks/README.md, "Complex products").
THIN_MAX = 32
#: The fewest elements of ``a`` in a thin product made interleaved: smaller ones take
#: microseconds either way, and building ``w`` would add to them.
THIN_MIN_ELEMENTS = 1 << 15
#: The longest short side (rows or columns) of a result ``cublasZgemm3m`` makes: the
#: sketch pieces and environment updates, whose rows are sketch columns. Results large
#: both ways are made faster with src_dask's planes (one H200: benchmarks/README.md,
#: "Complex products").
CUBLAS_3M_SIDE = 4096


def planes(dtype: Any, device: str, rows: int) -> bool:
    """Whether wide products of at most ``rows`` rows (a sketch block, an environment's
    rows) hold the real planes of their operands (:func:`_three_real_product`): with
    :func:`three_real`, but not where cuBLAS's own 3M makes them, which needs none (the
    plan assumes a GPU worker's cuBLAS has it)."""
    return three_real(dtype, device) and not (device == "gpu" and rows <= CUBLAS_3M_SIDE)


def _interleaved_product(xp: Any, a: Any, b: Any, conj_a: bool,
                         shapes: tuple[tuple[int, ...], tuple[int, ...]] | None) -> Any:
    """``conj(a) @ b`` or ``a @ b`` as one real product: ``a``'s rows read as real rows
    of interleaved (real, imaginary) parts (a view, no pass over ``a``), times the real
    ``(2k, 2n)`` matrix ``w`` that maps a pair ``(x_r, x_i)`` at row ``p`` to
    ``x · b[p, j]`` (or ``conj(x) · b[p, j]``) at columns ``(2j, 2j + 1)``; the
    product's rows are the result's interleaved parts (a view again). ``w`` holds
    twice ``b``'s elements, which a thin product's ``b`` makes small."""
    if shapes is not None:
        a, b = a.reshape(shapes[0]), b.reshape(shapes[1])
    a = xp.ascontiguousarray(a)
    k, n = b.shape[-2:]
    w = xp.empty(tuple(b.shape[:-2]) + (k, 2, n, 2), dtype=a.real.dtype)
    w[..., 0, :, 0] = b.real
    w[..., 0, :, 1] = b.imag
    # (not negative(..., out=w[...]): NumPy 2.4's float32 loop wrote wrong values into
    # such a strided view of w; b is small, and the negated copy with it)
    if conj_a:  # conj(x) b: the imaginary part of x enters with the other sign
        w[..., 1, :, 0] = b.imag
        w[..., 1, :, 1] = -b.real
    else:
        w[..., 1, :, 0] = -b.imag
        w[..., 1, :, 1] = b.real
    rows = a.view(w.dtype)
    out = xp.matmul(rows, w.reshape(tuple(b.shape[:-2]) + (2 * k, 2 * n)))
    return out.view(a.dtype)


#: The least rows, inner dimension and columns of a complex product made as three real
#: ones: a thinner product is bound by memory, not arithmetic, and splitting its operands
#: into planes costs more than the real GEMMs save (profile_kernels.py).
THREE_REAL_MIN = 512


def _gemm_dims(a: Any, b: Any, shapes: tuple[tuple[int, ...], ...] | None) -> tuple[int, ...]:
    """``(m, k, n)`` of ``a @ b`` (``b`` reshaped to ``shapes[1]``), batches apart."""
    sb = tuple(int(d) for d in (b.shape if shapes is None else shapes[1]))
    k, n, batch = sb[-2], sb[-1], prod(sb[:-2])
    return prod(int(d) for d in a.shape) // max(1, k * batch), k, n


def _three_real_product(xp: Any, a: Any, b: Any, conj_a: bool,
                        shapes: tuple[tuple[int, ...], tuple[int, ...]] | None,
                        combine: bool = True) -> Any:
    pa, pb = _planes(xp, a, conj_a), _planes(xp, b, False)
    if shapes is not None:
        pa, pb = pa.reshape((2,) + tuple(shapes[0])), pb.reshape((2,) + tuple(shapes[1]))
    t12 = xp.matmul(pa, pb)  # (a_r b_r, a_i b_i) as one batched product
    pa[0] += pa[1]
    pb[0] += pb[1]
    t3 = xp.matmul(pa[0], pb[0])
    del pa, pb
    if not combine:
        return Gauss(t12, t3, a.dtype)
    return _combined(xp, t12, t3, a.dtype)


def _combined(xp: Any, t12: Any, t3: Any, dtype: Any) -> Any:
    """The complex product from the three real ones (``t12`` and ``t3`` overwritten on
    the CPU)."""
    out = xp.empty(t3.shape, dtype=dtype)
    if xp is np:
        t3 -= t12[0]
        t3 -= t12[1]
        t12[0] -= t12[1]
        out.real, out.imag = t12[0], t3
    else:
        _combine_kernel()(t12[0], t12[1], t3, out)
    return out


class Gauss:
    """A complex product ``t1 - t2 + i (t3 - t1 - t2)`` not yet summed: the three real
    products (``t12`` holding ``t1`` and ``t2`` along its first axis, ``t3`` of the same
    strides), reshaped and transposed as one array. The step of :func:`contract` that
    takes it reads the planes itself (:func:`_apply_small`), which saves the pass that
    writes the complex result and reads it back; any other step takes
    :meth:`combined`."""

    def __init__(self, t12: Any, t3: Any, dtype: Any) -> None:
        self.t12, self.t3, self.dtype = t12, t3, np.dtype(dtype)

    shape = property(lambda self: tuple(self.t3.shape))
    ndim = property(lambda self: self.t3.ndim)
    size = property(lambda self: self.t3.size)
    #: in bytes of the complex dtype, as the complex result would have them
    strides = property(lambda self: tuple(s * 2 for s in self.t3.strides))

    def reshape(self, shape: tuple[int, ...]) -> Gauss:
        return Gauss(self.t12.reshape((2,) + tuple(shape)), self.t3.reshape(shape), self.dtype)

    def transpose(self, perm: tuple[int, ...]) -> Gauss:
        return Gauss(self.t12.transpose((0,) + tuple(p + 1 for p in perm)),
                     self.t3.transpose(perm), self.dtype)

    def combined(self) -> Any:
        xp = xp_of(self.t3)
        if xp is np:  # NumPy's sums overwrite the products (only the tests get here)
            return _combined(xp, self.t12.copy(), self.t3.copy(), self.dtype)
        return _combined(xp, self.t12, self.t3, self.dtype)


def _planes(xp: Any, x: Any, conj: bool) -> Any:
    """``x``'s real and imaginary parts (negated for ``conj``) as one contiguous real
    array of shape ``(2,) + x.shape`` (on a GPU in one pass over ``x``)."""
    planes = xp.empty((2,) + tuple(x.shape), dtype=x.real.dtype)
    if xp is not np:
        _split_kernel()(x, conj, planes[0], planes[1])
        return planes
    planes[0] = x.real
    if conj:
        xp.negative(x.imag, out=planes[1])
    else:
        planes[1] = x.imag
    return planes


@lru_cache(maxsize=1)
def _split_kernel() -> Any:
    import cupy

    return cupy.ElementwiseKernel("complex128 x, bool conj", "float64 re, float64 im",
                                  "re = x.real(); im = conj ? -x.imag() : x.imag()",
                                  "src_dask_three_real_planes")


@lru_cache(maxsize=1)
def _combine_kernel() -> Any:
    import cupy

    return cupy.ElementwiseKernel("float64 t1, float64 t2, float64 t3", "complex128 out",
                                  "out = complex<double>(t1 - t2, t3 - t1 - t2)",
                                  "src_dask_three_real_combine")


def _device_of(x: Any) -> str:
    """``"gpu"`` for a CuPy array or a planner's stand-in on a GPU, else ``"cpu"``."""
    return "gpu" if is_cupy(x) or getattr(x, "device", None) == "gpu" else "cpu"


def three_real_elements(a: int, b: int, out: int) -> int:
    """Elements (of the complex dtype) a three-real product of operands of ``a`` and
    ``b`` elements into ``out`` holds besides its inputs, at its peak: the planes of
    both operands and the three real products, then the products and the result."""
    return max(a + b + (3 * out + 1) // 2, (5 * out + 1) // 2)


# -- contraction engine -------------------------------------------------------
@lru_cache(maxsize=512)
def _plan(eq: str, shapes: tuple[tuple[int, ...], ...]) -> tuple[list[tuple], str]:
    """Pairwise steps for ``eq``; each step: positions, terms, transposes, shapes."""
    lhs, out = eq.split("->")
    terms = lhs.split(",")
    sizes = {c: d for t, s in zip(terms, shapes, strict=True) for c, d in zip(t, s, strict=True)}
    optimize = "optimal" if len(terms) <= 6 else "dp"
    path, _ = oe.contract_path(eq, *shapes, shapes=True, optimize=optimize)
    steps = []
    for pos in path:
        picked = [terms[p] for p in pos]
        rest = [t for i, t in enumerate(terms) if i not in pos]
        keep = set(out).union(*rest)
        if len(picked) == 1:
            (ta,) = picked
            tr = "".join(c for c in dict.fromkeys(ta) if c in keep)
            steps.append((pos, "einsum", f"{ta}->{tr}"))
        else:
            ta, tb = picked
            both = [c for c in ta if c in tb]
            batch = [c for c in both if c in keep]
            contr = [c for c in both if c not in keep]
            fa = [c for c in ta if c not in tb and c in keep]
            fb = [c for c in tb if c not in ta and c in keep]
            sum_a = tuple(i for i, c in enumerate(ta) if c not in tb and c not in keep)
            sum_b = tuple(i for i, c in enumerate(tb) if c not in ta and c not in keep)
            ta_s = "".join(c for i, c in enumerate(ta) if i not in sum_a)
            tb_s = "".join(c for i, c in enumerate(tb) if i not in sum_b)
            perm_a = tuple(ta_s.index(c) for c in batch + fa + contr)
            perm_b = tuple(tb_s.index(c) for c in batch + contr + fb)
            nb, nfa = prod(sizes[c] for c in batch), prod(sizes[c] for c in fa)
            nc, nfb = prod(sizes[c] for c in contr), prod(sizes[c] for c in fb)
            tr = "".join(batch + fa + fb)
            steps.append((pos, "matmul", (sum_a, sum_b, perm_a, perm_b, (nb, nfa, nc),
                                          (nb, nc, nfb), tuple(sizes[c] for c in tr),
                                          len(batch), len(contr))))
        terms = rest + [tr]
    (final,) = terms
    return steps, "".join(final)


def contract(eq: str, *arrays: Any) -> Any:
    """``einsum(eq, *arrays)`` along opt_einsum's path, each pair as a (batched) GEMM."""
    xp = xp_of(arrays[0])
    steps, final = _plan(eq, tuple(tuple(a.shape) for a in arrays))
    out = eq.split("->")[1]
    ops = list(arrays)
    # a wide step's three real products go unsummed to the next step, which sums them
    # as it reads them where it is one _apply_small
    gauss = _applied_on(xp)
    for pos, how, spec in steps:
        picked = [ops[p] for p in pos]
        ops = [a for i, a in enumerate(ops) if i not in pos]
        if how == "einsum":
            ops.append(xp.einsum(spec, *_combined_all(picked)))
            continue
        sum_a, sum_b, perm_a, perm_b, shape_a, shape_b, shape_out, n_batch, n_contr = spec
        a, b = picked
        if sum_a or sum_b:
            a, b = _combined_all([a, b])
        if sum_a:
            a = a.sum(axis=sum_a)
        if sum_b:
            b = b.sum(axis=sum_b)
        a, b = a.transpose(perm_a), b.transpose(perm_b)
        if _applies(xp, a, b, n_batch, n_contr):
            last = not ops  # the result's memory in eq's output order: contiguous
            order = tuple(final.index(c) for c in out) if last else None
            ops.append(_apply_small(xp, a, b, n_batch, n_contr, order))
            continue
        a, b = _combined_all([a, b])
        ops.append(matmul(a, b, shapes=(shape_a, shape_b), gauss=gauss and bool(ops))
                   .reshape(shape_out))
    (res,) = _combined_all(ops)
    return res.transpose(tuple(final.index(c) for c in out))


def _combined_all(arrays: list[Any]) -> list[Any]:
    """``arrays`` with each :class:`Gauss` summed into its complex product."""
    return [x.combined() if isinstance(x, Gauss) else x for x in arrays]


#: The most elements of the small operand of a product :func:`_apply_small` makes, and
#: the fewest of the large one: a large tensor contracted over a few of its axes with a
#: small core (the projection's and pass 1's thin steps).
APPLY_SMALL_MAX = 1 << 16
APPLY_LARGE_MIN = 1 << 20
#: The most free elements of the small operand a batch, and the most contracted ones: a
#: thread holds that many sums and reads that many elements, and beyond a few dozen the
#: GEMM is the faster (one H100: pass 1's step of 16 × 256 over 512,000 columns in 2.7 ms
#: as a GEMM, 3.7 applied; benchmarks/README.md, "Small cores in one pass").
APPLY_FREE_MAX = 32
APPLY_CONTRACTED_MAX = 64
#: Whether NumPy operands take :func:`_apply_small` too (the tests' switch: on the CPU
#: BLAS makes these products well).
_APPLY_ON_CPU = False


def _applied_on(xp: Any) -> bool:
    """Whether products of ``xp``'s arrays may be :func:`_apply_small`'s: on a GPU, or
    on the tests' CPU."""
    return xp is not np or _APPLY_ON_CPU


def _applies(xp: Any, a: Any, b: Any, n_batch: int, n_contr: int) -> bool:
    """Whether the product of the (transposed) operands is one :func:`_apply_small`
    makes: on a GPU, a small operand with a few free and contracted elements a batch
    (a product bound by the memory's speed) and a large one; complex ones not with
    config ``complex-products: native``, which makes every complex product a ZGEMM."""
    if not _applied_on(xp) or a.dtype != b.dtype or a.dtype.kind not in "fc" \
            or min(*a.strides, *b.strides, 0) < 0:
        return False
    if a.dtype.kind == "c" and _complex_products() == "native":  # ZGEMM's bits, as promised
        return False
    small, large = sorted((a, b), key=lambda x: x.size)
    per_batch = small.size // max(1, prod(a.shape[:n_batch]))
    k = prod(b.shape[n_batch:n_batch + n_contr])
    return (small.size <= APPLY_SMALL_MAX and k <= APPLY_CONTRACTED_MAX
            and per_batch // max(k, 1) <= APPLY_FREE_MAX and large.size >= APPLY_LARGE_MIN)


def _apply_small(xp: Any, a: Any, b: Any, n_batch: int, n_contr: int,
                 order: tuple[int, ...] | None = None) -> Any:
    """``a @ b`` over ``n_contr`` axes, batched over ``n_batch``, of operands with axes
    ``(batch.., free_a.., contracted..)`` and ``(batch.., contracted.., free_b..)``, one of
    them small, as one pass over the large one: the result's axes
    ``(batch.., free_a.., free_b..)``.

    A matrix product would first copy the large operand, a strided view, into
    the GEMM's layout, and a GEMM with a side of a few elements runs far below the
    memory's speed. Here one GPU thread takes one element of the large operand's free
    (and batch) axes: it reads the contracted elements where they lie, multiplies each
    by the small operand's column and writes the sums, the small operand's free
    elements of the result: one read of the large operand and one write of the result.
    Neighbouring threads take neighbouring elements of the large operand and of the
    result. The result's memory holds its axes in ``order`` (a C-contiguous result in
    that order, for the caller's last transpose) or, None, the small operand's free axes
    first and then the large one's in its memory's order; the array returned is a view
    with the axes in the product's order.
    """
    small_is_a = a.size <= b.size
    large, small = (b, a) if small_is_a else (a, b)
    if isinstance(small, Gauss):  # only the large operand's planes are read as they lie
        small = small.combined()
        a, b = (small, b) if small_is_a else (a, small)
    batch = list(range(n_batch))
    if small_is_a:
        contr = list(range(n_batch, n_batch + n_contr))  # of b
        free = list(range(n_batch + n_contr, b.ndim))
        small_free = list(range(n_batch, a.ndim - n_contr))
        w = xp.ascontiguousarray(a)  # (batch, free, contracted)
    else:
        contr = list(range(a.ndim - n_contr, a.ndim))  # of a
        free = list(range(n_batch, a.ndim - n_contr))
        small_free = list(range(n_batch + n_contr, b.ndim))
        w = xp.ascontiguousarray(b.transpose(batch + small_free + list(range(
            n_batch, n_batch + n_contr))))
    k = prod(large.shape[i] for i in contr)
    m = prod(small.shape[i] for i in small_free)  # the small operand's free elements
    if isinstance(large, Gauss) and m > k:
        # the planes (1.5 times the complex elements) beside a larger result would hold
        # more than the complex operand and the combining pass did, which the memory
        # plan counts (contraction_elements): summed first
        large = large.combined()
    item = large.dtype.itemsize
    tstride = [s // item for s in large.strides]
    # the result's axes in the product's order: (size, stride in large, stride in w,
    # whether the small operand's free axis)
    later = [prod(large.shape[i] for i in batch[n + 1:]) for n in batch]
    axes = [(large.shape[i], tstride[i], later[i] * m * k, False) for i in batch]
    mine = [(small.shape[i], 0, 0, True) for i in small_free]
    theirs = [(large.shape[i], tstride[i], 0, False) for i in free]
    axes += mine + theirs if small_is_a else theirs + mine
    threads = sorted((n for n, ax in enumerate(axes) if not ax[3]), key=lambda n: -axes[n][1])
    if order is None:
        order = tuple(n for n, ax in enumerate(axes) if ax[3]) + tuple(threads)
    result = xp.empty([axes[n][0] for n in order], dtype=large.dtype)
    ostride = {n: result.strides[order.index(n)] // item for n in range(len(axes))}
    toff = _offsets([(large.shape[i], tstride[i]) for i in contr])
    ooff = _offsets([(axes[n][0], ostride[n]) for n, ax in enumerate(axes) if ax[3]])
    if result.size:
        _apply_kernel(xp, large, w.ravel(), m, k, _merged(
            [(axes[n][0], axes[n][1], axes[n][2], ostride[n]) for n in threads]),
            toff, ooff, result)
    return result.transpose([order.index(n) for n in range(len(order))])


def _offsets(axes: list[tuple[int, int]]) -> np.ndarray:
    """The offsets of every element of ``axes`` (sizes and strides), in C order."""
    offsets = np.zeros((), dtype=np.int64)
    for size, stride in axes:
        offsets = np.add.outer(offsets, np.arange(size, dtype=np.int64) * stride)
    return offsets.ravel()


def _merged(axes: list[tuple[int, ...]]) -> list[tuple[int, ...]]:
    """``(size, strides..)`` of axes, outer first, with neighbours that step through
    every array as one axis merged (fewer divisions a thread) and unit ones dropped."""
    out: list[tuple[int, ...]] = []
    for size, *strides in axes:
        if size == 1:
            continue
        if out and all(o == s * size for o, s in zip(out[-1][1:], strides, strict=True)):
            out[-1] = (out[-1][0] * size, *strides)
        else:
            out.append((size, *strides))
    return out or [(1,) + (0,) * (len(axes[0]) - 1 if axes else 3)]


def _apply_kernel(xp: Any, t: Any, w: Any, m: int, k: int, axes: list[tuple[int, ...]],
                  toff: np.ndarray, ooff: np.ndarray, out: Any) -> None:
    """For each element ``e`` of ``axes`` (sizes, strides in ``t``, ``w`` and ``out``):
    ``out[o_e + ooff[r]] = Σ_j w[w_e + r k + j] · t[t_e + toff[j]]`` for the ``m`` rows
    ``r`` of ``w``; ``t`` read through its memory (strides ≥ 0, all in elements), a
    :class:`Gauss` through its three planes."""
    item = t.dtype.itemsize
    span = 1 + sum((d - 1) * s for d, s in zip(t.shape, t.strides, strict=True)) // item
    sizes, ts, ws, os = (np.array(c, dtype=np.int64) for c in zip(*axes, strict=True))
    gauss = isinstance(t, Gauss)
    # the memory read, from the first element on: the complex operand's, or the first
    # real plane's with the second ``plane`` elements further, and the third's
    if gauss:
        plane = t.t12.strides[0] // t.t3.itemsize
        flat, flat3 = _flat(xp, t.t12[0], plane + span), _flat(xp, t.t3, span)
    else:
        plane, flat = 0, _flat(xp, t, span)
        flat3 = flat
    if xp is np:  # the same sums by NumPy: the tests check the indexing on the CPU
        if gauss:
            t1, t2 = flat[:span], flat[plane:]
            flat = (t1 - t2) + 1j * (flat3 - t1 - t2)
        digits = np.indices(sizes).reshape(len(sizes), -1)
        tb, wb, ob = ts @ digits, ws @ digits, os @ digits
        res = out.reshape(-1)  # a view: _apply_small makes out C-contiguous
        for r in range(m):
            acc = np.zeros(tb.size, dtype=out.dtype)
            for j in range(k):
                acc += w[wb + r * k + j] * flat[tb + toff[j]]
            res[ob + ooff[r]] = acc
        return
    import cupy

    params = _device_ints(cupy.cuda.Device().id,
                          tuple(np.concatenate([sizes, ts, ws, os, toff, ooff]).tolist()))
    n = int(np.prod(sizes))
    # 32-bit index arithmetic where every offset fits with room for the grid's stride
    # (a 64-bit division is a long software sequence on a GPU, a few per element)
    wide = max(span + plane, w.size, out.size, n) >= 1 << 30
    block = 128
    grid = min((n + block - 1) // block, 65535 * 8)
    _apply_cuda(t.dtype, m, k, len(sizes), wide, gauss)((grid,), (block,), (
        flat, flat3, np.int64(plane), w, out, params, np.int64(n)))


def _flat(xp: Any, x: Any, n: int) -> Any:
    """The ``n`` elements of memory from ``x``'s first on, as one contiguous array."""
    if xp is np:
        return np.lib.stride_tricks.as_strided(x, shape=(n,), strides=(x.itemsize,))
    import cupy

    return cupy.ndarray((n,), dtype=x.dtype, memptr=x.data)


@lru_cache(maxsize=256)
def _device_ints(device: int, values: tuple[int, ...]) -> Any:
    """``values`` as an int64 array on GPU ``device``, made once per site shape (a
    copy to the device each call would be a small transfer in the stream's way)."""
    import cupy

    with cupy.cuda.Device(device):
        return cupy.asarray(np.array(values, dtype=np.int64))


_CTYPES = {"complex128": "complex<double>", "complex64": "complex<float>",
           "float64": "double", "float32": "float"}
#: Elements of the large operand a thread loads before it sums them (all of them in
#: flight at once, not one load a step of the sum; more would spill registers).
_APPLY_LOADS = 16


@lru_cache(maxsize=64)
def _apply_cuda(dtype: Any, m: int, k: int, nd: int, wide: bool, gauss: bool) -> Any:
    """The kernel of :func:`_apply_kernel` for ``dtype``, ``m`` rows of ``w``, ``k``
    contracted elements and ``nd`` axes, with 64-bit (``wide``) or 32-bit offsets, the
    large operand complex or three real planes (``gauss``): the loops' bounds known to
    the compiler, so the sums sit in registers and a chunk of loads is in flight before
    its products."""
    import cupy

    code = """
#include <cupy/complex.cuh>
typedef SRC_DASK_T T;
typedef SRC_DASK_I I;
#define M SRC_DASK_ROWS
#define K SRC_DASK_K
#define ND SRC_DASK_ND
#define LOADS (K < SRC_DASK_LOADS ? K : SRC_DASK_LOADS)
#if SRC_DASK_GAUSS
// Gauss's three real products: t1 at t, t2 a plane further, t3 apart; summed as
// _combine_kernel sums them
typedef SRC_DASK_R R;
__device__ __forceinline__ T load(const R* __restrict__ t, const R* __restrict__ t3,
                                  const I plane, const I i) {
    const R a = t[i], b = t[i + plane], c = t3[i];
    return T(a - b, c - a - b);
}
#else
typedef T R;
__device__ __forceinline__ T load(const R* __restrict__ t, const R* __restrict__ t3,
                                  const I plane, const I i) {
    return t[i];
}
#endif
extern "C" __global__ void src_dask_apply_small(
        const R* __restrict__ t, const R* __restrict__ t3, const long long plane,
        const T* __restrict__ w, T* __restrict__ out, const long long* __restrict__ p,
        const long long n) {
    // p: the axes' sizes, strides in t, w and out (ND each), the K offsets in t, the
    // M offsets in out
    const long long* toff = p + 4 * ND;
    const long long* ooff = toff + K;
    I size[ND], st[ND], sw[ND], so[ND];
#pragma unroll
    for (int d = 0; d < ND; ++d) {
        size[d] = (I)p[d]; st[d] = (I)p[ND + d]; sw[d] = (I)p[2 * ND + d];
        so[d] = (I)p[3 * ND + d];
    }
    for (I e = blockIdx.x * (I)blockDim.x + threadIdx.x; e < (I)n;
         e += (I)gridDim.x * blockDim.x) {
        I rest = e, tb = 0, wb = 0, ob = 0;
#pragma unroll
        for (int d = ND - 1; d >= 0; --d) {
            const I q = rest / size[d], digit = rest - q * size[d];
            rest = q;
            tb += digit * st[d];
            wb += digit * sw[d];
            ob += digit * so[d];
        }
        T acc[M];
#pragma unroll
        for (int r = 0; r < M; ++r) acc[r] = T(0);
#pragma unroll
        for (int j0 = 0; j0 < K; j0 += LOADS) {
            T v[LOADS];
#pragma unroll
            for (int j = 0; j < LOADS; ++j)
                v[j] = j0 + j < K ? load(t, t3, (I)plane, tb + (I)toff[j0 + j]) : T(0);
#pragma unroll
            for (int j = 0; j < LOADS; ++j) {
                if (j0 + j < K) {
#pragma unroll
                    for (int r = 0; r < M; ++r) acc[r] += w[wb + r * K + j0 + j] * v[j];
                }
            }
        }
#pragma unroll
        for (int r = 0; r < M; ++r) out[ob + (I)ooff[r]] = acc[r];
    }
}
"""
    return cupy.RawKernel(code, "src_dask_apply_small", options=(
        f"-DSRC_DASK_T={_CTYPES[np.dtype(dtype).name]}", f"-DSRC_DASK_ROWS={m}",
        f"-DSRC_DASK_K={k}", f"-DSRC_DASK_ND={nd}", f"-DSRC_DASK_LOADS={_APPLY_LOADS}",
        f"-DSRC_DASK_I={'long long' if wide else 'int'}", f"-DSRC_DASK_GAUSS={int(gauss)}",
        f"-DSRC_DASK_R={_CTYPES[np.dtype(dtype).type(0).real.dtype.name]}"))


def contraction_elements(eq: str, shapes: tuple[tuple[int, ...], ...],
                         three: bool = False) -> int:
    """Elements :func:`contract` holds at once besides its inputs, for arrays of
    ``shapes``: at each pairwise step the intermediates still alive, the
    transposed copies of the two operands and the product (its result included);
    ``three``: products wide enough made as three real ones (:func:`matmul`,
    :func:`three_real_elements`)."""
    return _contraction_elements(eq, tuple(tuple(int(d) for d in s) for s in shapes), three,
                                 _sizing())


def _sizing() -> tuple[int, int]:
    """The bounds that decide how :func:`contract` makes a product, part of the key of
    every count cached by shapes."""
    return THREE_REAL_MIN, THIN_MAX


@lru_cache(maxsize=1024)
def _contraction_elements(eq: str, shapes: tuple[tuple[int, ...], ...], three: bool,
                          sizing: tuple[int, int]) -> int:
    """:func:`contraction_elements` once a shape (the plan and every task ask it, site
    after site of the same shapes), under ``sizing`` (:func:`_sizing`)."""
    three_min, thin_max = sizing
    steps, _ = _plan(eq, shapes)
    ops = [(prod(s), False) for s in shapes]  # (elements, made here)
    peak = 0
    for pos, how, spec in steps:
        picked = [ops[p] for p in pos]
        ops = [o for i, o in enumerate(ops) if i not in pos]
        alive = sum(n for n, made in ops if made) + sum(n for n, made in picked if made)
        if how == "einsum":
            out = max(n for n, _ in picked)
            copies = 0
        else:
            _, _, perm_a, perm_b, shape_a, shape_b, shape_out = spec[:7]
            out = prod(shape_out)
            copies = (prod(shape_a) * (list(perm_a) != sorted(perm_a))
                      + prod(shape_b) * (list(perm_b) != sorted(perm_b)))
            if three and min(shape_a[1], shape_a[2], shape_b[2]) >= three_min:
                copies = three_real_elements(prod(shape_a), prod(shape_b), out) - out
            elif max(shape_b[1], shape_b[2]) <= thin_max:  # _interleaved_product's w
                copies += 2 * prod(shape_b)
        peak = max(peak, alive + copies + out)
        ops.append((out, True))
    return peak


def _three_real_row_extra(eq: str, shapes: tuple[tuple[int, ...], ...], three: bool) -> int:
    """Elements per row (of the first axis of ``shapes[0]``, the rows a step is halved
    along) that three-real products (``three``: :func:`three_real`) hold beyond native
    ones in :func:`contract`: what a second row adds (the planes of operands that do not
    grow with the rows, such as the cores', are a fixed cost left to the headroom)."""
    if not three:
        return 0
    two = ((2,) + tuple(shapes[0][1:]),) + tuple(shapes[1:])

    def more(rows_shapes: tuple[tuple[int, ...], ...]) -> int:
        return (contraction_elements(eq, rows_shapes, True)
                - contraction_elements(eq, rows_shapes))

    return max(0, more(two) - more(shapes))


# Letters for a, b and x; s, r and l are reserved for the sketch and bond axes.
_LETTERS = [c for c in map(oe.get_symbol, range(400)) if c not in "srl"]


@lru_cache(maxsize=64)
def _symbols(k: int) -> tuple[str, str, str]:
    """Index letters ``a_1..a_k``, ``b_1..b_k``, ``x_0..x_k`` for depth ``k``."""
    return "".join(_LETTERS[:k]), "".join(_LETTERS[k:2 * k]), "".join(_LETTERS[2 * k:3 * k + 1])


def _core_terms(k: int) -> list[str]:
    a, b, x = _symbols(k)
    return [a[i] + b[i] + x[i] + x[i + 1] for i in range(k)]


@lru_cache(maxsize=64)
def project_eq(k: int) -> str:
    """The einsum of :func:`project_core` at depth ``k``: the cores, then the rows of ``S``."""
    a, b, x = _symbols(k)
    return ",".join(_core_terms(k)) + f",r{b}->{a}r{x[0]}{x[k]}"


# -- input preparation ---------------------------------------------------------
def prepare_core(block: Any, *, kind: str, site: int, n: int, transpose: bool, dtype: np.dtype,
                 check: bool, name: str, device: str = "cpu") -> Any:
    """A site core padded to rank 4 ``(a, b, up, down)`` in the working dtype,
    on the run's device (``"gpu"``: a CuPy array).

    Lazy inputs (Dask, Zarr) reach here unread, so ``check`` tests their data
    for NaN/inf here; in-memory inputs were checked before the run.
    """
    # A host array is tested before it moves: on the GPU the test would wait for
    # every contraction queued before it (a device synchronisation per core).
    if check and not all_finite(block):
        raise ValueError(f"{name}, site {site}: the core contains NaN or inf")
    block = pad(on_device(block, device), kind, site, n, transpose)
    return xp_of(block).ascontiguousarray(block.astype(dtype, copy=False))


# -- pass 1: sketched left environments ----------------------------------------
def sketch_step(env: Any | None, cores: list[Any], *, omega: np.ndarray, site: int) -> Any:
    """``C_{j+1}[s, b..] = Σ C_j[s, a..] Ω_j[s, x_0, x_k] Π T_i[j]`` for a block of columns.

    ``env`` is None at site 0, where ``C_0 = 1``; ``omega`` is the block's
    Gaussian test vectors (host memory, drawn by :func:`_random.sketch_block`).
    """
    k = len(cores)
    xp = xp_of(cores[0])
    dtype = cores[0].dtype
    omega = xp.asarray(omega, dtype=dtype)
    if env is None:
        env = xp.ones((omega.shape[0],) + (1,) * k, dtype=dtype)
    return contract(_sketch_step_eq(k), env, omega, *cores)


def _sketch_step_eq(k: int) -> str:
    a, b, x = _symbols(k)
    return f"s{a},s{x[0]}{x[k]}," + ",".join(_core_terms(k)) + f"->s{b}"


def sketch_step_bytes(cores: list[Any]) -> int:
    """Memory one sketch column of :func:`sketch_step` needs: its environment in
    and out and the largest intermediate of the contraction. ``cores`` need only
    ``shape``, ``dtype`` (and ``device`` for a planner's stand-in)."""
    return _sketch_step_bytes(*_counted_as(cores))


def _counted_as(cores: list[Any]) -> tuple[Any, ...]:
    """What a memory count of ``cores`` depends on, the key of its cache: their shapes,
    dtype, whether wide products are made as three real ones, :func:`_sizing`."""
    dtype = np.dtype(cores[0].dtype)
    return (tuple(tuple(int(d) for d in c.shape) for c in cores), dtype,
            three_real(dtype, _device_of(cores[0])), _sizing())


@lru_cache(maxsize=256)
def _sketch_step_bytes(cores: tuple[tuple[int, ...], ...], dtype: np.dtype, three: bool,
                       sizing: tuple[int, int]) -> int:
    """:func:`sketch_step_bytes` of cores of these shapes (made once a shape: every task
    and the plan ask it, site after site of the same shapes)."""
    k = len(cores)
    shapes = ((1,) + tuple(c[0] for c in cores), (1, cores[0][2], cores[-1][3]), *cores)
    steps, _ = _plan(_sketch_step_eq(k), shapes)
    biggest = max((prod(spec[6]) for _, how, spec in steps if how == "matmul"), default=0)
    env_in, env_out = prod(shapes[0]), prod(c[1] for c in cores)
    extra = _three_real_row_extra(_sketch_step_eq(k), shapes, three)
    return (env_in + env_out + 2 * biggest + extra) * dtype.itemsize


def project_row_bytes(cores: list[Any]) -> int:
    """Memory one row of :func:`project_core` needs: its row of ``S`` in, of ``Z``
    out, and the largest intermediate of the contraction (twice: in and out of a
    step). ``cores`` need only ``shape``, ``dtype`` (and ``device`` for a planner's
    stand-in)."""
    return _project_row_bytes(*_counted_as(cores))


@lru_cache(maxsize=256)
def _project_row_bytes(cores: tuple[tuple[int, ...], ...], dtype: np.dtype, three: bool,
                       sizing: tuple[int, int]) -> int:
    """:func:`project_row_bytes` of cores of these shapes (made once a shape)."""
    k = len(cores)
    a, b, x = _symbols(k)
    shapes = (*cores, (1,) + tuple(c[1] for c in cores))
    steps, _ = _plan(project_eq(k), shapes)
    biggest = max((prod(spec[6]) for _, how, spec in steps if how == "matmul"), default=0)
    s_row = prod(shapes[-1])
    z_row = prod(c[0] for c in cores) * cores[0][2] * cores[-1][3]
    # the rows are S's: its terms first for the extra's count
    moved = f"r{b}," + ",".join(_core_terms(k)) + f"->{a}r{x[0]}{x[k]}"
    extra = _three_real_row_extra(moved, (shapes[-1], *shapes[:-1]), three)
    return (s_row + z_row + 2 * biggest + extra) * dtype.itemsize


def sketch_piece_bytes(env: Any, z: Any) -> int:
    """Memory one sketch column of :func:`sketch_piece` needs (its row of C and of Mᵀ;
    as three real products, the row's planes and half a row of Mᵀ more)."""
    k = env.ndim - 1
    row, out = prod(env.shape[1:]), prod(z.shape[k:])
    if planes(z.dtype, _device_of(z), env.shape[0]):
        row, out = 2 * row, out + (out + 1) // 2
    return (row + out) * np.dtype(z.dtype).itemsize


# -- pass 2: projection, orthonormalisation, environment update ----------------
def project_core(cores: list[Any], env: Any | None, rows: tuple[int, int] | None = None) -> Any:
    """``Z[a.., r, x_0, x_k] = Σ Π T_i[j] · S[r, b..]``; ``env`` None means ``S = 1``.

    ``rows=(b, m)`` projects only block ``b`` of ``m`` of the rows ``r`` of ``S``
    (None when that block is empty): a large projected core is made, kept and
    spilled in blocks, and its sketch and environment update are sums over them.
    """
    k = len(cores)
    xp = xp_of(cores[0])
    if env is None:
        env = xp.ones((1,) * (k + 1), dtype=cores[0].dtype)
    if rows is not None:
        lo, hi = block_rows(env.shape[0], *rows)
        if lo == hi:
            return None
        env = env[lo:hi]
    # contiguous once here, not copied by the sketch's and the update's reshapes each
    return xp.ascontiguousarray(contract(project_eq(k), *cores, env))


def laid_out_for_rows(cores: list[Any], env: Any) -> list[Any]:
    """``cores`` as :func:`project_core` of a row of ``env`` reads them: each core that
    a step of the contraction reads transposed copied once into that order (the same
    tensor, its memory in the step's order), so that the step needs no copy of it.

    A core does not grow with the rows: the contraction of any number of rows copies
    it whole where its step reads it transposed (a D_M=1000 core of physical
    dimension 4 is 244 MiB, five times a row's memory). A projection cut into
    pieces of rows (``_oom.halving``) would copy it again for every piece; laid out
    once, every piece reads it in place."""
    k = len(cores)
    row = (1,) + tuple(env.shape[1:])
    steps, _ = _plan(project_eq(k), tuple(tuple(c.shape) for c in cores) + (row,))
    out, origin = list(cores), list(range(k + 1))
    for pos, how, spec in steps:
        picked = [origin[p] for p in pos]
        origin = [o for i, o in enumerate(origin) if i not in pos] + [None]
        if how != "matmul":
            continue
        for index, summed, perm in zip(picked, spec[:2], spec[2:4], strict=True):
            if index is None or index == k or summed or list(perm) == sorted(perm):
                continue  # an intermediate, the rows, or read as it is
            xp = xp_of(out[index])
            order = xp.ascontiguousarray(out[index].transpose(perm))
            out[index] = order.transpose(tuple(int(i) for i in np.argsort(perm)))
    return out


def block_rows(rows: int, block: int, blocks: int, groups: int = 1) -> tuple[int, int]:
    """Rows ``[lo, hi)`` of block ``block`` when ``rows`` rows are cut in ``blocks``;
    with ``groups``, cut first in ``groups`` row ranges (``block_rows(rows, o,
    groups)``), each in its share of the blocks (:func:`block_group`): the row blocks
    of a projected core whose environment is summed in fewer, larger blocks, so each
    block of the core lies within one of the environment's."""
    if groups == 1:
        return block * rows // blocks, (block + 1) * rows // blocks
    group, within, count = block_group(block, blocks, groups)
    lo, hi = block_rows(rows, group, groups)
    first, last = block_rows(hi - lo, within, count)
    return lo + first, lo + last


def block_group(block: int, blocks: int, groups: int) -> tuple[int, int, int]:
    """``(group, index within it, blocks in it)`` of ``block`` of ``blocks`` shared out
    over ``groups`` groups (``block_rows(blocks, group, groups)``)."""
    group = ((block + 1) * groups - 1) // blocks
    first, stop = block_rows(blocks, group, groups)
    return group, block - first, stop - first


def _as_matrix(z: Any, k: int) -> Any:
    """``Z`` as a (Π a) × (R·U·D) matrix."""
    rows = prod(z.shape[:k])
    return z.reshape(rows, -1)


def sketch_piece(env: Any, z: Any | None) -> Any | None:
    """A block of the sketch, transposed: ``Mᵀ = C · Z`` of shape (s_c, R_b·U·D) for a
    block of columns of ``C`` and a block of rows of ``Z`` (None: an empty block)."""
    if z is None:
        return None
    k = env.ndim - 1
    return matmul(env.reshape(env.shape[0], -1), _as_matrix(z, k))


def pass2_step(pieces: list[list[Any]], zs: list[Any] | None, cores_left: list[Any] | None, *,
               up: int, down: int, cutoff: float, max_rank: int, site: int,
               checkpoint: Callable[[Any, Any], None] | None = None,
               update: Callable[[Any, list[Any]], Any] | None = None,
               project: Callable[[list[Any], Any], Any] | None = None,
               ahead: Ahead | None = None) -> tuple[Any, Any, Any]:
    """One site of pass 2: ``(η_j, S_{j-1}, Z_{j-1})``.

    ``pieces[c][b]`` is the sketch of column block ``c`` and row block ``b`` of
    ``Z_j`` (``zs[b]``). ``zs`` None: only ``η_j`` is made here (``S_{j-1}``
    is summed by :func:`partial_update` over the blocks), the rest is None.
    ``cores_left`` given: ``Z_{j-1}`` is projected here whole; None: it is left
    to one task per row block (a large core), and the third item is None.
    Fusing the QR, the environment update and a whole projection into one
    task leaves two dependent tasks per site on the critical path, which is
    what bounds small problems.
    ``checkpoint(η_j, S_{j-1})`` saves the state a restarted run resumes from;
    ``update`` and ``project`` stand for :func:`update_env` and :func:`project_core`
    (a task passes them computed in pieces if they do not fit in memory).
    ``ahead`` (on a GPU): while its last site's basis stood, the update and the
    projection are queued before the device says whether the basis made without
    waiting (:func:`basis_ahead`) is accurate, and made again in the rare case it is
    not; so the device is never idle while the host waits for that answer.
    """
    mt = _join(pieces)
    guessing = zs is not None and ahead is not None and ahead.on
    guess = basis_ahead(mt, up, down, cutoff, max_rank, site) if guessing else None
    if guess is None:  # the answer first (or no guess to make): no work queued on a guess
        eta = _orthonormal_rows(mt, up, down, cutoff, max_rank, site, ahead,
                                cholesky=not guessing)
    else:
        eta, settle = guess
    if zs is None:
        return eta, None, None
    env = (update or update_env)(eta, zs)
    z = None if cores_left is None else (project or project_core)(cores_left, env)
    if guess is not None:
        better = settle()
        ahead.on = better is None
        if better is not None:  # the guess did not stand: its update and projection again
            eta = better
            env = z = None
            env = (update or update_env)(eta, zs)
            z = None if cores_left is None else (project or project_core)(cores_left, env)
    if checkpoint is not None:
        checkpoint(eta, env)
    return eta, env, z


class Ahead:
    """Whether a run's next site of pass 2 is made on a guess of its basis
    (:func:`pass2_step`): on while the guesses stand. An ill-conditioned sketch
    (its singular values spread beyond about 10⁴, as the decaying spectra of
    physical states make them) defeats the guess; the sites after it wait for the
    answer first, until one stands again."""

    def __init__(self) -> None:
        self.on = True


def orthonormalize(pieces: list[list[Any]], up: int, down: int, cutoff: float, max_rank: int,
                   site: int) -> Any:
    """``η[q, r, x_0, x_k]``: an orthonormal basis of the sketch's range, as rows
    (``pieces[c][b]``: column block ``c``, row block ``b`` of ``Z``).

    ``max_rank`` bounds the rank of the exact product at this cut (the product
    of the input bonds, or of the physical dimensions to the left). The range
    has at most that many dimensions, so the leading ``max_rank`` sketch
    columns span it (with probability one): bonds never exceed what the
    product can have, and no SVD is needed. With ``cutoff > 0`` the directions
    whose singular values (of the triangular factor) fall below
    ``cutoff · σ_max`` are dropped, keeping at least one.

    The basis is canonical, a continuous function of the sketch: the QR has a
    real positive diagonal, and a truncated range is spanned by the leading
    sketch columns projected onto it (not by singular vectors, whose phases
    and near-degenerate rotations change with rounding). Cores then agree to
    rounding across chunkings and cluster shapes, not just the product.
    On a GPU without a cutoff, by CholeskyQR2 (:func:`basis_ahead`).
    """
    return _orthonormal_rows(_join(pieces), up, down, cutoff, max_rank, site)


def _orthonormal_rows(mt: Any, up: int, down: int, cutoff: float, max_rank: int,
                      site: int, ahead: Ahead | None = None, cholesky: bool = True) -> Any:
    """:func:`orthonormalize` of the sketch ``mt`` (its pieces joined); ``ahead`` is
    told whether CholeskyQR2's guess stood, where one was made. ``cholesky`` False:
    :func:`basis_ahead` has just declined this sketch (its first round failed), so
    Householder's QR straight away, not that round again."""
    guess = basis_ahead(mt, up, down, cutoff, max_rank, site) if cholesky else None
    if guess is not None:
        eta, settle = guess
        better = settle()
        if ahead is not None:
            ahead.on = better is None
        return eta if better is None else better
    return _householder(mt, up, down, cutoff, max_rank, site)


def _householder(mt: Any, up: int, down: int, cutoff: float, max_rank: int, site: int) -> Any:
    """:func:`orthonormalize` of the sketch ``mt`` by Householder QR (and an SVD of its
    triangular factor with a cutoff)."""
    xp = xp_of(mt)
    if not all_finite(mt):
        raise FloatingPointError(
            f"site {site}: the sketch contains NaN or inf (overflow? rescale the inputs)"
        )
    m = mt.T
    if cutoff == 0:
        q, r = xp.linalg.qr(m[:, :max_rank])
        q = _positive_diagonal(q, r)
    else:
        q, r = xp.linalg.qr(m)
        u, sv, _ = xp.linalg.svd(r, full_matrices=False)
        keep = min(max_rank, sv.shape[0])
        if sv[0] > 0:
            keep = min(keep, max(1, int((sv > cutoff * sv[0]).sum())))
        q = _canonical_basis(q @ u[:, :keep], m)
    return xp.ascontiguousarray(q.T).reshape(q.shape[1], -1, up, down)


#: Pass 2's bases by CholeskyQR2 on the CPU too (the tests' switch; NumPy's QR is as fast).
_CHOLESKY_ON_CPU = False


def basis_ahead(mt: Any, up: int, down: int, cutoff: float, max_rank: int,
                site: int) -> tuple[Any, Callable[[], Any | None]] | None:
    """:func:`orthonormalize` by CholeskyQR2 on a GPU (None elsewhere, with a cutoff
    or a sketch of fewer columns than rows; :data:`_CHOLESKY_ON_CPU`): ``(η, settle)``,
    η queued on a guess (:func:`_cholesky_qr2_ahead`) and ``settle()``, which waits for
    the device's answer: None where the guess stands, else the basis the answer
    requires (a second round, or Householder's QR). ``mt``: the sketch ``Mᵀ``."""
    rows = mt[:max_rank]
    if cutoff != 0 or not (xp_of(mt) is not np or _CHOLESKY_ON_CPU) \
            or rows.shape[0] > rows.shape[1]:  # more rows than columns: rank-deficient
        return None
    guess, settle_rows = _cholesky_qr2_ahead(rows)
    if guess is None:
        return None

    def settle() -> Any | None:
        rows = settle_rows()
        if rows is guess:
            return None
        if rows is None:
            return _householder(mt, up, down, cutoff, max_rank, site)
        return rows.reshape(rows.shape[0], -1, up, down)

    return guess.reshape(guess.shape[0], -1, up, down), settle


def _cholesky_qr2_ahead(rows: Any) -> tuple[Any | None, Callable[[], Any | None]]:
    """``Qᵀ`` of the QR ``M = QR`` (``diag R > 0``) of ``M = rowsᵀ`` by CholeskyQR2,
    queued without waiting for the device: ``(guess,
    settle)``, the guess that the first round left the rows orthonormal to ``1e-8``
    (None where it failed outright), and ``settle()``, which waits for the answer and
    returns the guess itself where it stands, else the rows of a second round, or None
    where Householder's QR is needed.

    Two rounds of ``Q = M L⁻ᴴ`` with ``MᴴM = LLᴴ`` are GEMMs and small factorizations,
    about twice as fast as cuSOLVER's Householder QR at these shapes, and give the
    same ``Q`` (``Lᴴ`` is the positive-diagonal R). The second round's Gram matrix
    ``I + E`` measures how orthonormal the first round left ``Q``: with
    ``‖E‖_F < 0.1`` the second round is accurate to rounding (Yamazaki et al., 2015),
    and with ``‖E‖_F < 1e-8`` its Cholesky factor is known to first order (error
    ``O(‖E‖²)``): a GEMM instead of a factorization, where most sketches land; beyond
    0.1 (``cond(M) ≳ 10⁷``, a rank-deficient sketch, NaN) the caller falls back to
    Householder.
    """
    xp = xp_of(rows)
    try:
        rows = _cholesky_round(rows, matmul(rows, rows.T, conj_a=True))
    except np.linalg.LinAlgError:  # not positive definite (raised where errors are checked)
        return None, lambda: None
    error = matmul(rows, rows.T, conj_a=True)  # I + E: how far round one left them
    error -= xp.eye(error.shape[0], dtype=error.dtype)
    # ‖E‖_F bounds the spectral norm: the first-order step below errs by O(‖E‖²)
    deviation = xp.linalg.norm(error)
    known = None if xp is np else xp.cuda.get_current_stream().record()
    # Cholesky of I + E is I + tril(E) - diag(E)/2 + O(E²), below rounding here
    lower = xp.tril(error, -1) + xp.diag(xp.diagonal(error) / 2)
    guess = rows - matmul(lower, rows, conj_a=True)

    def settle() -> Any | None:
        if known is not None:  # one wait a site, polled (_transfer.wait_for)
            wait_for(event=known)
        e = float(deviation)
        if e < 1e-8:
            return guess
        if e < 0.1:  # NaN compares False
            try:
                return _cholesky_round(rows, error + xp.eye(error.shape[0], dtype=error.dtype))
            except np.linalg.LinAlgError:
                pass
        return None

    return guess, settle


def _cholesky_round(rows: Any, gram: Any) -> Any:
    """``conj(L)⁻¹ A`` with ``LLᴴ = gram = conj(A) Aᵀ``: one CholeskyQR round on the
    rows ``A = Mᵀ`` (``gram`` is ``MᴴM``, a temporary: overwritten on a GPU)."""
    if xp_of(rows) is not np:
        return _cublas.cholesky_round(rows, gram)
    from scipy.linalg import solve_triangular  # only the tests run it on the CPU

    lower = np.linalg.cholesky(gram)
    return solve_triangular(lower.conj(), rows, lower=True, check_finite=False)


def _positive_diagonal(q: Any, r: Any) -> Any:
    """``q`` with its columns' phases chosen so that ``diag(r)`` is real positive
    (this makes a QR factorization unique)."""
    xp = xp_of(q)
    diag = xp.diagonal(r)[: q.shape[1]]
    mag = abs(diag)
    return q * xp.where(mag == 0, 1, diag / xp.where(mag == 0, 1, mag))[None, :]


def _canonical_basis(basis: Any, m: Any) -> Any:
    """The orthonormal basis of ``span(basis)`` made of the leading columns of ``m``
    projected onto it: a function of the subspace and ``m`` alone."""
    xp = xp_of(basis)
    k = basis.shape[1]
    q, r = xp.linalg.qr(basis @ (basis.conj().T @ m[:, :k]))
    return _positive_diagonal(q, r)


def _join(pieces: list[list[Any]]) -> Any:
    """The sketch ``Mᵀ`` from its pieces: blocks of sketch columns down, blocks of
    rows of ``Z`` across (None: empty)."""
    rows = [[p for p in row if p is not None] for row in pieces]
    xp = xp_of(rows[0][0])
    rows = [xp.concatenate(r, axis=1) if len(r) > 1 else r[0] for r in rows]
    return xp.concatenate(rows, axis=0) if len(rows) > 1 else rows[0]


def update_env(eta: Any, zs: list[Any]) -> Any:
    """``S'[l, a..] = Σ conj(η)[l, r, x_0, x_k] Z[a.., r, x_0, x_k]``, summed over the
    row blocks ``zs`` of ``Z`` (None: empty)."""
    zs = [z for z in zs if z is not None]
    k = zs[0].ndim - 3
    q = eta.shape[0]
    flat = eta.reshape(q, eta.shape[1], -1)
    env, lo = None, 0
    for z in zs:
        hi = lo + z.shape[k]
        zt = _as_matrix(z, k).T
        part = matmul(flat[:, lo:hi], zt, conj_a=True, shapes=((q, -1), zt.shape))
        env = part if env is None else env + part
        lo = hi
    return env.reshape((q,) + tuple(zs[0].shape[:k]))


def partial_update(eta: Any, z: Any | None, env: Any | None, rows: tuple[int, ...]) -> Any | None:
    """``env`` plus row block ``rows=(b, m[, groups])`` (:func:`block_rows`) of ``Z``'s
    share of ``S'`` (see :func:`update_env`); None stands for an empty block, or for no
    sum yet."""
    if z is None:
        return env
    lo, hi = block_rows(eta.shape[1], *rows)
    part = update_env(eta[:, lo:hi], [z])
    return part if env is None else env + part


def update_row_bytes(eta: Any, z: Any) -> int:
    """Memory one row of :func:`update_env`'s output needs: its row of η (and the
    conjugated copy) and of ``S'`` (the product, the running sum and the sum)."""
    k = z.ndim - 3
    out = 3 * prod(z.shape[:k])
    if planes(z.dtype, _device_of(z), eta.shape[0]):  # η's planes replace its conjugated copy
        out += (prod(z.shape[:k]) + 1) // 2
    return (2 * prod(eta.shape[1:]) + out) * np.dtype(z.dtype).itemsize


def first_core(zs: list[Any]) -> Any:
    """The output's site 0, ``y_0[1, r, x_0, x_k]``: the projected core of site 0
    (its row blocks joined)."""
    zs = [z for z in zs if z is not None]
    z = xp_of(zs[0]).concatenate(zs, axis=-3) if len(zs) > 1 else zs[0]
    return z.reshape((1,) + tuple(z.shape[-3:]))


# -- exact rounding (oversampled runs) -----------------------------------------
def round_step(carry: Any | None, core: Any, chi: int, cutoff: float,
               last: bool) -> tuple[Any, Any | None, float | None]:
    """One step of the left-to-right SVD sweep: ``(new core, carry to the right,
    discarded weight)``.

    The input is right-canonical, so each SVD sees the true singular values of
    its cut and the truncation to ``chi`` there is optimal; the discarded weight
    is the share of the squared singular values dropped at this bond, ``Σ_{i>χ}
    σ_i² / Σ σ_i²`` (None at the last site, which has no bond to its right).
    """
    xp = xp_of(core)
    if carry is not None:
        core = contract("lm,mrud->lrud", carry, core)
    if last:
        return core, None, None
    left, right, up, down = core.shape
    mat = core.transpose(0, 2, 3, 1).reshape(left * up * down, right)
    u, sv, _ = xp.linalg.svd(mat, full_matrices=False)
    keep = min(chi, sv.shape[0])
    if cutoff > 0 and sv[0] > 0:
        keep = min(keep, max(1, int((sv > cutoff * sv[0]).sum())))
    basis = _canonical_basis(u[:, :keep], mat)
    new = basis.reshape(left, up, down, keep).transpose(0, 3, 1, 2)
    power = sv * sv
    total = float(power.sum())
    dropped = float(power[keep:].sum()) / total if total > 0 else 0.0
    return xp.ascontiguousarray(new), basis.conj().T @ mat, dropped
