"""Bounded memory: environments 4x larger than the workers' memory still run.

The problem is an MPS of true rank 2 whose bonds alternate between 2 and
B = 4096 (a rank-2 state written with inflated bonds), compressed with a
cutoff: the sketched environments are large (s × B at every other site) while
every contraction stays cheap, so the test measures memory, not FLOPs.
"""

from __future__ import annotations

import numpy as np
import pytest
from distributed import Client, LocalCluster
from helpers import PeakRSS, peak_rss

import src_dask
from src_dask import TensorTrain

N, B, CHI, CHUNK = 56, 4096, 2048, 256
LIMIT = 400 * 2**20  # per worker; 2 workers


def _inflated_rank2_mps(seed: int = 0) -> TensorTrain:
    rng = np.random.default_rng(seed)
    bonds = [1] + [B if j % 2 else 2 for j in range(N - 1)] + [1]
    embed, cores = [], []
    for b in bonds:  # E (b x 2) and its pseudo-inverse F: F E = 1 on every cut
        e = rng.standard_normal((b, 2)) if b > 2 else np.eye(b, 2)
        embed.append((e, np.linalg.pinv(e)))
    for j in range(N):
        g = rng.standard_normal((min(bonds[j], 2), min(bonds[j + 1], 2), 2))
        core = np.einsum("la,abp,br->lrp", embed[j][0], g, embed[j + 1][1])
        cores.append(core[0] if j == 0 else core[:, 0] if j == N - 1 else core)
    cores[-1] = cores[-1].reshape(bonds[N - 1], 2)
    return TensorTrain([c.astype(np.complex128) for c in cores], "mps")


def env_bytes() -> int:
    return sum(CHI * (B if j % 2 else 2) for j in range(N - 1)) * 16


@pytest.fixture(scope="module")
def problem():
    x = _inflated_rank2_mps()
    assert env_bytes() >= 4 * 2 * LIMIT
    ref = src_dask.compress(x, CHI, cutoff=1e-10, seed=1, chunk=CHUNK)  # unconstrained
    assert max(ref.bond_dims) == 2
    return x, ref


def _limited_cluster(tmp_path):
    return LocalCluster(n_workers=2, threads_per_worker=1, memory_limit=LIMIT,
                        dashboard_address=":0", local_directory=str(tmp_path / "workers"))


def _assert_same(y, ref):
    for c, c0 in zip(y, ref, strict=True):
        c, c0 = np.asarray(c), np.asarray(c0)
        assert np.abs(c - c0).max() <= 1e-12 * np.abs(c0).max()


@pytest.mark.slow  # ~50 s on 2 cores: `make test-slow`
def test_store_bounds_memory(problem, tmp_path):
    x, ref = problem
    with _limited_cluster(tmp_path) as cluster, Client(cluster) as client:
        client.register_plugin(PeakRSS())
        workers = set(client.scheduler_info()["workers"])
        y = src_dask.compress(x, CHI, cutoff=1e-10, seed=1, chunk=CHUNK, client=client,
                              store=tmp_path / "run")
        _assert_same(y, ref)
        peaks = peak_rss(client)
        assert set(peaks) == workers  # no worker was lost or restarted
        assert all(p < LIMIT for p in peaks.values()), peaks


@pytest.mark.slow  # ~30 s on 2 cores: `make test-slow`
def test_spilling_bounds_memory_without_a_store(problem, tmp_path):
    x, ref = problem
    with _limited_cluster(tmp_path) as cluster, Client(cluster) as client:
        client.register_plugin(PeakRSS())
        workers = set(client.scheduler_info()["workers"])
        y = src_dask.compress(x, CHI, cutoff=1e-10, seed=1, chunk=CHUNK, client=client)
        _assert_same(y, ref)
        peaks = peak_rss(client)
        written = client.run(_disk_writes)
        assert set(peaks) == workers
        assert all(p < LIMIT for p in peaks.values()), peaks
        assert sum(written.values()) > env_bytes() / 2, written  # the envs went to disk


def _disk_writes(dask_worker) -> int:
    """Bytes the worker wrote to disk: Dask's spilling, and the tasks' own writes of
    environments it does not keep (in Dask's fine performance metrics)."""
    own = sum(v for k, v in dask_worker.digests_total.items()
              if k[0] == "execute" and k[-2:] == ("disk-write", "bytes"))
    return dask_worker.data.cumulative_metrics[("disk-write", "bytes")] + own


# -- the plan sizes tasks from the workers' limits (not from fixed sizes) ------------------
DEEP_LIMIT = 400 * 2**20  # one worker


def _deep_stack(depth: int, n: int, bond: int):
    """``depth`` trains of bond ``bond`` (MPOs, then an MPS), physical dimension 2."""
    from src_dask import problems

    mpos = [problems.random_mpo(n, bond, 2, seed=s) for s in range(1, depth)]
    return (*mpos, problems.random_mps(n, bond, 2, seed=depth))


@pytest.mark.slow  # ~1-2 min each on 2 cores: `make test-slow`
@pytest.mark.timeout(900)
@pytest.mark.parametrize("depth, bond, n, chi, store", [(3, 16, 53, 500, False),
                                                       (4, 8, 54, 500, True)])
def test_planned_tasks_fit_a_small_worker(tmp_path, depth, bond, n, chi, store):
    """Environments at least 4x a worker's memory: chunks, projected-core blocks and
    fused steps follow from the worker's limit, so the run completes with the worker's
    peak RSS under it (no restart), with and without a run store."""
    trains = _deep_stack(depth, n, bond)
    envs = chi * bond**depth * 16 * (n - 1)
    assert envs >= 4 * DEEP_LIMIT
    ref = src_dask.src(*trains, chi_out=chi, seed=2)  # unconstrained, this process
    with LocalCluster(n_workers=1, threads_per_worker=1, memory_limit=DEEP_LIMIT,
                      dashboard_address=":0",
                      local_directory=str(tmp_path / "workers")) as cluster, \
            Client(cluster) as client:
        client.register_plugin(PeakRSS())
        workers = set(client.scheduler_info()["workers"])
        y = src_dask.src(*trains, chi_out=chi, seed=2, client=client,
                         store=tmp_path / "run" if store else None)
        peaks = peak_rss(client)
    assert set(peaks) == workers  # no worker was lost or restarted
    assert all(p < DEEP_LIMIT for p in peaks.values()), peaks
    _assert_same(y, ref)


@pytest.mark.slow  # ~1-3 min each on 2 cores: `make test-slow`
@pytest.mark.timeout(1200)
@pytest.mark.parametrize("n, limit, store, times", [(84, 350 * 2**20, False, 8),
                                                     (44, DEEP_LIMIT, True, 4)])
def test_an_environment_larger_than_a_task_is_summed_in_row_blocks(tmp_path, n, limit, store,
                                                                   times):
    """Depth 3, bonds 16, chi_out 600 on two workers of 350-400 MiB: pass 2 sums an
    environment of 600 x 16^3 numbers (39 MB, twice with its parts), more than a task
    may use between what Dask spills down to and the pause threshold; the environments
    (1.7-3.3 GB) are 4-9x a worker's memory. The plan sums each environment in the
    row blocks of the next projected core, so no task holds one whole: the run
    completes with every worker's peak RSS under its limit and the cores of an
    in-memory run (it was refused with a PlanError before)."""
    assert 600 * 16**3 * 16 * (n - 1) >= times * limit
    trains = _deep_stack(3, n, 16)
    ref = src_dask.src(*trains, chi_out=600, seed=2)  # unconstrained, this process
    with LocalCluster(n_workers=2, threads_per_worker=1, memory_limit=limit,
                      dashboard_address=":0",
                      local_directory=str(tmp_path / "workers")) as cluster, \
            Client(cluster) as client:
        client.register_plugin(PeakRSS())
        workers = set(client.scheduler_info()["workers"])
        plan = src_dask.plan(*trains, chi_out=600, seed=2, client=client)
        assert plan.peak_host <= limit, plan
        y = src_dask.src(*trains, chi_out=600, seed=2, client=client,
                         store=tmp_path / "run" if store else None)
        peaks = peak_rss(client)
    assert set(peaks) == workers  # no worker was lost or restarted
    assert all(p < limit for p in peaks.values()), peaks
    _assert_same(y, ref)
