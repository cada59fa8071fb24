# reckon: the two set-up commands are `make run` and `make test` (see README.md).
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: run test repeat bench redis-server test-deps bench-deps clean

# The service with its test tools, and the Python client (client/, docs/client.md) beside it.
$(STAMP): pyproject.toml client/pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[test]' -e ./client
	touch $(STAMP)

# Debian packages, when the machine lacks them (ops/system-deps.sh says which and why).
redis-server:
	@bash ops/system-deps.sh run

test-deps:
	@bash ops/system-deps.sh test

bench-deps:
	@bash ops/system-deps.sh bench

run: $(STAMP) redis-server
	@bash ops/run.sh

test: $(STAMP) test-deps
	$(BIN)/pytest -q && bash ops/check_alerts.sh

# Each test of TESTS run COUNT times in a row (pytest-repeat): a test that fails by chance shows.
COUNT ?= 20
TESTS ?= tests/pipeline/test_leases.py
repeat: $(STAMP) test-deps
	$(BIN)/pytest -q -p no:cacheprovider --count $(COUNT) $(TESTS)

# ops/bench/bench.py --help: phases, sizes, --growth (long), --json PATH
bench: $(STAMP) bench-deps
	$(BIN)/python ops/bench/bench.py $(BENCH_ARGS)

clean:
	rm -rf $(VENV) var
