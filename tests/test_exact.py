"""With chi_out at least the exact bond dimension, SRC reproduces the product."""

from __future__ import annotations

import numpy as np
import pytest
from helpers import dense_product, random_mpo, random_mps, rel_err

import src_dask
from src_dask.trains import exact_product

# (name, builder(n, phys) -> list of trains). Uneven bonds throughout.
STACKS = {
    "compress-mps": lambda n, p: [random_mps(n, bond=_uneven(n, 5), phys=p, seed=1)],
    "compress-mpo": lambda n, p: [random_mpo(n, bond=_uneven(n, 3), phys=p, seed=2)],
    "mpo.mps": lambda n, p: [random_mpo(n, _uneven(n, 3), p, seed=3),
                             random_mps(n, _uneven(n, 4), p, seed=4)],
    "mpo.mpo": lambda n, p: [random_mpo(n, _uneven(n, 2), p, seed=5),
                             random_mpo(n, _uneven(n, 3), p, seed=6)],
    "mpo.mpo.mps": lambda n, p: [random_mpo(n, 2, p, seed=7), random_mpo(n, _uneven(n, 3), p,
                                                                          seed=8),
                                 random_mps(n, _uneven(n, 3), p, seed=9)],
    "mpo.mpo.mpo": lambda n, p: [random_mpo(n, 2, p, seed=10), random_mpo(n, 2, p, seed=11),
                                 random_mpo(n, _uneven(n, 2), p, seed=12)],
    "bra.mpo": lambda n, p: [random_mps(n, _uneven(n, 4), p, seed=13),
                             random_mpo(n, _uneven(n, 3), p, seed=14)],
    "bra.mpo.mpo": lambda n, p: [random_mps(n, _uneven(n, 3), p, seed=15),
                                 random_mpo(n, 2, p, seed=16),
                                 random_mpo(n, _uneven(n, 3), p, seed=17)],
}


def _uneven(n: int, base: int) -> list[int]:
    """Bonds that differ from cut to cut: base, base+1, base-1, ..."""
    return [max(1, base + (j % 3) - 1) for j in range(n - 1)]


# (sites, physical dim): 10 sites with d=2; 2, 3 and 5 sites with d=3
SIZES = [(2, 2), (3, 2), (10, 2), (2, 3), (3, 3), (5, 3)]


@pytest.mark.parametrize("stack", list(STACKS))
@pytest.mark.parametrize("n,p", SIZES)
def test_exact_complex128(stack, n, p):
    trains = STACKS[stack](n, p)
    exact = dense_product(*trains)
    y = src_dask.src(*trains, chi_out=200, seed=3)
    assert y.kind == ("mps" if any(t.kind == "mps" for t in trains) else "mpo")
    assert y.dtype == np.complex128
    assert rel_err(y, exact) <= 1e-12


@pytest.mark.parametrize("dtype,tol", [(np.float64, 1e-12), (np.float32, 2e-4),
                                       (np.complex64, 2e-4)])
@pytest.mark.parametrize("stack", ["mpo.mps", "mpo.mpo", "bra.mpo.mpo", "compress-mps"])
def test_exact_other_dtypes(stack, dtype, tol):
    trains = [type(t)([c.astype(dtype) if np.dtype(dtype).kind == "c" else c.real.astype(dtype)
                       for c in t], t.kind) for t in STACKS[stack](6, 2)]
    exact = dense_product(*trains)
    y = src_dask.src(*trains, chi_out=64, seed=1)
    assert y.dtype == dtype
    assert all(np.asarray(c).dtype == dtype for c in y)
    assert rel_err(y, exact) <= tol


def test_deep_ket_stack_with_phys_3_and_uneven_legs():
    """Rectangular MPOs: up legs 3, down legs 2, feeding an MPS of phys 2."""
    n = 4
    a = random_mpo(n, bond=[2, 3, 2], phys=3, down=2, seed=1)
    b = random_mpo(n, bond=[3, 1, 2], phys=2, down=2, seed=2)
    x = random_mps(n, bond=[2, 4, 3], phys=2, seed=3)
    y = src_dask.src(a, b, x, chi_out=100, seed=0)
    assert y.phys_dims == [(3,)] * n
    assert rel_err(y, dense_product(a, b, x)) <= 1e-12


@pytest.mark.parametrize("stack", ["mpo.mps", "mpo.mpo", "compress-mps", "bra.mpo"])
def test_output_cores_are_right_isometries(stack):
    trains = STACKS[stack](8, 2)
    y = src_dask.src(*trains, chi_out=12, seed=5)
    n = len(y)
    for j in range(1, n):
        c = np.asarray(y[j])
        c = c.reshape(c.shape[0], -1)
        np.testing.assert_allclose(c @ c.conj().T, np.eye(c.shape[0]), atol=1e-12)
    assert max(y.bond_dims) <= 12


def test_rounded_output_is_left_canonical_and_truncated():
    trains = STACKS["mpo.mps"](8, 2)
    y = src_dask.src(*trains, chi_out=5, oversample="auto", seed=2)
    assert max(y.bond_dims) <= 5
    for j in range(len(y) - 1):
        c = np.asarray(y[j])
        c = c[None] if j == 0 else c  # (l, r, p)
        m = c.transpose(0, 2, 1).reshape(-1, c.shape[1])
        np.testing.assert_allclose(m.conj().T @ m, np.eye(m.shape[1]), atol=1e-12)


def test_two_site_trains():
    a = random_mpo(2, bond=3, phys=3, seed=1)
    x = random_mps(2, bond=2, phys=3, seed=2)
    y = src_dask.apply(a, x, chi_out=1, seed=0)
    assert y.bond_dims == [1]
    y = src_dask.apply(a, x, chi_out=10, seed=0)
    assert rel_err(y, dense_product(a, x)) <= 1e-12
    assert y.bond_dims == [3]  # the rank of a 3x3 reshaped product


def test_apply_and_compress_match_src():
    a, x = STACKS["mpo.mps"](6, 2)
    np.testing.assert_array_equal(src_dask.apply(a, x, 7, seed=4).to_dense(),
                                  src_dask.src(a, x, chi_out=7, seed=4).to_dense())
    np.testing.assert_array_equal(src_dask.compress(x, 3, seed=4).to_dense(),
                                  src_dask.src(x, chi_out=3, seed=4).to_dense())


def test_compressing_a_bigger_bond_loses_nothing_it_need_not():
    """A sum of an MPS with itself has bond 2χ but rank χ."""
    x = random_mps(8, bond=3, seed=1)
    cores = []
    n = len(x)
    for j, c in enumerate(x.to_numpy()):
        if j in (0, n - 1):
            cores.append(np.concatenate([c, c], axis=0))
        else:
            cores.append(_block_diag(c))
    doubled = src_dask.TensorTrain(cores, "mps")
    assert max(doubled.bond_dims) == 6
    exact = 2 * x.to_dense()
    np.testing.assert_allclose(doubled.to_dense(), exact, atol=1e-12)
    y = src_dask.compress(doubled, chi_out=10, cutoff=1e-10, seed=0)
    assert max(y.bond_dims) <= 3
    assert rel_err(y, exact) <= 1e-10
    y = src_dask.compress(doubled, chi_out=10, cutoff=1e-10, oversample=4, seed=0)
    assert max(y.bond_dims) <= 3
    assert rel_err(y, exact) <= 1e-10


def _block_diag(c: np.ndarray) -> np.ndarray:
    left, right, p = c.shape
    out = np.zeros((2 * left, 2 * right, p), dtype=c.dtype)
    out[:left, :right] = c
    out[left:, right:] = c
    return out


@pytest.mark.parametrize("stack", list(STACKS))
def test_exact_product_norm_and_vdot_helpers(stack):
    trains = STACKS[stack](4, 3)
    dense = dense_product(*trains)
    e = exact_product(*trains)
    assert np.abs(e.to_dense() - dense).max() <= 1e-13 * np.abs(dense).max()
    assert abs(e.norm() / np.linalg.norm(dense) - 1) <= 1e-13
    y = src_dask.src(*trains, chi_out=3, seed=0)
    assert abs(y.vdot(e) - np.vdot(y.to_dense(), dense)) <= 1e-12 * np.linalg.norm(dense) ** 2
