"""The quick day-2 drills (hack.drills --quick) on the session's real node, under load.

A release with the chart's own drain settings (preStop sleep, gRPC connections aged out)
and two operators with peering runs in its own namespace while Locust sends a steady
gRPC load to the Triton Service's cluster IP; each drill counts every request of its window
from Locust's request log. Rollout, scale-in and failover must lose none; the OOM kill may
lose only the requests of the moments the pod died in; the install/uninstall cycles must
find the operator releasing every finalizer itself. `make drills` runs every drill in full.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from hack import drills as hack_drills
from hack.demo_k8s import CHART, Kubectl
from tests.cluster.harness import Cluster, Stopwatch, restricted_namespace, wait_namespace_gone

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
