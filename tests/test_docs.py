"""The README's examples, the demo command and the examples keep working."""

from __future__ import annotations

import re
import runpy
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from src_dask.trains import exact_product

ROOT = Path(__file__).resolve().parent.parent


def _python_blocks() -> list:
    """Every ``python`` code block of the README and the documentation pages."""
    out = []
    for path in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        blocks = re.findall(r"```python\n(.*?)```", path.read_text(), flags=re.S)
        out += [pytest.param(block, id=f"{path.relative_to(ROOT)}:{i + 1}")
                for i, block in enumerate(blocks)]
    return out


@pytest.mark.timeout(300)
@pytest.mark.parametrize("block", _python_blocks())
def test_every_python_block_of_the_docs_runs_on_its_own(block, tmp_path):
    """Each example is a complete program (imports, data, the main guard where it starts
    a cluster): run as a script of its own in an empty directory, it succeeds. A block
    whose first line is ``# needs: gpu`` runs where a GPU is."""
    from src_dask._cluster import has_gpu

    if block.startswith("# needs: gpu") and not has_gpu():
        pytest.skip("needs a GPU")
    script = tmp_path / "example.py"
    script.write_text(block)
    done = subprocess.run([sys.executable, str(script)], cwd=tmp_path, capture_output=True,
                          text=True, timeout=280, check=False)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]


def test_the_docs_have_their_examples():
    """The pages keep their examples (a page rewritten without them would pass the test
    above by having none)."""
    assert len(_python_blocks()) >= 15


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
