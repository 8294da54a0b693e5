"""Arrays between a client and a worker of its host through shared memory (``_shared``):
the files, their removal, and a one-task run's inputs and result going that way."""

from __future__ import annotations

import dataclasses
import errno
import logging
import mmap
import os
import subprocess
import sys

import dask
import numpy as np
import pytest

import src_dask
from src_dask import _api, _shared
from src_dask.problems import random_mpo, random_mps
from tests.helpers import close_cores


def _ours(directory: str = _shared.DIRECTORY) -> list[str]:
    return sorted(n for n in os.listdir(directory) if n.startswith(_shared._PREFIX))


def _mapped(x: np.ndarray) -> bool:
    """Whether ``x`` is a view of a memory map (no copy of its file's pages)."""
    while isinstance(x, np.ndarray | memoryview):
        x = x.base if isinstance(x, np.ndarray) else x.obj
    return isinstance(x, mmap.mmap)


@pytest.fixture
def shm_dir(tmp_path, monkeypatch):
    monkeypatch.setattr(_shared, "DIRECTORY", str(tmp_path))
    return tmp_path


@pytest.mark.timeout(30)
def test_arrays_come_back_equal_mapped_and_read_only_for_the_worker(shm_dir, monkeypatch):
    """Every dtype and shape (empty, scalar-like, several pieces of one array) comes back
    equal; the worker's view is read-only (inputs are never modified), the client's
    writable, and its file's name removed once taken (its pages are the array's)."""
    monkeypatch.setattr(_shared, "_PIECE", 1000)  # several pieces, several threads
    rng = np.random.default_rng(0)
    arrays = [rng.standard_normal((7, 13, 3)) + 1j * rng.standard_normal((7, 13, 3)),
              rng.standard_normal((5, 2)).astype(np.float32), np.zeros((0, 4)),
              np.asfortranarray(rng.standard_normal((9, 11))), np.arange(3, dtype=np.int64)]
    with _shared.call_files() as call:
        files = _shared.write(arrays, call.prefix + "in-")
        for d, a in zip(files, arrays, strict=True):
            got = _shared.read(d)
            assert got.dtype == a.dtype and np.array_equal(got, a)
            if a.size:
                assert _mapped(got) and not got.flags.writeable
        mine = _shared.take(files[0])
        assert mine.flags.writeable and _mapped(mine) and not os.path.exists(files[0].path)
        assert np.array_equal(mine, arrays[0])
        mine[:] = 0
        assert not mine.any()
    assert _ours(str(shm_dir)) == []


@pytest.mark.timeout(30)
def test_a_taken_result_is_the_files_pages_not_a_copy(shm_dir):
    """The client's array of a result is the file's own pages (a private map's populate
    copied every page: 0.5 s of a 1.6 GB result): a write to it shows in another map
    of the same pages."""
    with _shared.call_files() as call:
        (d,) = _shared.write([np.arange(4096.0)], call.prefix + "out-")
        other = _shared.read(d)
        mine = _shared.take(d)
        mine[7] = -1.0
        assert other[7] == -1.0


@pytest.mark.timeout(30)
def test_a_write_holds_no_view_that_a_profiler_could_keep(shm_dir, monkeypatch):
    """Dask's worker samples its threads' frames (its profiler); a frame so held keeps
    its locals after its function returned. A write whose every frame is kept alive
    (here by a profile hook on all threads) still completes and gives its arrays
    (a worker's task once failed with ``BufferError`` closing a map still viewed)."""
    import threading

    monkeypatch.setattr(_shared, "_PIECE", 1000)  # several pieces, several threads
    kept: list = []

    def hold(frame, event, arg):
        kept.append(frame)

    a = np.arange(5000, dtype=np.float64)
    threading.setprofile(hold)
    sys.setprofile(hold)
    try:
        with _shared.call_files() as call:
            (d,) = _shared.write([a], call.prefix + "out-")
            assert np.array_equal(_shared.take(d), a)
    finally:
        sys.setprofile(None)
        threading.setprofile(None)
    assert kept and _ours(str(shm_dir)) == []


@pytest.mark.timeout(30)
def test_a_missing_or_short_file_is_an_error_never_zeros(shm_dir):
    with _shared.call_files() as call:
        (d,) = _shared.write([np.ones((4, 4))], call.prefix + "in-")
        with open(d.path, "r+b") as f:
            f.truncate(64)
        with pytest.raises(OSError, match="64 bytes of 128"):
            _shared.read(d)
        os.remove(d.path)
        with pytest.raises(FileNotFoundError, match="missing"):
            _shared.read(d)


@pytest.mark.timeout(30)
def test_no_room_is_an_error_at_the_write_and_leaves_no_file(shm_dir, monkeypatch):
    """A full shared memory is an error at the write (the file is written, not mapped),
    never a SIGBUS at a copy; nothing is left behind."""
    def full(fd, data, offset):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "pwrite", full)
    with _shared.call_files() as call:
        with pytest.raises(OSError, match="in-0: no room for 64 bytes"):
            _shared.write([np.ones(8), np.ones(16)], call.prefix + "in-")
        assert _ours(str(shm_dir)) == [os.path.basename(call.marker)]
    assert not _shared.room(10**30)


@pytest.mark.timeout(30)
def test_a_call_removes_its_files_however_it_ends_and_its_outbox_closes(shm_dir):
    """Leaving a call (here by an error) removes its marker and every file of it; an
    outbox of a call that ended makes no file (a task still running after an
    interrupt), and a file another call made is left alone."""
    with _shared.call_files() as other:
        (kept,) = _shared.write([np.ones(3)], other.prefix + "in-")
        with pytest.raises(RuntimeError, match="boom"), _shared.call_files() as call:
            _shared.write([np.ones(3)], call.prefix + "in-")
            outbox = _shared.Outbox(*call)
            outbox.put(np.ones((2, 2)), 0)
            assert len([n for n in _ours(str(shm_dir)) if n.startswith(
                os.path.basename(call.prefix))]) == 3
            raise RuntimeError("boom")
        assert _ours(str(shm_dir)) == sorted(
            os.path.basename(p) for p in (other.marker, kept.path))
        with pytest.raises(RuntimeError, match="ended"):
            outbox.put(np.ones((2, 2)), 1)
        assert _ours(str(shm_dir)) == sorted(
            os.path.basename(p) for p in (other.marker, kept.path))


@pytest.mark.timeout(30)
def test_an_outbox_whose_call_ends_while_it_writes_removes_its_file(shm_dir, monkeypatch):
    """The call ending between the outbox's first look at its marker and the file's
    completion (the client may then have removed the call's files already): the
    outbox removes the file it made itself."""
    write = _shared.write
    with _shared.call_files() as call:
        def racing(arrays, prefix):
            out = write(arrays, prefix)
            os.remove(call.marker)  # the client's cleanup, between the two looks
            return out

        monkeypatch.setattr(_shared, "write", racing)
        with pytest.raises(RuntimeError, match="ended"):
            _shared.Outbox(*call).put(np.ones((2, 2)), 0)
        assert _ours(str(shm_dir)) == []


@pytest.mark.timeout(30)
def test_files_of_processes_that_are_gone_are_removed_and_nothing_else(shm_dir):
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True).stdout.strip()
    names = [f"{_shared._PREFIX}{dead}-abc-in-0", f"{_shared._PREFIX}{os.getpid()}-abc-in-0",
             "src_dask-shm-notapid-x", "someone-elses-file", f"{dead}-src_dask-shm-"]
    for name in names:
        (shm_dir / name).write_bytes(b"x")
    assert _shared.remove_stale() == 1
    assert sorted(os.listdir(shm_dir)) == sorted(names[1:])


# -- a one-task run on a cluster --------------------------------------------------------
@pytest.fixture
def one_task_problem(monkeypatch):
    """An MPO·MPS whose inputs (and result) are large enough to go ahead of the task
    (from 1 MiB here), as NumPy, run as one task on a cluster, and its product on
    Dask's threads."""
    monkeypatch.setattr(_api, "_SEND_AHEAD_BYTES", 1 << 20)
    monkeypatch.setitem(dask.config.config["src_dask"], "one-task-flops", 1e12)
    a = [np.asarray(c) for c in random_mpo(16, 3, seed=1)]
    x = [np.asarray(c) for c in random_mps(16, 100, seed=2)]
    return a, x, src_dask.apply(a, x, chi_out=100, seed=3)


@pytest.mark.timeout(120)
def test_a_one_task_run_takes_its_inputs_and_gives_its_result_through_shared_memory(
        cluster_client, one_task_problem, caplog, monkeypatch):
    """Inputs and result of a run that is one task cross through shared memory (the
    result's cores are the client's maps of the worker's files), the result is the
    threaded run's, the inputs are untouched and no file is left; with the config off
    they go by Dask's comm, as before."""
    a, x, ref = one_task_problem
    before = [c.copy() for c in a + x]
    for on in (True, False):
        caplog.clear()
        with caplog.at_level(logging.INFO, logger="src_dask"), \
                dask.config.set({"src_dask.shared-memory": on}):
            y = src_dask.apply(a, x, chi_out=100, seed=3, client=cluster_client)
        sent = [r.message for r in caplog.records if "in-memory inputs sent" in r.message]
        assert len(sent) == 1 and ("through shared memory" in sent[0]) == on
        assert y.run_info.sent_bytes == sum(c.nbytes for c in a + x)
        assert all(_mapped(c) == on for c in y) and all(c.flags.writeable for c in y)
        assert close_cores(y, ref)
        assert all(np.array_equal(p, q) for p, q in zip(a + x, before, strict=True))
        assert [n for n in _ours() if f"-{os.getpid()}-" in n] == []


@pytest.mark.timeout(120)
def test_an_interrupted_call_leaves_no_file_in_shared_memory(cluster_client, one_task_problem,
                                                             monkeypatch):
    """A call stopped after its task wrote the result (here: the wait for it
    interrupted) removes the inputs and the result the client never took."""
    from distributed import Future

    a, x, _ = one_task_problem
    result = Future.result

    def interrupted(self, *args, **kwargs):
        result(self, *args, **kwargs)  # the task ran: its files exist
        assert [n for n in _ours() if f"-{os.getpid()}-" in n and "-out-" in n]
        raise KeyboardInterrupt

    monkeypatch.setattr(Future, "result", interrupted)
    with pytest.raises(KeyboardInterrupt):
        src_dask.apply(a, x, chi_out=100, seed=3, client=cluster_client)
    assert [n for n in _ours() if f"-{os.getpid()}-" in n] == []


@pytest.mark.timeout(120)
def test_a_worker_that_does_not_see_the_files_gets_the_inputs_by_dask(
        cluster_client, one_task_problem, caplog, monkeypatch):
    """A worker that does not find the probe's file (another host, another container)
    gets the inputs by Dask's scatter and sends the result through Dask."""
    a, x, ref = one_task_problem
    monkeypatch.setattr(_shared, "_seen", {})
    run = cluster_client.run
    monkeypatch.setattr(cluster_client, "run", lambda f, *args, **kw: run(
        f, "/nonexistent/probe", *args[1:], **kw) if f is _shared._holds else run(f, *args, **kw))
    with caplog.at_level(logging.INFO, logger="src_dask"):
        y = src_dask.apply(a, x, chi_out=100, seed=3, client=cluster_client)
    assert any("by scatter" in r.message for r in caplog.records)
    assert not any(_mapped(c) for c in y) and close_cores(y, ref)
    assert not any(_shared._seen.values()) and _shared._seen


@pytest.mark.timeout(120)
@pytest.mark.parametrize("store", [False, True])
def test_a_graph_of_many_tasks_takes_its_inputs_through_shared_memory_too(
        cluster_client, one_task_problem, many_tasks, caplog, tmp_path, store):
    """A run that is a graph on workers that all share this host's memory: every worker
    maps the inputs it uses (the graph carries no input's bytes), the cores come back
    as maps (into a run store: there), equal to the threaded run's, and no file is left."""
    from distributed.protocol.pickle import dumps

    a, x, ref = one_task_problem
    compute, sizes = cluster_client.compute, []

    def measured(collections, *args, **kwargs):
        sizes.append(len(dumps([c.__dask_graph__() for c in collections])))
        return compute(collections, *args, **kwargs)

    with caplog.at_level(logging.INFO, logger="src_dask"), \
            pytest.MonkeyPatch.context() as mp:
        mp.setattr(cluster_client, "compute", measured)
        y = src_dask.apply(a, x, chi_out=100, seed=3, client=cluster_client,
                           store=str(tmp_path / "run") if store else None)
    assert any("the workers through shared memory" in r.message for r in caplog.records)
    inputs = sum(c.nbytes for c in a + x)
    if not store:  # a run store's result says what the store holds, not the call
        assert y.run_info.sent_bytes == inputs
    assert sizes and max(sizes) < inputs / 4  # the inputs' bytes are not in the graph
    assert all(_mapped(c) for c in y) != store
    assert close_cores(y, ref)
    assert [n for n in _ours() if f"-{os.getpid()}-" in n] == []


@pytest.mark.timeout(120)
def test_workers_in_this_process_get_the_arrays_themselves(one_task_problem, caplog):
    """A cluster of threads in this process: Dask hands its worker the arrays
    themselves, so nothing goes through shared memory (a copy for nothing)."""
    from distributed import Client, LocalCluster

    a, x, ref = one_task_problem
    with LocalCluster(n_workers=1, threads_per_worker=2, processes=False,
                      dashboard_address=":0") as cluster, Client(cluster) as client, \
            caplog.at_level(logging.INFO, logger="src_dask"):
        y = src_dask.apply(a, x, chi_out=100, seed=3, client=client)
    sent = [r.message for r in caplog.records if "in-memory inputs sent" in r.message]
    assert len(sent) == 1 and "by scatter" in sent[0]
    assert not any(_mapped(c) for c in y) and close_cores(y, ref)


@pytest.mark.timeout(60)
def test_a_graph_maps_each_input_where_and_when_it_would_read_it(shm_dir, many_tasks):
    """In a graph on two workers, each worker that uses an input maps its own copy (a
    task placed there: none crosses between them), and a site's maps wait for the step
    its reads would wait for (so a worker's pages come in a few sites ahead, not all
    at the start); the graph's result equals the plain graph's."""
    from dask.core import get_dependencies

    from src_dask import _graph, _plan, _random
    from src_dask._stack import make_stack

    a = [np.asarray(c) for c in random_mpo(16, 3, seed=1)]
    x = [np.asarray(c) for c in random_mps(16, 16, seed=2)]
    stack = make_stack((a, x))
    plan = _plan.Plan(sketch=8, chunk=4, chi_out=8, cutoff=0.0, key=_random.seed_key(0),
                      round=False)
    with _shared.call_files() as call:
        arrays = {id(c): c for t in (a, x) for c in t}
        sent = dict(zip(arrays, _shared.write(list(arrays.values()), call.prefix + "in-"),
                        strict=True))
        # two GPU workers: each prepares its own copy of the inputs (its own group)
        for addresses, device in ((None, "cpu"), (["w0", "w1"], "gpu")):
            graph = _graph.build(stack, dataclasses.replace(plan, device=device), addresses,
                                 sent=sent)
            dsk = dict(graph.dask)
            maps = [k for k, v in dsk.items() if isinstance(v, tuple) and getattr(
                v[0], "func", None) is _graph.tasks.read_shared]
            users = {k: [u for u, v in dsk.items() if k in get_dependencies(dsk, u)]
                     for k in maps}
            assert len({v[0].args[0].path for k, v in dsk.items() if k in maps}) == len(sent)
            # the load that prepares an input waits for what its map waits for, no more
            assert all(get_dependencies(dsk, u) - {k} == get_dependencies(dsk, k)
                       for k in maps for u in users[k])
            assert any(get_dependencies(dsk, k) for k in maps)
            if addresses:  # each map placed with its users, each worker mapping its own
                placed = graph.dask.layers[graph.key].annotations["workers"]
                assert all({placed(u) for u in users[k]} == {placed(k)} for k in maps)
                where = {(dsk[k][0].args[0].path, placed(k)) for k in maps}
                assert len(where) == len(maps) > len(sent)  # once a worker, on both
        graph = _graph.build(stack, plan, None, sent=sent)
        plain = _graph.build(stack, plan, None)
        assert close_cores(src_dask.TensorTrain(graph.compute(scheduler="sync"), "mps"),
                           src_dask.TensorTrain(plain.compute(scheduler="sync"), "mps"))


@pytest.mark.timeout(120)
def test_a_one_task_run_asks_the_scheduler_for_its_workers_not_the_clients_cache(
        cluster_client, one_task_problem, monkeypatch):
    """The client's cached identity may list no worker (its periodic refresh asks for
    none, and can land between ``scheduler_info()``'s own refresh and its return): the
    run asks the scheduler itself."""
    a, x, ref = one_task_problem
    monkeypatch.setattr(cluster_client, "scheduler_info",
                        lambda *args, **kwargs: {"workers": {}})
    y = src_dask.apply(a, x, chi_out=100, seed=3, client=cluster_client)
    assert close_cores(y, ref, rtol=1e-12)
