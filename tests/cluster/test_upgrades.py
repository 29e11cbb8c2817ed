"""Upgrades that complete, on a real API server with helm 4.

Two releases of their own, each in a namespace that enforces the restricted PodSecurity level:

- **The operator's HA values** (`ci/operator-ha-values.yaml`: three peered replicas, a required
  anti-affinity by node, a budget of two) on three nodes that KWOK fakes (hack/fleet's kwok and
  its stages, plus a heartbeat for the cluster's node-lifecycle-controller; the nodes are
  tainted and only the operator's pods tolerate it). The scheduler and the Deployment
  controller are the cluster's own; the pods' containers do not run, KWOK marks them Ready. A
  `helm upgrade` rolls out to the end, never with fewer than two replicas Ready (so with
  peering one is active and one ready to take over), each new pod on the node its predecessor
  left. On the same nodes, a surge rollout of pods kept apart stalls: what the chart's
  strategy avoids, and what makes the first test mean something.
- **Headless Locust** against the chart's Triton (the images `make images` built): a run
  survives `helm upgrade` with another worker count, a changed locustfile and a new chart
  version (each makes new Jobs, Helm deletes the old ones with their pods, and the new run
  finishes), an upgrade that changes nothing of the run leaves its finished Jobs alone, a run
  that cannot reach Triton fails within its bounds with a one-line reason, and turning Locust
  off leaves nothing.

The tests of each part run in this file's order, each leaving its release as the next expects.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from hack.fleet import build as kwok_build
from hack.fleet.fleet import KWOK_NODE_ANNOTATION, STAGES
from hack.processes import dying_with_parent
from tests.chart.helm import CHART
from tests.cluster.conftest import TOOLS_DIR
from tests.cluster.harness import (
    Cluster,
    Stopwatch,
    is_ready,
    restricted_namespace,
    wait_namespace_gone,
    wait_release_gone,
)
from tests.tooling import missing

VALUES = Path(__file__).parent / "e2e-values.yaml"
HEARTBEAT = Path(__file__).parent / "kwok-node-heartbeat.yaml"


def condition(obj: dict[str, Any], kind: str) -> dict[str, Any] | None:
    """The object's condition of that type when it is True."""
    for item in (obj.get("status") or {}).get("conditions") or []:
        if item["type"] == kind and item["status"] == "True":
            return item
    return None


# ---- the operator's HA values on three nodes --------------------------------------------------
HA_NAMESPACE = "e2e-operator-ha"
HA_RELEASE = "ha"
HA_OPERATOR = f"app.kubernetes.io/instance={HA_RELEASE},app.kubernetes.io/component=operator"
HA_DEPLOYMENT = f"{HA_RELEASE}-tritonscale-operator"
KWOK_NODES = [f"tritonscale-ha-{index}" for index in range(3)]
POOL_KEY, POOL = "tritonscale.io/test-pool", "operator-ha"
TOLERATION = {"key": POOL_KEY, "operator": "Equal", "value": POOL, "effect": "NoSchedule"}
# Addresses for the fake pods and nodes, outside the real node's pod subnet (hack.node) and
# the Service range: nothing ever connects to them.
KWOK_CIDR, KWOK_NODE_IP = "10.89.0.0/24", "10.89.1.1"
PROBE = "surge-probe"


def kwok_node(name: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "annotations": {KWOK_NODE_ANNOTATION: "fake"},
            # The anti-affinity's topology key: a node without it would count as no node.
            "labels": {"kubernetes.io/hostname": name, POOL_KEY: POOL, "type": "kwok"},
        },
        "spec": {"taints": [{"key": POOL_KEY, "value": POOL, "effect": "NoSchedule"}]},
    }


def node_ready(node: dict[str, Any]) -> bool:
    """Ready, and tainted with nothing but the pool's taint (not-ready, unreachable...)."""
    taints = [t["key"] for t in node["spec"].get("taints") or []]
    return condition(node, "Ready") is not None and taints == [POOL_KEY]


@pytest.fixture(scope="module")
def kwok_nodes(cluster: Cluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[str]]:
    """Three KWOK nodes on the session's cluster, Ready and tainted for the operator alone."""
    if not kwok_build.binary(TOOLS_DIR).is_file() and shutil.which("go") is None:
        missing("kwok is not built and go is not on PATH to build it")
    kwok = kwok_build.build(TOOLS_DIR, progress=lambda _line: None)
    workdir = tmp_path_factory.mktemp("kwok")
    stages = workdir / "stages.yaml"
    stages.write_text(STAGES.read_text() + HEARTBEAT.read_text())
    command = [
        str(kwok),
        f"--kubeconfig={cluster.kubeconfig}",
        f"--config={stages}",
        f"--manage-nodes-with-annotation-selector={KWOK_NODE_ANNOTATION}=fake",
        f"--cidr={KWOK_CIDR}",
        f"--node-ip={KWOK_NODE_IP}",
    ]
    log = workdir / "kwok.log"
    with open(log, "ab") as out:
        process = subprocess.Popen(
            dying_with_parent(command), stdin=subprocess.DEVNULL, stdout=out,
            stderr=subprocess.STDOUT,
        )  # fmt: skip
    try:
        for name in KWOK_NODES:
            cluster.kubectl("create", "-f", "-", stdin=json.dumps(kwok_node(name)))

        def all_ready() -> bool:
            assert process.poll() is None, f"kwok exited: {log.read_text()[-2000:]}"
            nodes = [cluster.get("node", name) for name in KWOK_NODES]
            return all(node_ready(node) for node in nodes)

        cluster.wait("the three KWOK nodes Ready", all_ready, timeout_s=90)
        yield KWOK_NODES
    finally:
        # After the release's namespace is gone (its fixture ends first): a pod bound to a
        # fake node is finalized by kwok alone.
        for name in KWOK_NODES:
            cluster.run("kubectl", "delete", "node", name, "--ignore-not-found")
        process.terminate()
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def operator_pods(cluster: Cluster) -> list[dict[str, Any]]:
    return cluster.pods(HA_NAMESPACE, HA_OPERATOR)


def spread_and_ready(pods: list[dict[str, Any]]) -> bool:
    """Three Ready pods, one on each KWOK node."""
    nodes = sorted(pod["spec"].get("nodeName") or "" for pod in pods)
    return len(pods) == 3 and all(is_ready(pod) for pod in pods) and nodes == KWOK_NODES


@pytest.fixture(scope="module")
def ha_release(
    cluster: Cluster, kwok_nodes: list[str], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Cluster]:
    """ci/operator-ha-values.yaml, its operator pods on the KWOK nodes; no Triton pod (the
    rollout is the operator's) and no autoscalers."""
    restricted_namespace(cluster, HA_NAMESPACE)
    pinned = tmp_path_factory.mktemp("ha") / "pinned-values.yaml"
    pinned.write_text(
        yaml.safe_dump(
            {
                "triton": {"replicaCount": 0},
                "autoscalers": {"enabled": False},
                "operator": {"nodeSelector": {POOL_KEY: POOL}, "tolerations": [TOLERATION]},
            }
        )
    )
    cluster.helm(
        "install", HA_RELEASE, str(CHART), "-n", HA_NAMESPACE,
        "-f", str(CHART / "ci" / "operator-ha-values.yaml"), "-f", str(pinned),
        *cluster.image_values(),
    )  # fmt: skip
    cluster.wait(
        "three operator pods Ready, one on each KWOK node",
        lambda: spread_and_ready(operator_pods(cluster)),
        timeout_s=120,
        namespace=HA_NAMESPACE,
    )
    yield cluster
    cluster.run("kubectl", "delete", "deployment", PROBE, "-n", HA_NAMESPACE, "--ignore-not-found")
    cluster.run("helm", "uninstall", HA_RELEASE, "-n", HA_NAMESPACE, "--wait", "--timeout", "2m",
                timeout=180)  # fmt: skip
    cluster.run("kubectl", "delete", "namespace", HA_NAMESPACE, "--wait=false")
    wait_namespace_gone(cluster, HA_NAMESPACE)


class ReadyCounter:
    """Counts the Ready operator pods every 0.2 s on a thread of its own, meanwhile."""

    def __init__(self, cluster: Cluster) -> None:
        self.cluster = cluster
        self.counts: list[int] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._count, name="ready-counter", daemon=True)

    def __enter__(self) -> ReadyCounter:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=30)
        assert not self._thread.is_alive(), "the Ready counter did not stop within 30 s"

    def _count(self) -> None:
        while not self._stop.is_set():
            done = self.cluster.run(
                "kubectl", "get", "pods", "-n", HA_NAMESPACE, "-l", HA_OPERATOR, "-o", "json",
                timeout=30,
            )  # fmt: skip
            if done.returncode == 0:
                pods = json.loads(done.stdout)["items"]
                self.counts.append(sum(is_ready(pod) for pod in pods))
            self._stop.wait(0.2)


def rolled_out(cluster: Cluster) -> dict[str, Any] | None:
    deployment = cluster.get("deployment", HA_DEPLOYMENT, "-n", HA_NAMESPACE)
    status = deployment.get("status") or {}
    done = (
        status.get("observedGeneration", 0) >= deployment["metadata"]["generation"]
        and status.get("replicas") == status.get("updatedReplicas") == 3
        and status.get("availableReplicas") == 3
    )
    return deployment if done else None


def test_an_upgrade_of_the_ha_operator_completes_on_three_nodes_with_two_always_ready(
    ha_release: Cluster,
) -> None:
    before = {pod["metadata"]["name"] for pod in operator_pods(ha_release)}
    strategy = ha_release.get("deployment", HA_DEPLOYMENT, "-n", HA_NAMESPACE)["spec"]["strategy"]
    assert strategy["rollingUpdate"] == {"maxSurge": 0, "maxUnavailable": 1}, strategy
    with (
        ReadyCounter(ha_release) as ready,
        Stopwatch(
            ha_release.timings, "helm upgrade of the HA operator: rollout on three nodes done"
        ),
    ):
        # Any change of the pod template rolls the pods out, as a new chart version does.
        ha_release.helm(
            "upgrade", HA_RELEASE, str(CHART), "-n", HA_NAMESPACE, "--reuse-values",
            "--set", "operator.podAnnotations.upgrade=second",
        )  # fmt: skip
        ha_release.wait(
            "the operator Deployment's rollout to complete (3 updated, 3 available)",
            lambda: rolled_out(ha_release),
            timeout_s=180,
            namespace=HA_NAMESPACE,
        )
    ha_release.wait(
        "the three new operator pods Ready, one on each KWOK node",
        lambda: spread_and_ready(operator_pods(ha_release)),
        timeout_s=60,
        namespace=HA_NAMESPACE,
    )
    after = operator_pods(ha_release)
    assert not before & {pod["metadata"]["name"] for pod in after}, "an old pod is still there"
    for pod in after:
        assert pod["metadata"]["annotations"]["upgrade"] == "second", pod["metadata"]["name"]
    # The budget's two throughout: one replica down at a time, never more.
    assert ready.counts, "the Ready operator pods were never counted"
    assert min(ready.counts) >= 2, ready.counts


def surge_probe() -> dict[str, Any]:
    """A Deployment of three pods kept apart on the KWOK nodes, rolled out with a surge: the
    shipped HA values before the chart's strategy. Its image is never pulled (KWOK)."""
    labels = {"app": PROBE}
    container = {
        "name": "probe",
        "image": "registry.invalid/never-pulled:1",
        "resources": {"requests": {"cpu": "10m", "memory": "16Mi"}, "limits": {"memory": "16Mi"}},
        "securityContext": {
            "allowPrivilegeEscalation": False,
            "capabilities": {"drop": ["ALL"]},
            "runAsNonRoot": True,
            "runAsUser": 65532,
            "seccompProfile": {"type": "RuntimeDefault"},
        },
    }
    term = {"topologyKey": "kubernetes.io/hostname", "labelSelector": {"matchLabels": labels}}
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": PROBE, "labels": labels},
        "spec": {
            "replicas": 3,
            "selector": {"matchLabels": labels},
            "strategy": {
                "type": "RollingUpdate",
                "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0},
            },
            "template": {
                "metadata": {"labels": labels},
                "spec": {
                    "nodeSelector": {POOL_KEY: POOL},
                    "tolerations": [TOLERATION],
                    "affinity": {
                        "podAntiAffinity": {
                            "requiredDuringSchedulingIgnoredDuringExecution": [term]
                        }
                    },
                    "containers": [container],
                },
            },
        },
    }


def test_on_the_same_nodes_a_surge_rollout_of_pods_kept_apart_stalls(ha_release: Cluster) -> None:
    ha_release.kubectl("apply", "-n", HA_NAMESPACE, "-f", "-", stdin=json.dumps(surge_probe()))
    selector = f"app={PROBE}"
    ha_release.wait(
        "the surge probe's three pods Ready, one on each KWOK node",
        lambda: spread_and_ready(ha_release.pods(HA_NAMESPACE, selector)),
        timeout_s=60,
        namespace=HA_NAMESPACE,
    )
    old = {pod["metadata"]["name"] for pod in ha_release.pods(HA_NAMESPACE, selector)}
    ha_release.kubectl(
        "patch", "deployment", PROBE, "-n", HA_NAMESPACE, "--type=merge",
        "-p", json.dumps({"spec": {"template": {"metadata": {"annotations": {"rev": "2"}}}}}),
    )  # fmt: skip

    def unschedulable() -> dict[str, Any] | None:
        for pod in ha_release.pods(HA_NAMESPACE, selector):
            for item in (pod.get("status") or {}).get("conditions") or []:
                if item["type"] == "PodScheduled" and item.get("reason") == "Unschedulable":
                    return pod
        return None

    pending = ha_release.wait(
        "the surge pod to be refused a node", unschedulable, timeout_s=60, namespace=HA_NAMESPACE
    )
    time.sleep(10)  # the controller's and the scheduler's retries change nothing
    pods = ha_release.pods(HA_NAMESPACE, selector)
    assert {p["metadata"]["name"] for p in pods if is_ready(p)} == old
    assert [p["metadata"]["name"] for p in pods if not p["spec"].get("nodeName")] == [
        pending["metadata"]["name"]
    ]
    status = ha_release.get("deployment", PROBE, "-n", HA_NAMESPACE)["status"]
    assert status.get("updatedReplicas") == 1 and status.get("availableReplicas") == 3, status
    ha_release.kubectl("delete", "deployment", PROBE, "-n", HA_NAMESPACE)


# ---- headless Locust across upgrades ----------------------------------------------------------
LOAD_NAMESPACE = "e2e-locust-upgrades"
LOAD_RELEASE = "load"
LOAD_INSTANCE = f"app.kubernetes.io/instance={LOAD_RELEASE}"
LOCUST = f"{LOAD_INSTANCE},app.kubernetes.io/component=locust"
RUN_LABEL = "tritonscale.io/locust-run"
# A short, light run, on top of e2e-values.yaml's (headless, pipeline_async): the waits long
# enough for the chart's Triton to start on the node.
LOAD_SETS = (
    "locust.enabled=true", "locust.runTime=15s", "locust.users=4", "locust.spawnRate=4",
    "locust.workers=1", "locust.waitForTritonSeconds=420", "locust.expectWorkersSeconds=120",
)  # fmt: skip


def sets(*items: str) -> list[str]:
    return [arg for item in items for arg in ("--set", item)]


def runs(cluster: Cluster) -> dict[str, dict[str, dict[str, Any]]]:
    """run id -> role -> Job, of the release's Locust Jobs now in the namespace."""
    found: dict[str, dict[str, dict[str, Any]]] = {}
    for job in cluster.items("jobs", "-n", LOAD_NAMESPACE, "-l", LOCUST):
        labels = job["metadata"]["labels"]
        found.setdefault(labels[RUN_LABEL], {})[labels["tritonscale.io/locust-role"]] = job
    return found


def run_pods(cluster: Cluster, run: str, role: str | None = None) -> list[dict[str, Any]]:
    """The pods of a run (of one role's Job)."""
    selector = f"{LOCUST},{RUN_LABEL}={run}"
    if role is not None:
        selector += f",tritonscale.io/locust-role={role}"
    return cluster.pods(LOAD_NAMESPACE, selector)


def wait_finished(cluster: Cluster, previous: str | None, timeout_s: float) -> str:
    """The one run there is, other than `previous`, once both its Jobs are Complete and
    nothing of `previous` (Jobs, pods) is left; its id."""

    def finished() -> str | None:
        now = runs(cluster)
        if len(now) != 1:
            return None
        ((run, jobs),) = now.items()
        if run == previous or sorted(jobs) != ["master", "worker"]:
            return None
        if not all(condition(job, "Complete") for job in jobs.values()):
            return None
        if previous is not None and run_pods(cluster, previous):
            return None
        return run

    what = "the headless run's master and worker Jobs Complete"
    if previous is not None:
        what = f"a new run replacing {previous} (Jobs and pods gone), its Jobs Complete"
    return cluster.wait(what, finished, timeout_s=timeout_s, namespace=LOAD_NAMESPACE, every_s=2)


def upgrade_load(cluster: Cluster, chart: Path, *items: str) -> None:
    """helm upgrade, keeping the release's values: refused, before the run's Jobs were named
    after it, whenever the change reached their pod template."""
    cluster.helm(
        "upgrade", LOAD_RELEASE, str(chart), "-n", LOAD_NAMESPACE, "--reuse-values", *sets(*items)
    )


@pytest.fixture(scope="module")
def chart_copy(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The chart, its links resolved, to edit as a changed locustfile and a new version do."""
    copy = tmp_path_factory.mktemp("chart") / "tritonscale"
    shutil.copytree(CHART, copy, symlinks=False)
    return copy


@pytest.fixture(scope="module")
def load_release(cluster: Cluster) -> Iterator[Cluster]:
    restricted_namespace(cluster, LOAD_NAMESPACE)
    cluster.helm(
        "install", LOAD_RELEASE, str(CHART), "-n", LOAD_NAMESPACE, "-f", str(VALUES),
        *cluster.image_values(), *sets(*LOAD_SETS),
    )  # fmt: skip
    yield cluster
    # Whatever a failed test left: go, without waiting on an operator's finalizer.
    if cluster.run("kubectl", "get", "namespace", LOAD_NAMESPACE).returncode == 0:
        cluster.run("helm", "uninstall", LOAD_RELEASE, "-n", LOAD_NAMESPACE, "--timeout", "2m")
        for name in cluster.run(
            "kubectl", "get", "iga", "-n", LOAD_NAMESPACE, "-o", "name"
        ).stdout.split():
            cluster.run("kubectl", "patch", name, "-n", LOAD_NAMESPACE, "--type=merge",
                        "-p", '{"metadata":{"finalizers":null}}')  # fmt: skip
        cluster.run("kubectl", "delete", "namespace", LOAD_NAMESPACE, "--wait=false")


@pytest.mark.timeout(900)
def test_a_headless_run_installed_with_the_release_finishes(load_release: Cluster) -> None:
    # Triton starts meanwhile: the master's init container waits for it (up to 420 s here).
    with Stopwatch(load_release.timings, "helm install to the first Locust run finished"):
        run = wait_finished(load_release, None, timeout_s=600)
    (master,) = run_pods(load_release, run, "master")
    (status,) = master["status"]["containerStatuses"]
    assert status["state"]["terminated"]["exitCode"] == 0, status


def test_an_upgrade_to_another_worker_count_replaces_the_run(load_release: Cluster) -> None:
    (before,) = runs(load_release)
    upgrade_load(load_release, CHART, "locust.workers=2")
    run = wait_finished(load_release, before, timeout_s=240)
    workers = runs(load_release)[run]["worker"]
    assert workers["spec"]["completions"] == workers["status"]["succeeded"] == 2


def test_an_upgrade_with_a_changed_locustfile_replaces_the_run(
    load_release: Cluster, chart_copy: Path
) -> None:
    (before,) = runs(load_release)
    bls = chart_copy / "files" / "loadtests" / "bls.py"
    bls.write_text(bls.read_text() + "\n# changed by tests/cluster/test_upgrades.py\n")
    upgrade_load(load_release, chart_copy)
    wait_finished(load_release, before, timeout_s=240)
    files = load_release.get("configmap", f"{LOAD_RELEASE}-tritonscale-locustfiles",
                             "-n", LOAD_NAMESPACE)  # fmt: skip
    assert files["data"]["bls.py"].endswith("# changed by tests/cluster/test_upgrades.py\n")


def test_an_upgrade_to_a_new_chart_version_replaces_the_run(
    load_release: Cluster, chart_copy: Path
) -> None:
    (before,) = runs(load_release)
    chart_yaml = chart_copy / "Chart.yaml"
    chart = yaml.safe_load(chart_yaml.read_text())
    # The version only: the images' tags follow appVersion, which stays.
    chart_yaml.write_text(yaml.safe_dump({**chart, "version": "0.1.1"}))
    # Triton rolls out too (its pods carry the chart's label): the run's init container waits
    # for a Ready pod behind the Service, and failed requests fail no run without a gate.
    upgrade_load(load_release, chart_copy)
    run = wait_finished(load_release, before, timeout_s=420)
    for role, job in runs(load_release)[run].items():
        assert job["metadata"]["labels"]["helm.sh/chart"] == "tritonscale-0.1.1", role


def test_an_upgrade_that_changes_nothing_of_the_run_leaves_it_alone(
    load_release: Cluster, chart_copy: Path
) -> None:
    ((run, jobs),) = runs(load_release).items()
    uids = {role: job["metadata"]["uid"] for role, job in jobs.items()}
    pods = {pod["metadata"]["name"] for pod in run_pods(load_release, run)}
    upgrade_load(load_release, chart_copy, "operator.podAnnotations.upgrade=unrelated")
    time.sleep(10)  # a Job made again would have started its pods by now
    now = runs(load_release)
    assert list(now) == [run], now.keys()
    assert {role: job["metadata"]["uid"] for role, job in now[run].items()} == uids
    assert {pod["metadata"]["name"] for pod in run_pods(load_release, run)} == pods


def test_a_run_that_cannot_reach_triton_fails_within_its_bounds_with_one_line(
    load_release: Cluster, chart_copy: Path
) -> None:
    (before,) = runs(load_release)
    nowhere = "http://127.0.0.1:9"  # nothing listens in the master's pod
    started = time.monotonic()
    upgrade_load(
        load_release, chart_copy, f"locust.host={nowhere}", "locust.waitForTritonSeconds=10",
        "locust.activeDeadlineSeconds=60",
    )  # fmt: skip

    def failed() -> tuple[str, dict[str, dict[str, Any]]] | None:
        now = runs(load_release)
        if before in now or len(now) != 1:
            return None
        ((run, jobs),) = now.items()
        if sorted(jobs) == ["master", "worker"] and all(
            condition(job, "Failed") for job in jobs.values()
        ):
            return run, jobs
        return None

    run, jobs = load_release.wait(
        "the unreachable run's master and worker Jobs Failed",
        failed,
        timeout_s=150,
        namespace=LOAD_NAMESPACE,
        every_s=2,
    )
    assert time.monotonic() - started < 60 + 60, "the run outlived its deadline"
    # The master's init container gave up at its limit, and said why in one line.
    assert condition(jobs["master"], "Failed")["reason"] == "BackoffLimitExceeded"
    init = jobs["master"]["spec"]["template"]["spec"]["initContainers"][0]["command"]
    models = [arg for arg in init if not arg.startswith(("-", "/")) and arg != "python3"]
    paths = ["/v2/health/ready", *(f"/v2/models/{model}/ready" for model in models)]
    expected = f"gave up after 10 s waiting for Triton at {nowhere}: not ready: {', '.join(paths)}"
    (master,) = run_pods(load_release, run, "master")
    (waited,) = master["status"]["initContainerStatuses"]
    terminated = waited["state"]["terminated"]
    assert terminated["exitCode"] == 1, waited
    assert terminated.get("message", "").strip() == expected, waited
    logs = load_release.kubectl("logs", master["metadata"]["name"], "-n", LOAD_NAMESPACE,
                                "-c", "wait-for-triton")  # fmt: skip
    assert logs.strip().splitlines() == [expected]
    # The workers, whose master never came, were stopped at the deadline: nothing runs on.
    assert condition(jobs["worker"], "Failed")["reason"] == "DeadlineExceeded"
    load_release.wait(
        "no pod of the failed run left running",
        lambda: (
            not [
                p
                for p in run_pods(load_release, run)
                if p["status"].get("phase") in ("Pending", "Running")
            ]
        ),
        timeout_s=60,
        namespace=LOAD_NAMESPACE,
    )


def test_locust_off_and_uninstall_leave_nothing(load_release: Cluster, chart_copy: Path) -> None:
    upgrade_load(load_release, chart_copy, "locust.enabled=false")
    load_release.wait(
        "every Locust Job and pod of the release deleted",
        lambda: not runs(load_release) and not load_release.pods(LOAD_NAMESPACE, LOCUST),
        timeout_s=120,
        namespace=LOAD_NAMESPACE,
    )
    load_release.helm("uninstall", LOAD_RELEASE, "-n", LOAD_NAMESPACE, "--wait", "--timeout",
                      "3m", timeout=240)  # fmt: skip
    wait_release_gone(load_release, LOAD_NAMESPACE, LOAD_INSTANCE)
    load_release.kubectl("delete", "namespace", LOAD_NAMESPACE, "--wait=false")
    wait_namespace_gone(load_release, LOAD_NAMESPACE)
