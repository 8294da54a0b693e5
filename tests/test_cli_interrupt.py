"""Ctrl-C on 'src-dask run --workers N --store S': one line, exit 130, a store the same
command resumes. The signal goes to the whole process group, as a terminal sends it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

import src_dask
from src_dask._cli import main


@pytest.mark.slow  # seconds of wall time: `make test-slow` (CI runs it too)
def test_ctrl_c_prints_one_line_exits_130_and_the_rerun_resumes(tmp_path):
    a, x, store, out = (str(tmp_path / n) for n in ("A.zarr", "x.zarr", "run.zarr", "y.zarr"))
    # big enough that the run is still going a while after its store appears (~3 s of work
    # on 2 cores)
    assert main(["generate", "mpo", a, "--sites", "30", "--bond", "4", "--seed", "1"]) == 0
    assert main(["generate", "mps", x, "--sites", "30", "--bond", "64", "--seed", "2"]) == 0
    command = [sys.executable, "-m", "src_dask", "run", a, x, "--chi-out", "64", "--seed", "0",
               "--workers", "2", "--store", store, "--out", out]
    # a shell's background job starts with SIGINT ignored, and so would the command:
    # give it the disposition of a command typed at a terminal
    ignored = signal.getsignal(signal.SIGINT) == signal.SIG_IGN
    if ignored:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True, start_new_session=True)
    finally:
        if ignored:
            signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        deadline = time.monotonic() + 60
        # the run is under way: a block of pass 1 is in the store (work a rerun skips)
        while not getattr(src_dask.storage.run_progress(store), "begun", False):
            assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
            time.sleep(0.02)
        assert proc.poll() is None, "the run ended before the interrupt: make it bigger"
        os.killpg(proc.pid, signal.SIGINT)  # what Ctrl-C in a terminal does
        stdout, stderr = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
    lines = stderr.splitlines()
    # the dashboard's address is printed when the cluster starts; after it, one line
    (said,) = [ln for ln in lines if not ln.startswith("src-dask: dashboard: http://127.0.0.1:")]
    # where it stopped, and how to go on
    assert said.startswith("src-dask: interrupted in pass ") and said.endswith(
        f"; {store} keeps it: rerun the same command to resume"), stderr
    assert proc.returncode == 130, stderr
    assert stdout == "" and not os.path.exists(out)
    rerun = subprocess.run(command, capture_output=True, text=True, timeout=120, check=False)
    assert rerun.returncode == 0, rerun.stderr
    assert "wrote mps" in rerun.stdout
    assert f"resumed the run in {store} from pass " in rerun.stdout  # the work done kept
    assert max(src_dask.open(out).bond_dims) == 64
