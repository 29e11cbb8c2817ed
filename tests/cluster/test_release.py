"""The chart on a real API server, with helm 4: one release, from install to uninstall.

The release lives in a namespace that enforces the restricted PodSecurity level and holds a
ResourceQuota on CPU and memory; the real node runs its pods as containers of the images
`make images` built, pulled from the node's registry (tritonserver, `tritonscale operator`
with its own service account, Locust). The tests run in this file's order,
each leaving the release as the next one expects: installed, rejecting bad autoscalers,
reconciling, passing `helm test`, scaled to two pods, under load and after, restarted
after a crash, upgraded, split over two operator shards, and finally uninstalled with nothing
left behind.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests
import yaml

from tests.chart.helm import CHART, REPO_ROOT
from tests.cluster.harness import (
    Cluster,
    Done,
    ServiceLoad,
    Stopwatch,
    is_ready,
    live_counts,
    restricted_namespace,
    served_requests,
    wait_namespace_gone,
    wait_release_gone,
)
from tritonscale.control.pod_sets import owner
from tritonscale.triton import metrics_text

NAMESPACE = "e2e-helm4"
RELEASE = "demo"
VALUES = Path(__file__).parent / "e2e-values.yaml"
INSTANCE = f"app.kubernetes.io/instance={RELEASE}"
TRITON = f"{INSTANCE},app.kubernetes.io/component=triton"
TRITON_DEPLOYMENT = f"{RELEASE}-tritonscale-triton"
READINESS_GATE = "tritonscale.io/instances-ready"
OPERATOR_ACCOUNT = f"{RELEASE}-tritonscale-operator"
# model -> minInstances, as e2e-values.yaml sets them
MINIMUM = {"pipeline_async": 1, "branch_embed": 2, "branch_classify": 1, "branch_rank": 1}
CRD = yaml.safe_load((CHART / "crds" / "instancegroupautoscalers.yaml").read_text())
SPEC_SCHEMA = CRD["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
QUOTA = {
    "apiVersion": "v1",
    "kind": "ResourceQuota",
    "metadata": {"name": "compute"},
    # Every pod must then state CPU and memory requests and a memory limit.
    "spec": {
        "hard": {
            "requests.cpu": "8",
            "requests.memory": "24Gi",
            "limits.memory": "64Gi",
            "pods": "30",
        }
    },
}
SHM_REGION = "triton_python_backend_shm_region_"


def autoscalers(cluster: Cluster) -> dict[str, dict[str, Any]]:
    """The release's autoscalers by model."""
    items = cluster.items("instancegroupautoscalers", "-n", NAMESPACE, "-l", INSTANCE)
    return {item["spec"]["model"]: item for item in items}


def counts_on_every_pod(cluster: Cluster, pods: int) -> dict[str, dict[str, int | None]] | None:
    """model -> pod -> live count, once exactly `pods` Triton pods are ready."""
    ready = cluster.ready_pods(NAMESPACE, TRITON)
    if len(ready) != pods:
        return None
    return {model: live_counts(ready, model) for model in MINIMUM}


@pytest.fixture(scope="module")
def release(cluster: Cluster) -> Iterator[Cluster]:
    restricted_namespace(cluster, NAMESPACE)
    cluster.kubectl("apply", "-n", NAMESPACE, "-f", "-", stdin=json.dumps(QUOTA))
    with Stopwatch(cluster.timings, "helm install to every pod Ready"):
        cluster.helm(
            "install", RELEASE, str(CHART), "-n", NAMESPACE, "-f", str(VALUES),
            *cluster.image_values(),
        )  # fmt: skip
        cluster.wait(
            "the release's pods (Triton and the operator) to be Ready",
            lambda: (
                (pods := cluster.pods(NAMESPACE, INSTANCE))
                and len(pods) == 2
                and all(is_ready(pod) for pod in pods)
            ),
            timeout_s=420,
            namespace=NAMESPACE,
        )
    yield cluster
    # Whatever a failed test left: go, without waiting on an operator's finalizer.
    if cluster.run("kubectl", "get", "namespace", NAMESPACE).returncode == 0:
        cluster.run("helm", "uninstall", RELEASE, "-n", NAMESPACE, "--timeout", "2m")
        for name in cluster.run(
            "kubectl", "get", "iga", "-n", NAMESPACE, "-o", "name"
        ).stdout.split():
            cluster.run("kubectl", "patch", name, "-n", NAMESPACE, "--type=merge",
                        "-p", '{"metadata":{"finalizers":null}}')  # fmt: skip
        cluster.run("kubectl", "delete", "namespace", NAMESPACE, "--wait=false")


def test_install_admits_every_pod_into_a_restricted_namespace(release: Cluster) -> None:
    crd = release.get("crd", "instancegroupautoscalers.tritonscale.io")
    conditions = {c["type"]: c["status"] for c in crd["status"]["conditions"]}
    assert conditions["Established"] == "True" and conditions["NamesAccepted"] == "True"
    assert sorted(autoscalers(release)) == sorted(MINIMUM)
    pods = release.pods(NAMESPACE, INSTANCE)
    components = sorted(p["metadata"]["labels"]["app.kubernetes.io/component"] for p in pods)
    assert components == ["operator", "triton"] and all(is_ready(p) for p in pods)
    # PodSecurity and the quota refuse pods at creation: their controller records it.
    refused = release.items("events", "-n", NAMESPACE, "--field-selector", "reason=FailedCreate")
    assert refused == []
    header = release.kubectl("get", "iga", "-n", NAMESPACE).splitlines()[0].split()
    assert header == ["NAME", "MODEL", "MIN", "MAX", "CURRENT", "DESIRED", "AGE"]
    wide = release.kubectl("get", "iga", "-n", NAMESPACE, "-o", "wide").splitlines()[0].split()
    assert wide == ["NAME", "MODEL", "MIN", "MAX", "CURRENT", "DESIRED", "REASON", "AGE"]


def _rule_message(rule_part: str) -> str:
    """The message of the spec's CEL rule whose expression holds `rule_part`."""
    (rule,) = [r for r in SPEC_SCHEMA["x-kubernetes-validations"] if rule_part in r["rule"]]
    return rule["message"]


# case -> (spec fields, what the API server must say)
INVALID = {
    "min above max": (
        {"minInstances": 5, "maxInstances": 2},
        _rule_message("self.minInstances <= self.maxInstances"),
    ),
    # The rule's messageExpression, evaluated: 'must not name the model itself (' + model + ')'
    "a model that calls itself": (
        {"calls": ["branch_embed"]},
        "must not name the model itself (branch_embed)",
    ),
    "an empty selector": ({"selector": {}}, _rule_message("size(self.selector.matchLabels)")),
}


def autoscaler(name: str, **spec: Any) -> str:
    body = {
        "apiVersion": "tritonscale.io/v1alpha1",
        "kind": "InstanceGroupAutoscaler",
        "metadata": {"name": name},
        "spec": {
            "selector": {"matchLabels": {"app.kubernetes.io/component": "nothing"}},
            "model": "branch_embed",
            **spec,
        },
    }
    return json.dumps(body)


@pytest.mark.parametrize("case", sorted(INVALID))
def test_the_api_server_rejects_an_invalid_autoscaler_with_the_crds_message(
    release: Cluster, case: str
) -> None:
    spec, message = INVALID[case]
    done = release.run(
        "kubectl", "create", "-n", NAMESPACE, "-f", "-", stdin=autoscaler("bad", **spec)
    )
    assert done.returncode != 0, f"{case} was admitted"
    assert message in done.output


def test_a_valid_autoscaler_is_admitted(release: Cluster) -> None:
    # The counterpart of the rejections: the same object with a sound spec goes in.
    release.kubectl(
        "create", "-n", NAMESPACE, "--dry-run=server", "-f", "-", stdin=autoscaler("good")
    )


def test_the_operator_reconciles_with_status_conditions_and_events(release: Cluster) -> None:
    def reconciled() -> dict[str, dict[str, Any]] | None:
        found = autoscalers(release)
        for model, item in found.items():
            status = item.get("status") or {}
            if status.get("currentInstances") != MINIMUM[model]:
                return None
            if not {"AbleToScale", "ScalingActive"} <= {
                c["type"] for c in status.get("conditions", [])
            }:
                return None
        return found

    found = release.wait(
        "every autoscaler's status to show its minimum as the current count",
        reconciled,
        timeout_s=180,
        namespace=NAMESPACE,
    )
    embed = found["branch_embed"]["metadata"]["name"]
    described = release.kubectl("describe", "iga", embed, "-n", NAMESPACE)
    for pattern in ("Conditions:", "AbleToScale", r"Current Instances:\s+2\n", "Events:"):
        assert re.search(pattern, described), described
    # From the repository's 1 instance to its minimum of 2: the operator said so.
    release.wait(
        "the operator's SucceededRescale event on branch_embed",
        lambda: "SucceededRescale" in release.kubectl("describe", "iga", embed, "-n", NAMESPACE),
        timeout_s=30,
        namespace=NAMESPACE,
    )


def test_helm_test_passes(release: Cluster) -> None:
    out = release.helm("test", RELEASE, "-n", NAMESPACE, "--timeout", "3m", timeout=240)
    assert "Phase:          Succeeded" in out, out


def test_a_second_triton_pod_joins_the_service_only_at_its_peers_count(release: Cluster) -> None:
    """Scale 1 -> 2 under load sent to the Service's cluster IP (kube-proxy routes it to the
    ready endpoints): the new pod starts at the repository's counts (branch_embed 1, its peer 2), so its
    readinessGate holds it out of the Service's endpoints, and it answers no request, until the
    operator has brought it to its peer's counts; then the Service sends it traffic."""
    (first,) = release.ready_pods(NAMESPACE, TRITON)
    with ServiceLoad(release, NAMESPACE, TRITON_DEPLOYMENT, "pipeline_async") as load:
        release.wait(
            "the load through the Service to be answered",
            lambda: load.answered >= 20 or None,
            timeout_s=120,
            namespace=NAMESPACE,
        )
        served_while_closed: list[float] = []
        listed_while_closed: list[str] = []

        def opened() -> dict[str, Any] | None:
            """The new pod once its gate is open; meanwhile what it served and whether the
            Service listed it (each read before the gate, so it was read while closed)."""
            new = [
                p
                for p in release.pods(NAMESPACE, TRITON)
                if p["metadata"]["name"] != first["metadata"]["name"]
            ]
            address = new[0]["status"].get("podIP") if new else None
            if not address:
                return None
            ready_endpoints = list(load.ready)
            served = served_requests(address, "pipeline_async")
            pod = release.get("pod", new[0]["metadata"]["name"], "-n", NAMESPACE)
            gate = next(
                (c for c in pod["status"].get("conditions") or [] if c["type"] == READINESS_GATE),
                None,
            )
            if gate is not None and gate["status"] == "True":
                return pod
            if served is not None:
                served_while_closed.append(served)
            if address in ready_endpoints:
                listed_while_closed.append(address)
            return None

        with Stopwatch(release.timings, "scale to 2 under load: new pod's gate open"):
            release.kubectl(
                "scale", "deployment", TRITON_DEPLOYMENT, "-n", NAMESPACE, "--replicas=2"
            )
            newest = release.wait(
                "the new Triton pod's readinessGate to open", opened, timeout_s=300,
                namespace=NAMESPACE, every_s=0.5,
            )  # fmt: skip
        address = newest["status"]["podIP"]
        release.wait(
            "the Service to send the new pod requests, and the pod to answer them",
            lambda: (served_requests(address, "pipeline_async") or 0) > 0,
            timeout_s=120,
            namespace=NAMESPACE,
        )
        counts = release.wait(
            "both Triton pods ready with the same counts of every model",
            lambda: (
                (c := counts_on_every_pod(release, 2))
                and all(len(set(c[m].values())) == 1 and None not in c[m].values() for m in c)
                and c
            ),
            timeout_s=120,
            namespace=NAMESPACE,
        )
    # The new pod answered Triton's own metrics while its gate was closed: it had served nothing.
    assert served_while_closed, "the new pod's metrics were never read while its gate was closed"
    assert max(served_while_closed) == 0, served_while_closed
    assert listed_while_closed == [], "the Service listed the new pod before its gate opened"
    assert min(counts["branch_embed"].values()) >= MINIMUM["branch_embed"]
    assert load.answered > 0 and len(load.errors) <= load.answered // 10, load.errors[:5]
    newest = release.get("pod", newest["metadata"]["name"], "-n", NAMESPACE)  # Ready by now
    conditions = {c["type"]: c for c in newest["status"]["conditions"]}
    assert conditions[READINESS_GATE]["reason"] == "InstancesMatch", conditions
    # RFC 3339 times in UTC compare as strings: Ready followed the gate, never preceded it.
    assert conditions["Ready"]["status"] == "True", conditions
    assert (
        conditions["Ready"]["lastTransitionTime"]
        >= conditions[READINESS_GATE]["lastTransitionTime"]
    ), conditions


def upgrade(cluster: Cluster, *sets: str) -> None:
    """helm upgrade with the release's values and `sets`, keeping the two Triton pods.

    Helm 4 applies server-side: after `kubectl scale`, spec.replicas belongs to kubectl and
    an upgrade conflicts on it, so the upgrade names the same count and takes it back.
    """
    args = ["--set", "triton.replicaCount=2"]
    for item in sets:
        args += ["--set", item]
    cluster.helm(
        "upgrade", RELEASE, str(CHART), "-n", NAMESPACE, "--reuse-values", "--force-conflicts",
        *args,
    )  # fmt: skip


def wait_load_end(cluster: Cluster, quiet_s: float = 5.0) -> float:
    """The monotonic time of the last read at which the Triton pods' answered pipeline
    requests had grown, once they have held still for `quiet_s`: when the load ended."""
    last: dict[str, float] = {"total": -1.0, "grew_at": time.monotonic()}

    def held_still() -> float | None:
        addresses = [pod["status"]["podIP"] for pod in cluster.ready_pods(NAMESPACE, TRITON)]
        total = sum(served_requests(address, "pipeline_async") or 0.0 for address in addresses)
        now = time.monotonic()
        if total != last["total"]:
            last.update(total=total, grew_at=now)
            return None
        return last["grew_at"] if now - last["grew_at"] >= quiet_s else None

    return cluster.wait(
        f"the load to end (pipeline_async's answered requests unchanged for {quiet_s:.0f} s)",
        held_still,
        timeout_s=240,
        namespace=NAMESPACE,
    )


def test_under_load_the_count_rises_on_every_pod_and_falls_after(release: Cluster) -> None:
    # The chart's own Locust (a headless master Job, workers) drives the pipeline through
    # the Triton Service: admitted under the restricted level, it also proves the pods'
    # seccomp profile.
    addresses = [pod["status"]["podIP"] for pod in release.ready_pods(NAMESPACE, TRITON)]
    before = {address: served_requests(address, "pipeline_async") for address in addresses}
    assert None not in before.values(), before
    # kube-proxy balances connections, and each Locust user keeps one of its own
    # (loadtests/bls.py: grpc_channel_args): enough users that both pods get a fair share
    # whatever the draw (with 64, a pod with under 30 % of the connections is a 1-in-500
    # draw, and the served shares are closer than the connections': the pods share the
    # node's CPUs, so the busier one answers each of its connections more slowly).
    upgrade(
        release, "locust.enabled=true", "locust.workers=2", "locust.users=64",
        "locust.spawnRate=64",
    )  # fmt: skip
    started = time.monotonic()

    def above_minimum() -> tuple[str, dict[str, int | None]] | None:
        counts = counts_on_every_pod(release, 2) or {}
        for model, per_pod in counts.items():
            if per_pod and all(
                count is not None and count > MINIMUM[model] for count in per_pod.values()
            ):
                return model, per_pod
        return None

    model, risen = release.wait(
        "a model's count above its minimum on both Triton pods, under load",
        above_minimum,
        timeout_s=240,
        namespace=NAMESPACE,
    )
    release.timings["load start to a higher count on both pods"] = round(
        time.monotonic() - started, 1
    )
    # The load's end is the last moment the pods answered a request: the Job completes
    # later (Locust's shutdown, the controller's sync), by when the counts may long be down.
    load_ended = wait_load_end(release)
    release.wait(
        "every model back at its minimum on both pods after the load",
        lambda: (
            (c := counts_on_every_pod(release, 2))
            and all(set(c[m].values()) == {MINIMUM[m]} for m in MINIMUM)
        ),
        timeout_s=240,
        namespace=NAMESPACE,
    )
    release.timings["load end to every count back down on both pods"] = round(
        time.monotonic() - load_ended, 1
    )
    served = {a: (served_requests(a, "pipeline_async") or 0) - (before[a] or 0) for a in addresses}
    total = sum(served.values())
    if not (total > 0 and all(count > 0.3 * total for count in served.values())):
        rules = subprocess.run(["iptables", "-t", "nat", "-S"], capture_output=True, text=True)
        routes = [line for line in rules.stdout.splitlines() if NAMESPACE in line]
        raise AssertionError(
            f"Locust's requests through the Service, per pod: {served} (before: {before})\n"
            + "\n".join(routes)
            + "\n"
            + release.kubectl("get", "endpointslices,pods", "-n", NAMESPACE, "-o", "wide")
        )
    # The master's Job is named after a hash of its run: found by its labels.
    masters = f"{INSTANCE},tritonscale.io/locust-role=master"
    release.wait(
        "the Locust master Job to complete its run",
        lambda: [
            job
            for job in release.items("jobs", "-n", NAMESPACE, "-l", masters)
            if (job.get("status") or {}).get("succeeded")
        ],
        timeout_s=120,
        namespace=NAMESPACE,
    )
    assert max(risen.values()) > MINIMUM[model]
    upgrade(release, "locust.enabled=false")


def test_a_crashed_triton_leaves_no_stale_shared_memory_in_its_pod(release: Cluster) -> None:
    # /dev/shm is the pod's Memory emptyDir: it outlives the container. Killing tritonserver
    # kills its backend stubs with it (as the end of a container's PID 1 does); without the
    # chart's start line their regions would stay and pile up with every restart.
    pod = release.ready_pods(NAMESPACE, TRITON)[0]
    name = pod["metadata"]["name"]

    def regions() -> set[str]:
        listing = release.kubectl("exec", name, "-n", NAMESPACE, "-c", "tritonserver", "--",
                                  "ls", "/dev/shm")  # fmt: skip
        return {entry for entry in listing.split() if entry.startswith(SHM_REGION)}

    before = regions()
    assert before, "a running Triton with Python models holds shared-memory regions"
    restarts = pod["status"]["containerStatuses"][0]["restartCount"]
    # From the host: inside its pid namespace, tritonserver is PID 1, which ignores SIGKILL
    # sent from there.
    os.kill(release.container_pid(NAMESPACE, name, "tritonserver"), signal.SIGKILL)
    restarted = release.wait(
        "the killed tritonserver to be restarted and Ready",
        lambda: (
            (p := release.get("pod", name, "-n", NAMESPACE))
            and p["status"]["containerStatuses"][0]["restartCount"] == restarts + 1
            and is_ready(p)
            and p
        ),
        timeout_s=240,
        namespace=NAMESPACE,
    )
    last = restarted["status"]["containerStatuses"][0]["lastState"]["terminated"]
    assert last["exitCode"] == 128 + signal.SIGKILL
    after = regions()
    # One region per Python stub: the new server has its own (as many as its instances).
    assert after, "the restarted Triton holds shared-memory regions of its own"
    assert not before & after, f"{len(before & after)} regions of the killed server remain"


def test_kubectl_logs_exec_and_port_forward_reach_triton(release: Cluster) -> None:
    """What users reach for first, through the API server to the kubelet: the container's
    output, a shell's view of its confinement and its cgroup's memory limit, and a port."""
    name = release.ready_pods(NAMESPACE, TRITON)[0]["metadata"]["name"]
    logs = release.kubectl("logs", name, "-n", NAMESPACE, "-c", "tritonserver")
    assert "Started HTTPService at 0.0.0.0:8000" in logs, logs[-2000:]

    def exec_(*command: str) -> Done:
        return release.run("kubectl", "exec", name, "-n", NAMESPACE, "-c", "tritonserver",
                           "--", *command)  # fmt: skip

    status = exec_("cat", "/proc/1/status").stdout
    fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
    assert fields["Uid"].split() == ["1000"] * 4, fields["Uid"]  # the chart's Triton user
    assert int(fields["CapEff"], 16) == 0 and fields["Seccomp"].strip() == "2", fields
    written = exec_("touch", "/written")
    assert written.returncode != 0 and "Read-only file system" in written.output
    limit = exec_("sh", "-c", "cat /sys/fs/cgroup/memory.max 2>/dev/null "
                              "|| cat /sys/fs/cgroup/memory/memory.limit_in_bytes")  # fmt: skip
    assert int(limit.stdout) == 4 * 2**30, limit.output  # e2e-values.yaml's limit

    command = [release.tools["kubectl"], "--kubeconfig", str(release.kubeconfig),
               "port-forward", "-n", NAMESPACE, f"pod/{name}", ":8000"]  # fmt: skip
    with subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          text=True) as forward:  # fmt: skip
        try:
            assert forward.stdout is not None
            line = forward.stdout.readline()  # "Forwarding from 127.0.0.1:PORT -> 8000"
            match = re.search(r"127\.0\.0\.1:(\d+) -> 8000", line)
            assert match, f"kubectl port-forward said: {line!r}"
            ready = requests.get(f"http://127.0.0.1:{match[1]}/v2/health/ready", timeout=10)
            assert ready.status_code == 200
        finally:
            forward.terminate()


def test_an_upgrade_rolls_out_and_the_new_pods_are_tuned(release: Cluster) -> None:
    old = {p["metadata"]["name"] for p in release.pods(NAMESPACE, TRITON)}
    with Stopwatch(release.timings, "helm upgrade: rollout of 2 pods done and tuned"):
        upgrade(release, "triton.logVerbose=1")
        release.kubectl(
            "rollout", "status", f"deployment/{TRITON_DEPLOYMENT}", "-n", NAMESPACE,
            "--timeout=360s", timeout=400,
        )  # fmt: skip
        counts = release.wait(
            "the new Triton pods ready, with every model at its minimum",
            lambda: (
                (c := counts_on_every_pod(release, 2))
                and not old & set(c["branch_embed"])
                and all(set(c[m].values()) == {MINIMUM[m]} for m in MINIMUM)
                and c
            ),
            timeout_s=240,
            namespace=NAMESPACE,
        )
    args = release.get("deployment", TRITON_DEPLOYMENT, "-n", NAMESPACE)["spec"]["template"]
    assert "--log-verbose=1" in args["spec"]["containers"][0]["args"]
    assert set(counts["branch_embed"].values()) == {2}


# What the operator's ServiceAccount may do in its namespace, asked of the API server.
# docs/rbac.md shows this table; the test fails when the two differ.
CAN_I = [
    ("list", "instancegroupautoscalers.tritonscale.io", True),
    ("watch", "instancegroupautoscalers.tritonscale.io", True),
    ("patch", "instancegroupautoscalers.tritonscale.io", True),
    ("patch", "instancegroupautoscalers.tritonscale.io/status", True),
    ("list", "pods", True),
    ("watch", "pods", True),
    ("create", "events", True),
    ("get", "instancegroupautoscalers.tritonscale.io", False),
    ("update", "instancegroupautoscalers.tritonscale.io", False),
    ("create", "instancegroupautoscalers.tritonscale.io", False),
    ("delete", "instancegroupautoscalers.tritonscale.io", False),
    ("get", "pods", False),
    ("delete", "pods", False),
    ("create", "pods/exec", False),
    ("patch", "events", False),
    ("get", "secrets", False),
    ("list", "secrets", False),
    ("patch", "deployments.apps", False),
    ("list", "namespaces", False),
    ("list", "customresourcedefinitions.apiextensions.k8s.io", False),
]
RBAC_DOC = REPO_ROOT / "docs" / "rbac.md"


def can_i_table(rows: list[tuple[str, str, bool]]) -> str:
    lines = ["| verb | resource | allowed |", "|---|---|---|"]
    lines += [
        f"| `{verb}` | `{resource}` | {'yes' if ok else 'no'} |" for verb, resource, ok in rows
    ]
    return "\n".join(lines)


def test_the_operators_rbac_is_what_docs_rbac_md_says(release: Cluster) -> None:
    account = f"system:serviceaccount:{NAMESPACE}:{OPERATOR_ACCOUNT}"
    answers = []
    for verb, resource, _ in CAN_I:
        done = release.run(
            "kubectl", "auth", "can-i", verb, resource, "-n", NAMESPACE, "--as", account
        )
        assert done.stdout.strip() in ("yes", "no"), done.output
        answers.append((verb, resource, done.stdout.strip() == "yes"))
    assert answers == CAN_I
    assert can_i_table(CAN_I) in RBAC_DOC.read_text(), (
        f"docs/rbac.md must show this table of `kubectl auth can-i`:\n{can_i_table(CAN_I)}"
    )


# Shards: an autoscaler that selects no pod is a pod set of its own (its tick finds no ready
# pod and says so), which the stable hash gives to the shard that does not own the release's
# set (tritonscale.control.pod_sets.owner: set-a8a3b5c9c2 is shard 0's of two, the release's
# set-996b985d0f shard 1's).
IDLE_AUTOSCALER = "idle-shard-probe"
IDLE_INTERVAL_S = 15
OPERATOR = f"{INSTANCE},app.kubernetes.io/component=operator"
LAST_TICK = "tritonscale_last_reconcile_timestamp_seconds"


def last_ticks(pod: dict[str, Any]) -> dict[str, float] | None:
    """autoscaler -> its last tick's end (unix seconds), as the operator process in `pod`
    exports them: the autoscalers this process ticked since it started. None while it does
    not answer."""
    try:
        text = requests.get(f"http://{pod['status']['podIP']}:9102/metrics", timeout=5).text
    except (requests.RequestException, KeyError):
        return None
    return {
        dict(labels)["autoscaler"]: value
        for (_name, labels), value in metrics_text.parse_metrics(text, {LAST_TICK}).items()
    }


def test_two_shards_split_the_sets_and_a_killed_shard_ticks_its_own_again(
    release: Cluster,
) -> None:
    """With operator.shards=2 each set has one owner (status.podSet.shard, and only its owner's
    process ticks it); a shard killed with SIGKILL is restarted by the kubelet and ticks its
    sets again within two of their intervals, while the other shard never touches them."""
    release.kubectl(
        "create", "-n", NAMESPACE, "-f", "-",
        stdin=autoscaler(
            IDLE_AUTOSCALER,
            selector={"matchLabels": {"app.kubernetes.io/component": "idle"}},
            intervalSeconds=IDLE_INTERVAL_S,
        ),
    )  # fmt: skip
    try:
        upgrade(release, "operator.shards=2")
        shards = {f"{RELEASE}-tritonscale-operator-{i}" for i in range(2)}
        release.wait(
            "the operator's two shard pods Ready, and the Deployment's pod gone",
            lambda: (
                (pods := release.pods(NAMESPACE, OPERATOR))
                and {p["metadata"]["name"] for p in pods} == shards
                and all(is_ready(p) for p in pods)
            ),
            timeout_s=240,
            namespace=NAMESPACE,
        )
        names = [*(a["metadata"]["name"] for a in autoscalers(release).values()), IDLE_AUTOSCALER]

        def split() -> dict[str, int] | None:
            """autoscaler -> its set's owner, once every status names it (`i/2`)."""
            owners = {}
            for item in release.items("instancegroupautoscalers", "-n", NAMESPACE):
                pod_set = (item.get("status") or {}).get("podSet") or {}
                if "name" not in pod_set:
                    return None
                shard = owner(pod_set["name"], 2)
                if pod_set.get("shard") != f"{shard}/2":
                    return None
                owners[item["metadata"]["name"]] = shard
            return owners if sorted(owners) == sorted(names) else None

        owners = release.wait(
            "every autoscaler's status.podSet.shard to name its set's owner of two",
            split,
            timeout_s=60,
            namespace=NAMESPACE,
        )
        assert set(owners.values()) == {0, 1}, f"one shard owns every set: {owners}"
        idle_shard = owners[IDLE_AUTOSCALER]
        pod_of = {i: f"{RELEASE}-tritonscale-operator-{i}" for i in range(2)}

        def ticked_by_owners() -> dict[int, dict[str, float]] | None:
            """Each shard's exported ticks, once they are those of its own autoscalers."""
            seen = {}
            for shard, pod in pod_of.items():
                ticks = last_ticks(release.get("pod", pod, "-n", NAMESPACE))
                if ticks is None or set(ticks) != {n for n, o in owners.items() if o == shard}:
                    return None
                seen[shard] = ticks
            return seen

        before = release.wait(
            "each shard's process to export the ticks of its own autoscalers, and only those",
            ticked_by_owners,
            timeout_s=2 * IDLE_INTERVAL_S,
            namespace=NAMESPACE,
        )
        victim = release.get("pod", pod_of[idle_shard], "-n", NAMESPACE)
        restarts = victim["status"]["containerStatuses"][0]["restartCount"]
        killed_at = time.time()
        os.kill(release.container_pid(NAMESPACE, pod_of[idle_shard], "operator"), signal.SIGKILL)
        started = time.monotonic()

        def ticking_again() -> dict[int, dict[str, float]] | None:
            pod = release.get("pod", pod_of[idle_shard], "-n", NAMESPACE)
            if pod["status"]["containerStatuses"][0]["restartCount"] != restarts + 1:
                return None
            seen = ticked_by_owners()
            if seen is None or min(seen[idle_shard].values()) <= killed_at:
                return None
            return seen

        after = release.wait(
            f"the killed shard {idle_shard}, restarted, to tick each of its sets again within "
            "two intervals, and the other shard none of them",
            ticking_again,
            timeout_s=2 * IDLE_INTERVAL_S,
            namespace=NAMESPACE,
            every_s=0.5,
        )
        release.timings["a killed shard: SIGKILL to its sets ticked again"] = round(
            time.monotonic() - started, 1
        )
        # The other shard went on with its own sets meanwhile.
        other = 1 - idle_shard
        assert all(after[other][n] > before[other][n] for n in before[other]), (before, after)
    finally:
        # Gone while the shards run, which let it go; without them, without kopf's finalizer
        # (the namespace would wait for it otherwise).
        deleted = release.run(
            "kubectl", "delete", "iga", IDLE_AUTOSCALER, "-n", NAMESPACE, "--timeout=60s"
        )
        if deleted.returncode != 0:
            release.run("kubectl", "patch", "iga", IDLE_AUTOSCALER, "-n", NAMESPACE,
                        "--type=merge", "-p", '{"metadata":{"finalizers":null}}')  # fmt: skip


def test_uninstall_leaves_nothing_and_the_namespace_deletes(release: Cluster) -> None:
    with Stopwatch(release.timings, "helm uninstall to namespace gone"):
        release.helm(
            "uninstall", RELEASE, "-n", NAMESPACE, "--wait", "--timeout", "3m", timeout=240
        )
        wait_release_gone(release, NAMESPACE, INSTANCE)
        release.kubectl("delete", "namespace", NAMESPACE, "--wait=false")
        wait_namespace_gone(release, NAMESPACE)
