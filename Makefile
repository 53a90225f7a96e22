# Every target sets up what it needs from nothing: a virtualenv from the system Python, and a
# Kafka broker from Maven Central jars (Java 17+ and Maven must be on the machine).
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
INSTALLED := $(VENV)/.installed
PYTEST_ARGS ?=

.PHONY: help venv kafka-up kafka-down kafka-status test unit check demo model bench faults clean

help:
	@echo "make demo        local Kafka + scorer + a 30 s simulated load, then a summary"
	@echo "make test        install, start Kafka, run unit and integration tests, stop Kafka"
	@echo "make unit        unit tests only (no Kafka)"
	@echo "make check       format, lint and type checks"
	@echo "make kafka-up    start a single-node Kafka (KRaft) on 127.0.0.1:9092"
	@echo "make kafka-down  stop it"
	@echo "make model       retrain and export the shipped ONNX model"
	@echo "make bench       service vs pass-through, faust and per-record; p99 at 5,000 tx/s"
	@echo "make faults      fault-injection scenarios, both modes, on a broker of their own (:9292)"

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

# Starts the broker unless one of ours already runs, and stops it again only if it started it.
test: venv
	@if ops/kafka/kafka.sh status >/dev/null 2>&1; then started=0; else started=1; fi; \
	ops/kafka/kafka.sh up || exit 1; \
	status=0; $(PY) -m pytest $(PYTEST_ARGS) || status=$$?; \
	if [ $$started = 1 ]; then ops/kafka/kafka.sh down; fi; \
	exit $$status

unit: venv
	$(PY) -m pytest tests/unit $(PYTEST_ARGS)

check: venv
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/ruff check .
	$(VENV)/bin/mypy

demo: venv
	ops/demo.sh

model: venv
	$(PY) -m training.train

# BENCH_ARGS, e.g. --quick, --profile, --strict, --price-per-hour 0.2 (python -m bench.pipeline_bench -h).
BENCH_ARGS ?=
BENCH_INSTALLED := $(VENV)/.bench-installed

$(BENCH_INSTALLED): $(INSTALLED)
	$(PY) -m pip install --quiet -e '.[dev,bench]'
	@touch $@

# Starts the broker unless one of ours already runs, and stops it again only if it started it.
bench: $(BENCH_INSTALLED)
	@if ops/kafka/kafka.sh status >/dev/null 2>&1; then started=0; else started=1; fi; \
	ops/kafka/kafka.sh up || exit 1; \
	status=0; $(PY) -m bench.pipeline_bench $(BENCH_ARGS) || status=$$?; \
	if [ $$started = 1 ]; then ops/kafka/kafka.sh down; fi; \
	exit $$status

# The fault-injection suite (faults/): every scenario in both modes against a broker of its own
# (127.0.0.1:9292, state in .kafka-faults/), which it starts and stops. FAULTS_ARGS, e.g.
# --short, --mode exactly-once, --scenario 2 3 (python -m faults -h).
FAULTS_ARGS ?=
faults: venv
	$(PY) -m faults $(FAULTS_ARGS)

clean:
	-ops/kafka/kafka.sh down
	-KAFKA_PORT=9292 KAFKA_CONTROLLER_PORT=9293 KAFKA_STATE_DIR=.kafka-faults ops/kafka/kafka.sh down
	rm -rf $(VENV) .kafka .kafka-faults .faults-logs .pytest_cache .mypy_cache .ruff_cache *.egg-info
