"""The sweep on Dask: one graph, named tasks, a cluster of worker processes."""

from __future__ import annotations

import dataclasses
import math
import os
import signal
import sys
import time

import dask
import numpy as np
import pytest
from dask.utils import key_split
from helpers import dense_product, graphs_received, random_mpo, random_mps, rel_err

import src_dask
from src_dask import _api, _graph, _plan, _random
from src_dask._graph import keys
from src_dask._stack import make_stack


@pytest.fixture(autouse=True)
def _layouts(many_tasks):
    """Small runs here are graphs of many tasks: their layout is what is tested."""


def _sweep(n=6, chunk=3, oversample=0, addresses=None, threads=1):
    a, x = random_mpo(n, 3, seed=1), random_mps(n, 4, seed=2)
    stack = make_stack((a, x))
    plan = _plan.Plan(sketch=8, chunk=chunk, chi_out=6, cutoff=0.0,
                       key=_random.seed_key(0), round=oversample > 0, threads=threads)
    return dict(_graph.build(stack, plan, addresses).dask)


def _graph_keys(n=6, chunk=3, oversample=0, addresses=None):
    return list(_sweep(n, chunk, oversample, addresses))


def test_task_prefixes_name_pass_and_site():
    prefixes = {key_split(k) for k in _graph_keys()}
    for j in range(5):
        assert f"pass1_site{j}" in prefixes
    for j in range(6):
        assert f"pass2_site{j}" in prefixes
        assert f"load_site{j}" in prefixes
        assert f"result_site{j}" in prefixes
    assert "pass1_site5" not in prefixes  # pass 1 stops at site n-2
    assert any(p.startswith("round_site") for p in map(key_split, _graph_keys(oversample=4)))


def test_graph_shape_per_site():
    # 8 columns in blocks of 3 -> 3 blocks, spread over two CPU workers of two threads
    dsk = _sweep(n=6, chunk=3, addresses=["w0", "w1"], threads=2)
    keys = list(dsk)
    pass1 = [k for k in keys if key_split(k).startswith("pass1") and isinstance(k[1], int)]
    assert len(pass1) == 3 * 5  # one task per block and site
    # blocks 0 and 2 share worker 0: its chains wait for each other two sites behind
    barriers = [k for k in keys if key_split(k).startswith("pass1") and k[1] == "all"]
    assert sorted((key_split(k[0]), k[2]) for k in barriers) == [
        (f"pass1_site{j}", 0) for j in range(3)]
    step = next(k for k in pass1 if key_split(k) == "pass1_site3" and k[1] == 2)
    barrier = next(k for k in barriers if key_split(k[0]) == "pass1_site1")
    assert barrier in dsk[step]  # block 2 at site 3 waits for blocks 0 and 2 at site 1
    site3 = [k for k in keys if key_split(k) == "pass2_site3"]
    # one sketch piece per block (where the block lives), one QR (fused with the update
    # and the next projection), the output core and the next site's projected core
    assert sorted(k[1] for k in site3) == ["core", "project", "qr", "sketch", "sketch", "sketch"]


def test_pass2_in_one_place_is_one_task_per_site():
    """On one worker of a cluster (or a GPU) a site's sketch pieces are made in its QR
    task, which takes Z from the previous site's task: the chain of pass 2 is one task
    per site (each dependent task on a cluster waits for the scheduler). Dask's local
    schedulers on a CPU keep one task per piece, which their threads run side by side."""
    from dask.core import get_dependencies

    dsk = _sweep(n=6, chunk=3, addresses=["w0"])
    site3 = [k for k in dsk if key_split(k) == "pass2_site3"]
    assert sorted(k[1] for k in site3) == ["core", "qr"]
    qr = {key_split(k): k for k in dsk if k[1:2] == ("qr",)}
    for j in range(2, 5):  # site j's QR depends on site j+1's QR itself
        assert qr[f"pass2_site{j + 1}"] in get_dependencies(dsk, qr[f"pass2_site{j}"])
    local = [k for k in _sweep(n=6, chunk=3) if key_split(k) == "pass2_site3"]
    assert sorted(k[1] for k in local) == ["core", "project", "qr", "sketch", "sketch", "sketch"]


@pytest.mark.parametrize("options", [{}, {"cutoff": 0.3}, {"oversample": 3}])
def test_projected_cores_in_row_blocks_give_the_same_cores(monkeypatch, options):
    """A large projected core Z is made, sketched and used in row blocks (one
    task each); the result is the same train, core by core. With a cutoff the
    bond can come out smaller than the blocks planned for it (empty blocks)."""
    trains = (random_mpo(7, 3, phys=3, seed=1), random_mpo(7, 2, phys=3, seed=2),
              random_mps(7, 6, phys=3, seed=3))
    opts = dict(chi_out=10, seed=4, chunk=4, **options)
    ref = src_dask.src(*trains, **opts)
    monkeypatch.setitem(dask.config.config["src_dask"], "projection-block-size", 16 * 50)
    stack = make_stack(trains)
    plan = _plan.Plan(sketch=10, chunk=4, chi_out=10, cutoff=0.0, key=0, round=False)
    assert max(_plan.z_blocks(stack, plan, j) for j in range(7)) == 10  # one row each
    with dask.config.set({"src_dask.projection-block-size": "1 GiB"}):
        assert _plan.Plan(sketch=10, chunk=4, chi_out=10, cutoff=0.0, key=0,
                           round=False).z_block_bytes == 2**30
    keys = list(dict(_graph.build(stack, plan).dask))
    assert len([k for k in keys if k[1:2] == ("project",)]) > 7
    # in one process the QR task sums S from the blocks; over CPU workers a chain of
    # update tasks does, one where each block is
    assert not [k for k in keys if k[1:2] == ("update",)]
    keys = list(dict(_graph.build(stack, plan, addresses=["w0", "w1"]).dask))
    assert len([k for k in keys if k[1:2] == ("update",)]) > 7
    y = src_dask.src(*trains, **opts)
    for c, c0 in zip(y, ref, strict=True):
        assert c.shape == c0.shape
        assert np.abs(c - c0).max() <= 1e-12 * np.abs(c0).max()
    assert rel_err(y, dense_product(*trains)) == pytest.approx(rel_err(ref, dense_product(*trains)))


def test_whole_sweep_is_one_graph_on_a_two_worker_cluster(cluster_client):
    graphs = graphs_received(cluster_client, "count-graphs")
    a, x = random_mpo(8, 3, seed=1), random_mps(8, 4, seed=2)
    y = src_dask.apply(a, x, 100, seed=0, client=cluster_client)
    assert graphs() == 1
    assert rel_err(y, dense_product(a, x)) <= 1e-12
    assert len(cluster_client.scheduler_info()["workers"]) == 2


def test_current_client_is_used_by_default(cluster_client):
    a, x = random_mpo(6, 3, seed=1), random_mps(6, 4, seed=2)
    with cluster_client.as_current():
        assert _api._client(None) is cluster_client
        y = src_dask.apply(a, x, 100, seed=0)
    assert rel_err(y, dense_product(a, x)) <= 1e-12
    assert _api._client(None) is None


def test_default_chunk_uses_every_worker_thread_or_gpu(cluster_client):
    stack = make_stack((random_mpo(6, 3, seed=1), random_mps(6, 4, seed=2)))
    assert _plan.default_chunk(stack, 100, _plan.slots(None, "cpu")) == 100
    assert _plan.default_chunk(stack, 100, _plan.slots(cluster_client, "cpu")) == 50


    class OneGpuWorker:
        def nthreads(self) -> dict[str, int]:
            return {"tcp://gpu-worker": 4}

    assert _plan.default_chunk(stack, 100, _plan.slots(OneGpuWorker(), "gpu")) == 100
    assert _plan.default_chunk(stack, 100, _plan.slots(OneGpuWorker(), "cpu")) == 25


def test_default_chunk_caps_block_size(monkeypatch):
    stack = make_stack((random_mpo(6, 3, seed=1), random_mps(6, 4, seed=2)))
    with dask.config.set({"src_dask.block-size": 16 * 12 * 10}):  # 10 columns of a 3*4 env
        assert _plan.default_chunk(stack, 100, 1) == 10


def _first_worker_graph(n=7, read_ahead=2):
    """The graph of a run on two single-threaded CPU workers whose ``Z`` is whole at
    every site (``Pass2.FIRST``): two blocks of sketch columns, one per worker."""
    stack = make_stack((random_mpo(n, 3, seed=1), random_mps(n, 4, seed=2)))
    plan = _plan.Plan(sketch=8, chunk=4, chi_out=8, cutoff=0.0, key=0, round=False,
                       threads=1, read_ahead=read_ahead)
    assert _plan.SweepPlan.decide(stack, plan, ["w0", "w1"]).pass2 is _plan.Pass2.FIRST
    graph = _graph.build(stack, plan, addresses=["w0", "w1"])
    token = next(k for k in graph.dask if isinstance(k, str)
                 and k.startswith("src_result-"))[11:]
    return dict(graph.dask), _where(graph), token


@pytest.mark.timeout(60)
def test_pass_2_on_the_first_of_two_cpu_workers_is_one_dependent_task_a_site():
    """Two single-threaded CPU workers, Z whole at every site: pass 1 runs over both,
    pass 2 on the first, one task a site (sketch pieces, QR, update, next Z) that
    depends on the site before's task directly: one scheduler round trip a site on
    the critical path, where the spread layout had two (sketch pieces where the blocks
    of C_j are, then the QR) and sent Z_j to the other worker. The other worker's
    block of C_j is fetched to the first ahead of use (read_ahead sites), off the
    critical path."""
    n, ahead = 7, 2
    dsk, where, token = _first_worker_graph(n, ahead)

    def name(step, j):
        return f"{step}_site{j}-{token}"

    pass1 = [k for k in dsk if key_split(k).startswith("pass1")]
    assert {where[k] for k in pass1} == {"w0", "w1"}
    for j in range(1, n):
        site = sorted(k[1:] for k in dsk if key_split(k) == f"pass2_site{j}")
        assert site == sorted([("core",), ("fetch", 1), ("qr",)] + (
            [("project", 0)] if j == n - 1 else [])), j
        qr, fetch = (name("pass2", j), "qr"), (name("pass2", j), "fetch", 1)
        assert where[qr] == where[fetch] == "w0"
        steps = {d for d in _deps(dsk, qr) if key_split(d).startswith("pass2")}
        before = (name("pass2", j + 1), "qr") if j < n - 1 else (name("pass2", j), "project", 0)
        assert steps == {before, fetch}, j  # the site before's task, and the fetched block
        assert (name("pass1", j - 1), 0) in _deps(dsk, qr)  # block 0 of C_j: made on w0
        assert (name("pass1", j - 1), 1) in _deps(dsk, fetch)  # block 1: fetched from w1
        signals = {d for d in _deps(dsk, fetch) if key_split(d) == "src_after"}
        if j + ahead < n:  # fetched once site j + ahead's core is made, not at the start
            assert signals == {(f"src_after-{token}", name("pass2", j + ahead), "core")}
        else:
            assert not signals
    # per site of pass 2: the step, its output core and one fetch (no sketch, project
    # or update tasks): 3 tasks, against 5 spread (2 sketch pieces, the QR, Z, core)
    assert len([k for k in dsk if key_split(k).startswith("pass2")]) == 3 * (n - 1) + 3


@pytest.mark.timeout(120)
def test_pass_2_on_the_first_worker_moves_only_pass_1s_blocks_and_inputs(cluster_client):
    """On two single-threaded workers (Pass2.FIRST) nothing of pass 2 crosses between
    the workers: only the other worker's blocks of C_j (each once) and the prepared
    input cores (each at most once a worker); the cores are the one-process run's
    (1e-12), and the same on a second call bit for bit."""
    from helpers import close_cores

    trains = (random_mpo(8, 3, seed=1), random_mps(8, 16, seed=2))
    ref = src_dask.src(*trains, chi_out=20, seed=3)

    def clear(dask_worker):
        dask_worker.transfer_incoming_log.clear()

    def received(dask_worker):
        return [k for log in dask_worker.transfer_incoming_log for k in log["keys"]]

    cluster_client.wait_for_workers(2, timeout=60)
    cluster_client.run(clear)
    y = src_dask.src(*trains, chi_out=20, seed=3, client=cluster_client)
    crossed = [k for keys in cluster_client.run(received).values() for k in keys]
    steps = {key_split(k)[:5] for k in crossed}
    assert steps <= {"pass1", "load_"}, steps
    pass1 = [k for k in crossed if key_split(k).startswith("pass1")]
    assert len(pass1) == len(set(pass1)) <= 7  # block 1 of C_1 … C_7, once each
    assert close_cores(y, ref)
    again = src_dask.src(*trains, chi_out=20, seed=3, client=cluster_client)
    assert all(np.array_equal(p, q) for p, q in zip(y, again, strict=True))


@pytest.mark.timeout(60)
def test_cpu_tasks_on_a_cluster_keep_glibcs_reuse_of_freed_blocks(monkeypatch):
    """Dask's nanny starts workers with MALLOC_TRIM_THRESHOLD_ set, which fixes glibc's
    mmap threshold at 128 KiB: every temporary of a contraction is then a fresh mmap
    (1.4x a run on one core). A CPU task on a cluster raises the mmap threshold while
    it runs (once for tasks running together; the trim threshold stays the worker's),
    then puts the worker's back and trims the heap; a process without the setting is
    left alone, and GPU or local graphs are as before."""
    from functools import partial

    from src_dask._graph import tasks

    calls = []

    class Libc:
        def mallopt(self, what, value):
            calls.append((what, value))
            return 1

        def malloc_trim(self, pad):
            calls.append(("trim", pad))
            return 1

    monkeypatch.setattr(tasks._Heap, "libc", Libc())
    monkeypatch.setenv("MALLOC_TRIM_THRESHOLD_", "65536")
    monkeypatch.delenv("MALLOC_MMAP_THRESHOLD_", raising=False)

    def inner():
        assert calls == [(-3, 32 << 20)]  # raised while it runs; the trim threshold kept
        return 7

    assert tasks.with_heap(tasks.with_heap, inner) == 7  # nested: raised once
    # the worker's put back, and the freed heap handed back to the system
    assert calls[1:] == [(-3, 128 << 10), ("trim", 0)]
    calls.clear()
    monkeypatch.delenv("MALLOC_TRIM_THRESHOLD_")
    assert tasks.with_heap(lambda: 8) == 8 and not calls

    def wrapped(addresses, device):
        stack = make_stack((random_mpo(5, 3, seed=1), random_mps(5, 4, seed=2)))
        plan = _plan.Plan(sketch=8, chunk=4, chi_out=8, cutoff=0.0, key=0, round=False,
                           device=device)
        dsk = dict(_graph.build(stack, plan, addresses=addresses).dask)
        qr = [v for k, v in dsk.items() if k[1:2] == ("qr",)]
        return {isinstance(t[0], partial) and t[0].func is tasks.with_heap for t in qr}

    assert wrapped(["w0", "w1"], "cpu") == {True}
    assert wrapped(None, "cpu") == {False}
    assert wrapped(["w0", "w1"], "gpu") == {False}



_FRAGMENT = """
import numpy as np
from src_dask._graph import tasks

def rss():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096

def fragment():  # 1-8 MiB temporaries, every other one live until one above them is made
    keep = [np.ones((1 + i % 8) << 17) for i in range(0, 120, 2)]
    for i in range(120):
        a = np.ones((1 + i % 8) << 17)
        keep.append(a) if i % 2 == 0 else None
    top = np.ones(1 << 17)
    keep.clear()
    return top

base = rss()
top = tasks.with_heap(fragment)
print(rss() - base)
"""


@pytest.mark.timeout(60)
@pytest.mark.skipif(not os.path.exists("/proc/self/statm"), reason="needs Linux's /proc")
def test_a_cpu_task_hands_its_freed_heap_back_to_the_system():
    """A task run with the raised thresholds frees ~250 MB of temporaries under a block
    still live at the heap's top: they go back to the system when it ends, not stay as
    the worker's unmanaged memory (a 400 MB worker paused for good at its threshold)."""
    import subprocess
    import sys

    env = {**os.environ, "MALLOC_TRIM_THRESHOLD_": "65536"}
    out = subprocess.run([sys.executable, "-c", _FRAGMENT], env=env, capture_output=True,
                         text=True, timeout=50, check=True).stdout
    assert int(out) < 32 << 20, f"{int(out) / 2**20:.0f} MiB kept after the task"


@pytest.mark.timeout(60)
def test_a_run_that_is_one_task_uses_the_cores_of_its_workers_host():
    """A whole run as one task goes to the first worker and runs with the threads of
    every worker on that host (idle meanwhile; Dask's nanny starts each with one BLAS
    thread): the BLAS pools are at that count inside the task and put back after."""
    threadpoolctl = pytest.importorskip("threadpoolctl")
    from src_dask._graph import tasks

    info = {"tcp://10.0.0.2:4": {"host": "10.0.0.2", "nthreads": 1},
            "tcp://10.0.0.1:9": {"host": "10.0.0.1", "nthreads": 1},
            "tcp://10.0.0.1:7": {"host": "10.0.0.1", "nthreads": 2}}
    assert _plan.one_task_worker(info) == ("tcp://10.0.0.1:7", 3)

    def blas():
        return {i["num_threads"] for i in threadpoolctl.threadpool_info()
                if i["user_api"] == "blas"}

    before = blas()
    assert tasks.with_threads(3, blas) == {3}
    assert blas() == before

def test_blocks_stay_on_their_worker(cluster_client):
    """Blocks of sketch columns are spread over the cluster, and each block's
    environments stay where they were made: its pass-1 chain and its pieces of
    the pass-2 sketch all run on one worker."""
    from distributed import get_task_stream

    a, x = random_mpo(8, 4, seed=1), random_mps(8, 16, seed=2)
    with get_task_stream(client=cluster_client) as stream:
        y = src_dask.apply(a, x, 40, seed=0, client=cluster_client)
    pass1 = [t for t in stream.data if key_split(t["key"]).startswith("pass1")]
    assert len(pass1) == 2 * 7
    assert len({t["worker"] for t in pass1}) == 2
    by_block: dict[int, set] = {}
    for t in stream.data:
        key = t["key"]
        if key_split(key).startswith("pass1") or (
                key_split(key).startswith("pass2") and key[1] == "sketch"):
            by_block.setdefault(key[-1], set()).add(t["worker"])
    assert sorted(by_block) == [0, 1]
    assert all(len(w) == 1 for w in by_block.values()), by_block
    assert rel_err(y, dense_product(a, x)) <= 1e-12


@pytest.mark.slow  # seconds of wall time: `make test-slow` (CI runs it too)
def test_losing_a_worker_mid_run_gives_the_same_result(tmp_path):
    import threading

    from distributed import Client, LocalCluster

    a, x = random_mpo(30, 4, seed=1), random_mps(30, 48, seed=2)
    ref = src_dask.apply(a, x, 48, seed=3, chunk=12)
    with LocalCluster(n_workers=2, threads_per_worker=1, dashboard_address=":0",
                      local_directory=str(tmp_path)) as cluster, Client(cluster) as client:
        victim = sorted(client.scheduler_info()["workers"])[1]
        result = {}
        run = threading.Thread(target=lambda: result.update(
            y=src_dask.apply(a, x, 48, seed=3, chunk=12, client=client)))
        run.start()

        def pass1_done(dask_scheduler):
            return sum(1 for ts in dask_scheduler.tasks.values()
                       if "pass1_site" in str(ts.key) and ts.state == "memory")

        deadline = time.time() + 60
        while client.run_on_scheduler(pass1_done) < 8 and time.time() < deadline:
            time.sleep(0.01)
        nanny = next(n for n in cluster.workers.values() if n.worker_address == victim)
        os.kill(nanny.process.process.pid, signal.SIGKILL)  # the worker dies mid-run
        run.join(120)
        assert victim not in client.scheduler_info()["workers"]
    for c, c0 in zip(result["y"], ref, strict=True):
        assert np.abs(c - c0).max() <= 1e-12 * np.abs(c0).max()


def test_inputs_are_loaded_two_sites_ahead_not_all_at_once():
    """Loading tasks have no inputs, so idle threads would run them all at the start
    and hold every core in (device) memory; each waits for the step two sites back."""
    from dask.core import get_dependencies

    dsk = dict(_graph.build(make_stack((random_mpo(8, 3, seed=1), random_mps(8, 4, seed=2))),
                            _plan.Plan(sketch=6, chunk=3, chi_out=6, cutoff=0.0, key=0,
                                        round=False, z_block_bytes=1)).dask)

    def step_of(key: tuple) -> tuple[str, object]:
        return key_split(key), key[1]

    for key in dsk:
        if isinstance(key, tuple) and key_split(key).startswith("load_site"):
            site = int(key_split(key).removeprefix("load_site"))
            deps = {step_of(d) for d in get_dependencies(dsk, key) if isinstance(d, tuple)
                    and "_site" in key_split(d)}
            if 2 <= site < 7:  # prepared once for both passes (in-memory inputs)
                assert deps == {(f"pass1_site{site - 2}", 0)}, (key, deps)
            else:  # pass 1 starts with sites 0 and 1; site 7 is pass 2's first
                assert deps == set()


def test_zarr_inputs_are_read_two_sites_ahead_in_each_pass(tmp_path):
    from dask.core import get_dependencies

    src_dask.save(random_mpo(8, 3, seed=1), tmp_path / "a")
    src_dask.save(random_mps(8, 4, seed=2), tmp_path / "x")
    stack = make_stack((src_dask.open(tmp_path / "a"), src_dask.open(tmp_path / "x")))
    dsk = dict(_graph.build(stack, _plan.Plan(sketch=6, chunk=3, chi_out=6, cutoff=0.0, key=0,
                                                round=False, z_block_bytes=1)).dask)
    for key in dsk:
        if isinstance(key, tuple) and key_split(key).startswith("load_site"):
            site, sweep = int(key_split(key).removeprefix("load_site")), key[1]
            reads = [d for d in get_dependencies(dsk, key) if key_split(d) == "src_read"]
            gates = {(key_split(d), d[1]) for d in get_dependencies(dsk, reads[0])
                     if isinstance(d, tuple) and "_site" in key_split(d)}
            if sweep == 1 and site >= 2:
                assert gates == {(f"pass1_site{site - 2}", 0)}
            elif sweep == 2 and site + 2 < 8:
                assert gates == {(f"pass2_site{site + 2}", "core")}
            else:
                assert gates == set()


def test_row_blocks_of_z_spread_over_the_workers(cluster_client, monkeypatch):
    """On a cluster, a projected core in row blocks is made on every worker, and the
    result is the one of a single process."""
    from distributed import get_task_stream

    monkeypatch.setitem(dask.config.config["src_dask"], "projection-block-size", 16 * 200)
    trains = (random_mpo(6, 3, phys=3, seed=1), random_mps(6, 6, phys=3, seed=2))
    ref = src_dask.src(*trains, chi_out=12, seed=1)
    with get_task_stream(client=cluster_client) as stream:
        y = src_dask.src(*trains, chi_out=12, seed=1, client=cluster_client)
    projects = [t for t in stream.data if t["key"][1:2] == ("project",)]
    assert len({t["worker"] for t in projects}) == 2
    for c, c0 in zip(y, ref, strict=True):
        assert np.abs(c - c0).max() <= 1e-12 * np.abs(c0).max()


@pytest.mark.slow  # seconds of wall time: `make test-slow` (CI runs it too)
def test_lookahead_keeps_a_few_sites_of_inputs_in_flight():
    """Reads run ahead of their use by as many sites as fit in twice the block size
    (2 to 8): the reference stacks read 8 (D_M=1000) and 4 (D_M=2000) ahead."""
    from src_dask import problems

    plan = _plan.Plan(sketch=8, chunk=8, chi_out=8, cutoff=0.0, key=0, round=False,
                       z_block_bytes=2 << 30)
    for dm, ahead in ((1000, 8), (2000, 4), (30000, 2)):
        stack = make_stack(tuple(problems.stack(sites=4, dm=dm).values()))
        assert _plan.lookahead(stack, plan) == ahead, dm


def test_in_memory_inputs_travel_once_in_the_graph():
    """An in-memory core rides inside the one task that loads it; where several GPU
    workers each load their own copy, it is one data key they share, so the graph
    carries every input once."""
    trains = (random_mpo(6, 3, seed=1), random_mps(6, 4, seed=2))
    stack = make_stack(trains)

    def embedded(dsk):
        """How many times each input core object appears in the graph's tasks."""
        found = {id(c): 0 for t in trains for c in t}

        def walk(x):
            if id(x) in found and isinstance(x, np.ndarray):
                found[id(x)] += 1
            elif isinstance(x, (tuple, list)):
                for y in x:
                    walk(y)
        for task in dsk.values():
            walk(task)
        return found

    for device, addresses, data_keys in (("cpu", None, 0), ("gpu", ["w0", "w1"], 12)):
        plan = _plan.Plan(sketch=8, chunk=4, chi_out=8, cutoff=0.0, key=0, round=False,
                           device=device)
        dsk = dict(_graph.build(stack, plan, addresses=addresses).dask)
        assert set(embedded(dsk).values()) == {1}, device
        shared = [k for k in dsk if key_split(k) == "src_input"]
        assert len(shared) == data_keys, device
        if shared:  # both workers' loads of a core use its one data key
            from dask.core import get_dependencies

            users = [k for k in dsk if key_split(k).startswith("load_site")
                     and shared[0] in get_dependencies(dsk, k)]
            assert len(users) == 2


def test_several_gpus_read_their_own_inputs_and_run_pass_2_on_one(tmp_path):
    """On several GPU workers over TCP each worker reads the Zarr cores its blocks use
    (no core moves between GPUs), and without the split (pass2-split false) pass 2
    runs on the first worker, which fetches the other workers' blocks of C_j a few
    sites ahead of their use."""
    from dask.core import get_dependencies

    src_dask.save(random_mpo(6, 3, seed=1), tmp_path / "a")
    src_dask.save(random_mps(6, 4, seed=2), tmp_path / "x")
    stack = make_stack((src_dask.open(tmp_path / "a"), src_dask.open(tmp_path / "x")))
    plan = _plan.Plan(sketch=8, chunk=4, chi_out=8, cutoff=0.0, key=0, round=False,
                       device="gpu", z_block_bytes=1)
    with dask.config.set({"src_dask.pass2-split": False}):
        graph = _graph.build(stack, plan, addresses=["w0", "w1"])
    dsk = dict(graph.dask)
    where = {k: f(k) for layer in graph.dask.layers.values()
             for k, f in ((k, (layer.annotations or {}).get("workers")) for k in layer)
             if callable(f)}
    token = next(k for k in dsk if isinstance(k, str) and k.startswith("src_result-"))[11:]

    def deps(key, prefix):
        return {d for d in get_dependencies(dsk, key) if key_split(d).startswith(prefix)}

    for j in range(5):  # block c's chain uses the loads of worker c
        for c in (0, 1):
            loads = deps((f"pass1_site{j}-{token}", c), "load_site")
            assert loads and {where[k] for k in loads} == {["w0", "w1"][c]}
            for load in loads:  # read where it is prepared: no raw core crosses workers
                reads = deps(load, "src_read")
                assert len(reads) == 1 and where[reads.pop()] == where[load]
    for j in range(1, 6):
        steps = [k for k in dsk if key_split(k) == f"pass2_site{j}"
                 and k[1] in ("project", "sketch", "qr", "update", "fetch")]
        assert {where[k] for k in steps} == {"w0"}
        fetch = (f"pass2_site{j}-{token}", "fetch", 1)
        # on a GPU one sketch task per row block of Z, against every block of C_j
        piece = (f"pass2_site{j}-{token}", "sketch", 0)
        if j == 5:  # Z of the last site is whole: its QR task makes the pieces itself
            assert piece not in dsk and fetch in deps((f"pass2_site{j}-{token}", "qr"), "pass2")
        else:
            assert fetch in dsk and deps(piece, "pass2") == {
                fetch, (f"pass2_site{j}-{token}", "project", 0)}
        if j + 2 < 6:  # fetched two sites ahead (z_block_bytes=1), not at the start
            assert deps(fetch, "src_after") == {(f"src_after-{token}",
                                                 f"pass2_site{j + 2}-{token}", "core")}


def test_pass_2_on_one_worker_gives_the_same_result(cluster_client, monkeypatch):
    """The several-GPU layout (own reads per worker, pass 2 on the first worker,
    fetched blocks of C_j), run on two CPU workers, gives the single-process result."""
    from distributed import get_task_stream

    monkeypatch.setattr(_plan, "input_groups", lambda device, workers: max(1, workers))
    trains = (random_mpo(6, 3, phys=3, seed=1), random_mps(6, 6, phys=3, seed=2))
    ref = src_dask.src(*trains, chi_out=12, seed=1)
    with get_task_stream(client=cluster_client) as stream:
        y = src_dask.src(*trains, chi_out=12, seed=1, client=cluster_client, chunk=6)
    ran = {}
    for t in stream.data:
        ran.setdefault(t["key"][1:2] if key_split(t["key"]).startswith("pass2") else
                       key_split(t["key"])[:5], set()).add(t["worker"])
    assert len(ran["pass1"]) == 2 and len(ran[("fetch",)]) == 1
    assert ran[("qr",)] == ran[("fetch",)] == ran[("project",)]
    for c, c0 in zip(y, ref, strict=True):
        assert np.abs(c - c0).max() <= 1e-12 * np.abs(c0).max()


def test_cores_come_back_one_by_one_and_nothing_stays_on_the_cluster(cluster_client):
    """On a cluster each output core is fetched when it is final (one future per core,
    not one list at the end), and the run leaves no task or data on the scheduler."""
    from distributed import get_task_stream

    a, x = random_mpo(6, 3, seed=1), random_mps(6, 4, seed=2)
    with get_task_stream(client=cluster_client) as stream:
        y = src_dask.apply(a, x, 12, seed=0, client=cluster_client)
    assert rel_err(y, dense_product(a, x)) <= 1e-12
    assert not [t for t in stream.data if key_split(t["key"]) == "src_result"]
    deadline = time.time() + 10
    while cluster_client.run_on_scheduler(lambda dask_scheduler: len(dask_scheduler.tasks)):
        assert time.time() < deadline, "tasks left on the scheduler"
        time.sleep(0.05)


def _where(graph) -> dict:
    """The worker each pinned task of ``graph`` prefers."""
    return {k: f(k) for layer in graph.dask.layers.values()
            for k, f in ((k, (layer.annotations or {}).get("workers")) for k in layer)
            if callable(f)}


def _deps(dsk, key) -> set:
    from dask.core import get_dependencies

    return set(get_dependencies(dsk, key))


def _split_graph(n=7, addresses=("w0", "w1"), sketch=8, chunk=4, z_block_bytes=1,
                 device="cpu"):
    stack = make_stack((random_mpo(n, 3, seed=1), random_mps(n, 4, seed=2)))
    plan = _plan.Plan(sketch=sketch, chunk=chunk, chi_out=8, cutoff=0.0, key=0, round=False,
                       device=device, z_block_bytes=z_block_bytes)
    with dask.config.set({"src_dask.pass2-split": True}):
        graph = _graph.build(stack, plan, addresses=list(addresses))
    return stack, plan, graph


@pytest.mark.parametrize("workers", [2, 3, 4])
def test_split_pass_2_moves_one_environment_a_site(workers):
    """Pass 2 split by rows of Z (config pass2-split): each worker projects, sketches
    and updates its own rows. Per site a worker receives the blocks of C_j it did
    not make in pass 1 ((W-1)/W of C_j, copied ahead of use), and the shares of S
    for its rows; the sketch goes to the QR. Z never moves."""
    names = tuple(f"w{i}" for i in range(workers))
    stack, plan, graph = _split_graph(addresses=names, sketch=9, chunk=3)
    dsk, where = dict(graph.dask), _where(graph)
    token = next(k for k in dsk if isinstance(k, str) and k.startswith("src_result-"))[11:]
    for j in range(1, stack.n - 1):
        name = f"pass2_site{j}-{token}"
        owners = {where[k] for k in dsk if isinstance(k, tuple) and k[0] == name
                  and k[1] == "project"}
        assert owners == set(names)  # every worker projects rows of Z_j
        left = int(np.prod(stack.left_bonds(j))) * stack.dtype.itemsize
        for w in names:
            fetched = [k for k in dsk if isinstance(k, tuple) and k[0] == name
                       and k[1] == "fetch" and where[k] == w]
            columns = sum(plan.blocks[k[2]][1] - plan.blocks[k[2]][0] for k in fetched)
            own = sum(b - a for c, (a, b) in enumerate(plan.blocks) if c % workers == int(w[1:]))
            assert len(set(fetched)) == len(fetched)  # each block once
            assert columns * left == (plan.sketch - own) * left  # all of C_j but its own
            if j + plan_ahead(stack, plan) < stack.n:  # copied ahead of use, not at once
                for k in fetched:
                    assert any(isinstance(d, tuple) and d[2:] == ("core",)
                               for d in _deps(dsk, k))
        for key in dsk:  # Z never leaves the worker that made it
            if isinstance(key, tuple) and key[0] == name:
                for d in _deps(dsk, key):
                    if isinstance(d, tuple) and d[0] == name and d[1] == "project":
                        assert where[d] == where[key], (key, d)
        # each worker sends its share of S_{j-1} to every worker projecting rows there
        after = {where[k] for k in dsk if isinstance(k, tuple)
                 and k[0] == f"pass2_site{j - 1}-{token}" and k[1] == "project"}
        shares = [k for k in dsk if isinstance(k, tuple) and k[0] == name
                  and k[1] == "update"]
        assert {(where[k], names[k[3]]) for k in shares} == {(w, h) for w in names
                                                            for h in after}
        # every worker makes eta_j from all the sketch pieces, and its shares use its
        # own: eta_j never travels (one hop a site fewer on the critical path)
        sketches = {k for k in dsk if isinstance(k, tuple) and k[0] == name
                    and k[1] == "sketch"}
        qrs = {where[k]: k for k in dsk if isinstance(k, tuple) and k[0] == name
               and k[1] == "qr"}
        assert set(qrs) == set(names)
        for k in qrs.values():
            assert {d for d in _deps(dsk, k) if d[1] == "sketch"} == sketches
        for k in shares:
            assert {d for d in _deps(dsk, k) if d[1] == "qr"} == {qrs[where[k]]}


def plan_ahead(stack, plan) -> int:
    return _plan.lookahead(stack, plan)


def test_split_pass_2_copies_inputs_over_a_fast_link():
    """On GPU workers linked by UCX each site's cores are read once (site j by worker
    j % W) and copied to the others; over TCP every worker reads its own."""
    for scheme, reads in (("ucx", 1), ("tcp", 2)):
        _, _, graph = _split_graph(addresses=(f"{scheme}://a:1", f"{scheme}://b:2"),
                                   device="gpu")
        dsk, where = dict(graph.dask), _where(graph)
        loads = [k for k in dsk if isinstance(k, tuple) and key_split(k).startswith("load_site")]
        for j in range(7):
            own = [k for k in loads if key_split(k) == f"load_site{j}" and "copy" not in k]
            # two trains; the last site is used by worker 0 only (Z has one row there)
            assert len(own) == 2 * (1 if j == 6 else reads)
            if scheme == "ucx":
                assert {where[k] for k in own} == {[f"{scheme}://a:1", f"{scheme}://b:2"][j % 2]}
                copies = [k for k in loads if key_split(k) == f"load_site{j}" and "copy" in k]
                # the last site is projected by worker 0 alone (Z has one row there)
                assert len(copies) == (2 if j < 6 or j % 2 else 0)
                assert all(where[k] != where[own[0]] for k in copies)


def test_reads_and_copies_ahead_of_use_wait_on_signals():
    """Reads, copies and fetches ahead of use are paced by steps on other workers
    (pass-1 blocks, output cores) through a signal of None made where the step ran:
    waiting on the step itself moved its result to them for nothing."""
    for scheme in ("ucx", "tcp"):
        names = (f"{scheme}://a:1", f"{scheme}://b:2")
        _, _, graph = _split_graph(addresses=names, device="gpu")
        dsk, where = dict(graph.dask), _where(graph)
        pacers = [k for k in dsk if isinstance(k, tuple)
                  and (key_split(k).startswith("load_site") or key_split(k) == "src_read"
                       or k[1:2] == ("fetch",))]
        assert pacers
        for k in pacers:  # (func, what it reads, copies or fetches, after)
            after = dsk[k][-1]
            assert after is None or key_split(after) == "src_after", (k, after)
        paced_by = {keys.step_of(key_split(s[1:]))[0] for s in dsk
                    if key_split(s) == "src_after"}
        assert paced_by == {"pass1", "pass2"}
        signals = [k for k in dsk if key_split(k) == "src_after"]
        assert signals
        for s in signals:
            (step,) = _deps(dsk, s)
            assert s[1:] == step and where.get(s) == where.get(step)
            assert dsk[s][0](None) is None  # carries nothing


@pytest.mark.parametrize("options", [dict(chunk=6), dict(chunk=4, z=1),
                                     dict(chunk=5, z=1, cutoff=1e-3)])
def test_split_pass_2_gives_the_same_result(cluster_client, options):
    """The split run on two workers (standing in for GPUs) gives the cores of the
    one-process run to rounding (the sum of S runs in another order), with Z whole or
    in row blocks and with a cutoff; every worker projects and updates rows."""
    from distributed import get_task_stream

    trains = (random_mpo(6, 3, phys=3, seed=1), random_mps(6, 6, phys=3, seed=2))
    run = dict(chi_out=12, seed=1, chunk=options["chunk"], cutoff=options.get("cutoff", 0.0))
    settings = {"src_dask.pass2-split": True}
    if "z" in options:
        settings["src_dask.projection-block-size"] = options["z"]
    cluster_client.wait_for_workers(2, timeout=60)  # the split needs both
    with dask.config.set(settings):
        ref = src_dask.src(*trains, **run)
        with get_task_stream(client=cluster_client) as stream:
            y = src_dask.src(*trains, client=cluster_client, **run)
    ran = {}
    for t in stream.data:
        if key_split(t["key"]).startswith("pass2"):
            ran.setdefault(t["key"][1], set()).add(t["worker"])
    workers = {step: len(w) for step, w in ran.items()}  # named in a failure
    assert workers.get("project") == workers.get("update") == workers.get("qr") == 2, workers
    assert [c.shape for c in y] == [c.shape for c in ref]
    for c, c0 in zip(y, ref, strict=True):
        assert np.abs(c - c0).max() <= 1e-12 * np.abs(c0).max()


def test_split_pass_2_on_four_workers_gives_the_same_result():
    """Four workers standing in for four GPUs: every one projects and updates rows of
    Z, and runs the QR, and the cores are the one-process run's to rounding."""
    from distributed import Client, LocalCluster, get_task_stream

    trains = (random_mpo(7, 3, phys=2, seed=3), random_mps(7, 8, phys=2, seed=4))
    run = dict(chi_out=16, seed=2, chunk=4)
    with dask.config.set({"src_dask.pass2-split": True}):
        ref = src_dask.src(*trains, **run)
        with LocalCluster(n_workers=4, threads_per_worker=1, processes=False,
                          dashboard_address=None) as cluster, \
                Client(cluster, set_as_default=False) as client, \
                get_task_stream(client=client) as stream:
            y = src_dask.src(*trains, client=client, **run)
    ran = {}
    for t in stream.data:
        if key_split(t["key"]).startswith("pass2"):
            ran.setdefault(t["key"][1], set()).add(t["worker"])
    workers = {step: len(w) for step, w in ran.items()}
    assert workers.get("project") == workers.get("update") == 4, workers
    for c, c0 in zip(y, ref, strict=True):
        assert np.abs(c - c0).max() <= 1e-12 * np.abs(c0).max()


def test_split_pass_2_resumes_from_its_checkpoint(tmp_path, monkeypatch):
    """A split run that fails in pass 2 leaves a checkpoint (S summed from the
    workers' shares); the rerun does only the sites left and gives the same cores."""
    from distributed import Client, LocalCluster

    from src_dask._graph import tasks

    trains = (random_mpo(7, 3, phys=3, seed=1), random_mps(7, 6, phys=3, seed=2))
    ref = src_dask.src(*trains, chi_out=12, seed=1, chunk=4)
    original, calls = tasks.pass2_step, []

    def checkpointed() -> bool:  # site 6 (at least) written to the store's progress
        import zarr

        try:
            return zarr.open_group(tmp_path / "run/progress", mode="r").attrs.get(
                "pass2_next", 6) < 6
        except (FileNotFoundError, KeyError, ValueError):
            return False

    def failing(*args, site, **kwargs):
        calls.append(site)
        if site == 3 and fail:
            deadline = time.monotonic() + 20  # the checkpoint's tasks run beside this one
            while not checkpointed() and time.monotonic() < deadline:
                time.sleep(0.05)
            raise RuntimeError("stop at site 3")
        return original(*args, site=site, **kwargs)

    monkeypatch.setattr(tasks, "pass2_step", failing)
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=False,
                      dashboard_address=None) as cluster, Client(cluster) as client, \
            dask.config.set({"src_dask.pass2-split": True,
                             "src_dask.projection-block-size": 1}):
        fail = True
        with pytest.raises(RuntimeError, match="stop at site 3"):
            src_dask.src(*trains, chi_out=12, seed=1, chunk=4, client=client,
                         store=tmp_path / "run")
        import zarr

        # tasks of the failed run already under way (cancelled ones too, whose threads
        # run to their end) may still checkpoint a site: the progress to resume from is
        # what the store holds once they are done
        def busy() -> bool:
            running = client.run(lambda dask_worker: dask_worker.state.executing_count)
            return any(client.processing().values()) or any(running.values())

        deadline = time.monotonic() + 20
        while busy() and time.monotonic() < deadline:
            time.sleep(0.05)
        saved = zarr.open_group(tmp_path / "run/progress", mode="r").attrs["pass2_next"]
        assert saved < 6  # site 6 (at least) was checkpointed before site 3 failed
        fail, calls[:] = False, []
        y = src_dask.src(*trains, chi_out=12, seed=1, chunk=4, client=client,
                         store=tmp_path / "run")
        # only the sites left (each worker makes eta_j: a site per worker)
        assert sorted(set(calls)) == list(range(1, saved + 1))
        for c, c0 in zip(y, ref, strict=True):
            assert np.abs(np.asarray(c) - c0).max() <= 1e-12 * np.abs(c0).max()


@pytest.mark.parametrize("limit", ["6 MiB", "12 MiB", "30 MiB"])
@pytest.mark.parametrize("client", [False, True])
def test_tight_memory_plans_give_the_same_cores(limit, client, cluster_client):
    """Budgets that cut Z in blocks, unfuse some sites and not others, or fit all:
    the same cores as an unbounded run (threads and a cluster)."""
    from src_dask import problems

    trains = (problems.random_mpo(12, 8, 2, seed=1), problems.random_mpo(12, 8, 2, seed=2),
              problems.random_mps(12, 8, 2, seed=3))
    ref = src_dask.src(*trains, chi_out=48, seed=2)
    with dask.config.set({"src_dask.memory-limit": limit}):
        y = src_dask.src(*trains, chi_out=48, seed=2,
                         client=cluster_client if client else None)
    for c, c0 in zip(y, ref, strict=True):
        assert np.abs(c - c0).max() <= 1e-12 * np.abs(c0).max()


@pytest.mark.parametrize("limit", ["100 KiB", "200 KiB"])
@pytest.mark.parametrize("where", ["threads", "cluster", "store"])
def test_an_environment_no_task_may_hold_is_summed_in_row_blocks(limit, where, cluster_client,
                                                                 tmp_path):
    """Budgets below one environment sum of pass 2: S_{j-1} is summed in the row blocks
    of Z_{j-1}, one running sum each, and each block of Z_{j-1} is projected from its
    own rows (no task holds S_{j-1} whole; it was a PlanError): the cores of an
    unbounded run, on threads, a cluster and with a run store."""
    from src_dask import problems
    from src_dask._stack import make_stack

    trains = (problems.random_mpo(8, 4, 2, seed=1), problems.random_mpo(8, 4, 2, seed=2),
              problems.random_mps(8, 8, 2, seed=3))
    ref = src_dask.src(*trains, chi_out=40, seed=2)
    with dask.config.set({"src_dask.memory-limit": limit}):
        stack = make_stack(trains)
        p, _ = _api._plan_for(stack, 40, 0, 0.0, None, None)  # as src plans it on threads
        sweep = _plan.SweepPlan.decide(stack, p, None)
        cut = [j for j in range(stack.n) if sweep.cut_env[j]]
        assert cut
        for j in cut:  # each block of S_{j-1} within half of one task's share: the
            # blocks' sums run side by side
            q = math.ceil(_plan.z_rows(stack, p, j - 1) / sweep.env_sums[j])
            left = math.prod(stack.left_bonds(j))
            assert 2 * q * left * 16 <= _plan.kind_bytes(p, "update", cut=True) \
                == p.task_bytes
        y = src_dask.src(*trains, chi_out=40, seed=2,
                         client=cluster_client if where == "cluster" else None,
                         store=tmp_path / "run" if where == "store" else None)
    for c, c0 in zip(y, ref, strict=True):
        c = np.asarray(c)
        assert np.abs(c - c0).max() <= 1e-12 * np.abs(c0).max()


def test_a_run_whose_environments_are_summed_in_row_blocks_resumes(monkeypatch, tmp_path):
    """With a run store, each row block of S_{j-1} saves its own rows (no task holds it
    whole); a run stopped in pass 2 resumes from the last complete checkpoint: pass 1
    is not done again, and the cores are the unbounded run's."""
    from src_dask import _kernels as K
    from src_dask import problems
    from src_dask._graph import tasks

    trains = (problems.random_mpo(8, 4, 2, seed=1), problems.random_mpo(8, 4, 2, seed=2),
              problems.random_mps(8, 8, 2, seed=3))
    ref = src_dask.src(*trains, chi_out=40, seed=2)
    original = tasks.project

    def failing(cores, env, *, site, **kw):
        if site == 2:
            raise RuntimeError("stopped at site 2")
        return original(cores, env, site=site, **kw)

    rows_saved = []
    save_rows = tasks.checkpoint_rows
    monkeypatch.setattr(tasks, "checkpoint_rows", lambda *a, **k: rows_saved.append(1) or
                        save_rows(*a, **k))
    with dask.config.set({"src_dask.memory-limit": "100 KiB"}):
        monkeypatch.setattr(tasks, "project", failing)
        with pytest.raises(RuntimeError, match="stopped at site 2"):
            src_dask.src(*trains, chi_out=40, seed=2, store=tmp_path / "run")
        monkeypatch.setattr(tasks, "project", original)
        steps = []
        sketch_step = K.sketch_step
        monkeypatch.setattr(K, "sketch_step", lambda *a, **k: steps.append(1) or
                            sketch_step(*a, **k))
        y = src_dask.src(*trains, chi_out=40, seed=2, store=tmp_path / "run")
    assert not steps  # pass 1 was done by the stopped run
    assert rows_saved  # S_{j-1} was saved by row blocks
    for c, c0 in zip(y, ref, strict=True):
        c = np.asarray(c)
        assert np.abs(c - c0).max() <= 1e-12 * np.abs(c0).max()


@pytest.mark.parametrize("z_block_bytes", [1, 2**30])  # Z in row blocks, or whole
def test_environments_in_host_memory_and_sketches_by_row_block_give_the_same_cores(
        monkeypatch, z_block_bytes):
    """A GPU run's layout (``Plan.host_envs``: pass 1 copies the first sites'
    environments to host memory, pass 2 fetches each back two sites ahead; one sketch
    task per row block of Z against every block of C_j), run on the CPU with the
    copies counted: the same cores as the plain layout, bit for bit, each of those
    environments copied out and back once per block, no others."""
    trains = (random_mpo(7, 3, phys=3, seed=1), random_mps(7, 6, phys=3, seed=2))
    stack = make_stack(trains)
    plan = _plan.Plan(sketch=10, chunk=4, chi_out=10, cutoff=0.0, key=_random.seed_key(3),
                      round=False, z_block_bytes=z_block_bytes)
    ref = _graph.build(stack, plan).compute(scheduler="sync")
    copies = {"out": [], "back": []}
    monkeypatch.setattr(_graph.tasks, "to_host",
                        lambda x: copies["out"].append(x.shape) or x.copy())
    monkeypatch.setattr(_graph.tasks, "fetch",
                        lambda x, after=None, device="gpu":
                        copies["back"].append(x.shape) or x.copy())
    monkeypatch.setattr(_plan.Pass2, "of_run", classmethod(
        lambda cls, device, n_workers: cls.ONE_GPU))
    host = dataclasses.replace(plan, host_envs=4)
    graph = _graph.build(stack, host)
    dsk = dict(graph.dask)
    token = keys.token_of(graph.key)
    fetches = [k for k in dsk if isinstance(k, tuple) and k[1:2] == ("fetch",)]
    assert sorted({int(key_split(k[0])[10:]) for k in fetches}) == [1, 2, 3, 4]
    # C_1 waits for the QR of site 3 (two sites ahead), not for nothing
    fetch = (f"pass2_site1-{token}", "fetch", 0)
    assert (f"pass2_site3-{token}", "core") in dsk[fetch][1:]
    if z_block_bytes == 1:  # one sketch task per row block of Z, no task per pair
        sketches = [k for k in dsk if isinstance(k, tuple) and k[1:2] == ("sketch",)]
        assert sketches and all(len(k) == 3 for k in sketches)
    y = graph.compute(scheduler="sync")
    assert all(np.array_equal(p, q) for p, q in zip(y, ref, strict=True))
    blocks = len(plan.blocks)
    assert len(copies["out"]) == len(copies["back"]) == 4 * blocks
    assert sorted(copies["out"]) == sorted(copies["back"])


@pytest.mark.parametrize("gpu_layout", [False, True])
@pytest.mark.parametrize("task_bytes", [20_000, 10_000])  # S summed whole, or in blocks
def test_projected_cores_made_twice_give_the_same_cores(monkeypatch, gpu_layout, task_bytes):
    """``Plan.reproject`` (a device that cannot keep ``Z``): no task keeps a row block of
    ``Z``; each block's sketch projects it, and each sum of ``S_{j-1}`` projects it
    again (once per block of ``S_{j-1}`` where that is cut). The cores equal those of
    the run that keeps ``Z``, with the CPU's layout and with a GPU's (one sketch task
    per row block against all of ``C_j``, one task for the sum through the blocks)."""
    trains = (random_mpo(7, 3, phys=3, seed=1), random_mps(7, 6, phys=3, seed=2))
    stack = make_stack(trains)
    plan = _plan.Plan(sketch=10, chunk=4, chi_out=10, cutoff=0.0, key=_random.seed_key(3),
                      round=False, task_bytes=task_bytes, threads=1)
    ref = _graph.build(stack, plan).compute(scheduler="sync")
    if gpu_layout:
        monkeypatch.setattr(_plan.Pass2, "of_run", classmethod(
            lambda cls, device, n_workers: cls.ONE_GPU))
    again = dataclasses.replace(plan, reproject=True)
    sweep = _plan.SweepPlan.decide(stack, again, None)
    assert any(sweep.cut_env) is (task_bytes == 10_000)
    # S_{j-1} in fewer sums than Z_{j-1} has row blocks: each sum over a group of them
    assert any(1 < e < sweep.z_blocks[j - 1] for j, e in enumerate(sweep.env_sums)) \
        is (task_bytes == 10_000)
    graph = _graph.build(stack, again)
    dsk = dict(graph.dask)
    projected = [k for k in dsk if isinstance(k, tuple) and k[1:2] == ("project",)]
    assert {key_split(k[0]) for k in projected} == {"pass2_site0"}  # Z_0: the first core
    # a GPU (all of pass 2 in one place) sums S_{j-1} in one task per block of it, not
    # one per row block of Z_j; Dask's threads keep a task per row block
    for j in range(1, stack.n):
        updates = [k for k in dsk if isinstance(k, tuple) and k[1:2] == ("update",)
                   and key_split(k[0]) == f"pass2_site{j}"]
        sums = sweep.env_sums[j]
        assert len(updates) == sums * (1 if gpu_layout else sweep.z_blocks[j]), (j, updates)
    calls: dict[int, int] = {}
    original = _graph.tasks.project

    def counted(cores, env, *, site, **kwargs):
        calls[site] = calls.get(site, 0) + 1
        return original(cores, env, site=site, **kwargs)

    monkeypatch.setattr(_graph.tasks, "project", counted)
    y = graph.compute(scheduler="sync")
    for c, c0 in zip(y, ref, strict=True):
        assert c.shape == c0.shape
        assert np.abs(c - c0).max() <= 1e-12 * np.abs(c0).max()
    for j in range(1, stack.n):
        sums = sweep.env_sums[j]
        assert calls[j] == sweep.z_blocks[j] * (1 + sums), (j, calls)


def _disk_layout(monkeypatch, tmp_path):
    """A GPU run's layout with environments in host memory and on disk, run on the
    CPU: pinned buffers and device copies are plain NumPy ones here; files go to
    ``tmp_path`` (Dask's temporary directory, where a task outside a worker writes)."""
    from src_dask import _transfer

    monkeypatch.setattr(_transfer, "empty_pinned", lambda shape, dtype: np.empty(shape, dtype))
    copies = {"host": 0, "disk": 0, "back": 0}
    to_disk = _transfer.to_disk

    def written(x, run, name):
        copies["disk"] += 1
        return to_disk(x, run, name)

    monkeypatch.setattr(_transfer, "to_disk", written)
    monkeypatch.setattr(_transfer, "to_device",
                        lambda x: copies.__setitem__("back", copies["back"] + 1) or x.copy())
    monkeypatch.setattr(_graph.tasks, "to_host",
                        lambda x: copies.__setitem__("host", copies["host"] + 1) or x.copy())
    monkeypatch.setattr(_plan.Pass2, "of_run", classmethod(
        lambda cls, device, n_workers: cls.ONE_GPU))
    fetch = _graph.tasks.fetch  # as on a GPU: through (stand-in) device copies
    monkeypatch.setattr(_graph.tasks, "fetch",
                        lambda x, after=None, device="gpu": fetch(x, after, device="gpu"))
    monkeypatch.setitem(dask.config.config, "temporary-directory", str(tmp_path))
    return copies


def test_environments_written_to_disk_give_the_same_cores(monkeypatch, tmp_path):
    """``Plan.disk_envs``: of the environments a GPU run sends to host memory, the first
    sites' go on to the worker's disk (written by pass 1's tasks, read back by pass 2's
    fetches two sites ahead). The cores equal the plain layout's bit for bit; each of
    those environments is written once per block and read back once, the others copied
    to host memory, and no file is left behind."""
    trains = (random_mpo(7, 3, phys=3, seed=1), random_mps(7, 6, phys=3, seed=2))
    stack = make_stack(trains)
    plan = _plan.Plan(sketch=10, chunk=4, chi_out=10, cutoff=0.0, key=_random.seed_key(3),
                      round=False)
    ref = _graph.build(stack, plan).compute(scheduler="sync")
    copies = _disk_layout(monkeypatch, tmp_path)
    graph = _graph.build(stack, dataclasses.replace(plan, host_envs=4, disk_envs=2))
    dsk = dict(graph.dask)
    token = keys.token_of(graph.key)
    # C_1 (on disk) is read back once the QR of site 3 is done, not before
    assert (f"pass2_site3-{token}", "core") in dsk[(f"pass2_site1-{token}", "fetch", 0)][1:]
    y = graph.compute(scheduler="sync")
    assert all(np.array_equal(p, q) for p, q in zip(y, ref, strict=True))
    blocks = len(plan.blocks)
    assert copies == {"disk": 2 * blocks, "host": 2 * blocks, "back": 4 * blocks}
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("depth", [1, 2])
def test_a_cpu_run_writes_the_environments_it_does_not_keep_and_reads_them_once(
        monkeypatch, tmp_path, depth):
    """A CPU run's ``Plan.disk_envs`` (as many as ``host_envs``: no copy in between):
    pass 1's tasks write the first sites' environments to disk, pass 2's fetches read
    each back once, in host memory; the cores equal the plain layout's bit for bit and
    no file is left behind."""
    from src_dask import _transfer

    trains = (*[random_mpo(7, 2, phys=3, seed=s) for s in range(1, depth + 1)],
              random_mps(7, 5, phys=3, seed=9))
    stack = make_stack(trains)
    plan = _plan.Plan(sketch=10, chunk=4, chi_out=10, cutoff=0.0, key=_random.seed_key(3),
                      round=False)
    ref = _graph.build(stack, plan).compute(scheduler="sync")
    monkeypatch.setitem(dask.config.config, "temporary-directory", str(tmp_path))
    counts = {"written": 0, "read": 0}
    to_disk, from_disk = _transfer.to_disk, _transfer.from_disk

    def written(x, run, name):
        assert isinstance(x, np.ndarray)
        counts["written"] += 1
        return to_disk(x, run, name)

    def read(d, device):
        assert device is False  # into host memory: there is no device
        counts["read"] += 1
        return from_disk(d, device)

    monkeypatch.setattr(_transfer, "to_disk", written)
    monkeypatch.setattr(_transfer, "from_disk", read)
    monkeypatch.setattr(_transfer, "to_device", lambda x: pytest.fail("a copy to a device"))
    y = _graph.build(stack, dataclasses.replace(plan, host_envs=3, disk_envs=3)).compute(
        scheduler="sync")
    assert all(np.array_equal(p, q) for p, q in zip(y, ref, strict=True))
    assert counts == {"written": 3 * len(plan.blocks), "read": 3 * len(plan.blocks)}
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("copies", [False, True])
def test_environments_every_worker_fetches_stay_in_host_memory(monkeypatch, tmp_path, copies):
    """Pass 2 split by rows fetches every block of ``C_j`` on each worker that owns rows:
    a file is removed as it is read, so those blocks are not written to disk (they stay
    in host memory, to travel), whatever ``Plan.disk_envs`` says; the cores are those
    of the plain layout, on a CPU and in a GPU run's layout."""
    from src_dask import _transfer

    stack, plan, graph = _split_graph(addresses=("w0", "w1", "w2"))
    ref = graph.compute(scheduler="sync")
    monkeypatch.setattr(_transfer, "to_disk", lambda *a: pytest.fail("an environment on disk"))
    if copies:  # a GPU run's layout (stand-in copies to and from the device)
        _disk_layout(monkeypatch, tmp_path)
        monkeypatch.setattr(_plan.Pass2, "of_run", classmethod(
            lambda cls, device, n_workers: cls.SPLIT))
    with dask.config.set({"src_dask.pass2-split": True}):
        graph = _graph.build(stack, dataclasses.replace(plan, host_envs=4, disk_envs=4),
                             addresses=["w0", "w1", "w2"])
    y = graph.compute(scheduler="sync")
    assert all(np.array_equal(p, q) for p, q in zip(y, ref, strict=True))


def test_a_run_that_stops_removes_the_environments_it_wrote(monkeypatch, tmp_path):
    """A run that fails after pass 1 wrote environments to disk removes them (those of
    its run only: another file beside them stays), and says what failed."""
    from src_dask import _transfer

    stack = make_stack((random_mpo(6, 3, seed=1), random_mps(6, 4, seed=2)))
    plan = _plan.Plan(sketch=8, chunk=4, chi_out=8, cutoff=0.0, key=_random.seed_key(3),
                      round=False, host_envs=3, disk_envs=3)
    _disk_layout(monkeypatch, tmp_path)
    other = tmp_path / f"{_transfer._PREFIX}another-run-1-0"
    other.write_bytes(b"not ours")

    def broken(d, device):
        assert any(p.name.startswith(_transfer._PREFIX + keys.token_of(graph.key))
                   for p in tmp_path.iterdir())
        raise RuntimeError("the fetch failed")

    monkeypatch.setattr(_transfer, "from_disk", broken)
    graph = _graph.build(stack, plan)
    with pytest.raises(RuntimeError, match="the fetch failed"), \
            _api._files_removed(graph, plan, None):
        graph.compute(scheduler="sync")
    assert list(tmp_path.iterdir()) == [other]


def test_an_environment_missing_or_cut_short_on_disk_is_an_error(monkeypatch, tmp_path):
    """An environment read back from disk is all there or an error naming the file;
    never zeros."""
    from src_dask import _transfer

    monkeypatch.setitem(dask.config.config, "temporary-directory", str(tmp_path))
    x = np.arange(12.0).reshape(3, 4) + 1j
    d = _transfer.to_disk(x, "run", "1-0")
    assert np.array_equal(_transfer.from_disk(d, device=False), x)
    assert not (tmp_path / f"{_transfer._PREFIX}run-1-0").exists()  # removed once read
    d = _transfer.to_disk(x, "run", "1-0")
    with open(d.path, "r+b") as f:
        f.truncate(d.nbytes - 16)
    with pytest.raises(OSError, match="cut short"):
        _transfer.from_disk(d, device=False)
    (tmp_path / f"{_transfer._PREFIX}run-1-0").unlink()
    with pytest.raises(FileNotFoundError, match="missing"):
        _transfer.from_disk(d, device=False)


@pytest.mark.timeout(60)
def test_a_run_that_stops_on_a_cluster_removes_its_files_from_the_workers(tmp_path):
    """On a cluster the files are in each worker's own directory: a run that stops has
    every worker remove those of its run, and nothing else."""
    from distributed import Client, LocalCluster

    from src_dask import _transfer

    stack = make_stack((random_mpo(6, 3, seed=1), random_mps(6, 4, seed=2)))
    plan = _plan.Plan(sketch=8, chunk=4, chi_out=8, cutoff=0.0, key=_random.seed_key(3),
                      round=False, host_envs=3, disk_envs=3)
    graph = _graph.build(stack, plan)
    token = keys.token_of(graph.key)
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=False,
                      dashboard_address="127.0.0.1:0", local_directory=str(tmp_path)) as cluster, \
            Client(cluster) as client:
        dirs = client.run(lambda dask_worker: dask_worker.local_directory)
        for d in dirs.values():
            for name in (f"{_transfer._PREFIX}{token}-1-0", f"{_transfer._PREFIX}other-1-0"):
                with open(f"{d}/{name}", "wb") as f:
                    f.write(b"x")
        with pytest.raises(RuntimeError, match="stopped"), \
                _api._files_removed(graph, plan, client):
            raise RuntimeError("stopped")
        left = client.run(lambda dask_worker: sorted(os.listdir(dask_worker.local_directory)))
    for names in left.values():
        assert f"{_transfer._PREFIX}other-1-0" in names
        assert not any(token in n for n in names)


@pytest.mark.timeout(30)
def test_a_gpu_wait_polls_an_event_beside_a_workers_loop_and_blocks_without_one(
        monkeypatch):
    """``_transfer.wait_for`` asks the stream's event until the GPU got there (a stand-in
    CuPy here), never a blocking synchronisation, where a Dask worker lives in the
    process (its event loop would wait for the driver); in a process without one, or
    while a run is one task of the worker (whose loop then frees none of its device
    memory), it synchronises the stream (the soonest return); given an event, only the
    work queued before it is waited for, the same two ways."""
    import types
    import weakref

    import distributed

    from src_dask import _transfer

    asks, synced = [], []

    class Event:
        @property
        def done(self):
            asks.append(1)
            return len(asks) % 3 == 0

        def synchronize(self):
            synced.append("event")

    class Stream:
        def record(self):
            return Event()

        def synchronize(self):
            synced.append(1)

    class Worker:  # a stand-in for the process's worker
        pass

    fake = types.ModuleType("cupy")
    fake.cuda = types.SimpleNamespace(get_current_stream=Stream)
    monkeypatch.setitem(sys.modules, "cupy", fake)
    worker = Worker()
    monkeypatch.setattr(distributed.Worker, "_instances", weakref.WeakSet([worker]))
    _transfer.wait_for()
    assert len(asks) == 3 and not synced
    _transfer.wait_for(Stream())
    assert len(asks) == 6 and not synced
    with _transfer.alone_on_the_worker():  # a run that is one task: the loop frees none
        _transfer.wait_for()
    assert len(asks) == 6 and synced == [1]
    synced.clear()
    _transfer.wait_for(event=Event())  # work queued before an event: that event asked
    assert len(asks) == 9 and not synced
    monkeypatch.setattr(distributed.Worker, "_instances", weakref.WeakSet())
    _transfer.wait_for()
    assert len(asks) == 9 and synced == [1]
    _transfer.wait_for(event=Event())  # only the work before the event waited for
    assert len(asks) == 9 and synced == [1, "event"]


@pytest.mark.timeout(30)
def test_a_copied_staging_buffer_goes_back_to_the_pool_whichever_thread_allocates(
        monkeypatch):
    """A pinned staging buffer is held until its copy has run, and let go at the next
    pinned allocation of any thread (a stand-in CuPy here): a list per thread kept each
    thread's last buffer until that thread copied again, so the pool page-locked more."""
    import threading
    import weakref

    from src_dask import _transfer

    class Event:
        done = False

    allocated = []
    monkeypatch.setattr(_transfer._pinned, "empty",
                        lambda shape, dtype: allocated.append(shape) or np.empty(shape, dtype))
    monkeypatch.setattr(_transfer, "_pending", [])
    copying, staging = Event(), np.empty(4)
    gone = weakref.ref(staging)
    worker = threading.Thread(target=_transfer._keep_until, args=(copying, staging))
    worker.start()
    worker.join()
    del staging
    _transfer.empty_pinned((2,), np.float64)  # its copy still runs: kept
    assert gone() is not None
    copying.done = True
    _transfer.empty_pinned((2,), np.float64)  # another thread, the copy done: let go
    assert gone() is None and allocated == [(2,), (2,)]


def _rss() -> int:
    """This process's resident bytes (Linux)."""
    import os

    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


@pytest.mark.timeout(30)
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the pinned blocks' mmap")
def test_a_pinned_block_is_faulted_in_before_it_is_page_locked_and_let_go_after():
    """A pinned block's pages are faulted in by the allocating thread before
    ``cudaHostRegister`` (a stand-in here) page-locks them: registering faults them in
    with the CUDA driver's lock held, as ``cudaHostAlloc`` does, and every CUDA call of
    the worker's event loop waits meanwhile. Collected, it is unregistered, then unmapped."""
    from src_dask import _pinned

    size, calls = 64 << 20, []

    def register(ptr, nbytes, flags):
        calls.append(("register", ptr, nbytes, _rss() - before))

    before = _rss()
    block = _pinned.Block(size, register, lambda ptr: calls.append(("unregister", ptr)))
    ptr = block.ptr
    (_, at, nbytes, resident), = calls
    assert (at, nbytes) == (ptr, size) and resident >= 0.9 * size
    del block
    assert calls[-1] == ("unregister", ptr)


@pytest.mark.timeout(30)
def test_a_pinned_block_is_reused_by_size_and_made_outside_the_pools_lock(monkeypatch):
    """The pool lends a free block of a request's rounded size again (one made, not
    one per request), and makes a new block outside its lock: another thread's reuse
    does not wait for it (a block of a few hundred MB takes tens of ms to fault in)."""
    import threading
    import types

    from src_dask import _pinned

    making, release = threading.Event(), threading.Event()

    def make(size):
        if size > 1 << 30:  # the slow one
            making.set()
            assert release.wait(10)
        return types.SimpleNamespace(ptr=1, size=size)

    monkeypatch.setattr(_pinned, "_available", lambda: 1 << 40)
    pool = _pinned.Pool(make)
    lease = pool.lend(3 << 20)
    assert lease.size == 4 << 20 and pool.made == 1
    del lease  # back to the pool
    slow = threading.Thread(target=pool.lend, args=(2 << 30,))
    slow.start()
    assert making.wait(10)
    again = pool.lend((3 << 20) + 5)  # the same rounded size: reused, while one is made
    assert again.size == 4 << 20 and pool.made == 1
    release.set()
    slow.join()
    assert pool.made == 2


@pytest.mark.timeout(30)
def test_a_lease_collected_while_its_pool_holds_the_lock_does_not_deadlock(monkeypatch):
    """A lease can be collected while its pool's lock is held by the same thread: the
    cyclic garbage collector runs at any allocation, one inside the lock included, and
    a collected lease gives its block back through that lock. It must not wait for
    itself (the worker's thread would hang for good)."""
    import threading
    import types

    from src_dask import _pinned

    monkeypatch.setattr(_pinned, "_available", lambda: 1 << 40)
    pool = _pinned.Pool(lambda size: types.SimpleNamespace(ptr=1, size=size))
    held = [pool.lend(4 << 20)]

    class Collecting(dict):
        """Drops the held lease (as a collection would) at the lookup under the lock."""

        def __missing__(self, size):
            held.clear()
            self[size] = []
            return self[size]

    pool._free = Collecting()
    done = []
    thread = threading.Thread(target=lambda: done.append(pool.lend(8 << 20)), daemon=True)
    thread.start()
    thread.join(10)
    assert done and not held, "lending deadlocked on a lease given back under the lock"
    assert [b.size for b in pool._free[4 << 20]] == [4 << 20]  # the collected one is back


@pytest.mark.timeout(30)
def test_a_pinned_block_past_the_free_memory_frees_the_spare_ones_first(monkeypatch):
    """A new pinned block that the host's free memory would not hold lets go of the
    pool's spare blocks first, and if still too big is a MemoryError, never faulted in
    (that would wake the OOM killer, not fail)."""
    import types

    from src_dask import _pinned

    available, made = [10 << 30], []
    monkeypatch.setattr(_pinned, "_available", lambda: available[0])
    pool = _pinned.Pool(lambda size: made.append(size) or types.SimpleNamespace(
        ptr=1, size=size))
    pool.lend(8 << 30)  # fits: made, then spare (the lease collected at once)
    assert made == [8 << 30] and pool._free[8 << 30]
    available[0] = 4 << 30
    with pytest.raises(MemoryError):
        pool.lend(6 << 30)
    assert made == [8 << 30] and not pool._free[8 << 30]  # the spare one let go


@pytest.mark.timeout(30)
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the pinned blocks' mmap")
def test_pinned_buffers_fall_back_to_cupys_pool_where_cuda_refuses_to_register(
        monkeypatch, caplog):
    """With ``pinned-memory: registered``, where CUDA refuses to register host memory
    (not for want of it), pinned buffers come from CuPy's own pool from then on, with
    one warning; a refusal for want of memory is a MemoryError (the out-of-memory
    halving's to handle). By default they come from CuPy's pool. Stand-in CuPy."""
    import types

    from src_dask import _pinned

    class CUDARuntimeError(RuntimeError):
        def __init__(self, status):
            super().__init__(f"status {status}")
            self.status = status

    refusal, from_cupy = [1], []

    def register(ptr, size, flags):
        raise CUDARuntimeError(refusal[0])

    runtime = types.SimpleNamespace(hostRegister=register, hostUnregister=lambda p: None,
                                    CUDARuntimeError=CUDARuntimeError,
                                    errorMemoryAllocation=2)
    cuda = types.ModuleType("cupy.cuda")
    cuda.runtime = runtime
    cupy = types.ModuleType("cupy")
    cupy.cuda = cuda
    cupyx = types.ModuleType("cupyx")
    cupyx.empty_pinned = lambda shape, dtype: from_cupy.append(shape) or np.empty(shape, dtype)
    for name, module in (("cupy", cupy), ("cupy.cuda", cuda), ("cupyx", cupyx)):
        monkeypatch.setitem(sys.modules, name, module)
    monkeypatch.setattr(_pinned, "_pool", None)
    monkeypatch.setattr(_pinned, "_cupys", False)
    monkeypatch.setitem(dask.config.config["src_dask"], "pinned-memory", "registered")
    refusal[0] = 2  # out of memory
    with pytest.raises(MemoryError):
        _pinned.empty((4,), np.float64)
    refusal[0] = 801  # not supported
    with caplog.at_level("WARNING", logger="src_dask"):
        assert _pinned.empty((4,), np.float64).shape == (4,)
        _pinned.empty((3,), np.float64)
    assert from_cupy == [(4,), (3,)] and _pinned._cupys
    assert sum("CuPy's pool" in r.getMessage() for r in caplog.records) == 1
    monkeypatch.setattr(_pinned, "_cupys", False)
    monkeypatch.setitem(dask.config.config["src_dask"], "pinned-memory", "cupy")
    _pinned.empty((2,), np.float64)  # the default: CuPy's pool, nothing registered
    assert from_cupy[-1] == (2,) and not _pinned._cupys


@pytest.mark.timeout(30)
def test_a_gpu_wait_polls_finely_at_first_then_ever_more_sparsely(monkeypatch):
    """``wait_for`` asks every ``_POLL_S[0]`` s for the first ``_FINE_S`` s (a short wait
    returns within a fine poll of the GPU), then doubles the pause up to ``_POLL_S[1]``
    (a long wait wakes its thread rarely); a clock of its own here, and a stand-in CuPy."""
    import sys
    import types

    from src_dask import _transfer

    clock, slept = [0.0], []

    def sleep(s):
        slept.append(s)
        clock[0] += s

    monkeypatch.setattr(_transfer, "time", types.SimpleNamespace(
        sleep=sleep, perf_counter=lambda: clock[0]))

    class Event:
        @property
        def done(self):
            return clock[0] >= 0.05  # the GPU gets there after 50 ms

    fake = types.ModuleType("cupy")
    fake.cuda = types.SimpleNamespace(get_current_stream=lambda: types.SimpleNamespace(
        record=Event))
    monkeypatch.setitem(sys.modules, "cupy", fake)
    monkeypatch.setattr(_transfer, "_beside_an_event_loop", lambda: True)
    _transfer.wait_for()
    first, longest = _transfer._POLL_S
    fine = int(_transfer._FINE_S / first)
    assert slept[:fine] == [first] * fine  # every 20 us for the first 2 ms
    assert slept[fine + 1] == 2 * slept[fine] and max(slept) == longest
    assert clock[0] < 0.05 + longest  # returns within one pause of the GPU
