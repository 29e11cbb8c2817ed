"""The quick day-2 drills (hack.drills --quick) on the session's real node, under load.

A release with the chart's own drain settings (preStop sleep, gRPC connections aged out)
and two operators with peering runs in its own namespace while Locust sends a steady
gRPC load to the Triton Service's cluster IP; each drill counts every request of its window
from Locust's request log. Rollout, scale-in and failover must lose none; the OOM kill may
lose only the requests of the moments the pod died in; the install/uninstall cycles must
find the operator releasing every finalizer itself. `make drills` runs every drill in full.
"""

from __future__ import annotations

import datetime
import json
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from hack import drills as hack_drills
from hack.demo_k8s import CHART, Kubectl
from tests.cluster.harness import (
    Cluster,
    Stopwatch,
    is_ready,
    restricted_namespace,
    wait_namespace_gone,
)

NAMESPACE = "e2e-drills"
Subject = tuple[hack_drills.Drills, hack_drills.Load, dict]


@pytest.fixture(scope="module")
def drills(cluster: Cluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Subject]:
    kubectl = Kubectl(cluster.kubeconfig)
    values = hack_drills.release_values(cluster.registry)
    restricted_namespace(cluster, NAMESPACE)
    with Stopwatch(cluster.timings, "drills: helm install to every pod tuned"):
        _install(cluster, values)
        subject = hack_drills.Drills(
            kubectl, cluster.state_dir, hack_drills.Settings.quick(), namespace=NAMESPACE,
            progress=lambda _line: None,
        )  # fmt: skip
        subject.wait_tuned(2)
    folder = tmp_path_factory.mktemp("drills")
    try:
        with hack_drills.load_on(subject, folder) as load:
            yield subject, load, values
    finally:
        cluster.run("helm", "uninstall", hack_drills.RELEASE, "-n", NAMESPACE, "--timeout", "3m")
        cluster.run("kubectl", "delete", "namespace", NAMESPACE, "--wait=false")
        wait_namespace_gone(cluster, NAMESPACE)


def _install(cluster: Cluster, values: dict) -> None:
    path = Path(cluster.state_dir) / "drills-values.yaml"
    path.write_text(yaml.safe_dump(values))
    cluster.helm(
        "install", hack_drills.RELEASE, str(CHART), "-n", NAMESPACE,
        "-f", str(path), "--wait", "--timeout", "8m", timeout=520,
    )  # fmt: skip


def run(drills: Subject, name: str) -> hack_drills.Record:
    subject, load, values = drills
    record = hack_drills.run_drill(subject, name, load, values)
    print("\n".join(hack_drills.table([record])))
    return record


@pytest.mark.parametrize("name", ["rollout", "scale-in"])
def test_a_drill_under_load_loses_no_request(drills: Subject, name: str) -> None:
    record = run(drills, name)
    assert record.requests_sent > 0
    assert record.requests_failed == 0, record
    assert record.passed, record


def test_operators_resume_ticking_after_the_active_one_is_killed_with_no_stale_count(
    drills: Subject,
) -> None:
    record = run(drills, "failover")
    assert record.passed, record
    detail = record.detail
    # Peering lifetime 15 s in these values: the standby waits out at most that, and the
    # killed pod's container restarts sooner still.
    assert record.recovery_s is not None and record.recovery_s < 15 + 15, record
    assert detail["desired_after"] == detail["desired_before"], detail
    # The new operator's ledger, rebuilt from status, grants what the old one had granted.
    assert detail["budget_after"] == detail["budget_before"], detail
    assert all(b is not None and b[0] == 4 for b in detail["budget_after"].values()), detail
    assert detail["rescale_events_during"] == 0, detail


def test_a_rollout_of_an_operator_that_never_gets_ready_stops_at_its_first_pod(
    drills: Subject, cluster: Cluster
) -> None:
    operators = hack_drills.harness.OPERATOR
    deployment = f"{hack_drills.RELEASE}-tritonscale-operator"

    def both_ready() -> list[dict] | None:
        ready = cluster.ready_pods(NAMESPACE, operators)
        return ready if len(ready) == 2 else None

    ready = cluster.wait(
        "both operator replicas Ready", both_ready, timeout_s=120, namespace=NAMESPACE
    )
    old = {p["metadata"]["name"] for p in ready}
    # A wrong API address: the container starts and serves its liveness probe, but the
    # operator reaches nothing (kopf gives up after about a minute, and the container
    # restarts). Without a readinessProbe it would count as available as soon as it runs,
    # and the rollout would replace both replicas with it.
    broken = [
        {"name": "KUBERNETES_SERVICE_HOST", "value": "127.0.0.1"},
        {"name": "KUBERNETES_SERVICE_PORT", "value": "1"},
    ]
    started = time.time()
    upgrade(cluster, f"operator.extraEnv={json.dumps(broken)}")
    seen_ready: set[str] = set()

    def new_pod() -> dict | None:
        pods = cluster.pods(NAMESPACE, operators)
        seen_ready.update(
            p["metadata"]["name"] for p in pods if is_ready(p) and p["metadata"]["name"] not in old
        )
        fresh = [p for p in pods if p["metadata"]["name"] not in old]
        return fresh[0] if len(fresh) == 1 else None

    def ran_a_while() -> dict | None:
        pod = new_pod()
        if pod is None:
            return None
        for status in (pod.get("status") or {}).get("containerStatuses") or []:
            running = (status.get("state") or {}).get("running")
            # Four readiness periods (5 s): long enough to have counted as available.
            if status.get("restartCount") or (
                running and time.time() - parse_time(running["startedAt"]) >= 20
            ):
                return pod
        return None

    pod = cluster.wait(
        "the new operator pod to run 20 s", ran_a_while, timeout_s=240, namespace=NAMESPACE
    )
    name = pod["metadata"]["name"]
    # Its probe answered, and said not Ready (the kubelet's event), rather than not answering.
    cluster.wait(
        f"a readiness probe of {name} answered 503",
        lambda: any(
            "statuscode: 503" in (event.get("message") or "")
            for event in cluster.items(
                "events", "-n", NAMESPACE, "--field-selector", f"involvedObject.name={name}"
            )
        ),
        timeout_s=60,
        namespace=NAMESPACE,
    )
    # The old replicas keep ticking: a status written since the upgrade.
    cluster.wait(
        "an autoscaler's status written by the old operators after the upgrade",
        lambda: any(
            parse_time(item.get("status", {}).get("lastTickTime", "1970-01-01T00:00:00Z")) > started
            for item in cluster.items("instancegroupautoscalers", "-n", NAMESPACE)
        ),
        timeout_s=150,
        namespace=NAMESPACE,
    )
    state = cluster.get("deployment", deployment, "-n", NAMESPACE)["status"]
    assert new_pod() is not None, "the rollout went past its first new pod"
    assert {p["metadata"]["name"] for p in cluster.ready_pods(NAMESPACE, operators)} == old
    assert not seen_ready, f"the broken operator pod was Ready: {seen_ready}"
    assert state.get("updatedReplicas") == 1, state
    assert state.get("availableReplicas") == 2, state

    # Fixed (the old template again): the broken pod goes, the old replicas stay.
    upgrade(cluster, "operator.extraEnv=[]")
    cluster.kubectl(
        "rollout", "status", f"deployment/{deployment}", "-n", NAMESPACE, "--timeout=240s",
        timeout=260,
    )  # fmt: skip
    cluster.wait(
        "the broken operator pod gone and both replicas Ready",
        lambda: (
            {p["metadata"]["name"] for p in cluster.pods(NAMESPACE, operators)}
            == {p["metadata"]["name"] for p in cluster.ready_pods(NAMESPACE, operators)}
            and len(cluster.ready_pods(NAMESPACE, operators)) == 2
        ),
        timeout_s=120,
        namespace=NAMESPACE,
    )


def upgrade(cluster: Cluster, value: str) -> None:
    """helm upgrade of the drills' release with one `--set-json`; conflicts forced, as after
    the scale-in drill `spec.replicas` of the Triton Deployment belongs to kubectl (it is
    back at the release's count)."""
    cluster.helm(
        "upgrade", hack_drills.RELEASE, str(CHART), "-n", NAMESPACE, "--reuse-values",
        "--force-conflicts", "--set-json", value,
    )  # fmt: skip


def parse_time(stamp: str) -> float:
    """An API server's RFC 3339 time (seconds, Z) as a Unix time."""
    return datetime.datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()


def test_an_oom_kill_loses_only_the_requests_of_the_moment_the_pod_died(drills: Subject) -> None:
    record = run(drills, "oom")
    detail = record.detail
    # What a failure is read from, as text (pytest cuts the repr of an object short): the
    # counts, and the gate's and the pod's conditions as watched, seconds after the kill.
    seen = json.dumps({
        key: detail.get(key)
        for key in (
            "reason", "counts_when_back", "conditions_when_back", "gate_closed_after_s",
            "container_restarted_after_s", "gate_reopened_after_s",
            "ready_while_gate_closed", "failed_outside_window", "pod_changes",
        )
    })  # fmt: skip
    assert detail["reason"] == "OOMKilled" and detail["exit_code"] == 137, seen
    assert detail["failed_outside_window"] == 0, seen
    # The gate closed while Triton restarted: back in the Service at its peers' counts.
    assert detail["gate_closed_meanwhile"], seen
    # Every change of the pod, watched: Ready while its gate was closed only for the
    # kubelet's moments (hack.drills.KUBELET_READY_BOUND_S says why), and never left so.
    assert detail["ready_while_gate_closed_max_s"] <= hack_drills.KUBELET_READY_BOUND_S, seen
    assert not detail["ready_while_gate_closed_unended"], seen
    # Not the repository's 1: branch_embed's floor is 2 (other counts may have moved with the
    # load while the pod was away, so only the floor is certain).
    assert detail["counts_when_back"]["branch_embed"] >= 2, seen
    assert record.passed, seen


def test_install_uninstall_cycles_leave_no_finalizer_to_the_hook(drills: Subject) -> None:
    record = run(drills, "finalizer")
    assert record.passed and record.detail["cycles"] == 3, record
    # The third cycle ran one Triton pod, the operator's loads and gate in flight.
    assert record.detail["cycles_with_triton_pod"] == 1, record
    assert record.detail["release_s_max_with_pod"] is not None, record
    assert record.detail["release_s_max"] < record.detail["hook_timeout_s"], record
