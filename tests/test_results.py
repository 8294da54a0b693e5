"""Results a quimb user can work with: the exact error of a result, train arithmetic,
expectation values, the seed used, quimb's names kept, and calls that do not mislead."""

from __future__ import annotations

import numpy as np
import pytest
from helpers import dense_product, random_mpo, random_mps

import src_dask
from src_dask import TensorTrain

pytestmark = pytest.mark.timeout(120)


def _stacks():
    a = random_mpo(6, 3, 3, seed=1)
    b = random_mpo(6, [2, 3, 1, 2, 2], 3, seed=3)
    x = random_mps(6, [2, 5, 4, 6, 3], 3, seed=2)
    return {"ket": (a, x), "depth 3": (a, b, x), "bra": (x, a), "mpo·mpo": (a, b),
            "one train": (x,)}


@pytest.mark.parametrize("name", list(_stacks()))
@pytest.mark.parametrize("chi", [2, 4])
def test_distance_is_the_exact_relative_error(name, chi):
    trains = _stacks()[name]
    y = src_dask.src(*trains, chi_out=chi, seed=1)
    p = dense_product(*trains)
    exact = np.linalg.norm(y.to_dense() - p) / np.linalg.norm(p)
    assert exact > 1e-3  # compressed: a real error to find
    assert src_dask.distance(y, *trains) == pytest.approx(exact, rel=1e-8)


def test_distance_of_an_exact_result_is_at_the_floor_and_checks_its_inputs():
    a, x = random_mpo(5, 2, seed=1), random_mps(5, 3, seed=2)
    y = src_dask.apply(a, x, chi_out=6, seed=0)
    assert src_dask.distance(y, a, x) < 1e-6
    with pytest.raises(ValueError, match="y has 4 sites but the product has 5"):
        src_dask.distance(random_mps(4, 2, seed=1), a, x)
    with pytest.raises(ValueError, match="site 0: y's physical legs"):
        src_dask.distance(random_mps(5, 2, 3, seed=1), a, x)


def test_distance_on_a_cluster_and_on_a_store(tmp_path):
    from distributed import Client, LocalCluster

    a, x = random_mpo(6, 3, seed=1), random_mps(6, 4, seed=2)
    import io

    with LocalCluster(n_workers=1, threads_per_worker=2, processes=False,
                      dashboard_address=None) as cluster, Client(cluster) as client:
        y = src_dask.apply(a, x, chi_out=5, seed=0, client=client, store=tmp_path / "run")
        stream = io.StringIO()
        d = src_dask.distance(y, a, x, client=client, progress=stream)
    p = dense_product(a, x)
    assert d == pytest.approx(np.linalg.norm(y.to_dense() - p) / np.linalg.norm(p), rel=1e-8)
    assert stream.getvalue().count("overlaps)") == 3
    local = io.StringIO()
    assert src_dask.distance(y, a, x, progress=local) == pytest.approx(d, rel=1e-10)
    assert "100%" in local.getvalue()


def test_distance_of_trains_in_memory_is_not_warned_about_as_a_large_graph():
    """The cores travel inside the graph by design (three overlaps use each): Dask's
    large-graph warning (10 MB) is not raised for them."""
    import warnings

    from distributed import Client, LocalCluster

    x = random_mps(8, 256, seed=3)  # 12.6 MB of cores (pickled once each): over 10 MB
    with LocalCluster(n_workers=1, threads_per_worker=1, processes=False,
                      dashboard_address=None) as cluster, Client(cluster) as client, \
            warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)
        assert src_dask.distance(x, x, client=client) < 1e-6


def test_train_arithmetic_makes_new_trains():
    x = random_mps(6, [2, 5, 4, 6, 3], 3, seed=2)
    before = [c.copy() for c in x]
    dense = x.to_dense()
    for got, want in ((x * 2, 2 * dense), (2j * x, 2j * dense), (x / 4, dense / 4),
                      (-x, -dense), (x * np.float32(3), 3 * dense)):
        assert isinstance(got, TensorTrain)
        np.testing.assert_allclose(got.to_dense(), want, rtol=1e-12)
    assert all(np.array_equal(c, b) for c, b in zip(x, before, strict=True))  # untouched
    y = x.normalize()
    assert y.norm() == pytest.approx(1.0) and x.norm() != pytest.approx(1.0)
    c = x.copy()
    c[0][...] = 0  # a copy's cores are its own
    assert np.array_equal(x[0], before[0])
    assert x.max_bond == 6
    with pytest.raises(TypeError):
        x * x
    with pytest.raises(ZeroDivisionError):
        x / 0


def test_lazy_trains_scale_lazily():
    x = src_dask.problems.random_mps(6, 4, seed=1)  # Dask cores
    y = x * 3
    assert hasattr(y[0], "dask")
    np.testing.assert_allclose(y.to_dense(), 3 * x.to_dense(), rtol=1e-12)


def test_expectation_and_vdot_agree_with_quimb():
    qtn = pytest.importorskip("quimb.tensor")
    psi = qtn.MPS_rand_state(7, 4, seed=1)
    h = qtn.MPO_ham_heis(7)
    want = qtn.expec_TN_1D(psi.H, h, psi) / (psi.H @ psi)
    t = TensorTrain(psi)  # a quimb object, as src takes it
    assert t.expectation(h) == pytest.approx(want, rel=1e-12)
    assert (3 * t).expectation(TensorTrain(h)) == pytest.approx(want, rel=1e-12)
    assert t.vdot(psi) == pytest.approx(psi.H @ psi, rel=1e-12)
    assert TensorTrain(t).norm() == pytest.approx(t.norm())
    with pytest.raises(ValueError, match="needs an MPS and an MPO"):
        TensorTrain(h).expectation(h)


def test_results_keep_quimb_names_and_say_their_seed(caplog):
    import logging

    qtn = pytest.importorskip("quimb.tensor")
    psi = qtn.MPS_rand_state(6, 3, seed=1, site_ind_id="s{}", site_tag_id="S{}")
    h = qtn.MPO_ham_heis(6, upper_ind_id="s{}", lower_ind_id="t{}", site_tag_id="S{}")
    with caplog.at_level(logging.INFO, logger="src_dask"):
        y = src_dask.apply(h, psi, chi_out=8)
    assert isinstance(y.seed, int) and y.seed >= 0
    assert any(r.getMessage() == f"src: seed {y.seed}" for r in caplog.records)
    again = src_dask.apply(h, psi, chi_out=8, seed=y.seed)
    assert all(np.array_equal(a, b) for a, b in zip(y, again, strict=True))
    q = y.to_quimb()
    assert (q.site_ind_id, q.site_tag_id) == ("s{}", "S{}")
    op = src_dask.src(h, h, chi_out=8, seed=0).to_quimb()
    assert (op.upper_ind_id, op.lower_ind_id) == ("s{}", "t{}")


def test_reprs_are_short_and_jupyter_gets_html():
    x = random_mps(40, 8, 2, seed=1)
    text = repr(x)
    assert len(text) < 120 and "40 sites" in text and "max bond 8" in text
    html = x._repr_html_()
    assert html.count("bond ") >= 39 and "complex128" in html


def test_apply_takes_the_operator_first():
    a, x = random_mpo(5, 2, seed=1), random_mps(5, 3, seed=2)
    with pytest.raises(ValueError, match=r"src_dask.src\(mps, mpo"):
        src_dask.apply(x, a, chi_out=4)
    with pytest.raises(TypeError, match="chi_out is quimb's max_bond"):
        src_dask.apply(a, x, max_bond=4)
    with pytest.raises(TypeError, match="missing chi_out"):
        src_dask.apply(a, x)


def test_a_closed_client_is_named():
    from distributed import Client, LocalCluster

    a, x = random_mpo(5, 2, seed=1), random_mps(5, 3, seed=2)
    with LocalCluster(n_workers=1, processes=False, dashboard_address=None) as cluster:
        client = Client(cluster, set_as_default=False)
        client.close()
        with pytest.raises(ValueError, match="the client is closed"):
            src_dask.apply(a, x, chi_out=4, client=client)


def test_discarded_weight_per_bond_is_the_truncated_spectrum(tmp_path, caplog):
    """With oversampling the rounding SVDs know what each bond drops: here the sketch
    spans the exact product, so the weight is the exact singular-value tail."""
    import logging

    a, x = random_mpo(6, 3, seed=1), random_mps(6, 4, seed=2)
    with caplog.at_level(logging.INFO, logger="src_dask"):
        y = src_dask.apply(a, x, chi_out=4, oversample=8, seed=0)
    assert len(y.discarded) == 5 and all(w >= 0 for w in y.discarded)
    p = dense_product(a, x)
    for bond in range(5):
        s = np.linalg.svd(p.reshape(2 ** (bond + 1), -1), compute_uv=False)
        assert y.discarded[bond] == pytest.approx((s[4:] ** 2).sum() / (s ** 2).sum(),
                                                  rel=1e-6, abs=1e-14)
    assert any("rounding discarded at most" in r.getMessage() for r in caplog.records)
    stored = src_dask.apply(a, x, chi_out=4, oversample=8, seed=0, store=tmp_path / "run")
    again = src_dask.apply(a, x, chi_out=4, oversample=8, seed=0, store=tmp_path / "run")
    assert stored.discarded == pytest.approx(y.discarded) == again.discarded
    assert src_dask.apply(a, x, chi_out=4, seed=0).discarded is None  # no rounding: unknown


def test_distance_pays_for_the_products_norm_once(tmp_path):
    """⟨P|P⟩ is computed once per product and reused: a second result compared with
    the same factors costs two overlaps, not three, and gives the same exact error;
    other factors, or cores whose content cannot be told (a Dask array of no saved
    train), cost three every time."""
    import dask
    import dask.array as da
    from dask.callbacks import Callback

    a, x = random_mpo(6, 3, seed=1), random_mps(6, 4, seed=2)
    y1 = src_dask.apply(a, x, chi_out=3, seed=0)
    y2 = src_dask.apply(a, x, chi_out=4, seed=0)
    p = dense_product(a, x)

    def counted(y, *trains):  # the distance, and how many overlaps it computed
        steps = []
        with dask.config.set(scheduler="sync"), \
                Callback(pretask=lambda key, dsk, state: steps.append(str(key))):
            d = src_dask.distance(y, *trains)
        return d, len({k.rsplit("-", 1)[-1] for k in steps if k.startswith("overlap")})

    d1, chains1 = counted(y1, a, x)
    d2, chains2 = counted(y2, a, x)
    assert (chains1, chains2) == (3, 2)
    for y, d in ((y1, d1), (y2, d2)):
        assert d == pytest.approx(np.linalg.norm(y.to_dense() - p) / np.linalg.norm(p),
                                  rel=1e-8)
    assert counted(y1, random_mpo(6, 3, seed=5), x)[1] == 3
    src_dask.save(a, tmp_path / "a")
    opened = src_dask.open(tmp_path / "a")
    assert [counted(y1, opened, x)[1] for _ in range(2)] == [3, 2]  # a saved train: by its save
    lazy = src_dask.TensorTrain([da.from_array(c) for c in a], "mpo")
    assert [counted(y1, lazy, x)[1] for _ in range(2)] == [3, 3]
    assert counted(y1, lazy, x)[0] == pytest.approx(d1, rel=1e-10)


def test_a_result_is_made_with_its_run_info(tmp_path):
    """A result carries what its run says in one :class:`~src_dask.trains.RunInfo`,
    given when it is made (in memory or read from a run store), read as ``seed`` and
    ``discarded``; arithmetic keeps it, a train made from the cores alone has none."""
    from src_dask.trains import RunInfo

    a, x = random_mpo(6, 3, seed=1), random_mps(6, 4, seed=2)
    y = src_dask.apply(a, x, chi_out=4, oversample=2, seed=5)
    assert y.run_info == RunInfo(seed=5, discarded=tuple(y.discarded))
    assert y.seed == 5 and isinstance(y.discarded, list) and len(y.discarded) == 5
    assert (2 * y).run_info == y.run_info and (2 * y).discarded == y.discarded
    plain = src_dask.apply(a, x, chi_out=4, seed=5)
    assert plain.seed == 5 and plain.discarded is None
    stored = src_dask.apply(a, x, chi_out=4, oversample=2, seed=5, store=tmp_path / "run")
    assert stored.run_info == y.run_info
    assert TensorTrain(list(y)).run_info is None and TensorTrain(list(y)).seed is None
