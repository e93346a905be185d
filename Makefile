# Allot: `make help` lists every target.
SHELL := /bin/bash
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
SHARED ?= ../shared
OUT ?= out

.DEFAULT_GOAL := help
.PHONY: help install core run demo up compare compare-gangs test browser lint type fmt bench bench-live chaos chaos-cluster golden schema philly clean

help: ## list the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  make %-14s %s\n", $$1, $$2}'

CORE_BUILD := $(VENV)/allot-native/manifest.json

$(STAMP): pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

install: $(STAMP) $(CORE_BUILD) ## create .venv and install allot with its dev tools (and compile the core: make core)

# The core's hot modules compiled with mypyc (tools/build_core.py); rebuilt when a core
# source changes (until then every process runs the source core: allot.compiled_core).
$(CORE_BUILD): $(STAMP) $(wildcard shared/allot/core/*.py tools/build_core.py)
	$(BIN)/python tools/build_core.py

core: $(CORE_BUILD) ## compile the core's hot modules with mypyc (same decisions, less CPU; needs a C compiler)

run: $(STAMP) $(CORE_BUILD) ## the main job: the live stack with no Docker, several teams, a preemption, a requeue (~30 s; the first run installs first)
	$(BIN)/allot demo --run-dir $(OUT)/demo

demo: run ## alias of run

up: $(STAMP) $(CORE_BUILD) ## the whole live stack (embedded NATS + Redis, services, dashboard, 2 fake agents) until Ctrl-C
	$(BIN)/allot up --run-dir $(OUT)/up

compare: $(STAMP) $(CORE_BUILD) ## simulator: Ai2-like month, legacy priority vs Allot fair share (reclaiming or keeping every gang), side by side (~4 min)
	$(BIN)/allot scenario ai2 --seed 1 --out $(OUT)/ai2
	$(BIN)/allot simulate --cluster $(OUT)/ai2/cluster.yaml --budgets $(OUT)/ai2/budgets.yaml \
		--trace $(OUT)/ai2/trace.csv --compare priority,fairshare-reclaim-gangs,fairshare,fairshare-keep-gangs --out $(OUT)/ai2/sim

compare-gangs: $(STAMP) $(CORE_BUILD) ## simulator: the same month with gangs up to 128 GPUs from every team, Allot without reservations, reclaiming every gang, as is, keeping every gang (~4-6 min)
	$(BIN)/allot scenario ai2 --seed 1 --max-gang 128 --out $(OUT)/ai2-gangs
	$(BIN)/allot simulate --cluster $(OUT)/ai2-gangs/cluster.yaml --budgets $(OUT)/ai2-gangs/budgets.yaml \
		--trace $(OUT)/ai2-gangs/trace.csv --compare fairshare-no-reservations,fairshare-reclaim-gangs,fairshare,fairshare-keep-gangs --out $(OUT)/ai2-gangs/sim

test: $(STAMP) $(CORE_BUILD) browser ## run the test suite (unit, property, golden, integration on real NATS/Redis, Node.js client, browser), then the goldens and core-internal tests on the source core
	$(BIN)/pytest
	ALLOT_PURE_CORE=1 $(BIN)/pytest -m source_core tests/unit
	ALLOT_PURE_CORE=1 $(BIN)/pytest tests/golden tests/unit/test_compiled_core.py

browser: ## Debian's chromium for the browser tests, installed with apt-get if missing (or set ALLOT_CHROMIUM)
	@if [ -n "$$ALLOT_CHROMIUM" ] || [ -x /usr/bin/chromium ]; then :; \
	elif command -v apt-get >/dev/null 2>&1; then \
		echo "== installing Debian's chromium for the browser tests"; \
		if [ "$$(id -u)" = 0 ]; then apt-get install -y --no-install-recommends chromium; \
		else sudo apt-get install -y --no-install-recommends chromium; fi; \
	else echo "== no /usr/bin/chromium and no apt-get: the browser tests will fail saying what they need"; fi

lint: $(STAMP) ## ruff format check, ruff lint, import-linter contracts (layers, the core and the fold pure), no package import cycle, deploy/k8s rendered and schema-checked
	$(BIN)/ruff format --check shared services tests bench tools
	$(BIN)/ruff check --no-cache shared services tests bench tools
	$(BIN)/lint-imports
	$(BIN)/python tools/package_cycles.py
	$(BIN)/python -m allot.proto.schema --check
	$(BIN)/python -m pytest -q -m 'not integration' tests/unit/test_k8s_manifests.py

type: $(STAMP) ## mypy --strict on the package
	$(BIN)/mypy

fmt: $(STAMP) ## format and auto-fix
	$(BIN)/ruff format shared services tests bench tools
	$(BIN)/ruff check --fix shared services tests bench tools

bench: $(STAMP) $(CORE_BUILD) ## benchmarks; prints figures and writes bench/results/
	$(BIN)/python bench/run_all.py --shared $(SHARED)

bench-live: $(STAMP) $(CORE_BUILD) ## live stack benchmark (1,000 fake hosts): submissions/s, submit->placement latency, fsync cost
	$(BIN)/python bench/bench_live.py
	$(BIN)/python bench/bench_live.py --no-sync-always

chaos: $(STAMP) $(CORE_BUILD) ## fault injection under load (kills, SIGSTOP, NATS restart, Redis wipe); writes bench/results/chaos.*
	$(BIN)/python bench/chaos.py

chaos-cluster: $(STAMP) $(CORE_BUILD) ## fault injection on a 3-node NATS cluster (replicated streams); writes bench/results/chaos-cluster.*
	$(BIN)/python bench/chaos_cluster.py --rounds 2

golden: $(STAMP) $(CORE_BUILD) ## regenerate the simulator's golden reports (review the diff!)
	$(BIN)/python tests/golden/regenerate.py

schema: $(STAMP) ## regenerate proto/schema.json and proto/asyncapi.json from the Structs (commit them)
	$(BIN)/python -m allot.proto.schema --write

philly: $(STAMP) $(CORE_BUILD) ## Philly trace, pooled 352x8 cluster: partitioned vs fair share
	$(BIN)/allot simulate --philly $(SHARED)/traces --compare partitioned,fairshare --out $(OUT)/philly

clean: ## remove build and run outputs (keeps .venv)
	rm -rf $(OUT) build dist .mypy_cache .ruff_cache .pytest_cache
