"""The plan: every sizing, placement and fusion decision, as pure functions."""

from __future__ import annotations

import dataclasses

import dask
import numpy as np
import pytest

from src_dask import _plan, problems
from src_dask._stack import make_stack
from src_dask.errors import PlanError

pytestmark = pytest.mark.timeout(60)


def _stack(n=6, mpo_bond=3, mps_bond=5, phys=2):
    return make_stack((problems.random_mpo(n, mpo_bond, phys, seed=1),
                       problems.random_mps(n, mps_bond, phys, seed=2)))


def _plan_of(**kw):
    return _plan.Plan(**{"sketch": 8, "chunk": 4, "chi_out": 8, "cutoff": 0.0, "key": 0,
                         "round": False, **kw})


@pytest.mark.parametrize("device, workers, groups, split, want", [
    # (home, together, spread, pieces_at_env, split)
    ("cpu", 0, 1, "auto", (False, False, False, True, False)),  # Dask's local scheduler
    ("cpu", 1, 1, "auto", (False, True, False, True, False)),  # one cluster worker
    ("cpu", 3, 1, "auto", (False, False, True, True, False)),  # CPU workers: a chain of S
    ("cpu", 3, 1, True, (False, False, False, False, True)),  # CPU workers split by rows
    ("cpu", 1, 1, True, (False, True, False, True, False)),  # nothing to split over
    ("gpu", 1, 1, "auto", (False, True, False, False, False)),  # one GPU
    ("gpu", 2, 2, "auto", (False, False, False, False, True)),  # several GPUs: split
    ("gpu", 2, 2, False, (True, True, False, False, False)),  # or all on the first
])
def test_pass2_strategy(device, workers, groups, split, want):
    p = _plan.Pass2.decide(device, workers, groups, split)
    assert (p.home, p.together, p.spread, p.pieces_at_env, p.split) == want


@pytest.mark.parametrize("mode, z_here, z_left, want", [
    # (fused, chain, whole)
    ("ONE_WORKER", 1, 1, (True, False, True)),  # one task per site, Z handed on
    ("ONE_WORKER", 1, 3, (True, False, False)),  # next Z too large: made in row blocks
    ("ONE_WORKER", 4, 1, (False, False, True)),  # this Z in blocks: pieces as tasks
    ("SPREAD", 4, 1, (False, True, False)),  # blocks over CPU workers: a chain of updates
    ("SPREAD", 1, 1, (False, False, True)),
    ("LOCAL", 1, 1, (False, False, True)),  # local threads: pieces as tasks
])
def test_site_step(mode, z_here, z_left, want):
    p = _plan.Pass2[mode]
    s = p.step(z_here, z_left)
    assert (s.fused, s.chain, s.whole) == want


@pytest.mark.parametrize("device, threads, z_block_bytes, cutoff, want", [
    ("cpu", 1, None, 0.0, "FIRST"),  # one task at a time per worker, Z whole: on the first
    ("cpu", 2, None, 0.0, "SPREAD"),  # threads to run a site's sketch pieces side by side
    ("cpu", 1, 16 * 40, 0.0, "SPREAD"),  # Z in row blocks: shared by the workers
    # a cutoff: the bonds that size a site's step are not known before the run, and a
    # step that does not fit one worker must stay shared
    ("cpu", 1, None, 1e-10, "SPREAD"),
    ("gpu", 1, None, 0.0, "SPLIT"),  # GPU modes as they were
])
def test_pass_2_runs_on_the_first_of_several_single_threaded_cpu_workers(
        device, threads, z_block_bytes, cutoff, want):
    stack = _stack(n=7)
    extra = {"cutoff": cutoff} | ({} if z_block_bytes is None else {"z_block_bytes": z_block_bytes})
    sweep = _plan.SweepPlan.decide(stack, _plan_of(device=device, threads=threads, **extra),
                                   ["w0", "w1"])
    assert sweep.pass2 is _plan.Pass2[want]
    if want == "FIRST":  # every site one task, pinned to the first worker
        assert sweep.pass2.home and sweep.pass2.together and not sweep.pass2.split
        assert all(step.fused and not step.chain for step in sweep.steps[1:])
    with dask.config.set({"src_dask.pass2-split": False}):  # several GPUs: HOME, as before
        gpu = _plan.SweepPlan.decide(stack, _plan_of(device="gpu"), ["w0", "w1"])
    assert gpu.pass2 is _plan.Pass2.HOME


def test_one_task_beats_a_graph_whose_pass_2_runs_on_one_worker_when_pass_1_is_small():
    first, spread = _plan.Pass2.FIRST, _plan.Pass2.SPREAD
    # L=50, χ=200 (pass 1 25 GFLOP) on 2 workers: 0.31 s saved < 100 round trips (0.7 s)
    assert _plan.one_task_beats_graph(25e9, 50, 2, first, 1, "cpu")
    assert not _plan.one_task_beats_graph(84e9, 50, 2, first, 1, "cpu")  # χ=300: 1.05 s
    assert _plan.one_task_beats_graph(1e15, 50, 1, _plan.Pass2.ONE_WORKER, 1, "cpu")
    assert not _plan.one_task_beats_graph(25e9, 50, 2, spread, 1, "cpu")  # pass 2 shared
    assert not _plan.one_task_beats_graph(25e9, 50, 1, _plan.Pass2.ONE_WORKER, 2, "cpu")
    # one GPU worker: its task's threads queue what the graph's would (any size that
    # fits); several: the graph spreads the work
    assert _plan.one_task_beats_graph(1e15, 50, 1, _plan.Pass2.ONE_GPU, 4, "gpu")
    assert not _plan.one_task_beats_graph(25e9, 50, 2, _plan.Pass2.HOME, 4, "gpu")


@pytest.mark.parametrize("blocks, workers", [(1, 2), (2, 2), (5, 2), (7, 3), (4, 4)])
def test_row_owners_are_contiguous_and_use_every_worker_they_can(blocks, workers):
    owners = [_plan.row_owner(b, blocks, workers) for b in range(blocks)]
    assert owners == sorted(owners) and owners[0] == 0
    assert len(set(owners)) == min(blocks, workers)


def test_sketch_is_clamped_to_the_reachable_rank():
    stack = _stack(n=6, mpo_bond=3, mps_bond=5)
    # bonds 15, capped by 2**k on the smaller side of each cut: at most 8 (middle cut)
    assert _plan.reachable_rank(stack) == 8
    assert _plan.sketch_width(stack, 4, 2) == 6
    assert _plan.sketch_width(stack, 10**9, 10**9) == 8


def test_reachable_rank_of_uneven_legs_on_the_right():
    # physical dim 3 and 4 sites: the right side caps the last cut at 3·3 = 9 < 27
    stack = make_stack((problems.random_mps(4, 100, 3, seed=0),))
    assert _plan.reachable_rank(stack) == 9


def test_default_chunk_fills_the_slots_within_the_block_size():
    stack = _stack()
    assert _plan.default_chunk(stack, 100, 1) == 100
    assert _plan.default_chunk(stack, 100, 4) == 25
    per_column = 16 * max(3 * 5, 1)  # the largest environment row: bonds 3·5, complex128
    with dask.config.set({"src_dask.block-size": per_column * 10}):
        assert _plan.default_chunk(stack, 100, 1) == 10


@pytest.mark.parametrize("setting, lazy, memory, want", [
    ("auto", 10, 40, True), ("auto", 11, 40, False), ("auto", 10, None, False),
    ("auto", 0, None, True), (True, 10, 1, True), (False, 1, 100, False),
])
def test_keep_inputs(setting, lazy, memory, want):
    with dask.config.set({"src_dask.keep-inputs": setting}):
        assert _plan.keep_inputs(lazy, memory) is want


def test_keep_inputs_setting_is_checked():
    with dask.config.set({"src_dask.keep-inputs": "often"}), \
            pytest.raises(ValueError, match="src_dask.keep-inputs: expected auto, True or False"):
        _plan.keep_inputs(1, 1)


def test_ucx_waits_for_the_default_stream_only_on_several_gpu_workers_over_ucx():
    ucx = ["ucx://127.0.0.1:1", "ucx://127.0.0.1:2"]
    assert _plan.stream_sync("gpu", ucx)
    assert not _plan.stream_sync("cpu", ucx)  # no GPU data
    assert not _plan.stream_sync("gpu", ucx[:1])  # one worker: nothing is sent
    assert not _plan.stream_sync("gpu", ["tcp://127.0.0.1:1", "tcp://127.0.0.1:2"])
    assert not _plan.stream_sync("gpu", [ucx[0], "tcp://127.0.0.1:2"])
    assert not _plan.stream_sync("gpu", None)
    with dask.config.set({"src_dask.ucx-sync": "device"}):
        assert not _plan.stream_sync("gpu", ucx)
    with dask.config.set({"src_dask.ucx-sync": "never"}), \
            pytest.raises(ValueError, match="src_dask.ucx-sync: expected stream or device"):
        _plan.stream_sync("gpu", ucx)


def test_config_defaults_are_visible_to_dask():
    settings = dask.config.get("src_dask")
    assert settings["device"] == "auto" and settings["keep-inputs"] == "auto"
    assert _plan.Plan(sketch=1, chunk=1, chi_out=1, cutoff=0, key=0, round=False
                      ).z_block_bytes == 2 * 2**30


def test_sweep_plan_decides_once_per_stack_and_workers():
    stack = _stack(n=7)
    with dask.config.set({"src_dask.projection-block-size": 16 * 40}):
        plan = _plan_of()
        sweep = _plan.SweepPlan.decide(stack, plan, ["w0", "w1"])
    assert sweep.groups == 1 and not sweep.pass2.home and sweep.pass2.spread
    assert sweep.z_blocks == tuple(_plan.z_blocks(stack, plan, j) for j in range(7))
    assert max(sweep.z_blocks) > 1 and sweep.z_blocks[-1] == 1
    gpu = _plan.SweepPlan.decide(stack, _plan_of(device="gpu"), ["w0", "w1"])
    assert gpu.groups == 2 and gpu.pass2.split and not gpu.copy_inputs
    assert gpu.own_streams and not sweep.own_streams  # see _plan.own_streams
    one = _plan.SweepPlan.decide(stack, _plan_of(device="gpu"), ["w0"])
    assert not one.own_streams and not one.pass2.split
    # split: every site whose Z has rows enough has a row block per worker
    assert all(b >= min(2, _plan.z_rows(stack, plan, j)) for j, b in enumerate(gpu.z_blocks))
    ucx = _plan.SweepPlan.decide(stack, _plan_of(device="gpu"), ["ucx://a:1", "ucx://b:2"])
    assert ucx.copy_inputs
    assert 2 <= sweep.lookahead <= 8


# -- memory: every task sized from the workers' limits --------------------------------------
def _deep(depth=3, n=8, bond=16):
    mpos = [problems.random_mpo(n, bond, 2, seed=s) for s in range(1, depth)]
    return make_stack((*mpos, problems.random_mps(n, bond, 2, seed=depth)))


@pytest.mark.parametrize("depth", [1, 2, 3, 4])
@pytest.mark.parametrize("task_mib", [8, 32, 256])
def test_chunks_and_z_blocks_fit_the_task_budget(depth, task_mib):
    stack = _deep(depth, bond=8 if depth == 4 else 16)
    task = task_mib * 2**20
    sketch = min(600, _plan.reachable_rank(stack))
    try:
        chunk = _plan.default_chunk(stack, sketch, 1, task)
    except PlanError:
        assert _plan.column_bytes(stack) > task
        return
    assert chunk * _plan.column_bytes(stack) <= task
    plan = _plan_of(sketch=sketch, chunk=chunk, task_bytes=task)
    for j in range(stack.n):
        try:
            blocks = _plan.z_blocks(stack, plan, j)
        except PlanError as err:
            assert f"site {j}: " in str(err) and "in a task, but a task may use" in str(err)
            continue
        rows = _plan.z_rows(stack, plan, j)
        left_rows = _plan.z_rows(stack, plan, j - 1) if j else 1
        for fixed, per in _plan.row_bytes(stack, j, rows, chunk, left_rows).values():
            assert fixed + per * -(-rows // blocks) <= task  # the largest block's tasks fit


def test_a_bounded_site_sums_its_environment_block_by_block():
    """Where memory (not size) cuts Z in blocks, no task holds them all: the shares of
    S are summed one block at a time (a chain), and the step is not fused."""
    stack = _deep(3, n=24)
    sketch = 400
    task = 96 * 2**20
    chunk = _plan.default_chunk(stack, sketch, 1, task)
    plan = _plan_of(sketch=sketch, chunk=chunk, task_bytes=task)
    sweep = _plan.SweepPlan.decide(stack, plan, None)
    middle = stack.n // 2
    assert sweep.bounded[middle] and sweep.z_blocks[middle] > 1 and not sweep.fits[middle]
    step = sweep.pass2.step(sweep.z_blocks[middle], sweep.z_blocks[middle - 1],
                            fits=sweep.fits[middle], bounded=sweep.bounded[middle])
    assert step.chain and not step.fused and not step.whole
    roomy = _plan.SweepPlan.decide(stack, _plan_of(sketch=sketch, chunk=chunk), None)
    assert not any(roomy.bounded) and all(roomy.fits)


def test_a_problem_that_cannot_fit_is_refused_before_any_work(monkeypatch):
    import src_dask
    from src_dask import _kernels as K

    calls = []
    monkeypatch.setattr(K, "sketch_step", lambda *a, **k: calls.append(1))
    a, x = problems.random_mpo(6, 16, 2, seed=1), problems.random_mps(6, 16, 2, seed=2)
    with dask.config.set({"src_dask.memory-limit": "64 KiB"}), \
            pytest.raises(PlanError, match=r"one sketch column needs about [0-9.]+ MiB in a "
                                           r"task, but a task may use [0-9.]+ MiB"):
        src_dask.apply(a, x, 32, seed=0)
    assert not calls
    assert issubclass(PlanError, MemoryError)


# -- a GPU's tasks get what the data dask-cuda keeps leave of the device ------------------
GIB = 2**30


def test_device_task_bytes_is_what_the_kept_data_leave():
    headroom = 0.05 * 100 * GIB
    # the data fit under the limit: the tasks share what the data leave
    assert _plan.device_task_bytes(100 * GIB, 80 * GIB, 60 * GIB, 4) == \
        int((100 * GIB - headroom - 60 * GIB) / 4)
    # the data exceed the limit: dask-cuda keeps the limit's worth, the rest spills
    assert _plan.device_task_bytes(100 * GIB, 70 * GIB, 300 * GIB, 1) == \
        int(100 * GIB - headroom - 70 * GIB)
    # nothing spills (no limit): data that crowd the device still leave the headroom
    assert _plan.device_task_bytes(100 * GIB, None, 120 * GIB, 2) == int(headroom / 2)


def _facts(device, threads, keep=None, n_workers=1):
    """A GPU worker of ``device`` bytes keeping ``keep`` of them (dask-cuda's limit)."""
    return _plan.Workers(count=n_workers, threads=threads, rss=0, host_limit=None, keep=None,
                         device_limit=keep, device_memory=device, memory=device)


def _gpu_plan(stack, chi_out, keep, device=140 * GIB, threads=4, n_workers=1):
    from src_dask import _api

    return _api.decide_plan(stack, chi_out, 0, 0.0, None, device="gpu",
                            facts=_facts(device, threads, keep, n_workers), slots=n_workers)


@pytest.mark.parametrize("depth", [1, 2, 3])
@pytest.mark.parametrize("device_mib", [24, 48, 96])
def test_gpu_tasks_fit_beside_the_data_the_device_keeps(depth, device_mib):
    """For several depths and device sizes (the data of these stacks are 1-31 MiB):
    with the device limit at 0.7, the data kept on the device (the inputs read ahead
    too) and the task fit the device less its headroom, or the task keeps the
    memory-fraction share (when that is smaller, or the data leave less than pass 2
    needs) and never exceeds it."""
    from src_dask import _estimate

    stack = _deep(depth, n=12, bond=16)
    device = device_mib * 2**20
    keep = int(0.7 * device)
    try:
        plan = _gpu_plan(stack, 64, keep, device=device, threads=1)
    except PlanError:
        return  # refused before any work: not even the fraction share fits
    share = _plan.task_bytes(_facts(device, 1), "gpu")
    # sized as if the device kept all the data it may, even where environments go to
    # host memory (the room they leave is margin)
    data = max(_estimate.data_held(stack, dataclasses.replace(plan, host_envs=0), 1, False))
    ahead = _estimate.inputs_in_flight(stack, _plan.lookahead(stack, plan))
    room = int(0.95 * device - min(data + ahead, keep))
    assert plan.task_bytes == min(share, room) or (room < plan.task_bytes == share)
    if (depth, device_mib) == (3, 48):  # the data crowd this one: sized to the device,
        # and the first sites' environments go to host memory
        assert plan.task_bytes == room < share and plan.host_envs > 0
        on_device = _estimate.environments(stack, plan, 1)[plan.host_envs + 1:]
        everything = dataclasses.replace(plan, host_envs=stack.n - 1)
        assert sum(on_device) + max(_estimate.data_held(stack, everything, 1, False)) <= (
            keep - ahead)


def test_the_stack_of_record_on_one_h200_keeps_its_blocks_at_a_device_limit_of_0_7():
    """D_M=2000/chi_out=1000 (lazy inputs; nothing drawn): its environments and a
    projected core (~122 GiB) exceed any default limit, so the first sites'
    environments go to host memory and the tasks get the device less the data it
    keeps: at 0.7 the sketch keeps 8 blocks of 125 columns; at 0.8 the device keeps
    more environments and the blocks are smaller (measured 137.4 s against 151.5 s
    when dask-cuda spilled them)."""
    from src_dask import _estimate

    stack = make_stack(tuple(problems.stack(50, 2000).values()))
    device = 150_109_880_320  # an H200 as CuPy reports it
    at_07, at_08 = (_gpu_plan(stack, 1000, int(f * device), device=device) for f in (0.7, 0.8))
    data = max(_estimate.data_held(stack, at_07, 1, False))
    ahead = _estimate.inputs_in_flight(stack, _plan.lookahead(stack, at_07))
    assert data + ahead <= int(0.7 * device)  # nothing left for dask-cuda to spill
    # sized as if the device kept up to its limit: the rest is margin
    assert at_07.task_bytes == int((0.95 * device - int(0.7 * device)) / 4)
    assert (at_07.chunk, len(at_07.blocks)) == (125, 8)
    assert 0 < at_08.host_envs < at_07.host_envs < stack.n - 1
    assert at_08.chunk < at_07.chunk and at_08.task_bytes < at_07.task_bytes


@pytest.mark.parametrize("dm", [1000, 2000])
@pytest.mark.parametrize("pool_gb", [12, 24, 48, 80])
def test_a_projected_core_the_device_cannot_keep_is_projected_twice(dm, pool_gb):
    """The reference stacks (lazy; nothing drawn) on one H200 whose RMM pool may grow to
    ``pool_gb`` (dask-cuda's limit at 2/3 of it): where ``Z_j`` (8 GB at D_M=1000, 33 GB
    at D_M=2000) would not fit the limit beside the rest even with every environment in
    host memory, the plan projects it twice (``Plan.reproject``) — no ``Z`` among the
    data, a second projection in the FLOPs, every site but 0 a chain of re-projecting
    sums — and the planned device peak stays within the pool less its headroom."""
    from src_dask import _api, _estimate

    stack = make_stack(tuple(problems.stack(50, dm).values()))
    device, keep = pool_gb * 10**9, pool_gb * 10**9 * 2 // 3
    facts = _facts(device, 4, keep)
    plan = _api.decide_plan(stack, dm // 2, 0, 0.0, None, device="gpu", facts=facts,
                            slots=1)
    ahead = _estimate.inputs_in_flight(stack, _plan.lookahead(stack, plan))
    kept = dataclasses.replace(plan, reproject=False, host_envs=stack.n - 1)
    z_fits = max(_estimate.data_held(stack, kept, 1, False)) + ahead <= keep
    assert plan.reproject is not z_fits
    sweep = _plan.SweepPlan.decide(stack, plan, None)
    est = _estimate.estimate(stack, sweep, facts, store=False, tasks=0, store_bytes=0,
                             product="")
    assert est.peak_device <= est.device_memory, est
    assert ("projected cores made twice" in str(est)) is plan.reproject
    if not plan.reproject:
        return
    assert [s.reproject for s in sweep.steps[1:]] == [True] * (stack.n - 1)
    assert all(s.chain and not s.fused and not s.whole for s in sweep.steps[1:])
    assert max(_estimate.data_held(stack, plan, 1, False)) < max(
        _estimate.data_held(stack, dataclasses.replace(plan, reproject=False), 1, False))
    # projected again for each sum of S_{j-1}: once, or once per block where it is cut
    once = _estimate.flops(stack, plan.sketch, plan.chi_out, False)
    again = sum(_estimate._project_madds(stack, j, _plan.z_rows(stack, plan, j)) * 8
                * sweep.env_sums[j]
                for j in range(1, stack.n))
    assert est.flops["pass 2"] == pytest.approx(once["pass 2"] + again)
    # each row block's sketch and environment sum fit a task with their projection
    for j in (1, stack.n // 2, stack.n - 2):
        rows = -(-_plan.z_rows(stack, plan, j) // sweep.z_blocks[j])
        left_rows = -(-_plan.z_rows(stack, plan, j - 1) // _plan.env_blocks(stack, plan, j))
        kinds = _plan.row_bytes(stack, j, _plan.z_rows(stack, plan, j), plan.chunk, left_rows)
        project = kinds["project"][1]
        for kind in ("sketch", "update"):
            fixed, per = kinds[kind]
            assert fixed + rows * (per + project) <= _plan.kind_bytes(plan, kind), (j, kind)


@pytest.mark.parametrize("pool_gb, warned", [(12, False), (4, False), (3, True), (2, True)])
def test_a_plan_that_projects_cores_many_times_says_so(pool_gb, warned, caplog):
    """The D_M=1000 stack (lazy) on a worker whose pool may grow to ``pool_gb``: below
    about 4 GB the tasks cut every environment's sum into blocks that each project the
    core again (each sum over a group of the next core's row blocks: 11-16 sums, not
    one per row block, 500, which made it 1e17 FLOPs); the run goes on, but says so,
    with the remedy, on the ``src_dask`` logger."""
    import logging

    from src_dask import _api, _estimate

    stack = make_stack(tuple(problems.stack(50, 1000).values()))
    facts = _facts(pool_gb * 10**9, 4, pool_gb * 10**9 * 2 // 3)
    plan = _api.decide_plan(stack, 500, 0, 0.0, None, device="gpu", facts=facts, slots=1)
    assert plan.reproject
    sweep = _plan.SweepPlan.decide(stack, plan, None)
    again = _estimate.projected_again(sweep)
    assert max(again.values()) == max(_plan.env_blocks(stack, plan, j) for j in again)
    flops = [sum(_estimate.flops(stack, plan.sketch, 500, plan.round, a).values())
             for a in (again, {})]
    assert flops[0] < 10 * flops[1], flops
    with caplog.at_level(logging.WARNING, logger="src_dask"):
        _api._warn_of_projections_again(stack, plan, None)
    assert ("project a core up to" in caplog.text) is warned, caplog.text
    if warned:
        assert "more device memory per worker" in caplog.text


@pytest.mark.parametrize("host_gb", [7, 8, 16, 128])
def test_a_gpu_worker_with_little_host_memory_reads_fewer_sites_ahead(host_gb):
    """D_M=1000 (lazy inputs, 256 MB a site) on a 24 GB pool whose worker's host memory
    is limited: the inputs read ahead land in pinned host memory beside all Dask keeps
    before it spills, so the plan reads fewer sites ahead where the default (8) would
    not fit, or where environments go to disk for want of host memory (16 GB), and
    its host peak stays within the limit; with room, the default."""
    from src_dask import _api, _estimate

    stack = make_stack(tuple(problems.stack(50, 1000).values()))
    host = host_gb * 10**9
    facts = _plan.Workers(count=1, threads=4, rss=1_400_000_000, host_limit=host,
                          keep=int(0.6 * host), device_limit=16 * 10**9,
                          device_memory=24 * 10**9, memory=24 * 10**9)
    plan = _api.decide_plan(stack, 500, 0, 0.0, None, device="gpu", facts=facts, slots=1)
    sweep = _plan.SweepPlan.decide(stack, plan, None)
    est = _estimate.estimate(stack, sweep, facts, store=False, tasks=0, store_bytes=0,
                             product="")
    default = _plan.lookahead(stack, dataclasses.replace(plan, read_ahead=None))
    if host_gb == 128:
        assert plan.read_ahead is None and sweep.lookahead == default == 8
        assert plan.disk_envs == 0
    else:
        assert 1 <= sweep.lookahead == plan.read_ahead < default
        assert plan.read_ahead <= 2 or plan.disk_envs == 0
    # the bound of the reads alone, where no environment went to disk
    alone = _plan.read_ahead(stack, dataclasses.replace(plan, read_ahead=None), facts)
    if host_gb <= 8:
        assert alone is not None and 1 <= alone < default
    assert est.peak_host <= host, est


def test_a_small_problem_keeps_the_memory_fraction_share_on_the_gpu():
    stack = _deep(2, n=10, bond=8)
    plan = _gpu_plan(stack, 32, int(0.7 * 140 * GIB))
    assert plan.task_bytes == _plan.task_bytes(_facts(140 * GIB, 4), "gpu")


def test_environments_that_crowd_the_device_go_to_host_memory():
    """A device without a limit (nothing spills) whose data leave less than the
    tasks' share: the first sites' environments go to host memory (copied by the
    tasks, not left to fill the device), and the tasks are sized to what all the data
    would leave, the rest being margin — not given more than the device has."""
    from src_dask import _estimate

    stack = _deep(3, n=12, bond=16)  # 31 MiB of data, pass 2 sums 8 MiB environments
    device = 32 * 2**20
    plan = _gpu_plan(stack, 256, None, device=device, threads=1)  # nothing spills
    assert plan.host_envs > 0
    everything = dataclasses.replace(plan, host_envs=0)
    data = max(_estimate.data_held(stack, everything, 1, False))
    ahead = _estimate.inputs_in_flight(stack, _plan.lookahead(stack, plan))
    assert plan.task_bytes == _plan.device_task_bytes(device, None, data, 1, ahead)
    assert plan.task_bytes < _plan.task_bytes(_facts(device, 1), "gpu")
    assert max(_estimate.data_held(stack, plan, 1, False)) < data
    est = _estimate.estimate(stack, _plan.SweepPlan.decide(stack, plan, None),
                             _facts(device, 1), store=False, tasks=0, store_bytes=0,
                             product="")
    assert est.peak_device <= est.device_memory
    assert est.host_env_bytes == sum(_estimate.environments(stack, plan, 1)[:plan.host_envs + 1])
    assert f"environments of sites 1-{plan.host_envs}" in str(est)


def test_the_environment_sum_may_use_every_threads_share():
    """Pass 2's environment sum runs alone on its worker (the next site's tasks need
    it), so its running sum may use the share of all the worker's threads: 8 MiB of
    it fit four threads of 4 MiB, but not one."""
    stack = _deep(3, n=12, bond=16)
    sketch = _plan.reachable_rank(stack)
    fixed = max(_plan.row_bytes(stack, j, _plan.z_rows(stack, _plan_of(sketch=sketch), j),
                                8)["update"][0] for j in range(stack.n))
    assert 4 * 2**20 < fixed < 15 * 2**20
    four = _plan_of(sketch=sketch, chunk=8, task_bytes=4 * 2**20, threads=4)
    _plan.check_fits(stack, four)
    assert _plan.kind_bytes(four, "update") == 16 * 2**20
    assert _plan.kind_bytes(four, "project") == 4 * 2**20
    # one thread's share: the environment is summed in row blocks instead
    one = _plan_of(sketch=sketch, chunk=8, task_bytes=4 * 2**20)
    _plan.check_fits(stack, one)
    assert max(_plan.env_blocks(stack, one, j) for j in range(stack.n)) > 1
    assert max(_plan.env_blocks(stack, four, j) for j in range(stack.n)) == 1
    # cut in row blocks, the blocks' sums run side by side, four at once on four
    # threads: each gets one thread's share, as on one thread
    small = _plan_of(sketch=sketch, chunk=8, task_bytes=2**20, threads=4)
    alone = _plan_of(sketch=sketch, chunk=8, task_bytes=2**20)
    for j in range(1, stack.n):
        blocks = _plan.env_blocks(stack, small, j)
        if blocks > 1:
            assert blocks == _plan.env_blocks(stack, alone, j)
    assert max(_plan.env_blocks(stack, small, j) for j in range(stack.n)) > 1
    # one row of it that does not fit is refused, naming what it needs
    with pytest.raises(PlanError, match=r"one row of the environment pass 2 sums needs"):
        _plan.env_blocks(stack, _plan_of(sketch=sketch, chunk=8, task_bytes=2**10), 6)


def test_gpu_workers_on_a_slow_link_are_warned_of():
    """Several GPU workers talking TCP (or TLS) get a WARNING's text saying what pass 2
    moves between them a site and how to get UCX; UCX, one worker or CPU workers none."""
    from dask.utils import format_bytes

    stack = _stack(n=12, mpo_bond=3, mps_bond=7)
    gpu, cpu = _plan_of(device="gpu"), _plan_of(device="cpu")
    tcp = ["tcp://127.0.0.1:1", "tcp://127.0.0.1:2", "tcp://127.0.0.1:3"]
    text = _plan.slow_gpu_link(stack, gpu, tcp)
    assert max(stack.left_bonds(6)) == 7  # not capped mid-train
    env = 8 * 3 * 7  # the largest environment: sketch x the left bonds (MPO x MPS)
    assert text.startswith("src: 3 GPU workers talk tcp")
    assert f"moves up to {format_bytes(int(2 / 3 * 2 * env * 16))} a site" in text
    assert "protocol='ucx'" in text and "'gpu' extra" in text
    assert "talk tls" in _plan.slow_gpu_link(stack, gpu, ["tls://10.0.0.1:1", "tls://b:1"])
    for plan, workers in ((gpu, ["ucx://a:1", "ucx://b:2"]), (gpu, tcp[:1]), (cpu, tcp),
                          (gpu, [])):
        assert _plan.slow_gpu_link(stack, plan, workers) is None


def test_src_warns_of_a_slow_link_once_a_cluster(monkeypatch, caplog, cluster_client,
                                                 many_tasks):
    """``src`` on a cluster logs what :func:`_plan.slow_gpu_link` says, as a WARNING on
    the ``src_dask`` logger, before it runs; the next call on that cluster does not."""
    import logging

    import numpy as np

    import src_dask
    from src_dask import _api

    seen = []
    monkeypatch.setattr(_api, "_slow_links_reported", set())
    monkeypatch.setattr(_plan, "slow_gpu_link", lambda stack, plan, workers: seen.append(
        len(workers)) or "src: a slow link")
    trains = (problems.random_mpo(4, 2, 2, seed=1).to_numpy(),
              problems.random_mps(4, 3, 2, seed=2).to_numpy())
    with caplog.at_level(logging.WARNING, logger="src_dask"):
        y = src_dask.apply(*trains, 4, seed=1, client=cluster_client)
        src_dask.apply(*trains, 4, seed=2, client=cluster_client)
    assert [r.getMessage() for r in caplog.records
            if r.levelno == logging.WARNING] == ["src: a slow link"]
    assert seen == [2]
    assert np.isfinite(y.norm())


# -- device -> host -> disk: what spills to disk must fit there ----------------------------
def _cpu_workers(disk_free: int, sharing: int = 2) -> _plan.Workers:
    mib = 2**20
    return _plan.Workers(count=2, threads=1, rss=100 * mib, host_limit=400 * mib,
                         keep=140 * mib, room=120 * mib, memory=400 * mib,
                         disk_free=disk_free, disk_sharing=sharing, spill_dir="/spill/here")


def test_spilling_beyond_the_free_disk_is_refused_before_any_work():
    """Environments 4x the workers' memory spill to the disk under their local
    directory; where that disk lacks the room (for every worker that spills there)
    the run is refused at once, naming the directory and both sizes."""
    import dataclasses

    from src_dask import _api, _estimate

    stack = _deep(3, n=20, bond=16)
    roomy = _cpu_workers(disk_free=2**40)
    plan = _api.decide_plan(stack, 600, 0, 0.0, None, device="cpu", facts=roomy, slots=2)
    sweep = _plan.SweepPlan.decide(stack, plan, None)
    to_disk = _estimate.estimate(stack, sweep, roomy, store=False, tasks=0, store_bytes=0,
                                 product="").to_disk
    assert to_disk > 100 * 2**20  # most of the environments go to disk
    _api._check_spill_room(stack, plan, None, roomy, False)  # room enough: no error
    for free, sharing in ((to_disk // 2, 1), (int(1.5 * to_disk), 2)):
        short = dataclasses.replace(roomy, disk_free=free, disk_sharing=sharing)
        with pytest.raises(OSError, match=r"/spill/here: the workers would spill about .* to "
                                          r"disk there .* but only .* are free"):
            _api._check_spill_room(stack, plan, None, short, False)
    # with a run store the environments go to the store, not to the workers' disk
    in_store = _api.decide_plan(stack, 600, 0, 0.0, None, device="cpu", facts=roomy, slots=2,
                                store=True)
    _api._check_spill_room(stack, in_store, None,
                           dataclasses.replace(roomy, disk_free=to_disk // 2), True)


def test_the_plan_imports_no_cluster_helpers():
    """The plan is pure: it decides from facts it is given, and the cluster helpers
    build on it (no import cycle between ``_plan`` and ``_cluster``)."""
    import ast
    import inspect

    tree = ast.parse(inspect.getsource(_plan))
    imported = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
    assert not any(m and m.endswith("_cluster") for m in imported), imported


@pytest.mark.parametrize(("depth", "bond", "mpo_bond", "phys"),
                         [(1, 16, 4, 2), (2, 16, 4, 3), (3, 8, 3, 2), (1, 64, 8, 2)])
def test_the_projection_model_is_the_kernels_measured_peak(depth, bond, mpo_bond, phys):
    """``project_row_bytes`` (what the plan, the estimate and the OOM halving size a
    projection by) against what the kernel allocates, measured with tracemalloc
    (NumPy reports its buffers there) on a few shapes: within 0.75-1.25x, so the
    model neither hides the contraction's intermediates nor refuses runs that fit.
    Measured in a process of its own: tracemalloc counts every thread's allocations,
    and threads other tests leave behind (a cluster's) would count in this one's."""
    import subprocess
    import sys

    from helpers import random_mpo, random_mps

    from src_dask import _kernels as K

    trains = [random_mpo(6, mpo_bond, phys=phys, seed=i) for i in range(depth)]
    stack = make_stack((*trains, random_mps(6, bond, phys=phys, seed=9)))
    shapes = [tuple(int(d) for d in s) for s in stack.shapes(3)]
    rows = 20
    script = f"""
import tracemalloc
import numpy as np
from src_dask import _kernels as K
rng = np.random.default_rng(0)
shapes = {shapes!r}
cores = [rng.standard_normal(s) + 1j * rng.standard_normal(s) for s in shapes]
env = rng.standard_normal(({rows}, *(s[1] for s in shapes))) + 0j
tracemalloc.start()
base = tracemalloc.get_traced_memory()[0]
tracemalloc.reset_peak()
K.project_core(cores, env)
print(tracemalloc.get_traced_memory()[1] - base)
"""
    run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         timeout=120, check=True)
    peak = int(run.stdout.split()[-1])
    cores = [np.empty(s, complex) for s in shapes]
    assert 0.75 <= peak / (rows * K.project_row_bytes(cores)) <= 1.25


@pytest.mark.parametrize("limit_mb, rss_mb, workers, threads", [
    (400, 150, 2, 1), (300, 140, 1, 1), (600, 150, 1, 2), (100_000, 150, 2, 1)])
def test_a_cpu_run_writes_what_its_workers_do_not_keep_to_disk(limit_mb, rss_mb, workers,
                                                               threads):
    """Without a store, a CPU worker keeps environments up to what Dask keeps before
    it spills (``Workers.keep``) beside the run's other data; the first sites'
    beyond that are written to disk by the tasks (``Plan.disk_envs``, all of
    ``host_envs``: no copy between), no more. Dask's spilling, which looks every
    100 ms, lost small workers to their restart at 95 %."""
    from src_dask import _api, _estimate

    stack = make_stack((problems.random_mpo(30, 4, seed=1),
                        problems.random_mps(30, 512, seed=2)))
    limit, rss = limit_mb * 2**20, rss_mb * 2**20
    facts = _plan.Workers(count=workers, threads=threads, rss=rss, host_limit=limit,
                          keep=int(min(0.6 * limit, 0.7 * limit - rss)),
                          room=int(0.8 * limit - max(rss, 0.7 * limit)), memory=limit)
    plan = _api.decide_plan(stack, 512, 0, 0.0, None, device="cpu", facts=facts,
                            slots=workers * threads)
    assert plan.disk_envs == plan.host_envs
    held = _estimate.data_held(stack, plan, workers, False)
    sweep = _plan.SweepPlan.decide(stack, plan, [f"tcp://w:{i}" for i in range(workers)])
    est = _estimate.estimate(stack, sweep, facts, store=False, tasks=0, store_bytes=0,
                             product="")
    if limit_mb == 100_000:
        assert plan.disk_envs == 0 and est.to_disk == 0
        return
    assert plan.disk_envs > 0
    # the environments kept and the run's other data (with all on disk: the projected
    # cores, two sites fetched back and their buffers) fit; one site more would not
    envs = _estimate.environments(stack, plan, workers)
    everything = dataclasses.replace(plan, host_envs=stack.n - 1, disk_envs=stack.n - 1)
    other = (max(_estimate.data_held(stack, everything, workers, False))
             + _estimate.staged_envs(stack, everything, workers))
    if other > facts.keep:  # not even then (Dask spills the rest): all of them
        assert plan.disk_envs == stack.n - 1
    else:
        assert max(held) + _estimate.staged_envs(stack, plan, workers) <= facts.keep
        assert sum(envs[plan.disk_envs + 1:]) <= facts.keep - other \
            < sum(envs[plan.disk_envs:])
    assert est.to_disk >= sum(envs[1:plan.disk_envs + 1])
    assert f"environments of sites 1-{plan.disk_envs} (" in str(est)
    # unlimited workers, a store, or no cluster: nothing goes to disk this way
    unlimited = dataclasses.replace(facts, keep=None, host_limit=None, room=None)
    assert _api.decide_plan(stack, 512, 0, 0.0, None, device="cpu", facts=unlimited,
                            slots=2).disk_envs == 0
    assert _api.decide_plan(stack, 512, 0, 0.0, None, device="cpu", facts=facts, slots=2,
                            store=True).disk_envs == 0
    if workers > 1:  # pass 2 split by rows: every worker reads every block
        with dask.config.set({"src_dask.pass2-split": True}):
            assert _api.decide_plan(stack, 512, 0, 0.0, None, device="cpu", facts=facts,
                                    slots=2).disk_envs == 0


@pytest.mark.parametrize("dm, pool_gb, host_gb", [(1000, 24, 8), (1000, 12, 16), (1000, 48, 8),
                                                  (2000, 24, 16), (1000, 24, 128)])
def test_environments_host_memory_cannot_keep_go_to_disk(dm, pool_gb, host_gb):
    """The environments a GPU run sends to host memory go on to the worker's disk where
    its host memory would not keep them beside the inputs read ahead (Dask would spill
    them on its event loop): the first sites' (used last), no more than that. The plan
    keeps the worker below Dask's spill threshold, counts them in what goes to disk,
    and says so."""
    from src_dask import _api, _estimate

    stack = make_stack(tuple(problems.stack(50, dm).values()))
    host, rss = host_gb * 10**9, 1_400_000_000
    facts = _plan.Workers(count=1, threads=4, rss=rss, host_limit=host,
                          keep=int(min(0.6 * host, 0.7 * host - rss)),
                          device_limit=pool_gb * 10**9 * 2 // 3,
                          device_memory=pool_gb * 10**9, memory=pool_gb * 10**9)
    plan = _api.decide_plan(stack, dm // 2, 0, 0.0, None, device="gpu", facts=facts, slots=1)
    sweep = _plan.SweepPlan.decide(stack, plan, None)
    est = _estimate.estimate(stack, sweep, facts, store=False, tasks=0, store_bytes=0,
                             product="")
    envs = _estimate.environments(stack, plan, 1)
    in_host = sum(envs[plan.disk_envs + 1:plan.host_envs + 1])
    room = facts.keep - _estimate.pinned_reads(stack, sweep.lookahead, "gpu")
    assert in_host <= room
    if host_gb == 128:
        assert plan.disk_envs == 0 and est.to_disk == 0
        return
    assert 0 < plan.disk_envs <= plan.host_envs
    assert in_host + envs[plan.disk_envs] > room - _estimate.staged_envs(stack, plan, 1)
    assert est.peak_host <= rss + facts.keep
    assert est.to_disk >= sum(envs[1:plan.disk_envs + 1]) == est.disk_env_bytes
    assert f"environments of sites 1-{plan.disk_envs} (" in str(est)
    assert "written to the workers' disk" in str(est)
    # a disk without room for them: refused before any work (D_M=2000 on 8 GB of host
    # memory writes 94 GB; the H200 machine's disk has 15 GB beside the inputs)
    _api._check_spill_room(stack, plan, None, dataclasses.replace(
        facts, disk_free=2 * est.to_disk, spill_dir="/w"), False)
    with pytest.raises(OSError, match=r"/w: the workers would spill about .* but only"):
        _api._check_spill_room(stack, plan, None, dataclasses.replace(
            facts, disk_free=est.to_disk // 2, spill_dir="/w"), False)


@pytest.mark.parametrize("device_limit, one", [(None, True), (2**30, True), (16 * 2**20, False)])
def test_a_run_on_one_gpu_worker_is_one_task_only_within_its_device_limit(device_limit, one):
    """On one GPU worker a run past ``one-task-flops`` is one task (``_api._one_task_flops``
    gives its FLOPs) when its data, largest task and inputs fit what dask-cuda keeps on
    the device (a task's own arrays never spill); past that limit it is a graph (None),
    and on two GPU workers always a graph."""
    from types import SimpleNamespace

    from helpers import random_mpo, random_mps

    from src_dask import _api

    stack = make_stack((random_mpo(12, 4, seed=1), random_mps(12, 256, seed=2)))  # 2.7e10 flop
    memory = 141 * 2**30
    for n_workers, want in ((1, one), (2, False)):
        facts = _plan.Workers(count=n_workers, threads=4, rss=3 * 2**30, host_limit=100 * 2**30,
                              keep=60 * 2**30, device_limit=device_limit,
                              device_memory=memory, memory=memory)
        plan = _api.decide_plan(stack, 256, 0, 0.0, None, device="gpu", facts=facts,
                                slots=n_workers)
        identity = SimpleNamespace(identity=lambda n_workers, n=n_workers: {
            "workers": {f"tcp://gpu{i}:1": {} for i in range(n)}})
        client = SimpleNamespace(sync=lambda f, **kwargs: f(**kwargs), scheduler=identity)
        with dask.config.set({"src_dask.one-task-flops": 2e9}):
            flops = _api._one_task_flops(stack, plan, client, facts)
        assert (flops is not None) is want, (n_workers, device_limit)


@pytest.mark.parametrize("device", ["cpu", "gpu"], ids=["host", "device"])  # stand-ins
def test_the_memory_counts_are_made_once_a_shape_not_once_a_site(device, monkeypatch):
    """The plan and every task ask the kernels' memory counts site by site; sites of the
    same shapes share one count (a 50-site χ=1000 call planned them 1,400 times), and a
    change of what the count depends on (the config, the bounds of the products' ways)
    is a new count, not a stale one."""
    from src_dask import _kernels as K

    stack = _stack(n=40, mps_bond=16)
    for f in (K._contraction_elements, K._project_row_bytes, K._sketch_step_bytes):
        f.cache_clear()
    shapes = {tuple(stack.shapes(j)) for j in range(stack.n)}
    counts = [K.project_row_bytes(_plan._shapes(stack, j, device)) for j in range(stack.n)]
    assert K._project_row_bytes.cache_info().misses == len(shapes) < stack.n
    _plan.sketch_column_bytes(stack, device)
    assert K._sketch_step_bytes.cache_info().misses == len(shapes)
    with dask.config.set({"src_dask.complex-products": "3m"}):
        three = [K.project_row_bytes(_plan._shapes(stack, j, device)) for j in range(stack.n)]
    monkeypatch.setattr(K, "THREE_REAL_MIN", 1)  # every product wide: as three real ones
    with dask.config.set({"src_dask.complex-products": "3m"}):
        wide = [K.project_row_bytes(_plan._shapes(stack, j, device)) for j in range(stack.n)]
    assert three == counts  # these products are too narrow to be made as three
    assert all(w >= c for w, c in zip(wide, three, strict=True)) and sum(wide) > sum(three)


def test_a_projection_cut_into_rows_reads_its_cores_laid_out_within_a_rows_memory():
    """A row of the projection holds what ``project_row_bytes`` counts for it once the
    cores are laid out for the rows (``laid_out_for_rows``); without that, every row
    copies a core its contraction reads transposed, here (an MPO bond of 300 against
    a row of 4) several times a row's memory, as a D_M=1000 core of physical dimension
    4 (244 MiB against 48 MiB) did in every row of a stack cut to rows in a 3 GB pool.
    The laid-out cores are the same tensors: the projection is unchanged. Measured
    with tracemalloc in a process of its own (see the test above)."""
    import subprocess
    import sys

    from src_dask import _kernels as K

    shapes = [(4, 4, 3, 3), (300, 300, 3, 3), (2, 2, 3, 3)]
    script = f"""
import tracemalloc
import numpy as np
from src_dask import _kernels as K
rng = np.random.default_rng(0)
cores = [rng.standard_normal(s) + 1j * rng.standard_normal(s) for s in {shapes!r}]
env = rng.standard_normal((5, *(s[1] for s in {shapes!r}))) + 0j
laid = K.laid_out_for_rows(cores, env)
assert all(np.array_equal(a, b) for a, b in zip(cores, laid))
peaks, rows = [], []
for cs in (cores, laid):
    tracemalloc.start()
    base = tracemalloc.get_traced_memory()[0]
    tracemalloc.reset_peak()
    rows.append(K.project_core(cs, env[2:3]))
    peaks.append(tracemalloc.get_traced_memory()[1] - base)
    tracemalloc.stop()
assert np.abs(rows[0] - rows[1]).max() <= 1e-13 * np.abs(rows[0]).max()  # two layouts, two GEMMs
print(*peaks)
"""
    run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         timeout=120, check=True)
    copied, laid = map(int, run.stdout.split()[-2:])
    row = K.project_row_bytes([np.empty(s, complex) for s in shapes])
    assert copied > 3 * row  # the core copied for the row
    assert laid <= 1.25 * row


def test_a_tasks_environment_sum_through_its_blocks_is_added_in_place():
    """``project_update_all`` keeps one running sum of ``S_{j-1}`` through the row
    blocks of ``Z_j``: each block's share is added into it, not into a new array
    beside the old one. The memory plan (``_estimate._pass2_parts``) counts the
    product and one running sum; a new sum held a third environment, 488 MiB at
    D_M=1000, which a stack in a 4 GB pool did not have (its update failed at one
    row, the pool holding no room for the output). The sum is the whole update's;
    the inputs are unchanged. Peak measured with tracemalloc in a process of its own
    (see the projection test above): 3.1 environments out of place, 2.3 in place."""
    import subprocess
    import sys

    script = """
import tracemalloc
import numpy as np
from src_dask._graph import tasks
rng = np.random.default_rng(0)
def c(*s): return rng.standard_normal(s) + 1j * rng.standard_normal(s)
cores = [c(*s) for s in [(2, 2, 3, 3), (50, 50, 3, 3), (2, 2, 3, 3)]]
s, eta = c(8, 2, 50, 2), c(400, 8, 3, 3)
kept = [a.copy() for a in (s, eta, *cores)]
tracemalloc.start()
base = tracemalloc.get_traced_memory()[0]
tracemalloc.reset_peak()
env = tasks.project_update_all(eta, cores, [s, s], s_rows=[(0, 2), (1, 2)], site=3, run="t")
peak = tracemalloc.get_traced_memory()[1] - base
tracemalloc.stop()
assert all(np.array_equal(a, b) for a, b in zip(kept, (s, eta, *cores)))
z = tasks.project(cores, s, rows=None, site=3, run="t")
whole = tasks.partial_update(eta, z, None, rows=(0, 1), site=3, run="t")
assert np.abs(env - whole).max() <= 1e-13 * np.abs(whole).max()
print(peak / env.nbytes)
"""
    run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         timeout=120, check=True)
    assert float(run.stdout.split()[-1]) <= 2.6
