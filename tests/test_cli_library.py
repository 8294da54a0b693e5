"""The library functions the command line calls: a run store's progress
(storage.run_progress), problems by spec (problems.spec, problems.write), and the client a
command computes on (src_dask.connect)."""

from __future__ import annotations

import json

import numpy as np
import pytest

import src_dask
from src_dask import _runstore, connect, problems, storage
from src_dask.errors import PathRefusedError


# -- storage.run_progress ---------------------------------------------------------------
@pytest.fixture
def trains():
    return [problems.random_mpo(6, 3, seed=1), problems.random_mps(6, 8, seed=2)]


def test_run_progress_of_an_interrupted_and_of_a_finished_store(trains, tmp_path, monkeypatch):
    store = tmp_path / "run.zarr"
    write = _runstore.RunStore.write_pass2

    def fail_at_site_3(self, site, *rest):
        if site == 3:
            raise RuntimeError("worker lost")
        return write(self, site, *rest)

    monkeypatch.setattr(_runstore.RunStore, "write_pass2", fail_at_site_3)
    with pytest.raises(RuntimeError, match="worker lost"):
        src_dask.src(*trains, chi_out=5, seed=1, chunk=3, store=store)
    progress = storage.run_progress(store)
    assert progress == storage.RunProgress(str(store), complete=False, begun=True,
                                           where="pass 2, at site 3")
    assert progress.resumed() == f"resumed the run in {store} from pass 2, at site 3"
    assert progress.stopped() == (f"in pass 2, at site 3; {store} keeps it: rerun the same "
                                  "command to resume")
    monkeypatch.setattr(_runstore.RunStore, "write_pass2", write)
    src_dask.src(*trains, chi_out=5, seed=1, chunk=3, store=store)
    done = storage.run_progress(store)
    assert done.complete and done.resumed() == \
        f"{store} held this run, finished: its result, not recomputed"


def test_run_progress_says_nothing_of_what_is_not_a_run_store(trains, tmp_path):
    assert storage.run_progress(None) is None
    assert storage.run_progress(tmp_path / "missing") is None
    (tmp_path / "empty").mkdir()
    assert storage.run_progress(tmp_path / "empty") is None
    src_dask.save(trains[0], tmp_path / "A")
    assert storage.run_progress(tmp_path / "A") is None  # a train
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "zarr.json").write_text("{not json")
    assert storage.run_progress(tmp_path / "bad") is None
    fresh = storage.RunProgress("s", complete=False, begun=False,
                                where="pass 1, 0 of 2 blocks of sketch columns done")
    assert fresh.resumed() is None  # nothing done: a fresh start, nothing to say


# -- problems.spec and problems.write ---------------------------------------------------
def test_spec_fills_defaults_and_refuses_what_does_not_apply():
    assert problems.spec("mpo", sites=5) == {"kind": "mpo", "sites": 5, "bond": 4, "phys": 2,
                                             "dtype": "complex128", "seed": 0}
    with pytest.raises(ValueError, match="--dm does not apply to 'mps'"):
        problems.spec("mps", dm=3)
    with pytest.raises(ValueError, match="--sites: a train needs at least 2 sites, got 1"):
        problems.spec("ising", sites=1)
    with pytest.raises(ValueError, match="kind: expected one of"):
        problems.spec("cube")


def test_write_saves_a_train_or_a_stack_with_its_spec(tmp_path):
    spec = problems.spec("mps", sites=5, bond=3, seed=4)
    trains = problems.write(spec, tmp_path / "x")
    assert list(trains) == [""]
    saved = src_dask.open(tmp_path / "x")
    for a, b in zip(saved.to_numpy(), problems.random_mps(5, 3, seed=4).to_numpy(), strict=True):
        np.testing.assert_array_equal(a, b)
    assert storage.describe(tmp_path / "x")["generated"] == spec
    stack = problems.write(problems.spec("stack", sites=3, dm=5), tmp_path / "s")
    assert list(stack) == ["N", "V", "M", "U"]
    assert list(src_dask.open_stack(tmp_path / "s")) == ["N", "V", "M", "U"]


def test_write_refuses_before_drawing(tmp_path):
    problems.write(problems.spec("ising", sites=3), tmp_path / "h")
    with pytest.raises(FileExistsError):
        problems.write(problems.spec("ising", sites=4), tmp_path / "h")
    assert len(src_dask.open(tmp_path / "h")) == 3
    (tmp_path / "keep").mkdir()
    (tmp_path / "keep" / "notes.txt").write_text("mine")
    with pytest.raises(PathRefusedError):
        problems.write(problems.spec("ising", sites=3), tmp_path / "keep", overwrite=True)
    with pytest.raises(OSError, match="needs"):  # an absurd size, refused from the shapes
        problems.write(problems.spec("mps", bond=400000), tmp_path / "big")
    assert not (tmp_path / "big").exists()


# -- connect ----------------------------------------------------------------------------
def test_security_of_three_files(tmp_path):
    files = [tmp_path / n for n in ("ca.pem", "cert.pem", "key.pem")]
    for f in files:
        f.write_text("-")
    sec = connect.security(*map(str, files))
    assert sec.require_encryption and sec.tls_client_cert == str(files[1])
    assert sec.tls_scheduler_key == sec.tls_worker_key == sec.tls_client_key == str(files[2])
    files[2].unlink()
    with pytest.raises(FileNotFoundError, match=f"--key {files[2]}: no such file"):
        connect.security(*map(str, files), names=("--ca", "--cert", "--key"))


def test_scheduler_tls_address_and_client_check_the_file_first(tmp_path):
    tls, tcp = tmp_path / "tls.json", tmp_path / "tcp.json"
    tls.write_text(json.dumps({"address": "tls://127.0.0.1:1"}))
    tcp.write_text(json.dumps({"address": "tcp://127.0.0.1:1"}))
    assert connect.scheduler_tls_address(tls) == "tls://127.0.0.1:1"  # no certificate
    assert connect.scheduler_tls_address(tcp) is None
    (tmp_path / "c.pem").write_text("-")
    with_cert = connect.security(*[str(tmp_path / "c.pem")] * 3)
    assert connect.scheduler_tls_address(tls, with_cert) is None
    (tmp_path / "junk.json").write_text("[1, 2")
    assert connect.scheduler_tls_address(tmp_path / "junk.json") is None  # Client's to say
    with pytest.raises(FileNotFoundError, match="no such scheduler file"):
        connect.scheduler_client(tmp_path / "none.json")
    with pytest.raises(ValueError, match="takes TLS connections only"):
        connect.scheduler_client(tls)


def test_client_is_none_without_a_cluster_and_a_local_one_with_options(trains):
    trains = [src_dask.TensorTrain(t.to_numpy(), t.kind) for t in trains]  # in memory
    with connect.client() as client:
        assert client is None
    with connect.client(gpus=0, n_workers=1, processes=False) as client:
        assert client.dashboard_link.startswith("http://127.0.0.1:")
        assert not client.dashboard_link.startswith("http://127.0.0.1:8787")  # a free port
        y = src_dask.src(*trains, chi_out=4, seed=0, client=client).to_dense()
    ref = src_dask.src(*trains, chi_out=4, seed=0)
    np.testing.assert_allclose(y, ref.to_dense(), atol=1e-12)
    assert client.status == "closed"


def test_client_options_of_the_where_to_run_flags(tmp_path):
    """``connect.client_options``: the keywords of ``connect.client`` for each way to run,
    and the flags that do not go together refused in the command line's words."""
    assert connect.client_options() == {"scheduler_file": None, "security": None}
    assert connect.client_options("s.json") == {"scheduler_file": "s.json", "security": None}
    assert connect.client_options(workers=2, host="localhost") == {
        "security": None, "host": "localhost", "memory_limit": "auto", "local_directory": None,
        "gpus": 0, "n_workers": 2, "threads_per_worker": 1}
    assert connect.client_options(gpus=2, protocol="tcp", memory_limit="1GB") == {
        "security": None, "memory_limit": "1GB", "local_directory": None, "gpus": 2,
        "protocol": "tcp"}
    for kwargs, message in [
        ({"threads": 2}, "--threads: sets up the local cluster"),
        ({"gpus": 1, "threads": 2}, "--threads: is for --workers N"),
        ({"workers": 1, "tls": ("a", None, None)}, "missing --tls-cert, --tls-key"),
        ({"tls": ("a", "b", "c")}, "TLS is for a cluster"),
        ({"workers": 1, "protocol": "ucx"}, "--protocol: chooses how the GPUs"),
        ({"workers": 1, "gpus": 1}, "one at most"),
    ]:
        with pytest.raises(ValueError, match=message):
            connect.client_options(**kwargs)
    with pytest.raises(FileNotFoundError, match="--tls-ca-file"):
        connect.client_options(workers=1, tls=[str(tmp_path / n) for n in ("a", "b", "c")])


def test_describe_says_where_a_client_runs(cluster_client, tmp_path):
    import json

    # written by hand: the shared client may have written its one scheduler file already
    (tmp_path / "s.json").write_text(json.dumps({"address": cluster_client.scheduler.address}))
    with connect.client(tmp_path / "s.json") as client:
        line = connect.describe(client)
    assert line.startswith("connected to tcp://") and "(2 workers); dashboard: http" in line
    with connect.client(gpus=0, n_workers=1, processes=False) as client:
        assert connect.describe(client) == f"dashboard: {client.dashboard_link}"


def test_log_to_shows_the_log_for_the_block_only():
    import io
    import logging

    from src_dask import diagnostics

    logger = logging.getLogger("src_dask")
    handlers, level, stream = list(logger.handlers), logger.level, io.StringIO()
    with diagnostics.log_to(stream, "100% src: "):
        logging.getLogger("src_dask.x").info("said")
        assert logger.level == logging.INFO
    logging.getLogger("src_dask.x").info("not said")
    assert stream.getvalue() == "100% src: said\n"
    assert logger.handlers == handlers and logger.level == level
