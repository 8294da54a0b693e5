"""Lazy array-likes as inputs: h5py datasets, numpy.memmap, and minimal objects with
shape, dtype, ndim and __getitem__ or __array__, read site by site like Zarr arrays."""

from __future__ import annotations

import pickle

import numpy as np
import pytest
from helpers import random_mpo, random_mps

import src_dask
from src_dask import _arraylike
from src_dask import _kernels as K

h5py = pytest.importorskip("h5py")


class Reads:
    """A core behind ``__getitem__`` only (no ``nbytes``, no ``__array__``), counting reads."""

    def __init__(self, a: np.ndarray, log: list) -> None:
        self._a, self._log = a, log
        self.shape, self.dtype, self.ndim = a.shape, a.dtype, a.ndim

    def __getitem__(self, selection):
        self._log.append(1)
        return self._a[selection]


class OnlyArray:
    """A core behind ``__array__`` only."""

    def __init__(self, a: np.ndarray) -> None:
        self._a = a
        self.shape, self.dtype, self.ndim = a.shape, a.dtype, a.ndim

    def __array__(self, dtype=None, copy=None):
        return self._a if dtype is None else self._a.astype(dtype)


def _trains():
    return (random_mpo(6, 3, phys=3, seed=1), random_mps(6, [4, 5, 3, 6, 2], phys=3, seed=2))


def _close(y, ref) -> None:
    for c, c0 in zip(y, ref, strict=True):
        assert np.abs(np.asarray(c) - c0).max() <= 1e-12 * np.abs(c0).max()


def _h5(trains, path):
    with h5py.File(path, "w") as f:
        for i, t in enumerate(trains):
            for j, c in enumerate(t):
                f[f"t{i}/{j}"] = c
    f = h5py.File(path, "r")
    return f, [src_dask.TensorTrain([f[f"t{i}/{j}"] for j in range(len(t))], t.kind)
               for i, t in enumerate(trains)]


def test_h5py_datasets_are_read_site_by_site(tmp_path, cluster_client):
    trains = _trains()
    ref = src_dask.src(*trains, chi_out=10, seed=3)
    f, lazy = _h5(trains, tmp_path / "in.h5")
    with f:
        _close(src_dask.src(*lazy, chi_out=10, seed=3), ref)  # threads
        _close(src_dask.src(*lazy, chi_out=10, seed=3, client=cluster_client), ref)
        _close(src_dask.src(*lazy, chi_out=10, seed=3, store=tmp_path / "run"), ref)
        # the same file is the same input: the finished store is returned as it is
        _close(src_dask.src(*lazy, chi_out=10, seed=3, store=tmp_path / "run"), ref)
        token = _arraylike.token(f["t0/0"])
    with h5py.File(tmp_path / "in.h5", "r") as again:
        assert _arraylike.token(again["t0/0"]) == token  # stable across opens
        assert _arraylike.token(again["t0/1"]) != token


def test_memmaps_stay_in_their_files(tmp_path, cluster_client):
    trains = _trains()
    ref = src_dask.src(*trains, chi_out=10, seed=3)
    lazy = []
    for i, t in enumerate(trains):
        cores = []
        for j, c in enumerate(t):
            m = np.memmap(tmp_path / f"{i}_{j}.dat", dtype=c.dtype, mode="w+", shape=c.shape)
            m[...] = c
            m.flush()
            cores.append(np.memmap(tmp_path / f"{i}_{j}.dat", dtype=c.dtype, mode="r",
                                   shape=c.shape))
        lazy.append(src_dask.TensorTrain(cores, t.kind))
    assert not K.is_in_memory(lazy[1][2])
    # what travels to a worker is the file's name, not its data
    assert len(pickle.dumps(_arraylike.MemmapSource(lazy[1][2]))) < 1000
    _close(src_dask.src(*lazy, chi_out=10, seed=3), ref)
    _close(src_dask.src(*lazy, chi_out=10, seed=3, client=cluster_client), ref)


@pytest.mark.parametrize("keep", [True, False])
def test_a_minimal_array_like_is_read_once_a_pass(keep):
    """``__getitem__`` alone: each core read once per pass (once in all when kept
    for pass 2); ``__array__`` alone works as well."""
    import dask

    trains = _trains()
    ref = src_dask.src(*trains, chi_out=10, seed=3)
    log: list = []
    lazy = [src_dask.TensorTrain([Reads(c, log) for c in t], t.kind) for t in trains]
    with dask.config.set({"src_dask.keep-inputs": keep}):
        _close(src_dask.src(*lazy, chi_out=10, seed=3), ref)
    sites = 6
    # pass 1 reads sites 0..n-2, pass 2 all n (kept: every site once)
    assert len(log) == 2 * (sites if keep else 2 * sites - 1)
    only = [src_dask.TensorTrain([OnlyArray(c) for c in t], t.kind) for t in trains]
    _close(src_dask.src(*only, chi_out=10, seed=3), ref)
    assert np.array_equal(only[0].to_numpy()[2], trains[0][2])


def test_something_that_cannot_be_read_is_refused_naming_the_site():
    class Shapeless:
        shape, dtype, ndim = (3, 2), np.dtype(complex), 2

    a = random_mps(4, 2, seed=0)
    cores = list(a)
    cores[0] = Shapeless()
    with pytest.raises(TypeError, match=r"site 0: expected an array .*__getitem__ or "
                                        r"__array__.*Shapeless"):
        src_dask.TensorTrain(cores)
