"""Out-of-memory halving, on the CPU with a simulated allocator limit."""

from __future__ import annotations

import contextlib
import logging
import threading
import time
import weakref
from collections.abc import MutableMapping

import numpy as np
import pytest
from helpers import random_mpo, random_mps

import src_dask
from src_dask import _kernels as K
from src_dask import _oom
from src_dask.diagnostics import memory_events


class _Allocator:
    """A simulated device allocator: a block of more than ``limit`` sketch columns
    raises MemoryError, as CuPy's pool does when it cannot allocate."""

    def __init__(self, limit: int):
        self.limit = limit
        self.refused = {"sketch_step": 0, "sketch_piece": 0}

    def wrap(self, name: str, func, columns):
        def kernel(*args, **kwargs):
            if columns(*args, **kwargs) > self.limit:
                self.refused[name] += 1
                raise MemoryError("Out of memory allocating 1,234 bytes (simulated)")
            return func(*args, **kwargs)
        return kernel


@pytest.fixture
def allocator(monkeypatch):
    def install(limit: int) -> _Allocator:
        alloc = _Allocator(limit)
        monkeypatch.setattr(K, "sketch_step", alloc.wrap(
            "sketch_step", K.sketch_step, lambda *a, **kw: kw["omega"].shape[0]))
        monkeypatch.setattr(K, "sketch_piece", alloc.wrap(
            "sketch_piece", K.sketch_piece, lambda env, state: env.shape[0]))
        return alloc
    return install


def test_halving_gives_the_same_result_and_keeps_the_split(allocator, caplog):
    a, x = random_mpo(8, 3, seed=1), random_mps(8, 6, seed=2)
    ref = src_dask.apply(a, x, 24, seed=4, chunk=12)
    alloc = allocator(limit=4)
    with caplog.at_level(logging.WARNING, logger="src_dask"):
        y = src_dask.apply(a, x, 24, seed=4, chunk=12)
    for c, c0 in zip(y, ref, strict=True):
        assert np.abs(c - c0).max() <= 1e-12 * np.abs(c0).max()
    # 12 -> 6 -> 3 columns: two refusals per block the first time (the two blocks may
    # race at the first site); later sites start at 3 and are never refused
    assert 2 <= alloc.refused["sketch_step"] <= 2 * 2
    assert 2 <= alloc.refused["sketch_piece"] <= 2 * 2
    warned = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any("pass 1" in m and "site 0" in m
               and "out of host memory on 12 sketch columns" in m for m in warned), warned
    assert any("pass 2's sketch" in m and "in pieces of 3 from now on" in m for m in warned)


def test_one_column_that_does_not_fit_says_how_much_is_needed(allocator):
    a, x = random_mpo(6, 3, seed=1), random_mps(6, 6, seed=2)
    allocator(limit=0)
    with pytest.raises(MemoryError, match=r"site 0, pass 1: one sketch column does not fit "
                                          r"in host memory; it needs about [0-9.]+ MiB.*"
                                          r"memory_limit / --memory-limit"):
        src_dask.apply(a, x, 8, seed=0, chunk=8)


def test_a_projection_row_that_does_not_fit_names_the_site_and_its_memory(monkeypatch):
    """A real MemoryError of NumPy (an allocation larger than any machine) in the
    projection of pass 2 is halved down to one row, then names the site, the step and
    what one row needs."""
    def huge(*args, **kwargs):
        return np.empty(1 << 62, dtype=np.uint8)  # raises MemoryError

    monkeypatch.setattr(K, "project_core", huge)
    a, x = random_mpo(5, 2, seed=1), random_mps(5, 3, seed=2)
    with pytest.raises(MemoryError, match=r"site \d, pass 2's projection: one row of the "
                                          r"projected core does not fit in host memory; it "
                                          r"needs about [0-9.]+ MiB"):
        src_dask.apply(a, x, 6, seed=0)


def test_a_real_host_memory_error_is_computed_in_halves(monkeypatch, caplog):
    """NumPy's own MemoryError (not a simulated one) in pass 1 is halved like CuPy's."""
    original, seen = K.sketch_step, []

    def sketch_step(env, cores, *, omega, site):
        seen.append(omega.shape[0])
        if omega.shape[0] > 2:
            np.empty(1 << 62, dtype=np.uint8)  # raises MemoryError
        return original(env, cores, omega=omega, site=site)

    monkeypatch.setattr(K, "sketch_step", sketch_step)
    a, x = random_mpo(6, 2, seed=1), random_mps(6, 3, seed=2)
    with caplog.at_level(logging.WARNING, logger="src_dask"):
        y = src_dask.apply(a, x, 8, seed=0, chunk=8)
    monkeypatch.setattr(K, "sketch_step", original)
    ref = src_dask.apply(a, x, 8, seed=0, chunk=8)
    for c, c0 in zip(y, ref, strict=True):
        assert np.abs(c - c0).max() <= 1e-12 * np.abs(c0).max()
    assert seen[0] > 2 and 2 in seen  # the whole block first, then halves
    assert any(f"out of host memory on {seen[0]} sketch columns" in r.getMessage()
               for r in caplog.records)


def test_other_errors_are_not_taken_for_memory(monkeypatch):
    def broken(*args, **kwargs):
        raise ValueError("a bug, not a memory problem")

    monkeypatch.setattr(K, "sketch_step", broken)
    with pytest.raises(ValueError, match="a bug"):
        src_dask.apply(random_mpo(5, 2, seed=0), random_mps(5, 2, seed=0), 4, seed=0)


def test_oom_recognised_from_gpu_libraries():
    assert _oom.is_oom(MemoryError("std::bad_alloc: out_of_memory: RMM failure"))
    assert _oom.is_oom(RuntimeError("CUBLAS_STATUS_ALLOC_FAILED"))
    assert _oom.is_oom(RuntimeError("cudaErrorMemoryAllocation: out of memory"))
    assert not _oom.is_oom(ValueError("shapes do not match"))


def _refusing(monkeypatch, name: str, rows, limit: int) -> dict[str, int]:
    """Kernel ``name`` of ``_kernels`` raising a MemoryError on more than ``limit`` rows
    (``rows(*args)`` counts them), as a device pool does; its refusals and calls."""
    original, count = getattr(K, name), {"refused": 0, "ran": 0}

    def kernel(*args, **kwargs):
        if rows(*args) > limit:
            count["refused"] += 1
            raise MemoryError("Maximum pool size exceeded (simulated)")
        count["ran"] += 1
        return original(*args, **kwargs)

    monkeypatch.setattr(K, name, kernel)
    return count


@pytest.mark.parametrize("limit", ["30 MiB", None])  # rows of Z in blocks, or Z whole
@pytest.mark.parametrize("dtype", [np.complex128, np.float64])
def test_every_step_of_pass_2_is_halved(monkeypatch, caplog, limit, dtype):
    """The projection (rows of S), the environment update (rows of S_{j-1}, in the
    fused step and in the running sums along Z's row blocks) are computed in pieces
    when they do not fit, down to what fits, with the same cores; one warning per
    kind of step and size."""
    import dask

    trains = (random_mpo(7, 4, phys=3, seed=1, dtype=dtype),
              random_mpo(7, 3, phys=3, seed=2, dtype=dtype),
              random_mps(7, (5, 9, 12, 12, 9, 5), phys=3, seed=3, dtype=dtype))
    settings = {"src_dask.memory-limit": limit} if limit else {}
    with dask.config.set(settings):
        ref = src_dask.src(*trains, chi_out=40, seed=2)
        project = _refusing(monkeypatch, "project_core",
                            lambda cores, env, *rest: 0 if env is None else env.shape[0], 3)
        update = _refusing(monkeypatch, "update_env", lambda eta, zs: eta.shape[0], 5)
        with caplog.at_level(logging.WARNING, logger="src_dask"):
            y = src_dask.src(*trains, chi_out=40, seed=2)
    for c, c0 in zip(y, ref, strict=True):
        assert np.abs(c - c0).max() <= 1e-12 * np.abs(c0).max()
    assert project["refused"] and update["refused"] and project["ran"] and update["ran"]
    warned = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any("pass 2's projection" in m and "pieces of 3 from now on" in m for m in warned)
    assert any("pass 2's update" in m and "pieces of 5 from now on" in m for m in warned)
    # later tasks start at the size that worked: far fewer refusals than calls
    assert project["refused"] <= 4 and update["refused"] <= 4


def test_the_qr_of_the_sketch_is_one_piece_and_says_so(monkeypatch):
    def huge(*args, **kwargs):
        raise MemoryError("Maximum pool size exceeded (simulated)")

    monkeypatch.setattr(K, "_orthonormal_rows", huge)  # the QR of the sketch
    a, x = random_mpo(5, 2, seed=1), random_mps(5, 3, seed=2)
    with pytest.raises(MemoryError, match=r"site 4, pass 2's QR: out of host memory .*"
                                          r"this step is one piece"):
        src_dask.apply(a, x, 6, seed=0)


class _Worker:
    """What :func:`_oom._spill_device_data` reads of a dask-cuda worker: its device
    buffer, a zict ``Buffer`` whose fast side is the device and slow side the host."""

    def __init__(self, n: float = 1000):
        import zict

        self.host: dict = {}
        self.data = type("Data", (), {})()
        self.data.device_buffer = zict.Buffer({}, self.host, n=n, weight=lambda k, v: v.nbytes)


@pytest.fixture(autouse=True)
def _no_worker_of_the_process(monkeypatch):
    """No test sees another's registered worker or allocation wait."""
    monkeypatch.setattr(_oom, "_WORKER", None)
    _oom._THREAD.__dict__.clear()
    _oom.events(reset=True)
    yield
    _oom._THREAD.__dict__.clear()


@pytest.fixture
def worker(monkeypatch):
    import distributed

    w = _Worker()
    monkeypatch.setattr(distributed, "get_worker", lambda: w)
    return w


def test_spilling_for_an_allocation_moves_the_least_recently_used_data_first(worker):
    buffer = worker.data.device_buffer
    blocks = {k: np.full(25, i, dtype=np.float64) for i, k in enumerate("abcd")}  # 200 B each
    for k, v in blocks.items():
        buffer[k] = v
    buffer["a"]  # used last: moved last
    assert _oom._spill_for(300) is True  # two blocks of 200 B reach 300
    assert sorted(worker.host) == ["b", "c"]
    assert memory_events() == {"spilled_bytes": 400}
    assert all(np.array_equal(buffer[k], blocks[k]) for k in "abcd")  # nothing lost


def test_spilling_moves_the_inputs_of_running_tasks_last(worker):
    """A running task holds its inputs: moving one frees its memory only as the task
    ends, and a task that wants it meanwhile copies it back to the device beside the
    first. So the other stored data goes first, least recently used first."""
    from types import SimpleNamespace as NS

    buffer = worker.data.device_buffer
    for i, k in enumerate("abcd"):
        buffer[k] = np.full(25, i, dtype=np.float64)  # 200 B each, a used least recently
    running = NS(dependencies=[NS(key="a"), NS(key="b")])  # TaskStates, as far as read
    worker.state = NS(executing=[running])
    assert _oom._spill_for(300) is True and sorted(worker.host) == ["c", "d"]
    assert _oom._spill_for(100) is True and sorted(worker.host) == ["a", "c", "d"]
    assert np.array_equal(buffer["a"], np.zeros(25))  # nothing lost


def test_spilling_says_no_once_nothing_is_left_to_move(worker, monkeypatch, caplog):
    """Once nothing is left to move, RMM raises; the log says what holds the device
    (for an allocation that is not cut smaller by its step: that one fails quietly)."""
    worker.data.device_buffer["x"] = np.zeros(4)
    assert _oom._spill_for(10**9) is True  # what there was is moved
    worker.data.device_buffer.n = 2**30
    worker.data.device_buffer["y"] = np.zeros(2**27, dtype=np.int8)
    worker.state = type("State", (), {"executing": [type("Task", (), {
        "dependencies": [type("Dep", (), {"key": "y"})]})]})

    def refusing(key=None):
        raise TypeError("Could not serialize (simulated)")

    monkeypatch.setattr(worker.data.device_buffer.fast, "evict", refusing)
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="src_dask"):
        with _oom._handles_oom():
            assert _oom._spill_for(10**9) is False
        assert caplog.text == ""
        assert _oom._spill_for(3 * 2**20) is False  # RMM then raises its MemoryError
    assert ("an allocation of 3.0 MiB fails on the device: 0.12 GiB of stored data on it "
            "(1 values, 0.12 GiB of them inputs of running tasks); 0 tasks running"
            in caplog.text)


def test_a_value_that_cannot_be_spilled_stays_and_the_next_one_goes(worker, monkeypatch,
                                                                    caplog):
    """Spilling a CuPy array that is not contiguous needs a device copy, which a full
    pool refuses (distributed then raises "Could not serialize"): that value stays on
    the device, nothing is lost, and the next least recently used one is moved; an
    error never crosses into RMM."""
    buffer = worker.data.device_buffer
    buffer["x"], buffer["y"] = np.zeros(4), np.ones(4)  # x used least recently
    evict = buffer.fast.evict

    flags = []

    def refusing_x(key=None):
        flags.append(getattr(_oom._THREAD, "splits", 0))  # a copy it needs must not wait
        if key == "x":
            raise TypeError("Could not serialize object of type ndarray (simulated)")
        return evict(key)

    monkeypatch.setattr(buffer.fast, "evict", refusing_x)
    with caplog.at_level(logging.INFO, logger="src_dask"):
        assert _oom._spill_for(10) is True
    assert list(worker.host) == ["y"] and "x" in buffer.fast
    assert "could not spill x" in caplog.text and min(flags) >= 1
    assert np.array_equal(buffer.fast["x"], np.zeros(4))  # nothing lost
    assert np.array_equal(worker.host["y"], np.ones(4))
    assert _oom._spill_for(10) is False  # only x is left, and it cannot move

    def broken(key=None):
        raise OSError("host memory full (simulated)")

    monkeypatch.setattr(buffer.fast, "evict", broken)
    monkeypatch.setattr(_oom, "_spill_device_data", lambda need: 1 / 0)
    with caplog.at_level(logging.ERROR, logger="src_dask"):
        assert _oom._spill_for(10) is False  # logged, not raised into RMM's C++
    assert "ZeroDivisionError" in caplog.text


def test_an_allocation_on_the_event_loop_spills_the_process_workers_data(fake_rmm):
    """dask-cuda brings a spilled input back to the device on the worker's event loop,
    where ``distributed.get_worker()`` knows no worker: the callback still finds the
    worker whose resource it wraps and spills its data (it spilled nothing there, and
    a D_M=1000 stack in a 4 GB pool failed within a second)."""
    import distributed

    with pytest.raises(ValueError):
        distributed.get_worker()  # as on the event loop
    worker = _Worker()
    assert _oom.spill_on_allocation_failure(worker) is True
    worker.data.device_buffer["x"] = np.zeros(4)
    assert _oom._spill_for(10) is True
    assert list(worker.host) == ["x"]
    del worker  # the callback keeps no worker alive
    assert _oom._spill_for(10) is False


def test_an_allocation_waits_for_running_tasks_only_where_nothing_else_can(worker,
                                                                          monkeypatch):
    """With nothing left to spill, an allocation outside src_dask's steps (an input
    brought back before its task starts) is tried again while another task runs on
    the worker, for up to ``WAIT_S``; one inside a step that cuts its own work
    (:func:`_oom.halving` above one row, :func:`_oom.waiting`) fails at once, as does
    one on a worker where no other task runs (nothing would free memory)."""
    import threading

    slept = []
    monkeypatch.setattr(_oom.time, "sleep", slept.append)
    worker.active_threads = {threading.get_ident(): "this task"}
    assert _oom._spill_for(10) is False and slept == []  # no other task: nothing to wait for
    worker.active_threads[-1] = "another task"
    clock = iter(range(10**6))
    monkeypatch.setattr(_oom.time, "monotonic", lambda: next(clock) * 0.01)
    monkeypatch.setattr(_oom, "WAIT_S", 1.0)
    tries = 1
    while _oom._spill_for(10):
        tries += 1
    assert 5 < tries < 200 and len(slept) == tries - 1  # within WAIT_S, then RMM raises
    assert slept[0] < slept[-1] <= 0.1  # 5 ms doubling, at most 0.1 s
    for _ in range(3):  # the next allocation, of this size, right after
        _oom._spill_for(10)
    slept.clear()
    assert _oom._spill_for(20) is True and slept == [0.005]  # another size: a new wait
    slept.clear()
    with _oom._handles_oom():
        assert _oom._spill_for(10) is False and slept == []
    with _oom._handles_oom(False):  # one row left: it waits
        assert _oom._spill_for(10) is True


def test_halving_leaves_the_waiting_to_its_last_row(monkeypatch):
    """Pieces above one row fail at once (and are cut); a piece of one row, which
    cannot be cut, has its allocations wait for other tasks' memory instead."""
    seen = []

    def compute(a, b):
        seen.append((b - a, getattr(_oom._THREAD, "splits", 0)))
        if b - a > 1:
            raise MemoryError("Maximum pool size exceeded (simulated)")
        return np.full((1, 2), a)

    monkeypatch.setattr(_oom, "_free_cached", lambda xp, need: None)
    out = _oom.halving(compute, 3, xp=np, run="waits", step="update", site=2, bytes_per_row=8)
    assert np.array_equal(out[:, 0], [0, 1, 2])
    assert {n: flag for n, flag in seen} == {3: 1, 2: 1, 1: 0}


class _Resource:
    def __init__(self, upstream=None, callback=None):
        self.upstream, self.callback = upstream, callback

    def get_upstream(self):
        return self.upstream


@pytest.fixture
def fake_rmm(monkeypatch):
    """An ``rmm`` module of resources that record what wraps what."""
    import sys
    import types

    mr = types.SimpleNamespace(
        FailureCallbackResourceAdaptor=type("FailureCallbackResourceAdaptor", (_Resource,), {}),
        TrackingResourceAdaptor=type("TrackingResourceAdaptor", (_Resource,), {}),
        StatisticsResourceAdaptor=type("StatisticsResourceAdaptor", (_Resource,), {}),
        PoolMemoryResource=type("PoolMemoryResource", (_Resource,), {}))
    mr.current = mr.PoolMemoryResource()
    mr.get_current_device_resource = lambda: mr.current
    mr.set_current_device_resource = lambda r: setattr(mr, "current", r)
    monkeypatch.setitem(sys.modules, "rmm", types.SimpleNamespace(mr=mr))
    return mr


def test_a_gpu_workers_allocations_spill_before_they_fail(fake_rmm):
    pool = fake_rmm.current
    worker = _Worker()
    assert _oom.spill_on_allocation_failure(worker) is True
    wrapped = fake_rmm.current
    assert isinstance(wrapped, fake_rmm.FailureCallbackResourceAdaptor)
    assert wrapped.upstream is pool and wrapped.callback is _oom._spill_for
    assert _oom.spill_on_allocation_failure(worker) is True  # every run asks: wrapped once
    assert fake_rmm.current is wrapped


@pytest.mark.parametrize("counting", ["TrackingResourceAdaptor", "StatisticsResourceAdaptor"])
def test_a_counting_resource_stays_on_top(fake_rmm, counting):
    pool = fake_rmm.PoolMemoryResource()
    fake_rmm.current = getattr(fake_rmm, counting)(pool)
    assert _oom.spill_on_allocation_failure(_Worker()) is True
    top = fake_rmm.current
    assert type(top).__name__ == counting  # what the dashboard or rmm.statistics reads
    assert isinstance(top.upstream, fake_rmm.FailureCallbackResourceAdaptor)
    assert top.upstream.upstream is pool


def test_an_adaptor_put_on_top_later_is_not_wrapped_again(fake_rmm):
    """rmm.statistics enabled after a run: the next run finds its spilling below."""
    assert _oom.spill_on_allocation_failure(_Worker()) is True
    below = fake_rmm.current
    fake_rmm.current = fake_rmm.StatisticsResourceAdaptor(below)
    on_top = fake_rmm.current
    assert _oom.spill_on_allocation_failure(_Worker()) is True
    assert fake_rmm.current is on_top


def test_a_worker_without_a_device_buffer_is_left_alone(fake_rmm):
    pool = fake_rmm.current
    cpu_worker = type("W", (), {"data": {}})()
    assert _oom.spill_on_allocation_failure(cpu_worker) is False
    assert fake_rmm.current is pool


def test_a_resource_that_cannot_be_wrapped_leaves_the_run_going(fake_rmm, caplog):
    def refuse(*args):
        raise TypeError("not a device memory resource (simulated)")

    pool = fake_rmm.current
    fake_rmm.FailureCallbackResourceAdaptor.__init__ = refuse
    with caplog.at_level(logging.WARNING, logger="src_dask"):
        assert _oom.spill_on_allocation_failure(_Worker()) is False
    assert fake_rmm.current is pool
    assert "not a device memory resource" in caplog.text


def test_a_copy_with_no_rows_to_split_waits_for_memory_then_names_the_site(monkeypatch):
    """A block of inputs copied to the device meets a pool full, for a moment, of the
    running tasks' temporaries: it frees and spills what it can, waits, and tries
    again, so the copy lands once they are gone; one that never fits fails after
    ``WAIT_S`` with the site, not at once; any other error is raised at once."""
    freed = []
    monkeypatch.setattr(_oom, "_free_cached", lambda xp, need: freed.append(need))
    monkeypatch.setattr(_oom.time, "sleep", lambda s: None)
    attempts = []

    def copy_after(n):
        def copy():
            attempts.append(1)
            if len(attempts) <= n:
                raise MemoryError("Maximum pool size exceeded (simulated)")
            return "copied"
        return copy

    assert _oom.waiting(copy_after(3), xp=np, nbytes=256, site=7, what="M's core") == "copied"
    assert len(attempts) == 4 and freed == [256] * 3
    attempts.clear()
    monkeypatch.setattr(_oom, "WAIT_S", 0.05)
    with pytest.raises(MemoryError, match=r"site 7, M's core: out of host memory .* after"):
        _oom.waiting(copy_after(10**9), xp=np, nbytes=256, site=7, what="M's core")
    assert len(attempts) > 1
    attempts.clear()

    def broken():
        attempts.append(1)
        raise ValueError("not memory")

    with pytest.raises(ValueError, match="not memory"):
        _oom.waiting(broken, xp=np, nbytes=256, site=7, what="M's core")
    assert len(attempts) == 1



class _Pool:
    """A simulated device pool of ``units``: an allocation that does not fit asks the
    failure callback, as RMM's ``FailureCallbackResourceAdaptor`` does, and tries
    again while it says so; else ``MemoryError``."""

    def __init__(self, units: int):
        import threading

        self.free, self.lock = units, threading.Lock()

    def alloc(self) -> None:
        while True:
            with self.lock:
                if self.free:
                    self.free -= 1
                    return
            if not _oom._spill_for(1):
                raise MemoryError("Maximum pool size exceeded (simulated)")

    def release(self, n: int) -> None:
        with self.lock:
            self.free += n


#: What the tasks below share in the test's process (tasks are pickled by reference).
_SIM: dict = {}


def _row_of_two_units(task: int, a: int, b: int):
    """Row ``a`` of ``task``: one unit, then (after all tasks hold one, on their first
    row) a second, both given back at the end."""
    pool, met = _SIM["pool"], _SIM["met"]
    pool.alloc()
    try:
        if a == 0 and task not in _SIM["met_by"]:
            _SIM["met_by"].add(task)
            with contextlib.suppress(threading.BrokenBarrierError):
                met.wait()
        pool.alloc()
        pool.release(1)
        return np.full((b - a, 2), 10 * task + np.arange(a, b)[:, None])
    finally:
        pool.release(1)


def _task_of_rows(task: int):
    return _oom.halving(lambda a, b: _row_of_two_units(task, a, b), _SIM["rows"], xp=np,
                        run="turns", step="update", site=task, bytes_per_row=8)


@pytest.mark.timeout(60)
def test_rows_that_each_hold_part_of_their_memory_take_turns(monkeypatch):
    """Three tasks' rows, each of two allocations in a pool of three, all hold their
    first one and wait for the second (a D_M=1000 stack in a 3 GB pool stopped so
    after 30 s): none waits for the others, they take turns, and every task
    completes, its result unchanged."""
    import distributed

    class _Time:  # counts the waits' sleeps
        monotonic, sleeps = staticmethod(time.monotonic), []

        def sleep(self, s):
            self.sleeps.append(s)
            time.sleep(s)

    monkeypatch.setattr(_oom, "time", _Time())
    monkeypatch.setattr(_oom, "WAIT_S", 10.0)
    monkeypatch.setitem(_oom._FITS, ("turns", "update"), 1)
    monkeypatch.setattr(_oom, "_RESCHEDULED", {})
    _SIM.update(pool=_Pool(3), rows=4, met=threading.Barrier(3, timeout=5), met_by=set())
    with distributed.Client(processes=False, n_workers=1, threads_per_worker=3,
                            dashboard_address=":0") as client:
        results = client.gather(client.map(_task_of_rows, range(3), pure=False))
    for t, out in enumerate(results):
        assert np.array_equal(out[:, 0], 10 * t + np.arange(4))
    assert _SIM["pool"].free == 3 and not _SIM["met"].broken  # all three met
    assert sum(_oom.time.sleeps) < 3.0  # not WAIT_S (10 s) each of waiting for each other
    counted = _oom.events()
    assert counted["turns"] >= 2 and "rescheduled" not in counted  # two rows gave way at least
    assert counted["waited_s"] == pytest.approx(sum(_oom.time.sleeps))


def _refused_twice(a: int, b: int):
    """A row refused on its first try and in its turn, then computed."""
    if len(_SIM["refused"]) < 2:
        _SIM["refused"].append(b - a)
        raise MemoryError("Maximum pool size exceeded (simulated)")
    return np.ones((b - a, 2))


def _never_fits(a: int, b: int):
    raise MemoryError("Maximum pool size exceeded (simulated)")


def _one_row(compute):
    return _oom.halving(compute, 1, xp=np, run="resched", step="projection", site=7,
                        bytes_per_row=2**20)


def _works_a_while():
    _SIM["working"].set()
    _SIM["stop"].wait(_SIM["work_s"])  # works meanwhile: longer than a row waits (WAIT_S)
    return 1


@pytest.mark.timeout(60)
def test_a_row_that_never_fits_beside_other_tasks_gives_its_memory_back(monkeypatch):
    """A row that does not fit even in its turn, while another task runs, makes its
    task give back all it holds and run again later (Dask reschedules it); the second
    run completes. With no other task it is an error naming the site, at once; and a
    task rescheduled ``RESCHEDULES`` times fails with that error too."""
    import distributed

    monkeypatch.setattr(_oom, "WAIT_S", 0.2)
    monkeypatch.setattr(_oom, "_RESCHEDULED", {})
    monkeypatch.setattr(_oom, "RESCHEDULES", 2)
    _SIM.update(refused=[], working=threading.Event(), stop=threading.Event(), work_s=1.0)
    with distributed.Client(processes=False, n_workers=1, threads_per_worker=2,
                            dashboard_address=":0") as client:
        busy = client.submit(_works_a_while, pure=False)
        assert _SIM["working"].wait(10)
        out = client.submit(_one_row, _refused_twice, pure=False).result()
        assert np.array_equal(out, np.ones((1, 2))) and _SIM["refused"] == [1, 1]
        assert list(_oom._RESCHEDULED.values()) == [1]  # run again once
        busy.result()

        _SIM.update(working=threading.Event(), work_s=20.0)
        busy = client.submit(_works_a_while, pure=False)
        assert _SIM["working"].wait(10)
        doomed = client.submit(_one_row, _never_fits, pure=False)
        with pytest.raises(MemoryError, match="site 7, pass 2's projection: one row"):
            doomed.result()
        assert list(_oom._RESCHEDULED.values())[-1] == 3  # twice again, then the error
        _SIM["stop"].set()
        busy.result()
    with pytest.raises(MemoryError, match="site 7, pass 2's projection: one row of the "
                                          "projected core does not fit .* 1.0 MiB"):
        _one_row(_never_fits)  # no worker, no other task: at once


class DeviceHostFile(MutableMapping):
    """dask-cuda's ``DeviceHostFile`` as far as membership goes: stores ``others``,
    ``device_keys`` and ``host_buffer`` (spilled device values too), no
    ``__contains__``, and a ``__getitem__`` that brings a spilled value back to the
    device (counted in ``loads``)."""

    def __init__(self):
        self.others, self.device_keys, self.host_buffer = {}, set(), {}
        self.device, self.loads = {}, []

    def __getitem__(self, key):
        if key in self.others:
            return self.others[key]
        if key in self.device_keys:
            if key not in self.device:  # spilled: back to the device
                self.loads.append(key)
                self.device[key] = self.host_buffer.pop(key)
            return self.device[key]
        if key in self.host_buffer:
            return self.host_buffer[key]
        raise KeyError(key)

    def __setitem__(self, key, value):
        self.device_keys.add(key)
        self.device[key] = value

    def __delitem__(self, key):
        self.device_keys.discard(key)
        self.device.pop(key, None) if key in self.device else self.host_buffer.pop(key)

    def __iter__(self):
        return iter(self.device_keys | set(self.host_buffer) | set(self.others))

    def __len__(self):
        return len(set(self))


def test_asking_whether_a_worker_holds_a_spilled_key_does_not_load_it():
    """distributed asks ``key in worker.data`` for every key it releases; dask-cuda's
    data answered through ``__getitem__``, copying a spilled value back to the device
    (on the event loop: a 3 GB pool's worker closed there). Answered from the stores
    since, the same answers, nothing loaded; done once per worker."""
    from types import SimpleNamespace as NS

    data = DeviceHostFile()
    data["on_device"] = np.zeros(2)
    data["spilled"] = np.ones(2)
    data.host_buffer["spilled"] = data.device.pop("spilled")  # spilled to host
    data.host_buffer["host_only"], data.others["other"] = 1, 2
    worker = NS(data=data)
    assert "spilled" in data and data.loads == ["spilled"]  # dask-cuda's way: loaded
    data.host_buffer["spilled"] = data.device.pop("spilled")
    data.loads.clear()

    assert _oom.membership_without_loading(worker) is True
    for key in ("on_device", "spilled", "host_only", "other"):
        assert key in data, key
    assert "absent" not in data and data.loads == []
    assert isinstance(data, DeviceHostFile) and np.array_equal(data["spilled"], np.ones(2))
    del data["spilled"]
    assert "spilled" not in data
    assert _oom.membership_without_loading(worker) is False  # answers already
    assert _oom.membership_without_loading(NS(data={})) is False  # not dask-cuda's


@pytest.mark.timeout(120)
def test_a_run_whose_rows_do_not_fit_beside_other_tasks_reschedules_and_is_unchanged(
        monkeypatch):
    """Through a Client, pass 2's projection rows that do not fit (first try and turn)
    while another task runs make their tasks run again later; the run's cores are those
    of a run that never ran out of memory."""
    import distributed

    a, x = random_mpo(6, 3, seed=1), random_mps(6, 5, seed=2)
    ref = src_dask.apply(a, x, 10, seed=3)
    original, refused = K.project_core, []

    def project_core(cores, env):
        if env is not None and env.shape[0] > 1:
            raise MemoryError("Maximum pool size exceeded (simulated)")  # one row at a time
        if len(refused) < 4 and getattr(_oom._THREAD, "row", None) and _oom._others_running():
            refused.append(_oom._THREAD.row)
            raise MemoryError("Maximum pool size exceeded (simulated)")
        return original(cores, env)

    monkeypatch.setattr(K, "project_core", project_core)
    monkeypatch.setattr(_oom, "_RESCHEDULED", {})
    monkeypatch.setattr(_oom, "WAIT_S", 0.5)
    _SIM.update(working=threading.Event(), stop=threading.Event(), work_s=60.0)
    with distributed.Client(processes=False, n_workers=1, threads_per_worker=3,
                            dashboard_address=":0") as client:
        busy = client.submit(_works_a_while, pure=False)  # another task, all along
        assert _SIM["working"].wait(10)
        y = src_dask.apply(a, x, 10, seed=3, client=client)
        _SIM["stop"].set()
        busy.result()
        (counted,) = client.run(memory_events).values()
    assert refused == ["first", "turn"] * 2
    assert sum(_oom._RESCHEDULED.values()) == 2  # two tasks, or one task twice
    assert counted["rescheduled"] == 2 and counted["turns"] == 2 and counted["halved"] >= 1
    for c, c0 in zip(y, ref, strict=True):
        assert np.abs(np.asarray(c) - c0).max() <= 1e-12 * np.abs(c0).max()


class _Unit:
    """One unit of a simulated pool, given back when the object goes (as a device
    array's memory goes with its last reference)."""

    pool = None

    def __init__(self, pool: _Pool):
        pool.alloc()
        self.pool = pool

    def __del__(self):
        if self.pool is not None:
            self.pool.release(1)


def _holding_a_unit_then_a_row():
    """A task that holds one unit (its inputs on the device) while its row is
    refused on its first try and in its turn (while another task works), then runs."""
    held = _Unit(_SIM["pool"])  # noqa: F841 (held by this frame, as a task's inputs are)
    return _one_row(_refused_twice)


@pytest.mark.timeout(60)
def test_a_rescheduled_tasks_memory_comes_back_though_distributed_keeps_it_in_a_cycle(
        monkeypatch):
    """distributed keeps a task's exception in a frame of the exception's own
    traceback, a reference cycle: the frames of a task that gave its memory back
    (``Reschedule``) keep holding it until Python's cyclic garbage collector runs,
    which counts objects, not device bytes (a D_M=1000 stack in a 3 GB pool failed
    so: no task ran and its pool was full). The next allocation that finds the pool
    full collects them: the task's second run gets the memory its first held,
    instead of waiting for it while another task works and failing."""
    import gc

    import distributed

    monkeypatch.setattr(_oom, "WAIT_S", 1.0)
    monkeypatch.setattr(_oom, "_RESCHEDULED", {})
    _SIM.update(pool=_Pool(1), refused=[], working=threading.Event(), stop=threading.Event(),
                work_s=60.0)
    gc.disable()  # as when the collector has not run yet: it runs by count of objects
    try:
        with distributed.Client(processes=False, n_workers=1, threads_per_worker=2,
                                dashboard_address=":0") as client:
            busy = client.submit(_works_a_while, pure=False)  # another task, all along
            assert _SIM["working"].wait(10)
            out = client.submit(_holding_a_unit_then_a_row, pure=False).result()
            _SIM["stop"].set()
            busy.result()
    finally:
        gc.enable()
    assert np.array_equal(out, np.ones((1, 2))) and _SIM["refused"] == [1, 1]
    assert list(_oom._RESCHEDULED.values()) == [1]  # given back once, then run
    assert _SIM["pool"].free == 1


def test_a_given_back_tasks_memory_comes_free_before_the_event_loop_takes_its_exception(
        monkeypatch):
    """Until distributed's event loop takes a rescheduled task's exception, the frames
    of its traceback hold the task's inputs and temporaries, and no collector frees
    what is still referenced. An allocation on that loop (an input copied back to the
    device for the next task) cannot wait for it: a D_M=1000 stack in a 3 GB pool
    failed so, two tasks given back and none running. The next allocation that finds
    memory short clears those frames of their variables: the memory comes free with
    the exception still held, and with the collector off."""
    import gc

    import distributed

    monkeypatch.setattr(_oom, "_GIVEN_BACK", weakref.WeakSet())
    held = []

    def a_task() -> None:
        out = _oom._Output(np, 4, 0)
        temporaries = np.ones(1000)
        held.append(weakref.ref(temporaries))
        raise _oom._give_back(out)

    gc.disable()
    try:
        try:
            a_task()
        except Exception as err:  # noqa: BLE001 - the loop's message, not yet taken
            taken_later = err
        assert held[0]() is not None and len(_oom._GIVEN_BACK) == 1
        assert _oom._collect_garbage(at_once=True)
        assert held[0]() is None and not _oom._GIVEN_BACK
        assert isinstance(taken_later, distributed.Reschedule)
    finally:
        gc.enable()


def test_clearing_a_given_back_tasks_frames_leaves_a_suspended_generator_running(
        monkeypatch):
    """Only the frames of plain functions are cleared: clearing a suspended
    generator's or coroutine's frame (one that caught the exception and waits, as an
    event loop's coroutine may) would close it."""
    monkeypatch.setattr(_oom, "_GIVEN_BACK", weakref.WeakSet())
    out, caught = _oom._Output(np, 1, 0), []

    def waits_holding_it():
        try:
            raise _oom._give_back(out)
        except Exception as err:  # noqa: BLE001 - kept, as distributed keeps it
            caught.append(err)
        yield "waiting"
        yield "resumed"

    waiting = waits_holding_it()
    assert next(waiting) == "waiting"
    _oom._collect_garbage(at_once=True)
    assert next(waiting) == "resumed"


def test_an_output_that_does_not_fit_in_a_rows_turn_names_the_site():
    """The first row of a step cut into rows allocates the step's whole output; when
    that does not fit even in the row's turn it is the error that names the site (or,
    beside other tasks, a reschedule), not a bare out-of-memory error (a D_M=1000
    stack in a 4 GB pool failed so: 488 MiB refused in a turn)."""
    import types

    def empty(shape, dtype):
        raise MemoryError("out of memory (simulated, the output)")

    xp = types.SimpleNamespace(__name__="numpy", empty=empty)

    def rows_only(a, b):
        if b - a > 1:
            raise MemoryError("out of memory (simulated)")
        return np.ones((1, 3))

    with pytest.raises(MemoryError, match="site 5, pass 2's update: one row of the "
                                          "environment does not fit"):
        _oom.halving(rows_only, 4, xp=xp, run="output", step="update", site=5,
                     bytes_per_row=8)


@pytest.mark.parametrize("apply_small", [False, True])
def test_a_projection_cut_into_rows_lays_its_cores_out_once(monkeypatch, apply_small):
    """Cut into pieces of rows, a projection lays its cores out for the rows once
    for all its pieces (each would copy a core again), and its result is the uncut
    one's; uncut, it reads the cores as they come. ``apply_small``: the GPU's kernel
    for small cores applied to a large tensor reads them laid out (its CPU stand-in)."""
    from src_dask._graph import tasks

    monkeypatch.setattr(K, "_APPLY_ON_CPU", apply_small)
    monkeypatch.setattr(K, "APPLY_LARGE_MIN", 1 << 8)
    monkeypatch.setattr(_oom, "_FITS", {})
    applied, apply = [], K._apply_small
    monkeypatch.setattr(K, "_apply_small", lambda *a, **k: applied.append(1) or apply(*a, **k))
    rng = np.random.default_rng(4)
    shapes = [(3, 3, 2, 2), (40, 40, 2, 2), (2, 2, 2, 2)]
    cores = [rng.standard_normal(s) + 1j * rng.standard_normal(s) for s in shapes]
    env = rng.standard_normal((6, 3, 40, 2)) + 1j * rng.standard_normal((6, 3, 40, 2))
    ref = K.project_core(cores, env)
    laid, layout, project_core = [], K.laid_out_for_rows, K.project_core
    monkeypatch.setattr(K, "laid_out_for_rows", lambda c, e: laid.append(1) or layout(c, e))
    assert np.array_equal(tasks.project(cores, env, rows=None, site=3, run="uncut"), ref)
    assert laid == []

    def rows_only(cs, e):
        if e is not None and e.shape[0] > 1:
            raise MemoryError("out of memory (simulated)")
        return project_core(cs, e)

    monkeypatch.setattr(K, "project_core", rows_only)
    z = tasks.project(cores, env, rows=None, site=3, run="cut")
    assert laid == [1] and np.abs(z - ref).max() <= 1e-13 * np.abs(ref).max()
    assert bool(applied) == apply_small


@pytest.mark.parametrize("step", ["pass 1", "sketch", "projection", "update"])
def test_the_pieces_of_a_cut_step_make_their_complex_products_natively(monkeypatch, step):
    """With complex products made as three real ones, a step cut into rows makes its
    pieces' products natively (three real products would split the operand that does
    not shrink with the rows into planes again for every piece); uncut, the step's
    products stay three real ones; the cut step's result is the uncut one's."""
    import dask

    from src_dask._graph import tasks

    ways, product_way = [], K.product_way
    monkeypatch.setattr(K, "product_way", lambda *a, **k: ways.append(product_way(*a, **k))
                        or ways[-1])
    monkeypatch.setattr(K, "THREE_REAL_MIN", 2)
    rng = np.random.default_rng(5)

    def rand(*shape):
        return rng.standard_normal(shape) + 1j * rng.standard_normal(shape)

    rows, cores = 6, [rand(5, 5, 2, 2)]
    env, eta = rand(rows, 5), rand(rows, 5, 2, 2)
    z = K.project_core(cores, env[:5])
    run = {"pass 1": lambda: tasks.pass1_block(env, cores, site=1, start=0, stop=rows,
                                               run="p1", store=None, block=0, last=False,
                                               seed_key=1, legs=(2, 2)),
           "sketch": lambda: tasks.sketch_piece(env, z, site=1, start=0, stop=rows,
                                                run="sk", store=None),
           "projection": lambda: tasks.project(cores, env, rows=None, site=1, run="pr"),
           "update": lambda: tasks.update(eta, [z], site=1, run="up")}[step]
    attempt = _oom._attempt

    def wholes_refused(compute, a, b, out, key, site, per_row):
        def pieces_only(lo, hi):
            if hi - lo == rows:
                raise MemoryError("out of memory (simulated)")
            return compute(lo, hi)
        return attempt(pieces_only, a, b, out, key, site, per_row)

    with dask.config.set({"src_dask.complex-products": "3m"}):
        ref = run()
        assert "three" in ways
        ways.clear()
        monkeypatch.setattr(_oom, "_attempt", wholes_refused)
        monkeypatch.setattr(_oom, "_FITS", {})
        cut = run()
    assert ways and "three" not in ways
    assert np.abs(cut - ref).max() <= 1e-13 * np.abs(ref).max()


@pytest.mark.timeout(60)
def test_projections_of_the_same_cores_at_once_share_one_layout(monkeypatch):
    """Two projections of the same cores cut into rows at once (the tasks of a site on
    one worker) lay the cores out once between them (a copy the size of a core each,
    244 MiB for a D_M=1000 core), kept until the last of them ends; both give the
    uncut result."""
    from src_dask._graph import tasks

    rng = np.random.default_rng(6)
    shapes = [(3, 3, 2, 2), (30, 30, 2, 2)]
    cores = [rng.standard_normal(s) + 1j * rng.standard_normal(s) for s in shapes]
    env = rng.standard_normal((4, 3, 30)) + 1j * rng.standard_normal((4, 3, 30))
    ref = K.project_core(cores, env)
    made, layout, project_core = [], K.laid_out_for_rows, K.project_core
    monkeypatch.setattr(K, "laid_out_for_rows", lambda c, e: made.append(1) or layout(c, e))
    inside, go = threading.Event(), threading.Event()

    def rows_only(cs, e):
        if e.shape[0] > 1:
            raise MemoryError("out of memory (simulated)")
        if threading.current_thread() is not threading.main_thread() and not inside.is_set():
            inside.set()  # the other projection holds its layout, in its first row
            assert go.wait(10)
        return project_core(cs, e)

    monkeypatch.setattr(K, "project_core", rows_only)
    monkeypatch.setattr(_oom, "_FITS", {})
    out: dict = {}
    other = threading.Thread(target=lambda: out.update(
        first=tasks.project(cores, env, rows=None, site=3, run="shared")))
    other.start()
    assert inside.wait(10)
    out["second"] = tasks.project(cores, env, rows=None, site=3, run="shared")
    assert len(tasks._LaidOut._shared) == 1  # the first still holds it
    go.set()
    other.join(10)
    assert made == [1] and tasks._LaidOut._shared == {}
    for z in out.values():
        assert np.abs(z - ref).max() <= 1e-13 * np.abs(ref).max()
