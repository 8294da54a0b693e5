"""Pass 2's basis by CholeskyQR2 queued on a guess (``_kernels.basis_ahead``, what a GPU
runs): the update and the projection are queued before the device says whether the
first-order basis is accurate, and made again where it is not. On the CPU the tests
switch it on (``_CHOLESKY_ON_CPU``): the same arithmetic, by NumPy and SciPy."""

from __future__ import annotations

import numpy as np
import pytest
from helpers import close_cores, count_calls, dense_product, random_mpo, random_mps, rel_err
from test_exact import STACKS

import src_dask
from src_dask import _kernels as K

pytestmark = pytest.mark.timeout(120)
pytest.importorskip("scipy")


@pytest.fixture
def cholesky(monkeypatch):
    monkeypatch.setattr(K, "_CHOLESKY_ON_CPU", True)


def _sketch(cond: float, rows: int = 12, cols: int = 60, seed: int = 0) -> np.ndarray:
    """``rows`` sketch rows of condition number ``cond`` (complex)."""
    rng = np.random.default_rng(seed)
    u, _ = np.linalg.qr(rng.standard_normal((cols, rows)) + 1j * rng.standard_normal((cols, rows)))
    v, _ = np.linalg.qr(rng.standard_normal((rows, rows)))
    return (u * np.logspace(0, -np.log10(cond), rows) @ v).T


def _householder(mt, up=2, down=3):
    q, r = np.linalg.qr(mt.T)
    return K._positive_diagonal(q, r).T.reshape(mt.shape[0], -1, up, down)


def _step(mt, ahead, calls):
    """One site of pass 2 on the sketch ``mt`` (its update noted in ``calls``)."""
    def update(eta, zs):
        calls.append(eta)
        return eta.sum()

    return K.pass2_step([[mt]], [np.ones(1)], None, up=2, down=3, cutoff=0.0,
                        max_rank=mt.shape[0], site=4, update=update, ahead=ahead)


def test_a_guess_that_stands_is_updated_once_and_is_householders_basis(cholesky):
    mt, ahead, calls = _sketch(1e2), K.Ahead(), []
    eta, env, z = _step(mt, ahead, calls)
    assert ahead.on and len(calls) == 1 and calls[0] is eta and z is None
    assert np.abs(eta - _householder(mt)).max() < 1e-13


def test_a_guess_that_fails_is_made_again_and_the_next_site_asks_first(cholesky):
    mt, ahead, calls = _sketch(1e5), K.Ahead(), []  # beyond first order: a second round
    eta, env, _ = _step(mt, ahead, calls)
    assert not ahead.on and len(calls) == 2 and calls[1] is eta and env == eta.sum()
    assert np.abs(eta - _householder(mt)).max() < 1e-10
    eta, _, _ = _step(mt, ahead, calls)  # asked first: made once, the guess not updated
    assert not ahead.on and len(calls) == 3 and calls[2] is eta
    good = _sketch(1e2, seed=1)
    eta, _, _ = _step(good, ahead, calls)  # asked first, stood: the next site guesses again
    assert ahead.on and len(calls) == 4
    assert np.abs(eta - _householder(good)).max() < 1e-13


@pytest.mark.parametrize("mt", [_sketch(1e10), np.repeat(_sketch(1e2)[:4], 3, axis=0)],
                         ids=["cond 1e10", "rank 4 of 12"])
def test_a_sketch_beyond_cholesky_qr2_gets_householders_basis(cholesky, mt, monkeypatch):
    """(NumPy's Cholesky refuses these outright, where CuPy's gives NaN and the guess
    fails: Householder's QR either way.) A first round that fails is not tried again
    before Householder's QR."""
    rounds = count_calls(monkeypatch, K, "_cholesky_qr2_ahead")
    eta, _, _ = _step(mt, K.Ahead(), [])
    assert len(rounds) == 1
    rows = eta.reshape(12, -1)
    assert np.abs(rows.conj() @ rows.T - np.eye(12)).max() < 1e-12
    assert np.abs(eta - K._householder(mt, 2, 3, 0.0, 12, site=4)).max() == 0


RUNS = {**{name: STACKS[name] for name in ("mpo.mps", "mpo.mpo.mps", "bra.mpo.mpo")},
        "real mpo.mps": lambda n, p: [random_mpo(n, 3, p, dtype="float64", seed=3),
                                      random_mps(n, 4, p, dtype="float64", seed=4)]}


@pytest.mark.parametrize("stack", list(RUNS))
@pytest.mark.parametrize("n,p", [(2, 3), (3, 2), (7, 2)])
def test_runs_on_guessed_bases_are_exact_and_the_householder_runs(stack, n, p, monkeypatch):
    trains = RUNS[stack](n, p)
    householder = src_dask.src(*trains, chi_out=200, seed=3)
    monkeypatch.setattr(K, "_CHOLESKY_ON_CPU", True)
    guesses = []
    real = K.basis_ahead
    monkeypatch.setattr(K, "basis_ahead", lambda *a: guesses.append(1) or real(*a))
    y = src_dask.src(*trains, chi_out=200, seed=3)
    assert len(guesses) >= n - 1
    assert rel_err(y, dense_product(*trains)) <= 1e-12
    assert close_cores(y, householder, rtol=1e-10)


def test_a_decaying_spectrum_guesses_little_and_stays_exact(cholesky, monkeypatch):
    """Sketches of a product whose bonds' spectra decay (as physical states' do) are too
    ill-conditioned for the guess at most sites: after a miss the sites ask first, so
    the updates made again are few."""
    a = random_mpo(12, 3, seed=1)
    x = random_mps(12, 24, seed=2, decay=0.3)
    updates = []
    real = K.update_env
    monkeypatch.setattr(K, "update_env", lambda *args: updates.append(1) or real(*args))
    y = src_dask.apply(a, x, 72, seed=4)  # exact: 3 x 24
    assert rel_err(y, dense_product(a, x)) <= 1e-10
    assert len(updates) <= 11 + 3  # a site's update, and a few made again
