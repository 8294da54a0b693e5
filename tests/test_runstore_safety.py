"""Run stores never lose or invent data: safe paths, verified reads, resume that
recomputes what is damaged, metadata checks, one writer per store."""

from __future__ import annotations

import glob
import json
import logging
import os
import socket

import numpy as np
import pytest
import zarr
from helpers import random_mpo, random_mps

import src_dask
from src_dask import _kernels as K
from src_dask import _runstore
from src_dask._lock import LOCK
from src_dask.errors import DamagedDataError, PathRefusedError, StoreError, StoreLockedError

N = 6


@pytest.fixture
def problem():
    return random_mpo(N, 3, seed=1), random_mps(N, 5, seed=2)


@pytest.fixture
def steps(monkeypatch):
    """Counts pass-1 steps run in this process (threaded scheduler)."""
    calls = {"sketch_step": 0}
    original = K.sketch_step

    def counting(*args, **kwargs):
        calls["sketch_step"] += 1
        return original(*args, **kwargs)

    monkeypatch.setattr(K, "sketch_step", counting)
    return calls


def _run(problem, store, **options):
    a, x = problem
    options = {"seed": 3, "chunk": 4, **options}
    return src_dask.apply(a, x, 8, store=store, **options)


def _ref(problem, **options):
    a, x = problem
    return src_dask.apply(a, x, 8, seed=3, chunk=4, **options).to_numpy()


def _close(y, ref, tol=1e-12):
    for c, c0 in zip(y.to_numpy() if hasattr(y, "to_numpy") else y, ref, strict=True):
        assert np.abs(c - c0).max() <= tol * np.abs(c0).max()


def _chunk_files(store, name):
    return sorted(f for f in glob.glob(os.path.join(store, name, "c", "**"), recursive=True)
                  if os.path.isfile(f))


def _flip_bit(path, at=8):
    data = bytearray(open(path, "rb").read())
    data[at] ^= 1
    open(path, "wb").write(bytes(data))


# -- paths ------------------------------------------------------------------------------
def test_empty_store_path_is_refused_and_the_working_directory_kept(problem, tmp_path,
                                                                     monkeypatch, steps):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "mine.txt").write_text("keep")
    for store in ("", " "):
        with pytest.raises(ValueError, match="store: empty path"):
            _run(problem, store, overwrite=True)
    with pytest.raises(PathRefusedError, match="working directory"):
        _run(problem, ".", overwrite=True)
    assert (tmp_path / "mine.txt").read_text() == "keep" and steps["sketch_step"] == 0


def test_a_folder_of_user_files_is_never_replaced(problem, tmp_path, steps):
    folder = tmp_path / "results"
    folder.mkdir()
    (folder / "thesis.tex").write_text("years of work")
    with pytest.raises(PathRefusedError, match="not a src_dask run store") as err:
        _run(problem, folder, overwrite=True)
    assert "overwrite" not in str(err.value)
    assert os.listdir(folder) == ["thesis.tex"] and steps["sketch_step"] == 0


@pytest.mark.parametrize("where", ["same", "inside", "containing"])
def test_a_store_overlapping_an_input_is_refused_before_any_work(problem, tmp_path, steps,
                                                                  where):
    a, x = problem
    src_dask.save(x, tmp_path / "in" / "x")
    x2 = src_dask.open(tmp_path / "in" / "x")
    store = {"same": tmp_path / "in" / "x", "inside": tmp_path / "in" / "x" / "run",
             "containing": tmp_path / "in"}[where]
    how = {"same": "is", "inside": "is inside", "containing": "contains"}[where]
    with pytest.raises(PathRefusedError, match=f": {how} the directory of input"):
        src_dask.apply(a, x2, 8, seed=3, store=store, overwrite=True)
    assert steps["sketch_step"] == 0
    np.testing.assert_array_equal(src_dask.open(tmp_path / "in" / "x").to_dense(), x.to_dense())


def test_store_of_the_wrong_type_or_a_file(problem, tmp_path):
    with pytest.raises(TypeError, match="store: expected a path .* got int"):
        _run(problem, 123)
    (tmp_path / "f").write_text("a file")
    with pytest.raises(PathRefusedError, match="is a file"):
        _run(problem, tmp_path / "f", overwrite=True)
    assert (tmp_path / "f").read_text() == "a file"


def test_overwrite_deletes_only_what_a_run_writes(problem, tmp_path, caplog):
    store = tmp_path / "run"
    _run(problem, store)
    (store / "notes.txt").write_text("mine")
    with caplog.at_level(logging.WARNING, logger="src_dask"):
        y = _run(problem, store, seed=4, overwrite=True)
    assert (store / "notes.txt").read_text() == "mine"
    assert "notes.txt" in caplog.text
    _close(y, src_dask.apply(*problem, 8, seed=4, chunk=4).to_numpy())


def test_numpy_integers_and_nothing_left_after_a_failed_setup(problem, tmp_path, monkeypatch):
    y = _run(problem, tmp_path / "run", seed=np.int64(3), chunk=np.int32(4))
    _close(y, _ref(problem))
    assert zarr.open_group(tmp_path / "run", mode="r").attrs["seed"] == 3

    from src_dask import _integrity

    def broken(*args, **kwargs):
        raise OSError(5, "I/O error")

    monkeypatch.setattr(_integrity, "create", broken)
    with pytest.raises(OSError, match="I/O error"):
        _run(problem, tmp_path / "new")
    assert not (tmp_path / "new").exists()
    monkeypatch.undo()
    _close(_run(problem, tmp_path / "new"), _ref(problem))  # the retry is not blocked


# -- lazy results and damaged data --------------------------------------------------------
def test_a_lazy_result_refuses_to_read_a_reused_store(problem, tmp_path):
    y = _run(problem, tmp_path / "run")
    _run(problem, tmp_path / "run", seed=9, overwrite=True)
    with pytest.raises(StoreError, match="replaced or changed since this result"):
        y.to_numpy()


def test_a_missing_result_chunk_is_an_error_not_zeros(problem, tmp_path):
    store = str(tmp_path / "run")
    y = _run(problem, store)
    os.remove(_chunk_files(store, "result/site_2")[0])
    with pytest.raises(DamagedDataError, match=r"run: result/site_2 \(site 2\): chunk .*missing"):
        y.to_numpy()
    with pytest.raises(DamagedDataError, match="result/site_2"):
        _run(problem, store)  # the finished store, asked again


@pytest.mark.parametrize("damage", ["nan", "bit", "truncate"])
def test_a_damaged_result_is_an_error(problem, tmp_path, damage):
    store = str(tmp_path / "run")
    _run(problem, store)
    if damage == "nan":
        zarr.open_array(f"{store}/result/site_3", mode="r+")[0, 0, 0] = np.nan
    else:
        f = _chunk_files(store, "result/site_3")[0]
        if damage == "bit":
            _flip_bit(f)
        else:
            os.truncate(f, os.path.getsize(f) // 2)
    with pytest.raises(DamagedDataError, match=r"result/site_3 \(site 3\)"):
        _run(problem, store).to_numpy()


def _unfinish(store: str, pass2_next: int = N - 1) -> None:
    """Make a finished store look interrupted (pass 1 done, pass 2 at ``pass2_next``)."""
    group = zarr.open_group(store, mode="r+")
    group.attrs["complete"] = False
    group["progress"].attrs["pass2_next"] = pass2_next


@pytest.mark.parametrize("damage", ["missing", "bit", "truncate"])
def test_resume_recomputes_damaged_environments(problem, tmp_path, steps, damage, caplog):
    store = str(tmp_path / "run")
    _run(problem, store)
    _unfinish(store)
    # block 1 of site 3's environment (rows 4..7)
    f = os.path.join(store, "env", "site_3", "c", "1", *["0"] * 2)
    assert os.path.isfile(f)
    {"missing": os.remove, "bit": _flip_bit,
     "truncate": lambda p: os.truncate(p, 10)}[damage](f)
    steps["sketch_step"] = 0
    with caplog.at_level(logging.WARNING, logger="src_dask"):
        y = _run(problem, store)
    assert "recomputing the block" in caplog.text and "env/site_3" in caplog.text
    assert steps["sketch_step"] == N - 1  # one block's chain again, not both
    _close(y, _ref(problem))


def test_resume_with_a_damaged_checkpoint_starts_pass_2_over(problem, tmp_path, steps, caplog):
    store = str(tmp_path / "run")
    _run(problem, store)
    # pass 2 stopped after site 4: eta 5, 4 and S_3 are its checkpoint
    group = zarr.open_group(store, mode="r+")
    s3 = np.ones((5, 3, 4, 1), complex)  # any S of the right kind, checksummed
    _runstore._write_whole(group, "S/site_3", s3)
    _unfinish(store, pass2_next=3)
    _flip_bit(_chunk_files(store, "eta/site_4")[0])
    steps["sketch_step"] = 0
    with caplog.at_level(logging.WARNING, logger="src_dask"):
        y = _run(problem, store)
    assert "pass 2 starts over" in caplog.text and steps["sketch_step"] == 0
    _close(y, _ref(problem))


@pytest.mark.parametrize("edit, match", [
    (lambda g: g.attrs.update({"chunk": 0}), "sketch .* and chunk 0"),
    (lambda g: g.attrs.__delitem__("seed"), "seed is missing"),
    (lambda g: g.attrs.update({"sketch": "8"}), "sketch is '8'"),
    (lambda g: g["progress"].attrs.update({"pass2_next": None}), "pass2_next is None"),
    (lambda g: g["progress"].attrs.update({"pass2_next": 99}), "pass2_next is 99"),
    (lambda g: g.attrs.update({"complete": True}), "result/site_0 is missing"),
])
def test_hand_edited_metadata_is_one_clear_error(problem, tmp_path, edit, match):
    store = str(tmp_path / "run")
    _run(problem, store)
    _unfinish(store)
    import shutil

    shutil.rmtree(os.path.join(store, "result"))
    edit(zarr.open_group(store, mode="r+"))
    with pytest.raises(StoreError, match=match) as err:
        _run(problem, store)
    assert str(tmp_path / "run") in str(err.value)


# -- one writer per store -------------------------------------------------------------------
def _write_lock(store, host, pid):
    os.makedirs(store, exist_ok=True)
    with open(os.path.join(store, LOCK), "w") as f:
        json.dump({"host": host, "pid": pid, "since": "2026-11-30T10:00:00"}, f)


def test_a_locked_store_fails_at_once_naming_the_owner(problem, tmp_path, steps):
    store = str(tmp_path / "run")
    _run(problem, store)
    _unfinish(store)
    steps["sketch_step"] = 0
    for host, pid in ((socket.gethostname(), os.getppid()), ("node17", 4242)):
        _write_lock(store, host, pid)
        with pytest.raises(StoreLockedError, match=f"another run .*process {pid} on {host}"):
            _run(problem, store)
    assert steps["sketch_step"] == 0
    assert not zarr.open_group(store, mode="r").attrs["complete"]


def test_a_stale_lock_of_a_dead_process_is_taken_over(problem, tmp_path, caplog):
    import subprocess
    import sys

    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True)
    _write_lock(str(tmp_path / "run"), socket.gethostname(), int(dead.stdout))
    with caplog.at_level(logging.WARNING, logger="src_dask"):
        y = _run(problem, tmp_path / "run")
    assert "taking over the lock" in caplog.text
    _close(y, _ref(problem))
    assert not os.path.exists(tmp_path / "run" / LOCK)  # released at the end


def test_the_lock_is_released_when_a_run_fails(problem, tmp_path, monkeypatch):
    def fail(*args, **kwargs):
        raise RuntimeError("boom")

    monkeypatch.setattr(K, "sketch_step", fail)
    with pytest.raises(RuntimeError, match="boom"):
        _run(problem, tmp_path / "run")
    assert not os.path.exists(tmp_path / "run" / LOCK)
    monkeypatch.undo()
    _close(_run(problem, tmp_path / "run"), _ref(problem))


# -- sizes ----------------------------------------------------------------------------------
def test_a_huge_chi_out_is_clamped_to_what_the_product_reaches(problem, tmp_path, caplog):
    a, x = problem
    exact = src_dask.trains.exact_product(a, x)
    with caplog.at_level(logging.INFO, logger="src_dask"):
        y = src_dask.apply(a, x, 10**9, oversample=10**9, seed=0, store=tmp_path / "run")
    assert "bonds reach at most" in caplog.text
    sketch = zarr.open_group(tmp_path / "run", mode="r").attrs["sketch"]
    reach = [min(3 * 5, 2**j, 2 ** (N - j)) for j in range(1, N)]  # bonds, physical legs
    assert sketch == max(reach) == 8
    assert all(b <= r for b, r in zip(y.bond_dims, reach, strict=True))
    dense = exact.to_dense()
    assert np.linalg.norm(y.to_dense() - dense) <= 1e-10 * np.linalg.norm(dense)


_SLOW_RUN = """
import sys, time
import src_dask
from src_dask import _kernels as K
sys.path.insert(0, sys.argv[2])
from helpers import random_mpo, random_mps
original = K.sketch_step
def slow(*args, **kwargs):
    time.sleep(0.3)
    return original(*args, **kwargs)
K.sketch_step = slow
src_dask.apply(random_mpo(6, 3, seed=1), random_mps(6, 5, seed=2), 8, seed=3, chunk=4,
               store=sys.argv[1])
"""


def test_a_second_process_on_a_running_store_fails_at_once(problem, tmp_path):
    import subprocess
    import sys
    import time

    store = str(tmp_path / "run")
    first = subprocess.Popen([sys.executable, "-c", _SLOW_RUN, store, os.path.dirname(__file__)],
                             stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        while not os.path.exists(os.path.join(store, LOCK)):
            assert first.poll() is None and time.monotonic() < deadline
            time.sleep(0.05)
        with pytest.raises(StoreLockedError, match=f"process {first.pid} on "):
            _run(problem, store)
        with pytest.raises(StoreLockedError):
            _run(problem, store, seed=5, overwrite=True)  # overwrite does not break a lock
    finally:
        _, err = first.communicate(timeout=120)
    assert first.returncode == 0, err
    _close(_run(problem, store), _ref(problem))


def test_overwrite_retries_while_files_appear_then_says_why(tmp_path, monkeypatch):
    """Removing an old run whose directory is still being written (a task of an
    interrupted run on a cluster) is tried again, then refused with one clear error."""
    import shutil

    from src_dask import _runstore as rs

    calls, real = [], shutil.rmtree

    def busy(where):
        calls.append(where)
        if len(calls) < 3:
            raise OSError(39, "Directory not empty")
        return real(where)

    (tmp_path / "env").mkdir()
    monkeypatch.setattr(rs.shutil, "rmtree", busy)
    monkeypatch.setattr(rs.time, "sleep", lambda s: None)
    rs._rmtree(str(tmp_path / "env"))
    assert len(calls) == 3 and not (tmp_path / "env").exists()
    (tmp_path / "env").mkdir()
    monkeypatch.setattr(rs.shutil, "rmtree", lambda where: (_ for _ in ()).throw(
        OSError(39, "Directory not empty")))
    with pytest.raises(StoreError, match="cannot be removed .*still writing"):
        rs._rmtree(str(tmp_path / "env"))


def test_a_store_of_another_number_of_sites_holds_another_run_not_a_damaged_one(tmp_path):
    """A run store of 6 sites asked for a run of 5: the error says it holds another
    run and how it differs (the store is intact; overwrite=True replaces it)."""
    from src_dask.errors import OverwriteNeededError

    store = tmp_path / "run"
    src_dask.apply(random_mpo(6, 3, seed=1), random_mps(6, 6, seed=2), 8, seed=0, store=store)
    five = (random_mpo(5, 3, seed=1), random_mps(5, 6, seed=2))
    with pytest.raises(OverwriteNeededError, match=r"holds a run of other inputs or options "
                                                   r"\(differs in .*sites: it holds 6, this "
                                                   r"run has 5\)") as err:
        src_dask.apply(*five, 8, seed=0, store=store)
    assert "damaged" not in str(err.value)
    y = src_dask.apply(*five, 8, seed=0, store=store, overwrite=True)
    assert len(y) == 5
