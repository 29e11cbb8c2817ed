"""Impossible values fail with one clear message, under both Helm majors.

Type and range mistakes are caught by values.schema.json (Helm 3 and Helm 4 word the
message differently; each case names both), impossible combinations by the chart's
validateValues (the same words under both).
"""

from __future__ import annotations

import pytest

from tests.chart.helm import run_helm, template_args


def helm_major(helm: str) -> int:
    return 3 if helm.endswith("helm3") else 4


# (id, --set values, message under Helm 4, message under Helm 3)
SCHEMA_CASES = [
    (
        "negative gpu count",
        ("triton.gpu.count=-1",),
        "at '/triton/gpu/count': minimum: got -1, want 0",
        "triton.gpu.count: Must be greater than or equal to 0",
    ),
    (
        "unknown repository source",
        ("triton.modelRepository.source=nfs",),
        "at '/triton/modelRepository/source': value must be one of 'configMap', 'image', 'pvc', 'uri'",
        'triton.modelRepository.source must be one of the following: "configMap", "image", "pvc", "uri"',
    ),
    (
        "uri that is not cloud storage",
        ("triton.modelRepository.source=uri", "triton.modelRepository.uri=http://x"),
        "at '/triton/modelRepository/uri': 'http://x' does not match pattern",
        "triton.modelRepository.uri: Does not match pattern",
    ),
    (
        "misspelt key",
        ("triton.gpus=2",),
        "at '/triton': additional properties 'gpus' not allowed",
        "triton: Additional property gpus is not allowed",
    ),
    (
        "zero min instances",
        ("autoscalers.models.branch_embed.minInstances=0",),
        "at '/autoscalers/models/branch_embed/minInstances': minimum: got 0, want 1",
        "autoscalers.models.branch_embed.minInstances: Must be greater than or equal to 1",
    ),
    (
        "unknown instance kind",
        ("autoscalers.defaults.instanceKind=GPU",),
        "at '/autoscalers/defaults/instanceKind': value must be one of '', 'KIND_CPU', 'KIND_GPU'",
        "autoscalers.defaults.instanceKind must be one of the following",
    ),
    (
        "zero operator shards",
        ("operator.shards=0",),
        "at '/operator/shards': minimum: got 0, want 1",
        "operator.shards: Must be greater than or equal to 1",
    ),
    (
        "unknown operator anti-affinity",
        ("operator.podAntiAffinity=soft",),
        "at '/operator/podAntiAffinity': value must be one of 'preferred', 'required', ''",
        'operator.podAntiAffinity must be one of the following: "preferred", "required", ""',
    ),
    (
        "a rollout surge that is not a number or a percentage",
        ("operator.rollingUpdate.maxSurge=one",),
        "at '/operator/rollingUpdate/maxSurge': 'one' does not match pattern",
        "operator.rollingUpdate.maxSurge: Does not match pattern",
    ),
    (
        "an unbounded wait for the locust workers",
        ("locust.expectWorkersSeconds=0",),
        "at '/locust/expectWorkersSeconds': minimum: got 0, want 1",
        "locust.expectWorkersSeconds: Must be greater than or equal to 1",
    ),
    (
        "a latency objective as every model's default",
        ("autoscalers.defaults.targets.latency.milliseconds=100",),
        "at '/autoscalers/defaults/targets': additional properties 'latency' not allowed",
        "autoscalers.defaults.targets: Additional property latency is not allowed",
    ),
    (
        "unknown monitor kind",
        ("monitoring.monitor.kind=Probe",),
        "at '/monitoring/monitor/kind': value must be one of 'ServiceMonitor', 'PodMonitor'",
        "monitoring.monitor.kind must be one of the following",
    ),
]

# (id, --set values, validateValues' message[, ci/ values file the values go on top of])
COMBINATION_CASES = [
    (
        "a latency objective on a model the pipeline calls",
        ("autoscalers.models.branch_rank.targets.latency.milliseconds=100",),
        "tritonscale: autoscalers.models.branch_rank.targets.latency: only a pipeline's root may "
        "carry a latency objective, and branch_rank is called by pipeline_async.",
    ),
    (
        "gpu mode without gpus",
        ("triton.gpu.count=0",),
        "tritonscale: triton.gpu.count is 0 but GPU mode (triton.gpu.enabled=true) needs at least 1 GPU",
    ),
    (
        "min instances above max",
        ("autoscalers.models.branch_embed.minInstances=9",),
        "tritonscale: autoscalers.models.branch_embed: minInstances (9) is above maxInstances (8).",
    ),
    (
        "default min above a model's max",
        ("autoscalers.defaults.minInstances=5",),
        "tritonscale: autoscalers.models.pipeline_async: minInstances (5) is above maxInstances (4).",
    ),
    (
        "grace period shorter than the drain",
        ("triton.terminationGracePeriodSeconds=45",),
        "tritonscale: triton.terminationGracePeriodSeconds (45) must exceed triton.preStopSleepSeconds + triton.exitTimeoutSeconds (15 + 30)",
    ),
    (
        "preStop sleep shorter than a gRPC connection's life",
        ("triton.preStopSleepSeconds=10", "triton.terminationGracePeriodSeconds=60"),
        "tritonscale: triton.preStopSleepSeconds (10) must be at least 14 with triton.grpcMaxConnectionAgeSeconds 8 and triton.grpcMaxConnectionAgeGraceSeconds 4",
    ),
    (
        "pvc without a claim",
        ("triton.modelRepository.source=pvc",),
        'tritonscale: triton.modelRepository.source is "pvc" but triton.modelRepository.pvc.claimName is empty.',
    ),
    (
        "image without a repository",
        ("triton.modelRepository.source=image",),
        'tritonscale: triton.modelRepository.source is "image" but triton.modelRepository.image.repository is empty.',
    ),
    (
        "uri source without a uri",
        ("triton.modelRepository.source=uri",),
        'tritonscale: triton.modelRepository.source is "uri" but triton.modelRepository.uri ("") does not start with s3://, gs:// or as://.',
    ),
    (
        "readiness on a model the repository lacks",
        ("triton.readyModels={bls_async,no_such_model}",),
        "tritonscale: triton.readyModels names no_such_model, not in the chart's model repository",
    ),
    (
        "hpa min above max",
        ("hpa.enabled=true", "hpa.minReplicas=5", "hpa.maxReplicas=2"),
        "tritonscale: hpa.minReplicas (5) is above hpa.maxReplicas (2).",
    ),
    (
        "an hpa without an instance budget",
        ("hpa.enabled=true",),
        "tritonscale: hpa.enabled scales pods on the instance budget's demand ratio: it needs "
        "autoscalers.enabled, operator.enabled and autoscalers.budget.instancesPerPod > 0.",
    ),
    (
        "a budget below the minimums",
        ("autoscalers.budget.instancesPerPod=3",),
        "tritonscale: the autoscalers' minInstances add up to 4, above "
        "autoscalers.budget.instancesPerPod (3).",
    ),
    (
        "a gpu memory budget below the minimums",
        (
            "autoscalers.budget.instancesPerPod=8",
            "autoscalers.budget.gpuMemoryPerPodMiB=1000",
            "autoscalers.budget.gpuMemoryPerInstanceMiB.branch_embed=2000",
        ),
        "tritonscale: the autoscalers' minInstances take 2000 MiB of GPU memory, above "
        "autoscalers.budget.gpuMemoryPerPodMiB (1000).",
    ),
    (
        "two pdb limits",
        ("triton.pdb.minAvailable=1",),
        "tritonscale: set only one of triton.pdb.minAvailable (1) and triton.pdb.maxUnavailable (1).",
    ),
    (
        "two operator pdb limits",
        (
            "operator.replicaCount=2",
            "operator.peering.enabled=true",
            "operator.pdb.minAvailable=1",
        ),
        "tritonscale: set only one of operator.pdb.minAvailable (1) and "
        "operator.pdb.maxUnavailable (1).",
    ),
    (
        "an operator pdb with no limit",
        (
            "operator.replicaCount=2",
            "operator.peering.enabled=true",
            "operator.pdb.maxUnavailable=",
        ),
        "tritonscale: operator.pdb.enabled is true but neither operator.pdb.minAvailable nor "
        "operator.pdb.maxUnavailable is set.",
    ),
    (
        "two operators without peering",
        ("operator.replicaCount=2",),
        "tritonscale: operator.replicaCount is 2 but operator.peering.enabled is false",
    ),
    (
        "shards with peered replicas",
        ("operator.shards=3", "operator.replicaCount=2", "operator.peering.enabled=true"),
        "tritonscale: operator.shards is 3 and operator.replicaCount is 2: shards (each pod acts "
        "on its share) and peered replicas (one pod acts, the others stand by) are not combined",
    ),
    (
        "shards with peering",
        ("operator.shards=3", "operator.peering.enabled=true"),
        "tritonscale: operator.shards is 3 and operator.peering.enabled is true",
    ),
    (
        "a surge with operator pods kept apart",
        ("operator.rollingUpdate.maxSurge=1",),
        "tritonscale: operator.podAntiAffinity is required but operator.rollingUpdate.maxSurge "
        "is 1: a surge pod needs a node without an operator pod, and with as many nodes as "
        "replicas there is none, so every upgrade would stall",
        "operator-ha-values.yaml",
    ),
    (
        "a rollout that can replace no pod",
        ("operator.rollingUpdate.maxSurge=0",),
        "tritonscale: operator.rollingUpdate.maxSurge (0) and operator.rollingUpdate."
        "maxUnavailable (0) both come to 0 pods of 2: a rollout could replace none",
        "peering-values.yaml",
    ),
    (
        "a rollout that takes every operator down",
        ("operator.rollingUpdate.maxUnavailable=100%",),
        "tritonscale: operator.rollingUpdate.maxUnavailable (100%) lets a rollout take down all "
        "3 operator pods; keep it below operator.replicaCount so that one stays active.",
        "operator-ha-values.yaml",
    ),
    (
        "a rollout that takes more than the budget lets a drain take",
        ("operator.replicaCount=2",),
        "tritonscale: a rollout takes down 1 of the 2 operator pods at once (operator."
        "rollingUpdate.maxUnavailable 1) but operator.pdb lets a drain take only 0: set "
        "operator.pdb.minAvailable to at most 1 (or operator.pdb.maxUnavailable to at least 1).",
        "operator-ha-values.yaml",
    ),
    (
        "a headless run without an end",
        ("locust.enabled=true", "locust.headless=true"),
        "tritonscale: locust.headless is true but locust.runTime is empty: a headless run is a "
        "Job that must end; set locust.runTime (e.g. 10m).",
    ),
    (
        "a deadline that stops every run",
        ("locust.activeDeadlineSeconds=600",),
        "tritonscale: locust.activeDeadlineSeconds (600) is not above locust.runTime (10m, "
        "600 s): Kubernetes would stop every run before its end.",
        "locust-values.yaml",
    ),
    (
        "a locustfile the chart does not hold",
        ("locust.enabled=true", "locust.locustfile=soak.py"),
        "tritonscale: locust.enabled is true but the chart holds no loadtests/soak.py",
    ),
]


@pytest.mark.parametrize(
    ("sets", "helm4_message", "helm3_message"),
    [case[1:] for case in SCHEMA_CASES],
    ids=[case[0] for case in SCHEMA_CASES],
)
def test_schema_rejects(
    helm: str, sets: tuple[str, ...], helm4_message: str, helm3_message: str
) -> None:
    result = run_helm(helm, *template_args(sets=sets))
    assert result.returncode != 0
    assert "values don't meet the specifications of the schema" in result.stderr
    assert (helm4_message if helm_major(helm) == 4 else helm3_message) in result.stderr


@pytest.mark.parametrize(
    ("sets", "message", "values_files"),
    [(case[1], case[2], case[3:]) for case in COMBINATION_CASES],
    ids=[case[0] for case in COMBINATION_CASES],
)
def test_validate_values_rejects(
    helm: str, sets: tuple[str, ...], message: str, values_files: tuple[str, ...]
) -> None:
    result = run_helm(helm, *template_args(*values_files, sets=sets))
    assert result.returncode != 0
    assert message in result.stderr
    assert "VALUES VALIDATION" in result.stderr


def test_every_problem_is_reported_at_once(helm: str) -> None:
    result = run_helm(
        helm, *template_args(sets=("triton.gpu.count=0", "hpa.enabled=true", "hpa.minReplicas=9"))
    )
    assert "triton.gpu.count is 0" in result.stderr
    assert "hpa.minReplicas (9) is above hpa.maxReplicas (4)" in result.stderr


def test_cpu_mode_accepts_zero_gpus(helm: str) -> None:
    result = run_helm(helm, *template_args(sets=("triton.gpu.enabled=false", "triton.gpu.count=0")))
    assert result.returncode == 0, result.stderr
