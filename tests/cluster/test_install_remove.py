"""Installing and removing, the other ways: helm 3, and the plain manifests with kubectl.

test_release.py takes one helm 4 release through its whole life; these only prove that the
other ways in and out work on a real API server: every object admitted, the pods running,
the autoscalers' finalizers released, and nothing left once the namespace has gone.
"""

from __future__ import annotations

import secrets
import shutil
from pathlib import Path

import yaml

from tests.chart.helm import CHART, REPO_ROOT
from tests.cluster.harness import (
    Cluster,
    Stopwatch,
    is_ready,
    restricted_namespace,
    wait_namespace_gone,
    wait_release_gone,
)

VALUES = Path(__file__).parent / "e2e-values.yaml"
MANIFESTS = REPO_ROOT / "charts" / "manifests" / "tritonscale.yaml"
MODELS = 4  # the default autoscalers: pipeline_async and its three branches


def test_helm3_installs_and_uninstalls_leaving_nothing(cluster: Cluster) -> None:
    namespace, release = "e2e-helm3", "three"
    selector = f"app.kubernetes.io/instance={release}"
    restricted_namespace(cluster, namespace)
    cluster.helm(
        "install", release, str(CHART), "-n", namespace, "-f", str(VALUES),
        *cluster.image_values(), major=3,
    )  # fmt: skip
    cluster.wait(
        "the helm 3 release's pods (Triton and the operator) to be Ready",
        lambda: (
            (pods := cluster.pods(namespace, selector))
            and len(pods) == 2
            and all(is_ready(pod) for pod in pods)
        ),
        timeout_s=420,
        namespace=namespace,
    )
    cluster.wait(
        "the operator to serve every autoscaler (its finalizer on each)",
        lambda: (
            (found := cluster.items("instancegroupautoscalers", "-n", namespace))
            and len(found) == MODELS
            and all(item["metadata"].get("finalizers") for item in found)
        ),
        timeout_s=120,
        namespace=namespace,
    )
    cluster.helm("uninstall", release, "-n", namespace, "--wait", "--timeout", "3m",
                 major=3, timeout=240)  # fmt: skip
    wait_release_gone(cluster, namespace, selector)
    cluster.kubectl("delete", "namespace", namespace, "--wait=false")
    wait_namespace_gone(cluster, namespace)


def kustomization(cluster: Cluster, folder: Path) -> Path:
    """A kustomization of the plain manifests that takes the operator's image from the node's
    registry (`images:`, as a user with a mirror of their own does): a folder for `-k`."""
    folder.mkdir(parents=True, exist_ok=True)
    shutil.copy(MANIFESTS, folder / MANIFESTS.name)
    operator = "tritonscale/tritonscale-operator"
    (folder / "kustomization.yaml").write_text(
        yaml.safe_dump(
            {
                "resources": [MANIFESTS.name],
                "images": [
                    {"name": f"ghcr.io/{operator}", "newName": f"{cluster.registry}/{operator}"}
                ],
            }
        )
    )
    return folder


def test_the_plain_manifests_apply_and_delete_leaving_nothing(
    cluster: Cluster, tmp_path: Path
) -> None:
    # The file's own instructions (its header), step by step, through a kustomization that
    # pulls the operator from the node's registry. It is rendered with the chart's defaults,
    # GPU mode: the node has no GPU, so Triton stays Pending (its nvidia.com/gpu request fits
    # nowhere); the operator runs and serves the autoscalers, which is what deleting them
    # needs.
    manifests = str(kustomization(cluster, tmp_path / "manifests"))
    namespace = "tritonscale"
    selector = "app.kubernetes.io/instance=tritonscale"
    restricted_namespace(cluster, namespace)
    try:
        cluster.kubectl(
            "-n", namespace, "create", "secret", "generic", "tritonscale-repository-key",
            f"--from-literal=repository-key={secrets.token_hex(32)}",
        )  # fmt: skip
        with Stopwatch(cluster.timings, "kubectl apply -f manifests to operator Ready"):
            cluster.kubectl("apply", "--server-side", "-k", manifests)
            cluster.wait(
                "the manifests' operator pod to be Ready",
                lambda: [
                    pod
                    for pod in cluster.pods(
                        namespace, f"{selector},app.kubernetes.io/component=operator"
                    )
                    if is_ready(pod)
                ],
                timeout_s=180,
                namespace=namespace,
            )
        (triton,) = cluster.pods(namespace, f"{selector},app.kubernetes.io/component=triton")
        assert triton["status"]["phase"] == "Pending"
        refused = cluster.items(
            "events", "-n", namespace, "--field-selector", "reason=FailedCreate"
        )
        assert refused == [], "PodSecurity or the quota refused a pod of the manifests"
        cluster.wait(
            "the operator to serve every autoscaler (its finalizer on each)",
            lambda: (
                (found := cluster.items("instancegroupautoscalers", "-n", namespace))
                and len(found) == MODELS
                and all(item["metadata"].get("finalizers") for item in found)
            ),
            timeout_s=120,
            namespace=namespace,
        )
        with Stopwatch(cluster.timings, "kubectl delete -f manifests to namespace gone"):
            cluster.kubectl("-n", namespace, "delete", "instancegroupautoscalers", "--all",
                            "--wait", "--timeout=120s", timeout=150)  # fmt: skip
            # As the file's header says (its autoscalers are gone by now).
            cluster.kubectl("delete", "-k", manifests, "--ignore-not-found", "--wait",
                            "--timeout=180s", timeout=210)  # fmt: skip
            wait_release_gone(cluster, namespace, selector)
            cluster.kubectl("delete", "namespace", namespace, "--wait=false")
            wait_namespace_gone(cluster, namespace)
    finally:
        if cluster.run("kubectl", "get", "namespace", namespace).returncode == 0:
            cluster.run("kubectl", "delete", "-k", manifests, "--wait=false")
            cluster.run("kubectl", "delete", "namespace", namespace, "--wait=false")
