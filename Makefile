# reckon: the two set-up commands are `make run` and `make test` (see README.md).
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: run test bench redis-server clean

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[test]'
	touch $(STAMP)

# Debian's redis-server (Redis 7) and faketime (a worker whose clock is off, in the tests)
# when the machine has none.
redis-server:
	@command -v redis-server >/dev/null && command -v faketime >/dev/null || { \
	  if [ "$$(id -u)" = 0 ]; then SUDO=; else SUDO=sudo; fi; \
	  $$SUDO apt-get update -qq && $$SUDO apt-get install -y -qq redis-server faketime; }

run: $(STAMP) redis-server
	@bash ops/run.sh

test: $(STAMP) redis-server
	$(BIN)/pytest -q && bash ops/check_alerts.sh

bench: $(STAMP) redis-server
	$(BIN)/python ops/bench.py

clean:
	rm -rf $(VENV) var
