"""The command line never writes over its inputs and reports damaged stores in one line."""

from __future__ import annotations

import os

import numpy as np
import pytest
import zarr

import src_dask
from src_dask._cli import main

pytestmark = pytest.mark.timeout(120)


def _one_error(capsys) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("src-dask: error: "), err
    return err[0]


@pytest.fixture
def saved(tmp_path):
    a, x = tmp_path / "A.zarr", tmp_path / "x.zarr"
    assert main(["generate", "mpo", str(a), "--sites", "6", "--bond", "3", "--seed", "1"]) == 0
    assert main(["generate", "mps", str(x), "--sites", "6", "--bond", "4", "--seed", "2"]) == 0
    assert main(["generate", "stack", str(tmp_path / "s.zarr"), "--sites", "4", "--dm", "3",
                 "--bond", "2", "--phys", "2"]) == 0
    return a, x, tmp_path / "s.zarr"


@pytest.mark.parametrize("where", ["input", "inside", "stack"])
def test_out_is_never_an_input_or_around_one(saved, tmp_path, capsys, where):
    a, x, stack = saved
    before = src_dask.open(x).to_dense()
    out, args = {"input": (x, [str(a), str(x)]),
                 "inside": (x / "y", [str(a), str(x)]),
                 "stack": (stack, [str(stack)])}[where]
    capsys.readouterr()
    assert main(["run", *args, "--chi-out", "4", "--seed", "0", "--out", str(out),
                 "--overwrite"]) == 1
    assert "directory of input" in _one_error(capsys)
    np.testing.assert_array_equal(src_dask.open(x).to_dense(), before)
    assert len(src_dask.open(stack / "N")) == 4


def test_store_and_out_apart(saved, tmp_path, capsys):
    a, x, _ = saved
    capsys.readouterr()
    assert main(["run", str(a), str(x), "--chi-out", "4", "--out", str(tmp_path / "run" / "y"),
                 "--store", str(tmp_path / "run")]) == 1
    assert "--store" in _one_error(capsys)
    assert not (tmp_path / "run").exists()


def test_a_store_of_another_run_names_the_cli_option(saved, tmp_path, capsys):
    a, x, _ = saved
    store = str(tmp_path / "run")
    assert main(["run", str(a), str(x), "--chi-out", "4", "--seed", "0", "--store", store,
                 "--out", str(tmp_path / "y1")]) == 0
    capsys.readouterr()
    assert main(["run", str(a), str(x), "--chi-out", "5", "--seed", "0", "--store", store,
                 "--out", str(tmp_path / "y2")]) == 1
    line = _one_error(capsys)
    assert "differs in chi_out" in line and "--overwrite-store" in line
    assert "overwrite=True" not in line


@pytest.mark.parametrize("edit", ["chunk", "sketch", "fingerprint", "zarr.json"])
def test_info_of_a_damaged_run_store_is_one_line(saved, tmp_path, capsys, edit):
    a, x, _ = saved
    store = tmp_path / "run"
    assert main(["run", str(a), str(x), "--chi-out", "4", "--seed", "0", "--store", str(store),
                 "--out", str(tmp_path / "y")]) == 0
    if edit == "zarr.json":
        (store / "zarr.json").write_text("{ not json")
    else:
        group = zarr.open_group(store, mode="r+")
        group.attrs[edit] = {"chunk": 0, "sketch": "x", "fingerprint": None}[edit]
    capsys.readouterr()
    assert main(["info", str(store)]) == 1
    line = _one_error(capsys)
    assert str(store) in line
    assert os.path.exists(store)


@pytest.mark.parametrize("path", [".", ""])
def test_out_is_never_the_working_directory(tmp_path, monkeypatch, capsys, path):
    """Not even an empty one, and not with --overwrite: it would be renamed away."""
    monkeypatch.chdir(tmp_path)
    assert main(["generate", "mps", path, "--sites", "4", "--bond", "2", "--overwrite"]) == 1
    assert "working directory" in _one_error(capsys)
    assert os.listdir(tmp_path) == [] and os.getcwd() == str(tmp_path)
