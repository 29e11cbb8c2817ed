"""Running the drills: one by one against a release under the steady load, each judged and
written to reports/drills/NAME.json; `run` does it all, from building the images to taking the
cluster down."""

from __future__ import annotations

import json
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict
from pathlib import Path
from typing import Any

import yaml

from hack import cluster, images, node
from hack.demo_k8s import CHART, VALUES, DemoError, Kubectl, image_values, merged, say
from hack.drills.apiserver import apiserver
from hack.drills.failover import failover
from hack.drills.finalizer import finalizer
from hack.drills.harness import (
    NAMESPACE,
    RELEASE,
    REPORTS,
    STATE,
    TARGET,
    USER_RATE,
    USERS,
    Drills,
    Load,
    Record,
    Settings,
    count_in_flight,
    note_failure_span,
    tally,
    tritonserver_exits,
)
from hack.drills.node_restart import node_restart
from hack.drills.oom import KUBELET_READY_BOUND_S, oom
from hack.drills.pod_delete import pod_delete
from hack.drills.rollout import rollout, rollout_over_http
from hack.drills.scale_in import scale_in

# The chart's own drain settings (preStop sleep 15 s, gRPC connections aged out after 8 s),
# which the drills exist to check; two operators with peering; a memory limit the OOM drill
# can reach.
DRILL_VALUES: dict[str, Any] = {
    "triton": {
        "preStopSleepSeconds": 15,
        "grpcMaxConnectionAgeSeconds": 8,
        "grpcMaxConnectionAgeGraceSeconds": 4,
        "exitTimeoutSeconds": 10,
        "terminationGracePeriodSeconds": 40,
        "resources": {"limits": {"memory": "3Gi"}},
    },
    "operator": {"replicaCount": 2, "peering": {"enabled": True, "lifetimeSeconds": 15}},
    "autoscalers": {
        # A shared instance budget: after a failover the new operator rebuilds its ledger
        # from the autoscalers' status.
        "budget": {"name": "pod", "instancesPerPod": 12},
        # Two from the start: a restarted Triton (the repository's one) has a count to be
        # brought back to before it rejoins.
        "models": {"branch_embed": {"minInstances": 2}},
    },
}
DRILLS = (
    "rollout",
    "rollout-http",
    "scale-in",
    "pod-delete",
    "failover",
    "apiserver",
    "node-restart",
    "oom",
    "finalizer",
)
# The drills that run under the load and return (record, start, end); rollout-http and
# finalizer have flows of their own in `run_drill`.
UNDER_LOAD: dict[str, Callable[[Drills], tuple[Record, float, float]]] = {
    "rollout": rollout,
    "scale-in": scale_in,
    "pod-delete": pod_delete,
    "failover": failover,
    "apiserver": apiserver,
    "node-restart": node_restart,
    "oom": oom,
}


def _outside_window(record: Record, failed: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The failed requests that began outside the drill's failure window (noted in its
    detail as a count)."""
    first, last = record.detail.pop("failure_window")
    outside = [r for r in failed if not first - 1 <= r["start"] <= last]
    record.detail["failed_outside_window"] = len(outside)
    return outside


def run_drill(drills: Drills, name: str, load: Load | None, values: dict[str, Any]) -> Record:
    """One drill, its request figures from the load's log, and its verdict."""
    if name == "finalizer":
        record, _, _ = finalizer(drills, values)
        record.passed = True  # a cycle that fails raises
        return record
    assert load is not None
    if name == "rollout-http":
        return rollout_over_http(drills, load)
    drills.settle()
    timeouts_before = drills.reload_timeouts()
    with tritonserver_exits(drills) as ended:
        record, start, end = UNDER_LOAD[name](drills)
    time.sleep(2)  # the requests in flight at the end finish
    record.reload_timeouts = drills.reload_timeouts() - timeouts_before
    requests = load.requests()
    failed = tally(record, requests, start, end, drills.settings.before_s)
    count_in_flight(record, requests, ended, start, end)
    note_failure_span(record, failed, start)
    if name == "oom":
        outside = _outside_window(record, failed)
        record.passed = (
            not outside
            and record.detail["reason"] == "OOMKilled"
            and (record.detail["counts_when_back"].get("branch_embed") or 0) >= 2
            and record.detail["gate_closed_meanwhile"]
            # Out of the Service while the gate was closed, but for the kubelet's moments.
            and record.detail["ready_while_gate_closed_max_s"] <= KUBELET_READY_BOUND_S
            and not record.detail["ready_while_gate_closed_unended"]
        )
    elif name == "apiserver" and "failure_window" in record.detail:
        record.passed = not _outside_window(record, failed)
    else:
        record.passed = record.requests_failed == 0
    record.passed = record.passed and record.requests_sent > 0 and record.reload_timeouts == 0
    return record


def install(k: Kubectl, namespace: str, values: dict[str, Any]) -> None:
    with tempfile.TemporaryDirectory(prefix="tritonscale-drills-") as folder:
        values_file = Path(folder) / "values.yaml"
        values_file.write_text(yaml.safe_dump(values))
        k("kubectl", "create", "namespace", namespace)
        k("kubectl", "label", "namespace", namespace,
          "pod-security.kubernetes.io/enforce=restricted")  # fmt: skip
        k("helm", "install", RELEASE, str(CHART), "-n", namespace, "-f", str(values_file),
          "--wait", "--timeout", "8m", timeout=500)  # fmt: skip


def release_values(registry_address: str) -> dict[str, Any]:
    return merged(VALUES, image_values(registry_address), DRILL_VALUES)


@contextmanager
def load_on(drills: Drills, folder: Path) -> Iterator[Load]:
    with Load(drills.service_ip(), folder / "requests.jsonl") as load:
        yield load


def table(records: Sequence[Record]) -> list[str]:
    def cell(value: Any) -> str:
        return "-" if value is None else str(value)

    lines = [
        f"{'drill':<14}{'sent':>7}{'failed':>8}{'in flight':>11}{'p95 before':>12}"
        f"{'p95 during':>12}{'recovery s':>12}{'reload t/o':>11}  passed"
    ]
    for r in records:
        lines.append(
            f"{r.drill:<14}{r.requests_sent:>7}{r.requests_failed:>8}"
            f"{cell(r.requests_in_flight_at_fault):>11}"
            f"{cell(r.p95_before_ms):>12}{cell(r.p95_during_ms):>12}{cell(r.recovery_s):>12}"
            f"{r.reload_timeouts:>11}  {'yes' if r.passed else 'NO'}"
        )
    return lines


def save_logs(k: Kubectl, namespace: str, report: str, folder: Path = REPORTS) -> Path:
    """Every container's log in the namespace, and its previous container's where it
    restarted, into reports/drills/REPORT-logs/: what a failed drill is read from."""
    into = folder / f"{report}-logs"
    into.mkdir(parents=True, exist_ok=True)
    for pod in k.items("pods", "-n", namespace):
        name = pod["metadata"]["name"]
        for status in (pod.get("status") or {}).get("containerStatuses") or []:
            container = status["name"]
            for previous in (False, True) if status.get("restartCount") else (False,):
                args = ["logs", name, "-n", namespace, "-c", container, "--timestamps"]
                try:
                    text = k("kubectl", *args, *(["--previous"] if previous else []), timeout=60)
                except DemoError as error:
                    text = str(error)
                suffix = ".previous" if previous else ""
                (into / f"{name}.{container}{suffix}.log").write_text(text)
    return into


def write_report(record: Record, name: str = "", folder: Path = REPORTS) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{name or record.drill}.json"
    path.write_text(json.dumps(asdict(record), indent=2) + "\n")
    return path


def run(names: Sequence[str], settings: Settings) -> list[Record]:
    say("building the images (reused when nothing changed)")
    images.build_all(python_image="")
    records: list[Record] = []
    try:
        cluster.up(STATE, Path(".tools"), say)
        address = (node.read_state(STATE) or {})["registry"]
        say(f"pushing the images: make push REGISTRY={address}/tritonscale")
        images.push(f"{address}/tritonscale", dry_run=False)
        k = Kubectl(STATE / "kubeconfig")
        values = release_values(address)
        say(f"helm install {RELEASE} into {NAMESPACE} (two Triton pods, two operators)")
        install(k, NAMESPACE, values)
        drills = Drills(k, STATE, settings)
        drills.wait_tuned(2)
        with tempfile.TemporaryDirectory(prefix="tritonscale-drills-") as folder:
            with load_on(drills, Path(folder)) as load:
                say(f"load: {USERS} users x {USER_RATE:g} requests/s to {TARGET} over gRPC")
                for number, name in enumerate(names):
                    say(f"drill {name} ...")
                    record = run_drill(drills, name, load, values)
                    records.append(record)
                    # A drill named more than once: NAME.json, NAME-2.json...
                    runs = names[:number].count(name)
                    report = f"{record.drill}-{runs + 1}" if runs else record.drill
                    if not record.passed:
                        say(f"  the pods' logs: {save_logs(k, NAMESPACE, report)}")
                    say(f"  {table([record])[1].strip()}  -> {write_report(record, report)}")
        k("helm", "uninstall", RELEASE, "-n", NAMESPACE, "--wait", "--timeout", "3m", timeout=200)
    finally:
        say("taking the cluster down")
        cluster.down(STATE, say)
    return records
