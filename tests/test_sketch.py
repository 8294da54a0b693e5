"""Oversampling, cutoff, reproducibility across chunks and workers, the random sketch."""

from __future__ import annotations

import numpy as np
import pytest
from helpers import cholesky_qr2, random_mpo, random_mps, rel_err

import src_dask
from src_dask import _random
from src_dask.trains import exact_product


def _tt_svd_error(vec: np.ndarray, dims: list[int], chi: int) -> float:
    """Error of the optimal-by-sweep TT-SVD truncation of ``vec`` to bond ``chi``."""
    left, rest, us = 1, vec, []
    for d in dims[:-1]:
        u, s, vh = np.linalg.svd(rest.reshape(left * d, -1), full_matrices=False)
        k = min(chi, len(s))
        us.append(u[:, :k])
        rest, left = s[:k, None] * vh[:k], k
    out = rest
    for u in reversed(us):
        out = u @ out.reshape(u.shape[1], -1)
    return float(np.linalg.norm(out.ravel() - vec) / np.linalg.norm(vec))


def test_oversampling_is_near_optimal():
    """median(error / TT-SVD error) <= 1.1 where the sketch is narrower than the rank."""
    n, chi = 12, 8
    ratios, plain = [], []
    for seed in range(7):
        a = random_mpo(n, 4, 2, seed=seed, decay=0.8)
        x = random_mps(n, 16, 2, seed=seed + 100, decay=0.8)
        exact = exact_product(a, x).to_dense()
        best = _tt_svd_error(exact, [2] * n, chi)
        y = src_dask.apply(a, x, chi, oversample="auto", seed=seed)
        assert max(y.bond_dims) <= chi
        ratios.append(rel_err(y, exact) / best)
        plain.append(rel_err(src_dask.apply(a, x, chi, seed=seed), exact) / best)
    assert np.median(ratios) <= 1.1, ratios
    assert np.median(plain) > 1.3  # the check can tell plain SRC from oversampled


def test_explicit_oversample_equals_auto_size():
    a, x = random_mpo(8, 3, seed=1), random_mps(8, 6, seed=2)
    y1 = src_dask.apply(a, x, 4, oversample=10, seed=3)
    y2 = src_dask.apply(a, x, 4, oversample="auto", seed=3)  # max(ceil(4/2), 10) = 10
    np.testing.assert_allclose(y1.to_dense(), y2.to_dense(), rtol=0, atol=1e-13)


def test_cutoff_drops_small_directions():
    a = random_mpo(8, 3, seed=1, decay=0.1)
    x = random_mps(8, 6, seed=2, decay=0.1)
    exact = exact_product(a, x).to_dense()
    full = src_dask.apply(a, x, 30, seed=0)
    cut = src_dask.apply(a, x, 30, cutoff=1e-3, seed=0)
    assert sum(cut.bond_dims) < sum(full.bond_dims)
    assert rel_err(full, exact) <= 1e-12
    assert 1e-12 < rel_err(cut, exact) <= 1e-2


@pytest.mark.parametrize("oversample", [0, 6])
@pytest.mark.parametrize("n,mpo_bond,bond,chi", [(10, 3, 8, 12), (30, 4, 48, 48)])
def test_result_independent_of_chunk(oversample, n, mpo_bond, bond, chi):
    """Core by core, not just the product: the gauge of the output is canonical.
    (The 30-site case truncates rank-deficient sketches near the left end.)"""
    a, x = random_mpo(n, mpo_bond, seed=1), random_mps(n, bond, seed=2)
    ys = [src_dask.apply(a, x, chi, seed=3, chunk=c, oversample=oversample) for c in (5, 12, 64)]
    for y in ys[1:]:
        for c0, c1 in zip(ys[0], y, strict=True):
            np.testing.assert_allclose(c1, c0, rtol=0, atol=1e-12 * np.abs(c0).max())


def test_result_independent_of_worker_count(cluster_client):
    a, x = random_mpo(10, 3, seed=4), random_mps(10, 8, seed=5)
    local = src_dask.apply(a, x, 12, seed=7, chunk=12)
    on_two = src_dask.apply(a, x, 12, seed=7, chunk=5, client=cluster_client)
    for c0, c1 in zip(local, on_two, strict=True):
        np.testing.assert_allclose(c1, c0, rtol=0, atol=1e-12 * np.abs(c0).max())


def test_different_seeds_differ_and_same_seed_repeats():
    a, x = random_mpo(8, 3, seed=4), random_mps(8, 8, seed=5)
    y1 = src_dask.apply(a, x, 5, seed=1).to_dense()
    y2 = src_dask.apply(a, x, 5, seed=1).to_dense()
    y3 = src_dask.apply(a, x, 5, seed=2).to_dense()
    np.testing.assert_array_equal(y1, y2)
    assert np.abs(y1 - y3).max() > 1e-6


def test_sketch_columns_depend_only_on_seed_site_and_column():
    key = _random.seed_key(42)
    whole = _random.sketch_block(key, 3, 0, 50, (2, 3), np.complex128)
    parts = np.concatenate([_random.sketch_block(key, 3, a, b, (2, 3), np.complex128)
                            for a, b in [(0, 7), (7, 8), (8, 50)]])
    np.testing.assert_array_equal(whole, parts)
    # the definition, written out for one column (site 3, column 9): SplitMix64 of the
    # Weyl sequence at counter (9 << 32) + i + 1, then Box-Muller on pairs
    origin = int(np.random.SeedSequence([key, 3]).generate_state(1, np.uint64)[0])
    m = 2**64 - 1
    uniform = []
    for i in range(12):
        z = (origin + (((9 << 32) + i + 1) * 0x9E3779B97F4A7C15)) & m
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & m
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & m
        z ^= z >> 31
        uniform.append(((z >> 11) + 0.5) * 2.0**-53)
    u = np.array(uniform)
    r, t = np.sqrt(-2 * np.log(u[0::2])), 2 * np.pi * u[1::2]
    draws = np.concatenate([r * np.cos(t), r * np.sin(t)])
    np.testing.assert_allclose(whole[9].ravel(), (draws[:6] + 1j * draws[6:]) / np.sqrt(2),
                               rtol=1e-13)
    # other sites and neighbouring columns are not correlated copies
    assert not np.allclose(whole[10], whole[9])
    assert not np.allclose(_random.sketch_block(key, 4, 9, 10, (2, 3), np.complex128)[0], whole[9])


def test_sketch_statistics():
    key = _random.seed_key(0)
    real = _random.sketch_block(key, 0, 0, 4000, (5,), np.float64)
    cplx = _random.sketch_block(key, 1, 0, 4000, (5,), np.complex128)
    assert abs(real.mean()) < 0.05 and abs(real.var() - 1) < 0.05
    assert abs(np.mean(np.abs(cplx) ** 2) - 1) < 0.05
    assert abs(np.mean(cplx.real * cplx.imag)) < 0.05


def test_cholesky_qr2_is_the_positive_diagonal_qr():
    """The GPU's CholeskyQR2 (run here through SciPy) gives Householder's Q with
    diag R > 0, and declines (None) what it cannot orthonormalise to rounding."""
    pytest.importorskip("scipy")
    from src_dask import _kernels as K

    rng = np.random.default_rng(0)
    for rows, cols in [(40, 100), (7, 7), (30, 31)]:
        a = rng.standard_normal((rows, cols)) + 1j * rng.standard_normal((rows, cols))
        q, r = np.linalg.qr(a.T)
        assert np.abs(cholesky_qr2(a) - K._positive_diagonal(q, r).T).max() < 1e-13
    u, _ = np.linalg.qr(rng.standard_normal((60, 12)))
    v, _ = np.linalg.qr(rng.standard_normal((12, 12)))
    for cond in (1e2, 1e5):  # round two to first order, and in full
        a = (u * np.logspace(0, -np.log10(cond), 12) @ v).T
        q, r = np.linalg.qr(a.T)
        q2 = cholesky_qr2(a)
        assert np.abs(q2 @ q2.T - np.eye(12)).max() < 1e-14
        assert np.abs(q2 - K._positive_diagonal(q, r).T).max() < 1e-15 * cond
    assert cholesky_qr2((u * np.logspace(0, -10, 12) @ v).T) is None  # cond 1e10
    assert cholesky_qr2(np.repeat(u.T[:4], 3, axis=0)) is None  # rank 4 of 12
    nan = u.T.copy()
    nan[0, 0] = np.nan
    assert cholesky_qr2(nan) is None


def test_the_cpu_basis_has_the_positive_diagonal_gauge():
    """On the CPU (Householder QR) the basis of the sketch's range is canonical: its
    triangular factor has a real positive diagonal, with and without a cutoff, so
    cores agree across devices and chunkings core by core, not only as products."""
    from src_dask import _kernels as K

    rng = np.random.default_rng(3)
    mt = rng.standard_normal((6, 20)) + 1j * rng.standard_normal((6, 20))
    for cutoff in (0.0, 1e-3):
        eta = K.orthonormalize([[mt[:4]], [mt[4:]]], up=2, down=2, cutoff=cutoff,
                               max_rank=6, site=1)
        q = eta.reshape(eta.shape[0], -1).T
        assert np.abs(q.conj().T @ q - np.eye(q.shape[1])).max() < 1e-13
        diag = np.diagonal(q.conj().T @ mt.T[:, :q.shape[1]])
        assert np.abs(diag.imag).max() < 1e-12 and diag.real.min() > 0, cutoff
