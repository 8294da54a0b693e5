"""On the GPU (CuPy blocks through dask-cuda). Marked ``gpu``: run on the GPU machine
with ``pytest -m gpu`` (see benchmarks/gpu_run.sh); skipped elsewhere."""

from __future__ import annotations

import gc
import logging
import os
import subprocess
import sys
import time

import dask
import numpy as np
import pytest
from helpers import cholesky_qr2, count_calls, random_mpo, random_mps

import src_dask

pytestmark = pytest.mark.gpu


@pytest.fixture(autouse=True)
def _layouts(many_tasks):
    """Small runs on GPU clusters here are graphs of many tasks: their placement and
    memory are what is tested (a small run is otherwise one task, test_cluster.py)."""


def _same(y, ref, tol=1e-12, dense=True):
    """The same train: the product to ``tol`` (relative), and core by core (the
    gauge is canonical) to rounding amplified by the QR/SVD condition."""
    for c, c0 in zip(y, ref, strict=True):
        c, c0 = np.asarray(c), np.asarray(c0)
        assert c.shape == c0.shape
        assert np.abs(c - c0).max() <= 1e3 * tol * np.abs(c0).max()
    if dense:
        d, d0 = y.to_dense(), ref.to_dense()
        assert np.linalg.norm(d - d0) <= tol * np.linalg.norm(d0)


def _on(device, *trains, **options):
    with dask.config.set({"src_dask.device": device}):
        return src_dask.src(*trains, **options)


STACKS = {
    "mpo.mps": lambda dt: (random_mpo(12, 4, dtype=dt, seed=1),
                           random_mps(12, 32, dtype=dt, seed=2)),
    "mpo.mpo.mps": lambda dt: (random_mpo(8, 3, phys=3, dtype=dt, seed=1),
                               random_mpo(8, 2, phys=3, dtype=dt, seed=2),
                               random_mps(8, 9, phys=3, dtype=dt, seed=3)),
    "bra.mpo": lambda dt: (random_mps(10, 16, dtype=dt, seed=4),
                           random_mpo(10, 3, dtype=dt, seed=5)),
    "mpo.mpo": lambda dt: (random_mpo(8, 4, dtype=dt, seed=6), random_mpo(8, 3, dtype=dt, seed=7)),
    "compress": lambda dt: (random_mps(12, 40, dtype=dt, seed=8),),
}


@pytest.mark.parametrize("dtype", [np.complex128, np.float64])
@pytest.mark.parametrize("stack", list(STACKS))
@pytest.mark.parametrize("oversample", [0, "auto"])
def test_gpu_equals_cpu(stack, dtype, oversample):
    trains = STACKS[stack](dtype)
    opts = dict(chi_out=24, seed=3, chunk=10, oversample=oversample)
    _same(_on("gpu", *trains, **opts), _on("cpu", *trains, **opts))


def test_projected_cores_in_row_blocks_on_the_gpu(monkeypatch):

    trains = STACKS["mpo.mpo.mps"](np.complex128)
    opts = dict(chi_out=24, seed=3, chunk=10)
    ref = _on("cpu", *trains, **opts)
    with dask.config.set({"src_dask.projection-block-size": 16 * 200}):
        _same(_on("gpu", *trains, **opts), ref)


def test_cupy_inputs_run_on_the_gpu():
    import cupy

    a, x = STACKS["mpo.mps"](np.complex128)
    ref = _on("cpu", a, x, chi_out=32, seed=1)
    y = src_dask.apply([cupy.asarray(c) for c in a], [cupy.asarray(c) for c in x], 32, seed=1)
    assert all(isinstance(c, cupy.ndarray) for c in y)  # CuPy in, CuPy out (as quimb)
    _same(src_dask.TensorTrain(y.to_numpy()), ref)
    y = src_dask.apply([cupy.asarray(c) for c in a], list(x), 32, seed=1)
    assert all(isinstance(c, np.ndarray) for c in y)  # any NumPy input: NumPy out
    _same(y, ref)


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
def test_cupy_inputs_are_checked_for_nan_and_inf_with_one_wait(monkeypatch):
    """Every CuPy core's sum is queued before the one wait for the device: a NaN or inf
    anywhere (real or imaginary part, any dtype) is named by train and site, finite
    values whose sum overflows are not, and the check waits once, not once a core."""
    import cupy

    from src_dask import _kernels as K

    big = np.finfo(np.float32).max
    xs = [cupy.ones((3, 4), dt) for dt in (np.float32, np.float64, np.complex64, np.complex128)]
    xs += [cupy.full(8, big, np.float32), cupy.arange(5)]  # overflowing sum; integers
    assert K.all_finite_each(xs) == [True] * len(xs)
    xs[1][2, 1] = np.inf
    xs[3][0, 0] = complex(1, np.nan)
    assert K.all_finite_each(xs) == [True, False, True, False, True, True]
    waits = count_calls(monkeypatch, K, "wait_for")
    a, x = STACKS["mpo.mps"](np.complex128)
    a, x = [cupy.asarray(c) for c in a], [cupy.asarray(c) for c in x]
    x[7][0, 0, 0] = np.nan
    with pytest.raises(ValueError, match=r"trains\[1\], site 7: .*NaN or inf"):
        src_dask.apply(a, x, 16, seed=1)
    assert len(waits) == 1  # the error comes before any other work


def test_distance_of_cupy_trains_on_the_gpu(monkeypatch):
    """distance streams its overlaps on the device when the trains are CuPy arrays (or
    the config says gpu), and agrees with the NumPy answer and the dense difference."""
    import cupy

    from src_dask import _kernels as K

    seen = []
    contract = K.contract
    monkeypatch.setattr(K, "contract",
                        lambda eq, *xs: seen.append(type(xs[0]).__module__) or contract(eq, *xs))
    a, x = STACKS["mpo.mpo.mps"](np.complex128)[1:]
    y = src_dask.apply(a, x, 6, seed=2)  # truncated well below the product's rank
    seen.clear()
    on_gpu = src_dask.distance([cupy.asarray(c) for c in y], [cupy.asarray(c) for c in a],
                               [cupy.asarray(c) for c in x])
    assert seen and all(m.startswith("cupy") for m in seen)
    seen.clear()
    with dask.config.set({"src_dask.device": "gpu"}):
        numpy_in_on_gpu = src_dask.distance(y, a, x)
    assert seen and all(m.startswith("cupy") for m in seen)
    seen.clear()
    with dask.config.set({"src_dask.device": "cpu"}):
        on_cpu = src_dask.distance(y, a, x)
    assert seen and all(m.startswith("numpy") for m in seen)
    assert numpy_in_on_gpu == pytest.approx(on_cpu, rel=1e-9)
    exact = src_dask.TensorTrain([np.asarray(c) for c in y]).to_dense()
    product = src_dask.apply(a, x, 10**6).to_dense()  # no truncation: the exact product
    dense = np.linalg.norm(exact - product) / np.linalg.norm(product)
    assert 1e-3 < dense < 1  # a real truncation error, not rounding
    assert on_gpu == pytest.approx(on_cpu, rel=1e-9)
    assert on_gpu == pytest.approx(dense, rel=1e-6)


def test_cholesky_qr2_on_the_gpu_and_its_fallback():
    import cupy

    from src_dask import _kernels as K

    rng = np.random.default_rng(0)
    a = rng.standard_normal((300, 900)) + 1j * rng.standard_normal((300, 900))
    q = cholesky_qr2(cupy.asarray(a))
    ref, r = np.linalg.qr(a.T)
    ref = K._positive_diagonal(ref, r).T
    assert np.abs(q.get() - ref).max() < 1e-13
    deficient = cupy.asarray(np.repeat(a[:10], 3, axis=0))  # 30 rows of rank 10
    assert cholesky_qr2(deficient) is None
    # a rank-deficient sketch still gives orthonormal rows, through Householder
    eta = K.orthonormalize([[deficient]], 900, 1, 0.0, 30, site=1).reshape(30, -1)
    assert abs(eta.conj() @ eta.T - cupy.eye(30)).max() < 1e-12


@pytest.mark.parametrize("dtype", [np.complex128, np.float64, np.complex64, np.float32])
def test_a_cholesky_round_on_the_gpu_is_the_triangular_solve(dtype):
    """cuSOLVER's and cuBLAS's Cholesky round on the arrays as they lie equals
    ``conj(L)⁻¹ rows`` made by NumPy, for every dtype, and leaves ``rows`` as it was."""
    import cupy

    from src_dask import _kernels as K

    rng = np.random.default_rng(1)
    a = rng.standard_normal((200, 700)).astype(dtype)
    if np.iscomplexobj(a):
        a = a + 1j * rng.standard_normal((200, 700)).astype(dtype)
    gram = a.conj() @ a.T
    want = np.linalg.solve(np.linalg.cholesky(gram.astype(np.complex128)).conj(), a)
    rows = cupy.asarray(a)
    got = K._cholesky_round(rows, cupy.asarray(gram)).get()
    tol = 1e-12 if np.dtype(dtype) in (np.float64, np.complex128) else 1e-4
    assert got.dtype == a.dtype
    assert np.abs(got - want).max() < tol * np.abs(want).max()
    assert np.array_equal(rows.get(), a)


@pytest.mark.parametrize("keep", [True, False])  # inputs kept for pass 2, or read again
def test_zarr_inputs_and_store_on_the_gpu(tmp_path, keep):
    a, x = STACKS["mpo.mps"](np.complex128)
    src_dask.save(a, tmp_path / "a")
    src_dask.save(x, tmp_path / "x", max_chunk_bytes=2**14)
    ref = _on("cpu", a, x, chi_out=32, seed=1, chunk=8)
    za, zx = src_dask.open(tmp_path / "a"), src_dask.open(tmp_path / "x")
    with dask.config.set({"src_dask.keep-inputs": keep}):
        _same(_on("gpu", za, zx, chi_out=32, seed=1, chunk=8), ref)
        y = _on("gpu", za, zx, chi_out=32, seed=1, chunk=8, store=tmp_path / "run")
    _same(y, ref)


def test_zarr_reads_land_in_pinned_memory_and_move_without_a_copy(tmp_path, monkeypatch):
    """A GPU run reads a Zarr core into a pinned buffer, which goes to the device as
    it is (no staging copy)."""
    import cupy
    import cupyx
    import zarr

    from src_dask import _graph, _transfer

    x = random_mps(6, 40, seed=3)
    src_dask.save(x, tmp_path / "x", max_chunk_bytes=2**14)
    arr = zarr.open_group(tmp_path / "x", mode="r")["site_2"]
    host = _graph.tasks.read_whole(arr, pinned=True)
    assert isinstance(host.base, cupy.cuda.PinnedMemoryPointer) and _transfer._is_pinned(host)
    np.testing.assert_array_equal(host, x[2])

    def no_staging(*args, **kwargs):
        raise AssertionError("a pinned read was copied into another staging buffer")

    monkeypatch.setattr(_transfer._pinned, "empty", no_staging)
    monkeypatch.setattr(cupyx, "empty_pinned", no_staging)
    np.testing.assert_array_equal(cupy.asnumpy(_transfer.to_device(host)), x[2])
    assert not _transfer._is_pinned(np.zeros(4))


def test_a_second_run_reuses_the_pinned_blocks_of_the_first(tmp_path, monkeypatch):
    """With ``pinned-memory: registered`` the reads of a GPU run land in this process's
    pool of pinned blocks (``_pinned``), registered with CUDA and kept: the same run
    again is served from them. (Not none made: how many reads overlap depends on the
    threads' timing, so the second run may hold a block or two more at once.)"""
    from src_dask import _pinned

    a, x = STACKS["mpo.mps"](np.complex128)
    src_dask.save(a, tmp_path / "a")
    src_dask.save(x, tmp_path / "x")
    za, zx = src_dask.open(tmp_path / "a"), src_dask.open(tmp_path / "x")
    with dask.config.set({"src_dask.pinned-memory": "registered"}):
        first = _on("gpu", za, zx, chi_out=32, seed=1, chunk=8)
        gc.collect()  # leases held in reference cycles go back to the pool
        made = _pinned.pool().made
        assert made > 0
        lent = count_calls(monkeypatch, _pinned.pool(), "lend")
        _same(_on("gpu", za, zx, chi_out=32, seed=1, chunk=8), first)
        assert len(lent) >= 8 and 4 * (_pinned.pool().made - made) <= len(lent)


def test_oom_halving_with_a_cupy_pool_limit(caplog):
    """One pass-1 step on a block of 2048 columns (C of 128 MiB, about 768 MiB of
    temporaries whole) under a CuPy pool limit of 512 MiB above what is in use: the
    whole block runs out of memory, halves fit, and the result equals the unlimited one.
    (The step alone: a whole run would be clamped to the product's rank, and pass 2's
    steps cannot be split.)"""
    import cupy

    from src_dask import _kernels as K
    from src_dask import _oom, _random

    rng = np.random.default_rng(0)
    mpo = cupy.asarray(rng.standard_normal((8, 8, 2, 2)) + 0j)
    mps = cupy.asarray(rng.standard_normal((512, 512, 2, 1)) + 0j)
    env = cupy.asarray(rng.standard_normal((2048, 8, 512)) + 0j)
    omega = _random.sketch_block(1, 3, 0, 2048, (2, 1), np.dtype(complex))

    def step() -> cupy.ndarray:
        return _oom.halving(lambda a, b: K.sketch_step(env[a:b], [mpo, mps], omega=omega[a:b],
                                                        site=3),
                            2048, xp=cupy, run="oom-test", step="pass 1", site=3,
                            bytes_per_row=K.sketch_step_bytes([mpo, mps]))

    ref = step().get()
    pool = cupy.get_default_memory_pool()
    pool.free_all_blocks()
    pool.set_limit(size=pool.used_bytes() + 512 * 2**20)
    try:
        with caplog.at_level(logging.WARNING, logger="src_dask"):
            out = step().get()
    finally:
        pool.set_limit(size=0)
    assert any("out of device memory on 2048" in r.getMessage() for r in caplog.records)
    assert np.abs(out - ref).max() <= 1e-12 * np.abs(ref).max()


def test_one_column_that_does_not_fit_on_the_gpu():
    """Five trains of bond 16: tiny cores, but one column of C holds 16**5 numbers
    (16 MiB); the last bonds are 2, so pass 2 starts small."""
    import cupy

    bonds = [16, 16, 16, 16, 2]
    trains = [random_mpo(6, bonds, seed=i) for i in range(4)] + [random_mps(6, bonds, seed=9)]
    pool = cupy.get_default_memory_pool()
    pool.free_all_blocks()
    pool.set_limit(size=8 * 2**20)
    try:
        with dask.config.set({"src_dask.device": "gpu"}):
            with pytest.raises(MemoryError, match=r"site 0, pass 1: one sketch column does not "
                                                  r"fit in device memory; it needs about "
                                                  r"[0-9.]+ MiB"):
                src_dask.src(*trains, chi_out=8, seed=0, chunk=8)
    finally:
        pool.set_limit(size=0)


def test_cluster_is_one_worker_per_gpu_with_rmm():
    import cupy
    from dask_cuda import LocalCUDACluster
    from distributed import Client

    with src_dask.cluster(dashboard_address=":0") as cluster, Client(cluster) as client:
        assert isinstance(cluster, LocalCUDACluster)
        assert len(client.scheduler_info()["workers"]) == cupy.cuda.runtime.getDeviceCount()
        a, x = STACKS["mpo.mps"](np.complex128)
        _same(src_dask.apply(a, x, 32, seed=2, chunk=8, client=client),
              _on("cpu", a, x, chi_out=32, seed=2, chunk=8))


@pytest.mark.timeout(300)
def test_a_run_that_fits_one_gpu_worker_is_one_task_of_its_threads(monkeypatch):
    """On one GPU worker a run past ``one-task-flops`` whose data fit what dask-cuda
    keeps on the device is one task (``compute_here``, the worker's threads queueing
    its kernels; no scheduler round trip per step), with inputs from the client and
    inputs persisted there, and gives the CPU cores; under a device limit its data
    pass, it is a graph again (dask-cuda spills what the graph stores)."""
    import dask.array as da
    from distributed import Client, get_task_stream, wait
    from distributed.utils import key_split

    monkeypatch.setitem(dask.config.config["src_dask"], "one-task-flops", 2e9)
    a, x = random_mpo(12, 4, seed=1), random_mps(12, 256, seed=2)  # ~2.6e10 flop
    ref = _on("cpu", a, x, chi_out=256, seed=3)
    for limit, one in ((None, True), ("16MB", False)):
        with src_dask.cluster(gpus=1, dashboard_address=":0",
                              **({"device_memory_limit": limit} if limit else {})) as cluster, \
                Client(cluster) as client:
            on_gpu = [client.persist(da.from_array(c, chunks=c.shape).map_blocks(
                __import__("cupy").asarray)) for c in x]
            wait(on_gpu)  # their tasks done before the stream is watched
            for x_in in (x, src_dask.TensorTrain(on_gpu, "mps")):
                with get_task_stream(client=client) as stream:
                    y = src_dask.apply(a, x_in, chi_out=256, seed=3, client=client)
                names = {key_split(t["key"]) for t in stream.data}
                assert (names == {"compute_here"}) is one, names
                _same(y, ref, tol=1e-10, dense=False)


@pytest.mark.timeout(300)
def test_a_gpu_workers_one_task_takes_numpy_through_shared_memory(monkeypatch, caplog):
    """A one-task run on a GPU worker of this host takes its NumPy inputs and gives its
    result through shared memory (the cores copied from the device once, into the
    files the client maps), with the CPU's cores, and leaves no file; the same with the
    config off goes through Dask's comm."""
    import mmap

    from distributed import Client

    from src_dask import _api, _shared

    # inputs and result (1.2 and 1.8 MB) from 1 MiB on go ahead of the task
    monkeypatch.setattr(_api, "_SEND_AHEAD_BYTES", 1 << 20)
    monkeypatch.setitem(dask.config.config["src_dask"], "one-task-flops", 1e12)
    a, x = random_mpo(16, 3, seed=1), random_mps(16, 100, seed=2)
    ref = _on("cpu", a, x, chi_out=100, seed=3)

    def mapped(c):
        while isinstance(c, np.ndarray | memoryview):
            c = c.base if isinstance(c, np.ndarray) else c.obj
        return isinstance(c, mmap.mmap)

    with src_dask.cluster(gpus=1, dashboard_address=":0") as cluster, Client(cluster) as client:
        for on in (True, False):
            caplog.clear()
            with caplog.at_level(logging.INFO, logger="src_dask"), \
                    dask.config.set({"src_dask.shared-memory": on}):
                y = src_dask.apply(a, x, chi_out=100, seed=3, client=client)
            assert any(("through shared memory" if on else "by scatter") in r.message
                       for r in caplog.records)
            assert all(mapped(c) == on for c in y)
            _same(y, ref, tol=1e-10, dense=False)
    assert not [n for n in os.listdir(_shared.DIRECTORY)
                if n.startswith(f"{_shared._PREFIX}{os.getpid()}-")]


@pytest.mark.timeout(300)
def test_the_command_line_runs_on_the_gpus(tmp_path, capsys):
    """``src-dask run --gpus 1`` (a local dask-cuda cluster of one worker) writes the
    result the threaded CPU run computes, and says so on one line."""
    from src_dask._cli import main

    a, x = STACKS["mpo.mps"](np.complex128)
    src_dask.save(a, tmp_path / "A.zarr")
    src_dask.save(x, tmp_path / "x.zarr")
    out = tmp_path / "y.zarr"
    assert main(["run", str(tmp_path / "A.zarr"), str(tmp_path / "x.zarr"), "--chi-out", "32",
                 "--seed", "2", "--chunk", "8", "--gpus", "1", "--out", str(out)]) == 0
    assert f"to {out}" in capsys.readouterr().out
    _same(src_dask.open(out), _on("cpu", a, x, chi_out=32, seed=2, chunk=8))

def test_device_spilling(tmp_path):
    """About 1 GB of environments on a worker allowed 256 MB of device memory."""
    from distributed import Client

    a, x = random_mpo(30, 8, seed=1), random_mps(30, 256, seed=2)  # C: 1024 x 2048 per site
    ref = _on("cpu", a, x, chi_out=1024, seed=0, chunk=128)
    with src_dask.cluster(gpus=1, device_memory_limit="256MB", memory_limit="16GB",
                          local_directory=str(tmp_path), dashboard_address=":0") as cluster, \
            Client(cluster) as client:
        y = src_dask.apply(a, x, 1024, seed=0, chunk=128, client=client)
    assert all(isinstance(c, np.ndarray) for c in y)  # results reach the client as NumPy
    _same(y, ref, dense=False)


def test_two_dask_cuda_workers_sharing_one_gpu(tmp_path):
    """Two ``dask cuda worker`` processes on one GPU (how the benchmarks stand in for
    two GPUs): in-memory and Zarr inputs give the one-GPU cores, pass 2 split over
    both workers, each making its own QR."""
    from distributed import Client, get_task_stream

    a, x = STACKS["mpo.mps"](np.complex128)
    ref = _on("gpu", a, x, chi_out=32, seed=5, chunk=8)
    sched = tmp_path / "scheduler.json"
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": "0"}
    bin_dir = os.path.dirname(sys.executable)
    dask_cli = [sys.executable, "-m", "dask"] if not os.path.exists(f"{bin_dir}/dask") else \
        [f"{bin_dir}/dask"]
    procs = [subprocess.Popen([*dask_cli, "scheduler", "--scheduler-file", str(sched),
                               "--dashboard-address", ":0"], env=env)]
    try:
        for _ in range(100):
            if sched.exists():
                break
            time.sleep(0.2)
        for i in range(2):
            procs.append(subprocess.Popen(
                [*dask_cli, "cuda", "worker", "--scheduler-file", str(sched),
                 "--device-memory-limit", "0.4", "--local-directory", str(tmp_path / f"w{i}")],
                env=env))
        with Client(scheduler_file=str(sched)) as client:
            client.wait_for_workers(2, timeout=120)
            y = src_dask.apply(a, x, 32, seed=5, chunk=8, client=client)
            # the split pass 2 from Zarr inputs: reads pinned, each worker's own QR
            src_dask.save(a, tmp_path / "a")
            src_dask.save(x, tmp_path / "x")
            with get_task_stream(client=client) as stream:
                stored = src_dask.apply(src_dask.open(tmp_path / "a"),
                                        src_dask.open(tmp_path / "x"), 32, seed=5, chunk=8,
                                        client=client)
    finally:
        for p in reversed(procs):
            p.terminate()
            p.wait(30)
    _same(y, ref)
    _same(stored, ref)
    qr = {t["worker"] for t in stream.data if t["key"][1:2] == ("qr",)}
    assert len(qr) == 2


def test_ucx():
    pytest.importorskip("distributed_ucxx")
    from distributed import Client

    a, x = STACKS["mpo.mps"](np.complex128)
    ref = _on("cpu", a, x, chi_out=32, seed=6, chunk=8)
    with src_dask.cluster(protocol="ucx", dashboard_address=":0") as cluster, \
            Client(cluster) as client:
        assert client.scheduler.address.startswith("ucx")
        y = src_dask.apply(a, x, 32, seed=6, chunk=8, client=client)
    _same(y, ref)


def test_resume_on_the_gpu(tmp_path):
    """A run stopped in pass 2 (here: by an error) resumes on the GPU, oversampled."""
    from src_dask import _kernels as K

    a, x = STACKS["mpo.mps"](np.complex128)
    ref = _on("cpu", a, x, chi_out=24, seed=2, chunk=8, oversample=4)
    original = K.pass2_step

    def failing(*args, **kwargs):
        if kwargs["site"] == 5:
            raise RuntimeError("stopped at site 5")
        return original(*args, **kwargs)

    K.pass2_step = failing
    try:
        with pytest.raises(RuntimeError, match="stopped"):
            _on("gpu", a, x, chi_out=24, seed=2, chunk=8, oversample=4, store=tmp_path / "r")
    finally:
        K.pass2_step = original
    y = _on("gpu", a, x, chi_out=24, seed=2, chunk=8, oversample=4, store=tmp_path / "r")
    _same(y, ref)


# -- several GPUs (the nvidia-h200-x2 machine) ---------------------------------------------
@pytest.fixture
def two_gpus() -> None:
    import cupy

    if cupy.cuda.runtime.getDeviceCount() < 2:
        pytest.skip("needs two GPUs")


def test_split_pass_2_on_two_gpus(tmp_path, two_gpus):
    """Pass 2 split by rows of Z over two GPU workers (the default on several GPUs)
    gives the one-GPU cores, in memory and with a run store, Z whole or in row
    blocks; both workers project and update rows and run the QR (each its own)."""
    from distributed import Client, get_task_stream
    from distributed.utils import key_split

    trains = STACKS["mpo.mpo.mps"](np.complex128)
    opts = dict(chi_out=24, seed=3, chunk=10)
    ref = _on("gpu", *trains, **opts)
    with src_dask.cluster(gpus=2, dashboard_address=":0") as cluster, \
            Client(cluster) as client:
        with get_task_stream(client=client) as stream:
            y = src_dask.src(*trains, client=client, **opts)
        with dask.config.set({"src_dask.projection-block-size": 16 * 64}):
            stored = src_dask.src(*trains, client=client, store=tmp_path / "run", **opts)
    ran: dict = {}
    for t in stream.data:
        if key_split(t["key"]).startswith("pass2"):
            ran.setdefault(t["key"][1], set()).add(t["worker"])
    assert len(ran["project"]) == len(ran["update"]) == len(ran["qr"]) == 2
    _same(y, ref)
    _same(stored, ref)


def test_gpu_blocks_move_between_workers_over_ucx(two_gpus):
    """The transfer path of split pass 2: a CuPy block made on one GPU worker reaches
    the other by an ordinary task dependency, over UCX (what ``src_dask.cluster``
    starts on several GPUs when UCX is installed), as a CuPy array on that worker's
    own GPU, allocated from an RMM pool."""
    pytest.importorskip("distributed_ucxx")
    from distributed import Client

    def make(n):
        import cupy

        return cupy.arange(n, dtype=cupy.complex128)

    def where(x):
        import cupy
        import rmm

        resource = type(rmm.mr.get_current_device_resource()).__name__
        return (type(x).__module__.split(".")[0], cupy.cuda.runtime.getDevice(),
                os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",")[0],
                float(x.real.sum()), resource)

    with src_dask.cluster(gpus=2, dashboard_address=":0") as cluster, \
            Client(cluster) as client:
        assert client.scheduler.address.startswith("ucx://")
        w0, w1 = sorted(client.scheduler_info()["workers"])
        n = 1 << 24  # 256 MiB
        block = client.submit(make, n, workers=[w0], pure=False)
        seen = client.submit(where, block, workers=[w1], pure=False).result()
        home = client.submit(where, block, workers=[w0], pure=False).result()
    assert seen[0] == "cupy" and seen[3] == n * (n - 1) / 2
    assert seen[2] != home[2]  # the other GPU
    assert "Pool" in seen[4] or "pool" in seen[4].lower()


def test_split_pass_2_over_ucx_waits_for_the_default_stream_only(two_gpus):
    """Over UCX the run has Dask's comm wait for the default stream (not the whole
    device, distributed-ucxx's own wait) while it runs, and puts the comm's wait back
    after; the cores are the one-GPU ones (nothing was sent before it was complete)."""
    pytest.importorskip("distributed_ucxx")
    from distributed import Client

    def state():
        from distributed_ucxx import ucxx as comm

        from src_dask import ucx as _ucx

        return (_ucx.stream_syncs, getattr(comm, "_src_dask_runs", None),
                comm.synchronize_stream is getattr(comm, "_src_dask_original_sync", None))

    trains = (random_mpo(10, 4, seed=1), random_mpo(10, 3, seed=2),
              random_mps(10, 48, seed=3))
    opts = dict(chi_out=64, seed=3, chunk=16)
    ref = _on("gpu", *trains, **opts)
    with src_dask.cluster(gpus=2, dashboard_address=":0") as cluster, \
            Client(cluster) as client:
        assert client.scheduler.address.startswith("ucx://")
        y = src_dask.src(*trains, client=client, **opts)
        after = client.run(state)
        with dask.config.set({"src_dask.ucx-sync": "device"}):
            z = src_dask.src(*trains, client=client, **opts)
        unchanged = client.run(state)
    assert all(syncs > 0 and runs == 0 and restored for syncs, runs, restored in after.values())
    assert {w: v[0] for w, v in unchanged.items()} == {w: v[0] for w, v in after.items()}
    _same(y, ref)
    _same(z, ref)


def test_plan_counts_no_more_device_than_the_rmm_pool_may_take():
    """A worker whose RMM pool may grow to 0.6 of the GPU has 0.6 of it for the plan
    (of the GPU's memory as dask-cuda counts it, NVML's total: 0.4 % more than CUDA's
    on an H200)."""
    pytest.importorskip("rmm", reason="RMM's pools need rmm (the gpu extra's UCX stack)")
    from dask_cuda.utils import get_device_total_memory
    from distributed import Client

    from src_dask._cluster import worker_facts

    total = get_device_total_memory(0)
    with src_dask.cluster(gpus=1, rmm_async=False, rmm_pool_size=0.5,
                          rmm_maximum_pool_size=0.6, dashboard_address=":0") as cluster, \
            Client(cluster) as client:
        facts = worker_facts(client, "gpu")
    assert abs(facts.device_memory - 0.6 * total) <= 2**20


def test_saved_trains_are_read_from_their_chunk_files_with_this_zarr(tmp_path, monkeypatch):
    """The GPU machine runs a newer zarr-python than CI (3.4 against 3.1), whose
    classes changed: saved trains must still be read from their chunk files there,
    not through Zarr's reader (which holds the GIL for every chunk's checksum)."""
    import zarr

    from src_dask import _integrity

    x = random_mps(4, 8, seed=1)
    src_dask.save(x, tmp_path / "x")
    y = src_dask.open(tmp_path / "x")
    calls = []
    original = zarr.Array.get_basic_selection
    monkeypatch.setattr(zarr.Array, "get_basic_selection",
                        lambda self, *a, **k: calls.append(1) or original(self, *a, **k))
    for j in range(4):
        assert _integrity._chunk_dir(y.source(j).array) is not None, zarr.__version__
        assert np.array_equal(y.source(j).read(), x[j])
    assert not calls


@pytest.mark.timeout(120)
def test_the_slurm_scripts_pass_options_this_dask_cuda_has():
    """Every option the Slurm examples and the README give `dask cuda worker` is one it
    has (a renamed option was skipped by the scripts' own check, so CuPy allocated
    beside RMM's pool and two workers sharing a GPU ran out of it)."""
    import re
    from pathlib import Path

    help_text = subprocess.run([sys.executable, "-m", "dask", "cuda", "worker", "--help"],
                               capture_output=True, text=True, check=True, timeout=100).stdout
    slurm = Path(__file__).resolve().parent.parent / "examples" / "slurm"
    for script in ("two_nodes_local.sh", "src_dask.sbatch"):
        text = slurm.joinpath(script).read_text()
        lines = [line for line in text.splitlines()
                 if re.search(r"\b(GPU_OPTS|RMM)\+?=|--help \S* ?\| grep", line)]
        options = {o for line in lines for o in re.findall(r"(?<![\w-])--[a-z][a-z-]+", line)}
        options -= {"--help"}
        assert "--set-rmm-allocator-for-libs" in options and "--rmm-pool-size" in options
        missing = sorted(o for o in options if o not in help_text)
        assert not missing, f"{script}: {missing}"
    sys.path.insert(0, str(slurm))
    from jobqueue import GPU_WORKER_ARGS  # examples/slurm/jobqueue.py's GPU jobs

    missing = sorted(o for o in GPU_WORKER_ARGS if o.startswith("--") and o not in help_text)
    assert not missing, f"jobqueue.py: {missing}"
    # the docs' `dask cuda worker` by hand (the command and its continued lines)
    readme = (slurm.parent.parent / "docs" / "hpc.md").read_text().splitlines()
    starts = [i for i, line in enumerate(readme) if line.startswith("dask cuda worker")]
    assert starts
    for i in starts:
        command = readme[i]
        while command.endswith("\\"):
            i += 1
            command = command[:-1] + readme[i]
        options = set(re.findall(r"(?<![\w-])--[a-z][a-z-]+", command))
        assert "--set-rmm-allocator-for-libs" in options
        missing = sorted(o for o in options if o not in help_text)
        assert not missing, f"README: {missing}"


@pytest.mark.timeout(300)
def test_a_jobqueue_gpu_job_starts_a_dask_cuda_worker_that_runs_src(tmp_path):
    """The worker command of examples/slurm/jobqueue.py's ``--gpu`` job script (as
    dask-jobqueue writes it; run here, as Slurm would on a GPU node) starts a
    ``dask cuda worker`` on the GPU that joins the SLURMCluster's scheduler, and
    ``src`` on it gives the CPU cores."""
    import shlex
    from pathlib import Path

    pytest.importorskip("dask_jobqueue", reason="the hpc extra's dask-jobqueue")
    from dask_jobqueue import SLURMCluster
    from distributed import Client

    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "examples" / "slurm"))
    from jobqueue import GPU_WORKER_ARGS, cluster_options

    opts = cluster_options(True, "127.0.0.1", cores=4, memory="16GB", python=sys.executable,
                           local_directory=str(tmp_path))
    a, x = STACKS["mpo.mps"](np.complex128)
    with SLURMCluster(**opts) as cluster, Client(cluster) as client:
        script = cluster.job_script()
        assert "#SBATCH --gres=gpu:1" in script
        command = script.strip().splitlines()[-1]
        assert "-m dask_cuda.cli" in command and " ".join(GPU_WORKER_ARGS) in command
        worker = subprocess.Popen(shlex.split(command),
                                  env={**os.environ, "CUDA_VISIBLE_DEVICES": "0"})
        try:
            client.wait_for_workers(1, timeout=120)
            kinds = client.run(lambda dask_worker: type(dask_worker.data).__name__)
            y = src_dask.apply(a, x, 32, seed=2, chunk=8, client=client)
        finally:
            worker.terminate()
            worker.wait(60)
    assert list(kinds.values()) == ["DeviceHostFile"]  # dask-cuda's device -> host spilling
    _same(y, _on("cpu", a, x, chi_out=32, seed=2, chunk=8))


# The check that two_nodes_local.sh runs on its two workers (COMMAND): odd stacks
# through the split pass 2, against the one-process CPU run made before connecting.
_PAIR_CHECK = r'''
import sys

import dask
import numpy as np
from distributed import Client, get_task_stream
from distributed.utils import key_split

sys.path.insert(0, sys.argv[2])
from helpers import dense_product, random_mpo, random_mps

import src_dask

f64, c128, c64 = np.float64, np.complex128, np.complex64
ROWS = {"src_dask.projection-block-size": 16 * 64}  # Z in row blocks
cases = {  # name: (trains, options, settings, tolerance of the dtype, chi_out exact)
    "mpo.mps phys 3, uneven bonds, 5 sites": (
        (random_mpo(5, [2, 3, 2, 3], phys=3, dtype=f64, seed=1),
         random_mps(5, [3, 4, 2, 5], phys=3, dtype=f64, seed=2)),
        dict(chi_out=64, seed=1, chunk=5), {}, 1e-12, True),
    "bra.mpo.mpo, 3 sites": (
        (random_mps(3, [3, 4], dtype=c128, seed=3), random_mpo(3, 2, dtype=c128, seed=4),
         random_mpo(3, [2, 3], dtype=c128, seed=5)),
        dict(chi_out=64, seed=2, chunk=4), {}, 1e-12, True),
    "mpo.mpo, 2 sites, complex64": (
        (random_mpo(2, 3, phys=3, dtype=c64, seed=6),
         random_mpo(2, 2, phys=3, dtype=c64, seed=7)),
        dict(chi_out=64, seed=3, chunk=3), {}, 1e-4, True),
    "mps compressed, oversampled, cutoff": (
        (random_mps(7, 12, dtype=c128, seed=8, decay=0.6),),
        dict(chi_out=5, seed=4, chunk=3, oversample=3, cutoff=1e-8), {}, 1e-12, False),
    "mpo.mpo.mps, Z in row blocks": (
        (random_mpo(8, 3, phys=3, dtype=c128, seed=9),
         random_mpo(8, 2, phys=3, dtype=c128, seed=10),
         random_mps(8, 9, phys=3, dtype=c128, seed=11)),
        dict(chi_out=24, seed=5, chunk=10), ROWS, 1e-12, False),
}
refs = {}
for name, (trains, opts, settings, _, _) in cases.items():
    with dask.config.set({"src_dask.device": "cpu", "scheduler": "threads", **settings}):
        refs[name] = src_dask.src(*trains, **opts)
workers = int(sys.argv[3])
with Client(scheduler_file=sys.argv[1], timeout="60s") as client:
    client.wait_for_workers(workers, timeout=120)
    for name, (trains, opts, settings, tol, exact) in cases.items():
        # graphs of many tasks, as a large run's (a small run is one task by default)
        with dask.config.set({**settings, "src_dask.one-task-flops": 0}), \
                get_task_stream(client=client) as stream:
            y = src_dask.src(*trains, client=client, **opts)
        projected = {t["worker"] for t in stream.data
                     if key_split(t["key"]).startswith("pass2") and t["key"][1] == "project"}
        # pass 2 split: over every worker where Z has the rows for it
        assert 2 <= len(projected) <= workers, (name, projected)
        assert len(projected) == workers or "row blocks" not in name, (name, projected)
        ref = refs[name]
        for j, (c, c0) in enumerate(zip(y, ref, strict=True)):
            c, c0 = np.asarray(c), np.asarray(c0)
            assert c.shape == c0.shape and c.dtype == c0.dtype, (name, j, c.shape, c0.shape)
            assert np.abs(c - c0).max() <= 1e3 * tol * np.abs(c0).max(), (name, j)
        if exact:
            d0 = dense_product(*trains)
            assert np.linalg.norm(y.to_dense() - d0) <= 1e2 * tol * np.linalg.norm(d0), name

    def syncs():
        from src_dask import ucx as _ucx

        return _ucx.stream_syncs

    if sys.argv[4:] != ["--no-ucx"]:  # the comm waited for the default stream only
        assert all(n > 0 for n in client.run(syncs).values())
print(f"checked {len(cases)} stacks on {workers} GPU workers")
'''


@pytest.mark.timeout(600)
@pytest.mark.parametrize("workers", [2, 3])
def test_split_pass_2_on_gpu_workers_gives_the_cpu_cores_for_odd_stacks(tmp_path, workers):
    """Two or three `dask cuda worker`s over UCX, started as under Slurm (two on two
    GPUs; else sharing the first GPU, each with its share of the memory): pass 2 split
    over all gives the one-process CPU run's cores for odd stacks (physical dimension
    3, uneven bonds, 2 and 3 sites, a bra, complex64, oversampling with a cutoff, Z in
    row blocks), and the product when chi_out is exact; the UCX comm waited for the
    default stream only."""
    from pathlib import Path

    import cupy

    pytest.importorskip("distributed_ucxx")
    root = Path(__file__).resolve().parent.parent
    bin_dir = tmp_path / "bin"  # the commands the example calls, this Python's (a
    bin_dir.mkdir()             # script: a link to a virtualenv's python leaves the env)
    for name, args in (("python", ""), ("dask", " -m dask")):
        (bin_dir / name).write_text(f'#!/bin/sh\nexec "{sys.executable}"{args} "$@"\n')
        (bin_dir / name).chmod(0o755)
    check = tmp_path / "check.py"
    check.write_text(_PAIR_CHECK)
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "PROTOCOL": "ucx",
           "COMMAND": f'python "{check}" "$SCHEDULER_FILE" "{root / "tests"}" {workers}'}
    if workers == 2 and cupy.cuda.runtime.getDeviceCount() >= 2:
        env["GPUS"] = "0 1"
    else:  # as gpu_run.sh's stand-in: 0.7 of the device for data, pools to 0.9, shared
        share = 1 / workers
        env.update(GPUS=" ".join(["0"] * workers), DEVICE_MEMORY_LIMIT=f"{0.7 * share:.3f}",
                   RMM_POOL_SIZE=f"{0.7 * share:.3f}", RMM_MAXIMUM_POOL_SIZE=f"{0.9 * share:.3f}")
    run = subprocess.run(["bash", str(root / "examples/slurm/two_nodes_local.sh"),
                          str(tmp_path / "two")], env=env, capture_output=True, text=True,
                         timeout=560, cwd=root)
    logs = "".join(p.read_text()[-2000:] for p in (tmp_path / "two/logs").glob("node*.log"))
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-5000:] + logs
    assert f"checked 5 stacks on {workers} GPU workers" in run.stdout + run.stderr


@pytest.mark.timeout(600)
@pytest.mark.parametrize("threads, host", [(1, False), (4, False), (4, True)])
def test_a_stack_under_a_capped_rmm_pool_gives_the_uncapped_cores(tmp_path, threads, host):
    """The src-method stack at D_M=256 (environments ~0.74 GB) on one worker whose RMM
    pool starts at 256 MB and may grow to 640 MB, as a smaller GPU would: the plan
    keeps its peak within the pool, sends environments to host memory and projects
    each ``Z`` twice rather than keep it (``Plan.reproject``: ``Z`` is 1 GB), every
    step that still runs out is computed in pieces, and the cores are the uncapped
    run's. ``host``: the worker keeps little in host memory too (a dask-cuda worker's
    host buffer keeps data up to its limit and spills only once the process passes the
    spill threshold, here 30 % of 4 GB, less than the environments with the process),
    so environments go on to its disk, and none is left there."""
    pytest.importorskip("rmm", reason="RMM's pools need rmm (the gpu extra's UCX stack)")
    from dask_cuda import LocalCUDACluster
    from distributed import Client

    trains = [t.to_numpy() for t in src_dask.problems.stack(12, 256, seed=3).values()]
    ref = _on("gpu", *trains, chi_out=256, seed=1)
    memory = {"memory_limit": "4GB"} if host else {}
    with dask.config.set({"distributed.worker.memory.target": 0.05 if host else 0.6,
                          "distributed.worker.memory.spill": 0.3 if host else 0.7}), \
            LocalCUDACluster(n_workers=1, threads_per_worker=threads,
                             device_memory_limit="256MB", rmm_pool_size="256MB",
                             rmm_maximum_pool_size="640MB",
                             rmm_allocator_external_lib_list=["cupy"],
                             local_directory=str(tmp_path), dashboard_address=":0",
                             **memory) as cluster, \
            Client(cluster) as client:
        plan = src_dask.plan(*trains, chi_out=256, seed=1, client=client)
        assert plan.peak_device <= plan.device_memory <= 640e6, plan
        assert plan.reproject and plan.host_envs, plan
        assert (plan.disk_envs > 0) is host, plan
        y = src_dask.src(*trains, chi_out=256, seed=1, client=client)
        left = [p.name for p in tmp_path.rglob("src_dask-env-*")]
    assert plan.env_bytes > 640e6
    assert left == []
    _same(y, ref, tol=1e-10, dense=False)


@pytest.mark.timeout(300)
def test_the_slurm_runner_example_runs_src_on_a_cuda_worker(tmp_path):
    """examples/slurm/runner.py ``--gpu`` as ``srun -n 3`` starts it inside an
    allocation (dask-jobqueue's SLURMRunner: rank 0 the scheduler, rank 1 the client,
    rank 2 a ``dask_cuda.CUDAWorker`` on the GPU; the ranks told by Slurm's variables,
    set here as srun sets them): the run completes on that worker and its store holds
    the CPU cores."""
    from pathlib import Path

    pytest.importorskip("dask_jobqueue", reason="the hpc extra's dask-jobqueue")
    a, x = STACKS["mpo.mps"](np.complex128)
    for i, t in enumerate((a, x)):
        src_dask.save(t, tmp_path / "in" / str(i))
    runner = Path(__file__).resolve().parent.parent / "examples" / "slurm" / "runner.py"
    command = [sys.executable, str(runner), "--gpu", "--inputs", str(tmp_path / "in"),
               "--store", str(tmp_path / "run.zarr"), "--chi-out", "32", "--seed", "2",
               "--timeout", "120"]
    logs = [open(tmp_path / f"rank{rank}.log", "w") for rank in range(3)]  # noqa: SIM115
    ranks = [subprocess.Popen(command, cwd=tmp_path, stdout=logs[rank],
                              stderr=subprocess.STDOUT, text=True,
                              env={**os.environ, "SLURM_PROCID": str(rank),
                                   "SLURM_NTASKS": "3", "SLURM_JOB_ID": "7",
                                   "CUDA_VISIBLE_DEVICES": "0"})
             for rank in range(3)]
    try:
        ranks[1].wait(240)  # the client's rank ends the job
    finally:
        for p in ranks:
            if p.poll() is None:
                p.terminate()
        for p, log in zip(ranks, logs, strict=True):
            p.wait(60)
            log.close()
    out = (tmp_path / "rank1.log").read_text()
    assert ranks[1].returncode == 0, out[-3000:] + (tmp_path / "rank2.log").read_text()[-3000:]
    assert "on 1 workers" in out
    opened = [src_dask.open(tmp_path / "in" / str(i)) for i in range(2)]
    y = src_dask.src(*opened, chi_out=32, seed=2, store=tmp_path / "run.zarr")  # its result
    _same(y, _on("cpu", a, x, chi_out=32, seed=2))


@pytest.mark.parametrize("way", ["interleaved", "cublas", "three"])
def test_complex_products_made_from_real_ones_on_the_gpu_are_the_native_ones(way, monkeypatch):
    """Each way of ``_kernels.matmul`` on CuPy operands, plain, transposed and conjugated,
    against CuPy's ZGEMM; and a whole run made with them against the native run."""
    import cupy

    from src_dask import _cublas, _kernels

    if way == "cublas" and not _cublas.available():
        pytest.skip("this cuBLAS has no cublasZgemm3m")
    monkeypatch.setattr(_kernels, "THREE_REAL_MIN", 64)
    rng = cupy.random.default_rng(0)

    def rand(*shape):
        return rng.standard_normal(shape) + 1j * rng.standard_normal(shape)

    m, k, n = {"interleaved": (5000, 16, 24), "cublas": (300, 700, 400),
               "three": (600, 700, 800)}[way]
    made = []
    real = getattr(_kernels, "_interleaved_product" if way == "interleaved" else
                   "_three_real_product", None)
    if way == "cublas":
        real = _cublas.gemm3m
        monkeypatch.setattr(_cublas, "gemm3m", lambda *a, **kw: made.append(1) or real(*a, **kw))
    else:
        monkeypatch.setattr(_kernels, "CUBLAS_3M_SIDE", 0)  # the planes, not cuBLAS's 3M
        monkeypatch.setattr(_kernels, real.__name__,
                            lambda *a, **kw: made.append(1) or real(*a, **kw))
    with dask.config.set({"src_dask.complex-products": "3m"}):
        for a, b in [(rand(m, k), rand(k, n)), (rand(k, m).T, rand(n, k).T)]:
            for conj in (False, True):
                want = cupy.matmul(a.conj() if conj else a, b)
                got = _kernels.matmul(a, b, conj_a=conj)
                err = float(cupy.abs(got - want).max() / cupy.abs(want).max())
                assert err <= 1e-13, (way, conj, a.flags.c_contiguous, err)
        assert len(made) == 4
        trains = STACKS["mpo.mps"](np.complex128)
        y = _on("gpu", *trains, chi_out=64, seed=1)
    with dask.config.set({"src_dask.complex-products": "native"}):
        ref = _on("gpu", *trains, chi_out=64, seed=1)
    _same(y, ref, tol=1e-12)


@pytest.mark.parametrize("dtype", [np.complex128, np.float32])
def test_small_cores_applied_on_the_gpu_are_the_einsum(dtype, monkeypatch):
    """``_kernels._apply_small``'s CUDA kernel against CuPy's einsum on a stack's
    projection and pass 1, and a whole run made with it against the run without."""
    import cupy

    from src_dask import _kernels

    monkeypatch.setattr(_kernels, "APPLY_LARGE_MIN", 1000)
    made = count_calls(monkeypatch, _kernels, "_apply_small")
    rng = np.random.default_rng(0)

    def rand(*shape):
        x = rng.standard_normal(shape) + (1j * rng.standard_normal(shape)
                                         if np.dtype(dtype).kind == "c" else 0)
        return cupy.asarray(x.astype(dtype))

    cores = [rand(*s) for s in [(4, 2, 3, 4), (3, 4, 4, 2), (90, 70, 2, 5), (2, 3, 5, 3)]]
    a, b, x = _kernels._symbols(4)
    project = ",".join(_kernels._core_terms(4)) + f",r{b}->{a}r{x[0]}{x[4]}"
    sketch = _kernels._sketch_step_eq(4)
    env, left, omega = rand(60, 2, 4, 70, 3), rand(50, 4, 3, 90, 2), rand(50, 3, 3)
    tol = 1e-12 if dtype == np.complex128 else 1e-5
    for eq, ops in [(project, (*cores, env)), (sketch, (left, omega, *cores))]:
        want = cupy.einsum(eq, *ops)
        got = _kernels.contract(eq, *ops)
        assert float(cupy.abs(got - want).max() / cupy.abs(want).max()) <= tol, eq
    assert len(made) >= 3
    trains = STACKS["mpo.mpo.mps"](np.complex128)
    y = _on("gpu", *trains, chi_out=64, seed=1)
    monkeypatch.setattr(_kernels, "APPLY_SMALL_MAX", 0)
    _same(y, _on("gpu", *trains, chi_out=64, seed=1), tol=1e-12)


@pytest.mark.timeout(300)
def test_an_allocation_that_meets_a_pool_full_of_stored_data_spills_it_and_goes_on():
    """A dask-cuda worker whose RMM pool (1 GiB, not growing) is mostly stored data it
    has no reason to spill (below its device limit): an allocation that does not fit
    raises MemoryError, as outside src_dask's steps it did before (a block of inputs
    copied to the device; dask-cuda bringing a spilled input back). Once a run's plan
    has asked the worker, the same allocation spills the least recently used stored
    data to host memory and succeeds, and the stored data come back intact."""
    pytest.importorskip("rmm", reason="RMM's pools need rmm")
    from dask_cuda import LocalCUDACluster
    from distributed import Client, wait

    n = 2**25  # 256 MiB of float64

    def block(i):
        import cupy

        return cupy.full(n, i, dtype=cupy.float64)

    def allocate(nbytes):
        import cupy

        return int(cupy.ones(nbytes // 8, dtype=cupy.float64).sum())

    def total(x):
        return float(x.sum())

    with LocalCUDACluster(n_workers=1, threads_per_worker=1, rmm_pool_size="1GiB",
                          rmm_maximum_pool_size="1GiB", device_memory_limit="1000MiB",
                          rmm_allocator_external_lib_list=["cupy"],
                          dashboard_address=":0") as cluster, Client(cluster) as client:
        blocks = [client.submit(block, i, pure=False) for i in range(3)]
        wait(blocks)
        with pytest.raises(MemoryError):
            client.submit(allocate, 400 * 2**20, pure=False).result()
        src_dask.plan(*STACKS["mpo.mps"](np.complex128), chi_out=8, client=client)
        assert client.submit(allocate, 400 * 2**20, pure=False).result() == 400 * 2**17
        assert [client.submit(total, b, pure=False).result() for b in blocks] == \
            [float(i * n) for i in range(3)]
