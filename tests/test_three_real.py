"""Complex products as three real ones (config ``complex-products``): the same answers
as the native products to roundoff, real and complex64 untouched, memory counted."""

from __future__ import annotations

import dask
import numpy as np
import pytest
from helpers import (
    close_cores,
    count_calls,
    dense_product,
    random_mpo,
    random_mps,
    rel_err,
    same_cores,
)
from test_exact import STACKS, _uneven

import src_dask
from src_dask import _estimate, _kernels, _plan
from src_dask._stack import make_stack


@pytest.fixture(autouse=True)
def _small_products_too(monkeypatch):
    """The tests' products are small: made as three real ones all the same (none thin
    enough for the interleaved product: tests/test_interleaved.py)."""
    monkeypatch.setattr(_kernels, "THREE_REAL_MIN", 0)
    monkeypatch.setattr(_kernels, "THIN_MAX", 0)


def _three(value: str = "3m"):
    return dask.config.set({"src_dask.complex-products": value})


def _random(rng, shape, dtype=np.complex128):
    x = rng.standard_normal(shape)
    return (x + 1j * rng.standard_normal(shape)).astype(dtype) if np.dtype(dtype).kind == "c" \
        else x.astype(dtype)


@pytest.fixture
def products(monkeypatch):
    """How many products were made as three real ones."""
    return count_calls(monkeypatch, _kernels, "_three_real_product")


@pytest.mark.parametrize("conj_a", [False, True])
def test_a_product_as_three_real_ones_is_the_native_product(conj_a, products):
    rng = np.random.default_rng(0)
    a, b = _random(rng, (3, 40, 30)), _random(rng, (3, 30, 20))
    want = np.matmul(a.conj() if conj_a else a, b)
    with _three():
        got = _kernels.matmul(a, b, conj_a=conj_a)
    assert products == [1]
    assert got.dtype == np.complex128 and got.shape == want.shape
    assert np.abs(got - want).max() <= 1e-13 * np.abs(want).max()


def test_strided_operands_are_split_and_reshaped_like_the_native_ones():
    rng = np.random.default_rng(1)
    a = _random(rng, (4, 5, 6, 7)).transpose(0, 2, 1, 3)  # (4, 6, 5, 7): not contiguous
    b = _random(rng, (4, 35, 8))
    shapes = ((4, 6, 35), (4, 35, 8))
    want = np.matmul(a.reshape(shapes[0]), b)
    with _three():
        got = _kernels.matmul(a, b, shapes=shapes)
    assert np.abs(got - want).max() <= 1e-13 * np.abs(want).max()
    with _three("native"):
        assert np.array_equal(_kernels.matmul(a, b, shapes=shapes), want)


@pytest.mark.parametrize("dtype", [np.float64, np.float32, np.complex64])
def test_real_and_single_precision_products_keep_their_path(dtype):
    rng = np.random.default_rng(2)
    a, b = _random(rng, (30, 20), dtype), _random(rng, (20, 10), dtype)
    with _three():
        assert not _kernels.three_real(dtype, "gpu")
        assert np.array_equal(_kernels.matmul(a, b), a @ b)


def test_thin_products_stay_native(monkeypatch, products):
    monkeypatch.setattr(_kernels, "THREE_REAL_MIN", 21)
    rng = np.random.default_rng(4)
    for shape_a, shape_b in [((2, 20, 30), (2, 30, 40)), ((2, 40, 20), (2, 20, 40)),
                             ((2, 40, 30), (2, 30, 20))]:  # m, k or n below 21
        a, b = _random(rng, shape_a), _random(rng, shape_b)
        with _three():
            assert np.array_equal(_kernels.matmul(a, b), np.matmul(a, b))
    assert products == []
    with _three():
        _kernels.matmul(_random(rng, (2, 21, 21)), _random(rng, (2, 21, 21)))
        a, b = _random(rng, (21, 25, 2)), _random(rng, (50, 21))
        got = _kernels.matmul(a, b, shapes=((21, 50), (50, 21)))
    assert products == [1, 1]
    assert np.abs(got - a.reshape(21, 50) @ b).max() <= 1e-13 * np.abs(got).max()


def test_auto_is_the_default_and_other_settings_an_error():
    assert dask.config.get("src_dask.complex-products") == "auto"
    assert _kernels.three_real(np.complex128, "gpu")  # measured faster on GPU stacks
    assert not _kernels.three_real(np.complex128, "cpu")  # and slower on the CPU's BLAS
    with _three("native"):
        assert not _kernels.three_real(np.complex128, "gpu")
    with _three():
        assert _kernels.three_real(np.complex128, "gpu") and _kernels.three_real(
            np.complex128, "cpu")
    with _three("auto"):
        assert _kernels.three_real(np.complex128, "gpu")
        assert not _kernels.three_real(np.complex128, "cpu")
        assert not _kernels.three_real(np.complex64, "gpu")
    with _three("fast"), pytest.raises(ValueError, match="complex-products"):
        _kernels.three_real(np.complex128, "gpu")


def test_a_product_that_runs_out_of_memory_as_three_is_made_natively(monkeypatch):
    def no_room(*args, **kwargs):
        raise MemoryError("out of memory allocating the planes")

    monkeypatch.setattr(_kernels, "_three_real_product", no_room)
    rng = np.random.default_rng(3)
    a, b = _random(rng, (20, 30)), _random(rng, (30, 10))
    with _three():
        assert np.array_equal(_kernels.matmul(a, b, conj_a=True), a.conj() @ b)

    def broken(*args, **kwargs):
        raise RuntimeError("not a memory error")

    monkeypatch.setattr(_kernels, "_three_real_product", broken)
    with _three(), pytest.raises(RuntimeError, match="not a memory error"):
        _kernels.matmul(a, b)


@pytest.mark.parametrize("stack", list(STACKS))
@pytest.mark.parametrize("n,p", [(2, 2), (3, 3), (6, 2)])
def test_src_with_three_real_products_is_exact_and_the_native_result(stack, n, p, products):
    exact_and_native(STACKS[stack](n, p), "3m", products)  # pass 1, projections, pieces, updates


def exact_and_native(trains, setting: str, calls: list) -> None:
    """``src`` of ``trains`` with ``complex-products: setting`` makes ``calls`` (none
    natively), is exact and is the native result to 1e-12."""
    with _three("native"):
        native = src_dask.src(*trains, chi_out=200, seed=3)
    assert calls == []
    with _three(setting):
        y = src_dask.src(*trains, chi_out=200, seed=3)
    assert calls
    assert rel_err(y, dense_product(*trains)) <= 1e-12
    assert close_cores(y, native, rtol=1e-12)


def test_truncated_results_agree_with_the_native_ones_and_real_runs_are_unchanged(products):
    trains = [random_mpo(12, _uneven(12, 4), 2, seed=5), random_mps(12, _uneven(12, 6), 2, seed=6)]
    real = [type(t)([c.real for c in t], t.kind) for t in trains]
    with _three("native"):
        native = src_dask.src(*trains, chi_out=8, seed=1)
        real_native = src_dask.src(*real, chi_out=8, seed=1)
    with _three():
        y = src_dask.src(*trains, chi_out=8, seed=1)
        made = len(products)
        y_real = src_dask.src(*real, chi_out=8, seed=1)
    assert made and len(products) == made  # none for the real run
    assert close_cores(y, native, rtol=1e-10)
    assert same_cores(y_real, real_native)


def test_the_plan_counts_the_planes_of_three_real_products(monkeypatch):
    trains = [random_mpo(6, 8, 2, seed=1), random_mps(6, 16, 2, seed=2)]
    stack = make_stack(list(trains))
    eq, shapes = _estimate._project_eq(stack), _estimate._project_shapes(stack, 3, 64)
    assert _kernels.contraction_elements(eq, shapes, True) > _kernels.contraction_elements(
        eq, shapes)
    with monkeypatch.context() as m:  # steps too thin to be made as three count as native
        m.setattr(_kernels, "THREE_REAL_MIN", 10**6)
        assert _kernels.contraction_elements(eq, shapes, True) == \
            _kernels.contraction_elements(eq, shapes)
    monkeypatch.setattr(_kernels, "CUBLAS_3M_SIDE", 16)  # blocks of 32 rows: the planes
    with _three():
        gpu = _plan.row_bytes(stack, 3, 64, 32, device="gpu")
        gpu_columns = _plan.sketch_column_bytes(stack, "gpu")
    with _three("native"):
        native = _plan.row_bytes(stack, 3, 64, 32, device="gpu")
        native_columns = _plan.sketch_column_bytes(stack, "gpu")
        native_cpu = _plan.row_bytes(stack, 3, 64, 32, device="cpu")
    for kind in ("sketch", "update"):
        assert gpu[kind][0] > native[kind][0] and gpu[kind][1] > native[kind][1], kind
    assert gpu["project"][1] >= native["project"][1]
    assert gpu_columns >= native_columns
    assert _plan.row_bytes(stack, 3, 64, 32, device="gpu") == gpu  # the default: auto
    assert _plan.row_bytes(stack, 3, 64, 32, device="cpu") == native_cpu  # native there
    # pieces and updates of at most CUBLAS_3M_SIDE rows are cuBLAS's 3M: no planes
    monkeypatch.setattr(_kernels, "CUBLAS_3M_SIDE", 64)
    with _three():
        cublas = _plan.row_bytes(stack, 3, 64, 32, device="gpu")
    for kind in ("sketch", "update"):
        assert cublas[kind] == native[kind], kind


def test_which_wide_products_go_to_cublas_3m(monkeypatch):
    """On a GPU, one product with a small result against its work is cuBLAS's own Gauss
    product; a large result, a batch or a thin inner dimension is not; CPUs never."""
    from src_dask import _cublas

    monkeypatch.setattr(_kernels, "THREE_REAL_MIN", 512)
    monkeypatch.setattr(_kernels, "THIN_MAX", 32)
    assert not _cublas.available()  # no CuPy here: looked for once, quietly
    way = _kernels.product_way
    c = np.complex128
    with _three("auto"):  # the GPU's as 3m; the CPU's native
        assert way(c, c, (32000, 1000, 16000), "gpu") == "three"
        assert way(c, c, (32000, 1000, 16000), "cpu") == "native"
    with _three():
        assert way(c, c, (500, 64000, 8000), "gpu") == "native"  # m < 512, no cuBLAS here
        monkeypatch.setattr(_cublas, "available", lambda: True)
        assert way(c, c, (500, 64000, 8000), "gpu") == "cublas"  # the sketch piece
        assert way(c, c, (500, 8000, 64000), "gpu") == "cublas"  # the update
        assert way(c, c, (500, 8000, 64000), "gpu", batched=True) == "native"
        assert way(c, c, (32000, 1000, 16000), "gpu") == "three"  # a large result
        assert way(c, c, (16, 1000, 64000), "gpu") == "native"  # too few rows for either
        assert way(c, c, (500, 64000, 8000), "cpu") == "native"  # m < 512
        assert way(c, c, (600, 64000, 8000), "cpu") == "three"
        assert way(np.complex64, np.complex64, (500, 64000, 8000), "gpu") == "native"
    with _three("native"):
        assert way(c, c, (500, 64000, 8000), "gpu") == "native"
