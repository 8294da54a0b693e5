"""The HPC path under a real Slurm (``make test-slurm``; CI runs it): two nodes on
this machine (``tests/slurm/cluster.sh``: Debian's slurmctld and two slurmd),
``examples/slurm/src_dask.sbatch`` submitted with ``sbatch`` and CPU workers, its
failures that must end the job at once, and dask-jobqueue's ``SLURMCluster``.

Jobs are followed with ``squeue``/``scontrol`` (``sbatch --wait`` notices the end
slowly and returned 0 for a cancelled job)."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from helpers import random_mpo, random_mps

import src_dask

pytestmark = pytest.mark.slurm
ROOT = Path(__file__).resolve().parents[1]
SBATCH = ROOT / "examples" / "slurm" / "src_dask.sbatch"


@pytest.fixture(scope="module")
def slurm(tmp_path_factory):
    """``SLURM_CONF`` of a running two-node Slurm: the one in the environment, or one
    started here (and stopped after the module's tests)."""
    given = os.environ.get("SLURM_CONF")
    if given and shutil.which("sinfo") and subprocess.run(
            ["sinfo", "-h"], capture_output=True).returncode == 0:
        yield given
        return
    if not shutil.which("sbatch") and os.geteuid() != 0:
        pytest.skip("no Slurm here and not root to install it (tests/slurm/cluster.sh)")
    where = tmp_path_factory.mktemp("slurm")
    script = ROOT / "tests" / "slurm" / "cluster.sh"
    subprocess.run(["bash", str(script), "start", str(where)], check=True, timeout=600)
    os.environ["SLURM_CONF"] = str(where / "slurm.conf")
    try:
        yield os.environ["SLURM_CONF"]
    finally:
        subprocess.run(["bash", str(script), "stop", str(where)], timeout=60)
        os.environ.pop("SLURM_CONF", None)


def _submit(args: list[str], env: dict[str, str], out: Path) -> str:
    """Submit the example script; its job id."""
    full = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}",
            "DRIVER": str(ROOT / "examples" / "slurm" / "driver.py"), **env}
    done = subprocess.run(["sbatch", "--parsable", "--cpus-per-task=1", "--time=00:05:00",
                           "-o", str(out), str(SBATCH), *args],
                          env=full, cwd=out.parent, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip().split(";")[0]


def _wait(job: str, timeout: float) -> tuple[str, float]:
    """The job's final state and how long it took to leave the queue from now."""
    start = time.monotonic()
    while time.monotonic() - start < timeout:
        queued = subprocess.run(["squeue", "-h", "-j", job], capture_output=True, text=True)
        if job not in queued.stdout:
            break
        time.sleep(1)
    else:
        subprocess.run(["scancel", job])
        pytest.fail(f"job {job} still queued or running after {timeout} s")
    shown = subprocess.run(["scontrol", "show", "job", job], capture_output=True,
                           text=True).stdout
    state = shown.split("JobState=", 1)[1].split()[0] if "JobState=" in shown else "?"
    took = time.monotonic() - start
    print(f"Slurm job {job}: JobState={state} after {took:.0f} s")  # noqa: T201 - make test-slurm shows it
    return state, took


def _job(tmp_path: Path, inputs: Path, env: dict[str, str], timeout: float
         ) -> tuple[str, str, float]:
    """The example submitted on ``inputs`` (its store in ``tmp_path``): the job's final
    state, its output and how long it took."""
    job = _submit([str(inputs), str(tmp_path / "run.zarr")], env, tmp_path / "job.out")
    state, took = _wait(job, timeout)
    return state, (tmp_path / "job.out").read_text(), took


def _inputs(where: Path) -> tuple[Path, list]:
    """An MPO and an MPS of physical dimension 3 saved as the example reads them."""
    trains = [random_mpo(6, 3, phys=3, seed=1), random_mps(6, 5, phys=3, seed=2)]
    for i, t in enumerate(trains):
        src_dask.save(t, where / "in" / str(i))
    return where / "in", trains


@pytest.mark.timeout(300)
def test_the_sbatch_example_runs_on_two_cpu_nodes(slurm, tmp_path):
    """``sbatch src_dask.sbatch IN STORE`` on two CPU nodes (no --gpus-per-node): a
    scheduler, one ``dask worker`` per node, the driver; the stored result is the
    product an in-process run computes."""
    inputs, trains = _inputs(tmp_path)
    state, log, _ = _job(tmp_path, inputs, {"THREADS": "1", "DRIVER_ARGS": "--chi-out 12",
                                             "START_TIMEOUT": "120"}, 240)
    assert state == "COMPLETED", log[-3000:]
    assert "2 workers" in log  # one per node
    assert not list(tmp_path.glob("scheduler-*.json"))  # the job's own file, gone with it
    # the finished run store gives its result back without work (same inputs, options)
    opened = [src_dask.open(inputs / str(i)) for i in range(len(trains))]
    y = src_dask.src(*opened, chi_out=12, oversample=0, seed=0, store=tmp_path / "run.zarr")
    ref = src_dask.src(*trains, chi_out=12, oversample=0, seed=0)
    for p, q in zip(y.to_numpy(), ref.to_numpy(), strict=True):
        assert p.shape == q.shape
        assert np.abs(p - q).max() <= 1e-12 * np.abs(q).max()


@pytest.mark.timeout(300)
def test_a_scheduler_that_cannot_start_ends_the_job_at_once(slurm, tmp_path):
    """The scheduler's port is taken: the job fails within seconds, saying so, rather
    than waiting for a scheduler file until its time limit."""
    inputs, _ = _inputs(tmp_path)
    with socket.socket() as taken:
        taken.bind(("0.0.0.0", 0))
        taken.listen()
        port = taken.getsockname()[1]
        state, log, took = _job(tmp_path, inputs,
                                {"SCHEDULER_PORT": str(port), "START_TIMEOUT": "200"}, 120)
    assert state == "FAILED", log[-3000:]
    assert "the scheduler exited before it wrote" in log
    assert took < 100  # not START_TIMEOUT (200 s)
    assert not (tmp_path / "run.zarr" / "result").exists()


@pytest.mark.timeout(300)
def test_gpu_workers_without_gpus_or_dask_cuda_are_refused_at_once(slurm, tmp_path):
    """WORKER='dask cuda worker' where the job has no GPUs (or dask-cuda is missing):
    the job fails before it starts anything, naming what to change."""
    inputs, _ = _inputs(tmp_path)
    state, log, _ = _job(tmp_path, inputs, {"WORKER": "dask cuda worker"}, 120)
    assert state == "FAILED", log[-3000:]
    assert "WORKER='dask cuda worker'" in log
    assert "--gpus-per-node" in log
    assert "distributed.scheduler" not in log  # refused before the scheduler started


@pytest.mark.timeout(300)
def test_workers_that_do_not_come_end_the_job_naming_how_many_did(slurm, tmp_path):
    """The driver waits for more workers than the job starts: it gives up after
    START_TIMEOUT, saying how many joined, and the job fails."""
    inputs, _ = _inputs(tmp_path)
    state, log, _ = _job(tmp_path, inputs,
                         {"THREADS": "1", "WORKERS": "5", "START_TIMEOUT": "20"}, 180)
    assert state == "FAILED", log[-3000:]
    assert "2 of 5 workers joined within 20 s" in log


@pytest.mark.timeout(300)
def test_dask_jobqueue_slurm_cluster_runs_src(slurm, tmp_path):
    """dask-jobqueue's SLURMCluster (the ``hpc`` extra): two worker jobs on the Slurm,
    ``src`` through its Client gives the in-process cores to roundoff."""
    from dask_jobqueue import SLURMCluster
    from distributed import Client

    sys.path.insert(0, str(ROOT / "examples" / "slurm"))
    from jobqueue import cluster_options  # the example's jobs

    trains = (random_mpo(6, 3, phys=3, seed=1), random_mps(6, 5, phys=3, seed=2))
    ref = src_dask.src(*trains, chi_out=12, seed=0)
    opts = cluster_options(False, "127.0.0.1", cores=1, memory="1GB", walltime="00:05:00",
                           python=sys.executable, log_directory=str(tmp_path / "logs"))
    with SLURMCluster(**opts) as cluster, Client(cluster) as client:
        cluster.scale(jobs=2)
        client.wait_for_workers(2, timeout=120)
        y = src_dask.src(*trains, chi_out=12, seed=0, client=client)
    for p, q in zip(y.to_numpy(), ref.to_numpy(), strict=True):
        assert np.abs(p - q).max() <= 1e-12 * np.abs(q).max()


@pytest.mark.timeout(300)
def test_dask_jobqueue_slurm_runner_inside_an_allocation(slurm, tmp_path):
    """``srun python examples/slurm/runner.py`` in a job of two nodes x two tasks
    (dask-jobqueue's SLURMRunner: rank 0 the scheduler, rank 1 the client, the rest
    workers): the job completes on its two workers and the store holds the in-process
    result."""
    inputs, trains = _inputs(tmp_path)
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    runner = ROOT / "examples" / "slurm" / "runner.py"
    done = subprocess.run(
        ["sbatch", "--parsable", "-N2", "--ntasks-per-node=2", "--cpus-per-task=1",
         "--time=00:05:00", "-o", str(tmp_path / "job.out"), "--wrap",
         f"srun python {runner} --inputs {inputs} --store {tmp_path / 'run.zarr'} "
         "--chi-out 12 --timeout 120"],
        env=env, cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    state, _ = _wait(done.stdout.strip().split(";")[0], 240)
    log = (tmp_path / "job.out").read_text()
    assert state == "COMPLETED", log[-3000:]
    assert "on 2 workers" in log
    opened = [src_dask.open(inputs / str(i)) for i in range(len(trains))]
    y = src_dask.src(*opened, chi_out=12, oversample=0, seed=0, store=tmp_path / "run.zarr")
    ref = src_dask.src(*trains, chi_out=12, oversample=0, seed=0)
    for p, q in zip(y.to_numpy(), ref.to_numpy(), strict=True):
        assert np.abs(p - q).max() <= 1e-12 * np.abs(q).max()
