# Every target sets up what it needs from nothing: a virtualenv from the system Python, and a
# Kafka broker from Maven Central jars (Java 17+ and Maven must be on the machine).
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
INSTALLED := $(VENV)/.installed
PYTEST_ARGS ?=

# Tools built or fetched for the deploy checks (compose CLI, helm, promtool, uv) live here.
TOOLS := .tools
COMPOSE_VERSION := v2.40.3
HELM_VERSION := v3.22.0
UV_VERSION := 0.13.9
UV := $(TOOLS)/uv/bin/uv
# Debian's promtool unless one is on PATH (`brew install prometheus` on macOS).
PROMTOOL ?= $(shell command -v promtool 2>/dev/null || echo $(TOOLS)/promtool/usr/bin/promtool)

.PHONY: help venv kafka-up kafka-down kafka-status kafka-up-secure kafka-down-secure \
	kafka-status-secure registry-up registry-down mlflow-up mlflow-down test test-secure unit check docs docs-serve demo model bench \
	faults upgrade-check flywheel flywheel-audit clean \
	alerts-check lock resolve-check compose-check helm-check

help:
	@echo "make demo        local Kafka + scorer + features worker + 70 s of simulated load, then a summary"
	@echo "                 (under 2 min; make demo DEMO_DURATION=300: the five-minute run)"
	@echo "make test        install, start the brokers, registry, MLflow and PostgreSQL, run every test tier, stop them"
	@echo "make test-secure the secured-broker tests only (starts and stops that broker)"
	@echo "make unit        unit tests only (no Kafka)"
	@echo "make check       format, lint and type checks; the docs site built --strict"
	@echo "make docs        build the docs site into site/ (make docs-serve: on 127.0.0.1:8000)"
	@echo "make kafka-up    start a single-node Kafka (KRaft) on 127.0.0.1:9092"
	@echo "make kafka-down  stop it"
	@echo "make kafka-up-secure    start the secured Kafka (SASL_SSL, ACLs) on 127.0.0.1:9192,"
	@echo "                        create the service's topics and grant its principal's ACLs"
	@echo "make kafka-down-secure  stop it"
	@echo "make registry-up   start a Schema Registry (Apicurio, Confluent API) on 127.0.0.1:18081"
	@echo "make registry-down stop it"
	@echo "make mlflow-up     start an MLflow tracking server and model registry on 127.0.0.1:15000"
	@echo "make mlflow-down   stop it"
	@echo "make model       retrain and export the shipped ONNX model"
	@echo "make bench       decoding per input format; service vs pass-through, faust, Quix Streams and per-record; p99 at 5,000 tx/s"
	@echo "make faults      fault-injection scenarios, both modes, on a broker of their own (:9292)"
	@echo "make upgrade-check  release 0.1.0's worker and scorers, with state, replaced one by one under load"
	@echo "make flywheel    v1 serves, the world drifts, v2 trained from the topics, shadowed, promoted"
	@echo "make flywheel-audit  what a random audit buys the flywheel, 3 seeds (about 45 min)"
	@echo "make alerts-check      promtool: Prometheus config and alert-rule unit tests"
	@echo "make lock              regenerate requirements/{cpu,gpu}.txt (the images' locks)"
	@echo "make resolve-check     resolve pip install -e . for linux/macOS, x86_64/arm64"
	@echo "make compose-check     docker-compose.yml end to end with podman (root, Debian)"
	@echo "make helm-check        helm lint, render, validate against a real kube-apiserver"

$(INSTALLED): pyproject.toml
	@command -v $(PYTHON) >/dev/null || { echo "$(PYTHON) not found: install Python 3.11+" >&2; exit 1; }
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[dev]'
	@touch $@

venv: $(INSTALLED)

kafka-up:
	ops/kafka/kafka.sh up

kafka-down:
	ops/kafka/kafka.sh down

kafka-status:
	ops/kafka/kafka.sh status

# The secured broker, ready for `fraud-scorer run` as the user fraud-scorer (docs/security.md: "Running
# against a secured cluster"): the service's topics and exactly its ACLs, made by the admin.
SECURE_STATE = $${KAFKA_SECURE_STATE_DIR:-.kafka-secure}

kafka-up-secure: venv
	ops/kafka/kafka.sh up --secure
	$(PY) -m ops.kafka.acls --config $(SECURE_STATE)/clients/admin.properties grant --create-topics

kafka-down-secure:
	ops/kafka/kafka.sh down --secure

kafka-status-secure:
	ops/kafka/kafka.sh status --secure

# Starts both brokers (the plain one and the secured one, side by side), the Schema Registry and
# the MLflow server unless ours already run, and stops again only those it started. The secured
# broker adds about 5 s (starting both brokers in parallel saved under 1 s on 2 cores), the
# registry about 10 s (and its 150 MB download once). MLflow (about 10 s, and its install, about
# 70 s, once) starts in the background meanwhile, its output shown once it is up: pip, not
# Maven, whose local repository two concurrent downloads of the same artifact could corrupt.
# So does the install of Debian's Chromium and chromedriver for the review console's browser
# test (ops/tools/browser.sh; apt, once). A PostgreSQL server (Debian's, about 3 s) serves the
# review console's shared-store tests (ops/postgres/postgres.sh, 127.0.0.1:15432).
# The tests create their own topics, users, ACLs and schemas. The unit tier runs first, on every
# core (pytest-xdist); the tiers with brokers after it, one test at a time. PYTEST_ARGS takes
# options (-k, -x, --durations), not paths; a run in which it selects nothing (pytest's exit 5)
# is no failure, since the other run may hold what it selects.
test: venv
	@if ops/kafka/kafka.sh status >/dev/null 2>&1; then plain=0; else plain=1; fi; \
	if ops/kafka/kafka.sh status --secure >/dev/null 2>&1; then secure=0; else secure=1; fi; \
	if ops/registry/registry.sh status >/dev/null 2>&1; then registry=0; else registry=1; fi; \
	if ops/mlflow/mlflow.sh status >/dev/null 2>&1; then mlflow=0; else mlflow=1; fi; \
	if ops/postgres/postgres.sh status >/dev/null 2>&1; then postgres=0; else postgres=1; fi; \
	status=0; mkdir -p .mlflow $(TOOLS); \
	ops/mlflow/mlflow.sh up >.mlflow/up.log 2>&1 & mlflow_up=$$!; \
	ops/tools/browser.sh >$(TOOLS)/browser.log 2>&1 & browser_up=$$!; \
	ops/kafka/kafka.sh up && ops/kafka/kafka.sh up --secure && ops/registry/registry.sh up \
		&& ops/postgres/postgres.sh up || status=$$?; \
	wait $$mlflow_up || status=$$?; cat .mlflow/up.log; \
	wait $$browser_up || status=$$?; cat $(TOOLS)/browser.log; \
	if [ $$status = 0 ]; then $(PY) -m pytest -n auto tests/unit $(PYTEST_ARGS) \
		|| { s=$$?; [ $$s = 5 ] || status=$$s; }; fi; \
	if [ $$status = 0 ]; then $(PY) -m pytest --ignore=tests/unit $(PYTEST_ARGS) \
		|| { s=$$?; [ $$s = 5 ] || status=$$s; }; fi; \
	if [ $$mlflow = 1 ]; then ops/mlflow/mlflow.sh down; fi; \
	if [ $$postgres = 1 ]; then ops/postgres/postgres.sh down; fi; \
	if [ $$registry = 1 ]; then ops/registry/registry.sh down; fi; \
	if [ $$secure = 1 ]; then ops/kafka/kafka.sh down --secure; fi; \
	if [ $$plain = 1 ]; then ops/kafka/kafka.sh down; fi; \
	exit $$status

# A real Schema Registry (Apicurio, Confluent-compatible API) on 127.0.0.1:18081, from Maven
# Central; it needs a Java 21+ JDK (ops/registry/registry.sh finds one under /usr/lib/jvm).
registry-up:
	ops/registry/registry.sh up

registry-down:
	ops/registry/registry.sh down

# A real MLflow tracking server and model registry on 127.0.0.1:15000, installed from PyPI into
# .mlflow/ (the service itself needs only the client, the mlflow extra).
mlflow-up:
	ops/mlflow/mlflow.sh up

mlflow-down:
	ops/mlflow/mlflow.sh down

# Only the secured-broker tier (tests/secure/), with that broker alone.
test-secure: venv
	@if ops/kafka/kafka.sh status --secure >/dev/null 2>&1; then started=0; else started=1; fi; \
	ops/kafka/kafka.sh up --secure || exit 1; \
	status=0; $(PY) -m pytest tests/secure $(PYTEST_ARGS) || status=$$?; \
	if [ $$started = 1 ]; then ops/kafka/kafka.sh down --secure; fi; \
	exit $$status

unit: venv
	$(PY) -m pytest -n auto tests/unit $(PYTEST_ARGS)

check: venv
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/ruff check .
	$(VENV)/bin/mypy
	$(PY) -m ops.tools.reference_pages --check
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict --quiet

# The docs site (mkdocs.yml): built into site/, or served with live reload.
docs: venv
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict

docs-serve: venv
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs serve --dev-addr 127.0.0.1:8000

demo: venv
	ops/demo.sh

model: venv
	$(PY) -m pip install --quiet -e '.[dev,train]'
	$(PY) -m training

# BENCH_ARGS, e.g. --quick, --profile, --strict, --price-per-hour 0.2 (python -m bench.pipeline_bench -h).
BENCH_ARGS ?=
BENCH_INSTALLED := $(VENV)/.bench-installed

$(BENCH_INSTALLED): $(INSTALLED)
	$(PY) -m pip install --quiet -e '.[dev,bench]'
	@touch $@

# The Quix Streams contender's virtualenv (bench/quix-requirements.txt says why it has its own),
# with the .venv's versions of what it shares with the other contenders.
QUIX_VENV := .venv-quix
QUIX_INSTALLED := $(QUIX_VENV)/.installed
QUIX_SHARED := ^(numpy|msgspec|numba|llvmlite|onnxruntime(-gpu)?|prometheus[-_]client)==

$(QUIX_INSTALLED): $(INSTALLED) bench/quix-requirements.txt Makefile
	$(PYTHON) -m venv $(QUIX_VENV)
	$(QUIX_VENV)/bin/python -m pip install --quiet --upgrade pip
	$(PY) -m pip list --format=freeze | grep -E '$(QUIX_SHARED)' > $(QUIX_VENV)/shared.txt
	$(QUIX_VENV)/bin/python -m pip install --quiet -r bench/quix-requirements.txt -r $(QUIX_VENV)/shared.txt
	@touch $@

# Starts the broker unless one of ours already runs, and stops it again only if it started it.
bench: $(BENCH_INSTALLED) $(QUIX_INSTALLED)
	@if ops/kafka/kafka.sh status >/dev/null 2>&1; then started=0; else started=1; fi; \
	if ops/registry/registry.sh status >/dev/null 2>&1; then registry=0; else registry=1; fi; \
	ops/kafka/kafka.sh up && ops/registry/registry.sh up || exit 1; \
	status=0; $(PY) -m bench.input_formats || status=$$?; \
	if [ $$status = 0 ]; then $(PY) -m bench.pipeline_bench $(BENCH_ARGS) || status=$$?; fi; \
	if [ $$status = 0 ]; then $(PY) -m bench.worker_cost --duration 20 --records 50000 || status=$$?; fi; \
	if [ $$status = 0 ]; then $(PY) -m bench.system_cost || status=$$?; fi; \
	if [ $$registry = 1 ]; then ops/registry/registry.sh down; fi; \
	if [ $$started = 1 ]; then ops/kafka/kafka.sh down; fi; \
	exit $$status

alerts-check:
	@test -x "$(PROMTOOL)" || ops/tools/promtool.sh $(TOOLS)/promtool
	$(PROMTOOL) check config ops/prometheus/prometheus.yml
	$(PROMTOOL) test rules ops/prometheus/alerts_test.yml

$(UV):
	$(PYTHON) -m venv $(TOOLS)/uv
	$(TOOLS)/uv/bin/pip install --quiet 'uv==$(UV_VERSION)'

lock: $(UV)
	ops/tools/lock.sh

resolve-check: $(UV)
	ops/tools/resolve-check.sh

$(TOOLS)/bin/docker-compose:
	ops/tools/go-build.sh github.com/docker/compose/v2 $(COMPOSE_VERSION) ./cmd $@

compose-check: venv $(TOOLS)/bin/docker-compose
	$(PY) -m pytest -q tests/deploy
	ops/compose/check.sh

$(TOOLS)/bin/helm:
	ops/tools/go-build.sh helm.sh/helm/v3 $(HELM_VERSION) ./cmd/helm $@

helm-check: venv $(TOOLS)/bin/helm
	ops/k8s/helm-check.sh

# The fault-injection suite (faults/): every scenario in both modes against a broker of its own
# (127.0.0.1:9292, state in .kafka-faults/), which it starts and stops. FAULTS_ARGS, e.g.
# --short, --mode exactly-once, --scenario 2 3 (python -m faults -h).
FAULTS_ARGS ?=
faults: venv
	$(PY) -m faults $(FAULTS_ARGS)

# The rolling upgrade from release 0.1.0 (fault scenario 7, faults/upgrade.py), both guarantees,
# on the fault suite's broker: the release is installed from its commit into .upgrade/ once
# (about 20 s with pip's cache warm). `make test` runs its short form, exactly-once. UPGRADE_ARGS,
# e.g. --short, --mode at-least-once.
UPGRADE_ARGS ?=
upgrade-check: venv
	$(PY) -m faults --scenario 7 $(UPGRADE_ARGS)

# FLYWHEEL_ARGS, e.g. --cards 2000 --late-days 5 (python -m flywheel -h).
flywheel: venv
	ops/kafka/kafka.sh status >/dev/null 2>&1 || ops/kafka/kafka.sh up
	$(PY) -m flywheel $(FLYWHEEL_ARGS)

# What a random audit buys the flywheel: 12 arms x 3 seeds, about 45 minutes (python -m
# flywheel.audit_study -h); FLYWHEEL_AUDIT_ARGS, e.g. --seeds 17,18 --arms cap-d20-a0,today-d20.
flywheel-audit: venv
	ops/kafka/kafka.sh status >/dev/null 2>&1 || ops/kafka/kafka.sh up
	$(PY) -m flywheel.audit_study $(FLYWHEEL_AUDIT_ARGS)

clean:
	-ops/mlflow/mlflow.sh down
	-ops/postgres/postgres.sh down
	-ops/registry/registry.sh down
	-ops/kafka/kafka.sh down
	-ops/kafka/kafka.sh down --secure
	-KAFKA_PORT=9292 KAFKA_CONTROLLER_PORT=9293 KAFKA_STATE_DIR=.kafka-faults ops/kafka/kafka.sh down
	rm -rf $(VENV) $(QUIX_VENV) .kafka .kafka-secure .kafka-faults .faults-logs .upgrade .registry .mlflow .postgres $(TOOLS) .pytest_cache \
		.mypy_cache .ruff_cache *.egg-info
