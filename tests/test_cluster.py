"""Cluster helpers and the choice of device, on a machine without a GPU."""

from __future__ import annotations

import dask
import pytest
from distributed import Client, LocalCluster
from helpers import dense_product, random_mpo, random_mps, rel_err

import src_dask
from src_dask import _cluster as C


def test_cluster_without_gpu_is_a_cpu_local_cluster(tmp_path, monkeypatch):
    monkeypatch.setattr(C, "has_gpu", lambda: False)
    with src_dask.cluster(n_workers=2, memory_limit="1GiB",
                          local_directory=str(tmp_path), dashboard_address=":0") as cluster:
        assert isinstance(cluster, LocalCluster)
        with Client(cluster) as client:
            info = client.scheduler_info()["workers"]
            assert len(info) == 2
            assert all(w["memory_limit"] == 2**30 for w in info.values())
            a, x = random_mpo(6, 3, seed=1), random_mps(6, 4, seed=2)
            y = src_dask.apply(a, x, 100, seed=0, client=client)
            assert rel_err(y, dense_product(a, x)) <= 1e-12


def test_device_choice(monkeypatch):
    x = random_mps(4, 2, seed=0)
    monkeypatch.setattr(C, "has_gpu", lambda: False)
    assert C.choose_device(None, list(x)) == "cpu"
    with dask.config.set({"src_dask.device": "gpu"}):
        with pytest.raises(RuntimeError, match="'gpu' but local has no usable GPU"):
            src_dask.compress(x, 2)
    with dask.config.set({"src_dask.device": "tpu"}):
        with pytest.raises(ValueError, match="expected auto, cpu or gpu"):
            src_dask.compress(x, 2)
    monkeypatch.setattr(C, "has_gpu", lambda: True)
    assert C.choose_device(None, list(x)) == "gpu"
    with dask.config.set({"src_dask.device": "cpu"}):
        assert C.choose_device(None, list(x)) == "cpu"


def test_import_needs_no_gpu_packages():
    import subprocess
    import sys

    code = ("import sys, src_dask; "
            "assert not {'cupy', 'dask_cuda', 'rmm'} & set(sys.modules), sys.modules.keys()")
    subprocess.run([sys.executable, "-c", code], check=True)
