# The two commands a newcomer runs on a fresh machine: `make test` and (with the notebooks) `make figures`.
# Both create .venv, install torch 2.13.0 first (a CPU build; an unpinned torch pulls a CUDA build), then sinklib.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python

.PHONY: setup test benchmark

setup: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -e ".[notebooks,test]"
	touch $@

test: setup
	$(PY) -m pytest

benchmark: setup
	$(PY) benchmarks/capture_overhead.py
	$(PY) benchmarks/generate_overhead.py
