"""The Slurm driver, run against a local scheduler file (no Slurm needed)."""

from __future__ import annotations

import runpy
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import zarr
from helpers import random_mpo, random_mps

import src_dask

ROOT = Path(__file__).resolve().parent.parent


def test_slurm_job_script_is_valid_bash():
    subprocess.run(["bash", "-n", str(ROOT / "examples/slurm/src_dask.sbatch")], check=True)


@pytest.mark.slow  # seconds of wall time: `make test-slow` (CI runs it too)
def test_slurm_driver_runs_on_zarr_inputs(tmp_path, capsys):
    a, x = random_mpo(6, 3, seed=1), random_mps(6, 4, seed=2)
    src_dask.save(a, tmp_path / "in" / "0")
    src_dask.save(x, tmp_path / "in" / "1")
    sched = tmp_path / "scheduler.json"
    procs = [subprocess.Popen([sys.executable, "-m", "distributed.cli.dask_scheduler",
                               "--scheduler-file", str(sched), "--dashboard-address", ":0"])]
    try:
        for _ in range(200):
            if sched.exists():
                break
            time.sleep(0.05)
        procs.append(subprocess.Popen([sys.executable, "-m", "distributed.cli.dask_worker",
                                       "--scheduler-file", str(sched), "--nthreads", "1",
                                       "--local-directory", str(tmp_path / "w")]))
        driver = runpy.run_path(str(ROOT / "examples/slurm/driver.py"))
        driver["main"](["--scheduler-file", str(sched), "--inputs", str(tmp_path / "in"),
                        "--store", str(tmp_path / "run.zarr"), "--chi-out", "12"])
    finally:
        for p in reversed(procs):
            p.terminate()
            p.wait(30)
    assert "written to" in capsys.readouterr().out
    group = zarr.open_group(tmp_path / "run.zarr", mode="r")
    assert group.attrs["complete"] is True
    ref = src_dask.apply(a, x, 12, seed=0)
    for j in range(6):
        np.testing.assert_allclose(group[f"result/site_{j}"][...], ref[j], atol=1e-12)
