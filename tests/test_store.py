"""Out of core with Zarr: saved trains, the run store, restart, disk errors."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap

import dask
import dask.array as da
import numpy as np
import pytest
import zarr
from helpers import random_mpo, random_mps

import src_dask
from src_dask import _graph, _runstore
from src_dask import _kernels as K
from src_dask.errors import StoreError


def _close(y, ref, tol=1e-12):
    for c, c0 in zip(y, ref, strict=True):
        c, c0 = np.asarray(c), np.asarray(c0)
        assert np.abs(c - c0).max() <= tol * np.abs(c0).max()


@pytest.fixture
def saved(tmp_path):
    """An MPO and an MPS saved to Zarr, opened lazily."""
    a, x = random_mpo(8, 3, seed=1), random_mps(8, 6, seed=2)
    src_dask.save(a, tmp_path / "a")
    src_dask.save(x, tmp_path / "x", max_chunk_bytes=300)
    return a, x, src_dask.open(tmp_path / "a"), src_dask.open(tmp_path / "x")


@pytest.fixture
def counts(monkeypatch):
    """Counts of kernel calls in this process (threaded scheduler)."""
    calls = {"sketch_step": 0, "pass2_step": 0, "read": 0}

    def counting(name, func):
        def wrapper(*args, **kwargs):
            calls[name] += 1
            return func(*args, **kwargs)
        return wrapper

    monkeypatch.setattr(K, "sketch_step", counting("sketch_step", K.sketch_step))
    monkeypatch.setattr(K, "pass2_step", counting("pass2_step", K.pass2_step))
    monkeypatch.setattr(_graph.tasks, "read_whole", counting("read", _graph.tasks.read_whole))
    return calls


# -- saved trains ---------------------------------------------------------------------
def test_save_and_open_round_trip(saved, tmp_path):
    a, x, a2, x2 = saved
    group = zarr.open_group(tmp_path / "x", mode="r")
    attrs = dict(group.attrs)
    assert len(attrs.pop("id")) == 32  # a fresh uuid4 hex per save
    assert attrs == {"format": "src_dask.train", "version": 2, "kind": "mps", "sites": 8,
                     "layout": "lrp", "complete": True}
    for j, core in enumerate(x):
        arr = group[f"site_{j}"]
        assert arr.shape == core.shape and arr.dtype == core.dtype
        assert np.prod(arr.chunks) * arr.dtype.itemsize <= 300
    assert isinstance(x2[3], da.Array) and x2.kind == "mps" and a2.kind == "mpo"
    np.testing.assert_array_equal(x2.to_dense(), x.to_dense())
    np.testing.assert_array_equal(a2.to_dense(), a.to_dense())


def test_pinned_read_fills_the_buffer_from_every_chunk(saved, tmp_path, monkeypatch):
    """GPU runs read a Zarr core straight into a (pinned) buffer, chunk by chunk: the
    same data as a plain read, for cores of one and of many chunks."""
    from src_dask import _graph, _transfer

    buffers = []

    def empty(shape, dtype):  # stands in for CuPy's pinned pool on this CPU machine
        buffers.append(np.full(shape, np.nan, dtype))
        return buffers[-1]

    monkeypatch.setattr(_transfer, "empty_pinned", empty)
    group = zarr.open_group(tmp_path / "x", mode="r")
    for j in range(8):
        arr = group[f"site_{j}"]
        out = _graph.tasks.read_whole(arr, pinned=True)
        assert out is buffers[-1]
        np.testing.assert_array_equal(out, arr[...])
    assert any(group[f"site_{j}"].nchunks > 1 for j in range(8))


def test_open_reads_no_data(tmp_path):
    x = random_mps(4, 3, seed=0)
    src_dask.save(x, tmp_path / "x")
    for j in range(4):  # drop every chunk: open() only needs the metadata
        for root, _, files in os.walk(tmp_path / "x" / f"site_{j}" / "c"):
            for f in files:
                os.remove(os.path.join(root, f))
    y = src_dask.open(tmp_path / "x")
    assert [c.shape for c in y] == [c.shape for c in x]


def test_open_refuses_other_things(tmp_path):
    with pytest.raises(FileNotFoundError, match="no saved train"):
        src_dask.open(tmp_path / "missing")
    zarr.open_group(tmp_path / "g", mode="w").attrs["format"] = "other"
    with pytest.raises(ValueError, match="not a src_dask train"):
        src_dask.open(tmp_path / "g")


def test_save_dask_cores_and_fixed_chunks(tmp_path):
    x = random_mps(5, 4, seed=0)
    lazy = src_dask.TensorTrain([da.from_array(c, chunks=2) for c in x])
    src_dask.save(lazy, tmp_path / "x", chunks=(2, 3, 2))
    group = zarr.open_group(tmp_path / "x", mode="r")
    assert group["site_2"].chunks == (2, 3, 2) and group["site_0"].chunks == (3, 2)
    np.testing.assert_array_equal(src_dask.open(tmp_path / "x").to_dense(), x.to_dense())
    with pytest.raises(FileExistsError, match="already exists.*overwrite=True"):
        src_dask.save(x, tmp_path / "x")


def test_opened_trains_are_streamed(saved, counts):
    """Not kept (as for inputs too large to keep), each input core is read once per pass
    that needs it (sites 0…n-2 twice, n-1 once)."""
    import dask

    a, x, a2, x2 = saved
    with dask.config.set({"src_dask.keep-inputs": False}):
        y = src_dask.apply(a2, x2, 10, seed=0)
    _close(y, src_dask.apply(a, x, 10, seed=0))
    assert counts["read"] == 2 * (2 * 8 - 1)


# -- the run store ----------------------------------------------------------------------
def test_store_run_equals_in_memory_run_and_reads_as_zarr(saved, tmp_path):
    a, x, a2, x2 = saved
    ref = src_dask.apply(a, x, 10, seed=5, chunk=4)
    y = src_dask.apply(a2, x2, 10, seed=5, chunk=4, store=tmp_path / "run")
    assert all(isinstance(c, da.Array) for c in y)
    _close(y, ref)
    run = zarr.open_group(tmp_path / "run", mode="r")
    assert run.attrs["format"] == "src_dask.run" and run.attrs["complete"] is True
    assert run["env/site_3"].shape == (10, 3, 6) and run["env/site_3"].chunks == (4, 3, 6)
    assert run["progress"].attrs["pass2_next"] == 0
    assert list(run["progress/pass1"][...]) == [1, 1, 1]
    for j in range(8):
        np.testing.assert_array_equal(run[f"result/site_{j}"][...], np.asarray(ref[j]))


def test_finished_store_is_returned_without_work(saved, tmp_path, counts):
    a, x, a2, x2 = saved
    first = src_dask.apply(a2, x2, 10, seed=5, store=tmp_path / "run")
    calls = dict(counts)
    again = src_dask.apply(a2, x2, 10, seed=5, store=tmp_path / "run")
    assert counts == calls
    _close(again, first, tol=0)


def test_seed_none_is_recorded_and_reused(saved, tmp_path):
    a, x, a2, x2 = saved
    first = src_dask.apply(a2, x2, 6, store=tmp_path / "run")
    seed = zarr.open_group(tmp_path / "run", mode="r").attrs["seed"]
    _close(first, src_dask.apply(a2, x2, 6, seed=seed))


@pytest.mark.parametrize("change", ["inputs", "chi_out", "seed", "oversample", "cutoff", "dtype"])
def test_store_of_another_run_is_refused(saved, tmp_path, change):
    a, x, a2, x2 = saved
    src_dask.apply(a2, x2, 6, seed=1, store=tmp_path / "run")
    args = {"inputs": (a2, random_mps(8, 6, seed=9)), }.get(change, (a2, x2))
    options = {"chi_out": 6, "seed": 1}
    options.update({"chi_out": {"chi_out": 7}, "seed": {"seed": 2},
                    "oversample": {"oversample": 3}, "cutoff": {"cutoff": 1e-3},
                    "dtype": {"dtype": "complex64"}}.get(change, {}))
    chi = options.pop("chi_out")
    with pytest.raises(ValueError, match=f"holds a run of other inputs or options.*{change}"):
        src_dask.apply(*args, chi, store=tmp_path / "run", **options)
    assert zarr.open_group(tmp_path / "run", mode="r").attrs["complete"] is True  # untouched
    y = src_dask.apply(*args, chi, store=tmp_path / "run", overwrite=True, **options)
    _close(y, src_dask.apply(*args, chi, **options) if options.get("seed") else y)


def test_a_directory_that_is_not_a_store_is_refused(tmp_path):
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "notes.txt").write_text("mine")
    a, x = random_mpo(4, 2, seed=0), random_mps(4, 2, seed=0)
    with pytest.raises(ValueError, match="not a src_dask run store"):
        src_dask.apply(a, x, 4, store=tmp_path / "data")
    assert (tmp_path / "data" / "notes.txt").read_text() == "mine"


def test_read_only_store_fails_early(tmp_path, counts):
    a, x = random_mpo(5, 2, seed=0), random_mps(5, 3, seed=0)
    ro = tmp_path / "ro"
    ro.mkdir()
    if os.geteuid() == 0:  # root ignores permission bits: use a read-only mount
        if subprocess.run(["mount", "-t", "tmpfs", "-o", "ro,size=1m", "tmpfs", str(ro)],
                          capture_output=True, check=False).returncode != 0:
            pytest.skip("cannot make a read-only directory here (root without mount rights)")
    else:
        ro.chmod(0o555)
    try:
        with pytest.raises(OSError, match=rf"{ro}/run: .*cannot be written.*needs \d+ bytes"):
            src_dask.apply(a, x, 4, store=ro / "run")
    finally:
        if os.geteuid() == 0:
            subprocess.run(["umount", str(ro)], check=False)
    assert counts["sketch_step"] == 0


def test_not_enough_space_fails_early(tmp_path, monkeypatch, counts):
    a, x = random_mpo(5, 2, seed=0), random_mps(5, 3, seed=0)
    usage = _runstore.shutil.disk_usage(tmp_path)
    monkeypatch.setattr(_runstore.shutil, "disk_usage",
                        lambda p: usage._replace(free=1000))
    with pytest.raises(OSError, match=r"run: the run store needs \d+ bytes but only 1000 are "
                                      r"free"):
        src_dask.apply(a, x, 4, store=tmp_path / "run")
    assert not (tmp_path / "run").exists() and counts["sketch_step"] == 0


def test_planned_bytes_cover_what_a_run_writes(saved, tmp_path):
    a, x, a2, x2 = saved
    src_dask.apply(a2, x2, 10, seed=0, oversample=4, store=tmp_path / "run")
    written = sum(os.path.getsize(os.path.join(r, f))
                  for r, _, fs in os.walk(tmp_path / "run") for f in fs)
    planned = zarr.open_group(tmp_path / "run", mode="r").attrs["bytes_planned"]
    assert written <= planned


@pytest.mark.timeout(120)
def test_planned_bytes_follow_the_data_of_a_run_of_several_megabytes(tmp_path):
    """On a run that writes several MB (environments and checkpoints far above the
    per-site allowance for metadata), the plan covers what is written and is not far
    above it: its data terms are counted, not lost in the allowance."""
    # bonds 8·64 = 512 against a sketch of 32: the environments are most of the store
    a, x = random_mpo(12, 8, seed=1), random_mps(12, 64, seed=2)
    src_dask.apply(a, x, 32, seed=0, store=tmp_path / "run")
    written = sum(os.path.getsize(os.path.join(r, f))
                  for r, _, fs in os.walk(tmp_path / "run") for f in fs)
    planned = zarr.open_group(tmp_path / "run", mode="r").attrs["bytes_planned"]
    allowance = 2**16 * (12 + 1)
    assert written > 2 * allowance  # data, not metadata, make up the run store
    assert written <= planned <= 2 * written + allowance


# -- restart -----------------------------------------------------------------------------
_KILLED_RUN = textwrap.dedent("""
    import os, signal, sys
    import dask
    import src_dask
    dask.config.set(scheduler="synchronous")  # one task at a time: a known order
    from src_dask import _kernels as K
    step, site, nth, path = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
    dask.config.set({"src_dask.projection-block-size": int(sys.argv[5])})
    original = getattr(K, step)
    seen = []
    def killer(*args, **kwargs):
        if kwargs["site"] == site:
            seen.append(1)
            if len(seen) == nth:  # the nth call at this site
                os.kill(os.getpid(), signal.SIGKILL)  # like a killed client: no cleanup
        return original(*args, **kwargs)
    setattr(K, step, killer)
    src_dask.apply(src_dask.open(path + "/a"), src_dask.open(path + "/x"), 10, seed=5, chunk=4,
                   oversample=2, store=path + "/run")
""")


def _killed_run(tmp_path, step: str, site: int, nth: int = 1,
                z_block_bytes: int = 2 << 30) -> None:
    res = subprocess.run([sys.executable, "-c", _KILLED_RUN, step, str(site), str(nth),
                          str(tmp_path), str(z_block_bytes)], capture_output=True, text=True,
                         check=False)
    assert res.returncode == -signal.SIGKILL, res.stderr
    run = zarr.open_group(tmp_path / "run", mode="r")
    assert run.attrs["complete"] is False  # an interrupted run never looks finished


@pytest.mark.parametrize("z_block_bytes", [2 << 30, 16 * 30])
def test_resume_after_kill_in_pass2(saved, tmp_path, counts, monkeypatch, z_block_bytes):
    """Resumes from the checkpoint, with Z whole or in row blocks."""
    monkeypatch.setitem(dask.config.config["src_dask"], "projection-block-size", z_block_bytes)
    a, x, a2, x2 = saved
    _killed_run(tmp_path, "pass2_step", site=4, z_block_bytes=z_block_bytes)
    assert zarr.open_group(tmp_path / "run/progress", mode="r").attrs["pass2_next"] == 4
    y = src_dask.apply(a2, x2, 10, seed=5, chunk=4, oversample=2, store=tmp_path / "run")
    assert counts["sketch_step"] == 0  # pass 1 is not redone
    assert counts["pass2_step"] == 4  # sites 4, 3, 2, 1: the finished 7, 6, 5 are not redone
    _close(y, src_dask.apply(a, x, 10, seed=5, chunk=4, oversample=2))


@pytest.mark.parametrize("chunk", [3, 8])
def test_a_resume_with_another_chunk_keeps_the_stores(saved, tmp_path, counts, chunk):
    """The run store's blocks of columns are its own: resumed with another ``chunk=``
    (fewer or more columns a block), pass 1 is not redone, pass 2 goes on from its
    checkpoint, and the result is the uninterrupted run's."""
    a, x, a2, x2 = saved
    _killed_run(tmp_path, "pass2_step", site=4)
    y = src_dask.apply(a2, x2, 10, seed=5, chunk=chunk, oversample=2, store=tmp_path / "run")
    assert counts["sketch_step"] == 0 and counts["pass2_step"] == 4
    _close(y, src_dask.apply(a, x, 10, seed=5, chunk=4, oversample=2))


def test_a_pass_1_resumed_with_another_chunk_redoes_only_its_unfinished_block(saved, tmp_path,
                                                                              counts):
    a, x, a2, x2 = saved
    _killed_run(tmp_path, "sketch_step", site=6, nth=2)  # one block of 4 columns done
    y = src_dask.apply(a2, x2, 10, seed=5, chunk=3, oversample=2, store=tmp_path / "run")
    assert counts["sketch_step"] == 7 * 2  # the store's other block of 4, not blocks of 3
    _close(y, src_dask.apply(a, x, 10, seed=5, chunk=4, oversample=2))


def test_a_resume_on_a_cluster_of_two_workers(saved, tmp_path, cluster_client):
    """Killed in one process, resumed on a cluster of two workers (other placement,
    other schedulers): the uninterrupted run's cores to roundoff."""
    a, x, a2, x2 = saved
    _killed_run(tmp_path, "pass2_step", site=4)
    y = src_dask.apply(a2, x2, 10, seed=5, chunk=4, oversample=2, store=tmp_path / "run",
                       client=cluster_client)
    _close(y, src_dask.apply(a, x, 10, seed=5, chunk=4, oversample=2))


def test_a_resume_with_a_cutoff(saved, tmp_path, counts):
    """A run with a cutoff (bonds known only as it goes) killed in pass 2 and resumed:
    the uninterrupted run's result, bonds included."""
    a, x, a2, x2 = saved
    script = _KILLED_RUN.replace("oversample=2, store=", "oversample=2, cutoff=1e-3, store=")
    res = subprocess.run([sys.executable, "-c", script, "pass2_step", "4", "1", str(tmp_path),
                          str(2 << 30)], capture_output=True, text=True, check=False)
    assert res.returncode == -signal.SIGKILL, res.stderr
    y = src_dask.apply(a2, x2, 10, seed=5, chunk=4, oversample=2, cutoff=1e-3,
                       store=tmp_path / "run")
    assert counts["sketch_step"] == 0 and counts["pass2_step"] == 4
    ref = src_dask.apply(a, x, 10, seed=5, chunk=4, oversample=2, cutoff=1e-3)
    assert [c.shape for c in y.to_numpy()] == [c.shape for c in ref.to_numpy()]
    _close(y, ref)


def test_resume_after_kill_in_pass1_redoes_only_unfinished_blocks(saved, tmp_path, counts):
    a, x, a2, x2 = saved
    _killed_run(tmp_path, "sketch_step", site=6, nth=2)  # one block has finished pass 1
    done = zarr.open_group(tmp_path / "run/progress", mode="r")["pass1"][...]
    assert done.sum() == 1
    y = src_dask.apply(a2, x2, 10, seed=5, chunk=4, oversample=2, store=tmp_path / "run")
    assert counts["sketch_step"] == 7 * 2
    assert counts["pass2_step"] == 7
    _close(y, src_dask.apply(a, x, 10, seed=5, chunk=4, oversample=2))


def test_a_full_disk_fails_early(tmp_path, counts):
    """A real 1 MiB file system (where we may mount one; the test above covers the rest)."""
    small = tmp_path / "small"
    small.mkdir()
    if os.geteuid() != 0 or subprocess.run(
            ["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(small)],
            capture_output=True, check=False).returncode != 0:
        pytest.skip("needs root to mount a small file system")
    try:
        # 12 sites: bonds up to 4·32 = 128 (at 6 sites the physical legs cap them at 8)
        a, x = random_mpo(12, 4, seed=0), random_mps(12, 32, seed=0)
        with pytest.raises(OSError, match=rf"{small}/run: the run store needs \d+ bytes"):
            src_dask.apply(a, x, 64, store=small / "run")
        assert os.listdir(small) == []
    finally:
        subprocess.run(["umount", str(small)], check=False)
    assert counts["sketch_step"] == 0


@pytest.mark.parametrize("memory, kept", [(None, False), (3, False), (4, True)])
def test_inputs_are_kept_when_they_take_a_quarter_of_memory_at_most(saved, counts, monkeypatch,
                                                                       memory, kept):
    """By default (``src_dask.keep-inputs: auto``) lazy inputs are kept for pass 2 when
    they take at most a quarter of a worker's memory, else read in each pass (and when
    the memory cannot be told)."""
    import dataclasses

    from src_dask import _api

    a, x, a2, x2 = saved
    lazy = sum(c.nbytes for t in (a2, x2) for c in t)
    facts = _api.worker_facts
    monkeypatch.setattr(_api, "worker_facts", lambda client, device: dataclasses.replace(
        facts(client, device), memory=None if memory is None else memory * lazy))
    y = src_dask.apply(a2, x2, 10, seed=0)
    _close(y, src_dask.apply(a, x, 10, seed=0))
    assert counts["read"] == (2 * 8 if kept else 2 * (2 * 8 - 1))


def test_keep_inputs_config_is_checked(saved):
    import dask

    with dask.config.set({"src_dask.keep-inputs": "sometimes"}), \
            pytest.raises(ValueError, match="src_dask.keep-inputs: expected auto, True or False"):
        src_dask.apply(saved[2], saved[3], 10, seed=0)


def test_worker_memory_is_the_machine_or_the_worker_limit(cluster_client):
    """The memory the keep-inputs rule compares with: the machine's without a client,
    each worker's limit on a cluster (the smallest)."""
    import psutil

    from src_dask._cluster import worker_facts

    assert worker_facts(None, "cpu").memory == psutil.virtual_memory().total
    limits = [w["memory_limit"] for w in cluster_client.scheduler_info()["workers"].values()]
    assert worker_facts(cluster_client, "cpu").memory == min(limits)


def test_kept_inputs_are_read_once(saved, counts):
    """With the Dask config ``src_dask.keep-inputs``, each input core is read once and
    kept for pass 2; the result is the same."""
    import dask

    a, x, a2, x2 = saved
    with dask.config.set({"src_dask.keep-inputs": True}):
        y = src_dask.apply(a2, x2, 10, seed=0)
    _close(y, src_dask.apply(a, x, 10, seed=0))
    assert counts["read"] == 2 * 8


# -- stacks and provenance ----------------------------------------------------------------
def test_a_stack_saves_and_opens_its_factors_in_order(tmp_path):
    """``save_stack`` writes the factors of a product as one stack (leftmost first,
    ``attrs`` on the stack and each train); ``open_stack`` gives them back by name,
    in order, lazily; ``overwrite`` replaces a stack src_dask wrote, as a train."""
    trains = {"N": random_mpo(5, 2, phys=3, seed=1), "M": random_mpo(5, 3, phys=3, seed=2),
              "psi": random_mps(5, 4, phys=3, seed=3)}
    src_dask.save_stack(trains, tmp_path / "s", attrs={"generated": {"by": "test"}})
    back = src_dask.open_stack(tmp_path / "s")
    assert list(back) == ["N", "M", "psi"]
    for name, t in trains.items():
        _close(back[name], t, tol=0)
        assert zarr.open_group(tmp_path / "s" / name, mode="r").attrs["generated"] == {"by": "test"}
    assert zarr.open_group(tmp_path / "s", mode="r").attrs["generated"] == {"by": "test"}
    with pytest.raises(FileExistsError, match="already exists"):
        src_dask.save_stack(trains, tmp_path / "s")
    src_dask.save_stack({"psi": trains["psi"]}, tmp_path / "s", overwrite=True)
    assert list(src_dask.open_stack(tmp_path / "s")) == ["psi"]
    src_dask.save(trains["N"], tmp_path / "s", overwrite=True)  # a train may replace it too
    assert len(src_dask.open(tmp_path / "s")) == 5
    assert [p.name for p in tmp_path.iterdir()] == ["s"]  # no temporaries left


@pytest.mark.parametrize(("factors", "attrs", "match"), [
    ({"../up": None}, None, "not a folder name"),
    ({".hidden": None}, None, "not a folder name"),
    ({}, None, "no factors"),
    ({"a": None}, {"format": "mine"}, "format are the format's own attributes"),
    ({"a": None}, {"when": object()}, "not JSON values"),
])
def test_a_stack_of_bad_names_or_attributes_is_refused_before_writing(tmp_path, factors, attrs,
                                                                     match):
    factors = {k: random_mps(3, 2, seed=0) for k in factors}
    with pytest.raises(ValueError, match=match):
        src_dask.save_stack(factors, tmp_path / "s", attrs=attrs)
    assert list(tmp_path.iterdir()) == []


def test_save_records_attributes_but_not_over_the_formats_own(tmp_path):
    x = random_mps(4, 3, seed=0)
    src_dask.save(x, tmp_path / "x", attrs={"made_by": {"command": "test", "seed": 3}})
    assert zarr.open_group(tmp_path / "x", mode="r").attrs["made_by"] == {"command": "test",
                                                                          "seed": 3}
    for bad in ({"id": "mine"}, {"complete": True}, ["not", "a", "dict"]):
        with pytest.raises(ValueError, match="attrs"):
            src_dask.save(x, tmp_path / "y", attrs=bad)
    assert not (tmp_path / "y").exists()


def test_open_stack_refuses_what_is_not_a_stack_or_reaches_outside_it(tmp_path):
    src_dask.save(random_mps(3, 2, seed=0), tmp_path / "x")
    with pytest.raises(StoreError, match="not a src_dask stack"):
        src_dask.open_stack(tmp_path / "x")
    src_dask.save_stack({"a": random_mps(3, 2, seed=0)}, tmp_path / "s")
    group = zarr.open_group(tmp_path / "s", mode="r+")
    group.attrs["factors"] = ["../x"]
    with pytest.raises(StoreError, match="outside the stack folder"):
        src_dask.open_stack(tmp_path / "s")


def test_open_trains_expands_stacks_and_refuses_what_holds_no_train(tmp_path):
    """``storage.open_trains``: saved trains and stacks in order, a stack giving its
    factors; a missing path, a run store or a folder of other things named in the error
    before anything is read."""
    from src_dask import storage

    a, x = random_mpo(4, 2, seed=1), random_mps(4, 3, seed=2)
    src_dask.save_stack({"A": a}, tmp_path / "stack")
    src_dask.save(x, tmp_path / "x")
    trains = storage.open_trains(tmp_path / "stack", str(tmp_path / "x"))
    assert [t.kind for t in trains] == ["mpo", "mps"]
    assert np.allclose(trains[0].to_dense(), a.to_dense())
    assert np.allclose(trains[1].to_dense(), x.to_dense())
    with pytest.raises(FileNotFoundError, match="gone: no such file"):
        storage.open_trains(tmp_path / "x", tmp_path / "gone")
    src_dask.src(a, x, chi_out=4, seed=0, store=tmp_path / "run")
    with pytest.raises(StoreError, match="run: is a run store, not a train"):
        storage.open_trains(tmp_path / "run")
    (tmp_path / "other").mkdir()
    with pytest.raises(StoreError, match="other: not a src_dask train"):
        storage.open_trains(tmp_path / "other")


def test_check_writable_refuses_a_path_over_what_is_read_or_too_large(tmp_path, monkeypatch):
    """``storage.check_writable(apart_from=, nbytes=)``: a result must not go inside,
    onto or around a train being read or a named directory, and must fit its disk."""
    from src_dask import _paths, storage
    from src_dask.errors import PathRefusedError

    src_dask.save(random_mps(4, 3, seed=2), tmp_path / "x")
    x = src_dask.open(tmp_path / "x")
    for path, how in ((tmp_path / "x" / "out", "is inside"), (tmp_path / "x", "is")):
        with pytest.raises(PathRefusedError, match=f"{how} the directory of input x"):
            storage.check_writable(path, overwrite=True, apart_from={"input x": x})
    src_dask.save_stack({"A": random_mpo(4, 2, seed=1)}, tmp_path / "s")
    a = storage.open_stack(tmp_path / "s")["A"]
    with pytest.raises(PathRefusedError, match="contains the directory of factor A"):
        storage.check_writable(tmp_path / "s", overwrite=True, apart_from={"factor A": a})
    with pytest.raises(PathRefusedError, match="directory of --store"):
        storage.check_writable(tmp_path / "run" / "y", apart_from={"--store": tmp_path / "run"})
    storage.check_writable(tmp_path / "y", apart_from={"input x": x, "--store": tmp_path / "r"},
                           nbytes=1)
    usage = _paths.shutil.disk_usage(tmp_path)
    monkeypatch.setattr(_paths.shutil, "disk_usage", lambda p: usage._replace(free=1000))
    with pytest.raises(OSError, match=r"y: the train needs 1000000 bytes but only 1000"):
        storage.check_writable(tmp_path / "y", nbytes=10**6)


def test_the_store_in_tasks_pickles_without_the_lock_and_writes_through(tmp_path):
    """The tasks carry the run's :class:`~src_dask._runstore.RunStore` (path, run id,
    layout), never the client's :class:`~src_dask._runstore.OpenRun` and its lock: the
    whole graph pickles without them, and run from its pickled copy (as workers get
    it) it writes the same cores as a run in memory."""
    import cloudpickle
    from dask.local import get_sync

    from src_dask import _plan, _random
    from src_dask._lock import StoreLock
    from src_dask._stack import make_stack

    stack = make_stack((random_mpo(6, 3, seed=1), random_mps(6, 4, seed=2)))
    plan = _plan.Plan(sketch=6, chunk=3, chi_out=6, cutoff=0.0, key=_random.seed_key(3),
                      round=False)
    run, progress, seed, chunk = _runstore.OpenRun.prepare(
        str(tmp_path / "run"), stack, {"test": 1}, seed=3, sketch=6, chunk=3, overwrite=False)
    try:
        assert (seed, chunk) == (3, 3) and isinstance(run._lock, StoreLock)
        shipped = cloudpickle.loads(cloudpickle.dumps(run.store))
        assert shipped == run.store
        assert not any(isinstance(v, (StoreLock, _runstore.OpenRun))
                       for v in vars(shipped).values())
        graph = _graph.build(stack, plan, None, run.store, progress)
        blob = cloudpickle.dumps(dict(graph.__dask_graph__()))
        assert b"StoreLock" not in blob and b"OpenRun" not in blob
        get_sync(cloudpickle.loads(blob), [graph.key])
        run.write_discarded(None)
        run.mark_complete()
        _close(run.result(stack.kind), _graph.build(stack, plan).compute(scheduler="sync"))
    finally:
        run.release()


@pytest.mark.timeout(60)
@pytest.mark.parametrize("rows, blocks", [(500, 3), (40, 6), (9, 2), (7, 7)])
def test_blocks_of_a_pass2_checkpoint_never_share_a_chunk(tmp_path, rows, blocks):
    """``S_{j-1}`` saved by row blocks (no task holds it whole), each block by its own
    task, side by side on a worker's threads: the array's chunks of rows divide every
    block's first row, so no two writers rewrite one chunk (a partial chunk is read,
    changed and written whole: one writer's rows would be lost); written from threads
    at once, every row reads back."""
    from concurrent.futures import ThreadPoolExecutor

    from src_dask._graph import tasks

    path = tmp_path / "run"
    zarr.open_group(str(path), mode="w")
    store = _runstore.RunStore(str(path))
    rng = np.random.default_rng(0)
    left = (3, 2)
    eta = rng.standard_normal((rows, 2, 1, 1))
    env = rng.standard_normal((rows, *left))
    assert tasks.checkpoint_begin(eta, store=store, site=1, left=left, blocks=blocks) == rows
    arr = zarr.open_array(str(path / _runstore.LAYOUT.right_env_site(0)), mode="r")
    cut = [K.block_rows(rows, b, blocks) for b in range(blocks)]
    assert all(lo % arr.chunks[0] == 0 for lo, _ in cut), (arr.chunks, cut)
    with ThreadPoolExecutor(blocks) as pool:
        list(pool.map(lambda b: tasks.checkpoint_rows(env[slice(*cut[b])], rows, store=store,
                                                      site=1, block=(b, blocks)),
                      range(blocks)))
    np.testing.assert_array_equal(store.read_right_env(0), env)
