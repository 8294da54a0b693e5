"""Cluster helpers and the choice of device, on a machine without a GPU (GPU clusters
on a pretend one), and examples/slurm/two_nodes_local.sh with CPU workers."""

from __future__ import annotations

import io
import logging
import math
import os
import subprocess
import sys
from pathlib import Path

import dask
import pytest
from dask.utils import key_split
from distributed import Client, LocalCluster
from helpers import close_cores, dense_product, random_mpo, random_mps, rel_err

import src_dask
from src_dask import _cluster as C
from src_dask import _plan
from src_dask import ucx as U


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


def test_gpus_0_is_a_cpu_cluster_and_gpus_asked_for_without_one_an_error(monkeypatch):
    """``gpus=0``: CPU workers even where there are GPUs (the command line's
    ``--workers``); GPUs asked for where there is none: a ValueError, not a CPU cluster
    in their place."""
    monkeypatch.setattr(C, "has_gpu", lambda: True)
    with src_dask.cluster(gpus=0, n_workers=1, processes=False,
                          dashboard_address=None) as cluster:
        assert type(cluster) is LocalCluster and len(cluster.workers) == 1
    monkeypatch.setattr(C, "has_gpu", lambda: False)
    for gpus in (1, [0]):
        with pytest.raises(ValueError, match="no usable GPU here"):
            src_dask.cluster(gpus=gpus)


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


def test_src_dasks_settings_outlive_a_config_block_around_its_first_use():
    """The names of ``src_dask`` load on first use, its settings at import: a first use
    inside a caller's ``dask.config.set`` block leaves them in Dask's config after it."""
    code = ("import dask, src_dask\n"
            "with dask.config.set({'src_dask.device': 'cpu'}):\n"
            "    src_dask.apply\n"
            "print(dask.config.get('src_dask.keep-inputs'))")
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True,
                         text=True).stdout
    assert out.strip() == "auto"


def test_import_needs_no_gpu_packages():
    code = ("import sys, src_dask; "
            "assert not {'cupy', 'dask_cuda', 'rmm'} & set(sys.modules), sys.modules.keys()")
    subprocess.run([sys.executable, "-c", code], check=True)


# -- cluster() on a pretend GPU machine ---------------------------------------------------
# has_gpu() says yes, gpu_count() says how many, and dask_cuda is a stand-in whose
# LocalCUDACluster records what it was given; distributed_ucxx and rmm import or not
# as each test says (a module, or None in sys.modules: an ImportError).
class _Recorded:
    """What ``cluster()`` passed to ``LocalCUDACluster``."""

    def __init__(self):
        self.calls: list[dict] = []

    @property
    def kwargs(self) -> dict:
        assert len(self.calls) == 1, self.calls
        return self.calls[0]


@pytest.fixture
def gpus(monkeypatch, tmp_path):
    """``gpus(n, ucx=True, rmm=True)``: a machine with n GPUs, where distributed_ucxx and
    rmm import (or not); returns ``start(**options)``, which runs ``cluster`` (spilling
    under tmp_path) and returns the keyword arguments LocalCUDACluster got."""
    import sys
    import types

    recorded = _Recorded()

    class LocalCUDACluster:
        def __init__(self, **kwargs):
            recorded.calls.append(kwargs)

        async def _close(self):
            pass

    fake = types.ModuleType("dask_cuda")
    fake.LocalCUDACluster = LocalCUDACluster
    monkeypatch.setitem(sys.modules, "dask_cuda", fake)
    monkeypatch.setattr(C, "has_gpu", lambda: True)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)

    def machine(n: int, ucx: bool = True, rmm: bool = True):
        monkeypatch.setattr(C, "gpu_count", lambda: n)
        for name, present in (("distributed_ucxx", ucx), ("rmm", rmm)):
            monkeypatch.setitem(sys.modules, name, types.ModuleType(name) if present else None)

        def start(**options) -> dict:
            recorded.calls.clear()
            src_dask.cluster(local_directory=str(tmp_path), **options)
            return recorded.kwargs

        return start

    return machine


def _warnings(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records
            if r.name == "src_dask" and r.levelno >= logging.WARNING]


POOL = {"rmm_async": False, "rmm_pool_size": 0.7, "rmm_maximum_pool_size": 0.9,
        "rmm_allocator_external_lib_list": ["cupy"]}


def _protocol(kwargs: dict) -> str:
    """The protocol a cluster started with ``kwargs`` talks: theirs, or LocalCluster's
    choice (TLS where the security requires encryption, else TCP)."""
    from distributed import Security

    security = kwargs.get("security") or Security()
    return kwargs.get("protocol") or ("tls" if security.require_encryption else "tcp")


def _rmm(kwargs: dict) -> dict:
    return {k: v for k, v in kwargs.items() if k.startswith("rmm_")}


def test_several_gpus_default_to_ucx_and_an_rmm_pool(gpus, caplog):
    start = gpus(2)
    with caplog.at_level(logging.INFO, logger="src_dask"):
        kw = start()
    assert _protocol(kw) == "ucx" and _rmm(kw) == POOL
    assert "host" not in kw and kw["device_memory_limit"] == 0.7  # LocalCluster's loopback
    assert kw["threads_per_worker"] == 4 and "CUDA_VISIBLE_DEVICES" not in kw
    # UCX listens on every interface (host does not bind it): said once, as a WARNING,
    # since the cluster is no longer private; protocol="ucx" chooses it knowingly
    (warning,) = _warnings(caplog)
    assert "every network interface" in warning and "protocol='tcp'" in warning
    info = " ".join(r.getMessage() for r in caplog.records if r.name == "src_dask")
    assert "2 GPUs over ucx with an RMM pool" in info
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="src_dask"):
        kw = start(protocol="ucx")
    assert _protocol(kw) == "ucx" and _rmm(kw) == POOL and not _warnings(caplog)


def test_the_pool_holds_what_a_worker_keeps_before_spilling(gpus):
    start = gpus(4)
    assert _rmm(start(device_memory_limit=0.5))["rmm_pool_size"] == 0.5
    kw = _rmm(start(device_memory_limit=0.95))  # above the usual maximum: grows to it
    assert (kw["rmm_pool_size"], kw["rmm_maximum_pool_size"]) == (0.9, 0.95)
    kw = _rmm(start(device_memory_limit="40GB"))  # bytes: the pool may grow to the device
    assert kw["rmm_pool_size"] == "40GB" and "rmm_maximum_pool_size" not in kw
    for no_spilling in (None, 0, "auto"):
        kw = _rmm(start(device_memory_limit=no_spilling))
        assert (kw["rmm_pool_size"], kw["rmm_maximum_pool_size"]) == (0.9, 0.9)


@pytest.mark.parametrize("ucx, rmm", [(False, True), (True, False), (False, False)])
def test_several_gpus_without_ucx_or_rmm_fall_back_to_tcp_with_one_warning(gpus, caplog,
                                                                            ucx, rmm):
    start = gpus(2, ucx=ucx, rmm=rmm)
    kw = start()
    assert _protocol(kw) == "tcp"
    assert _rmm(kw) == ({"rmm_async": True, "rmm_allocator_external_lib_list": ["cupy"]}
                        if rmm else {})
    (warning,) = _warnings(caplog)
    assert "exchange data over TCP" in warning and "'gpu' extra" in warning
    assert "distributed-ucxx-cu13" in warning and "protocol='tcp'" in warning
    assert ("distributed_ucxx does not import" in warning) is not ucx
    assert ("rmm does not import" in warning) is not rmm


@pytest.mark.parametrize("machine, options", [
    (1, {}),                          # one GPU
    (2, {"gpus": 1}),                 # one of two
    (2, {"gpus": [1]}),
    (3, {"n_workers": 1}),
])
def test_one_gpu_keeps_tcp_and_rmm_async(gpus, caplog, machine, options):
    start = gpus(machine, ucx=False)  # no warning about UCX either: it is not needed
    kw = start(**options)
    assert _protocol(kw) == "tcp"
    assert _rmm(kw) == {"rmm_async": True, "rmm_allocator_external_lib_list": ["cupy"]}
    assert not _warnings(caplog)


def test_cluster_options_are_what_cluster_starts_with(gpus):
    """``cluster_options`` gives the keyword arguments ``cluster`` hands to
    ``LocalCUDACluster`` (to start one's own with); on CPU workers, ``LocalCluster``'s."""
    kw = gpus(2)(device_memory_limit=0.6)
    opts = src_dask.cluster_options(device_memory_limit=0.6, local_directory=kw["local_directory"])
    assert opts.keys() == kw.keys()
    assert {k: v for k, v in opts.items() if k != "security"} == \
        {k: v for k, v in kw.items() if k != "security"}
    assert _protocol(opts) == "ucx" and opts["rmm_pool_size"] == 0.6
    cpu = src_dask.cluster_options(gpus=0, n_workers=2)
    assert "device_memory_limit" not in cpu and not any(k.startswith("rmm_") for k in cpu)
    assert "host" not in cpu and cpu["n_workers"] == 2
    assert cpu["dashboard_address"] == "127.0.0.1:8787"  # LocalCluster's: every interface


def test_gpus_picks_among_the_visible_devices(gpus, monkeypatch):
    """``gpus=2``: the first two visible (LocalCUDACluster's ``n_workers``, which takes
    them from CUDA_VISIBLE_DEVICES); ``gpus=[...]``: those devices."""
    start = gpus(3)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3,5,7")
    kw = start(gpus=2)
    assert kw["n_workers"] == 2 and "CUDA_VISIBLE_DEVICES" not in kw
    assert _protocol(kw) == "ucx"
    kw = start(gpus=[5])
    assert kw["CUDA_VISIBLE_DEVICES"] == [5] and _protocol(kw) == "tcp"


def test_explicit_arguments_win(gpus, caplog):
    start = gpus(2)
    kw = start(protocol="tcp")  # TCP on purpose: RMM's async allocator, as before
    assert _protocol(kw) == "tcp" and kw["rmm_async"] is True
    assert "rmm_pool_size" not in kw
    kw = start(rmm_async=True)  # UCX, but the allocator asked for
    assert _protocol(kw) == "ucx" and kw["rmm_async"] is True
    assert "rmm_pool_size" not in kw and "rmm_maximum_pool_size" not in kw
    kw = start(rmm_pool_size="24GB")  # the caller's pool, dask-cuda's maximum
    assert _rmm(kw) == {"rmm_async": False, "rmm_pool_size": "24GB",
                        "rmm_allocator_external_lib_list": ["cupy"]}
    kw = start(rmm_pool_size=0.5, rmm_maximum_pool_size=0.6,
               rmm_allocator_external_lib_list=["cupy", "numba"])
    assert _rmm(kw) == {"rmm_async": False, "rmm_pool_size": 0.5,
                        "rmm_maximum_pool_size": 0.6,
                        "rmm_allocator_external_lib_list": ["cupy", "numba"]}
    kw = start(protocol="tcp", rmm_pool_size="8GB")  # a pool over TCP: not async
    assert _protocol(kw) == "tcp" and kw["rmm_async"] is False
    kw = gpus(1)(protocol="ucx")  # UCX asked for on one GPU: with the pool
    assert _protocol(kw) == "ucx" and _rmm(kw) == POOL
    kw = gpus(2, ucx=False)(protocol="ucx")  # asked for: no fallback (Dask will say why)
    assert _protocol(kw) == "ucx"
    # the only warnings: UCX chosen by default (no protocol=) listens everywhere
    assert all("every network interface" in w for w in _warnings(caplog))


def test_tls_wins_over_ucx(gpus, caplog):
    from distributed import Security

    start = gpus(2)
    kw = start(security=Security(require_encryption=True))
    assert _protocol(kw) == "tls" and kw["rmm_async"] is True
    assert not _warnings(caplog)
    with dask.config.set({"distributed.comm.require-encryption": True}):
        with pytest.raises(ValueError, match="cannot encrypt, but security requires"):
            start(protocol="ucx")
    with pytest.raises(ValueError, match="cannot encrypt"):
        start(protocol="ucx://", security=Security(require_encryption=True))


# -- what Dask's UCX comm waits for ----------------------------------------------------------
@pytest.fixture
def fake_ucx_comm(monkeypatch):
    """A stand-in for distributed-ucxx's comm module (not installed here): its wait."""
    import types

    comm = types.ModuleType("distributed_ucxx.ucxx")

    def device_sync(stream=None):  # what distributed-ucxx does: cudaDeviceSynchronize
        comm.device_syncs += 1

    comm.synchronize_stream, comm.device_syncs = device_sync, 0
    package = types.ModuleType("distributed_ucxx")
    package.ucxx = comm
    monkeypatch.setitem(sys.modules, "distributed_ucxx", package)
    monkeypatch.setitem(sys.modules, "distributed_ucxx.ucxx", comm)
    return comm


def test_ucx_comm_waits_for_the_default_stream_while_runs_want_it(fake_ucx_comm):
    comm, own = fake_ucx_comm, fake_ucx_comm.synchronize_stream
    assert U._ucx_sync(1) and comm.synchronize_stream is U._default_stream_sync
    assert U._ucx_sync(1) and U._ucx_sync(-1)  # two runs at once: the first one ends
    assert comm.synchronize_stream is U._default_stream_sync
    assert U._ucx_sync(-1) and comm.synchronize_stream is own  # the last: the comm's own
    assert U._ucx_sync(-1) and comm.synchronize_stream is own  # never below none
    assert U._ucx_sync(1) and comm.synchronize_stream is U._default_stream_sync
    U._ucx_sync(-1)
    comm.synchronize_stream()
    assert comm.device_syncs == 1


def test_ucx_comm_switch_runs_on_every_worker_and_back(fake_ucx_comm):
    """In-process workers see the stand-in module; the switch is undone however the
    block ends, and skipped where the plan said no."""
    with LocalCluster(n_workers=2, processes=False, dashboard_address=None) as cluster, \
            Client(cluster, set_as_default=False) as client:
        with pytest.raises(RuntimeError, match="stop"), \
                U.ucx_waits_for_default_stream(client, True):
            assert fake_ucx_comm._src_dask_runs == 2  # both workers (one process here)
            assert fake_ucx_comm.synchronize_stream is U._default_stream_sync
            raise RuntimeError("stop")
        assert fake_ucx_comm._src_dask_runs == 0
        assert fake_ucx_comm.synchronize_stream is fake_ucx_comm._src_dask_original_sync
        with U.ucx_waits_for_default_stream(client, False):
            assert fake_ucx_comm._src_dask_runs == 0


def test_without_distributed_ucxx_there_is_nothing_to_switch(monkeypatch):
    monkeypatch.setitem(sys.modules, "distributed_ucxx", None)  # import fails
    assert U._ucx_sync(1) is False


# -- examples/slurm/two_nodes_local.sh ------------------------------------------------------
SLURM = Path(__file__).resolve().parent.parent / "examples" / "slurm"


def test_two_nodes_script_is_valid_bash():
    subprocess.run(["bash", "-n", str(SLURM / "two_nodes_local.sh")], check=True)


@pytest.mark.slow
@pytest.mark.timeout(440)
def test_two_nodes_script_runs_with_cpu_workers(tmp_path):
    """The script's flow with `dask worker` for `dask cuda worker`: scheduler, two
    workers, generate, run on them, and nothing of it left running afterwards."""
    import importlib.util

    import psutil

    env = {**os.environ, "WORKER": "dask worker", "THREADS": "1",
           "SITES": "6", "BOND": "4", "CHI_OUT": "16",  # chi_out 16: the exact product
           "PATH": os.pathsep.join([str(Path(sys.executable).parent), os.environ["PATH"]])}
    ucx = importlib.util.find_spec("distributed_ucxx") is not None
    if ucx:
        env["PROTOCOL"] = "tcp"
    else:  # the fallback: tcp, saying so
        env.pop("PROTOCOL", None)
    out = tmp_path / "out"
    res = subprocess.run(["bash", str(SLURM / "two_nodes_local.sh"), str(out)], env=env,
                         capture_output=True, text=True, timeout=220, check=False)
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-4000:]
    assert "protocol tcp" in res.stderr and "done: result in" in res.stderr
    assert ("WARNING: distributed_ucxx or rmm does not import" in res.stderr) is not ucx
    assert "node0" in res.stderr and "node1" in res.stderr and "(2 workers)" in res.stderr
    y = src_dask.open(out / "y.zarr")
    a, x = src_dask.open(out / "in" / "mpo"), src_dask.open(out / "in" / "mps")
    assert rel_err(y, dense_product(a, x)) <= 1e-10
    left = [p.info for p in psutil.process_iter(["pid", "cmdline"])
            if str(out) in " ".join(p.info["cmdline"] or [])]
    assert not left, left

    # COMMAND instead of the example problem, on the same workers (the benchmarks' way)
    env["COMMAND"] = ("python -c 'import os; from distributed import Client; "
                      "c = Client(scheduler_file=os.environ[\"SCHEDULER_FILE\"]); "
                      "print(\"workers:\", sorted(w[\"name\"] for w in "
                      "c.scheduler_info()[\"workers\"].values()))'")
    res = subprocess.run(["bash", str(SLURM / "two_nodes_local.sh"), str(out)], env=env,
                         capture_output=True, text=True, timeout=220, check=False)
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-4000:]
    assert "workers: ['node0', 'node1']" in res.stdout and "done: python -c" in res.stderr
    assert not (out / "y.zarr").exists() and not (out / "run.zarr").exists()


def test_tasks_are_sized_from_the_workers_limit_less_what_they_hold(tmp_path):
    """What a run's tasks are sized from (one round trip to the workers): a worker
    process's limit less its RSS, within its pause threshold, shared by its threads; a
    worker in the client's own process its limit (the process's RSS is the client's)."""
    import dask
    from distributed import Client, LocalCluster

    from src_dask import _plan
    from src_dask._cluster import worker_facts

    limit = 600 * 2**20
    fraction = dask.config.get("src_dask.memory-fraction")
    with LocalCluster(n_workers=1, threads_per_worker=2, memory_limit=limit,
                      dashboard_address=None, local_directory=str(tmp_path)) as cluster, \
            Client(cluster, set_as_default=False) as client:
        facts = worker_facts(client, "cpu")
        assert facts.threads == 2 and facts.host_limit == limit == facts.memory
        assert 0 < facts.rss < limit and not facts.in_client and facts.available is None
        task = _plan.task_bytes(facts, "cpu")
        assert task == int(min(fraction * (limit - facts.rss), facts.room) / 2)
    with LocalCluster(n_workers=1, threads_per_worker=1, memory_limit=limit, processes=False,
                      dashboard_address=None) as cluster, \
            Client(cluster, set_as_default=False) as client:
        facts = worker_facts(client, "cpu")
        assert facts.in_client and _plan.task_bytes(facts, "cpu") == int(fraction * limit)
    with dask.config.set({"src_dask.memory-limit": "64 MiB"}):  # overrides what is free
        assert _plan.task_bytes(facts, "cpu") == int(fraction * 64 * 2**20)


def test_device_limit_is_read_from_dask_cudas_worker_data(dask_cuda_stand_in):
    """dask-cuda's DeviceHostFile keeps its device limit as its device buffer's ``n``
    (a zict Buffer); ProxifyHostFile as its manager's ``device_memory_limit``."""
    from types import SimpleNamespace

    import zict

    from src_dask._cluster import _device_limit

    def limit(data):
        worker = SimpleNamespace(plugins={}, data=data)
        return _device_limit(C._dask_cuda_config(worker), worker)

    buffer = zict.Buffer({}, {}, n=123 * 2**20)
    assert limit(SimpleNamespace(device_buffer=buffer)) == 123 * 2**20
    manager = SimpleNamespace(device_memory_limit=7 * 2**30)
    assert limit(SimpleNamespace(manager=manager)) == 7 * 2**30
    assert limit({}) is None  # a plain worker's dict: not told
    assert limit(SimpleNamespace(device_buffer={})) is None  # no limit: no spilling
    assert _device_limit({}, None) is None  # this process: not told


def test_a_gpu_worker_has_no_more_device_memory_than_its_rmm_pool_may_take(monkeypatch,
                                                                           dask_cuda_stand_in):
    """dask-cuda's RMMSetup plugin keeps the pool's maximum (bytes, after its setup):
    the worker's device memory for the plan is the smaller of that and the GPU's."""
    from types import SimpleNamespace

    class RMMSetup:  # the name dask_cuda.plugins gives it
        def __init__(self, maximum):
            self.maximum_pool_size = maximum

    gpu = 140 * 2**30
    monkeypatch.setattr(C, "_memory", lambda device, dask_worker=None: gpu)

    def facts(*plugins):
        worker = SimpleNamespace(plugins={f"p{i}": p for i, p in enumerate(plugins)},
                                 data={}, memory_manager=None)
        return C._facts("gpu", dask_worker=worker)

    pool = int(0.9 * gpu)
    assert facts(RMMSetup(pool))["device_memory"] == pool
    assert facts(RMMSetup(pool))["device_limit"] == pool  # nothing spills: all it has
    assert facts(RMMSetup(None))["device_memory"] == gpu  # grows to the whole device
    assert facts(RMMSetup(2 * gpu))["device_memory"] == gpu
    assert facts(SimpleNamespace(maximum_pool_size=1))["device_memory"] == gpu  # not RMM's
    assert facts()["device_memory"] == gpu
    # the tasks' share shrinks by what the pool cannot give
    keep = int(0.7 * gpu)
    whole = _plan.device_task_bytes(gpu, keep, 2 * keep, threads=4)
    capped = _plan.device_task_bytes(pool, keep, 2 * keep, threads=4)
    assert whole - capped >= (gpu - pool) * 0.95 / 4


def test_a_plugin_dask_cuda_cannot_read_does_not_hide_the_pool(monkeypatch,
                                                              dask_cuda_stand_in):
    """dask-cuda's ``get_worker_config`` pickles every plugin's attributes and raises
    on anything but a TypeError: a plugin of a class pickle cannot find (one defined
    in a script's ``__main__`` or a function) made the plan of a 4 GB pool size tasks
    for the whole GPU. The pool and the device limit are then read directly."""
    from types import SimpleNamespace

    import zict

    class RMMSetup:
        def __init__(self):
            self.initial_pool_size, self.maximum_pool_size = 2 * 10**9, 4 * 10**9

    class Local:  # its bound method pickles the instance, whose class pickle cannot find
        def read(self):
            return []

    gpu = 80 * 10**9
    monkeypatch.setattr(C, "_memory", lambda device, dask_worker=None: gpu)
    data = SimpleNamespace(device_buffer=zict.Buffer({}, {}, n=int(2.67e9)))
    class Worker:  # a Worker's instances can be weakly referenced: a SimpleNamespace not
        plugins, memory_manager = {"rmm": RMMSetup(), "mine": Local()}, None

    worker = Worker()
    worker.data = data
    with pytest.raises(Exception) as err:  # what dask-cuda's reader does with it
        sys.modules["dask_cuda.utils"].get_worker_config(worker)
    assert not isinstance(err.value, TypeError)
    facts = C._facts("gpu", dask_worker=worker)
    assert facts["device_memory"] == 4 * 10**9 and facts["device_limit"] == int(2.67e9)


def test_a_dask_cuda_worker_keeps_host_data_up_to_its_spill_threshold(monkeypatch,
                                                                      dask_cuda_stand_in):
    """dask-cuda's host buffer keeps data up to the worker's whole limit: its data spill
    only when the process passes the spill threshold (not at the target, as a plain
    worker's ``SpillBuffer`` does), so that threshold bounds what the plan keeps there."""
    from types import SimpleNamespace

    import psutil

    monkeypatch.setattr(C, "_memory", lambda device, dask_worker=None: 2**30)
    rss = psutil.Process().memory_info().rss
    limit = 40 * rss  # the target (24 rss) binds a plain worker, not dask-cuda's (27 rss)
    manager = SimpleNamespace(memory_limit=limit, memory_target_fraction=0.6,
                              memory_spill_fraction=0.7, memory_pause_fraction=0.8)

    def keep(data):
        worker = SimpleNamespace(plugins={}, data=data, memory_manager=manager)
        return C._facts("cpu", dask_worker=worker)["keep"]

    dask_cuda = SimpleNamespace(device_buffer=SimpleNamespace(n=2**29))
    assert keep({}) == int(min(0.6 * limit, 0.7 * limit - rss))
    assert keep(dask_cuda) == pytest.approx(0.7 * limit - rss, rel=0.05)
    assert keep(dask_cuda) > keep({})


def test_the_workers_are_asked_once_a_call(cluster_client, monkeypatch, caplog, many_tasks):
    """One question to the workers per call of src or plan, also when the plan is
    logged at INFO (the plan and its log line read the same answer)."""
    from src_dask import _api

    asked = []
    real = _api.worker_facts
    monkeypatch.setattr(_api, "worker_facts", lambda *a: asked.append(a) or real(*a))
    a, x = random_mpo(5, 3, seed=1), random_mps(5, 4, seed=2)
    with caplog.at_level(logging.INFO, logger="src_dask"):
        y = src_dask.apply(a, x, 12, seed=0, client=cluster_client)
    assert len(asked) == 1 and any("peak" in r.getMessage() for r in caplog.records)
    assert rel_err(y, dense_product(a, x)) <= 1e-12
    asked.clear()
    src_dask.plan(a, x, chi_out=12, client=cluster_client)
    assert len(asked) == 1


def test_worker_facts_say_where_the_workers_spill_and_what_is_free(tmp_path):
    """Two workers spilling under one local directory share its file system's room."""
    import shutil

    with LocalCluster(n_workers=2, threads_per_worker=1, memory_limit="300MiB",
                      dashboard_address=":0", local_directory=str(tmp_path)) as cluster, \
            Client(cluster) as client:
        facts = C.worker_facts(client, "cpu")
    assert facts.disk_sharing == 2
    assert facts.spill_dir.startswith(str(tmp_path))
    free = shutil.disk_usage(tmp_path).free
    assert 0.5 * free < facts.disk_free < 2 * free


def test_a_tasks_room_starts_where_dask_starts_spilling():
    """Dask spills stored data only once the process passes the spill fraction (then
    down to the target), so the tasks may use what lies between that and the pause
    threshold (or between what the process holds, if more, and the threshold)."""
    from types import SimpleNamespace

    manager = SimpleNamespace(memory_target_fraction=0.6, memory_spill_fraction=0.7,
                              memory_pause_fraction=0.8)
    assert C._below_pause(manager, 1000, 100) == 100  # 800 - 700
    assert C._below_pause(manager, 1000, 750) == 50  # the process holds more already
    assert C._below_pause(manager, 1000, 900) == 0
    no_spill = SimpleNamespace(memory_target_fraction=False, memory_spill_fraction=False,
                               memory_pause_fraction=0.8)
    assert C._below_pause(no_spill, 1000, 100) == 700


@pytest.mark.timeout(120)
def test_a_small_run_on_a_cluster_is_one_task(cluster_client):
    """A run of at most ``src_dask.one-task-flops`` whose data fit a worker's tasks runs
    as one task on one worker (its graph computed there): one task in the scheduler's
    stream, not one per block and site, and the cores of the threaded run to 1e-12,
    rounding included. Past the limit (or with it 0), or with a progress bar, the run
    is the graph of many tasks."""
    from distributed import get_task_stream

    trains = (random_mpo(8, 3, phys=3, seed=1), random_mps(8, 5, phys=3, seed=2))
    for oversample in (0, 4):
        ref = src_dask.src(*trains, chi_out=10, oversample=oversample, seed=3)
        with get_task_stream(client=cluster_client) as stream:
            y = src_dask.src(*trains, chi_out=10, oversample=oversample, seed=3,
                             client=cluster_client)
        assert len(stream.data) == 1
        (task,) = stream.data  # named for the docs' table, on the first worker
        assert key_split(task["key"]) == "compute_here"
        assert task["worker"] == min(cluster_client.scheduler_info()["workers"])
        assert close_cores(y, ref) and y.seed == 3
        if oversample:
            assert y.discarded == pytest.approx(ref.discarded, rel=1e-9, abs=1e-15)
    for config, progress in (({"src_dask.one-task-flops": 0}, False), ({}, io.StringIO())):
        with dask.config.set(config), get_task_stream(client=cluster_client) as stream:
            y = src_dask.src(*trains, chi_out=10, seed=3, client=cluster_client,
                             progress=progress)
        assert len(stream.data) > 8
        assert close_cores(y, src_dask.src(*trains, chi_out=10, seed=3))


@pytest.mark.timeout(120)
def test_a_run_past_the_bound_is_one_task_where_its_graph_would_be_slower(cluster_client):
    """On single-threaded CPU workers, where pass 2 runs on one worker anyway
    (Pass2.FIRST), a run past ``one-task-flops`` is still one task when running pass
    1's chains side by side would save less than the graph's round trips cost
    (``_plan.one_task_beats_graph``): one task in the stream, the threaded run's cores
    to 1e-12. A larger pass 1 (the model's rate made small) gets the graph."""
    from distributed import get_task_stream

    from src_dask import _estimate
    from src_dask._stack import make_stack

    trains = (random_mpo(16, 4, seed=1), random_mps(16, 110, seed=2))
    stack = make_stack(trains)
    flops = _estimate.flops(stack, 110, 110, False)
    assert sum(flops.values()) > dask.config.get("src_dask.one-task-flops")
    ref = src_dask.src(*trains, chi_out=110, seed=3)
    cluster_client.wait_for_workers(2, timeout=60)
    with get_task_stream(client=cluster_client) as stream:
        y = src_dask.src(*trains, chi_out=110, seed=3, client=cluster_client)
    assert len(stream.data) == 1
    assert close_cores(y, ref)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(_plan, "CORE_FLOPS", 1.0)  # pass 1 worth running side by side
        with get_task_stream(client=cluster_client) as stream:
            y = src_dask.src(*trains, chi_out=110, seed=3, client=cluster_client)
    assert len(stream.data) > 16
    assert close_cores(y, ref)


@pytest.mark.timeout(30)
def test_inputs_go_ahead_only_to_workers_the_client_surely_reaches():
    """A worker in this process or on the loopback (IPv4, IPv6, ``localhost``) gets
    in-memory inputs sent straight to it; one named by another address or a host name
    may be out of the client's reach (they then ride in the task)."""
    from src_dask._api import _on_loopback

    for address in ("tcp://127.0.0.1:8786", "tcp://[::1]:8786", "tls://localhost:1",
                    "inproc://10.0.0.1/12/3"):
        assert _on_loopback(address), address
    for address in ("tcp://10.1.2.3:8786", "tcp://node01:8786", "tls://[fe80::1]:8786"):
        assert not _on_loopback(address), address


@pytest.mark.timeout(120)
def test_a_one_task_runs_large_numpy_inputs_go_to_its_worker_once_ahead_of_it(
        cluster_client, monkeypatch):
    """Large in-memory inputs of a run that is one task go to its worker once and
    straight (Dask's scatter, where shared memory is off: test_shared.py has it on),
    not inside the task through the scheduler: what the client submits holds none of
    their bytes, the result says how many bytes went ahead, and it is the threaded
    run's. Small inputs ride in the task (one round trip fewer)."""
    from distributed.protocol.pickle import dumps

    from src_dask import _api

    monkeypatch.setitem(dask.config.config["src_dask"], "shared-memory", False)
    a, x = random_mpo(8, 3, seed=1), random_mps(8, 40, seed=2)
    inputs = sum(c.nbytes for t in (a, x) for c in t)
    ref = src_dask.apply(a, x, chi_out=20, seed=3)
    submitted, submit = [], cluster_client.submit
    monkeypatch.setattr(cluster_client, "submit", lambda func, *args, **kwargs: (
        submitted.append(len(dumps(args))), submit(func, *args, **kwargs))[1])
    for ahead, sent in ((1, inputs), (inputs + 1, 0)):
        monkeypatch.setattr(_api, "_SEND_AHEAD_BYTES", ahead)
        y = src_dask.apply(a, x, chi_out=20, seed=3, client=cluster_client)
        assert y.run_info.sent_bytes == sent and (y.run_info.sent_s is None) == (not sent)
        assert (submitted[-1] < inputs / 4) == bool(sent)
        assert close_cores(y, ref)


@pytest.mark.parametrize("one_task", [True, False])
def test_persisted_results_stay_on_the_cluster_through_a_loop(cluster_client, one_task,
                                                              monkeypatch):
    """``persist=True``, three steps of an MPO applied to an MPS on a Client (a small run
    as one task, or as a graph of many): each result is Dask arrays over futures whose
    data are on the workers, the next step takes it where it is, and the state equals
    the same loop in this process."""
    from distributed import futures_of

    if not one_task:
        monkeypatch.setitem(dask.config.config["src_dask"], "one-task-flops", 0)
    a, x = random_mpo(8, 2, seed=1), random_mps(8, 4, seed=2)
    y, z = x, x
    for step in range(3):
        y = src_dask.apply(a, y, chi_out=8, seed=step, client=cluster_client, persist=True)
        z = src_dask.apply(a, z, chi_out=8, seed=step)
        futures = [futures_of(c) for c in y]
        assert all(futures)
        assert all(cluster_client.who_has([f for fs in futures for f in fs]).values())
    with cluster_client.as_current():  # computed where they are
        assert close_cores(y, z)
    assert src_dask.apply(a, x, chi_out=8, seed=0, persist=True).kind == "mps"  # no client


@pytest.mark.parametrize("one_task", [True, False])
def test_lazy_random_inputs_run_on_a_client(cluster_client, one_task, monkeypatch):
    """Trains of ``problems.random_*`` (Dask arrays not drawn yet) on a Client, as one
    task and as a graph: the one task carries their layers inside its graph (they are
    no keys of the cluster), and the result is the threaded run's."""
    if not one_task:
        monkeypatch.setitem(dask.config.config["src_dask"], "one-task-flops", 0)
    a = src_dask.problems.random_mpo(8, bond=3, seed=1)
    x = src_dask.problems.random_mps(8, bond=5, seed=2)
    y = src_dask.apply(a, x, chi_out=10, seed=4, client=cluster_client)
    assert close_cores(y, src_dask.apply(a, x, chi_out=10, seed=4))
    persisted = src_dask.apply(a, x, chi_out=10, seed=4, client=cluster_client, persist=True)
    again = src_dask.apply(a, persisted, chi_out=10, seed=5, client=cluster_client)
    with cluster_client.as_current():
        assert close_cores(again, src_dask.apply(a, y, chi_out=10, seed=5))


@pytest.mark.timeout(60)
def test_a_run_that_is_one_task_on_a_gpu_worker_keeps_one_block():
    """A run as one task takes one block per thread of a CPU worker (run one after the
    other, each GEMM on the host's cores) but one on a GPU worker, however many threads
    it has: the GPU runs one block's GEMMs at a time, as an in-process GPU run's one
    block (the plan of a 4-thread GPU worker once split χ=1000's sketch in four)."""
    from src_dask import _api
    from src_dask._stack import make_stack

    stack = make_stack((random_mpo(12, 4, seed=1), random_mps(12, 300, seed=2)))
    facts = _plan.Workers(count=1, threads=4, rss=0, host_limit=None, keep=None)
    for device, blocks in (("gpu", 1), ("cpu", 4)):
        plan = _plan.Plan(sketch=300, chunk=75, chi_out=300, cutoff=0.0, key=0, round=False,
                          device=device, task_bytes=None, threads=4)
        assert math.ceil(300 / _api._one_task_chunk(stack, plan, facts)) == blocks, device
