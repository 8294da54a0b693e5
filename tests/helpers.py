"""Helpers of the tests: random trains in quimb's layouts (drawn by
:func:`src_dask.problems.random_train`, held in memory), dense reference
products, a counter of the graphs a scheduler receives, and the peak resident
memory of cluster workers."""

from __future__ import annotations

import numpy as np
from distributed.diagnostics.plugin import SchedulerPlugin, WorkerPlugin

from src_dask import TensorTrain, problems


def _bonds(n: int, bond) -> list[int]:
    bonds = [bond] * (n - 1) if isinstance(bond, int) else list(bond)
    assert len(bonds) == n - 1
    return bonds


def random_mps(n: int, bond=3, phys=2, dtype=complex, seed=0, decay: float | None = None):
    """An MPS with the given bonds (int or list, not capped); ``phys`` int or per-site
    list. ``decay`` weights bond index i by ``decay**i`` so the state is compressible."""
    t = problems.random_train("mps", _bonds(n, bond), phys, dtype=dtype, seed=seed, decay=decay)
    return TensorTrain(t.to_numpy(), "mps")


def random_mpo(n: int, bond=2, phys=2, dtype=complex, seed=0, down=None,
               decay: float | None = None):
    """An MPO with up legs ``phys`` and down legs ``down`` (default ``phys``)."""
    t = problems.random_train("mpo", _bonds(n, bond), phys, down=down, dtype=dtype, seed=seed,
                              decay=decay)
    return TensorTrain(t.to_numpy(), "mpo")


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


class PeakRSS(WorkerPlugin):
    """The worker process's peak resident memory from ``register_plugin`` on (read it
    with :func:`peak_rss`): the kernel's own high-water mark (``VmHWM``, reset through
    ``/proc/self/clear_refs``), which no short peak escapes; where that cannot be reset,
    a sample of the RSS every 5 ms."""

    name = "peak-rss"

    def setup(self, worker):
        self.peak = 0
        try:
            with open("/proc/self/clear_refs", "w") as f:
                f.write("5")  # reset the high-water mark to the current RSS
            self.hwm = True
            return
        except OSError:
            self.hwm = False
        import threading
        import time

        import psutil

        proc = psutil.Process()

        def sample():
            while True:
                self.peak = max(self.peak, proc.memory_info().rss)
                time.sleep(0.005)

        threading.Thread(target=sample, daemon=True).start()

    def read(self) -> int:
        if not self.hwm:
            return self.peak
        with open("/proc/self/status") as f:
            kib = next(line.split()[1] for line in f if line.startswith("VmHWM:"))
        return int(kib) * 1024


def peak_rss(client) -> dict:
    """The peak resident memory of each worker since :class:`PeakRSS` was registered."""
    return client.run(lambda dask_worker: dask_worker.plugins["peak-rss"].read())


def same_cores(y, z) -> bool:
    """Whether two results have bit-identical cores: what the design promises for two
    runs on the same execution path with the same seed (docs/design.md §2)."""
    return all(np.array_equal(p, q) for p, q in zip(y.to_numpy(), z.to_numpy(), strict=True))


def close_cores(y, z, rtol: float = 1e-12) -> bool:
    """Whether two results' cores agree to ``rtol`` of each core's largest entry: what
    the design promises across execution paths (threads or a cluster, CPU or GPU, a
    step split or whole), whose summation orders differ."""
    ys, zs = y.to_numpy(), z.to_numpy()
    return len(ys) == len(zs) and all(
        p.shape == q.shape and np.abs(p - q).max() <= rtol * max(np.abs(q).max(), 1e-300)
        for p, q in zip(ys, zs, strict=True))


def cholesky_qr2(rows):
    """The rows CholeskyQR2 settles on for ``rows`` (NumPy or CuPy), waiting for the
    device's answer; None: Householder's turn."""
    from src_dask import _kernels

    return _kernels._cholesky_qr2_ahead(rows)[1]()


def count_calls(monkeypatch, owner, name: str) -> list:
    """``owner.name`` wrapped to note each call: the list of calls (one ``1`` each)."""
    calls = []
    real = getattr(owner, name)

    def counted(*args, **kwargs):
        calls.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(owner, name, counted)
    return calls
