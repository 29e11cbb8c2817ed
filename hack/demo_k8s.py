"""`make demo-k8s`: the chart on a real API server, under a step load, in one command.

1. The images (`make images`: reused when nothing changed) and the local cluster
   (`hack.cluster up`: the control plane and a real node with containerd, the kubelet,
   kube-proxy, kube-scheduler, CoreDNS and a registry; the first run builds them, with
   progress lines; root needed); the images pushed to the node's registry as the README says
   (`make push REGISTRY=<registry>/tritonscale`).
2. `helm install` in CPU mode into a namespace that enforces the restricted PodSecurity
   level, every image pulled from that registry (`global.imageRegistry`): two Triton pods
   and the operator, with autoscaler windows of seconds.
3. `helm upgrade` turns the chart's Locust on: a headless master and a worker run
   loadtests/bls.py against pipeline_async with `--shape step` (STEP_USERS more users every
   STEP_SECONDS), as the chart's values say; then the load ends and the counts come down.
4. While it runs: the `kubectl` lines to watch it, and a line every few seconds. At the end
   a table per phase: req/s (Triton's request counter over the phase, every pod), p95
   (Triton's request-latency summary, its sliding window, at the phase's end, the worse pod)
   and the instance counts per pod; the requests each pod served (kube-proxy spreads
   Locust's connections over both); and how long the operator took to raise a count on both
   pods once the load began.
5. `helm uninstall`, the namespace deleted, `hack.cluster down`: nothing is left running,
   also after Ctrl-C or a failure.

    python -m hack.demo_k8s   # from a checkout, after `make tools` (`make demo-k8s` does both)
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from prometheus_client.parser import text_string_to_metric_families

from hack import cluster, images, kubernetes_build, node, registry
from tritonscale.triton.actuator import instance_count

# The demo runs from a checkout: its files, relative to the current directory.
CHART = Path("charts/tritonscale")
TOOLS = Path(".tools")
STATE = Path(".cluster-demo")
NAMESPACE = "tritonscale-demo"
RELEASE = "demo"
TARGET = "pipeline_async"
MINIMUM = {"pipeline_async": 1, "branch_embed": 1, "branch_classify": 1, "branch_rank": 1}
STEP_USERS = 4
STEP_SECONDS = 30
STEPS = 3
AFTER_SECONDS = 45  # past the scale-down stabilization window
SAMPLE_S = 3.0
TRITON = f"app.kubernetes.io/instance={RELEASE},app.kubernetes.io/component=triton"
VALUES: dict[str, Any] = {
    "triton": {
        "replicaCount": 2,
        "gpu": {"enabled": False},
        "summaryLatencies": True,
        "resources": {"requests": {"cpu": "250m", "memory": "512Mi"}, "limits": {"memory": "4Gi"}},
        "exitTimeoutSeconds": 5,
        "preStopSleepSeconds": 1,
        "grpcMaxConnectionAgeSeconds": 0,
        "terminationGracePeriodSeconds": 15,
        "probes": {
            "startup": {"periodSeconds": 2, "failureThreshold": 150},
            "readiness": {"periodSeconds": 2},
        },
    },
    "autoscalers": {
        "defaults": {
            "intervalSeconds": 2,
            "metricsWindowSeconds": 10,
            "behavior": {
                "scaleUp": {
                    "stabilizationWindowSeconds": 0,
                    "selectPolicy": "Max",
                    "policies": [{"type": "Instances", "value": 4, "periodSeconds": 5}],
                },
                "scaleDown": {
                    "stabilizationWindowSeconds": 15,
                    "selectPolicy": "Max",
                    "policies": [{"type": "Instances", "value": 4, "periodSeconds": 5}],
                },
            },
        },
        "models": {
            "pipeline_async": {
                "calls": ["branch_embed", "branch_classify", "branch_rank"],
                "maxInstances": 4,
            },
            "branch_embed": {},
            "branch_classify": {},
            "branch_rank": {},
        },
    },
}
LOCUST: dict[str, Any] = {
    "enabled": True,
    "headless": True,
    "workers": 1,
    "users": STEP_USERS * STEPS,
    "spawnRate": STEP_USERS,
    "runTime": f"{STEP_SECONDS * STEPS}s",
    "resources": {"requests": {"cpu": "100m", "memory": "128Mi"}, "limits": {"memory": "1Gi"}},
    "extraArgs": [
        f"--workload={TARGET}",
        "--shape=step",
        f"--step-users={STEP_USERS}",
        f"--step-time={STEP_SECONDS}",
    ],
}


class DemoError(RuntimeError):
    """The demo cannot go on; one line for a person."""


# What bringing up and driving the local cluster raises for a person to read: one line each.
CLUSTER_ERRORS = (
    DemoError,
    cluster.ClusterError,
    node.NodeError,
    registry.RegistryError,
    images.ImageError,
)


@dataclass
class PhaseRow:
    name: str
    seconds: float
    requests: float = 0.0
    p95_ms: float | None = None
    counts: dict[str, dict[str, int | None]] = field(default_factory=dict)  # pod -> model -> n


def say(line: str) -> None:
    print(line, flush=True)


class Kubectl:
    """kubectl and helm from .tools against one kubeconfig; a failure is a DemoError."""

    def __init__(self, kubeconfig: Path) -> None:
        self.kubeconfig = kubeconfig
        for tool in ("kubectl", "helm"):
            if not (TOOLS / "bin" / tool).is_file():
                raise DemoError(f"{TOOLS / 'bin' / tool} is missing: run `make tools` first")

    def __call__(self, tool: str, *args: str, timeout: float = 240, stdin: str = "") -> str:
        command = [str(TOOLS / "bin" / tool), "--kubeconfig", str(self.kubeconfig), *args]
        try:
            done = subprocess.run(
                command, capture_output=True, text=True, timeout=timeout, input=stdin or None
            )
        except subprocess.TimeoutExpired:
            raise DemoError(
                f"`{tool} {' '.join(args)}` did not finish in {timeout:.0f} s"
            ) from None
        if done.returncode != 0:
            raise DemoError(f"`{tool} {' '.join(args)}` failed: {done.stderr.strip()[-500:]}")
        return done.stdout

    def items(self, *args: str) -> list[dict[str, Any]]:
        return json.loads(self("kubectl", "get", *args, "-o", "json"))["items"]


def is_ready(pod: dict[str, Any]) -> bool:
    if pod["metadata"].get("deletionTimestamp"):
        return False
    conditions = (pod.get("status") or {}).get("conditions") or []
    return any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)


def ready_addresses(slices: list[dict[str, Any]]) -> list[str]:
    """The addresses a Service's EndpointSlices list as ready: where kube-proxy sends its
    traffic."""
    return sorted(
        address
        for item in slices
        for endpoint in item.get("endpoints") or []
        if (endpoint.get("conditions") or {}).get("ready")
        for address in endpoint["addresses"]
    )


def wait_for(what: str, check: Callable[[], Any], timeout_s: float) -> Any:
    """`check()` until it is truthy; a DemoError naming `what` at the deadline."""
    deadline = time.monotonic() + timeout_s
    while True:
        result = check()
        if result:
            return result
        if time.monotonic() > deadline:
            raise DemoError(f"timed out after {timeout_s:.0f} s waiting for {what}")
        time.sleep(1.0)


def _get(url: str) -> str | None:
    try:
        with urllib.request.urlopen(url, timeout=3) as response:
            return response.read().decode()
    except OSError:
        return None


def pod_counts(ip: str) -> dict[str, int | None]:
    """Each model's live instance count on the Triton pod at `ip`."""
    counts: dict[str, int | None] = {}
    for model in MINIMUM:
        text = _get(f"http://{ip}:8000/v2/models/{model}/config")
        counts[model] = instance_count(json.loads(text)) if text else None
    return counts


def target_metrics(text: str) -> tuple[float, float | None]:
    """(successful requests of TARGET so far, its p95 in ms) from a Triton /metrics page."""
    requests, p95 = 0.0, None
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.labels.get("model") != TARGET:
                continue
            # The parser names a counter's samples NAME_total, whatever Triton wrote.
            if sample.name == "nv_inference_request_success_total":
                requests += sample.value
            elif (
                sample.name == "nv_inference_request_summary_us"
                and float(sample.labels.get("quantile", "nan")) == 0.95
                and sample.value == sample.value  # NaN while the window holds no request
            ):
                p95 = sample.value / 1000
    return requests, p95


def _short(counts: dict[str, int | None]) -> str:
    return "/".join("?" if n is None else str(n) for n in counts.values())


class Demo:
    def __init__(self, kubectl: Kubectl) -> None:
        self.k = kubectl
        self.timings: dict[str, float] = {}
        self.served: dict[str, float] = {}  # pod -> requests counted so far
        self.last_counter: dict[str, float] = {}  # pod -> Triton's counter at the last sample

    def triton_pods(self) -> list[dict[str, Any]]:
        return [p for p in self.k.items("pods", "-n", NAMESPACE, "-l", TRITON) if is_ready(p)]

    def install(self, values_file: Path) -> None:
        self.k("kubectl", "create", "namespace", NAMESPACE)
        self.k("kubectl", "label", "namespace", NAMESPACE,
               "pod-security.kubernetes.io/enforce=restricted")  # fmt: skip
        started = time.monotonic()
        self.k("helm", "install", RELEASE, str(CHART), "-n", NAMESPACE, "-f", str(values_file))
        say("helm install done; waiting for two Triton pods and the operator to be Ready")
        wait_for(
            "the release's three pods to be Ready",
            lambda: (
                len(pods := self.k.items("pods", "-n", NAMESPACE)) == 3
                and all(is_ready(p) for p in pods)
            ),
            420,
        )
        self.timings["helm install to every pod Ready"] = time.monotonic() - started
        say(f"every pod Ready in {self.timings['helm install to every pod Ready']:.1f} s")

    def sample(self) -> tuple[float, float | None, dict[str, dict[str, int | None]]]:
        """Requests so far (every pod), the worse p95, and each pod's counts."""
        worst, counts = None, {}
        for pod in self.triton_pods():
            ip, name = pod["status"]["podIP"], pod["metadata"]["name"]
            counter, p95 = target_metrics(_get(f"http://{ip}:8002/metrics") or "")
            last = self.last_counter.get(name, 0.0)
            # Reloading a model with a new count starts its counter again.
            self.served[name] = self.served.get(name, 0.0) + (
                counter - last if counter >= last else counter
            )
            self.last_counter[name] = counter
            if p95 is not None:
                worst = p95 if worst is None else max(worst, p95)
            counts[name] = pod_counts(ip)
        return sum(self.served.values()), worst, counts

    def load(self, values_file: Path) -> list[PhaseRow]:
        # The headless master's Job is named after a hash of its run: found by its labels.
        master = f"app.kubernetes.io/instance={RELEASE},tritonscale.io/locust-role=master"
        self.k("helm", "upgrade", RELEASE, str(CHART), "-n", NAMESPACE, "-f", str(values_file))
        say(f"Locust on: {STEP_USERS} more users every {STEP_SECONDS} s, {STEPS} steps")

        def running() -> bool:
            for pod in self.k.items("pods", "-n", NAMESPACE, "-l", master):
                for status in (pod.get("status") or {}).get("containerStatuses") or []:
                    if "running" in status.get("state", {}):
                        return True
            return False

        wait_for("the Locust master to start", running, 180)
        # The phases count from the first request served, not from the master's start: the
        # workers connect and spawn their users first.
        started = self.sample()[0]
        wait_for("Locust's first requests", lambda: self.sample()[0] > started, 180)
        phases = [(f"{STEP_USERS * (n + 1)} users", STEP_SECONDS) for n in range(STEPS)]
        phases.append(("after the load", AFTER_SECONDS))
        rows: list[PhaseRow] = []
        load_start = time.monotonic()
        requests, _, counts = self.sample()
        for name, seconds in phases:
            row = PhaseRow(name, seconds)
            began, end = requests, time.monotonic() + seconds
            while time.monotonic() < end:
                before, sampled_at = requests, time.monotonic()
                time.sleep(min(SAMPLE_S, max(0.0, end - time.monotonic())))
                requests, p95, counts = self.sample()
                rate = (requests - before) / max(time.monotonic() - sampled_at, 0.1)
                self._note_rise(counts, load_start)
                p95_text = f"{p95:.0f} ms" if p95 is not None and rate else "-"
                per_pod = "  ".join(f"{pod[-5:]}: {_short(c)}" for pod, c in counts.items())
                say(f"  [{name}] {rate:6.1f} req/s, p95 {p95_text}, counts {per_pod}")
            row.requests, row.counts = requests - began, counts
            # Triton's summary keeps its last window while no request comes.
            row.p95_ms = p95 if row.requests else None
            rows.append(row)
        return rows

    def _note_rise(self, counts: dict[str, dict[str, int | None]], load_start: float) -> None:
        key = "load start to a higher count on both pods"
        if key in self.timings or len(counts) < 2:
            return
        for model, minimum in MINIMUM.items():
            if all((c.get(model) or 0) > minimum for c in counts.values()):
                self.timings[key] = time.monotonic() - load_start
                say(f"  {model} raised on both pods {self.timings[key]:.1f} s into the load")
                return

    def uninstall(self) -> None:
        started = time.monotonic()
        self.k("helm", "uninstall", RELEASE, "-n", NAMESPACE, "--wait", "--timeout", "3m")
        self.k("kubectl", "delete", "namespace", NAMESPACE, "--timeout=180s", timeout=200)
        self.timings["helm uninstall to namespace gone"] = time.monotonic() - started


def served_lines(served: dict[str, float]) -> list[str]:
    """The requests each Triton pod served over the whole load, and its share."""
    total = sum(served.values())
    return [
        f"{pod}: {count:.0f} {TARGET} requests served"
        + (f" ({100 * count / total:.0f} %)" if total else "")
        for pod, count in sorted(served.items())
    ]


def table(rows: list[PhaseRow]) -> list[str]:
    pods = sorted({pod for row in rows for pod in row.counts})
    header = f"{'phase':<16}{'req/s':>8}{'p95 ms':>8}  " + "  ".join(
        f"{pod[-5:]:>12}" for pod in pods
    )
    lines = [header, "-" * len(header)]
    for row in rows:
        p95 = f"{row.p95_ms:.0f}" if row.p95_ms is not None else "-"
        shown = [_short(row.counts[pod]) if pod in row.counts else "-" for pod in pods]
        cells = "  ".join(f"{cell:>12}" for cell in shown)
        lines.append(f"{row.name:<16}{row.requests / row.seconds:>8.1f}{p95:>8}  {cells}")
    lines.append(f"(counts per pod: {'/'.join(MINIMUM)})")
    return lines


def image_values(address: str) -> dict[str, Any]:
    """Values that pull every image from the registry at `address`, where `make push` put
    them; Triton's is the CPU image `make images` builds."""
    return {
        "global": {"imageRegistry": address},
        "triton": {
            "image": {
                "repository": "tritonscale/tritonscale-triton-cpu",
                "tag": images.chart_version(),
            }
        },
    }


def merged(*layers: dict[str, Any]) -> dict[str, Any]:
    """Values layered as helm layers -f files: later ones win, maps merge key by key."""
    out: dict[str, Any] = {}
    for layer in layers:
        for key, value in layer.items():
            if isinstance(value, dict) and isinstance(out.get(key), dict):
                out[key] = merged(out[key], value)
            else:
                out[key] = value
    return out


def run() -> None:
    if not all(path.is_file() for path in kubernetes_build.binaries(TOOLS).values()):
        say("building the cluster from source (once; 10 to 25 minutes on 2 cores)")
    say("building the images (reused when nothing changed)")
    images.build_all(python_image="")
    try:
        cluster.up(STATE, TOOLS, say)
        address = (node.read_state(STATE) or {})["registry"]
        say(f"pushing the images to the node's registry: make push REGISTRY={address}/tritonscale")
        images.push(f"{address}/tritonscale", dry_run=False)
        kubectl = Kubectl(STATE / "kubeconfig")
        config = f"--kubeconfig {STATE}/kubeconfig"
        say("watch it from another shell:")
        for what in ("pods -o wide", "instancegroupautoscalers -o wide", "events"):
            say(f"  {TOOLS}/bin/kubectl {config} -n {NAMESPACE} get {what} -w")
        demo = Demo(kubectl)
        values = merged(VALUES, image_values(address))
        with tempfile.TemporaryDirectory(prefix="tritonscale-demo-") as folder:
            values_file = Path(folder) / "values.yaml"
            values_file.write_text(yaml.safe_dump(values))
            demo.install(values_file)
            values_file.write_text(yaml.safe_dump({**values, "locust": LOCUST}))
            rows = demo.load(values_file)
        demo.uninstall()
        say("")
        for line in table(rows):
            say(line)
        say("")
        for line in served_lines(demo.served):
            say(line)
        for name, seconds in demo.timings.items():
            say(f"{name}: {seconds:.1f} s")
        if len(demo.served) < 2 or not all(demo.served.values()):
            raise DemoError(f"the load did not reach both Triton pods: {demo.served}")
    finally:
        say("taking the cluster down")
        cluster.down(STATE, say)


def main(argv: list[str] | None = None) -> int:
    # SIGTERM as Ctrl-C: `run` takes the cluster down on the way out.
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    try:
        run()
    except KeyboardInterrupt:
        say("interrupted: the cluster is down")
        return 130
    except CLUSTER_ERRORS as error:
        print(f"demo-k8s: {error}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
