# Two commands do all set-up on a fresh machine: `make demo` and `make test`.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
# Debian packages the tests and the demo use: Prometheus (and promtool) for the real
# metrics path, and libpython3.11 for the Triton Python backend stub.
DEBIAN_PACKAGES := prometheus libpython3.11

.PHONY: all deps venv debian demo test lint serve clean

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

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache
