"""Fixtures shared by the tests (helpers to import live in ``helpers.py``)."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def cluster_client():
    """A LocalCluster of 2 worker processes (one thread each) for the session."""
    from distributed import Client, LocalCluster

    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                      dashboard_address=":0") as cluster, \
            Client(cluster, set_as_default=False) as client:
        yield client



def pytest_collection_modifyitems(config, items):
    """Tests marked ``gpu`` need a CUDA device (they run on the GPU machine)."""
    from src_dask._cluster import has_gpu

    if has_gpu():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU with CuPy (run on the GPU machine)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(autouse=True)
def _fresh_product_norms():
    """Each test starts without the ⟨P|P⟩ that ``distance`` remembers of earlier ones."""
    from src_dask import _overlap

    _overlap._NORMS.clear()
    yield


@pytest.fixture
def many_tasks(monkeypatch):
    """Runs on a cluster as graphs of many tasks even when small (by default a run of
    at most ``src_dask.one-task-flops`` is one task on one worker): for the tests of
    the graph's layout on a cluster."""
    import dask

    monkeypatch.setitem(dask.config.config["src_dask"], "one-task-flops", 0)


@pytest.fixture
def dask_cuda_stand_in(monkeypatch):
    """A stand-in ``dask_cuda.utils.get_worker_config`` (installed or not) that reads a
    worker as dask-cuda 26.10's does (each plugin's public attributes under ``[plugin]
    <class name>``, the device buffer's ``n`` as ``device-memory-limit``) without the
    rest of a worker it needs: what src_dask reads of its answer, tested on the CPU (the
    GPU tests read the real one's)."""
    import pickle
    import sys
    import types

    def get_worker_config(dask_worker):
        out = {}
        for p in dask_worker.plugins.values():
            config = {v: getattr(p, v) for v in dir(p) if not v.startswith("_")}
            try:  # as dask-cuda's: only a TypeError is taken for "cannot be sent"
                pickle.dumps(config)
            except TypeError:
                config = "UNKNOWN CONFIG"
            out[f"[plugin] {type(p).__name__}"] = config
        buffer = getattr(dask_worker.data, "device_buffer", None)
        if hasattr(buffer, "n"):
            out["device-memory-limit"] = buffer.n
        return out

    package, utils = types.ModuleType("dask_cuda"), types.ModuleType("dask_cuda.utils")
    utils.get_worker_config, package.utils = get_worker_config, utils
    monkeypatch.setitem(sys.modules, "dask_cuda", package)
    monkeypatch.setitem(sys.modules, "dask_cuda.utils", utils)
