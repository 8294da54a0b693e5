"""Hostile inputs: Dask cores of unknown shape, mismatched trains in ``vdot``, a
progress stream that breaks during the run, and NumPy integers for ints."""

from __future__ import annotations

import errno
import io
import logging
import re

import dask
import dask.array as da
import numpy as np
import pytest
from helpers import close_cores, same_cores

import src_dask
from src_dask import TensorTrain, problems

_same = same_cores  # the same path and seed: bit for bit


# -- 1. Dask cores of unknown shape ------------------------------------------------
def _unknown_by_indexing(core: np.ndarray) -> da.Array:
    """``core`` behind a boolean mask Dask cannot size without computing: shape (nan, ...)."""
    d = da.from_array(core)
    return d[d[:, 0, 0].real > -10]


def _unknown_by_delayed(core: np.ndarray, calls: list) -> da.Array:
    """``core`` rebuilt from a delayed value with an unknown first size; ``calls`` counts
    how often it is computed."""
    def make():
        calls.append(1)
        return core

    return da.from_delayed(dask.delayed(make)(), shape=(np.nan, *core.shape[1:]),
                           dtype=core.dtype)


def test_unknown_shape_names_train_and_site_in_the_constructor():
    cores = problems.random_mps(6, 4, 2, seed=1).to_numpy()
    cores[3] = _unknown_by_indexing(cores[3])
    with pytest.raises(ValueError, match=re.escape(
            "chain, site 3: a Dask core of unknown shape (nan, 4, 2); call "
            ".compute_chunk_sizes() first")):
        TensorTrain(cores, name="chain")
    cores[3] = cores[3].compute_chunk_sizes()  # the fix the message names
    assert TensorTrain(cores).bond_dims == [2, 4, 4, 4, 2]


@pytest.mark.parametrize("how", ["indexing", "delayed"])
def test_unknown_shape_in_src_is_one_error_before_any_work(how):
    a = problems.random_mpo(6, 2, 2, seed=0)
    cores = problems.random_mps(6, 4, 2, seed=1).to_numpy()
    calls: list = []
    cores[3] = (_unknown_by_indexing(cores[3]) if how == "indexing"
                else _unknown_by_delayed(cores[3], calls))
    with pytest.raises(ValueError, match=re.escape(
            "trains[1], site 3: a Dask core of unknown shape (nan, 4, 2); call "
            ".compute_chunk_sizes() first")):
        src_dask.src(a, cores, chi_out=3, seed=0)
    assert calls == []  # nothing was computed


def test_unknown_shape_of_a_first_site_and_of_an_mpo():
    mpo = problems.random_mpo(4, 2, 2, seed=0).to_numpy()
    calls: list = []
    mpo[0] = _unknown_by_delayed(mpo[0], calls)
    with pytest.raises(ValueError, match=re.escape(
            "trains[0], site 0: a Dask core of unknown shape (nan, 2, 2)")):
        src_dask.src(mpo, problems.random_mps(4, 2, seed=1), chi_out=2)
    assert calls == []


# -- 2. vdot of mismatched trains ------------------------------------------------------
def test_vdot_of_different_physical_dims_names_the_site_and_both_dims():
    x = problems.random_mps(5, 3, 2, seed=1)
    cores = x.to_numpy()
    cores[3] = np.ones((3, 2, 3), complex)  # site 3: p = 3 instead of 2
    y = TensorTrain(cores)
    with pytest.raises(ValueError, match=r"vdot: site 3: physical leg \(p\) 2 .* but 3 in the "
                                         r"other"):
        x.vdot(y)
    with pytest.raises(ValueError, match=r"vdot: site 3: physical leg \(p\) 3 .* but 2 in the "
                                         r"other"):
        y.vdot(x)


def test_vdot_of_mpos_with_transposed_legs_is_refused_not_silently_reshaped():
    a = problems.random_mpo(4, 2, 2, seed=0).to_numpy()
    b = list(a)
    b[2] = np.ones((a[2].shape[0], a[2].shape[1], 2, 3))
    b[3] = np.ones((a[3].shape[0], 3, 2))
    with pytest.raises(ValueError, match=re.escape(
            "vdot: site 2: physical legs (u, d) (2, 3) in this train")):
        TensorTrain(b).vdot(a)  # (2, 3) and (3, 2) would both flatten to 6 for einsum


def test_vdot_of_different_bonds_works_and_of_different_kinds_or_lengths_is_clear():
    x = problems.random_mps(5, 2, 2, seed=1)
    y = problems.random_mps(5, 4, 2, seed=2)  # other bonds: fine
    want = np.vdot(x.to_dense(), y.to_dense())
    assert abs(x.vdot(y) - want) <= 1e-12
    with pytest.raises(ValueError, match="vdot: this train .* is an MPS but the other is an MPO"):
        x.vdot(problems.random_mpo(5, 2, 2, seed=0))
    with pytest.raises(ValueError, match="has 5 sites but the other has 4"):
        x.vdot(problems.random_mps(4, 2, 2, seed=0))


def test_vdot_with_a_core_unlike_its_declared_shape_names_the_site():
    x = problems.random_mps(4, 2, 2, seed=1)
    cores = x.to_numpy()
    liar = da.from_delayed(dask.delayed(np.ones)((2, 2, 3)), shape=(2, 2, 2), dtype=float)
    with pytest.raises(ValueError, match=r"vdot: site 2: cannot contract"):
        x.vdot([*cores[:2], liar, cores[3]])


def test_vdot_accepts_what_as_train_accepts_and_refuses_the_rest():
    x = problems.random_mps(4, 3, 2, seed=1)
    y = problems.random_mps(4, 2, 2, seed=2)
    want = x.vdot(y)
    assert x.vdot(list(y)) == want
    assert x.vdot(y.to_numpy()) == pytest.approx(want, rel=1e-14)
    assert x.vdot(tuple(y.to_numpy())) == pytest.approx(want, rel=1e-14)
    for bad in (3.0, "train", np.ones((2, 2)), {"a": 1}, None):
        with pytest.raises(TypeError, match="vdot: other: expected a train"):
            x.vdot(bad)


def test_vdot_accepts_a_quimb_train():
    qtn = pytest.importorskip("quimb.tensor")
    x = problems.random_mps(4, 3, 2, seed=1)
    y = problems.random_mps(4, 2, 2, seed=2)
    q = qtn.MatrixProductState(y.to_numpy(), shape="lrp")
    assert x.vdot(q) == pytest.approx(x.vdot(y), rel=1e-12)


# -- 3. the progress bar is advisory -------------------------------------------------
class _Failing(io.StringIO):
    """A text stream whose ``after + 1``-th write (and every later one) raises ``error``."""

    def __init__(self, error: Exception, after: int = 0) -> None:
        super().__init__()
        self.error, self.after, self.writes = error, after, 0

    def write(self, text: str) -> int:
        self.writes += 1
        if self.writes > self.after:
            raise self.error
        return super().write(text)


def _closed() -> io.StringIO:
    s = io.StringIO()
    s.close()
    return s


_STREAMS = {
    "disk full at once": lambda: _Failing(OSError(errno.ENOSPC, "disk full")),
    "disk full midway": lambda: _Failing(OSError(errno.ENOSPC, "disk full"), after=1),
    "closed file": _closed,
    "anything midway": lambda: _Failing(RuntimeError("boom"), after=1),
}
_SAYS = {"disk full at once": "disk full", "disk full midway": "disk full",
         "closed file": "I/O operation on closed file", "anything midway": "boom"}


def _problem():
    return problems.random_mpo(6, 2, 2, seed=0), problems.random_mps(6, 4, 2, seed=1)


def _one_progress_warning(caplog, says: str) -> None:
    warnings = [r for r in caplog.records if r.name == "src_dask"
                and r.levelno >= logging.WARNING]
    assert len(warnings) == 1, [r.getMessage() for r in warnings]
    text = warnings[0].getMessage()
    assert text.startswith("progress: cannot write to the progress stream (")
    assert says in text and text.endswith("; continuing without it")


@pytest.mark.parametrize("which", list(_STREAMS))
def test_a_broken_progress_stream_on_threads_costs_only_the_bar(which, caplog):
    a, x = _problem()
    stream = _STREAMS[which]()
    with caplog.at_level(logging.WARNING, logger="src_dask"):
        y = src_dask.apply(a, x, 4, seed=3, progress=stream, oversample=1)
    _one_progress_warning(caplog, _SAYS[which])
    if isinstance(stream, _Failing):
        assert stream.writes == stream.after + 1  # dropped at the first failure
        if stream.after:
            assert stream.getvalue().startswith("src_dask pass 1 of 3")
    assert _same(y, src_dask.apply(a, x, 4, seed=3, oversample=1))


@pytest.fixture(scope="module")
def inprocess_client():
    from distributed import Client, LocalCluster

    with LocalCluster(n_workers=1, threads_per_worker=2, processes=False,
                      dashboard_address=":0") as cluster, \
            Client(cluster, set_as_default=False) as client:
        yield client


@pytest.mark.parametrize("which", list(_STREAMS))
def test_a_broken_progress_stream_on_a_cluster_costs_only_the_bar(which, caplog,
                                                                  inprocess_client):
    a, x = _problem()
    stream = _STREAMS[which]()
    with caplog.at_level(logging.WARNING, logger="src_dask"):
        y = src_dask.apply(a, x, 4, seed=3, progress=stream, client=inprocess_client)
    _one_progress_warning(caplog, _SAYS[which])
    if isinstance(stream, _Failing):
        assert stream.writes == stream.after + 1
    # a cluster against Dask's threads: equal to roundoff (summation orders may differ)
    assert close_cores(y, src_dask.apply(a, x, 4, seed=3))


def test_a_failed_run_keeps_its_own_error_when_the_stream_breaks(caplog):
    a, x = _problem()
    cores = [da.from_array(c) for c in x.to_numpy()]
    cores[3] = cores[3] * np.nan
    with caplog.at_level(logging.WARNING, logger="src_dask"), \
            pytest.raises(ValueError, match="NaN"):
        src_dask.apply(a, cores, 4, seed=0,
                       progress=_Failing(OSError(errno.ENOSPC, "disk full"), after=1))


# -- 4. NumPy integers are ints ------------------------------------------------------
_NP_INTS = (np.int64, np.int32)


@pytest.mark.parametrize("as_int", _NP_INTS)
def test_numpy_ints_in_problems_give_the_same_trains(as_int):
    for make in (problems.random_mps, problems.random_mpo, problems.stack_mpo):
        want = make(5, 3, 2, seed=7)
        got = make(as_int(5), as_int(3), as_int(2), seed=as_int(7))
        assert got.bond_dims == want.bond_dims and _same(got, want)
    want = problems.stack(4, 5, phys=2, bond=3, seed=1)
    got = problems.stack(as_int(4), as_int(5), phys=as_int(2), bond=as_int(3), seed=as_int(1))
    assert all(_same(got[k], want[k]) for k in want)
    for make in (problems.heisenberg, problems.ising):
        assert _same(make(as_int(4), as_int(1)), make(4, 1))
    assert _same(problems.heisenberg(4, (as_int(1), 1, as_int(2))),
                 problems.heisenberg(4, (1, 1, 2)))


@pytest.mark.parametrize("as_int", _NP_INTS)
def test_numpy_ints_in_src_and_trains_give_the_same_result(as_int):
    a, x = _problem()
    want = src_dask.apply(a, x, 3, oversample=1, seed=5, chunk=2)
    got = src_dask.apply(a, x, as_int(3), oversample=as_int(1), seed=as_int(5), chunk=as_int(2))
    assert _same(got, want)
    assert _same(src_dask.compress(x, as_int(2), seed=as_int(1)), src_dask.compress(x, 2, seed=1))
    assert x[as_int(2)] is x[2] and x.source(as_int(1)) is x.source(1)


def test_numpy_int_seed_with_a_store(tmp_path):
    x = problems.random_mps(4, 3, 2, seed=1)
    want = src_dask.compress(x, 2, seed=3, store=tmp_path / "a")
    got = src_dask.compress(x, 2, seed=np.int64(3), store=tmp_path / "b")
    assert _same(got, want)
