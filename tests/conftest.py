"""Shared helpers: random trains in quimb's layouts and dense reference products."""

from __future__ import annotations

import numpy as np
import pytest
from distributed.diagnostics.plugin import SchedulerPlugin

from src_dask import TensorTrain


def _draw(rng: np.random.Generator, shape: tuple[int, ...], dtype) -> np.ndarray:
    dtype = np.dtype(dtype)
    x = rng.standard_normal(shape)
    if dtype.kind == "c":
        x = x + 1j * rng.standard_normal(shape)
    return x.astype(dtype)


def _bonds(n: int, bond) -> list[int]:
    if isinstance(bond, int):
        bond = [bond] * (n - 1)
    assert len(bond) == n - 1
    return [1, *bond, 1]


def random_mps(n: int, bond=3, phys=2, dtype=complex, seed=0, decay: float | None = None):
    """An MPS with the given bonds (int or list); ``phys`` int or per-site list.

    ``decay`` weights bond index i by ``decay**i`` so the state is compressible.
    """
    rng = np.random.default_rng(seed)
    bonds = _bonds(n, bond)
    phys = [phys] * n if isinstance(phys, int) else phys
    cores = []
    for j in range(n):
        c = _draw(rng, (bonds[j], bonds[j + 1], phys[j]), dtype)
        if decay is not None:
            c = c * (decay ** np.arange(bonds[j + 1]))[None, :, None].astype(c.dtype)
        cores.append(_strip(c, j, n))
    return TensorTrain(cores, "mps")


def random_mpo(n: int, bond=2, phys=2, dtype=complex, seed=0, down=None,
               decay: float | None = None):
    """An MPO with up legs ``phys`` and down legs ``down`` (default ``phys``)."""
    rng = np.random.default_rng(seed)
    bonds = _bonds(n, bond)
    up = [phys] * n if isinstance(phys, int) else phys
    down = up if down is None else ([down] * n if isinstance(down, int) else down)
    cores = []
    for j in range(n):
        c = _draw(rng, (bonds[j], bonds[j + 1], up[j], down[j]), dtype)
        if decay is not None:
            c = c * (decay ** np.arange(bonds[j + 1]))[None, :, None, None].astype(c.dtype)
        cores.append(_strip(c, j, n))
    return TensorTrain(cores, "mpo")


def _strip(c: np.ndarray, j: int, n: int) -> np.ndarray:
    if j == n - 1:
        c = c[:, 0]
    if j == 0:
        c = c[0]
    return c


def dense_product(*trains) -> np.ndarray:
    """The exact product of the trains (TensorTrains or quimb MPS/MPO) as a dense
    vector or matrix."""
    mats = [np.asarray(t.to_dense()) for t in trains]
    first_is_mps = getattr(trains[0], "kind", type(trains[0]).__name__) in (
        "mps", "MatrixProductState")
    if first_is_mps and len(trains) > 1:  # a bra: row vector first
        out = mats[0].ravel()
        for m in mats[1:]:
            out = out @ m
        return out
    out = mats[-1]
    for m in reversed(mats[:-1]):
        out = m @ out
    return out


def rel_err(y, exact) -> float:
    y = y.to_dense() if isinstance(y, TensorTrain) else y
    return float(np.linalg.norm(y - exact) / np.linalg.norm(exact))


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


class CountGraphs(SchedulerPlugin):
    """A scheduler plugin counting the graphs the scheduler receives."""

    def __init__(self):
        self.graphs = 0

    def update_graph(self, scheduler, *, keys, **kwargs):
        self.graphs += 1


def graphs_received(client, name: str):
    """Start counting the graphs ``client``'s scheduler receives; returns the count's reader."""
    client.register_plugin(CountGraphs(), name=name)
    return lambda: client.run_on_scheduler(
        lambda dask_scheduler: dask_scheduler.plugins[name].graphs)
