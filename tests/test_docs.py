"""The README's examples, the demo command and the examples keep working."""

from __future__ import annotations

import re
import runpy
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def test_readme_python_blocks_run(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # the examples write files
    text = (ROOT / "README.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", text, flags=re.S)
    assert len(blocks) >= 2
    namespace: dict = {"__name__": "readme"}
    for block in blocks:
        exec(compile(block, "README.md", "exec"), namespace)  # noqa: S102
    assert namespace["y"].kind == "mps" and max(namespace["y"].bond_dims) <= 16
    assert max(namespace["z"].bond_dims) <= 4
    assert namespace["bra"].kind == "mps"


def test_demo_command(capsys):
    from src_dask._cli import main

    assert main(["demo", "--sites", "8", "--bond", "8", "--chi-out", "8", "--workers", "1"]) == 0
    out = capsys.readouterr().out
    assert "dashboard: http" in out
    errors = [float(e) for e in re.findall(r"relative error ([0-9.e+-]+)", out)]
    assert len(errors) == 2 and all(0 <= e < 1 for e in errors)


def test_module_entry_point_help():
    res = subprocess.run([sys.executable, "-m", "src_dask", "--help"], capture_output=True,
                         text=True, check=False)
    assert res.returncode == 0 and "demo" in res.stdout


@pytest.mark.parametrize("script", ["quickstart.py"])
def test_examples_run(script, capsys):
    pytest.importorskip("quimb")
    runpy.run_path(str(ROOT / "examples" / script), run_name="__main__")
    assert "fidelity" in capsys.readouterr().out
