"""A small core contracted into a large tensor in one pass (``_kernels._apply_small``,
which ``contract`` takes on a GPU): the einsum to roundoff whichever operand is small,
for every dtype, strided operands and the result's layout; whole runs exact and equal
to the runs without it. On the CPU the tests switch it on (``_APPLY_ON_CPU``): its
indexing is the GPU kernel's, summed by NumPy."""

from __future__ import annotations

import dask
import numpy as np
import pytest
from helpers import close_cores, count_calls, dense_product, rel_err
from test_exact import STACKS

import src_dask
from src_dask import _kernels

pytestmark = pytest.mark.timeout(120)

TOL = {np.complex128: 1e-13, np.float64: 1e-13, np.complex64: 1e-5, np.float32: 1e-5}


@pytest.fixture
def applied(monkeypatch):
    """On the CPU, for the tests' small tensors too: the calls made."""
    monkeypatch.setattr(_kernels, "_APPLY_ON_CPU", True)
    monkeypatch.setattr(_kernels, "APPLY_LARGE_MIN", 0)
    return count_calls(monkeypatch, _kernels, "_apply_small")


def _random(rng, shape, dtype=np.complex128):
    x = rng.standard_normal(shape)
    if np.dtype(dtype).kind == "c":
        x = x + 1j * rng.standard_normal(shape)
    return x.astype(dtype)


def _close(got, want, dtype):
    assert got.shape == want.shape and got.dtype == want.dtype
    assert np.abs(got - want).max() <= TOL[dtype] * np.abs(want).max()


def _stack_eqs(k: int):
    """The projection's and pass 1's contractions of a depth-``k`` stack."""
    a, b, x = _kernels._symbols(k)
    cores = ",".join(_kernels._core_terms(k))
    return cores + f",r{b}->{a}r{x[0]}{x[k]}", _kernels._sketch_step_eq(k)


@pytest.mark.parametrize("dtype", list(TOL))
def test_the_projection_and_pass_1_of_a_stack_are_the_einsum(dtype, applied):
    rng = np.random.default_rng(0)
    # bonds a_i, b_i, legs x_0..x_4 all different: a mixed-up axis cannot pass
    cores = [_random(rng, s, dtype) for s in [(4, 2, 3, 4), (3, 4, 4, 2), (9, 7, 2, 5),
                                             (2, 3, 5, 3)]]
    inputs = [c.copy() for c in cores]
    project, sketch = _stack_eqs(4)
    env = _random(rng, (6, 2, 4, 7, 3), dtype)
    got = _kernels.contract(project, *cores, env)
    _close(got, np.einsum(project, *cores, env), dtype)
    assert got.flags.c_contiguous  # the last step wrote the result in its order
    made = len(applied)
    assert made >= 2
    left, omega = _random(rng, (5, 4, 3, 9, 2), dtype), _random(rng, (5, 3, 3), dtype)
    _close(_kernels.contract(sketch, left, omega, *cores),
           np.einsum(sketch, left, omega, *cores), dtype)
    assert len(applied) > made
    assert all(np.array_equal(c, c0) for c, c0 in zip(cores, inputs, strict=True))


@pytest.mark.parametrize("small_first", [True, False])
@pytest.mark.parametrize("order", [None, "reversed"])
def test_strided_operands_either_way_round(small_first, order):
    rng = np.random.default_rng(1)
    large = _random(rng, (6, 5, 3, 7, 2)).transpose(3, 1, 4, 0, 2)  # (7, 5, 2, 6, 3), strided
    small = _random(rng, (4, 2, 3)).transpose(1, 0, 2)[:, ::1]  # (2, 4, 3)
    if small_first:  # small (free 2·4) over large's first two axes... as (free.., contr..)
        a = small.transpose(1, 0, 2)  # (4, 2, 3): free 4, contracted (2, 3)
        b = large.transpose(2, 4, 0, 1, 3)  # (2, 3, 7, 5, 6): contracted (2, 3), free
        want = np.einsum("fcd,cdxyz->fxyz", a, b)
    else:
        a = large.transpose(0, 1, 3, 2, 4)  # (7, 5, 6, 2, 3): free, contracted (2, 3)
        b = small.transpose(0, 2, 1)  # (2, 3, 4): contracted, free 4
        want = np.einsum("xyzcd,cdf->xyzf", a, b)
    axes = want.ndim
    order = None if order is None else tuple(reversed(range(axes)))
    got = _kernels._apply_small(np, a, b, 0, 2, order)
    _close(got, want, np.complex128)
    if order is not None:  # its memory holds the axes in that order
        assert got.transpose(order).flags.c_contiguous


def test_neighbouring_axes_are_merged_and_unit_ones_dropped():
    assert _kernels._merged([(3, 40, 0), (1, 7, 7), (5, 8, 0), (8, 1, 0), (4, 0, 1)]) == \
        [(120, 1, 0), (4, 0, 1)]
    assert _kernels._merged([(2, 0, 4), (4, 0, 1), (3, 1, 0)]) == [(8, 0, 1), (3, 1, 0)]
    assert _kernels._merged([(1, 5, 0)]) == [(1, 0, 0)]


def test_only_products_of_a_small_and_a_large_operand_are_applied(monkeypatch):
    monkeypatch.setattr(_kernels, "APPLY_LARGE_MIN", 1000)
    rng = np.random.default_rng(2)
    small, large = _random(rng, (4, 8)), _random(rng, (8, 200))
    assert not _kernels._applies(np, small, large, 0, 1)  # NumPy: BLAS does these well
    monkeypatch.setattr(_kernels, "_APPLY_ON_CPU", True)
    assert _kernels._applies(np, small, large, 0, 1)
    assert not _kernels._applies(np, small, large[:, :100], 0, 1)  # not large
    assert not _kernels._applies(np, small.astype(np.complex64), large, 0, 1)
    assert not _kernels._applies(np, small, large[:, ::-1], 0, 1)  # reversed strides
    with dask.config.set({"src_dask.complex-products": "native"}):  # every one a ZGEMM
        assert not _kernels._applies(np, small, large, 0, 1)
        assert _kernels._applies(np, small.real.copy(), large.real.copy(), 0, 1)
    wide = _random(rng, (64, 8))  # 64 free elements: a GEMM's arithmetic
    assert not _kernels._applies(np, wide, large, 0, 1)
    deep = _random(rng, (4, 128)), _random(rng, (128, 200))  # 128 contracted: the same
    assert not _kernels._applies(np, *deep, 0, 1)
    assert _kernels._applies(np, deep[0][:, :64], deep[1][:64], 0, 1)
    batched = _random(rng, (5, 4, 8)), _random(rng, (5, 8, 200))
    assert _kernels._applies(np, *batched, 1, 1)  # 4 free elements a batch
    assert not _kernels._applies(np, _random(rng, (5, 40, 8)), batched[1], 1, 1)


@pytest.mark.parametrize("small_first", [True, False])
def test_a_batched_product_applies_each_batch_its_own_small_operand(small_first):
    rng = np.random.default_rng(4)
    large = _random(rng, (3, 5, 7, 6)).transpose(1, 0, 3, 2)  # batch 5, then (3, 6, 7)
    small = _random(rng, (5, 3, 6, 4))
    if small_first:  # (batch, free, contracted) @ (batch, contracted, free)
        a, b = small.transpose(0, 3, 1, 2), large  # (5, 4, 3, 6), (5, 3, 6, 7)
        want = np.einsum("bfcd,bcdx->bfx", a, b)
    else:
        a, b = large.transpose(0, 3, 1, 2), small  # (5, 7, 3, 6), (5, 3, 6, 4)
        want = np.einsum("bxcd,bcdf->bxf", a, b)
    _close(_kernels._apply_small(np, a, b, 1, 2), want, np.complex128)


@pytest.mark.parametrize("stack", ["mpo.mps", "mpo.mpo.mps", "bra.mpo.mpo", "mpo.mpo.mpo"])
@pytest.mark.parametrize("n,p", [(2, 3), (3, 2), (6, 2)])
def test_src_applying_small_cores_is_exact_and_the_run_without(stack, n, p, monkeypatch):
    trains = STACKS[stack](n, p)
    before = src_dask.src(*trains, chi_out=200, seed=3)
    monkeypatch.setattr(_kernels, "_APPLY_ON_CPU", True)
    monkeypatch.setattr(_kernels, "APPLY_LARGE_MIN", 0)
    applied = count_calls(monkeypatch, _kernels, "_apply_small")
    y = src_dask.src(*trains, chi_out=200, seed=3)
    assert applied
    assert rel_err(y, dense_product(*trains)) <= 1e-12
    assert close_cores(y, before, rtol=1e-12)


@pytest.fixture
def three_real(monkeypatch):
    """Every complex product of the tests' small shapes made as three real ones; the
    planes each applied step read (True: a Gauss's, unsummed)."""
    monkeypatch.setattr(_kernels, "THREE_REAL_MIN", 2)
    monkeypatch.setattr(_kernels, "THIN_MAX", 0)
    read = []
    kernel = _kernels._apply_kernel

    def spy(xp, t, *args):
        read.append(isinstance(t, _kernels.Gauss))
        return kernel(xp, t, *args)

    monkeypatch.setattr(_kernels, "_apply_kernel", spy)
    with dask.config.set({"src_dask.complex-products": "3m"}):
        yield read


def _summed_first(monkeypatch):
    """Three real products summed as they are made, as before the applied step read them
    unsummed."""
    product = _kernels._three_real_product
    monkeypatch.setattr(_kernels, "_three_real_product",
                        lambda *args, combine=True: product(*args))


@pytest.mark.parametrize("k", [1, 2, 4])
def test_an_applied_step_sums_the_three_real_products_as_it_reads_them(
        k, applied, three_real, monkeypatch):
    monkeypatch.setattr(_kernels, "APPLY_SMALL_MAX", 100)  # the wide step a GEMM
    rng = np.random.default_rng(5)
    # the small cores square (results no larger than the large operand, which is read
    # unsummed only then)
    shapes = [(3, 3, 2, 2), (2, 2, 2, 2), (9, 7, 2, 2), (3, 3, 2, 2)][-k:]
    cores = [_random(rng, s) for s in shapes]
    env = _random(rng, (20,) + tuple(s[1] for s in shapes))  # 20 rows: not small
    project, sketch = _stack_eqs(k)
    left = _random(rng, (20,) + tuple(s[0] for s in shapes))
    omega = _random(rng, (20, shapes[0][2], shapes[-1][3]))
    got = [_kernels.contract(project, *cores, env), _kernels.contract(sketch, left, omega, *cores)]
    if k > 1:  # a wide step went on unsummed to an applied one
        assert any(three_real)
    _close(got[0], np.einsum(project, *cores, env), np.complex128)
    _close(got[1], np.einsum(sketch, left, omega, *cores), np.complex128)
    # the same sums as the complex result's, summed first: the same bits
    _summed_first(monkeypatch)
    three_real.clear()
    assert np.array_equal(_kernels.contract(project, *cores, env), got[0])
    assert np.array_equal(_kernels.contract(sketch, left, omega, *cores), got[1])
    assert not any(three_real)


def test_three_real_products_unsummed_reshape_and_transpose_as_their_sum(three_real):
    rng = np.random.default_rng(6)
    a, b = _random(rng, (6, 5)), _random(rng, (5, 12))
    g = _kernels.matmul(a, b, gauss=True)
    assert isinstance(g, _kernels.Gauss) and g.shape == (6, 12) and g.dtype == np.complex128
    want = a @ b
    _close(g.combined(), want, np.complex128)
    moved = g.reshape((2, 3, 4, 3)).transpose((2, 0, 3, 1))
    assert moved.shape == (4, 2, 3, 3)
    assert moved.strides == want.reshape(2, 3, 4, 3).transpose(2, 0, 3, 1).strides
    _close(moved.combined(), want.reshape(2, 3, 4, 3).transpose(2, 0, 3, 1), np.complex128)
    assert not isinstance(_kernels.matmul(a, b), _kernels.Gauss)


@pytest.mark.parametrize("rows,planes_read", [(2, True), (5, False)])
def test_unsummed_products_are_read_only_into_a_result_no_larger(rows, planes_read,
                                                                  three_real):
    # 4 contracted elements a result element: 2 rows make a smaller result, 5 a larger
    # one, which the planes beside it would make larger than the memory plan holds
    rng = np.random.default_rng(7)
    a, b = _random(rng, (6, 5)), _random(rng, (5, 24))
    g = _kernels.matmul(a, b, gauss=True).reshape((6, 3, 2, 4))  # contracted: the last
    small = _random(rng, (4, rows))
    got = _kernels._apply_small(np, g, small, 0, 1)
    _close(got, np.einsum("xyzc,cf->xyzf", (a @ b).reshape(6, 3, 2, 4), small), np.complex128)
    assert three_real == [planes_read]


@pytest.mark.parametrize("stack,n,p", [("mpo.mpo.mps", 6, 2), ("bra.mpo.mpo", 6, 2),
                                       ("mpo.mpo.mpo", 2, 3)])
def test_src_reading_three_real_products_unsummed_is_exact_and_the_run_summing_them(
        stack, n, p, applied, three_real, monkeypatch):
    # at the tests' sizes: products of three or more a side as three real ones, only
    # cores of up to 16 elements applied, so wide steps before applied ones are GEMMs
    monkeypatch.setattr(_kernels, "THREE_REAL_MIN", 3)
    monkeypatch.setattr(_kernels, "APPLY_SMALL_MAX", 16)
    trains = STACKS[stack](n, p)
    y = src_dask.src(*trains, chi_out=200, seed=3)
    assert any(three_real)
    assert rel_err(y, dense_product(*trains)) <= 1e-12
    _summed_first(monkeypatch)
    summed = src_dask.src(*trains, chi_out=200, seed=3)
    # the same sums of the same values; a whole run's tasks on threads, so a tolerance
    # (at rounding's scale) rather than bit identity across machines' BLAS threading
    assert close_cores(y, summed, rtol=1e-14)
