"""Against quimb: its objects in and out, its ``direct`` and ``src`` results."""

from __future__ import annotations

import numpy as np
import pytest
from helpers import dense_product

import src_dask

qtn = pytest.importorskip("quimb.tensor")


def _quimb_problem(n=8, chi=6, seed=0, phys=2):
    a = qtn.MPO_rand(n, bond_dim=3, phys_dim=phys, dtype="complex128", seed=seed)
    x = qtn.MPS_rand_state(n, bond_dim=chi, phys_dim=phys, dtype="complex128", seed=seed + 1)
    return a, x


@pytest.mark.parametrize("phys", [2, 3])
def test_quimb_objects_convert_both_ways(phys):
    a, x = _quimb_problem(n=5, phys=phys)
    ta = src_dask.trains.as_train(a)
    tx = src_dask.trains.as_train(x)
    assert ta.kind == "mpo" and tx.kind == "mps"
    np.testing.assert_allclose(ta.to_dense(), a.to_dense(), atol=1e-13)
    np.testing.assert_allclose(tx.to_dense(), x.to_dense().ravel(), atol=1e-13)
    np.testing.assert_allclose(ta.to_quimb().to_dense(), a.to_dense(), atol=1e-13)
    np.testing.assert_allclose(tx.to_quimb().to_dense(), x.to_dense(), atol=1e-13)


def test_matches_quimb_direct():
    a, x = _quimb_problem()
    direct = x.gate_with_mpo(a, method="direct")
    y = src_dask.apply(a, x, chi_out=100, seed=0)
    ref = direct.to_dense().ravel()
    assert np.linalg.norm(y.to_dense() - ref) / np.linalg.norm(ref) <= 1e-12
    # the quimb object we return is the same state
    yq = y.to_quimb()
    overlap = abs(yq.H @ direct) / (yq.norm() * direct.norm())
    assert abs(overlap - 1) <= 1e-12


def test_error_like_quimb_src():
    """Same algorithm, same sketch width: errors agree in distribution."""
    ours, theirs = [], []
    for seed in range(5):
        a, x = _quimb_problem(n=10, chi=8, seed=10 * seed)
        exact = x.gate_with_mpo(a, method="direct").to_dense().ravel()
        ref = np.linalg.norm(exact)
        y = src_dask.apply(a, x, chi_out=10, seed=seed)
        q = x.gate_with_mpo(a, method="src", max_bond=10, seed=seed)
        ours.append(np.linalg.norm(y.to_dense() - exact) / ref)
        theirs.append(np.linalg.norm(q.to_dense().ravel() - exact) / ref)
    ratio = np.median(ours) / np.median(theirs)
    assert 0.6 <= ratio <= 1.6, (ours, theirs)


def test_quimb_mpo_mpo():
    a, _ = _quimb_problem(n=6, seed=3)
    b, _ = _quimb_problem(n=6, seed=5)
    y = src_dask.src(a, b, chi_out=100, seed=0)
    assert y.kind == "mpo"
    exact = a.to_dense() @ b.to_dense()
    assert np.linalg.norm(y.to_dense() - exact) / np.linalg.norm(exact) <= 1e-12


def _physics_stacks():
    n = 7
    heis, ising = qtn.MPO_ham_heis(n), qtn.MPO_ham_ising(n, j=1.0, bx=0.5)
    psi = qtn.MPS_rand_state(n, 5, seed=1)
    return {
        "heis.neel": (heis, qtn.MPS_neel_state(n)),
        "heis.heis.psi": (heis, heis, psi),
        "ising.psi": (ising, psi),
        "identity.product-state": (qtn.MPO_identity(n), qtn.MPS_computational_state("0110100")),
        "compress-neel": (qtn.MPS_neel_state(n),),
        "bra psi.heis": (psi, heis),
        "heis.ising (mpo.mpo)": (heis, ising),
        "spin-1 heis.psi": (qtn.MPO_ham_heis(5, S=1), qtn.MPS_rand_state(5, 4, phys_dim=3, seed=2)),
    }


@pytest.mark.parametrize("name", list(_physics_stacks()))
def test_physics_operators_exact(name):
    tns = _physics_stacks()[name]
    y = src_dask.src(*tns, chi_out=64, seed=0)
    exact = dense_product(*tns)
    exact = exact.ravel() if y.kind == "mps" else exact
    assert y.dtype == np.float64  # real operators and states stay real
    assert np.linalg.norm(y.to_dense() - exact) / np.linalg.norm(exact) <= 1e-12
