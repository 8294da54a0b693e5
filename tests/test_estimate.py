"""``src_dask.plan``: what a run needs, said before it runs — and what the run then does.

The per-worker peaks are checked against the resident memory sampled on every
worker of a real run (within 25 %), the task count against the tasks Dask runs,
the FLOPs against counts worked out by hand; problems that cannot fit are
refused before any work, by ``plan`` and ``src`` alike.
"""

from __future__ import annotations

import dataclasses
import json
import logging

import dask
import numpy as np
import pytest
from dask.callbacks import Callback
from distributed import Client, LocalCluster
from helpers import PeakRSS, peak_rss, random_mpo, random_mps

import src_dask
from src_dask import RunPlan, problems
from src_dask.errors import PlanError

pytestmark = pytest.mark.timeout(240)


def _stack(depth: int, n: int, bond: int, phys: int = 2):
    mpos = [problems.random_mpo(n, bond, phys, seed=s) for s in range(1, depth)]
    return (*mpos, problems.random_mps(n, bond, phys, seed=depth))


class _Ran(Callback):
    """Counts the tasks Dask's local scheduler runs."""

    def __init__(self):
        super().__init__()
        self.count = 0

    def _pretask(self, key, dask, state):
        self.count += 1


def test_plan_computes_nothing_and_says_what_the_run_does():
    trains = (random_mpo(7, 3, 3, seed=1), random_mps(7, [2, 5, 4, 6, 3, 2], 3, seed=2))
    with _Ran() as ran:
        p = src_dask.plan(*trains, chi_out=6, oversample=2, seed=3)
    assert ran.count == 0 and isinstance(p, RunPlan)
    assert (p.sketch, p.chi_out, p.workers, p.device) == (8, 6, 1, "cpu")
    assert p.chunk * p.blocks >= p.sketch > p.chunk * (p.blocks - 1)
    assert len(p.z_blocks) == 7 and "rounding" in p.flops
    with _Ran() as ran:
        src_dask.src(*trains, chi_out=6, oversample=2, seed=3, chunk=p.chunk,
                     client=None)
    assert ran.count == p.tasks  # every task of the graph runs once
    text = str(p)
    for word in ("MPO·MPS", "chi_out 6", "sketch 8", "peak per worker", "FLOPs", "tasks"):
        assert word in text, text
    json.dumps(dataclasses.asdict(p))  # plain data


def test_flops_follow_the_shapes():
    """Pass 1 grows with the sketch columns, complex costs 4x real, and for one MPS the
    count is the hand count: site j multiplies s x b_{j-1} by b_{j-1} x (d b_j)."""
    n, bond, d = 10, 16, 2  # ranks up to 16: neither sketch is capped
    mps = problems.random_mps(n, bond, d, seed=1)
    one = src_dask.plan(mps, chi_out=3).flops
    two = src_dask.plan(mps, chi_out=6).flops
    assert two["pass 1"] == pytest.approx(2 * one["pass 1"])
    bonds = [1, *mps.bond_dims, 1]
    hand = sum(3 * bonds[j] * d * bonds[j + 1] for j in range(n - 1))
    assert one["pass 1"] == pytest.approx(8 * hand, rel=0.1)  # + contracting Ω
    real = src_dask.plan(problems.random_mps(n, bond, d, seed=1, dtype=np.float64),
                         chi_out=3).flops
    assert one["pass 2"] == pytest.approx(4 * real["pass 2"])


@pytest.mark.parametrize("depth, n, bond, chi, limit, store", [
    pytest.param(2, 24, 48, 384, 800 * 2**20, False,  # environments dominate
                 marks=pytest.mark.slow),
    pytest.param(3, 16, 10, 300, 500 * 2**20, True,  # depth 3, a run store
                 marks=pytest.mark.slow),
    (4, 14, 6, 216, 500 * 2**20, False),  # depth 4: the contractions' temporaries
])
def test_planned_peaks_are_the_measured_ones(tmp_path, depth, n, bond, chi, limit, store):
    trains = _stack(depth, n, bond)
    with LocalCluster(n_workers=2, threads_per_worker=1, memory_limit=limit,
                      dashboard_address=None, local_directory=str(tmp_path / "w")) as cluster, \
            Client(cluster, set_as_default=False) as client:
        client.register_plugin(PeakRSS())
        options = {"chi_out": chi, "seed": 1, "client": client,
                   "store": tmp_path / "run" if store else None}
        p = src_dask.plan(*trains, **options)
        src_dask.src(*trains, **options)
        measured_peaks = peak_rss(client)
    assert p.workers == 2 and p.host_limit == limit
    measured = max(measured_peaks.values())
    assert 0.75 * measured <= p.peak_host <= 1.25 * measured, (p.peak_host, measured_peaks,
                                                              str(p))


def test_src_logs_the_plan(caplog):
    trains = (random_mpo(5, 2, seed=1), random_mps(5, 3, seed=2))
    with caplog.at_level(logging.INFO, logger="src_dask"):
        src_dask.src(*trains, chi_out=4, seed=1)
    planned = [r.getMessage() for r in caplog.records if "SRC plan:" in r.getMessage()]
    assert len(planned) == 1 and "peak per worker" in planned[0]


def test_a_column_larger_than_a_worker_is_refused_before_any_work(tmp_path):
    trains = _stack(2, 8, 32)
    with dask.config.set({"src_dask.memory-limit": "256 KiB"}), _Ran() as ran:
        with pytest.raises(PlanError, match="but a task may use"):
            src_dask.plan(*trains, chi_out=64)
        with pytest.raises(PlanError, match="but a task may use"):
            src_dask.src(*trains, chi_out=64, store=tmp_path / "run")
    assert ran.count == 0 and not (tmp_path / "run").exists()


def test_a_store_larger_than_the_free_disk_is_refused(tmp_path, monkeypatch):
    import shutil
    from collections import namedtuple

    trains = _stack(2, 8, 8)
    need = src_dask.plan(*trains, chi_out=32).store_bytes
    usage = namedtuple("usage", "total used free")
    monkeypatch.setattr(shutil, "disk_usage", lambda path: usage(need, need - 1000, 1000))
    with _Ran() as ran:
        for call in (src_dask.plan, src_dask.src):
            with pytest.raises(OSError, match=f"needs {need} bytes but only 1000 are free"):
                call(*trains, chi_out=32, store=tmp_path / "run")
    assert ran.count == 0 and not (tmp_path / "run").exists()


def test_the_command_line_prints_the_plan(tmp_path, capsys):
    from src_dask._cli import main

    src_dask.save(problems.random_mpo(6, 3, 2, seed=1), tmp_path / "A.zarr")
    src_dask.save(problems.random_mps(6, 4, 2, seed=2), tmp_path / "x.zarr")
    args = [str(tmp_path / "A.zarr"), str(tmp_path / "x.zarr"), "--chi-out", "8"]
    assert main(["plan", *args]) == 0
    text = capsys.readouterr().out
    assert "SRC plan: MPO·MPS" in text and "peak per worker" in text
    assert main(["plan", *args, "--json", "--workers", "1", "--memory-limit", "600MB"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["workers"] == 1 and out["host_limit"] == 600 * 10**6 and out["tasks"] > 0
    with dask.config.set({"src_dask.memory-limit": "1 KiB"}):
        assert main(["plan", *args]) == 1
    assert "but a task may use" in capsys.readouterr().err


@pytest.mark.timeout(60)
def test_kept_lazy_inputs_count_as_data_on_every_gpu_worker():
    """Lazy inputs the plan keeps for pass 2 are data the workers hold all run long: on
    CPU workers their share (each core is read once), on GPU workers a whole copy each
    (every GPU worker reads its own)."""
    import dask.array as da

    from src_dask import _estimate, _plan
    from src_dask import _kernels as K
    from src_dask._stack import make_stack

    mpo, mps = random_mpo(8, 4, seed=1), random_mps(8, 16, seed=2)
    lazy = [[da.from_array(c) for c in t] for t in (mpo, mps)]
    stack = make_stack(tuple(lazy))
    nbytes = sum(K.nbytes(c) for t in lazy for c in t)
    for device, workers, share in [("cpu", 2, 0.5), ("gpu", 2, 1.0), ("gpu", 1, 1.0)]:
        base = _plan.Plan(sketch=16, chunk=8, chi_out=16, cutoff=0.0, key=0, round=False,
                          device=device)
        kept = dataclasses.replace(base, keep_inputs=True)
        without = _estimate.data_held(stack, base, workers, False)
        with_inputs = _estimate.data_held(stack, kept, workers, False)
        assert [b - a for a, b in zip(without, with_inputs, strict=True)] == \
            pytest.approx([nbytes * share] * len(without))


@pytest.mark.timeout(60)
def test_split_pass_2_holds_its_share_of_each_projected_core():
    """Pass 2 split over several GPU workers: each holds its rows of ``Z`` (not all of
    it, as the first worker does when pass 2 runs there)."""
    from src_dask import _estimate, _plan
    from src_dask._stack import make_stack

    stack = make_stack((random_mpo(8, 4, seed=1), random_mps(8, 16, seed=2)))
    plan = _plan.Plan(sketch=16, chunk=8, chi_out=16, cutoff=0.0, key=0, round=False,
                      device="gpu")
    split = _estimate.data_held(stack, plan, 2, False)
    with dask.config.set({"src_dask.pass2-split": False}):
        home = _estimate.data_held(stack, plan, 2, False)
    z = [_estimate._z_bytes(stack, plan, j) for j in range(stack.n - 1, -1, -1)]
    assert split[0] == home[0]  # the end of pass 1: no Z yet
    assert [h - s for h, s in zip(home[1:], split[1:], strict=True)] == \
        pytest.approx([b / 2 for b in z])


@pytest.mark.timeout(60)
def test_a_gpu_worker_counts_its_pinned_reads_of_lazy_inputs_in_host_memory():
    """A GPU worker reads lazy inputs into pinned host memory a few sites ahead of
    their use, and CuPy's pinned pool keeps the blocks: its planned host peak has
    twice the reads in flight that in-memory inputs (or a CPU run) do not add."""
    import dask.array as da

    from src_dask import _estimate, _plan
    from src_dask._stack import make_stack

    mpo, mps = random_mpo(8, 4, seed=1), random_mps(8, 16, seed=2)
    eager = make_stack((mpo, mps))
    lazy = make_stack(tuple([da.from_array(c) for c in t] for t in (mpo, mps)))
    facts = _plan.Workers(count=1, threads=2, rss=100, host_limit=None, keep=None,
                          device_limit=None, device_memory=2**30, memory=2**30)
    peaks = {}
    for name, stack in (("eager", eager), ("lazy", lazy)):
        for device in ("cpu", "gpu"):
            plan = _plan.Plan(sketch=16, chunk=8, chi_out=16, cutoff=0.0, key=0, round=False,
                              device=device)
            sweep = _plan.SweepPlan.decide(stack, plan, None)
            peaks[name, device] = _estimate.estimate(stack, sweep, facts, store=False,
                                                     tasks=0, store_bytes=0, product="")
            ahead = _estimate.inputs_in_flight(stack, sweep.lookahead)
    assert peaks["lazy", "gpu"].peak_host == peaks["eager", "gpu"].peak_host + 2 * ahead
    assert peaks["lazy", "cpu"].peak_host == peaks["eager", "cpu"].peak_host


@pytest.mark.timeout(60)
def test_pass_2_on_the_first_worker_counts_the_blocks_fetched_to_it():
    """Where all of pass 2 runs on the first of two workers (``Pass2.FIRST``), it holds
    the other worker's blocks of ``C_i`` for the sites fetched ahead of use beside its
    own: the plan's data at each site of pass 2 has exactly those copies more, and its
    host peak follows."""
    from src_dask import _estimate, _plan
    from src_dask._stack import make_stack

    stack = make_stack((random_mpo(9, 3, seed=1), random_mps(9, 12, seed=2)))
    plan = _plan.Plan(sketch=16, chunk=8, chi_out=16, cutoff=0.0, key=0, round=False,
                      threads=1)
    sweep = _plan.SweepPlan.decide(stack, plan, ["w0", "w1"])
    assert sweep.pass2 is _plan.Pass2.FIRST and len(plan.blocks) == 2
    ahead = sweep.lookahead
    mine = _estimate.data_held(stack, plan, 2, False)
    held = _estimate.data_held(stack, plan, 2, False, fetched=ahead)
    assert held[0] == mine[0]  # pass 1: nothing fetched yet
    c = [0.0] + [16 * np.prod(stack.left_bonds(i)) * 16 for i in range(1, 9)]  # whole C_i
    for k, j in enumerate(range(8, -1, -1), start=1):  # pass 2, right to left
        other = sum(c[i] for i in range(max(1, j - ahead), j + 1)) / 2  # the other's half
        assert held[k] == pytest.approx(mine[k] + other), j
    facts = _plan.Workers(count=2, threads=1, rss=0, host_limit=None, keep=None,
                          device_limit=None, device_memory=None, memory=None)
    peak = _estimate.estimate(stack, sweep, facts, store=False, tasks=0, store_bytes=0,
                              product="").peak_host
    spread = dataclasses.replace(sweep, pass2=_plan.Pass2.SPREAD)
    assert peak > _estimate.estimate(stack, spread, facts, store=False, tasks=0,
                                     store_bytes=0, product="").peak_host

@pytest.mark.parametrize("start, most, arrays, expected", [
    (16, 24, 5, 16),        # far below where the pool starts: the pool's first size
    (16, 24, 15.08, 20),    # within the headroom of it: grown by half of what it may grow
    (16, 24, 20.5, 20.5),   # past that: as far as the arrays need
    (8, 12, 9.74, 10),
    (32, 48, 42.6, 42.6),
    (None, 24, 15.08, 15.08),  # RMM's asynchronous allocator (no pool): the arrays
])
def test_an_rmm_pool_that_grows_is_counted_as_rmm_grows_it(start, most, arrays, expected):
    """A GPU worker whose arrays live in an RMM pool that starts at ``start`` GB and may
    grow to ``most``: the device memory it takes is the pool's size, which RMM grows by
    half of what it may still grow (or as far as an allocation needs) once the arrays
    come within the headroom of it; the memory ladder's capped rungs (benchmarks/
    README.md) measured 0.94-1.12x of these sizes (24 GB at D_M=2000: 20 GB planned,
    21.25 measured, where the arrays' own peak was planned at 15.08)."""
    from src_dask import _estimate, _plan

    G = 10**9
    workers = _plan.Workers(count=1, threads=4, rss=0, host_limit=None, keep=None,
                            device_memory=most * G,
                            device_pool=None if start is None else start * G)
    assert _estimate.pool_size(int(arrays * G), workers) == pytest.approx(expected * G, rel=1e-6)
    assert _estimate.pool_size(int(arrays * G), workers) <= _estimate.usable_device(workers)


def test_a_dask_cuda_worker_tells_where_its_rmm_pool_starts(monkeypatch, dask_cuda_stand_in):
    """dask-cuda's RMMSetup plugin keeps the pool's initial size (bytes, after its
    setup); RMM's asynchronous allocator is no pool that grows."""
    from types import SimpleNamespace

    from src_dask import _cluster

    class RMMSetup:  # the name dask_cuda.plugins gives it
        def __init__(self, start, async_alloc):
            self.initial_pool_size, self.async_alloc = start, async_alloc
            self.maximum_pool_size = 24 * 10**9

    monkeypatch.setattr(_cluster, "_memory", lambda device, dask_worker=None: 140 * 10**9)

    def facts(plugin):
        worker = SimpleNamespace(plugins={"rmm": plugin}, data={}, memory_manager=None)
        return _cluster._facts("gpu", dask_worker=worker)

    assert facts(RMMSetup(16 * 10**9, False))["device_pool"] == 16 * 10**9
    assert facts(RMMSetup(16 * 10**9, True))["device_pool"] is None
    assert facts(RMMSetup(None, False))["device_pool"] is None
