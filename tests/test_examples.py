"""The examples keep working, at small sizes: examples/ising_evolution.py and
examples/out_of_core.py (quickstart and slurm are tested in test_docs.py and
test_examples_slurm.py)."""

from __future__ import annotations

import importlib.util
import runpy
from pathlib import Path

import numpy as np
import pytest
from helpers import random_mpo, random_mps

import src_dask

ROOT = Path(__file__).resolve().parent.parent
HAS_MATPLOTLIB = importlib.util.find_spec("matplotlib") is not None


def _example(name: str) -> dict:
    """The example's module namespace, without running its ``__main__`` part."""
    return runpy.run_path(str(ROOT / "examples" / name))


@pytest.fixture(scope="module")
def ising():
    pytest.importorskip("quimb")
    return _example("ising_evolution.py")


@pytest.fixture(scope="module")
def ooc():
    return _example("out_of_core.py")


# -- ising_evolution.py --------------------------------------------------------------------
def test_ising_bond_terms_sum_to_quimbs_hamiltonian(ising):
    """The convention: Σ h_{i,i+1} = -J ΣZZ - h ΣX = quimb's ham_ising(L, jz=-4J, bx=2h)."""
    import quimb

    n, j, h = 5, 0.7, 1.3
    total = np.zeros((2**n, 2**n))
    for i in range(n - 1):
        total += np.kron(np.kron(np.eye(2**i), ising["bond_hamiltonian"](i, n, j, h)),
                         np.eye(2 ** (n - i - 2)))
    np.testing.assert_allclose(total, quimb.ham_ising(n, jz=-4 * j, bx=2 * h).real, atol=1e-12)


@pytest.mark.parametrize("parity", [0, 1])
def test_ising_layer_mpo_is_the_gate_layer(ising, parity):
    n = 5
    layer = ising["gates"](n, parity, 0.3, 1.0, 0.8)
    mpo = ising["layer_mpo"](n, layer)
    assert max(mpo.bond_dims) <= 4
    v = np.random.default_rng(0).standard_normal(2**n) + 0j
    np.testing.assert_allclose(mpo.to_dense() @ v, ising["apply_layer_dense"](v, n, layer),
                               atol=1e-12)


def test_ising_evolution_is_exact_without_truncation(ising, tmp_path):
    """chi_out = 2^(L/2), the largest bond of any state: src_dask reproduces the dense
    Trotter evolution to rounding, and differs from e^{-iHt} by the Trotter error only."""
    res = ising["main"](["--sites", "8", "--steps", "10", "--dt", "0.1", "--chi-out", "16",
                         "--plot", ""])
    assert res["max_infidelity_vs_trotter"] < 1e-12
    assert res["max_dz_vs_trotter"] < 1e-10
    assert 1e-6 < res["max_dz_trotter_vs_exact"] < 1e-2  # second order, dt = 0.1
    assert res["max_infidelity_vs_exact"] < 1e-4
    assert max(res["final_bonds"]) == 16


def test_ising_evolution_truncated_and_plotted(ising, tmp_path, capsys):
    plot = tmp_path / "ising.png"
    res = ising["main"](["--sites", "8", "--steps", "15", "--dt", "0.1", "--chi-out", "6",
                         "--plot", str(plot)])
    out = capsys.readouterr().out
    assert "vs dense Trotter" in out and "vs exact e^-iHt" in out
    assert max(res["final_bonds"]) == 6
    # truncation to bond 6 of 16 costs something, but little
    assert 1e-10 < res["max_infidelity_vs_trotter"] < 1e-4  # measured 2.5e-6
    assert res["max_dz_vs_trotter"] < 1e-4  # measured 5e-7
    assert res["rows"][0]["z_src"] == pytest.approx(1.0)
    if HAS_MATPLOTLIB:
        assert res["plot"] == plot and plot.stat().st_size > 10_000
    else:
        assert res["plot"] is None and "matplotlib is not installed" in out


# -- out_of_core.py --------------------------------------------------------------------------
def test_streamed_overlap_matches_dense(ooc):
    a, x = random_mpo(5, 3, seed=1), random_mps(5, 4, seed=2)
    y = random_mps(5, 2, seed=3)
    ax = a.to_dense() @ x.to_dense()
    m, log = ooc["overlap"](y, [(a, False)], x)
    assert m * np.exp(log) == pytest.approx(np.vdot(y.to_dense(), ax), rel=1e-12)
    m, log = ooc["overlap"](x, [(a, True), (a, False)], x)
    assert m * np.exp(log) == pytest.approx(np.vdot(ax, ax), rel=1e-12)


def test_generated_inputs_are_the_same_every_time(ooc, tmp_path):
    one = ooc["random_train"]("mps", 4, 300, 2, 4.0, seed=5)  # > one generation chunk
    two = ooc["random_train"]("mps", 4, 300, 2, 4.0, seed=5)
    for c1, c2 in zip(one.to_numpy(), two.to_numpy(), strict=True):
        np.testing.assert_array_equal(c1, c2)


@pytest.mark.slow  # seconds of wall time: `make test-slow` (CI runs it too)
def test_out_of_core_run_store_and_resume(ooc, tmp_path, capsys):
    argv = ["--dir", str(tmp_path), "--sites", "8", "--bond", "8", "--chi-out", "8",
            "--memory-limit", "500MiB", "--workers", "1"]
    res = ooc["main"](argv)
    out = capsys.readouterr().out
    assert "generated in" in out and "calling src again" in out
    assert res["complete"] is True and res["same"]
    y = res["result"]
    assert all(type(c).__module__.startswith("dask") for c in y)  # over the store
    assert (tmp_path / "run.zarr" / "result" / "site_7").is_dir()
    assert all(p < 500 * 2**20 for p in res["peaks"].values())
    # the result against A·x and against the optimal truncation of the exact product
    assert 0 < res["rel_error"] < 0.05
    assert res["rel_error"] < 1.5 * res["svd_error"]
    a, x = src_dask.open(tmp_path / "inputs/A"), src_dask.open(tmp_path / "inputs/x")
    exact = src_dask.trains.exact_product(a, x).to_dense()
    dense_err = np.linalg.norm(y.to_dense() - exact) / np.linalg.norm(exact)
    assert res["rel_error"] == pytest.approx(dense_err, rel=1e-4)
    # the same command again: the inputs and the finished run are reused, not recomputed
    # (nothing in the inputs or the store is written again)
    def written():
        return {p: p.stat().st_mtime_ns for d in ("inputs", "run.zarr")
                for p in (tmp_path / d).rglob("*") if p.is_file()}

    before = written()
    again = ooc["main"]([*argv, "--no-check", "--reference", "no"])
    assert "(reused)" in capsys.readouterr().out
    assert written() == before
    for c, c2 in zip(y, again["result"], strict=True):
        np.testing.assert_array_equal(np.asarray(c), np.asarray(c2))


# -- evolution_on_a_cluster.py -----------------------------------------------------------
@pytest.mark.timeout(300)
def test_evolution_on_a_cluster_keeps_the_state_there_and_agrees_with_quimb(capsys):
    """The loop of persisted steps on a Client gives quimb's state (both exact here: the
    bonds stay below chi_out) and prints the times per step of both."""
    pytest.importorskip("quimb")
    example = _example("evolution_on_a_cluster.py")
    out = example["main"](["--sites", "8", "--chi-out", "16", "--steps", "3",
                           "--workers", "1"])
    assert out["infidelity_vs_quimb"] < 1e-10
    assert max(out["bonds"]) <= 16 and out["src_dask_seconds_per_step"] > 0
    assert "a step" in capsys.readouterr().out
