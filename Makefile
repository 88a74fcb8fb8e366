# Set-up, tests, demo and benchmarks. Everything runs inside .venv, which `make install` creates.
PYTHON ?= python3
VENV   ?= .venv
PY      = $(VENV)/bin/python
GSPMDC  = $(VENV)/bin/gspmdc

.PHONY: install test demo bench conformance clean

install: $(VENV)/.installed

$(VENV)/.installed: setup.cfg pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip "setuptools>=68" wheel
	$(PY) -m pip install --quiet -e '.[test]'
	touch $@

test: install
	$(PY) -m pytest

demo: install
	$(GSPMDC) parse gspmdc/examples/mlp.hlo
	$(GSPMDC) eval gspmdc/examples/mlp.hlo --seed 0

bench: install
	$(PY) bench/run.py

conformance: install
	$(PY) -m gspmdc.conformance parse
	$(PY) -m gspmdc.conformance propagate

clean:
	rm -rf $(VENV) build dist *.egg-info .pytest_cache .hypothesis
