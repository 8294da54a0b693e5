"""The src-dask command line: generate, run, info; exit codes and one-line errors."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import dask
import numpy as np
import pytest
import zarr
from dask.utils import format_bytes

import src_dask
from src_dask import _runstore, problems
from src_dask._cli import CLIError, main

SMALL = ["--sites", "8"]


def error_line(capsys) -> str:
    """The one line the command wrote to stderr."""
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("src-dask: error: ")
    return lines[0]


def siblings(path) -> list[str]:
    """Entries next to ``path`` whose name mentions it (temporaries included)."""
    return sorted(p for p in os.listdir(path.parent) if path.name in p)


@pytest.fixture
def problem(tmp_path):
    """A small MPO·MPS saved by the command line."""
    a, x = tmp_path / "A.zarr", tmp_path / "x.zarr"
    assert main(["generate", "mpo", str(a), *SMALL, "--bond", "3", "--seed", "1"]) == 0
    assert main(["generate", "mps", str(x), *SMALL, "--bond", "12", "--seed", "2"]) == 0
    return a, x


# -- generate ------------------------------------------------------------------------------
def test_generate_writes_what_problems_make(tmp_path, capsys):
    path = tmp_path / "x.zarr"
    assert main(["generate", "mps", str(path), "--sites", "6", "--bond", "5", "--phys", "3",
                 "--seed", "4", "--dtype", "complex64"]) == 0
    assert "wrote mps" in capsys.readouterr().out
    saved = src_dask.open(path)
    ref = problems.random_mps(6, 5, 3, dtype="complex64", seed=4)
    assert saved.bond_dims == ref.bond_dims and saved.dtype == np.complex64
    for a, b in zip(saved.to_numpy(), ref.to_numpy(), strict=True):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("kind, options, bonds", [
    ("heisenberg", ["--jz", "0.5", "--field", "0.1"], 5),
    ("ising", ["--field", "0.5", "--dtype", "complex128"], 3),
])
def test_generate_hamiltonians(tmp_path, kind, options, bonds):
    path = tmp_path / kind
    assert main(["generate", kind, str(path), "--sites", "5", *options]) == 0
    h = src_dask.open(path)
    assert h.bond_dims == [bonds] * 4
    ref = (problems.heisenberg(5, (1.0, 1.0, 0.5), 0.1) if kind == "heisenberg"
           else problems.ising(5, 1.0, 0.5))
    np.testing.assert_allclose(h.to_dense(), ref.to_dense(), atol=1e-14)


def test_generate_stack_and_info(tmp_path, capsys):
    path = tmp_path / "stack"
    assert main(["generate", "stack", str(path), "--sites", "4", "--dm", "6"]) == 0
    assert sorted(os.listdir(path)) == ["M", "N", "U", "V", "zarr.json"]
    assert src_dask.open(path / "M").bond_dims == [6, 6, 6]
    # the line on what was written: storage.describe(...).summary(), the factors' bytes
    total = sum(src_dask.open(path / name).nbytes for name in "NVMU")
    line = capsys.readouterr().out
    assert line.startswith(f"wrote stack N·V·M·U to {path}: 4 sites, complex128, "
                           f"{format_bytes(total)} in ")
    assert main(["info", str(path)]) == 0
    out = capsys.readouterr().out
    assert "stack N·V·M·U" in out and out.count("phys dims   4×4 at every site") == 4


def test_generate_refuses_to_overwrite(tmp_path, capsys):
    path = tmp_path / "A"
    assert main(["generate", "mpo", str(path), "--sites", "4"]) == 0
    assert main(["generate", "mpo", str(path), "--sites", "4"]) == 1
    assert "already exists; pass --overwrite" in error_line(capsys)
    assert main(["generate", "mpo", str(path), "--sites", "5", "--overwrite"]) == 0
    assert len(src_dask.open(path)) == 5
    assert siblings(path) == ["A"]
    other = tmp_path / "notes"
    other.mkdir()
    (other / "keep.txt").write_text("mine")
    assert main(["generate", "mpo", str(other), "--overwrite"]) == 1
    assert "not a src_dask train" in error_line(capsys)
    assert (other / "keep.txt").read_text() == "mine"


# -- run --------------------------------------------------------------------------------------
def test_generate_run_info_round_trip(problem, tmp_path, capsys):
    a, x = problem
    out = tmp_path / "y.zarr"
    assert main(["run", str(a), str(x), "--chi-out", "6", "--seed", "5", "--out", str(out),
                 "--oversample", "auto", "--cutoff", "1e-14"]) == 0
    assert "wrote mps" in capsys.readouterr().out
    y = src_dask.open(out)
    ref = src_dask.src(src_dask.open(a), src_dask.open(x), chi_out=6, seed=5,
                       oversample="auto", cutoff=1e-14)
    assert y.bond_dims == ref.bond_dims
    for c, r in zip(y.to_numpy(), ref.to_numpy(), strict=True):
        np.testing.assert_allclose(c, r, rtol=0, atol=1e-12 * np.abs(r).max())
    assert main(["info", str(out)]) == 0
    text = capsys.readouterr().out
    assert "kind        MPS" in text and "sites       8" in text and "complex128" in text
    assert "seed=5" in text  # how it was made
    assert main(["info", "--json", str(out)]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["bond_dims"] == ref.bond_dims and data["bytes"] == ref.nbytes
    assert data["made_by"]["chi_out"] == 6 and data["made_by"]["oversample"] == "auto"


def test_run_with_dtype_and_chunk_matches_api(problem, tmp_path):
    a, x = problem
    out = tmp_path / "y"
    assert main(["run", str(a), str(x), "--chi-out", "5", "--seed", "1", "--chunk", "2",
                 "--dtype", "complex64", "--out", str(out)]) == 0
    y = src_dask.open(out)
    ref = src_dask.src(src_dask.open(a), src_dask.open(x), chi_out=5, seed=1,
                       dtype="complex64")
    assert y.dtype == np.complex64
    np.testing.assert_allclose(y.to_dense(), ref.to_dense(), atol=1e-5)


def test_run_refuses_to_write_over_an_output(problem, tmp_path, capsys):
    a, x = problem
    out = tmp_path / "y"
    args = ["run", str(a), str(x), "--seed", "1", "--out", str(out)]
    assert main([*args, "--chi-out", "4"]) == 0
    before = src_dask.open(out).to_dense()
    assert main([*args, "--chi-out", "6"]) == 1
    assert "already exists; pass --overwrite" in error_line(capsys)
    np.testing.assert_array_equal(src_dask.open(out).to_dense(), before)
    assert main([*args, "--chi-out", "6", "--overwrite"]) == 0
    assert max(src_dask.open(out).bond_dims) == 6
    assert siblings(out) == ["y"]


def test_a_failed_run_leaves_no_output(problem, tmp_path, monkeypatch, capsys):
    """A failure while writing the result, or an interrupt during the run, leaves
    nothing at --out: no complete-looking train, no temporaries."""
    from src_dask import storage

    a, x = problem
    out = tmp_path / "y"
    write = storage._write

    def write_then_fail(*args, **kw):
        write(*args, **kw)  # the whole train written, then the failure
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(storage, "_write", write_then_fail)
    args = ["run", str(a), str(x), "--chi-out", "4", "--out", str(out)]
    assert main(args) == 1
    assert "No space left on device" in error_line(capsys)
    assert siblings(out) == []

    def interrupted(*trains, **options):
        raise KeyboardInterrupt

    monkeypatch.setattr(storage, "_write", write)
    monkeypatch.setattr(src_dask, "src", interrupted)
    assert main(args) == 130
    assert capsys.readouterr().err.strip() == "src-dask: interrupted"
    assert siblings(out) == []
    with pytest.raises(KeyboardInterrupt):
        main([*args, "--debug"])


def test_interrupted_store_run_shows_progress_and_resumes(problem, tmp_path, monkeypatch,
                                                          capsys):
    a, x = problem
    out, store = tmp_path / "y", tmp_path / "run.zarr"
    args = ["run", str(a), str(x), "--chi-out", "6", "--seed", "3", "--chunk", "3",
            "--out", str(out), "--store", str(store)]
    write = _runstore.RunStore.write_pass2

    def fail_at_site_4(self, site, *rest):
        if site == 4:
            raise RuntimeError("worker lost")
        return write(self, site, *rest)

    monkeypatch.setattr(_runstore.RunStore, "write_pass2", fail_at_site_4)
    assert main(args) == 1
    assert "worker lost" in error_line(capsys)
    assert siblings(out) == []

    assert main(["info", str(store)]) == 0
    text = capsys.readouterr().out
    assert "run store" in text and "not complete" in text
    assert "2 of 2 blocks of sketch columns done" in text
    assert "next site 4 (3 of 7 sites done)" in text
    assert "chi_out=6" in text and "seed=3" in text
    assert main(["info", "--json", str(store)]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["complete"] is False and data["pass2_next_site"] == 4
    assert [i["kind"] for i in data["inputs"]] == ["mpo", "mps"] and data["bytes_planned"] > 0

    monkeypatch.setattr(_runstore.RunStore, "write_pass2", write)
    assert main(args) == 0  # resumes
    ref = src_dask.src(src_dask.open(a), src_dask.open(x), chi_out=6, seed=3)
    np.testing.assert_allclose(src_dask.open(out).to_dense(), ref.to_dense(), rtol=0,
                               atol=1e-12 * np.abs(ref.to_dense()).max())
    capsys.readouterr()
    assert main(["info", str(store)]) == 0
    text = capsys.readouterr().out
    assert "status      complete" in text and "pass 2      done" in text
    assert "result      MPS" in text


def test_store_of_another_run_needs_overwrite_store(problem, tmp_path, capsys):
    a, x = problem
    store = tmp_path / "run.zarr"
    base = ["run", str(a), str(x), "--seed", "1", "--store", str(store)]
    assert main([*base, "--chi-out", "4", "--out", str(tmp_path / "y4")]) == 0
    assert main([*base, "--chi-out", "5", "--out", str(tmp_path / "y5")]) == 1
    line = error_line(capsys)
    assert "other inputs or options" in line and "--overwrite-store" in line
    assert main([*base, "--chi-out", "5", "--out", str(tmp_path / "y5"),
                 "--overwrite-store"]) == 0
    assert max(src_dask.open(tmp_path / "y5").bond_dims) == 5
    # --overwrite-store replaces run stores only
    other = tmp_path / "data"
    other.mkdir()
    (other / "keep.txt").write_text("mine")
    assert main(["run", str(a), str(x), "--chi-out", "4", "--store", str(other),
                 "--overwrite-store", "--out", str(tmp_path / "y6")]) == 1
    assert "is not a src_dask run store" in error_line(capsys)
    assert (other / "keep.txt").read_text() == "mine"


def test_run_takes_a_stack_as_its_factors(tmp_path):
    path = tmp_path / "stack"
    assert main(["generate", "stack", str(path), "--sites", "4", "--dm", "5", "--seed", "2"]) == 0
    assert main(["run", str(path), "--chi-out", "6", "--seed", "0",
                 "--out", str(tmp_path / "y")]) == 0
    y = src_dask.open(tmp_path / "y")
    factors = [src_dask.open(path / name) for name in "NVMU"]
    ref = src_dask.src(*factors, chi_out=6, seed=0)
    assert y.kind == "mpo"
    np.testing.assert_allclose(y.to_dense(), ref.to_dense(), rtol=0,
                               atol=1e-12 * np.abs(ref.to_dense()).max())


def test_run_on_a_local_cluster_gives_the_same_result(problem, tmp_path, capsys, monkeypatch):
    """--workers: a LocalCluster (with Dask's performance report); the result depends on
    the seed alone. The workers run in this process here (processes=False), to start fast."""
    import distributed

    local_cluster = distributed.LocalCluster
    started = []

    def in_process(**kwargs):
        started.append(kwargs)  # over TCP as in processes (in one, it would talk in-process)
        return local_cluster(processes=False, **{"protocol": "tcp", **kwargs})

    monkeypatch.setattr(distributed, "LocalCluster", in_process)
    a, x = problem
    common = ["run", str(a), str(x), "--chi-out", "6", "--seed", "9"]
    assert main([*common, "--out", str(tmp_path / "local")]) == 0
    report = tmp_path / "report.html"
    assert main([*common, "--workers", "1", "--report", str(report),
                 "--out", str(tmp_path / "cluster")]) == 0
    assert "dashboard: http" in capsys.readouterr().err
    assert report.stat().st_size > 0
    assert started[0]["n_workers"] == 1 and started[0]["threads_per_worker"] == 1
    np.testing.assert_allclose(src_dask.open(tmp_path / "cluster").to_dense(),
                               src_dask.open(tmp_path / "local").to_dense(), atol=1e-12)
    # --threads and --host reach the cluster
    assert main([*common, "--workers", "1", "--threads", "2", "--host", "localhost",
                 "--out", str(tmp_path / "threads")]) == 0
    assert started[1]["threads_per_worker"] == 2 and started[1]["host"] == "localhost"
    assert started[1]["dashboard_address"] == "localhost:0"


def test_run_through_a_scheduler_file(problem, tmp_path, cluster_client, capsys):
    """--scheduler-file: the way onto a cluster started elsewhere (Slurm)."""
    a, x = problem
    scheduler_file = tmp_path / "scheduler.json"
    cluster_client.write_scheduler_file(str(scheduler_file))
    assert main(["run", str(a), str(x), "--chi-out", "6", "--seed", "9",
                 "--scheduler-file", str(scheduler_file), "--out", str(tmp_path / "y")]) == 0
    assert "(2 workers)" in capsys.readouterr().err
    ref = src_dask.src(src_dask.open(a), src_dask.open(x), chi_out=6, seed=9)
    np.testing.assert_allclose(src_dask.open(tmp_path / "y").to_dense(), ref.to_dense(),
                               rtol=0, atol=1e-12 * np.abs(ref.to_dense()).max())


def test_run_progress_and_log_on_stderr(problem, tmp_path, capsys):
    a, x = problem
    assert main(["run", str(a), str(x), "--chi-out", "6", "--seed", "9", "--progress", "-v",
                 "--out", str(tmp_path / "y")]) == 0
    captured = capsys.readouterr()
    assert "wrote mps (MPO·MPS, ket)" in captured.out and "passes" not in captured.out
    assert "done: 2 passes over 8 sites" in captured.err  # the bar
    assert "src-dask: src: SRC plan: MPO·MPS" in captured.err  # the INFO log
    with pytest.raises(SystemExit) as exc:  # a usage error
        main(["run", str(a), str(x), "--chi-out", "6", "--report", "r.html",
              "--out", str(tmp_path / "z")])
    assert exc.value.code == 2
    assert "--report: Dask's performance report needs a cluster" in error_line(capsys)


def test_verbose_log_handler_is_removed_after_each_run(problem, tmp_path, capsys):
    """-v shows the log for that run only: main called in-process again and again leaves
    no handler behind (on a stream that may since be closed) and restores the level."""
    import logging

    logger = logging.getLogger("src_dask")
    handlers, level = list(logger.handlers), logger.level
    a, x = problem
    for i in range(2):
        assert main(["run", str(a), str(x), "--chi-out", "6", "--seed", "9", "-v",
                     "--out", str(tmp_path / f"y{i}")]) == 0
        assert capsys.readouterr().err.count("src-dask: src: done in") == 1  # once, not i + 1
        assert logger.handlers == handlers and logger.level == level
    # a run that fails inside src (mismatched legs) cleans up too
    b = tmp_path / "B.zarr"
    assert main(["generate", "mpo", str(b), *SMALL, "--phys", "3"]) == 0
    assert main(["run", str(b), str(x), "--chi-out", "6", "-v", "--out",
                 str(tmp_path / "z")]) == 1
    assert "they must match" in capsys.readouterr().err
    assert logger.handlers == handlers and logger.level == level
    assert main(["run", str(a), str(x), "--chi-out", "6", "--seed", "9",
                 "--out", str(tmp_path / "y2")]) == 0
    assert "src-dask: src:" not in capsys.readouterr().err  # without -v: silent


# -- errors and exit codes ------------------------------------------------------------------
def test_bad_input_is_one_line_and_exit_1(problem, tmp_path, capsys):
    a, x = problem
    out = str(tmp_path / "y")
    assert main(["run", str(a), str(tmp_path / "missing"), "--chi-out", "4", "--out", out]) == 1
    assert "missing: no such file or directory" in error_line(capsys)
    assert main(["info", str(tmp_path / "missing")]) == 1
    assert "no such file or directory" in error_line(capsys)
    assert main(["info", str(tmp_path)]) == 1
    assert "not a src_dask train, stack or run store" in error_line(capsys)
    assert main(["run", str(tmp_path), "--chi-out", "4", "--out", out]) == 1
    assert "not a src_dask train" in error_line(capsys)
    # two MPS: the API's validation, as one line
    assert main(["run", str(x), str(x), "--chi-out", "4", "--out", out]) == 1
    error_line(capsys)
    assert main(["run", str(a), str(x), "--chi-out", "4", "--out", out,
                 "--scheduler-file", str(tmp_path / "nope.json")]) == 1
    assert "no such scheduler file" in error_line(capsys)
    assert not os.path.exists(out)


@pytest.mark.parametrize("args, message", [
    (["run", "A", "--chi-out", "0", "--out", "y"], "--chi-out: expected a positive integer"),
    (["run", "A", "--out", "y"], "required: --chi-out"),
    (["run", "A", "--chi-out", "4", "--out", "y", "--oversample", "some"], "'auto'"),
    (["run", "A", "--chi-out", "4", "--out", "y", "--cutoff", "1.5"], "[0, 1)"),
    (["run", "A", "--chi-out", "4", "--out", "y", "--workers", "2", "--gpus", "1"],
     "not allowed with"),
    (["run", "A", "--chi-out", "4", "--out", "y", "--workers", "1", "--tls-cert", "c.pem"],
     "--tls-ca-file, --tls-cert and --tls-key go together (missing --tls-ca-file, --tls-key)"),
    (["run", "A", "--chi-out", "4", "--out", "y", "--tls-ca-file", "a", "--tls-cert", "b",
      "--tls-key", "c"], "TLS is for a cluster"),
    (["run", "A", "--chi-out", "4", "--out", "y", "--workers", "2", "--protocol", "ucx"],
     "--protocol: chooses how the GPUs of --gpus N talk"),
    (["run", "A", "--chi-out", "4", "--out", "y", "--gpus", "2", "--protocol", "rdma"],
     "invalid choice"),
    (["generate", "mps", "x", "--dm", "3"], "--dm does not apply to 'mps'"),
    (["generate", "cube", "x"], "invalid choice"),
    (["frobnicate"], "invalid choice"),
])
def test_usage_errors_exit_2_with_one_line(args, message, capsys):
    with pytest.raises(SystemExit) as exc:
        main(args)
    assert exc.value.code == 2
    assert message in error_line(capsys)


def test_debug_shows_the_exception(problem, tmp_path):
    a, x = problem
    with pytest.raises(CLIError, match="no such file"):
        main(["info", "--debug", str(tmp_path / "x")])
    with pytest.raises(ValueError, match="MPS"):  # from the API, unchanged
        main(["run", str(x), str(x), "--chi-out", "2", "--out", str(tmp_path / "y"),
              "--debug"])


def test_gpus_without_a_gpu_is_a_clear_error(problem, tmp_path, capsys):
    from src_dask._cluster import has_gpu

    if has_gpu():
        pytest.skip("this machine has a GPU")
    a, x = problem
    assert main(["run", str(a), str(x), "--chi-out", "4", "--gpus", "1",
                 "--out", str(tmp_path / "y")]) == 1
    assert "--gpus: no usable GPU" in error_line(capsys)


def test_protocol_reaches_the_gpu_cluster(problem, tmp_path, monkeypatch):
    """``--gpus N --protocol tcp`` starts ``src_dask.cluster(gpus=N, protocol="tcp")``
    (a CPU cluster stands in for it here)."""
    from distributed import LocalCluster

    from src_dask import _cluster

    seen = {}

    def fake_cluster(gpus, protocol=None, **options):
        seen.update(gpus=gpus, protocol=protocol, host=options["host"])
        return _cluster.start_local(LocalCluster, n_workers=1, threads_per_worker=1,
                                    **options)

    monkeypatch.setattr(src_dask, "cluster", fake_cluster)
    a, x = problem
    with dask.config.set({"src_dask.device": "cpu"}):  # the stand-in has no GPU
        assert main(["run", str(a), str(x), "--chi-out", "4", "--gpus", "2", "--protocol",
                     "tcp", "--out", str(tmp_path / "y"), "--no-progress"]) == 0
    assert seen == {"gpus": 2, "protocol": "tcp", "host": "127.0.0.1"}


def test_module_help_in_a_subprocess():
    res = subprocess.run([sys.executable, "-m", "src_dask", "--help"], capture_output=True,
                         text=True, check=False)
    assert res.returncode == 0 and res.stderr == ""
    for command in ("demo", "generate", "run", "info"):
        assert command in res.stdout
    assert "Exit status" in res.stdout


@pytest.mark.parametrize("command", ["demo", "generate", "run", "info"])
def test_subcommand_help(command, capsys):
    with pytest.raises(SystemExit) as exc:
        main([command, "--help"])
    assert exc.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith(f"usage: src-dask {command}") and "--debug" in out


def test_info_of_a_broken_train(tmp_path, capsys):
    """A train whose group says 'train' but lacks a site (written by hand and cut short)."""
    path = tmp_path / "t"
    src_dask.save(problems.ising(4), path)
    zarr.open_group(path, mode="r+").attrs["sites"] = 5
    assert main(["info", str(path)]) == 1
    assert "incomplete train" in error_line(capsys)


# -- options that would be ignored, the version, unknown options, absurd sizes --------------
def _usage_error(argv, capsys) -> str:
    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code == 2
    return error_line(capsys)


@pytest.mark.parametrize("command", ["run", "plan"])
@pytest.mark.parametrize("option", [["--threads", "2"], ["--memory-limit", "1GB"],
                                    ["--local-directory", "spill"]])
def test_local_cluster_options_need_a_local_cluster(problem, tmp_path, capsys, command,
                                                    option):
    a, x = problem
    argv = [command, str(a), str(x), "--chi-out", "4", *option]
    if command == "run":
        argv += ["--out", str(tmp_path / "y")]
    line = _usage_error(argv, capsys)
    assert option[0] in line and "--workers N or --gpus N" in line
    assert not (tmp_path / "y").exists()


def test_unknown_options_point_to_the_subcommand_help(problem, tmp_path, capsys):
    a, x = problem
    line = _usage_error(["run", str(a), str(x), "--chi-out", "4", "--out",
                         str(tmp_path / "y"), "--max-bond", "4"], capsys)
    assert "unrecognized arguments: --max-bond 4" in line and "src-dask run --help" in line


def test_version(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["--version"])
    assert exc.value.code == 0 and capsys.readouterr().out.strip() == \
        f"src-dask {src_dask.__version__}"


@pytest.mark.timeout(20)  # refused from the shapes, before anything is drawn
@pytest.mark.parametrize("argv", [["mps", "--bond", "400000"], ["stack", "--dm", "20000"],
                                  ["mpo", "--sites", "200", "--bond", "100000"]])
def test_generate_refuses_absurd_sizes_at_once(tmp_path, capsys, argv):
    kind, *options = argv
    assert main(["generate", kind, str(tmp_path / "p.zarr"), *options]) == 1
    assert "needs" in error_line(capsys) and not (tmp_path / "p.zarr").exists()


def test_generate_bytes_from_the_shapes_are_what_is_written(tmp_path):
    from src_dask.problems import spec_bytes

    for spec, trains in [
        ({"kind": "mps", "sites": 9, "bond": 7, "phys": 3, "dtype": "complex64"},
         [problems.random_mps(9, 7, 3, dtype="complex64")]),
        ({"kind": "mpo", "sites": 6, "bond": 5, "phys": 2, "dtype": "float64"},
         [problems.random_mpo(6, 5, 2, dtype="float64")]),
        ({"kind": "stack", "sites": 5, "bond": 2, "phys": 3, "dm": 6, "dtype": "complex128"},
         list(problems.stack(5, 6, phys=3, bond=2).values())),
    ]:
        assert spec_bytes(spec) == sum(t.nbytes for t in trains)


def test_an_interrupted_run_with_a_store_says_where_it_stopped(problem, tmp_path, capsys,
                                                               monkeypatch):
    """Ctrl-C during ``run --store`` (here: in pass 2, after pass 1 wrote the store)
    names the pass and site the store holds and says the same command resumes; without
    a store, one word."""
    from src_dask import _graph

    a, x = problem
    store = tmp_path / "run.zarr"
    original = _graph.tasks.pass2_step

    def interrupted(*args, site, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(_graph.tasks, "pass2_step", interrupted)
    common = ["run", str(a), str(x), "--chi-out", "6", "--seed", "1", "--out",
              str(tmp_path / "y")]
    assert main([*common, "--store", str(store)]) == 130
    err = capsys.readouterr().err.strip()
    assert err == (f"src-dask: interrupted in pass 2, at site {len(src_dask.open(a)) - 1}; "
                   f"{store} keeps it: rerun the same command to resume"), err
    assert main(common) == 130
    assert capsys.readouterr().err.strip() == "src-dask: interrupted"
    monkeypatch.setattr(_graph.tasks, "pass2_step", original)
    assert main([*common, "--store", str(store), "--overwrite"]) == 0  # the rerun resumes
    out = capsys.readouterr().out.splitlines()
    assert out[0] == (f"resumed the run in {store} from pass 2, at site "
                      f"{len(src_dask.open(a)) - 1}"), out
    assert out[1].startswith("wrote mps")
    # the same command again: the store holds the finished run
    assert main([*common, "--store", str(store), "--overwrite"]) == 0
    assert capsys.readouterr().out.splitlines()[0] == \
        f"{store} held this run, finished: its result, not recomputed"
    # a store of nothing yet, and no store: no such line
    assert main([*common, "--store", str(tmp_path / "fresh.zarr"), "--overwrite"]) == 0
    assert capsys.readouterr().out.startswith("wrote mps")


def test_the_run_line_names_the_product(problem, tmp_path, capsys):
    """The summary line says what was computed: the factors in order, bra or ket."""
    a, x = problem
    assert main(["run", str(x), str(a), "--chi-out", "6", "--seed", "1",
                 "--out", str(tmp_path / "bra")]) == 0
    assert capsys.readouterr().out.startswith(f"wrote mps (MPS·MPO, bra) to {tmp_path / 'bra'}:")
    assert main(["run", str(a), str(a), "--chi-out", "6", "--seed", "1",
                 "--out", str(tmp_path / "aa")]) == 0
    assert capsys.readouterr().out.startswith(f"wrote mpo (MPO·MPO, ket) to {tmp_path / 'aa'}:")


def test_distance_and_run_check_print_the_error_of_a_result(problem, tmp_path, capsys):
    """``run --check`` and ``distance RESULT TRAIN...`` print the relative error that
    ``src_dask.distance`` gives; factors that do not match the result are an error."""
    a, x = problem
    out = tmp_path / "y.zarr"
    assert main(["run", str(a), str(x), "--chi-out", "4", "--seed", "1", "--out", str(out),
                 "--check"]) == 0
    line = capsys.readouterr().out
    expected = src_dask.distance(src_dask.open(str(out)), src_dask.open(str(a)),
                                 src_dask.open(str(x)))
    assert 1e-3 < expected < 1  # chi_out 4 of a product of bond 36: truncated
    assert line.rstrip().endswith(f"; relative error {expected:.3e}")
    assert main(["distance", str(out), str(a), str(x)]) == 0
    assert capsys.readouterr().out.strip() == \
        f"{out} against MPO·MPS: relative error {expected:.3e}"
    assert main(["distance", str(out), str(a)]) == 1  # an MPO is not the result's kind
    assert "distance" in error_line(capsys)


def test_plan_on_a_local_cluster_opens_no_dashboard(problem, capsys):
    """``plan`` starts workers only to ask them what they have: no dashboard to watch."""
    a, x = problem
    assert main(["plan", str(a), str(x), "--chi-out", "4", "--workers", "1"]) == 0
    captured = capsys.readouterr()
    assert captured.out.startswith("SRC plan:") and "dashboard" not in captured.err


@pytest.mark.timeout(60)
def test_help_and_info_import_no_array_library(problem):
    """``--help`` imports neither NumPy nor Dask's arrays, and ``info`` not Dask's arrays
    (with pandas and xarray, which they pull in, the import is most of a second)."""
    import subprocess
    import sys

    a, _ = problem
    code = ("import sys, contextlib, io\n"
            "from src_dask._cli import main\n"
            "with contextlib.redirect_stdout(io.StringIO()):\n"
            "    try:\n"
            "        main(sys.argv[1:])\n"
            "    except SystemExit:\n"
            "        pass\n"
            "print(sorted({'numpy', 'dask.array'} & set(sys.modules)))\n")
    for argv, loaded in ((["--help"], "[]"), (["run", "--help"], "[]"),
                         (["info", str(a)], "['numpy']")):
        out = subprocess.run([sys.executable, "-c", code, *argv], capture_output=True,
                             text=True, check=True).stdout.strip()
        assert out == loaded, (argv, out)


def test_the_command_lines_lists_are_the_librarys():
    """The dtypes and problem kinds the parser offers (written out, so that ``--help``
    needs no library import) are the library's."""
    from src_dask import _cli, problems
    from src_dask.trains import SUPPORTED_DTYPES

    assert _cli.DTYPES == tuple(t.name for t in SUPPORTED_DTYPES)
    assert _cli.KINDS == tuple(problems.SPEC_DEFAULTS)
