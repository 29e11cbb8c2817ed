"""The ci/ values matrix under both Helm majors, every object checked against Kubernetes' schemas.

Each ci/*-values.yaml turns on one feature (see the chart README). For each:
helm lint --strict and helm template pass under Helm 3 and Helm 4, the two render the
same objects, and every object validates (strict: unknown fields are errors) against the
schemas of Kubernetes 1.29 and of the newest version kubernetes-validate carries. Kinds
that are not Kubernetes' own are checked elsewhere: InstanceGroupAutoscaler against our
CRD (test_chart_autoscalers.py), KopfPeering by its CRD's shape, and the
monitoring.coreos.com kinds by assertions (test_chart_features.py).
"""

from __future__ import annotations

import functools
import json

import kubernetes_validate
import pytest
from kubernetes_validate.utils import latest_version

from tests.chart.helm import CHART, CI_VALUES, run_helm, template_args

FIXED_KEY = ("repositoryKey.value=fixed-for-comparison",)
NOT_KUBERNETES_KINDS = {
    "InstanceGroupAutoscaler",
    "KopfPeering",
    "ServiceMonitor",
    "PodMonitor",
    "PrometheusRule",
}
KUBERNETES_VERSIONS = ["1.29", ".".join(latest_version().split(".")[:2])]
LOCUSTFILE_PRESENT = (CHART / "files" / "loadtests" / "bls.py").is_file()


def expect_render_failure(values_file: str) -> str | None:
    """The message a values file must fail with in the chart's current state, else None."""
    if values_file == "locust-values.yaml" and not LOCUSTFILE_PRESENT:
        return "locust.enabled is true but the chart holds no loadtests/bls.py"
    return None


# The files that render in the chart's current state (the others fail as expected above).
RENDERABLE = [name for name in CI_VALUES if expect_render_failure(name) is None]


@pytest.mark.parametrize("values_file", CI_VALUES)
def test_lint_passes(helm: str, values_file: str) -> None:
    result = run_helm(helm, "lint", "--strict", str(CHART), "-f", str(CHART / "ci" / values_file))
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize("values_file", CI_VALUES)
def test_template_renders_the_same_objects_under_helm_3_and_4(
    tools: dict[str, str], values_file: str
) -> None:
    helm4 = run_helm(
        tools["helm"], *template_args(values_file, sets=FIXED_KEY, extra=("--include-crds",))
    )
    helm3 = run_helm(
        tools["helm3"], *template_args(values_file, sets=FIXED_KEY, extra=("--include-crds",))
    )
    if message := expect_render_failure(values_file):
        for result in (helm4, helm3):
            assert result.returncode != 0
            assert message in result.stderr
        return
    assert helm4.returncode == 0, helm4.stderr
    assert helm3.returncode == 0, helm3.stderr
    assert helm4.objects == helm3.objects


@functools.cache
def validation_error(obj_json: str, version: str) -> str | None:
    """kubernetes-validate's verdict on one object; cached, as the files share most objects."""
    obj = json.loads(obj_json)
    try:
        kubernetes_validate.validate(obj, version, strict=True)
    except kubernetes_validate.ValidationError as error:
        path = ".".join(str(p) for p in error.path)
        return f"{obj['kind']}/{obj['metadata']['name']}: {path}: {error.message}"
    return None


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
@pytest.mark.parametrize("values_file", RENDERABLE)
def test_every_object_is_valid_kubernetes(helm4: str, values_file: str, version: str) -> None:
    result = run_helm(helm4, *template_args(values_file, sets=FIXED_KEY, extra=("--include-crds",)))
    assert result.returncode == 0, result.stderr
    checked = [obj for obj in result.objects if obj["kind"] not in NOT_KUBERNETES_KINDS]
    errors = [validation_error(json.dumps(obj, sort_keys=True), version) for obj in checked]
    assert not [e for e in errors if e], "\n".join(e for e in errors if e)
    assert len(checked) >= 10  # the Deployments, Services, ConfigMaps, RBAC and CRDs at least


@pytest.mark.parametrize("values_file", RENDERABLE)
def test_every_object_carries_the_chart_labels(helm4: str, values_file: str) -> None:
    result = run_helm(helm4, *template_args(values_file, sets=FIXED_KEY))
    for obj in result.objects:
        labels = obj["metadata"].get("labels", {})
        where = f"{obj['kind']}/{obj['metadata']['name']}"
        assert labels.get("app.kubernetes.io/name") == "tritonscale", where
        assert labels.get("app.kubernetes.io/instance") == "demo", where
        assert labels.get("app.kubernetes.io/managed-by") == "Helm", where
        assert labels.get("helm.sh/chart", "").startswith("tritonscale-"), where
        assert len(obj["metadata"]["name"]) <= 63, where
        assert obj["metadata"].get("namespace"), f"{where} has no namespace"
        spec = obj.get("spec", {})
        if "template" in spec:
            pod_labels = spec["template"]["metadata"]["labels"]
            selector = spec["selector"]["matchLabels"]
            assert selector.items() <= pod_labels.items(), (
                f"{where}: selector does not match its pods"
            )
            assert pod_labels.get("app.kubernetes.io/component") in {
                "triton",
                "operator",
                "locust",
            }, where
