"""Reference problems: shapes, dtypes, statistics, laziness, and the Hamiltonians
against quimb's dense matrices."""

from __future__ import annotations

import math

import dask
import dask.array as da
import numpy as np
import pytest

from src_dask import TensorTrain, problems


def test_random_mps_layout_capped_bonds_and_dtype():
    x = problems.random_mps(8, 6, phys=2, seed=1)
    assert isinstance(x, TensorTrain) and x.kind == "mps"
    assert x.bond_dims == [2, 4, 6, 6, 6, 4, 2]  # min(6, 2**k), k sites on the smaller side
    assert x[0].shape == (2, 2) and x[3].shape == (6, 6, 2) and x[-1].shape == (2, 2)
    assert all(isinstance(c, da.Array) for c in x)  # lazy
    assert x.dtype == np.complex128
    assert problems.random_mps(5, 3, phys=3, dtype="float32", seed=1).dtype == np.float32


def test_random_mpo_layout_capped_bonds_and_dtype():
    a = problems.random_mpo(6, 8, phys=2, dtype="complex64", seed=2)
    assert a.kind == "mpo" and a.dtype == np.complex64
    assert a.bond_dims == [4, 8, 8, 8, 4]  # min(8, 4**k)
    assert a[0].shape == (4, 2, 2) and a[2].shape == (8, 8, 2, 2) and a[-1].shape == (4, 2, 2)
    assert a.phys_dims == [(2, 2)] * 6


def test_random_trains_are_reproducible_and_seeded():
    a, b = problems.random_mps(5, 4, seed=7), problems.random_mps(5, 4, seed=7)
    c = problems.random_mps(5, 4, seed=8)
    for x, y, z in zip(a.to_numpy(), b.to_numpy(), c.to_numpy(), strict=True):
        np.testing.assert_array_equal(x, y)
        assert not np.allclose(x, z)


def test_random_train_scaling():
    """Entries of variance 1/(r·p): E|psi|^2 = 1 for an MPS, E|A x|^2 = |x|^2 for an MPO."""
    mid = problems.random_mps(16, 64, phys=2, seed=0)[7].compute()
    assert mid.shape == (64, 64, 2)  # right bond 64
    assert abs(np.mean(np.abs(mid) ** 2) * 64 * 2 - 1) < 0.05
    assert abs(np.mean(mid.real ** 2) - np.mean(mid.imag ** 2)) < 0.1 / (64 * 2)
    a = problems.random_mpo(12, 32, phys=2, dtype="float64", seed=0)[6].compute()
    assert a.shape == (32, 32, 2, 2)
    assert abs(np.mean(a ** 2) * 32 * 2 - 1) < 0.05


def test_stack_shapes_statistics_and_seeds():
    s = problems.stack(sites=5, dm=32, seed=3)
    assert list(s) == ["N", "V", "M", "U"]
    assert [t.bond_dims[1] for t in s.values()] == [4, 4, 32, 4]
    assert all(t.phys_dims == [(4, 4)] * 5 and t.dtype == np.complex128 for t in s.values())
    m = s["M"][2].compute()  # (32, 32, 4, 4): entries (N(0,1) + i N(0,1)) / sqrt(32·4)
    assert m.shape == (32, 32, 4, 4)
    assert abs(np.mean(m.real ** 2) * 32 * 4 - 1) < 0.05
    assert abs(np.mean(m.imag ** 2) * 32 * 4 - 1) < 0.05
    assert abs(np.mean(m)) < 0.05 / np.sqrt(32 * 4)
    # factor i is drawn with seed + i: N and V differ, a second call is identical
    assert not np.allclose(s["N"][1].compute(), s["V"][1].compute())
    again = problems.stack(sites=5, dm=32, seed=3)
    np.testing.assert_array_equal(again["M"][2].compute(), m)


def test_stack_is_lazy():
    """A stack of D_M = 1000 (3 GB on 12 sites; 12 GB on 50) is a graph, not memory."""
    def no_compute(*args, **kwargs):  # pragma: no cover - must not run
        raise AssertionError("building the stack computed something")

    with dask.config.set(scheduler=no_compute):
        s = problems.stack(sites=12, dm=1000)
    m = s["M"]
    assert m.nbytes == 10 * 1000 * 1000 * 16 * 16 + 2 * 1000 * 16 * 16
    assert all(isinstance(c, da.Array) for c in m)
    biggest = np.prod([max(c) for c in m[1].chunks])
    assert biggest * 16 <= 32 * 2**20  # drawn in chunks of at most 32 MiB



@pytest.mark.parametrize("dtype, decay", [("complex128", None), ("complex64", 0.9),
                                          ("float64", 0.5)])
def test_random_cores_are_dasks_draws_in_tasks_named_for_the_inputs(dtype, decay):
    """Each block of a random core is one task named ``src_random_<kind>`` (the
    dashboard's Progress panel tells the inputs' draws apart), and the numbers are
    those of dask.array.random's ``default_rng(seed)`` chain bit for bit: ``re`` then
    ``im`` per site, scaled, weighted by the decay, cast; cores chunked along a bond."""
    from dask.utils import key_split

    bonds, phys, seed = [300, 300], 40, 5  # the middle core in 2 blocks of its left bond
    train = problems.random_train("mps", bonds, phys=phys, dtype=dtype, seed=seed,
                                  decay=decay)
    assert train[1].numblocks == (2, 1, 1)
    rng = da.random.default_rng(seed)
    for j, core in enumerate(train):
        assert {key_split(k) for k in dict(core.dask)} == {"src_random_mps"}
        assert len(dict(core.dask)) == math.prod(core.numblocks)  # one task a block
        ref = rng.standard_normal(core.shape, chunks=core.chunks)
        if np.dtype(dtype).kind == "c":
            ref = ref + 1j * rng.standard_normal(core.shape, chunks=core.chunks)
        ref = ref * 1.0
        if decay is not None and j < len(bonds):
            axis = 0 if j == 0 else 1
            w = decay ** np.arange(bonds[j], dtype=float)
            ref = ref * w.reshape((-1,) + (1,) * (ref.ndim - axis - 1))
        got, want = core.compute(), ref.astype(dtype).compute()
        assert got.dtype == want.dtype and np.array_equal(got, want), j

def test_problem_argument_errors():
    with pytest.raises(ValueError, match="sites"):
        problems.random_mps(1, 4)
    with pytest.raises(ValueError, match="dtype"):
        problems.random_mpo(4, 2, dtype="int64")
    with pytest.raises(ValueError, match="bond"):
        problems.random_mps(4, 0)
    with pytest.raises(ValueError, match="sites"):
        problems.ising(1)


# -- Hamiltonians against quimb ----------------------------------------------------------
@pytest.mark.parametrize("sites", [2, 3, 6])
@pytest.mark.parametrize("j, bz", [(1.0, 0.0), (0.7, 0.3), ((1.0, 1.0, 2.5), -0.4),
                                   ((0.5, -0.8, 0.3), 0.2)])
def test_heisenberg_matches_quimb(sites, j, bz):
    qtn = pytest.importorskip("quimb.tensor")
    h = problems.heisenberg(sites, j, bz)
    assert h.kind == "mpo" and h.dtype == np.float64
    assert h.bond_dims == [5] * (sites - 1)
    ref = qtn.MPO_ham_heis(sites, j=j, bz=bz).to_dense()
    np.testing.assert_allclose(h.to_dense(), ref, rtol=0, atol=1e-12)


@pytest.mark.parametrize("sites", [2, 3, 6])
@pytest.mark.parametrize("j, bx", [(1.0, 0.0), (1.0, 0.5), (-0.6, 1.3)])
def test_ising_matches_quimb(sites, j, bx):
    qtn = pytest.importorskip("quimb.tensor")
    h = problems.ising(sites, j, bx)
    assert h.bond_dims == [3] * (sites - 1)
    ref = qtn.MPO_ham_ising(sites, j=j, bx=bx).to_dense()
    np.testing.assert_allclose(h.to_dense(), ref, rtol=0, atol=1e-12)


@pytest.mark.parametrize("dtype", ["float32", "float64", "complex64", "complex128"])
def test_hamiltonian_dtypes_and_quimb_layout(dtype):
    qtn = pytest.importorskip("quimb.tensor")
    h = problems.heisenberg(5, (1.0, 0.5, 0.2), 0.3, dtype=dtype)
    assert h.dtype == np.dtype(dtype)
    assert [c.shape for c in h] == [(5, 2, 2), (5, 5, 2, 2), (5, 5, 2, 2), (5, 5, 2, 2),
                                    (5, 2, 2)]
    ref = qtn.MPO_ham_heis(5, j=(1.0, 0.5, 0.2), bz=0.3).to_dense()
    tol = 1e-12 if np.dtype(dtype).itemsize >= 16 or dtype == "float64" else 1e-5
    # through quimb: the cores are in quimb's layout, so quimb reads them as they are
    np.testing.assert_allclose(h.to_quimb().to_dense(), ref, rtol=0, atol=tol)
    i = problems.ising(4, 1.0, 0.5, dtype=dtype)
    assert [c.shape for c in i] == [(3, 2, 2), (3, 3, 2, 2), (3, 3, 2, 2), (3, 2, 2)]


def test_stack_bond_sets_the_bonds_of_n_v_and_u():
    s = problems.stack(5, dm=7, bond=3, phys=2)
    assert {name: max(t.bond_dims) for name, t in s.items()} == {"N": 3, "V": 3, "M": 7, "U": 3}


def test_a_problem_spec_fills_its_defaults_builds_and_sizes_itself():
    """``problems.spec`` (what ``src-dask generate`` records): defaults filled in, an
    option of another kind refused; ``build`` makes it and ``spec_bytes`` says its
    size without making it."""
    from src_dask import problems

    spec = problems.spec("mps", sites=6, bond=5)
    assert spec == {"kind": "mps", "sites": 6, "bond": 5, "phys": 2, "dtype": "complex128",
                    "seed": 0}
    (train,) = problems.build(spec).values()
    assert len(train) == 6 and max(train.bond_dims) == 5
    assert problems.spec_bytes(spec) == train.nbytes
    stack = problems.build(problems.spec("stack", sites=4, dm=6))
    assert list(stack) == ["N", "V", "M", "U"]
    with pytest.raises(ValueError, match="--dm does not apply to 'mpo'"):
        problems.spec("mpo", dm=3)
    with pytest.raises(ValueError, match="kind: expected one of"):
        problems.spec("peps")
