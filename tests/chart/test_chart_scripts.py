"""The chart's model repository and its two in-cluster scripts, on a real tritonserver.

The Triton pod's model volumes are rebuilt here as the kubelet lays out a ConfigMap
volume with `items` (a timestamped folder, a `..data` link to it, and one link per
top-level entry), from the ConfigMaps the chart renders in CPU mode. tritonserver 2.51
(NGC 24.10's) must load every model from that layout. Against it run
files/scripts/triton_ready.py (the readiness probe) and check_inference.py (the `helm
test` pod); both are stdlib-only, so they run here as they run in the images.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.chart.helm import CHART, by_kind, one
from tests.tooling import require_local_triton
from tritonscale.local.ports import free_port
from tritonscale.local.triton_server import LocalTriton

SCRIPTS = CHART / "files" / "scripts"


def lay_out_like_the_kubelet(objects: list[dict], root: Path) -> list[str]:
    """Write the Triton pod's /models/<model> ConfigMap volumes under root; return the models."""
    deployment = one(objects, "Deployment", "-triton")
    pod = deployment["spec"]["template"]["spec"]
    (tritonserver,) = [c for c in pod["containers"] if c["name"] == "tritonserver"]
    volumes = {v["name"]: v for v in pod["volumes"]}
    configmaps = {cm["metadata"]["name"]: cm for cm in by_kind(objects, "ConfigMap")}
    models = []
    for mount in tritonserver["volumeMounts"]:
        if not mount["mountPath"].startswith("/models/"):
            continue
        source = volumes[mount["name"]]["configMap"]
        data = configmaps[source["name"]]["data"]
        folder = root / mount["mountPath"].removeprefix("/models/")
        payload = folder / "..2024_11_29_18_00_00.000000001"
        for item in source["items"]:
            target = payload / item["path"]
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(data[item["key"]])
        os.symlink(payload.name, folder / "..data")
        for top in {item["path"].split("/")[0] for item in source["items"]}:
            os.symlink(f"..data/{top}", folder / top)
        models.append(folder.name)
    return models


@pytest.fixture(scope="module")
def chart_triton(render, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalTriton]:
    """tritonserver on the chart's CPU-mode model ConfigMaps, laid out as in the pod."""
    require_local_triton()
    repository = tmp_path_factory.mktemp("pod") / "models"
    models = lay_out_like_the_kubelet(render("cpu-only-values.yaml").objects, repository)
    assert "bls_async" in models
    # A short exit timeout bounds teardown: Triton 2.51 waits for idle HTTP connections
    # too, and one left open by the readiness polling holds it for the whole timeout.
    with LocalTriton(
        repository, http_port=0, grpc_port=0, metrics_port=0, exit_timeout_s=3
    ) as server:
        yield server


def run_script(name: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(SCRIPTS / name), *args], capture_output=True, text=True, timeout=60
    )


def test_every_model_loads_from_the_configmap_layout(chart_triton: LocalTriton) -> None:
    models = sorted(p.name for p in chart_triton.model_repository.iterdir())
    done = run_script("triton_ready.py", f"--url=http://{chart_triton.http_url}", *models)
    assert done.returncode == 0, done.stdout + done.stderr


def test_ready_when_the_server_and_the_named_models_are(chart_triton: LocalTriton) -> None:
    done = run_script(
        "triton_ready.py", f"--url=http://{chart_triton.http_url}", "bls_async", "pipeline_async"
    )
    assert done.returncode == 0, done.stdout + done.stderr


def test_not_ready_names_the_model_that_is_not(chart_triton: LocalTriton) -> None:
    done = run_script(
        "triton_ready.py", f"--url=http://{chart_triton.http_url}", "bls_async", "no_such_model"
    )
    assert done.returncode == 1
    assert done.stdout.strip() == "not ready: /v2/models/no_such_model/ready"


def test_not_ready_when_nothing_listens() -> None:
    done = run_script("triton_ready.py", f"--url=http://127.0.0.1:{free_port()}", "--timeout=1")
    assert done.returncode == 1
    assert "/v2/health/ready" in done.stdout


def test_a_bounded_wait_gives_up_at_its_limit_with_one_line_naming_what_it_waited_for() -> None:
    # The headless Locust master's init container: no Triton answers, so it must end.
    url = f"http://127.0.0.1:{free_port()}"
    started = time.monotonic()
    done = run_script("triton_ready.py", f"--url={url}", "--timeout=1", "--wait=3", "bls_async")
    assert done.returncode == 1
    assert time.monotonic() - started < 10
    assert done.stdout.strip() == (
        f"gave up after 3 s waiting for Triton at {url}: "
        "not ready: /v2/health/ready, /v2/models/bls_async/ready"
    )


def test_a_bounded_wait_ends_as_soon_as_triton_is_ready(chart_triton: LocalTriton) -> None:
    started = time.monotonic()
    done = run_script(
        "triton_ready.py", f"--url=http://{chart_triton.http_url}", "--wait=600", "bls_async"
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert time.monotonic() - started < 30


def test_helm_test_inference_on_bls_async_passes(chart_triton: LocalTriton) -> None:
    done = run_script(
        "check_inference.py", f"--url=http://{chart_triton.http_url}", "--model=bls_async"
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.startswith("OK: bls_async")


def test_helm_test_inference_fails_on_a_model_with_another_interface(
    chart_triton: LocalTriton,
) -> None:
    done = run_script(
        "check_inference.py", f"--url=http://{chart_triton.http_url}", "--model=bls_decoupled_sync"
    )
    assert done.returncode == 1
    assert done.stdout.startswith("FAIL: bls_decoupled_sync: HTTP 400")


def test_helm_test_check_catches_wrong_outputs() -> None:
    spec = importlib.util.spec_from_file_location("check_inference", SCRIPTS / "check_inference.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    right = {
        "outputs": [
            {"name": "OUTPUT0", "data": [11, 22, 33, 44]},
            {"name": "OUTPUT1", "data": [-9, -18, -27, -36]},
        ]
    }
    assert module.check(right) is None
    swapped = {
        "outputs": [
            {"name": "OUTPUT0", "data": [-9, -18, -27, -36]},
            {"name": "OUTPUT1", "data": [11, 22, 33, 44]},
        ]
    }
    assert (
        module.check(swapped) == "OUTPUT0 is [-9, -18, -27, -36], expected [11.0, 22.0, 33.0, 44.0]"
    )
    assert module.check({"outputs": []}) == "OUTPUT0 missing from the reply"
