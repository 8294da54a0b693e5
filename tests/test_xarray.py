"""Files for the PyData ecosystem: every array src_dask writes names its axes
(Zarr's ``dimension_names``), so ``xarray.open_zarr`` opens a saved train, and a
run store's result, as one Dataset whose shared bonds agree; metadata is consolidated."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest
import zarr
from helpers import random_mpo, random_mps

import src_dask

pytestmark = pytest.mark.timeout(120)
xr = pytest.importorskip("xarray")


def _open(path, **kw):
    return xr.open_zarr(path, consolidated=True, **kw)  # consolidated: an error if it is not


@pytest.mark.parametrize("train", [random_mps(5, [2, 3, 4, 3], 3, seed=1),
                                   random_mpo(4, [2, 3, 2], 3, seed=2, down=2)],
                         ids=["mps", "mpo"])
def test_a_saved_train_is_one_dataset(tmp_path, train):
    src_dask.save(train, tmp_path / "t.zarr")
    ds = _open(tmp_path / "t.zarr")
    n = len(train)
    assert sorted(ds.data_vars) == [f"site_{j}" for j in range(n)]
    for j, bond in enumerate(train.bond_dims):
        assert ds.sizes[f"bond_{j}"] == bond
        assert f"bond_{j}" in ds[f"site_{j}"].dims and f"bond_{j}" in ds[f"site_{j + 1}"].dims
    legs = ("phys",) if train.kind == "mps" else ("up", "down")
    for j in range(n):
        assert ds[f"site_{j}"].dims[-len(legs):] == tuple(f"{leg}_{j}" for leg in legs)
        np.testing.assert_array_equal(ds[f"site_{j}"].values, np.asarray(train[j]))
    assert ds.attrs["kind"] == train.kind and ds.attrs["complete"] is True


def test_a_run_stores_result_is_one_dataset(tmp_path):
    a, x = random_mpo(6, 2, 3, seed=1), random_mps(6, 3, 3, seed=2)
    y = src_dask.apply(a, x, chi_out=5, seed=0, store=tmp_path / "run")
    ds = _open(tmp_path / "run", group="result")
    for j, bond in enumerate(y.bond_dims):
        assert ds.sizes[f"bond_{j}"] == bond
    np.testing.assert_array_equal(ds["site_3"].values, np.asarray(y[3]))
    assert src_dask.apply(a, x, chi_out=5, seed=0, store=tmp_path / "run").bond_dims == \
        y.bond_dims  # the finished store still reads as such


def _arrays(root):
    for dirpath, _, files in os.walk(root):
        if "zarr.json" in files:
            meta = json.load(open(os.path.join(dirpath, "zarr.json")))
            if meta["node_type"] == "array":
                yield os.path.relpath(dirpath, root), meta


def test_every_array_written_names_its_axes(tmp_path):
    a, x = random_mpo(5, 2, seed=1), random_mps(5, 3, seed=2)
    src_dask.save(x, tmp_path / "x.zarr")
    src_dask.apply(a, x, chi_out=4, seed=0, store=tmp_path / "run")
    found = list(_arrays(tmp_path))
    assert {p.split(os.sep)[1] for p, _ in found if p.startswith("run")} >= \
        {"env", "result", "progress", "eta", "S"}
    for path, meta in found:
        names = meta.get("dimension_names")
        assert names and len(names) == len(meta["shape"]) and all(names), path
        assert len(set(names)) == len(names), path
    env = zarr.open_array(tmp_path / "run" / "env" / "site_2")
    assert env.metadata.dimension_names == ("sketch", "bond_1_factor_0", "bond_1_factor_1")
