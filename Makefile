# mailtap: `make test` sets everything up and runs all tests; `make demo` runs the demo.
# Both start with deploy/bootstrap.sh, which is idempotent and takes seconds once done.
SHELL := /bin/bash
.DEFAULT_GOAL := test

VENV := .venv
PYTHON := $(VENV)/bin/python
PYTEST_FLAGS ?= -ra --durations=15

.PHONY: venv test demo lint registry s3proxy greenmail image deploy-test

venv:
	./deploy/bootstrap.sh

# The Apicurio registry (built with Maven, cached) lets the Confluent wire-format tests run
# against a real registry, not only against confluent-kafka's mock.
# S3Proxy (resolved with Maven, cached) is the S3-compatible server of the S3 claim-check tests.
# One pytest session for everything, the deployment tests (tests/deploy) included, so that the
# whole suite shares one Kafka broker, one Dovecot and one SMTP server.
# MAILTAP_NO_SKIP: a test that would skip fails (tests/conftest.py): everything it needs is
# installed above, so a skip here would hide a missing install step.
test: venv registry s3proxy greenmail
	MAILTAP_NO_SKIP=1 MAILTAP_DEPLOY_TEST=require $(PYTHON) -m pytest tests $(PYTEST_FLAGS)

# The demo runs on the schema registry `mailtap dev up` starts (Confluent wire format).
demo: venv registry
	$(VENV)/bin/mailtap demo

# The local Confluent-compatible schema registry (Apicurio, built with Maven into .cache/registry)
# that `mailtap dev up` starts (MAILTAP_DEV_REGISTRY=off runs without one);
# tests/integration/core/test_registry_real.py skips, saying so, where it is not built.
registry: venv
	$(PYTHON) -m mailtap.dev.registry build

# A local S3-compatible server (S3Proxy, resolved with Maven into .cache/s3proxy/libs);
# tests/integration/core/test_s3_claimcheck.py skips, saying so, where it is not resolved.
s3proxy: venv
	$(PYTHON) -m mailtap.dev.s3proxy build

# GreenMail (resolved with Maven into .cache/greenmail/libs), one of the IMAP servers of the
# server-matrix tests (tests/integration/imap/test_imap_servers.py) and `mailtap dev up --imap`.
greenmail: venv
	$(PYTHON) -c "from mailtap.dev import greenmail; print(greenmail.build())"

lint: venv
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy connectors streams mailtap
	$(VENV)/bin/lint-imports --no-logo

# The container image with podman (deploy/podman/build-image.sh: podman, runc and mmdebstrap from
# apt, a private containers.conf, the base image from the Debian mirror; all cached).
image:
	./deploy/podman/build-image.sh

# The shipped deployment files, run: the image, each component in a container against the test
# services, the compose file (with the local-kafka profile), the Kubernetes manifests
# (kubernetes-validate, podman kube play). Skips, saying why, where podman cannot run.
deploy-test: venv registry
	$(PYTHON) -m pytest tests/deploy $(PYTEST_FLAGS)
