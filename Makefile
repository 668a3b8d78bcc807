# Two commands for a newcomer: `make demo` and `make test`. Each sets itself up.
# The test tiers (docs/testing.md): `make check` is the developer's loop (lint, types, every test
# that needs neither Azurite, Spark, a browser nor the Functions worker, each simulation break at
# its known seed); `make test` is CI's (everything a change can break, on 3.13 and 3.10, with a
# simulation slice that follows the commit); `make test-all` adds the long searches.
# The Functions app runs on Python 3.13 (Microsoft's worker, azure-functions-runtime, needs it);
# the bus package's own tests also run on 3.10, the oldest Python it supports.
find_python = $(or $(shell PYENV_VERSION=$(1) pyenv which python$(2) 2>/dev/null),$(shell command -v python$(2)))
PYTHON ?= $(call find_python,3.13.0,3.13)
PYTHON310 ?= $(call find_python,3.10.13,3.10)
VENV := .venv
BIN := $(VENV)/bin
PY := $(BIN)/python
SIM_RUNS ?= 300
# Test processes: pytest-xdist, one per core (each Azurite-using process starts its own Azurite);
# worksteal: an idle process takes tests queued for a busy one (the simulation's long runs).
JOBS ?= auto
PYTEST_PARALLEL = -n $(JOBS) --dist worksteal
# What `make check` leaves out: the tests marked by tests/conftest.py as needing Azurite, Spark,
# a browser or Microsoft's Functions worker, the simulation slice that follows the commit and the
# simulation runs that drive the whole public surface (sim_long).
CHECK_MARKERS = not (azurite or spark or browser or worker or sim_slice or sim_long)
# The commit's simulation slice in `make test` (tests/sim/seeds.py): its size.
SIM_SLICE ?= 150

.PHONY: help setup lint check test test-all test-py310 sim demo devhost azurite clean lock infra-check spark-demo bench \
	chromium dashboard screenshots dist

# Playwright (requirements-dev.txt) drives Debian's Chromium: it never downloads a browser.
export PLAYWRIGHT_SKIP_BROWSER_DOWNLOAD := 1

help:
	@echo "make check  - the developer's loop (under 2 min): lint, types, the tests needing no"
	@echo "              Azurite/Spark/browser/Functions worker, each simulation break at its seed"
	@echo "make test   - CI: set up (venvs, pinned deps, Azurite, Chromium for the browser tests) and run every test on"
	@echo "              3.13 and 3.10, with a simulation slice that follows the commit"
	@echo "make test-all - make test, then 2,000 simulation runs, every break searched, quick bench"
	@echo "make azurite - Azurite on the default ports, as the project starts it (Ctrl-C stops)"
	@echo "make demo   - the main job: 1,000 orders through the Functions app on Azurite, checked"
	@echo "make sim    - the deterministic simulation: SIM_RUNS=2000 make sim"
	@echo "make spark-demo - Spark producer -> Functions app -> Spark consumer on Azurite, checked"
	@echo "make bench  - benchmarks vs the raw transport and kombu -> bench/results/ (QUICK=1: about 3 min)"
	@echo "make infra-check - offline checks of infra/ (topology in sync, checkov, Bicep structure)"
	@echo "make dashboard - the operations dashboard on Azurite with the sample app and some traffic"
	@echo "make dist   - the package's wheel in dist/ (pip install it, then python -m bus init)"

$(BIN)/.installed: requirements.txt requirements-dev.txt
	@test -n "$(PYTHON)" || { echo "Python 3.13 is needed (pyenv install 3.13.0, or PYTHON=/path/to/python3.13)"; exit 1; }
	$(PYTHON) -m venv --clear $(VENV)
	$(BIN)/pip install --quiet --disable-pip-version-check -r requirements-dev.txt
	touch $@

node_modules/.installed: package.json package-lock.json
	SCARF_ANALYTICS=false npm ci --no-audit --no-fund --loglevel=error
	touch $@

# Debian's Chromium, for the dashboard's browser tests (tests/operations/browser) and its
# screenshots - nothing else uses a browser (`make demo` and `make dashboard` do not): nothing to do when a `chromium` is on PATH; otherwise apt-get installs it (as root, or through
# sudo), with the DejaVu fonts the pages are drawn in. CHROMIUM_PATH=/path/to/chromium points
# the tests at another build of it.
chromium:
ifdef CHROMIUM_PATH
	@test -x "$(CHROMIUM_PATH)" || { echo "CHROMIUM_PATH=$(CHROMIUM_PATH) is not an executable"; exit 1; }
else
	@command -v chromium >/dev/null 2>&1 || { \
	  command -v apt-get >/dev/null 2>&1 || { echo "Chromium is needed for the browser tests \
	and make screenshots, and there is no apt-get here to install it: install Debian's chromium \
	package, or set CHROMIUM_PATH=/path/to/chromium"; exit 1; }; \
	  sudo=; [ "$$(id -u)" = 0 ] || sudo=sudo; \
	  echo "Installing Debian's chromium: apt-get install chromium fonts-dejavu-core"; \
	  { $$sudo apt-get update -qq && $$sudo env DEBIAN_FRONTEND=noninteractive apt-get install \
	    -y -qq --no-install-recommends chromium fonts-dejavu-core >/dev/null; } || { \
	  echo "apt-get could not install chromium: install Debian's chromium package as root, \
	or set CHROMIUM_PATH=/path/to/chromium"; exit 1; }; \
	  command -v chromium >/dev/null 2>&1 || { echo "apt-get installed chromium but it is \
	not on PATH"; exit 1; }; }
endif

setup: $(BIN)/.installed node_modules/.installed

lint: $(BIN)/.installed
	$(BIN)/ruff check bus tests devhost bench spark function_app.py
	$(BIN)/mypy

check: $(BIN)/.installed lint
	BUS_TEST_TIER=check $(PY) -m pytest $(PYTEST_PARALLEL) -q -m "$(CHECK_MARKERS)" \
	  --durations=10

test: setup chromium lint test-py310
	$(PY) -m pytest $(PYTEST_PARALLEL) --sim-slice $(SIM_SLICE) --durations=25

# Not in CI (about an hour here): the long simulation, each break's first failing seed searched
# among 1,500 (every one must fail; most within 300, tests/sim/test_simulation.py names the others), and the quick benchmark.
test-all: test
	$(PY) -m bus.testing.simulate --runs 2000 --seed 1 --progress
	$(PY) -m bus.testing.simulate --every-break --runs 1500 --progress
	$(PY) -m bench --quick

# The package on Python 3.10 with the oldest versions pyproject.toml allows
# (requirements-py310.txt): the in-memory tests of the protocol, its hosts and operations, the
# simulation at its known seeds, then on Azurite the storage adapter's contract (the Azure
# SDKs' lower bounds), the docs' examples and the Spark tests on PySpark 3.5
# (bus.spark.publish/receive; format("bus") needs Spark 4 and is skipped). Java 17 for Spark.
# Not here: the Functions app and the dashboard (the app runs on 3.13 only).
PY310_PURE = tests/unit tests/protocol tests/hosting tests/observability tests/operations tests/sim
PY310_OUT = --ignore=tests/hosting/functions --ignore=tests/operations/dashboard \
	--ignore=tests/operations/browser --ignore=tests/operations/infra
VENV310 := .venv-3.10
$(VENV310)/.installed: requirements-py310.txt requirements.txt pyproject.toml
	@test -n "$(PYTHON310)" || { echo "Python 3.10 is needed (pyenv install 3.10.13, or PYTHON310=...)"; exit 1; }
	$(PYTHON310) -m venv --clear $(VENV310)
	$(VENV310)/bin/pip install --quiet --disable-pip-version-check -r requirements-py310.txt
	touch $@

test-py310: $(VENV310)/.installed node_modules/.installed
	$(VENV310)/bin/python -m pytest $(PYTEST_PARALLEL) -q $(PY310_PURE) $(PY310_OUT) \
	  -m "$(CHECK_MARKERS)"
	$(VENV310)/bin/python -m pytest $(PYTEST_PARALLEL) -q tests/contract tests/docs \
	  tests/integrations/spark

sim: $(BIN)/.installed
	$(PY) -m bus.testing.simulate --runs $(SIM_RUNS) --seed 1 --progress

# The main job: 1,000 orders through function_app.py on the local host and Azurite, checked.
# DEMO_TRACES=dir: the client's and the app's spans and metrics to dir (OTLP JSON lines);
# `python -m devhost.trace_picture dir` draws one order's trace.
DEMO_ORDERS ?= 1000
DEMO_TRACES ?=
demo: setup
	$(PY) -m devhost.demo --orders $(DEMO_ORDERS) $(if $(DEMO_TRACES),--traces $(DEMO_TRACES))

# Benchmarks: each scenario on a fresh Azurite; the last line printed is JSON.
# Full: about 13 minutes, writes bench/results/latest.md; QUICK=1: about 3, bench/results/quick.md.
QUICK ?=
bench: setup
	$(PY) -m bench $(if $(filter 1 yes true,$(QUICK)),--quick)

# Spark jobs through the same app: PlaceOrder rows in, OrderBilled streamed to Parquet, checked
# (docs/spark.md). The last line printed is a JSON summary; non-zero exit on loss or duplicates.
SPARK_ORDERS ?= 200
spark-demo: setup
	$(PY) -m spark.demo --orders $(SPARK_ORDERS)

# The operations dashboard (docs/dashboard.md) on a fresh Azurite: function_app.py provisioned,
# some orders through it (a few poisoned, one scheduled), the local host running the app, and
# `python -m bus dashboard --app function_app --allow-actions` on localhost until Ctrl-C.
DASHBOARD_PORT ?= 8080
dashboard: setup
	$(PY) -m devhost.dashboard --port $(DASHBOARD_PORT)

# The dashboard's screenshots in docs/img (docs/dashboard.md), taken by its browser tests.
screenshots: setup chromium
	DASHBOARD_SCREENSHOTS=docs/img $(PY) -m pytest tests/operations/browser -q

# Run the function app locally (Azurite must be running; settings from local.settings.json).
devhost: setup
	$(PY) -m devhost

# Azurite on the default ports (UseDevelopmentStorage=true reaches it), data in .azurite/,
# with the flag the pinned SDKs need (--skipApiVersionCheck). Ctrl-C stops it.
azurite: node_modules/.installed
	$(or $(PYTHON),python3) -m devhost.azurite

# Offline checks of infra/: topology.json in sync with the app, checkov over the Bicep (in its
# own venv, so its pins cannot clash with the app's), the Bicep's structure (tests/operations/infra).
# The last line printed is a JSON summary; non-zero exit when any check fails.
INFRA_VENV := .venv-infra
$(INFRA_VENV)/.installed: requirements-infra.txt
	$(PYTHON) -m venv $(INFRA_VENV)
	$(INFRA_VENV)/bin/pip install --quiet --disable-pip-version-check -r requirements-infra.txt
	touch $@

infra-check: $(BIN)/.installed $(INFRA_VENV)/.installed
	$(PY) -m bus.operations.infra_check --checkov $(INFRA_VENV)/bin/checkov

# The package, as an app installs it: a wheel in dist/ (README, "Your own app"). Its extras:
# functions, spark, dashboard, testing (pyproject.toml).
dist: $(BIN)/.installed
	rm -rf dist
	$(BIN)/pip wheel . --no-deps --quiet --disable-pip-version-check -w dist
	@ls dist/*.whl

# Regenerate the pins of requirements*.txt from a clean venv (needs the registry).
lock:
	rm -rf /tmp/bus-lock && $(PYTHON) -m venv /tmp/bus-lock
	/tmp/bus-lock/bin/pip install --quiet -r requirements-dev.txt
	/tmp/bus-lock/bin/pip freeze

clean:
	rm -rf $(VENV) $(VENV310) $(INFRA_VENV) node_modules .mypy_cache .ruff_cache .pytest_cache .test-durations.json
