"""Thin complex products as one real product of interleaved parts (``_kernels.matmul``):
the native product to roundoff, for both complex dtypes, conjugated, batched and strided
operands; real products and config ``native`` untouched; whole runs exact and equal
to the native ones."""

from __future__ import annotations

import dask
import numpy as np
import pytest
from helpers import count_calls
from test_exact import STACKS
from test_three_real import _random, exact_and_native

from src_dask import _kernels

pytestmark = pytest.mark.timeout(120)


def _way(value: str):
    return dask.config.set({"src_dask.complex-products": value})


@pytest.fixture(autouse=True)
def _small_products_too(monkeypatch):
    """The tests' products are small: made interleaved all the same (but in the test of
    the least size)."""
    monkeypatch.setattr(_kernels, "THIN_MIN_ELEMENTS", 0)


@pytest.fixture
def made(monkeypatch):
    """How many products were made interleaved."""
    return count_calls(monkeypatch, _kernels, "_interleaved_product")


TOL = {np.complex128: 1e-14, np.complex64: 1e-5}


@pytest.mark.parametrize("dtype", [np.complex128, np.complex64])
@pytest.mark.parametrize("conj_a", [False, True])
@pytest.mark.parametrize("shape_a,shape_b", [((300, 16), (16, 16)), ((3, 200, 7), (3, 7, 5)),
                                             ((50, 1), (1, 32)), ((40, 32), (32, 1))])
def test_a_thin_product_is_the_native_product(dtype, conj_a, shape_a, shape_b, made):
    rng = np.random.default_rng(0)
    a, b = _random(rng, shape_a, dtype), _random(rng, shape_b, dtype)
    a0, b0 = a.copy(), b.copy()
    want = np.matmul(a.conj() if conj_a else a, b)
    with _way("auto"):
        got = _kernels.matmul(a, b, conj_a=conj_a)
    assert made == [1]
    assert got.dtype == want.dtype and got.shape == want.shape
    assert np.abs(got - want).max() <= TOL[dtype] * np.abs(want).max()
    assert np.array_equal(a, a0) and np.array_equal(b, b0)  # inputs untouched


def test_strided_operands_are_reshaped_like_the_native_ones(made):
    rng = np.random.default_rng(1)
    a = _random(rng, (4, 2, 6, 8)).transpose(0, 2, 1, 3)  # (4, 6, 2, 8): not contiguous
    b = _random(rng, (4, 8, 16)).transpose(0, 2, 1)  # (4, 16, 8), transposed
    shapes = ((4, 6, 16), (4, 16, 8))
    want = np.matmul(a.reshape(shapes[0]), b)
    with _way("3m"):
        got = _kernels.matmul(a, b, shapes=shapes)
        conj = _kernels.matmul(a, b, shapes=shapes, conj_a=True)
    assert made == [1, 1]
    assert np.abs(got - want).max() <= 1e-13 * np.abs(want).max()
    assert np.abs(conj - np.matmul(a.reshape(shapes[0]).conj(), b)).max() <= 1e-13 * np.abs(
        want).max()


def test_only_thin_complex_products_are_interleaved_and_native_makes_none(made):
    rng = np.random.default_rng(2)
    thin, wide = (_random(rng, (64, 32)), _random(rng, (32, 32))), \
        (_random(rng, (64, 33)), _random(rng, (33, 8)))
    with _way("auto"):
        _kernels.matmul(*thin)
        assert made == [1]
        assert np.array_equal(_kernels.matmul(*wide), np.matmul(*wide))  # k = 33
        real = (thin[0].real.copy(), thin[1].real.copy())
        assert np.array_equal(_kernels.matmul(*real), np.matmul(*real))
        mixed = (thin[0], thin[1].astype(np.complex64))
        assert np.array_equal(_kernels.matmul(*mixed), np.matmul(*mixed))
    assert made == [1]
    with _way("native"):
        assert np.array_equal(_kernels.matmul(*thin), np.matmul(*thin))
        assert not _kernels.interleaved(np.complex128)
    assert made == [1]
    assert _kernels.product_way(np.complex128, np.complex128, (10**6, 16, 16), "gpu") \
        == ("native" if dask.config.get("src_dask.complex-products") == "native"
            else "interleaved")


@pytest.mark.parametrize("stack", list(STACKS))
@pytest.mark.parametrize("n,p", [(2, 2), (3, 3), (6, 2)])
def test_src_with_interleaved_products_is_exact_and_the_native_result(stack, n, p, made):
    exact_and_native(STACKS[stack](n, p), "auto", made)  # pass 1's and the projections' thin steps


def test_tiny_thin_products_stay_native(monkeypatch, made):
    monkeypatch.setattr(_kernels, "THIN_MIN_ELEMENTS", 64 * 16)
    rng = np.random.default_rng(3)
    tiny, big = (_random(rng, (63, 16)), _random(rng, (16, 8))), \
        (_random(rng, (64, 16)), _random(rng, (16, 8)))
    with _way("auto"):
        assert np.array_equal(_kernels.matmul(*tiny), np.matmul(*tiny))
        assert made == []
        _kernels.matmul(*big)
    assert made == [1]
