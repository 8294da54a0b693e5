"""The README's examples, the demo command and the examples keep working."""

from __future__ import annotations

import logging
import re
import runpy
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from src_dask.trains import exact_product

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def restore_logging():
    """The README configures logging (basicConfig, a handler on "src_dask"): undo it,
    so that no handler on a since-closed stream outlives the test."""
    loggers = [logging.getLogger(name) for name in ("", "src_dask", "distributed")]
    saved = [(lg, list(lg.handlers), lg.level) for lg in loggers]
    yield
    for lg, handlers, level in saved:
        lg.handlers[:] = handlers
        lg.setLevel(level)


def test_readme_python_blocks_run(tmp_path, monkeypatch, restore_logging, capsys):
    monkeypatch.chdir(tmp_path)  # the examples write files
    text = (ROOT / "README.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", text, flags=re.S)
    assert len(blocks) >= 10
    namespace: dict = {"__name__": "readme"}
    for block in blocks:
        exec(compile(block, "README.md", "exec"), namespace)  # noqa: S102
    ns = SimpleNamespace(**namespace)
    # API
    assert ns.bra.kind == "mps" and max(ns.z.bond_dims) <= 4
    # quimb in and out; reference problems. chi_out = 5·8 is the product's largest bond,
    # so both products are exact (to the rounding of the sketch's QR)
    ref = ns.H_q.apply(ns.psi_q)
    assert type(ns.Hpsi_q).__name__ == "MatrixProductState" and ns.Hpsi_q.max_bond() == 40
    assert abs((ns.Hpsi_q - ref).norm()) < 1e-6 * abs(ref.norm())
    exact = exact_product(ns.H, ns.psi).to_dense()
    assert ns.Hpsi.kind == "mps" and max(ns.Hpsi.bond_dims) == 40
    assert np.linalg.norm(ns.Hpsi.to_dense() - exact) < 1e-6 * np.linalg.norm(exact)
    # progress: on stderr, and into a file
    assert "done: 2 passes over 40 sites" in capsys.readouterr().err
    assert "done: 2 passes over 40 sites" in (tmp_path / "run.log").read_text()
    # large problems: inputs opened from Zarr; the last y comes from the finished run store
    assert all(type(c).__module__.startswith("dask") for c in ns.A_disk)
    assert (tmp_path / "run.zarr" / "result" / "site_39").is_dir()
    assert all(type(c).__module__.startswith("dask") for c in ns.y)
    assert ns.y.kind == "mps" and max(ns.y.bond_dims) <= 16


def test_demo_command(capsys, monkeypatch):
    """The demo's errors are those of the same SRC calls made here (plain, then
    oversampled: smaller), and --wait holds the cluster until Enter."""
    import src_dask
    from src_dask import problems
    from src_dask._cli import main

    waited = []
    monkeypatch.setattr("builtins.input", lambda prompt="": waited.append(prompt) or "")
    assert main(["demo", "--sites", "8", "--bond", "8", "--mpo-bond", "3", "--chi-out", "6",
                 "--workers", "1", "--seed", "2", "--wait"]) == 0
    out = capsys.readouterr().out
    assert "dashboard: http" in out and "MPO (bond 3)" in out and waited
    errors = [float(e) for e in re.findall(r"relative error ([0-9.e+-]+)", out)]
    mpo = problems.random_mpo(8, 3, seed=2, decay=0.5)
    mps = problems.random_mps(8, 8, seed=3, decay=0.9)
    exact = exact_product(mpo, mps)
    want = []
    for oversample in (0, "auto"):
        y = src_dask.apply(mpo, mps, 6, oversample=oversample, seed=2)
        want.append(float(np.linalg.norm((y.to_dense() - exact.to_dense()).ravel())
                          / np.linalg.norm(exact.to_dense().ravel())))
    assert errors == pytest.approx(want, rel=1e-3) and errors[1] < errors[0], (errors, want)


def test_module_entry_point_help():
    res = subprocess.run([sys.executable, "-m", "src_dask", "--help"], capture_output=True,
                         text=True, check=False)
    assert res.returncode == 0 and "demo" in res.stdout


@pytest.mark.parametrize("script", ["quickstart.py"])
def test_examples_run(script, capsys, monkeypatch):
    pytest.importorskip("quimb")
    monkeypatch.setattr(sys, "argv", [script])
    runpy.run_path(str(ROOT / "examples" / script), run_name="__main__")
    out = capsys.readouterr().out
    error = float(re.search(r"relative error against the exact product: (\S+)", out)[1])
    infidelity = float(re.search(r"1 - fidelity .*: (\S+)", out)[1])
    assert error < 1e-6 and abs(infidelity) < 1e-12  # chi_out is the product's exact bond


@pytest.mark.parametrize("script", ["quickstart.py", "ising_evolution.py", "out_of_core.py"])
def test_example_help_runs_nothing(script):
    res = subprocess.run([sys.executable, str(ROOT / "examples" / script), "--help"],
                         capture_output=True, text=True, timeout=60, check=False)
    assert res.returncode == 0 and res.stdout.startswith("usage:"), res.stderr
    assert "relative error" not in res.stdout
