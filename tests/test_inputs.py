"""Inputs: the kinds of arrays accepted, bad input errors, and no mutation."""

from __future__ import annotations

import copy
import re

import dask.array as da
import numpy as np
import pytest
import zarr
from helpers import dense_product, random_mpo, random_mps, rel_err

import src_dask
from src_dask import TensorTrain


def _problem():
    return random_mpo(5, 3, seed=1), random_mps(5, 4, seed=2)


# -- accepted inputs -------------------------------------------------------------
def test_plain_lists_dask_and_zarr_arrays_give_the_same_result():
    a, x = _problem()
    ref = src_dask.apply(a, x, 6, seed=3).to_dense()
    as_lists = src_dask.apply(list(a), list(x), 6, seed=3).to_dense()
    as_dask = src_dask.apply([da.from_array(c, chunks=2) for c in a],
                             [da.from_array(c, chunks=3) for c in x], 6, seed=3).to_dense()
    group = zarr.group(store=zarr.storage.MemoryStore())
    zs = []
    for j, c in enumerate(x):
        z = group.create_array(f"x{j}", shape=c.shape, dtype=c.dtype, chunks=(2,) * c.ndim)
        z[...] = c
        zs.append(z)
    as_zarr = src_dask.apply(a, zs, 6, seed=3).to_dense()
    for other in (as_lists, as_dask, as_zarr):
        np.testing.assert_allclose(other, ref, rtol=0, atol=1e-13 * np.abs(ref).max())


def test_integer_inputs_promote_to_float64_and_dtype_option():
    x = TensorTrain([np.ones((2, 2), int), np.ones((2, 2, 2), int), np.ones((2, 2), int)])
    y = src_dask.compress(x, 4, seed=0)
    assert y.dtype == np.float64
    assert rel_err(y, x.to_dense().astype(float)) <= 1e-12
    y = src_dask.compress(x, 4, seed=0, dtype="complex64")
    assert y.dtype == np.complex64


def test_tensor_train_api():
    a, x = _problem()
    y = src_dask.apply(a, x, 6, seed=0)
    assert isinstance(y, TensorTrain) and y.kind == "mps" and len(y) == 5
    assert [np.asarray(c).shape for c in y] == [c.shape for c in y.to_numpy()]
    assert np.asarray(y[0]).ndim == 2 and np.asarray(y[2]).ndim == 3
    assert all(isinstance(c, np.ndarray) for c in y)
    assert "mps" in repr(y)
    q = y.to_quimb()
    np.testing.assert_allclose(q.to_dense().ravel(), y.to_dense(), atol=1e-13)
    assert TensorTrain(list(a)).kind == "mpo" and a.phys_dims == [(2, 2)] * 5


# -- bad input: clear errors before any heavy work ---------------------------------
BAD_OPTIONS = [
    (dict(chi_out=0), "chi_out"), (dict(chi_out=-3), "chi_out"), (dict(chi_out=2.0), "chi_out"),
    (dict(chi_out=True), "chi_out"), (dict(chi_out="8"), "chi_out"),
    (dict(chi_out=4, cutoff=1.0), "cutoff"), (dict(chi_out=4, cutoff=-0.1), "cutoff"),
    (dict(chi_out=4, cutoff=float("nan")), "cutoff"), (dict(chi_out=4, cutoff="0"), "cutoff"),
    (dict(chi_out=4, oversample=-1), "oversample"), (dict(chi_out=4, oversample="lots"),
                                                     "oversample"),
    (dict(chi_out=4, oversample=1.5), "oversample"),
    (dict(chi_out=4, seed=-1), "seed"), (dict(chi_out=4, seed=1.5), "seed"),
    (dict(chi_out=4, chunk=0), "chunk"),
    (dict(chi_out=4, dtype="float16"), "dtype"), (dict(chi_out=4, dtype="int64"), "dtype"),
    (dict(chi_out=4, dtype="float64"), "imaginary"),
]


@pytest.mark.parametrize("options,message", BAD_OPTIONS)
def test_bad_options(options, message):
    a, x = _problem()
    with pytest.raises((ValueError, TypeError), match=message):
        src_dask.src(a, x, **options)


def test_chi_out_is_required():
    a, x = _problem()
    with pytest.raises(TypeError, match="chi_out"):
        src_dask.src(a, x)


def test_bad_client():
    a, x = _problem()
    with pytest.raises(TypeError, match="client"):
        src_dask.src(a, x, chi_out=4, client="tcp://localhost:8786")


def test_no_trains_or_not_a_train():
    with pytest.raises(ValueError, match="at least one train"):
        src_dask.src(chi_out=4)
    with pytest.raises(TypeError, match=r"trains\[1\].*got ndarray"):
        src_dask.src(random_mpo(4, seed=0), np.ones((2, 2)), chi_out=4)
    with pytest.raises(TypeError, match=r"trains\[0\].*got int"):
        src_dask.src(3, chi_out=4)
    with pytest.raises(TypeError, match=r"trains\[0\], site 1: expected an array"):
        src_dask.src([np.ones((2, 2)), "core", np.ones((2, 2))], chi_out=4)
    with pytest.raises(ValueError, match=r"trains\[0\]: a train needs at least 2 sites"):
        src_dask.src([np.ones((2, 2))], chi_out=4)


def test_trains_of_different_lengths():
    with pytest.raises(ValueError, match=r"trains\[1\] has 4 sites but trains\[0\] has 5"):
        src_dask.src(random_mpo(5, seed=0), random_mps(4, seed=0), chi_out=4)


def test_physical_leg_mismatch_names_site_and_sizes():
    a = random_mpo(4, phys=[2, 2, 3, 2], seed=0)  # up = down = 3 at site 2
    x = random_mps(4, phys=2, seed=0)
    with pytest.raises(ValueError, match=r"site 2: trains\[0\] has a down .* 3 .* trains\[1\] "
                                         r"has an up .* 2"):
        src_dask.apply(a, x, 4)
    bra = random_mps(4, phys=[2, 2, 2, 3], seed=0)
    with pytest.raises(ValueError, match=r"site 3: trains\[0\] .* 3 .*trains\[1\] .* 2"):
        src_dask.src(bra, random_mpo(4, seed=0), chi_out=4)


def test_bond_mismatch_names_train_and_site():
    cores = list(random_mps(5, bond=3, seed=0))
    cores[2] = cores[2][:, :2]  # right bond 2, but site 3 expects 3
    with pytest.raises(ValueError, match=r"trains\[1\], site 2: right bond 2 does not match "
                                         r"the left bond 3 of site 3"):
        src_dask.src(random_mpo(5, seed=0), cores, chi_out=4)


def test_wrong_ranks():
    cores = list(random_mps(4, seed=0))
    cores[1] = cores[1][..., None]
    with pytest.raises(ValueError, match=r"trains\[0\], site 1: .* rank 3, got rank 4"):
        src_dask.src(cores, chi_out=4)
    with pytest.raises(ValueError, match=r"trains\[0\], site 0: rank 1"):
        src_dask.src([np.ones(2), np.ones(2)], chi_out=4)


def test_mps_placement():
    a, x = _problem()
    with pytest.raises(ValueError, match=r"trains\[1\] is an MPS in the middle"):
        src_dask.src(a, x, a, chi_out=4)
    with pytest.raises(ValueError, match=r"MPS may stand only at one end"):
        src_dask.src(x, a, x, chi_out=4)


def test_unsupported_input_dtype():
    cores = [c.astype(np.float16) for c in random_mps(4, dtype=float, seed=0)]
    with pytest.raises(TypeError, match=r"trains\[0\], site 0: unsupported dtype float16"):
        src_dask.src(cores, chi_out=4)
    cores = [c.astype(object) for c in random_mps(4, seed=0)]
    with pytest.raises(TypeError, match="unsupported dtype object"):
        src_dask.src(cores, chi_out=4)


@pytest.mark.parametrize("threaded", [False, True])  # large inputs: a thread per host core
@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_nan_or_inf_in_memory_names_the_site(bad, threaded, monkeypatch):
    from src_dask import _stack

    if threaded:
        monkeypatch.setattr(_stack, "_THREADED_CHECK_BYTES", 1)
    a, x = _problem()
    cores = [c.copy() for c in x]
    cores[3][0, 1, 0] = bad
    cores[4][0, 0] = bad  # the first one in order is named
    with pytest.raises(ValueError, match=r"trains\[1\], site 3: the core contains NaN or inf"):
        src_dask.apply(a, cores, 4)


@pytest.mark.parametrize("site", [2, 4])  # checked in pass 1; the last site, in pass 2
def test_nan_in_lazy_input_names_the_site(site):
    a, x = _problem()
    cores = [da.from_array(c, chunks=2) for c in x]
    bad = x[site].copy()
    bad[1, 1] = np.nan
    cores[site] = da.from_array(bad, chunks=2)
    with pytest.raises(ValueError, match=rf"trains\[1\], site {site}: the core contains NaN"):
        src_dask.apply(a, cores, 4)


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.complex64, np.complex128])
def test_finite_check_finds_every_nan_and_inf_and_no_false_one(dtype):
    """The NaN/inf test of the cores (a sum first, element by element when the sum is
    not finite): each bad value in the real or the imaginary part is found, and
    finite values whose sum overflows are not reported."""
    from src_dask._kernels import all_finite

    big = np.finfo(dtype).max
    assert all_finite(np.full(8, big, dtype))  # the sum overflows, the values are finite
    assert all_finite(np.array([big, -big], dtype))
    parts = [1, 1j] if np.dtype(dtype).kind == "c" else [1]
    for bad in (np.nan, np.inf, -np.inf):
        for part in parts:
            x = np.ones((3, 4), dtype)
            x[2, 1] = bad * part if part == 1 else complex(1, bad)
            assert not all_finite(x), (bad, part)
            y = np.ones((3, 4), dtype)
            y[0, 0], y[1, 1] = np.inf * (part if part == 1 else 1), -np.inf
            assert not all_finite(y)  # inf - inf = NaN: still caught


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
def test_overflow_never_gives_a_nan_result():
    x = random_mps(6, 3, dtype=np.float32, seed=0)
    huge = TensorTrain([c * np.float32(1e30) for c in x])
    with pytest.raises(FloatingPointError, match="NaN or inf"):
        src_dask.compress(huge, 4, seed=0)


def test_errors_come_before_any_heavy_work(monkeypatch):
    """Validation fails without building or computing a graph."""
    from src_dask import _graph

    def boom(*args, **kwargs):  # pragma: no cover - must not run
        raise AssertionError("graph built despite bad input")

    monkeypatch.setattr(_graph, "build", boom)
    a, x = _problem()
    with pytest.raises(ValueError, match="site"):
        src_dask.src(a, random_mps(5, phys=3, seed=0), chi_out=4)


# -- inputs are never modified -------------------------------------------------------
@pytest.mark.parametrize("oversample", [0, 5])
def test_inputs_are_not_modified(oversample):
    a, x = random_mpo(6, 3, seed=1), random_mps(6, 4, seed=2)
    before = [copy.deepcopy(list(t)) for t in (a, x)]
    exact = dense_product(a, x)
    y = src_dask.apply(a, x, 5, seed=0, oversample=oversample)
    src_dask.src(x, a, chi_out=5, seed=0)
    for t, old in zip((a, x), before, strict=True):
        for c, c0 in zip(t, old, strict=True):
            np.testing.assert_array_equal(c, c0)
    # the output shares no memory with the inputs
    for c in y:
        assert not any(np.shares_memory(c, ci) for t in (a, x) for ci in t)
    assert rel_err(src_dask.apply(a, x, 100, seed=0), exact) <= 1e-12


def test_quimb_inputs_are_not_modified():
    qtn = pytest.importorskip("quimb.tensor")
    a = qtn.MPO_rand(5, bond_dim=3, dtype="complex128", seed=1)
    x = qtn.MPS_rand_state(5, bond_dim=4, dtype="complex128", seed=2)
    a0, x0 = a.copy(), x.copy()
    src_dask.apply(a, x, 3, seed=0)
    for t, t0 in ((a, a0), (x, x0)):
        for j in range(5):
            assert t[j].inds == t0[j].inds
            np.testing.assert_array_equal(t[j].data, t0[j].data)


def test_error_messages_are_one_line():
    a, x = _problem()
    with pytest.raises(ValueError) as info:
        src_dask.apply(a, random_mps(5, phys=3, seed=0), 4)
    assert "\n" not in str(info.value) and re.search(r"site \d", str(info.value))


def test_all_gpu_inputs_run_on_the_synchronous_scheduler(monkeypatch):
    """CuPy in, CuPy out without a client: every task only queues kernels, so the graph
    runs on Dask's synchronous scheduler, unless the Dask config names a scheduler."""
    import dask

    from src_dask import _api

    used = []
    compute = dask.compute

    def spy(*args, **kwargs):
        used.append(kwargs.get("scheduler"))
        return compute(*args, **kwargs)

    monkeypatch.setattr(dask, "compute", spy)
    a, x = _problem()
    ref = src_dask.apply(a, x, 4, seed=0)
    monkeypatch.setattr(_api, "is_cupy", lambda c: True)  # as if every core were CuPy
    y = src_dask.apply(a, x, 4, seed=0)
    with dask.config.set(scheduler="threads"):
        src_dask.apply(a, x, 4, seed=0)
    assert used == [None, "sync", None]
    for c, c0 in zip(y, ref, strict=True):
        np.testing.assert_allclose(c, c0, rtol=0, atol=1e-12 * np.abs(c0).max())
