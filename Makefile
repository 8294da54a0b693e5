# Quick start: `make demo` runs SRC on a built-in problem, `make test` runs the suite.
# Both create the virtualenv .venv with the Python found as $(PYTHON) when it is missing.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin

.PHONY: demo test test-slow test-slurm test-mutants docs lint bench clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip

$(VENV)/.installed: pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install -q -e .
	touch $@

$(VENV)/.installed-test: pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install -q -e ".[test]"
	touch $@ $(VENV)/.installed

demo: $(VENV)/.installed
	$(BIN)/src-dask demo

# two pytest processes (pytest-xdist): the suite's tests are mostly single-threaded Python
# and Dask set-up, so two cores run it in ~0.7 of the time
test: $(VENV)/.installed-test
	$(BIN)/ruff check src tests benchmarks examples docs
	$(BIN)/python -m pytest -q -n 2

# the documentation as HTML (docs/_build/html); any Sphinx warning is an error
$(VENV)/.installed-docs: pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install -q -e ".[docs]"
	touch $@ $(VENV)/.installed

docs: $(VENV)/.installed-docs
	$(BIN)/python -m sphinx -W -q -b html docs docs/_build/html

# the tests marked slow (memory bounds of out-of-core runs): one at a time, as their
# budgets follow the memory the machine has free; CI runs them after `make test`
test-slow: $(VENV)/.installed-test
	$(BIN)/python -m pytest -q -m slow

# the HPC path under a real Slurm: two nodes on this machine (tests/slurm/cluster.sh
# installs Debian's Slurm when it is missing, as root), the sbatch example, dask-jobqueue
test-slurm: $(VENV)/.installed-test
	$(BIN)/python -m pytest -q -m slurm -rP -p no:logging

# the mutation check: deliberate defects in the core, each of which a fast test must catch
# (tests/mutants.py lists them; it grows with every defect found)
test-mutants: $(VENV)/.installed-test
	$(BIN)/python tests/mutants.py

bench: $(VENV)/.installed-test
	$(BIN)/python benchmarks/bench_cpu.py

clean:
	rm -rf $(VENV) build dist src/*.egg-info .pytest_cache .ruff_cache
