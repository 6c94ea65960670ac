# candidate_scheduler: two commands do all set-up on a fresh machine: `make run` and `make test`.
SHELL := /bin/bash
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.setup-$(shell cat requirements/lock.txt pyproject.toml | sha256sum | cut -c1-12)
CHECKPOINT ?= .cache/tiny-cosmos3
CKPT_STAMP := $(CHECKPOINT)/tiny_checkpoint.json

export HF_HUB_OFFLINE := 1
export SGLANG_DISABLE_COSMOS3_GUARDRAILS := 1
export PYTHONUNBUFFERED := 1

.PHONY: setup system-deps openpi-client checkpoint run test test-deps test-unit test-integration lint bench reliability dashboards-check gpu-check clean

setup: $(STAMP) $(CKPT_STAMP)

# The venv is rebuilt only when the lock or pyproject changes (the stamp name carries their hash).
# pip byte-compiles on one core (about half of a 170 s install); compileall on every core takes 44 s of
# it. Compiled here, not on first import: PYTHONDONTWRITEBYTECODE would make every process compile again.
$(STAMP): requirements/lock.txt pyproject.toml
	@echo ">> creating $(VENV) (torch comes from this machine's local wheel store; ~2-4 min the first time)"
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q --no-compile -r requirements/lock.txt
	$(BIN)/pip install -q --no-compile --no-deps sglang==0.5.23
	$(BIN)/pip install -q --no-deps --no-build-isolation -e .
	@# a few of torch's test files are for newer Pythons: pip skips what does not compile, and so do we
	$(BIN)/python -m compileall -q -j0 $(VENV)/lib > /dev/null || true
	rm -f $(VENV)/.setup-*
	touch $@

$(CKPT_STAMP): $(STAMP) candidate_scheduler/worker/tiny_checkpoint.py candidate_scheduler/worker/checkpoint_layout.py
	@echo ">> writing the tiny Cosmos3 checkpoint to $(CHECKPOINT) (random weights, fixed seed, no download)"
	$(BIN)/candidate-scheduler make-checkpoint $(CHECKPOINT)

checkpoint: $(CKPT_STAMP)

# Debian packages the tests need (Prometheus for the metrics test). Root on CI; sudo elsewhere if present.
system-deps:
	@if ! command -v prometheus >/dev/null || ! command -v promtool >/dev/null; then \
	  echo ">> installing Debian's prometheus (metrics integration test)"; \
	  SUDO=$$( [ $$(id -u) = 0 ] || echo sudo ); \
	  $$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq --no-install-recommends prometheus >/dev/null; \
	fi

run: setup
	$(BIN)/candidate-scheduler demo --model $(CHECKPOINT)

# The robot side of tests/compat/test_openpi.py: openpi's own client (numpy<2) in a venv of its own,
# .cache/openpi-client-venv, from requirements/openpi-client.txt; built once, rebuilt when that file changes.
openpi-client: $(STAMP)
	$(BIN)/python tests/compat/openpi_client_env.py

# --timeout: no single test may hang CI; -rs: say why anything was skipped. The set-up steps run side by
# side: apt's downloads, pip's install and the openpi client's venv wait on different things.
test: test-deps
	$(BIN)/python -m pytest -q -rs -p no:cacheprovider --timeout 900 tests

test-deps:
	@$(MAKE) --no-print-directory -j4 setup system-deps lint openpi-client

lint: $(STAMP)
	$(BIN)/ruff check .

test-unit: $(STAMP)
	$(BIN)/python -m pytest -q -p no:cacheprovider tests/unit

# Real processes, sglang's Cosmos3 code and the real clients (everything of `make test` but the unit tests).
test-integration: test-deps
	$(BIN)/python -m pytest -q -rs -p no:cacheprovider --timeout 900 tests --ignore=tests/unit

bench: setup
	$(BIN)/candidate-scheduler bench --model $(CHECKPOINT)

reliability: setup
	$(BIN)/python -m pytest -q -p no:cacheprovider tests/reliability --reliability-long

# One short, prepared run on a lent CUDA machine (issue 24): bench/results/bench_cuda.json and report_cuda.md.
# DRY_RUN=1: the same script end to end on the CPU with the tiny checkpoint (no figures; in make test).
gpu-check:
	DRY_RUN=$(DRY_RUN) scripts/gpu_check.sh

dashboards-check: $(STAMP)
	$(BIN)/python -m candidate_scheduler.service.dashboards_check grafana

clean:
	rm -rf $(VENV) .cache
