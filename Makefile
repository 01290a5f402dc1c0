# mailtap: `make test` sets everything up and runs all tests; `make demo` runs the demo.
# Both start with deploy/bootstrap.sh, which is idempotent and takes seconds once done.
SHELL := /bin/bash
.DEFAULT_GOAL := test

VENV := .venv
PYTHON := $(VENV)/bin/python
PYTEST_FLAGS ?= -ra --durations=15

.PHONY: venv test demo lint registry

venv:
	./deploy/bootstrap.sh

test: venv
	$(PYTHON) -m pytest tests $(PYTEST_FLAGS)

demo: venv
	$(VENV)/bin/mailtap demo

# Optional: a local Confluent-compatible schema registry (Apicurio, built with Maven into
# .cache/registry); tests/integration/core/test_registry_real.py runs only once it is built.
registry: venv
	$(PYTHON) -m mailtap.dev.registry build

lint: venv
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy connectors streams mailtap
