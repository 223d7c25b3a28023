# dispatcher: developer entry points. See README.md.
VENV ?= .venv
PY = $(VENV)/bin/python
# python3.11 if there is one, else python3.
PYTHON ?= $(shell command -v python3.11 2>/dev/null || command -v python3)
CONFIG ?= config/dispatcher.yaml
DEMO_PORT ?= 8080
PYTEST_ARGS ?=
# make test runs the suite on this many pytest-xdist workers: most of its time is
# spent waiting on brokers and subscribers, not on a CPU (docs/design.md, "Tests").
WORKERS ?= 2
# e.g. make bench BENCH_ARGS="--workloads W1,W3 --contenders dispatcher,b --repeat 1"
# (--quick: a smoke run). The service suite needs nginx: apt-get install -y nginx-light
BENCH_ARGS ?=
# e.g. make bench-pipeline PIPELINE_BENCH_ARGS="--lines 100000 --events 10000"
PIPELINE_BENCH_ARGS ?=
# Container image: an engine that builds Dockerfiles, the tag, and the base
# (a Python 3.11 image; on machines that cannot pull, a locally made one).
CONTAINER ?= podman
IMAGE ?= dispatcher:0.1.0
BASE ?= python:3.11-slim-bookworm
# Optional CA bundle for a TLS-intercepting proxy, given to the build as a secret.
CA_BUNDLE ?=
DEFAULT_BROKER_URL = amqp://guest:guest@localhost:5672/%2F

# Exits non-zero, with a message, unless something accepts TCP connections at
# the broker's address ($RABBITMQ_URL, else the default URL).
define BROKER_CHECK_PY
import os, socket, sys, urllib.parse
url = urllib.parse.urlsplit(os.environ.get("RABBITMQ_URL") or "$(DEFAULT_BROKER_URL)")
host = url.hostname or "localhost"
port = url.port or (5671 if url.scheme == "amqps" else 5672)
try:
    socket.create_connection((host, port), timeout=3).close()
except OSError as e:
    sys.exit(f"make: no RabbitMQ broker answers at {host}:{port} ({e}); "
             "start one (rabbitmq-server -detached) or set RABBITMQ_URL")
endef
export BROKER_CHECK_PY

.PHONY: all venv run publish test test-unit test-faults bench bench-pipeline soak lint clean distclean image image-smoke

all: venv

venv: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[dev,pipeline]'
	touch $@

# The demo: the bundled subscriber in the background, the service in the
# foreground (it declares the demo queue). Ctrl-C stops both.
run: $(VENV)/.installed
	@if [ -z "$$RABBITMQ_URL" ]; then bash .ci/broker; fi
	@$(PY) -c "$$BROKER_CHECK_PY"
	@trap 'kill $$SUB 2>/dev/null; wait $$SUB 2>/dev/null' EXIT INT TERM; \
	PYTHONUNBUFFERED=1 $(PY) cmd/demo_subscriber.py --port $(DEMO_PORT) & SUB=$$!; \
	sleep 1; kill -0 $$SUB 2>/dev/null || { echo "make run: the demo subscriber did not start" >&2; exit 1; }; \
	PYTHONUNBUFFERED=1 $(PY) -m dispatcher run --config $(CONFIG)

# Publishes one demo event to the demo queue (run it while `make run` runs).
publish: $(VENV)/.installed
	$(PY) cmd/publish_demo.py

# The whole suite, every marker included. The shared broker and Redis must
# answer: .ci/broker and .ci/redis start the installed ones if they are not running;
# .ci/tools installs the command-line tools the tests call (openssl).
test: $(VENV)/.installed
	@bash .ci/tools
	@bash .ci/broker
	@bash .ci/redis
	$(PY) -m pytest -n $(WORKERS) --dist loadgroup $(PYTEST_ARGS)

test-unit: $(VENV)/.installed
	$(PY) -m pytest -m "not broker and not fault and not spark and not redis" $(PYTEST_ARGS)

test-faults: $(VENV)/.installed
	@bash .ci/broker
	@bash .ci/redis
	$(PY) -m pytest -m fault $(PYTEST_ARGS)

# The benchmarks' own dependencies (aio-pika, aiohttp, httpx, uvloop): only `make bench` installs them.
$(VENV)/.bench-installed: $(VENV)/.installed
	$(PY) -m pip install --quiet -e '.[dev,pipeline,bench]'
	touch $@

# The service suite (W1-W7, tests/bench/run.py), a subscriber outage with and
# without the circuit breaker (W8, tests/bench/outage.py), what one HTTP request costs in
# each engine (docs/http.md, "Why libcurl"), what a filter and tracing cost per
# event, then the batch side.
bench: $(VENV)/.bench-installed
	@bash .ci/tools bench
	@bash .ci/broker
	@bash .ci/redis
	$(PY) tests/bench/run.py $(BENCH_ARGS)
	$(PY) tests/bench/outage.py
	$(PY) tests/bench/http_engines.py
	$(PY) tests/bench/filter_cost.py
	$(PY) tests/bench/trace_cost.py
	$(PY) tests/bench/pipeline.py $(PIPELINE_BENCH_ARGS)

# Two replicas sharing a dedupe store under random broker, store, subscriber and
# replica faults for SOAK_ARGS' --minutes (default 20), then a ledger of what was
# lost and which duplicates fell in which fault window (tests/soak/fleet_soak.py).
# Not part of `make test`: it runs for as long as it is told. Output in .soak/.
SOAK_ARGS ?=
soak: $(VENV)/.installed
	$(PY) tests/soak/fleet_soak.py $(SOAK_ARGS)

# The batch side alone: report over 1M log lines, replay of 100k events.
bench-pipeline: $(VENV)/.installed
	$(PY) tests/bench/pipeline.py $(PIPELINE_BENCH_ARGS)

# The config part of the Helm chart's values.schema.json and the key reference
# (docs/configuration-keys.md), generated from the settings models
# (tests/unit/test_config_schema.py fails when either is stale).
.PHONY: schema
schema: $(VENV)/.installed
	$(PY) -m dispatcher.config.schema
	$(PY) -m dispatcher.config.reference

# docs/modules.md, from the first line of each module's docstring
# (tests/unit/test_module_map.py fails when it is stale).
.PHONY: modules
modules: $(VENV)/.installed
	$(PY) -m tests.support.module_map

lint: $(VENV)/.installed
	$(VENV)/bin/ruff check dispatcher tests cmd
	$(VENV)/bin/ruff format --check dispatcher tests cmd
	$(VENV)/bin/mypy

clean:
	rm -rf .pytest_cache .mypy_cache .ruff_cache build dist *.egg-info
	find . -path ./$(VENV) -prune -o -type d -name __pycache__ -exec rm -rf {} +

distclean: clean
	rm -rf $(VENV)

comma := ,
# Not part of `make test`: needs a container engine (see docs/deployment.md).
image:
	$(CONTAINER) build --build-arg BASE=$(BASE) \
	  $(if $(CA_BUNDLE),--secret id=ca-bundle$(comma)src=$(CA_BUNDLE)) -t $(IMAGE) .

image-smoke: image
	bash deploy/image-smoke.sh $(CONTAINER) $(IMAGE)
