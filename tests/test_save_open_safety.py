"""src_dask.save / src_dask.open never lose or invent data: which paths save refuses,
atomic saves, clear errors from open, and verified reads of damaged trains."""

from __future__ import annotations

import os
import pickle

import dask.array as da
import numpy as np
import pytest
import zarr
from helpers import random_mpo, random_mps

import src_dask
from src_dask import _graph, _integrity, _transfer
from src_dask.errors import DamagedDataError, PathRefusedError, StoreError

try:  # a guard against a hung test where pytest-timeout is installed (it is optional)
    import pytest_timeout  # noqa: F401

    pytestmark = pytest.mark.timeout(60)
except ImportError:
    pass


def _tree(path) -> dict[str, bytes]:
    """Every file under ``path`` with its contents."""
    out = {}
    for root, _, files in os.walk(path):
        for f in files:
            full = os.path.join(root, f)
            with open(full, "rb") as fh:
                out[os.path.relpath(full, path)] = fh.read()
    return out


def _hidden(parent) -> list[str]:
    return sorted(n for n in os.listdir(parent) if n.startswith("."))


# -- 1. paths --------------------------------------------------------------------------------
def test_empty_path_and_a_path_of_the_wrong_type_are_refused(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    x = random_mps(3, 2, seed=0)
    for empty in ("", " "):
        with pytest.raises(ValueError, match=r"path: empty path \('\s*'\)"):
            src_dask.save(x, empty)
    with pytest.raises(TypeError, match=r"path: expected a path \(str or os.PathLike\), got int"):
        src_dask.save(x, 3)
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize("overwrite", [False, True])
def test_a_directory_that_is_not_a_train_is_never_replaced(tmp_path, overwrite):
    data = tmp_path / "data"
    data.mkdir()
    (data / "notes.txt").write_text("mine")
    zarr.open_group(data / "other", mode="w").attrs["format"] = "someone else's"
    before = _tree(data)
    with pytest.raises(PathRefusedError, match="exists and is not a src_dask train") as err:
        src_dask.save(random_mps(3, 2), data, overwrite=overwrite)
    assert "overwrite" not in str(err.value) and isinstance(err.value, FileExistsError)
    assert _tree(data) == before and _hidden(tmp_path) == []


@pytest.mark.parametrize("overwrite", [False, True])
def test_a_file_is_refused(tmp_path, overwrite):
    f = tmp_path / "f"
    f.write_text("mine")
    with pytest.raises(PathRefusedError, match=f"{f}: is a file") as err:
        src_dask.save(random_mps(3, 2), f, overwrite=overwrite)
    assert "overwrite" not in str(err.value)
    assert f.read_text() == "mine" and _hidden(tmp_path) == []


def test_an_empty_directory_is_used_unless_it_is_the_working_directory(tmp_path, monkeypatch):
    x = random_mps(3, 2, seed=1)
    (tmp_path / "empty").mkdir()
    src_dask.save(x, tmp_path / "empty")
    np.testing.assert_array_equal(src_dask.open(tmp_path / "empty").to_dense(), x.to_dense())
    here = tmp_path / "here"
    here.mkdir()
    monkeypatch.chdir(here)
    for path in (".", here, "../here"):
        with pytest.raises(PathRefusedError, match="current working directory"):
            src_dask.save(x, path, overwrite=True)
    assert os.listdir(here) == [] and _hidden(tmp_path) == []


def test_a_train_is_replaced_only_with_overwrite(tmp_path):
    x, y = random_mps(3, 2, seed=1), random_mps(4, 3, seed=2)
    src_dask.save(x, tmp_path / "t")
    with pytest.raises(FileExistsError, match="already exists; pass overwrite=True"):
        src_dask.save(y, tmp_path / "t")
    np.testing.assert_array_equal(src_dask.open(tmp_path / "t").to_dense(), x.to_dense())
    src_dask.save(y, str(tmp_path / "t") + "/", overwrite=True)  # a trailing slash too
    np.testing.assert_array_equal(src_dask.open(tmp_path / "t").to_dense(), y.to_dense())
    assert sorted(os.listdir(tmp_path)) == ["t"]


def test_saving_a_train_over_the_one_it_was_opened_from_keeps_the_data(tmp_path):
    a = random_mpo(5, 3, seed=4)
    src_dask.save(a, tmp_path / "a", max_chunk_bytes=200)
    opened = src_dask.open(tmp_path / "a")
    before = opened.to_dense()
    src_dask.save(opened, tmp_path / "a", overwrite=True)
    again = src_dask.open(tmp_path / "a")
    np.testing.assert_array_equal(again.to_dense(), before)
    np.testing.assert_array_equal(before, a.to_dense())
    assert sorted(os.listdir(tmp_path)) == ["a"]
    # the train opened before the save is not read any more: it is another save now
    with pytest.raises(StoreError, match=f"{tmp_path / 'a'}: was replaced by another save"):
        opened[1].compute()


def test_a_path_inside_or_around_the_trains_source_is_refused(tmp_path):
    outer = tmp_path / "outer"
    src_dask.save(random_mps(3, 2, seed=0), outer)
    src_dask.save(random_mps(4, 2, seed=1), outer / "inner")  # a train inside a train
    inner = src_dask.open(outer / "inner")
    before = _tree(outer)
    for target in (outer / "inner" / "copy", outer / "inner" / "site_1" / "x", outer,
                   tmp_path):
        with pytest.raises(PathRefusedError, match=r"the train being saved \(site 0\)"):
            src_dask.save(inner, target, overwrite=True)
    # cores taken out of the opened train (no sources) still name where they are read from
    with pytest.raises(PathRefusedError, match="destroy data being read"):
        src_dask.save(list(inner), outer, overwrite=True)
    assert _tree(outer) == before and _hidden(outer) == [] and _hidden(tmp_path) == []
    np.testing.assert_array_equal(inner.to_dense(), random_mps(4, 2, seed=1).to_dense())


@pytest.mark.parametrize("chunks", [(2, 2), (2, 2, 2, 2), (0, 2, 2), (2, -1, 2), (2.0, 2, 2),
                                    ("a", 2, 2), (True, 2, 2), 4, "abc"])
def test_bad_chunks_are_a_value_error_naming_chunks_and_the_rank(tmp_path, chunks):
    with pytest.raises(ValueError, match=r"chunks: expected 3 positive ints.*MPS core"):
        src_dask.save(random_mps(4, 2), tmp_path / "x", chunks=chunks)
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize("bad", [0, -1, float("nan"), "1MB", None])
def test_bad_max_chunk_bytes(tmp_path, bad):
    with pytest.raises(ValueError, match="max_chunk_bytes: expected a positive number"):
        src_dask.save(random_mps(4, 2), tmp_path / "x", max_chunk_bytes=bad)
    assert os.listdir(tmp_path) == []


def test_good_chunks_of_numpy_ints(tmp_path):
    x = random_mpo(4, 3, seed=0)
    src_dask.save(x, tmp_path / "a", chunks=tuple(np.int64(c) for c in (2, 2, 1, 2)))
    assert zarr.open_group(tmp_path / "a", mode="r")["site_1"].chunks == (2, 2, 1, 2)


# -- 2. atomic saves ------------------------------------------------------------------------
def test_saved_arrays_carry_checksums_a_completion_mark_and_a_fresh_id(tmp_path):
    x = random_mps(4, 3, seed=0)
    src_dask.save(x, tmp_path / "x")
    group = zarr.open_group(tmp_path / "x", mode="r")
    first = group.attrs["id"]
    assert group.attrs["complete"] is True and group.attrs["version"] == 2
    for j in range(4):
        arr = group[f"site_{j}"]
        assert _integrity.is_verifiable(arr) and np.isnan(arr.fill_value)
        assert arr.attrs["train_id"] == first
    src_dask.save(x, tmp_path / "x", overwrite=True)
    assert zarr.open_group(tmp_path / "x", mode="r").attrs["id"] != first


@pytest.mark.parametrize("failure", [KeyboardInterrupt, OSError])
def test_an_interrupted_save_leaves_the_old_train_and_no_partial(tmp_path, monkeypatch,
                                                                   failure):
    old = random_mps(4, 2, seed=1)
    src_dask.save(old, tmp_path / "t")
    before = _tree(tmp_path / "t")
    create, made = _integrity.create, []

    def create_then_fail(*args, **kwargs):
        made.append(1)
        if len(made) == 3:
            raise failure("interrupted")
        return create(*args, **kwargs)

    monkeypatch.setattr(_integrity, "create", create_then_fail)
    for where in ("t", "new"):
        made.clear()
        with pytest.raises(failure):
            src_dask.save(random_mps(4, 2, seed=2), tmp_path / where, overwrite=True)
    assert sorted(os.listdir(tmp_path)) == ["t"]  # no partial, and nothing at "new"
    assert _tree(tmp_path / "t") == before


def test_a_failing_dask_core_leaves_nothing(tmp_path):
    def boom(block):
        raise RuntimeError("worker lost")

    x = random_mps(4, 2, seed=0)
    cores = [da.from_array(c, chunks=1) for c in x]
    cores[2] = cores[2].map_blocks(boom, dtype=cores[2].dtype)
    with pytest.raises(RuntimeError, match="worker lost"):
        src_dask.save(src_dask.TensorTrain(cores), tmp_path / "x")
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize("lazy", [False, True])
def test_cores_holding_nan_are_not_saved(tmp_path, lazy):
    x = list(random_mps(4, 2, seed=0))
    x[2] = x[2].copy()
    x[2][0, 1, 0] = np.nan
    if lazy:
        x = [da.from_array(c, chunks=1) for c in x]
    with pytest.raises(ValueError, match=r"x, site 2: holds NaN or inf"):
        src_dask.save(x, tmp_path / "x")
    assert os.listdir(tmp_path) == []


# -- 3. open: clear errors ----------------------------------------------------------------
def _edit(path, **attrs):
    group = zarr.open_group(path, mode="r+")
    for k, v in attrs.items():
        if v is None:
            del group.attrs[k]
        else:
            group.attrs[k] = v


@pytest.mark.parametrize("edit, message", [
    ({"complete": None}, "incomplete: an interrupted save; write it again"),
    ({"complete": False}, "incomplete: an interrupted save; write it again"),
    ({"version": 1}, "format version 1, written by an older src_dask"),
    ({"version": 3}, "version 3 is newer than this src_dask understands"),
    ({"version": "2"}, "version '2' is not an int"),
    ({"sites": None}, r"sites None, expected an int >= 2"),
    ({"sites": "4"}, r"sites '4', expected an int >= 2"),
    ({"sites": 1}, r"sites 1, expected an int >= 2"),
    ({"sites": 5}, "incomplete train: site_4 is missing"),
    ({"sites": 3}, "sites is 3, but site_3 exists"),
    ({"kind": "peps"}, "kind 'peps', expected 'mps' or 'mpo'"),
    ({"kind": "mpo", "layout": "lrud"}, "site_0 has rank 2"),
    ({"format": "other"}, "not a src_dask train"),
    ({"id": None}, "no id"),
])
def test_hand_edited_metadata_is_one_clear_error(tmp_path, edit, message):
    path = tmp_path / "t"
    src_dask.save(random_mps(4, 2, seed=0), path)
    _edit(path, **edit)
    with pytest.raises(StoreError, match=message) as err:
        src_dask.open(path)
    assert str(err.value).startswith(f"{path}: ")


def test_a_site_array_missing_replaced_or_of_another_save(tmp_path):
    import shutil

    path = tmp_path / "t"
    src_dask.save(random_mps(4, 2, seed=0), path)
    src_dask.save(random_mps(4, 2, seed=1), tmp_path / "u")
    shutil.rmtree(path / "site_2")
    with pytest.raises(StoreError, match=f"{path}: incomplete train: site_2 is missing"):
        src_dask.open(path)
    shutil.copytree(tmp_path / "u" / "site_2", path / "site_2")
    with pytest.raises(StoreError, match="site_2 belongs to another save"):
        src_dask.open(path)
    group = zarr.open_group(path, mode="r+")
    plain = group.create_array("site_2", shape=(2, 2, 2), dtype=float, overwrite=True)
    plain[...] = 1
    with pytest.raises(StoreError, match="site_2 has no checksums"):
        src_dask.open(path)
    _integrity.create(group, "site_2", (2, 2), float, (2, 2), overwrite=True)
    with pytest.raises(StoreError, match=f"{path}: site_2 has rank 2"):
        src_dask.open(path)


def test_things_that_are_not_trains(tmp_path):
    with pytest.raises(FileNotFoundError, match="no saved train here"):
        src_dask.open(tmp_path / "missing")
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match="no saved train here"):
        src_dask.open(tmp_path / "empty")
    (tmp_path / "f").write_text("x")
    with pytest.raises(StoreError, match="f: is a file, not a src_dask train"):
        src_dask.open(tmp_path / "f")
    zarr.create_array(tmp_path / "arr", shape=(2,), dtype=float)
    with pytest.raises(StoreError, match=r"arr: is a Zarr array, not a src_dask train \(a "
                                         r"group written by src_dask.save\)"):
        src_dask.open(tmp_path / "arr")
    (tmp_path / "junk").mkdir()
    (tmp_path / "junk" / "a.txt").write_text("x")
    with pytest.raises(StoreError, match="junk: not a src_dask train"):
        src_dask.open(tmp_path / "junk")
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "zarr.json").write_text("{not json")
    with pytest.raises(StoreError, match="bad: not a src_dask train.*cannot be read"):
        src_dask.open(tmp_path / "bad")
    with pytest.raises(ValueError, match=r"path: empty path \(''\)"):
        src_dask.open("")


def test_open_gives_verified_dask_cores(tmp_path):
    x = random_mps(4, 3, seed=0)
    src_dask.save(x, tmp_path / "x", max_chunk_bytes=100)
    y = src_dask.open(tmp_path / "x")
    for j in range(4):
        assert isinstance(y[j], da.Array)
        src = y.source(j)
        assert isinstance(src, _integrity.VerifiedArray)
        assert src.what == f"{tmp_path / 'x'}/site_{j}"
        np.testing.assert_array_equal(pickle.loads(pickle.dumps(src)).read(), x[j])
    np.testing.assert_array_equal(y.to_dense(), x.to_dense())


# -- damage on disk: an error naming path and site, never zeros ------------------------------
def _chunk_files(path, site):
    return sorted(os.path.join(r, f) for r, _, fs in os.walk(path / f"site_{site}" / "c")
                  for f in fs)


def _damage(path, how):
    victim = _chunk_files(path, 2)[1]
    if how == "missing chunk":
        os.remove(victim)
    elif how in ("flipped bit", "truncated chunk"):
        with open(victim, "rb") as f:
            data = bytearray(f.read())
        if how == "flipped bit":
            data[len(data) // 2] ^= 0x10
        else:
            data = data[: len(data) // 2]
        with open(victim, "wb") as f:
            f.write(bytes(data))
    else:  # NaN written through Zarr: the checksums agree, the values do not
        zarr.open_group(path, mode="r+")["site_2"][0, 0, 0] = np.nan


_HOW = ["missing chunk", "flipped bit", "truncated chunk", "nan"]
_SAYS = {"missing chunk": "is missing", "flipped bit": "damaged", "truncated chunk": "damaged",
         "nan": "NaN"}


@pytest.mark.parametrize("how", _HOW)
def test_damaged_data_raises_naming_path_and_site(tmp_path, how):
    path = tmp_path / "x"
    x = random_mps(4, 4, seed=0)
    src_dask.save(x, path, max_chunk_bytes=64)
    assert len(_chunk_files(path, 2)) > 1
    _damage(path, how)
    y = src_dask.open(path)
    np.testing.assert_array_equal(y[1].compute(), x[1])  # the other sites still read
    with pytest.raises(DamagedDataError, match=f"{path}/site_2: .*{_SAYS[how]}"):
        y[2].compute()
    with pytest.raises(DamagedDataError, match=f"{path}/site_2"):
        y.to_dense()


# -- 4. the graph reads sources directly ---------------------------------------------------
def test_the_graph_reads_verified_sources_directly(tmp_path, monkeypatch):
    path = tmp_path / "x"
    x = random_mps(4, 4, seed=0)
    src_dask.save(x, path, max_chunk_bytes=64)
    src = src_dask.open(path).source(2)
    assert _graph.tasks.is_stored(src)
    np.testing.assert_array_equal(_graph.tasks.read_whole(src), x[2])
    buffers = []

    def empty(shape, dtype):  # stands in for CuPy's pinned pool on this CPU machine
        buffers.append(np.full(shape, np.nan, dtype))
        return buffers[-1]

    monkeypatch.setattr(_transfer, "empty_pinned", empty)
    out = _graph.tasks.read_whole(src, pinned=True)
    assert out is buffers[-1]
    np.testing.assert_array_equal(out, x[2])
    lazy = _graph.tasks.lazy(src)
    assert isinstance(lazy, da.Array) and lazy.chunks == da.from_array(x[2], src.chunks).chunks
    np.testing.assert_array_equal(lazy.compute(), x[2])
    _damage(path, "missing chunk")
    read_whole = _graph.tasks.read_whole
    for read in (lambda: read_whole(src), lambda: read_whole(src, pinned=True),
                 lambda: lazy.compute()):
        with pytest.raises(DamagedDataError, match=f"{path}/site_2: chunk .* is missing"):
            read()


@pytest.mark.parametrize("keep", [True, False])
def test_a_run_on_a_damaged_train_raises(tmp_path, keep):
    import dask

    src_dask.save(random_mpo(4, 2, seed=0), tmp_path / "a")
    src_dask.save(random_mps(4, 3, seed=0), tmp_path / "x", max_chunk_bytes=64)
    _damage(tmp_path / "x", "flipped bit")
    with dask.config.set({"src_dask.keep-inputs": keep}), \
            pytest.raises(DamagedDataError, match=f"{tmp_path / 'x'}/site_2"):
        src_dask.apply(src_dask.open(tmp_path / "a"), src_dask.open(tmp_path / "x"), 4, seed=0)


def test_a_train_saved_again_has_another_token(tmp_path):
    """Runs fingerprint their inputs with ``tokenize(train.source(j))``: the same data
    saved again is another save, so a run store of the old one is not taken for it."""
    from dask.base import tokenize

    x = random_mps(4, 2, seed=0)
    src_dask.save(x, tmp_path / "x")
    first = tokenize(src_dask.open(tmp_path / "x").source(1))
    assert tokenize(src_dask.open(tmp_path / "x").source(1)) == first
    src_dask.save(x, tmp_path / "x", overwrite=True)
    assert tokenize(src_dask.open(tmp_path / "x").source(1)) != first


def test_a_path_below_a_file_is_refused_naming_the_file(tmp_path):
    (tmp_path / "f").write_text("mine")
    x = random_mps(3, 2, seed=0)
    for where in (tmp_path / "f" / "x", tmp_path / "f" / "deeper" / "x"):
        with pytest.raises(PathRefusedError, match=f"{tmp_path / 'f'} is a file"):
            src_dask.save(x, where)
        with pytest.raises(PathRefusedError, match=f"{tmp_path / 'f'} is a file"):
            src_dask.apply(random_mpo(3, 2, seed=1), x, 2, seed=0, store=where)
    assert (tmp_path / "f").read_text() == "mine"


# -- whole arrays read straight from their chunk files -------------------------------------
@pytest.mark.parametrize("shape, chunks", [((5, 7, 3), (5, 7, 3)), ((5, 7, 3), (2, 3, 3)),
                                           ((4, 6), (4, 1)), ((9,), (4,))])
@pytest.mark.parametrize("dtype", [np.complex128, np.float32])
def test_whole_arrays_are_read_from_their_chunk_files(tmp_path, monkeypatch, shape, chunks,
                                                      dtype):
    """What src_dask wrote on a local file system is read from its chunk files (Zarr's
    reader is not called), the same values as Zarr gives, edge chunks included; with
    the config direct-reads off Zarr reads it."""
    import dask

    data = np.random.default_rng(0).standard_normal(shape).astype(dtype)
    arr = _integrity.create(zarr.open_group(tmp_path / "g", mode="w"), "a", shape, dtype, chunks)
    arr[...] = data
    arr = zarr.open_group(tmp_path / "g", mode="r")["a"]
    with dask.config.set({"src_dask.direct-reads": False}):
        assert np.array_equal(_integrity.read(arr, what="a"), data)
    calls = []
    original = type(arr).get_basic_selection
    monkeypatch.setattr(type(arr), "get_basic_selection",
                        lambda self, *a, **k: calls.append(1) or original(self, *a, **k))
    monkeypatch.setattr(type(arr), "__getitem__",
                        lambda self, *a, **k: calls.append(1) or original(self, *a, **k))
    assert np.array_equal(_integrity.read(arr, what="a"), data)
    out = np.empty(shape, dtype)
    got = _integrity.read(arr, what="a", out=out)
    assert got is out and np.array_equal(out, data) and not calls
    with dask.config.set({"src_dask.direct-reads": False}):
        _integrity.read(arr, what="a")
    assert calls  # through Zarr


@pytest.mark.parametrize("how", ["missing chunk", "flipped bit", "truncated chunk", "longer"])
@pytest.mark.parametrize("direct", [True, False])
def test_a_damaged_chunk_file_is_an_error_read_either_way(tmp_path, how, direct):
    import dask

    data = np.arange(24, dtype=np.float64).reshape(4, 6)
    arr = _integrity.create(zarr.open_group(tmp_path / "g", mode="w"), "a", (4, 6),
                            np.float64, (2, 3))
    arr[...] = data
    victim = tmp_path / "g" / "a" / "c" / "1" / "0"
    assert victim.is_file()
    if how == "missing chunk":
        victim.unlink()
    else:
        raw = bytearray(victim.read_bytes())
        if how == "flipped bit":
            raw[3] ^= 0x01
        elif how == "truncated chunk":
            raw = raw[:-7]
        else:
            raw += b"\0"
        victim.write_bytes(bytes(raw))
    says = "chunk \\(1, 0\\) is missing" if how == "missing chunk" else "damaged"
    with dask.config.set({"src_dask.direct-reads": direct}), \
            pytest.raises(DamagedDataError, match=f"the a: .*{says}|a: .*{says}"):
        _integrity.read(zarr.open_group(tmp_path / "g", mode="r")["a"], what="the a")


def test_without_the_crc32c_package_checksums_are_taken_a_few_megabytes_a_call(
        monkeypatch):
    """Without the ``crc32c`` package a chunk's CRC32C comes from google_crc32c, in
    steps no larger than _CRC_STEP, with the same value: google_crc32c holds the GIL
    for a whole call, which stalled a worker's event loop and its other threads for
    ~60 ms per 256 MB core."""
    import google_crc32c

    steps = []
    real = google_crc32c.extend
    monkeypatch.setattr(_integrity, "_crc32c_gil_free", lambda: None)
    monkeypatch.setattr(google_crc32c, "extend",
                        lambda crc, b: steps.append(b.size) or real(crc, b))
    monkeypatch.setattr(_integrity, "_CRC_STEP", 1000)
    rng = np.random.default_rng(0)
    for n in (0, 1, 999, 1000, 1001, 4500):
        data = rng.integers(0, 256, n, dtype=np.uint8)
        steps.clear()
        assert _integrity._crc32c(data) == google_crc32c.value(data.tobytes())
        assert len(steps) == -(-n // 1000) and all(0 < s <= 1000 for s in steps)
    x = rng.standard_normal((3, 5, 7)) + 1j * rng.standard_normal((3, 5, 7))
    assert _integrity._crc32c(x) == google_crc32c.value(x.tobytes())


def test_the_crc32c_package_gives_zarrs_checksums_and_lets_other_threads_run(monkeypatch):
    """Where the ``crc32c`` package is installed (the gpu and test extras) it takes the
    checksums: the values Zarr's codec writes (google_crc32c's), for any length and
    dtype, while it lets go of the GIL (a thread that only counts keeps counting through
    a checksum of 256 MB in one call, where google_crc32c's would hold it throughout)."""
    import threading
    import time

    import google_crc32c

    pytest.importorskip("crc32c")
    assert _integrity._crc32c_gil_free() is not None
    rng = np.random.default_rng(1)
    for n in (0, 1, 31, 32 << 10, (32 << 10) + 3, 100_001):
        data = rng.integers(0, 256, n, dtype=np.uint8)
        assert _integrity._crc32c(data) == google_crc32c.value(data.tobytes())
    x = rng.standard_normal((3, 5, 7)) + 1j * rng.standard_normal((3, 5, 7))
    assert _integrity._crc32c(x) == google_crc32c.value(x.tobytes())

    monkeypatch.setattr(_integrity, "_CRC_STEP", 1 << 40)  # google_crc32c: one call
    big = rng.integers(0, 256, 256 << 20, dtype=np.uint8)
    ticks, done = [], threading.Event()
    counter = threading.Thread(target=lambda: [ticks.append(1) or time.sleep(1e-4)
                                               for _ in iter(done.is_set, True)])
    counter.start()
    try:
        time.sleep(0.01)
        before = len(ticks)
        _integrity._crc32c(big)
        during = len(ticks) - before
    finally:
        done.set()
        counter.join()
    assert during >= 4  # google_crc32c's: 0 or 1
