"""What the chart's objects must say, feature by feature (Helm 4 renders; test_chart_matrix
shows that Helm 3 renders the same objects)."""

from __future__ import annotations

import base64
import json
import re
import shutil
import subprocess
from pathlib import Path, PurePosixPath

import click
import pytest
import yaml
from kubernetes.utils.quantity import parse_quantity

from tests.chart.helm import CHART, NAMESPACE, by_kind, container, one, run_helm, template_args
from tests.tooling import require_tool
from tritonscale import cli

MONITORING_KINDS = {"ServiceMonitor", "PodMonitor", "PrometheusRule"}
CHART_MODELS = sorted(p.parent.name for p in (CHART / "files" / "models").glob("*/config.pbtxt"))


def triton_pod(objects: list[dict]) -> dict:
    return one(objects, "Deployment", "-triton")["spec"]["template"]["spec"]


def triton_container(objects: list[dict]) -> dict:
    return container(one(objects, "Deployment", "-triton"), "tritonserver")


def model_configs(objects: list[dict]) -> dict[str, str]:
    """model name -> the config.pbtxt its ConfigMap carries."""
    return {
        cm["metadata"]["labels"]["tritonscale.io/model"]: cm["data"]["config.pbtxt"]
        for cm in by_kind(objects, "ConfigMap")
        if "tritonscale.io/model" in cm["metadata"].get("labels", {})
    }


def locust_job(objects: list[dict], role: str) -> dict:
    """The headless run's Job of one role (its name ends with the run's hash)."""
    (job,) = [
        o
        for o in by_kind(objects, "Job")
        if o["metadata"]["labels"].get("tritonscale.io/locust-role") == role
    ]
    return job


class TestTritonPod:
    def test_shared_memory_is_a_memory_emptydir_at_dev_shm(self, render) -> None:
        objects = render(sets=("triton.shm.sizeLimit=3Gi",)).objects
        volumes = {v["name"]: v for v in triton_pod(objects)["volumes"]}
        assert volumes["shm"]["emptyDir"] == {"medium": "Memory", "sizeLimit": "3Gi"}
        mounts = {m["mountPath"]: m["name"] for m in triton_container(objects)["volumeMounts"]}
        assert mounts["/dev/shm"] == "shm"

    def test_memory_limit_holds_the_request_and_the_whole_of_dev_shm(self, render) -> None:
        # /dev/shm is memory-backed and counts against the container's limit.
        objects = render().objects
        resources = triton_container(objects)["resources"]
        limit = parse_quantity(resources["limits"]["memory"])
        volumes = {v["name"]: v for v in triton_pod(objects)["volumes"]}
        shm = parse_quantity(volumes["shm"]["emptyDir"]["sizeLimit"])
        assert limit >= parse_quantity(resources["requests"]["memory"]) + shm

    def test_start_clears_stale_python_backend_regions_then_becomes_tritonserver(
        self, render
    ) -> None:
        # An unclean exit leaves the Python backend's regions in /dev/shm, an emptyDir that
        # outlives the container: each restart would add its own (tests/cluster shows it).
        tritonserver = triton_container(render().objects)
        shell, flag, line, name = tritonserver["command"]
        assert (shell, flag, name) == ("/bin/sh", "-c", "tritonserver")
        assert line == 'rm -f /dev/shm/triton_python_backend_shm_region_* && exec tritonserver "$@"'
        assert tritonserver["args"][0] == "--model-repository=/models"

    def test_gpu_mode_requests_gpus_tolerates_the_taint_and_pins_the_product(self, render) -> None:
        objects = render("gpu-node-values.yaml").objects
        pod = triton_pod(objects)
        assert triton_container(objects)["resources"]["limits"]["nvidia.com/gpu"] == 2
        assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in pod[
            "tolerations"
        ]
        assert pod["nodeSelector"] == {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}
        assert pod["runtimeClassName"] == "nvidia"

    def test_cpu_mode_has_no_gpu_limit_toleration_selector_or_runtime_class(self, render) -> None:
        objects = render("cpu-only-values.yaml").objects
        pod = triton_pod(objects)
        text = json.dumps(pod)
        assert "nvidia.com/gpu" not in text
        assert "runtimeClassName" not in pod
        assert "tolerations" not in pod
        assert "nodeSelector" not in pod

    def test_gpu_mode_turns_every_instance_group_into_kind_gpu(self, render) -> None:
        configs = model_configs(render().objects)
        assert sorted(configs) == CHART_MODELS and configs
        for model, config in configs.items():
            source = (CHART / "files" / "models" / model / "config.pbtxt").read_text()
            assert "KIND_CPU" not in config, model
            assert config == source.replace("KIND_CPU", "KIND_GPU"), model
        assert any("KIND_GPU" in config for config in configs.values())

    def test_cpu_mode_keeps_or_makes_every_instance_group_kind_cpu(self, render) -> None:
        configs = model_configs(render("cpu-only-values.yaml").objects)
        assert configs
        for model, config in configs.items():
            assert "KIND_GPU" not in config, model

    def test_model_configmaps_rebuild_each_models_folder(self, render) -> None:
        objects = render().objects
        pod = triton_pod(objects)
        volumes = {v["name"]: v for v in pod["volumes"]}
        mounts = {m["mountPath"]: m for m in triton_container(objects)["volumeMounts"]}
        for model in CHART_MODELS:
            mount = mounts[f"/models/{model}"]
            assert mount["readOnly"] is True
            items = volumes[mount["name"]]["configMap"]["items"]
            source = CHART / "files" / "models" / model
            expected = sorted(
                p.relative_to(source).as_posix()
                for p in source.rglob("*")
                if p.is_file() and "__pycache__" not in p.parts and not p.name.startswith(".")
            )
            assert sorted(item["path"] for item in items) == expected, model
            cm = one(objects, "ConfigMap", f"-model-{model.replace('_', '-')}")
            for item in items:
                assert cm["data"][item["key"]].strip() == (
                    (CHART / "files" / "models" / model / item["path"])
                    .read_text()
                    .replace("KIND_CPU", "KIND_GPU")
                    .strip()
                )

    def test_explicit_model_control_loads_every_model(self, render) -> None:
        args = triton_container(render().objects)["args"]
        assert "--model-control-mode=explicit" in args
        assert "--load-model=*" in args
        assert "--model-repository=/models" in args

    def test_the_rate_limiter_lets_count_changes_finish_under_load(self, render) -> None:
        # In Triton's default (`off`) a BLS root's instance change waited for its queue to
        # empty; `execution_count` is what lets the operator's loads finish under load.
        assert "--rate-limit=execution_count" in triton_container(render().objects)["args"]
        args = triton_container(render(sets=("triton.rateLimit=off",)).objects)["args"]
        assert "--rate-limit=off" in args

    def test_repository_api_is_restricted_by_the_secrets_key(self, render) -> None:
        objects = render().objects
        tritonserver = triton_container(objects)
        assert (
            "--http-restricted-api=model-repository,shared-memory,logging,trace:tritonscale-repository-key=$(TRITONSCALE_REPOSITORY_KEY)"
            in tritonserver["args"]
        )
        assert (
            "--grpc-restricted-protocol=model-repository,shared-memory,logging,trace:tritonscale-repository-key=$(TRITONSCALE_REPOSITORY_KEY)"
            in tritonserver["args"]
        )
        env = {e["name"]: e for e in tritonserver["env"]}
        secret = one(objects, "Secret")
        assert env["TRITONSCALE_REPOSITORY_KEY"]["valueFrom"]["secretKeyRef"] == {
            "name": secret["metadata"]["name"],
            "key": "repository-key",
        }
        key = base64.b64decode(secret["data"]["repository-key"]).decode()
        assert re.fullmatch(r"[A-Za-z0-9]{32}", key)

    def test_an_explicit_key_goes_into_the_secret(self, render) -> None:
        secret = one(render(sets=("repositoryKey.value=s3cret-value",)).objects, "Secret")
        assert base64.b64decode(secret["data"]["repository-key"]) == b"s3cret-value"

    def test_an_existing_secret_replaces_the_generated_one(self, render) -> None:
        objects = render("existing-secret-values.yaml").objects
        assert by_kind(objects, "Secret") == []
        refs = [
            e["valueFrom"]["secretKeyRef"]
            for kind in ("Deployment",)
            for d in by_kind(objects, kind)
            for c in d["spec"]["template"]["spec"]["containers"]
            for e in c.get("env", [])
            if e["name"] == "TRITONSCALE_REPOSITORY_KEY"
        ]
        assert (
            refs == [{"name": "my-repository-key", "key": "repository-key"}] * 2
        )  # triton, operator

    def test_probes_check_liveness_and_the_readiness_of_the_models_that_matter(
        self, render
    ) -> None:
        tritonserver = triton_container(
            render(sets=("triton.readyModels={bls_async,add_sub}",)).objects
        )
        assert tritonserver["startupProbe"]["httpGet"] == {
            "path": "/v2/health/live",
            "port": "http",
        }
        assert tritonserver["livenessProbe"]["httpGet"] == {
            "path": "/v2/health/live",
            "port": "http",
        }
        command = tritonserver["readinessProbe"]["exec"]["command"]
        assert command[:2] == ["python3", "/opt/tritonscale/scripts/triton_ready.py"]
        assert command[-2:] == ["bls_async", "add_sub"]

    def test_termination_drains_before_the_kubelet_kills(self, render) -> None:
        objects = render().objects
        pod, tritonserver = triton_pod(objects), triton_container(objects)
        sleep = int(tritonserver["lifecycle"]["preStop"]["exec"]["command"][1])
        exit_timeout = int(
            next(a for a in tritonserver["args"] if a.startswith("--exit-timeout-secs=")).split(
                "="
            )[1]
        )
        assert (sleep, exit_timeout) == (15, 30)
        assert pod["terminationGracePeriodSeconds"] > sleep + exit_timeout

    def test_services_expose_http_grpc_and_metrics(self, render) -> None:
        service = one(render().objects, "Service", "-triton")
        ports = {p["name"]: p for p in service["spec"]["ports"]}
        assert {n: p["port"] for n, p in ports.items()} == {
            "http": 8000,
            "grpc": 8001,
            "metrics": 8002,
        }
        assert ports["grpc"]["appProtocol"] == "grpc"

    def test_pods_wait_at_the_instances_ready_gate_while_the_operator_sizes_them(
        self, render
    ) -> None:
        gate = [{"conditionType": "tritonscale.io/instances-ready"}]
        assert triton_pod(render().objects)["readinessGates"] == gate
        # Nobody would open it: without the operator or the autoscalers, or when turned off.
        for off in ("operator.enabled=false", "autoscalers.enabled=false"):
            assert "readinessGates" not in triton_pod(render(sets=(off,)).objects), off
        off = "triton.readinessGate.enabled=false"
        assert "readinessGates" not in triton_pod(render(sets=(off,)).objects)

    def test_pod_disruption_budget_selects_the_triton_pods(self, render) -> None:
        objects = render("gpu-node-values.yaml").objects
        pdb = one(objects, "PodDisruptionBudget")
        assert pdb["spec"]["minAvailable"] == 1 and "maxUnavailable" not in pdb["spec"]
        # A pod the readiness gate holds NotReady (operator down) must not block a drain.
        assert pdb["spec"]["unhealthyPodEvictionPolicy"] == "AlwaysAllow"
        pod_labels = one(objects, "Deployment", "-triton")["spec"]["template"]["metadata"]["labels"]
        assert pdb["spec"]["selector"]["matchLabels"].items() <= pod_labels.items()

    def test_triton_runs_with_a_read_only_root_and_a_bounded_tmp(self, render) -> None:
        objects = render().objects
        assert triton_container(objects)["securityContext"]["readOnlyRootFilesystem"] is True
        assert {"name": "tmp", "mountPath": "/tmp"} in triton_container(objects)["volumeMounts"]
        assert {"name": "tmp", "emptyDir": {"sizeLimit": "1Gi"}} in triton_pod(objects)["volumes"]

    def test_pod_annotations_labels_and_affinity_pass_through(self, render) -> None:
        objects = render(
            sets=(
                "triton.podAnnotations.team=ml",
                "triton.podLabels.tier=gpu",
                "triton.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms[0].matchExpressions[0].key=pool",
                "triton.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms[0].matchExpressions[0].operator=Exists",
            )
        ).objects
        template = one(objects, "Deployment", "-triton")["spec"]["template"]
        assert template["metadata"]["annotations"]["team"] == "ml"
        assert template["metadata"]["labels"]["tier"] == "gpu"
        assert "nodeAffinity" in template["spec"]["affinity"]


class TestModelRepositorySources:
    def test_image_source_copies_the_repository_in_an_init_container(self, render) -> None:
        objects = render("image-repository-values.yaml").objects
        pod = triton_pod(objects)
        init = pod["initContainers"][0]
        assert init["image"] == "registry.example.com/team/models:2024-11-29"
        assert init["command"] == ["cp", "-R", "/opt/models/.", "/models/"]
        # Bounded and requested, as a namespace with a ResourceQuota and a node's disk need.
        assert {"name": "models", "emptyDir": {"sizeLimit": "10Gi"}} in pod["volumes"]
        assert init["resources"]["requests"] == {"cpu": "100m", "memory": "64Mi"}
        assert init["resources"]["limits"] == {"memory": "256Mi"}
        assert model_configs(objects) == {}

    def test_pvc_source_mounts_the_claim_read_only(self, render) -> None:
        objects = render("pvc-repository-values.yaml").objects
        volume = next(v for v in triton_pod(objects)["volumes"] if v["name"] == "models")
        assert volume["persistentVolumeClaim"] == {"claimName": "triton-models", "readOnly": True}
        mount = next(m for m in triton_container(objects)["volumeMounts"] if m["name"] == "models")
        assert mount == {
            "name": "models",
            "mountPath": "/models",
            "readOnly": True,
            "subPath": "repository",
        }
        assert model_configs(objects) == {}

    def test_uri_source_lets_triton_read_cloud_storage(self, render) -> None:
        objects = render("uri-repository-values.yaml").objects
        tritonserver = triton_container(objects)
        assert "--model-repository=s3://my-bucket/triton-models" in tritonserver["args"]
        assert tritonserver["envFrom"] == [{"secretRef": {"name": "s3-credentials"}}]
        assert not any(v["name"].startswith("model") for v in triton_pod(objects)["volumes"])


class TestOperator:
    RULES = [
        {
            "apiGroups": ["tritonscale.io"],
            "resources": ["instancegroupautoscalers"],
            "verbs": ["list", "watch", "patch"],
        },
        {
            "apiGroups": ["tritonscale.io"],
            "resources": ["instancegroupautoscalers/status"],
            "verbs": ["patch"],
        },
        {"apiGroups": [""], "resources": ["pods"], "verbs": ["list", "watch"]},
        {"apiGroups": [""], "resources": ["pods/status"], "verbs": ["patch"]},
        {"apiGroups": [""], "resources": ["events"], "verbs": ["create"]},
    ]
    PEERING_RULE = {
        "apiGroups": ["kopf.dev"],
        "resources": ["kopfpeerings"],
        "verbs": ["list", "watch", "patch"],
    }

    def test_rbac_is_exactly_the_least_privilege_rules(self, render) -> None:
        objects = render().objects
        assert (
            by_kind(objects, "ClusterRole") == [] and by_kind(objects, "ClusterRoleBinding") == []
        )
        role = one(objects, "Role", "-operator")
        assert role["metadata"]["namespace"] == NAMESPACE
        assert role["rules"] == self.RULES
        binding = one(objects, "RoleBinding", "-operator")
        assert binding["roleRef"] == {
            "apiGroup": "rbac.authorization.k8s.io",
            "kind": "Role",
            "name": role["metadata"]["name"],
        }
        account = one(objects, "ServiceAccount", "-operator")
        assert binding["subjects"] == [
            {"kind": "ServiceAccount", "name": account["metadata"]["name"], "namespace": NAMESPACE}
        ]

    def test_peering_adds_its_rule_a_peering_object_and_a_role_per_namespace(self, render) -> None:
        objects = render("peering-values.yaml").objects
        namespaces = [NAMESPACE, "inference-canary"]
        roles = [r for r in by_kind(objects, "Role") if r["metadata"]["name"].endswith("-operator")]
        assert sorted(r["metadata"]["namespace"] for r in roles) == sorted(namespaces)
        for role in roles:
            assert role["rules"] == [*self.RULES, self.PEERING_RULE]
        peerings = by_kind(objects, "KopfPeering")
        assert sorted(p["metadata"]["namespace"] for p in peerings) == sorted(namespaces)
        assert {p["metadata"]["name"] for p in peerings} == {"demo-tritonscale"}
        deployment = one(objects, "Deployment", "-operator")
        env = {e["name"]: e.get("value") for e in container(deployment, "operator")["env"]}
        assert env["TRITONSCALE_OPERATOR_PEERING"] == "demo-tritonscale"
        assert env["TRITONSCALE_OPERATOR_NAMESPACES"] == "inference inference-canary"
        assert env["TRITONSCALE_OPERATOR_PROMETHEUS_URL"].startswith("http://")
        # A new replica must be Ready before an old one goes: a rollout of an operator that
        # never gets Ready stops at its first new pod.
        assert deployment["spec"]["strategy"] == {
            "type": "RollingUpdate",
            "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0},
        }

    def test_without_peering_one_operator_never_overlaps_another(self, render) -> None:
        deployment = one(render().objects, "Deployment", "-operator")
        assert deployment["spec"]["strategy"] == {"type": "Recreate"}
        env = {e["name"]: e.get("value") for e in container(deployment, "operator")["env"]}
        assert "TRITONSCALE_OPERATOR_PEERING" not in env  # standalone
        assert env["TRITONSCALE_OPERATOR_NAMESPACES"] == NAMESPACE

    def test_replicas_get_a_budget_and_spread_over_nodes(self, render) -> None:
        objects = render("peering-values.yaml").objects
        deployment = one(objects, "Deployment", "-operator")
        pod_labels = deployment["spec"]["template"]["metadata"]["labels"]
        pdb = one(objects, "PodDisruptionBudget", "-operator")
        # A drain evicts one replica at a time: a standby is left to take over.
        assert pdb["spec"]["maxUnavailable"] == 1 and "minAvailable" not in pdb["spec"]
        assert pdb["spec"]["unhealthyPodEvictionPolicy"] == "AlwaysAllow"
        assert pdb["spec"]["selector"]["matchLabels"].items() <= pod_labels.items()
        triton_labels = one(objects, "Deployment", "-triton")["spec"]["template"]["metadata"]
        assert not pdb["spec"]["selector"]["matchLabels"].items() <= triton_labels["labels"].items()
        anti = deployment["spec"]["template"]["spec"]["affinity"]["podAntiAffinity"]
        (preferred,) = anti["preferredDuringSchedulingIgnoredDuringExecution"]
        term = preferred["podAffinityTerm"]
        assert term["topologyKey"] == "kubernetes.io/hostname"
        assert term["labelSelector"]["matchLabels"].items() <= pod_labels.items()
        assert term["labelSelector"]["matchLabels"]["app.kubernetes.io/component"] == "operator"

    def test_one_replica_gets_no_budget_or_anti_affinity(self, render) -> None:
        objects = render().objects
        assert [p["metadata"]["name"] for p in by_kind(objects, "PodDisruptionBudget")] == [
            "demo-tritonscale-triton"
        ]
        assert "affinity" not in one(objects, "Deployment", "-operator")["spec"]["template"]["spec"]

    def test_replicas_can_be_kept_apart_and_a_quorum_kept_up(self, render) -> None:
        objects = render("operator-ha-values.yaml").objects
        pdb = one(objects, "PodDisruptionBudget", "-operator")
        assert pdb["spec"]["minAvailable"] == 2 and "maxUnavailable" not in pdb["spec"]
        spec = one(objects, "Deployment", "-operator")["spec"]["template"]["spec"]
        (required,) = spec["affinity"]["podAntiAffinity"][
            "requiredDuringSchedulingIgnoredDuringExecution"
        ]
        assert required["topologyKey"] == "kubernetes.io/hostname"

    def test_budget_and_anti_affinity_can_be_turned_off(self, render) -> None:
        objects = render(
            "peering-values.yaml", sets=("operator.pdb.enabled=false", "operator.podAntiAffinity=")
        ).objects
        budgets = [p["metadata"]["name"] for p in by_kind(objects, "PodDisruptionBudget")]
        assert budgets == ["demo-tritonscale-triton"]
        assert "affinity" not in one(objects, "Deployment", "-operator")["spec"]["template"]["spec"]

    def test_an_affinity_of_the_users_own_replaces_the_anti_affinity(self, render) -> None:
        required = "operator.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution"
        objects = render(
            "peering-values.yaml",
            sets=(
                f"{required}.nodeSelectorTerms[0].matchExpressions[0].key=pool",
                f"{required}.nodeSelectorTerms[0].matchExpressions[0].operator=Exists",
            ),
        ).objects
        spec = one(objects, "Deployment", "-operator")["spec"]["template"]["spec"]
        term = {"matchExpressions": [{"key": "pool", "operator": "Exists"}]}
        assert spec["affinity"] == {
            "nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [term]}
            }
        }

    def test_an_operator_image_older_than_the_readiness_probe_runs_without_it(self, render) -> None:
        objects = render(sets=("operator.readinessProbe.enabled=false",)).objects
        operator = container(one(objects, "Deployment", "-operator"), "operator")
        assert "readinessProbe" not in operator
        assert "readyz" not in {p["name"] for p in operator["ports"]}
        assert "TRITONSCALE_OPERATOR_READINESS" not in {e["name"] for e in operator["env"]}

    def test_operator_pod_runs_the_cli_non_root_read_only_with_probes_and_metrics(
        self, render
    ) -> None:
        objects = render().objects
        deployment = one(objects, "Deployment", "-operator")
        pod = deployment["spec"]["template"]["spec"]
        operator = container(deployment, "operator")
        assert operator["image"] == "ghcr.io/tritonscale/tritonscale-operator:0.1.0"
        assert operator["command"] == ["tritonscale", "operator"]
        assert operator["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "healthz"}
        assert operator["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "readyz"}
        ports = {p["name"]: p["containerPort"] for p in operator["ports"]}
        assert ports == {"healthz": 8080, "readyz": 8081, "metrics": 9102}
        env = {e["name"]: e.get("value") for e in operator["env"]}
        assert env["TRITONSCALE_OPERATOR_LIVENESS"] == "http://0.0.0.0:8080/healthz"
        assert env["TRITONSCALE_OPERATOR_READINESS"] == "http://0.0.0.0:8081/readyz"
        assert env["TRITONSCALE_OPERATOR_METRICS_PORT"] == "9102"
        assert operator["securityContext"]["readOnlyRootFilesystem"] is True
        assert operator["securityContext"]["runAsNonRoot"] is True
        assert pod["securityContext"]["runAsNonRoot"] is True
        account = one(objects, "ServiceAccount", "-operator")
        assert pod["serviceAccountName"] == account["metadata"]["name"]
        key = next(e for e in operator["env"] if e["name"] == "TRITONSCALE_REPOSITORY_KEY")
        assert key["valueFrom"]["secretKeyRef"]["key"] == "repository-key"
        service = one(objects, "Service", "-operator")
        assert [(p["name"], p["port"]) for p in service["spec"]["ports"]] == [("metrics", 9102)]

    def test_operator_tag_is_configurable(self, render) -> None:
        objects = render(sets=("operator.image.tag=1.2.3",)).objects
        assert container(one(objects, "Deployment", "-operator"), "operator")["image"].endswith(
            ":1.2.3"
        )

    def test_operator_off_leaves_out_its_objects(self, render) -> None:
        objects = render(sets=("operator.enabled=false",)).objects
        assert not [
            o
            for o in objects
            if o["metadata"]["labels"].get("app.kubernetes.io/component") == "operator"
        ]


class TestMonitoring:
    def test_defaults_render_no_monitoring_hpa_or_locust(self, render) -> None:
        objects = render().objects
        kinds = {o["kind"] for o in objects}
        assert not kinds & (MONITORING_KINDS | {"HorizontalPodAutoscaler"})
        assert not [o for o in objects if "grafana_dashboard" in o["metadata"]["labels"]]
        assert not [
            o
            for o in objects
            if o["metadata"]["labels"].get("app.kubernetes.io/component") == "locust"
        ]

    @pytest.mark.parametrize("kind", ["ServiceMonitor", "PodMonitor"])
    def test_monitors_scrape_triton_and_operator_metrics_ports(self, render, kind: str) -> None:
        values = "monitoring-values.yaml" if kind == "ServiceMonitor" else "podmonitor-values.yaml"
        objects = render(values).objects
        monitors = by_kind(objects, kind)
        assert len(monitors) == 2
        endpoints_key = "endpoints" if kind == "ServiceMonitor" else "podMetricsEndpoints"
        for monitor in monitors:
            component = monitor["metadata"]["labels"]["app.kubernetes.io/component"]
            assert monitor["spec"][endpoints_key][0]["port"] == "metrics"
            # The operator's own `namespace` label (the autoscaler's) must survive the scrape.
            honor = monitor["spec"][endpoints_key][0].get("honorLabels", False)
            assert honor is (component == "operator")
            if kind == "ServiceMonitor":
                assert monitor["metadata"]["labels"]["release"] == "kube-prometheus-stack"
                target = one(objects, "Service", f"-{component}")["metadata"]["labels"]
                assert any(
                    p["name"] == "metrics"
                    for p in one(objects, "Service", f"-{component}")["spec"]["ports"]
                )
            else:
                target = one(objects, "Deployment", f"-{component}")["spec"]["template"][
                    "metadata"
                ]["labels"]
            assert monitor["spec"]["selector"]["matchLabels"].items() <= target.items()

    def test_prometheus_rule_carries_the_rules_file(self, render, tmp_path: Path) -> None:
        objects = render("monitoring-values.yaml").objects
        rules_file = CHART / "files" / "rules" / "tritonscale.rules.yaml"
        rules = by_kind(objects, "PrometheusRule")
        assert len(rules) == 1
        assert rules[0]["metadata"]["labels"]["release"] == "kube-prometheus-stack"
        assert rules[0]["spec"]["groups"] == yaml.safe_load(rules_file.read_text())["groups"]
        # What Prometheus will load must be valid rules: promtool parses every expression.
        promtool = require_tool("promtool")
        rule_file = tmp_path / "rules.yaml"
        rule_file.write_text(yaml.safe_dump({"groups": rules[0]["spec"]["groups"]}))
        done = subprocess.run(
            [promtool, "check", "rules", str(rule_file)], capture_output=True, text=True
        )
        assert done.returncode == 0, done.stdout + done.stderr

    def test_dashboards_become_labelled_configmaps(self, render) -> None:
        objects = render(
            "monitoring-values.yaml", sets=("monitoring.dashboards.labelValue=yes",)
        ).objects
        sources = sorted((CHART / "files" / "dashboards").glob("*.json"))
        dashboards = [
            o
            for o in by_kind(objects, "ConfigMap")
            if "grafana_dashboard" in o["metadata"]["labels"]
        ]
        assert len(dashboards) == len(sources)
        by_file = {name: cm for cm in dashboards for name in cm["data"]}
        for source in sources:
            cm = by_file[source.name]
            assert cm["metadata"]["labels"]["grafana_dashboard"] == "yes"
            assert cm["metadata"]["annotations"] == {"grafana_folder": "Tritonscale"}
            assert json.loads(cm["data"][source.name]) == json.loads(source.read_text())


class TestHpaLocustAndHelmTest:
    def test_hpa_scales_the_triton_deployment_on_the_budgets_demand_ratio(self, render) -> None:
        objects = render("hpa-values.yaml").objects
        hpa = one(objects, "HorizontalPodAutoscaler")
        deployment = one(objects, "Deployment", "-triton")
        assert hpa["apiVersion"] == "autoscaling/v2"
        assert hpa["spec"]["scaleTargetRef"] == {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "name": deployment["metadata"]["name"],
        }
        assert (hpa["spec"]["minReplicas"], hpa["spec"]["maxReplicas"]) == (2, 6)
        # Pods are added only when instances cannot help: the models' needs exceed the
        # pod's instance budget (not on a queue, which the operator answers with instances).
        assert hpa["spec"]["metrics"] == [
            {
                "type": "External",
                "external": {
                    "metric": {
                        "name": "tritonscale_budget_demand_ratio",
                        "selector": {"matchLabels": {"budget": "triton"}},
                    },
                    "target": {"type": "Value", "value": "1"},
                },
            }
        ]
        assert "replicas" not in deployment["spec"]  # the HPA owns it

    def test_helm_test_pod_infers_bls_async_through_the_service(self, render) -> None:
        objects = render().objects
        pod = one(objects, "Pod", "-test-inference")
        assert pod["metadata"]["annotations"]["helm.sh/hook"] == "test"
        service = one(objects, "Service", "-triton")["metadata"]["name"]
        assert pod["spec"]["containers"][0]["command"] == [
            "python3",
            "/opt/tritonscale/scripts/check_inference.py",
            f"--url=http://{service}.{NAMESPACE}.svc:8000",
            "--model=bls_async",
        ]
        scripts = one(objects, "ConfigMap", "-scripts")
        assert (
            scripts["data"]["check_inference.py"]
            == (CHART / "files" / "scripts" / "check_inference.py").read_text()
        )
        # A namespace with a ResourceQuota on CPU or memory admits no pod without them.
        resources = pod["spec"]["containers"][0]["resources"]
        assert {"cpu", "memory"} <= set(resources["requests"])
        assert "memory" in resources["limits"]

    def test_uninstall_hook_deletes_the_autoscalers_before_the_operator_goes(self, render) -> None:
        # kopf's finalizer on each autoscaler needs the operator and its Role to be removed;
        # `helm uninstall` deletes all three together unless the hook goes first.
        objects = [
            o for o in render().objects if o["metadata"].get("name", "").endswith("-uninstall")
        ]
        assert sorted(o["kind"] for o in objects) == [
            "Job",
            "Role",
            "RoleBinding",
            "ServiceAccount",
        ]
        for obj in objects:
            assert obj["metadata"]["annotations"]["helm.sh/hook"] == "pre-delete"
        assert one(objects, "Role")["rules"] == [
            {
                "apiGroups": ["tritonscale.io"],
                "resources": ["instancegroupautoscalers"],
                "verbs": ["list", "delete", "patch"],
            }
        ]
        job = one(objects, "Job")
        command = job["spec"]["template"]["spec"]["containers"][0]["command"]
        assert command[:2] == ["python3", "/opt/tritonscale/scripts/delete_autoscalers.py"]
        selector = "app.kubernetes.io/name=tritonscale,app.kubernetes.io/instance=demo"
        assert f"--selector={selector},app.kubernetes.io/component=autoscaler" in command
        autoscaler = by_kind(render().objects, "InstanceGroupAutoscaler")[0]
        labels = autoscaler["metadata"]["labels"]
        for pair in f"{selector},app.kubernetes.io/component=autoscaler".split(","):
            key, value = pair.split("=")
            assert labels[key] == value
        off = render(sets=("operator.uninstall.deleteAutoscalers=false",)).objects
        assert not [o for o in off if o["metadata"].get("name", "").endswith("-uninstall")]

    def test_locust_runs_the_load_test_against_the_service(self, helm4: str) -> None:
        result = run_helm(helm4, *template_args("locust-values.yaml"))
        assert result.returncode == 0, result.stderr
        objects = result.objects
        job = locust_job(objects, "master")  # headless: one run, never restarted
        assert job["spec"]["backoffLimit"] == 0
        assert job["spec"]["template"]["spec"]["restartPolicy"] == "Never"
        master = container(job, "locust")
        # The workers quit with the master: a Job too, or they would be restarted into a
        # master that is gone; each worker runs once, retried only when it fails.
        workers = locust_job(objects, "worker")
        assert workers["spec"]["parallelism"] == workers["spec"]["completions"] == 4
        assert workers["spec"]["template"]["spec"]["restartPolicy"] == "OnFailure"
        # Locust's own image (loadtests/Dockerfile), not the operator's: that one has no Locust.
        for locust in (master, container(workers, "locust")):
            assert locust["image"] == "ghcr.io/tritonscale/tritonscale-locust:0.1.0"
        assert "--locustfile=/mnt/locust/bls.py" in master["args"]
        assert f"--host=http://demo-tritonscale-triton.{NAMESPACE}.svc:8000" in master["args"]
        assert {"--headless", "--users=64", "--run-time=10m", "--expect-workers=4"} <= set(
            master["args"]
        )
        assert "--master-host=demo-tritonscale-locust" in container(workers, "locust")["args"]
        service = one(objects, "Service", "-locust")
        master_labels = job["spec"]["template"]["metadata"]["labels"]
        assert service["spec"]["selector"].items() <= master_labels.items()
        files = one(objects, "ConfigMap", "-locustfiles")
        assert files["data"]["bls.py"] == (CHART / "files" / "loadtests" / "bls.py").read_text()


# What Locust, Python and the init container's tools write to: each must lie in an emptyDir.
LOCUST_WRITABLE_ENV = ("HOME", "XDG_CACHE_HOME", "TMPDIR")


@pytest.mark.parametrize(
    "sets",
    [
        ("locust.enabled=true",),
        ("locust.enabled=true", "locust.headless=true", "locust.runTime=1m"),
    ],
    ids=["web ui", "headless"],
)  # fmt: skip
def test_locust_runs_on_a_read_only_root_and_writes_only_to_emptydirs(
    render, sets: tuple[str, ...]
) -> None:
    objects = render(sets=sets).objects
    workloads = [
        o
        for o in objects
        if o["kind"] in ("Deployment", "Job")
        and o["metadata"]["labels"]["app.kubernetes.io/component"] == "locust"
    ]
    checked = []
    for workload in workloads:
        pod = workload["spec"]["template"]["spec"]
        empty_dirs = {v["name"] for v in pod["volumes"] if "emptyDir" in v}
        for item in [*pod.get("initContainers", []), *pod["containers"]]:
            where = f"{workload['metadata']['name']}/{item['name']}"
            assert item["securityContext"]["readOnlyRootFilesystem"] is True, where
            writable = [
                PurePosixPath(m["mountPath"])
                for m in item["volumeMounts"]
                if m["name"] in empty_dirs and not m.get("readOnly")
            ]
            env = {e["name"]: e.get("value") for e in item["env"]}
            for name in LOCUST_WRITABLE_ENV:
                path = PurePosixPath(env[name])
                assert any(path.is_relative_to(mount) for mount in writable), (
                    f"{where}: {name}={path} is not in an emptyDir (writable: {writable})"
                )
            # No byte code next to the read-only sources (the image's is compiled already).
            assert env["PYTHONDONTWRITEBYTECODE"] == "1", where
            checked.append(item["name"])
    assert sorted(checked) == ["locust", "locust", "wait-for-triton"]


def images(objects: list[dict]) -> dict[str, str]:
    """{object kind/name/container: image} over every container and init container."""
    found = {}
    for obj in objects:
        spec = obj.get("spec", {})
        pod = spec.get("template", {}).get("spec", spec) if obj["kind"] != "Pod" else spec
        for key in ("initContainers", "containers"):
            for item in pod.get(key) or []:
                found[f"{obj['kind']}/{obj['metadata']['name']}/{item['name']}"] = item["image"]
    return found


class TestImages:
    def test_global_image_registry_replaces_the_registry_of_every_image(self, render) -> None:
        objects = render(
            "locust-values.yaml",
            "image-repository-values.yaml",
            sets=("global.imageRegistry=mirror.example.com",),
        ).objects
        found = images(objects)
        assert len(found) >= 5  # Triton, its model copier, the operator, Locust x2, helm test
        assert {name: ref.split("/")[0] for name, ref in found.items()} == {
            name: "mirror.example.com" for name in found
        }
        assert "mirror.example.com/nvidia/tritonserver:24.10-py3" in found.values()
        assert "mirror.example.com/tritonscale/tritonscale-locust:0.1.0" in found.values()

    def test_without_it_each_image_keeps_its_own_registry(self, render) -> None:
        found = set(images(render("locust-values.yaml").objects).values())
        assert found == {
            "nvcr.io/nvidia/tritonserver:24.10-py3",
            "ghcr.io/tritonscale/tritonscale-operator:0.1.0",
            "ghcr.io/tritonscale/tritonscale-locust:0.1.0",
        }

    def test_the_model_image_without_a_tag_is_the_chart_s_release(self, render) -> None:
        # Not `latest`: with IfNotPresent a node keeps the models it pulled first.
        app_version = yaml.safe_load((CHART / "Chart.yaml").read_text())["appVersion"]
        objects = render(
            "image-repository-values.yaml", sets=("triton.modelRepository.image.tag=",)
        ).objects
        init = triton_pod(objects)["initContainers"][0]
        assert init["image"] == f"registry.example.com/team/models:{app_version}"

    def test_a_registry_with_a_space_is_refused(self, helm4: str) -> None:
        result = run_helm(helm4, *template_args(sets=("global.imageRegistry=a b",)))
        assert result.returncode != 0 and "imageRegistry" in result.stderr


def test_notes_name_the_images_and_how_to_build_and_push_them(helm4: str) -> None:
    done = subprocess.run(
        [helm4, "install", "demo", str(CHART), "--dry-run=client", "-n", NAMESPACE]
        + ["--set", "locust.enabled=true", "--set", "global.imageRegistry=mirror.example.com"],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr
    notes = done.stdout.split("NOTES:", 1)[1]
    assert "operator   mirror.example.com/tritonscale/tritonscale-operator:0.1.0" in notes
    assert "Locust     mirror.example.com/tritonscale/tritonscale-locust:0.1.0" in notes
    assert "make push REGISTRY=<registry>/tritonscale" in notes


def test_notes_say_how_to_reach_triton_and_the_dashboards(helm4: str) -> None:
    done = subprocess.run(
        [
            helm4,
            "install",
            "demo",
            str(CHART),
            "--dry-run=client",
            "-n",
            NAMESPACE,
            "-f",
            str(CHART / "ci" / "monitoring-values.yaml"),
        ],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr
    notes = done.stdout.split("NOTES:", 1)[1]
    assert f"http://demo-tritonscale-triton.{NAMESPACE}.svc:8000" in notes
    assert "port-forward svc/demo-tritonscale-triton" in notes
    assert "grafana_dashboard" in notes
    assert "helm test demo" in notes


def test_tools_are_on_this_machine(tools: dict[str, str]) -> None:
    for name, path in tools.items():
        assert shutil.which(path), name


def test_the_longest_release_name_keeps_names_valid_and_distinct(helm4: str) -> None:
    release = "r" * 53  # Helm's own limit
    args = [
        "template",
        release,
        str(CHART),
        "-n",
        NAMESPACE,
        "-f",
        str(CHART / "ci" / "peering-values.yaml"),
    ]
    result = run_helm(helm4, *args)
    assert result.returncode == 0, result.stderr
    keys = [(o["kind"], o["metadata"]["namespace"], o["metadata"]["name"]) for o in result.objects]
    assert len(keys) == len(set(keys))
    dns_label = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
    for _, _, name in keys:
        assert dns_label.match(name), name
    for volume in triton_pod(result.objects)["volumes"]:
        assert dns_label.match(volume["name"]), volume["name"]


def test_locust_with_its_web_ui_keeps_the_master_running(render) -> None:
    objects = render(sets=("locust.enabled=true",)).objects
    master = one(objects, "Deployment", "-locust-master")
    assert master["spec"]["replicas"] == 1
    assert "--headless" not in container(master, "locust")["args"]
    assert one(objects, "Deployment", "-locust-worker")["spec"]["replicas"] >= 1


@pytest.mark.parametrize("values_file", ["default-values.yaml", "peering-values.yaml"])
def test_operator_environment_names_options_the_cli_really_has(
    render, values_file: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The chart configures `tritonscale operator` only through click's auto env vars: each
    TRITONSCALE_OPERATOR_* it sets must be an option of the real command, and parse."""
    command = cli.main.commands["operator"]
    parent = click.Context(cli.main, auto_envvar_prefix="TRITONSCALE")
    context = click.Context(command, parent=parent, info_name="operator")
    options = {f"{context.auto_envvar_prefix}_{p.name.upper()}": p for p in command.params}
    deployment = one(render(values_file).objects, "Deployment", "-operator")
    env = {e["name"]: e["value"] for e in container(deployment, "operator")["env"] if "value" in e}
    ours = {name: value for name, value in env.items() if name.startswith("TRITONSCALE_OPERATOR_")}
    assert set(ours) <= set(options), f"not options of the CLI: {set(ours) - set(options)}"
    for name, value in ours.items():
        monkeypatch.setenv(name, value)
    parsed = {
        options[name].name: options[name].type_cast_value(
            context, options[name].value_from_envvar(context)
        )
        for name in ours
    }
    assert parsed["metrics_port"] == 9102
    assert parsed["liveness"] == "http://0.0.0.0:8080/healthz"
    assert parsed["readiness"] == "http://0.0.0.0:8081/readyz"
    assert NAMESPACE in parsed["namespaces"]
    if values_file == "peering-values.yaml":
        assert parsed["namespaces"] == (NAMESPACE, "inference-canary")
        assert parsed["peering"] == "demo-tritonscale"
        assert parsed["prometheus_url"].startswith("http://")


@pytest.mark.unit
def test_no_image_of_the_chart_defaults_to_latest() -> None:
    """Every image's default tag changes with the release (empty: the chart's appVersion) or
    is a fixed version: a moving tag with IfNotPresent leaves each node on what it pulled first."""

    def image_tags(value: object, path: str = "") -> dict[str, str]:
        found: dict[str, str] = {}
        if isinstance(value, dict):
            if "repository" in value and "tag" in value:
                found[path] = str(value["tag"])
            for key, item in value.items():
                found |= image_tags(item, f"{path}.{key}" if path else str(key))
        return found

    tags = image_tags(yaml.safe_load((CHART / "values.yaml").read_text()))
    assert tags["triton.modelRepository.image"] == ""
    assert {path: tag for path, tag in tags.items() if tag == "latest"} == {}
