"""Dask's dashboard during a src_dask run, as a user opens it: headless Chromium
(Debian's ``chromium``) loads each page while the run is held in progress, and no
page may be answered or driven with a server error."""

from __future__ import annotations

import asyncio
import importlib.util
import logging
import os
import shutil
import threading
import time
from pathlib import Path

import dask.array as da
import numpy as np
import pytest
from helpers import close_cores

import src_dask
from src_dask import problems

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
SCRIPT = Path(__file__).parents[1] / "docs" / "make_dashboard_screenshot.py"


def _browser_class():
    """``Browser`` of docs/make_dashboard_screenshot.py (the DevTools driver the
    screenshot is taken with)."""
    spec = importlib.util.spec_from_file_location("make_dashboard_screenshot", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.Browser


def _held(block: np.ndarray, gate: str) -> np.ndarray:
    """``block`` once the file ``gate`` exists: a run stays in progress until then."""
    deadline = time.monotonic() + 240
    while not os.path.exists(gate) and time.monotonic() < deadline:
        time.sleep(0.05)
    return block


async def _visit(base: str, pages: list[str]) -> dict[str, int]:
    browser = _browser_class()()
    try:
        await browser.connect()
        return {page: await browser.open(f"{base}/{page}", wait=3.0) for page in pages}
    finally:
        browser.close()


@pytest.mark.slow  # ~30 s on 2 cores: `make test-slow`
@pytest.mark.timeout(300)
@pytest.mark.skipif(CHROMIUM is None, reason="needs Debian's chromium "
                    "(apt-get install -y chromium)")
def test_the_dashboards_pages_work_during_a_run(tmp_path, caplog, many_tasks):
    """/status, /graph, /tasks, /workers and /info load with status 200 during a run of
    lazy inputs (its last input site is held until the pages have been opened), no
    error is logged by the dashboard's server meanwhile, and the run's result is the
    threaded one. (/groups answers 500 then, distributed's bug:
    test_progress.py::test_distributeds_groups_page_fails_during_a_run.)"""
    pytest.importorskip("bokeh")
    from distributed import Client, LocalCluster

    gate = str(tmp_path / "go")
    mpo, mps = problems.random_mpo(10, 4, seed=1), problems.random_mps(10, 32, seed=2)
    ref = src_dask.src(mpo, mps, chi_out=32, seed=0)
    cores = list(mps)
    cores[-1] = da.map_blocks(_held, cores[-1], gate, name="held",  # meta: not called here
                              meta=np.empty((0,) * cores[-1].ndim, cores[-1].dtype))
    mps = src_dask.TensorTrain(cores, "mps")
    caplog.set_level(logging.ERROR)
    with LocalCluster(n_workers=2, threads_per_worker=1,
                      dashboard_address="127.0.0.1:0") as cluster, Client(cluster) as client:
        result: dict = {}
        run = threading.Thread(target=lambda: result.update(
            y=src_dask.src(mpo, mps, chi_out=32, seed=0, client=client)))
        run.start()
        try:
            base = client.dashboard_link.rsplit("/", 1)[0]
            # in a thread of its own: asyncio.run here would leave the main thread
            # without an event loop, which distributed's later calls expect
            codes: dict = {}
            pages = ["status", "graph", "tasks", "workers", "info"]
            browse = threading.Thread(target=lambda: codes.update(asyncio.run(
                _visit(base, pages))))
            browse.start()
            browse.join(timeout=200)
            assert run.is_alive()  # the pages were opened during the run
        finally:
            Path(gate).touch()
            run.join(timeout=240)
    assert codes == dict.fromkeys(codes, 200), codes
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert not errors, [r.getMessage() for r in errors]
    assert close_cores(result["y"], ref)
