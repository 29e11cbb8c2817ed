"""A fleet of fake Triton pods on a real API server, and the real operator tuning them.

    with Fleet(FleetConfig(pods=100, source="prometheus"), workdir) as fleet:
        fleet.set_rates(...)                 # requests per second per set and model
        fleet.state()                        # every pod's instance counts, from the pods

Run it inside a network namespace of its own (hack.fleet.netns). It starts:

- the control plane (hack.cluster.ControlPlane: etcd, kube-apiserver with an audit log of the
  operator's requests, kube-controller-manager; no node), with the CRD;
- KWOK (hack.fleet.build) faking the nodes and the pods' lifecycle: pods are created by
  Deployments (one per set of PODS_PER_SET pods, each pinned to a fake node by `nodeName`, so
  no scheduler runs), run at once, and get their IP from POD_CIDR;
- one process answering as every pod's Triton (hack.fleet.triton);
- with `source="prometheus"`, Prometheus (tritonscale.local.prometheus_server) scraping each
  pod through file_sd, its targets written from the pod list with `namespace` and `pod`;
- InstanceGroupAutoscalers, one per (set, model), and the operator as the chart runs it
  (`tritonscale operator`), outside the cluster with a kubeconfig of its own user
  (OPERATOR_USER), so that the audit log tells its requests from everyone else's.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any

import yaml

from hack import cluster
from hack.fleet import build, triton
from hack.pki import new_cert, write_kubeconfig
from hack.processes import dying_with_parent
from tritonscale import REPOSITORY_KEY_ENV
from tritonscale.local.prometheus_server import LocalPrometheus

REPO_ROOT = Path(__file__).resolve().parents[2]
TOOLS_DIR = REPO_ROOT / ".tools"
CRD = REPO_ROOT / "charts" / "tritonscale" / "crds" / "instancegroupautoscalers.yaml"
STAGES = Path(__file__).resolve().parent / "kwok-stages.yaml"
NAMESPACE = "fleet"
POD_CIDR = "127.64.0.0/10"
PODS_PER_SET = 10
PODS_PER_NODE = 100
SET_LABEL = "fleet.tritonscale.io/set"
OPERATOR_USER = "tritonscale-operator"
CONTROL_PORT = 9000
OPERATOR_PROBE_PORT = 8080
OPERATOR_METRICS_PORT = 9102
KWOK_NODE_ANNOTATION = "kwok.x-k8s.io/node"
# Only the operator's requests, one event each when its answer is complete (a watch's when
# it ends).
AUDIT_POLICY = {
    "apiVersion": "audit.k8s.io/v1",
    "kind": "Policy",
    "omitStages": ["RequestReceived", "ResponseStarted"],
    "rules": [{"level": "Metadata", "users": [OPERATOR_USER]}, {"level": "None"}],
}


class FleetError(RuntimeError):
    """The fleet could not start; one line for a person."""


@dataclass(frozen=True)
class FleetConfig:
    pods: int = 10
    source: str = "scrape"  # or "prometheus"
    interval_s: int = 15  # the autoscalers' intervalSeconds
    metrics_window_s: int = 30  # their metricsWindowSeconds
    scrape_interval_s: float = 5.0  # Prometheus's
    models: tuple[str, ...] = triton.MODELS  # one autoscaler per (set, model)
    max_instances: int = 8
    # Requests per second per pod and model before any step: 0.4 busy instances at
    # triton.SERVICE_S, below the default utilization target at one instance.
    base_rate: float = 8.0
    # Operator processes sharing the pod sets (`--shard i --total-shards shards`).
    shards: int = 1

    @property
    def sets(self) -> int:
        return max(1, self.pods // PODS_PER_SET)


def set_name(index: int) -> str:
    return f"set-{index:03d}"


class Fleet:
    """The fleet's processes and objects; `start` brings them up, `stop` takes them down."""

    def __init__(
        self,
        config: FleetConfig,
        workdir: Path,
        progress: Callable[[str], Any] = lambda _line: None,
    ) -> None:
        self.config = config
        self.workdir = Path(workdir)
        self.progress = progress
        self.repository_key = secrets.token_hex(16)
        self.plane: cluster.ControlPlane | None = None
        self.processes: dict[str, subprocess.Popen[bytes]] = {}
        self.prometheus: FileSdPrometheus | None = None
        self._api: Any = None

    # ---- bring-up ----------------------------------------------------------------------
    def start(self) -> Fleet:
        try:
            self._start()
        except BaseException:
            self.stop()
            raise
        return self

    def _start(self) -> None:
        kwok = build.build(TOOLS_DIR, self.progress)
        self.workdir.mkdir(parents=True, exist_ok=True)
        audit_policy = self.workdir / "audit-policy.yaml"
        audit_policy.write_text(yaml.safe_dump(AUDIT_POLICY))
        self.plane = cluster.ControlPlane(
            self.workdir / "cluster",
            TOOLS_DIR,
            extra_args={
                "kube-apiserver": [
                    f"--audit-policy-file={audit_policy}",
                    f"--audit-log-path={self.audit_log}",
                    "--audit-log-maxsize=0",
                ],
                # Its default 20 requests per second would make 1,000 pods a minute's work.
                "kube-controller-manager": ["--kube-api-qps=500", "--kube-api-burst=1000"],
            },
            progress=self.progress,
        ).start()
        self._operator_kubeconfig()
        self._spawn(
            "kwok",
            [
                str(kwok),
                f"--kubeconfig={self.plane.kubeconfig}",
                f"--config={STAGES}",
                f"--manage-nodes-with-annotation-selector={KWOK_NODE_ANNOTATION}=fake",
                f"--cidr={POD_CIDR}",
                "--node-ip=127.63.0.1",
            ],
        )
        self._spawn(
            "triton",
            [sys.executable, "-m", "hack.fleet.triton", f"--control-port={CONTROL_PORT}"],
            env={REPOSITORY_KEY_ENV: self.repository_key},
        )
        self._wait("the Triton stand-in", self._triton_serves, timeout_s=30)
        self._create_objects()
        pods = self._wait_for_pods()
        self._control("PUT", "/fleet/pods", {"pods": pods})
        base = {model: self.config.base_rate for model in self.config.models}
        self.set_rates({set_name(index): base for index in range(self.config.sets)})
        if self.config.source == "prometheus":
            self.prometheus = FileSdPrometheus(
                self.workdir / "targets.json", scrape_interval_s=self.config.scrape_interval_s
            )
            self.prometheus.write_targets(pods)
            self.prometheus.start()
            self._wait(
                f"Prometheus scraping all {len(pods)} pods",
                lambda: self._targets_up() >= len(pods),
                timeout_s=120 + len(pods) * 0.1,
            )
        self._create_autoscalers()
        self._start_operator()

    @property
    def audit_log(self) -> Path:
        return self.workdir / "audit.log"

    def _operator_kubeconfig(self) -> None:
        assert self.plane is not None
        pki = self.plane.pki
        # Its own user, in system:masters: RBAC is not what the fleet measures.
        new_cert(pki, OPERATOR_USER, OPERATOR_USER, ca="ca", org="system:masters",
                 usage="clientAuth")  # fmt: skip
        write_kubeconfig(self.operator_kubeconfig, self.plane.server, pki, OPERATOR_USER)

    @property
    def operator_kubeconfig(self) -> Path:
        return self.workdir / "operator.kubeconfig"

    def _spawn(self, name: str, command: list[str], env: Mapping[str, str] | None = None) -> None:
        log = self.workdir / f"{name}.log"
        with open(log, "ab") as out:
            self.processes[name] = subprocess.Popen(
                dying_with_parent(command),
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                cwd=REPO_ROOT,
                env={**os.environ, **(env or {})},
            )

    def check_alive(self) -> None:
        for name, process in self.processes.items():
            if process.poll() is not None:
                tail = (self.workdir / f"{name}.log").read_text(errors="replace").strip()
                last = tail.splitlines()[-1] if tail else "no output"
                raise FleetError(f"{name} exited (code {process.returncode}): {last}")

    def _wait(self, what: str, ready: Callable[[], bool], timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while not ready():
            self.check_alive()
            if time.monotonic() > deadline:
                raise FleetError(f"timed out after {timeout_s:.0f} s waiting for {what}")
            time.sleep(1.0)

    @property
    def api(self) -> Any:
        """The `kubernetes` client's ApiClient, as the admin."""
        if self._api is None:
            from kubernetes import config

            assert self.plane is not None
            self._api = config.new_client_from_config(str(self.plane.kubeconfig))
        return self._api

    def _create_objects(self) -> None:
        from kubernetes import client, utils

        core, apps = client.CoreV1Api(self.api), client.AppsV1Api(self.api)
        utils.create_from_yaml(self.api, str(CRD))
        core.create_namespace({"metadata": {"name": NAMESPACE}})
        sets = self.config.sets
        nodes = max(1, -(-self.config.pods // PODS_PER_NODE))
        for index in range(nodes):
            core.create_node(
                {
                    "metadata": {
                        "name": f"fleet-node-{index:03d}",
                        "annotations": {KWOK_NODE_ANNOTATION: "fake"},
                        "labels": {"type": "kwok"},
                    }
                }
            )
        for index in range(sets):
            apps.create_namespaced_deployment(NAMESPACE, self._deployment(index, nodes))
        self.progress(f"created {nodes} fake nodes and {sets} Deployments")

    def _deployment(self, index: int, nodes: int) -> dict[str, Any]:
        labels = {"app.kubernetes.io/component": "triton", SET_LABEL: set_name(index)}
        pods_per_set = min(PODS_PER_SET, self.config.pods)
        return {
            "metadata": {"name": f"triton-{set_name(index)}", "labels": labels},
            "spec": {
                "replicas": pods_per_set,
                "selector": {"matchLabels": labels},
                "template": {
                    "metadata": {"labels": labels},
                    "spec": {
                        "nodeName": f"fleet-node-{index * pods_per_set // PODS_PER_NODE % nodes:03d}",
                        "containers": [
                            {
                                "name": "triton",
                                "image": "fake/tritonserver:24.10",
                                "ports": [
                                    {"name": "http", "containerPort": triton.HTTP_PORT},
                                    {"name": "metrics", "containerPort": triton.METRICS_PORT},
                                ],
                            }
                        ],
                    },
                },
            },
        }

    def pods(self) -> dict[str, dict[str, str]]:
        """The running pods with an IP: {ip: {"name": ..., "set": ...}}."""
        from kubernetes import client

        listed = client.CoreV1Api(self.api).list_namespaced_pod(NAMESPACE)
        return {
            pod.status.pod_ip: {"name": pod.metadata.name, "set": pod.metadata.labels[SET_LABEL]}
            for pod in listed.items
            if pod.status.phase == "Running" and pod.status.pod_ip
        }

    def _wait_for_pods(self) -> dict[str, dict[str, str]]:
        started = time.monotonic()
        found: dict[str, dict[str, str]] = {}

        def all_running() -> bool:
            nonlocal found
            found = self.pods()
            return len(found) >= self.config.pods

        self._wait(f"{self.config.pods} pods running", all_running, 120 + self.config.pods * 0.3)
        self.progress(f"{len(found)} pods running in {time.monotonic() - started:.0f} s")
        return found

    def _triton_serves(self) -> bool:
        try:
            self.state()
        except OSError:
            return False
        return True

    def _targets_up(self) -> int:
        assert self.prometheus is not None
        result = self.prometheus.query('count(up{job="triton"} == 1)')
        return int(float(result[0]["value"][1])) if result else 0

    def autoscaler_name(self, set_index: int, model: str) -> str:
        return f"{set_name(set_index)}-{model.replace('_', '-')}"

    def _create_autoscalers(self) -> None:
        from kubernetes import client

        custom = client.CustomObjectsApi(self.api)
        for index in range(self.config.sets):
            for model in self.config.models:
                custom.create_namespaced_custom_object(
                    "tritonscale.io",
                    "v1alpha1",
                    NAMESPACE,
                    "instancegroupautoscalers",
                    {
                        "apiVersion": "tritonscale.io/v1alpha1",
                        "kind": "InstanceGroupAutoscaler",
                        "metadata": {"name": self.autoscaler_name(index, model)},
                        "spec": {
                            "selector": {"matchLabels": {SET_LABEL: set_name(index)}},
                            "model": model,
                            "minInstances": 1,
                            "maxInstances": self.config.max_instances,
                            "intervalSeconds": self.config.interval_s,
                            "metricsWindowSeconds": self.config.metrics_window_s,
                        },
                    },
                )
        self.progress(f"created {self.config.sets * len(self.config.models)} autoscalers")

    def _start_operator(self) -> None:
        for shard in range(self.config.shards):
            self.start_operator(shard)

    def operator_name(self, shard: int) -> str:
        return "operator" if self.config.shards == 1 else f"operator-{shard}"

    @property
    def operator_names(self) -> list[str]:
        return [self.operator_name(shard) for shard in range(self.config.shards)]

    def start_operator(self, shard: int = 0) -> None:
        """The operator as the chart runs it; with shards, replica `shard` of them (its own
        liveness and metrics ports: the next ones after the first replica's)."""
        command = [
            sys.executable,
            "-m",
            "tritonscale.cli",
            "operator",
            f"--namespace={NAMESPACE}",
            f"--liveness=http://127.0.0.1:{OPERATOR_PROBE_PORT + shard}/healthz",
            f"--metrics-port={OPERATOR_METRICS_PORT + shard}",
            f"--shard={shard}",
            f"--total-shards={self.config.shards}",
        ]
        if self.prometheus is not None:
            command.append(f"--prometheus-url={self.prometheus.url}")
        self._spawn(
            self.operator_name(shard),
            command,
            env={
                "KUBECONFIG": str(self.operator_kubeconfig),
                REPOSITORY_KEY_ENV: self.repository_key,
            },
        )

    def kill_operator(self, shard: int) -> None:
        """SIGKILL one operator process (as a lost node would), and wait for it to be gone."""
        process = self.processes.pop(self.operator_name(shard))
        process.kill()
        process.wait()

    # ---- while it runs -----------------------------------------------------------------
    @property
    def operator_pid(self) -> int:
        return self.processes[self.operator_names[0]].pid

    @property
    def operator_pids(self) -> list[int]:
        return [self.processes[n].pid for n in self.operator_names if n in self.processes]

    def _control(self, method: str, path: str, body: Any = None) -> Any:
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(
            f"http://127.0.0.1:{CONTROL_PORT}{path}", data=data, method=method
        )
        with urllib.request.urlopen(request, timeout=30) as answer:
            return json.loads(answer.read())

    def set_rates(self, rates: Mapping[str, Mapping[str, float]]) -> None:
        """Requests per second per set and model (sets not named keep theirs)."""
        self._control("PUT", "/fleet/rates", {"rates": rates})

    def state(self) -> dict[str, Any]:
        """The Triton stand-in's view: every pod's counts, and the requests it served."""
        self.check_alive()
        return self._control("GET", "/fleet/state")

    def operator_metrics(self, shard: int = 0) -> str:
        """One operator process's metrics (the first's, without shards)."""
        url = f"http://127.0.0.1:{OPERATOR_METRICS_PORT + shard}/metrics"
        with urllib.request.urlopen(url, timeout=10) as answer:
            return answer.read().decode()

    def apiserver_metrics(self) -> str:
        assert self.plane is not None
        status, text = self.plane.get("/metrics", timeout_s=10)
        if status != 200:
            raise FleetError(f"the API server's /metrics answered {status}")
        return text

    def autoscaler_status(self, set_index: int, model: str) -> dict[str, Any]:
        from kubernetes import client

        found = client.CustomObjectsApi(self.api).get_namespaced_custom_object(
            "tritonscale.io",
            "v1alpha1",
            NAMESPACE,
            "instancegroupautoscalers",
            self.autoscaler_name(set_index, model),
        )
        return found.get("status") or {}

    # ---- take-down ---------------------------------------------------------------------
    def stop(self) -> None:
        """Stop everything it started, the operator first (it must not act on a fleet
        that goes away); the logs stay in the workdir."""
        operators = [n for n in self.processes if n.startswith("operator")]
        others = [n for n in self.processes if n not in operators]
        for name in (*operators, *reversed(others)):
            process = self.processes.pop(name, None)
            if process is None:
                continue
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
                try:
                    process.wait(timeout=20)
                except subprocess.TimeoutExpired:
                    process.kill()
                    process.wait()
        if self.prometheus is not None:
            self.prometheus.close()
            self.prometheus = None
        if self._api is not None:
            self._api.close()
            self._api = None
        if self.plane is not None:
            self.plane.stop()
            self.plane = None

    def __enter__(self) -> Fleet:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


class FileSdPrometheus(LocalPrometheus):
    """LocalPrometheus whose one job, `triton`, reads its targets from a file_sd file."""

    def __init__(self, targets_file: Path, **kwargs: Any) -> None:
        super().__init__({}, **kwargs)
        self.targets_file = Path(targets_file)

    def config(self) -> dict[str, Any]:
        interval = f"{int(self.scrape_interval_s * 1000)}ms"
        return {
            **super().config(),
            "scrape_configs": [
                {
                    "job_name": "triton",
                    "scrape_interval": interval,
                    "scrape_timeout": interval,
                    "file_sd_configs": [
                        {"files": [str(self.targets_file)], "refresh_interval": "5s"}
                    ],
                }
            ],
        }

    def write_targets(self, pods: Mapping[str, Mapping[str, str]]) -> None:
        """One target per pod, labelled as Kubernetes service discovery labels it."""
        targets = [
            {
                "targets": [f"{ip}:{triton.METRICS_PORT}"],
                "labels": {"namespace": NAMESPACE, "pod": pod["name"]},
            }
            for ip, pod in sorted(pods.items())
        ]
        partial = self.targets_file.with_suffix(".partial")
        partial.write_text(json.dumps(targets))
        partial.replace(self.targets_file)


def remove_workdir(workdir: Path) -> None:
    with contextlib.suppress(OSError):
        shutil.rmtree(workdir)
