"""The three images really built (`make images`: hack/images.py) and really run with runc.

Each image is built from its Dockerfile (buildah on the Debian stand-in for python:3.11-slim
where no Docker engine runs), unpacked from its OCI archive and run as the chart runs it:
its user (65532 for the operator and Locust, 1000 for Triton), a read-only root filesystem,
no capabilities, /tmp a writable tmpfs. A cold build takes minutes (the base, then three
pip installs); a second build with nothing changed reuses every image in seconds.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from hack import images
from tests.containers import Bundle, Runc, runc_spec, unpack
from tests.tooling import require_tool
from tests.venvs import REPO_ROOT, clean_environment
from tritonscale.local.ports import LOOPBACK, free_ports

pytestmark = [pytest.mark.slow, pytest.mark.timeout(3600)]

# The cold path on 2 shared cores took 5 to 8 min (the base under 2 min, the three images 3 to 6).
BUILD_TIMEOUT_S = 45 * 60
# Nothing changed: every image reused. Measured under 1 s; generous for a busy machine.
WARM_BUILD_S = 30
CHART_USERS = {
    "tritonscale-operator": (65532, 65532),
    "tritonscale-locust": (65532, 65532),
    "tritonscale-triton-cpu": (1000, 1000),
}


def build_images() -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "hack.images", "build"],
        cwd=REPO_ROOT,
        env=clean_environment(),
        capture_output=True,
        text=True,
        timeout=BUILD_TIMEOUT_S,
    )


@pytest.fixture(scope="module")
def built(pytestconfig: pytest.Config) -> dict[str, Path]:
    """Every image's OCI archive, built (or reused) by `python -m hack.images build`."""
    if not images.docker_engine():
        for tool in ("buildah", "debootstrap"):
            require_tool(tool)
    require_tool("runc")
    started = time.monotonic()
    done = build_images()
    assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]
    # Each step's output (lines starting "  [") is for a person watching; the rest says what
    # was built or reused and each image's size.
    lines = [line for line in done.stdout.splitlines() if not line.startswith("  [")]
    show(pytestconfig, [f"\nmake images: {time.monotonic() - started:.0f} s", *lines])
    return {image.name: image.archive for image in images.IMAGES}


@pytest.fixture(scope="module")
def runc(tmp_path_factory: pytest.TempPathFactory) -> Runc:
    return Runc(tmp_path_factory.mktemp("runc-state"))


@pytest.fixture(scope="module")
def bundles(
    built: dict[str, Path], tmp_path_factory: pytest.TempPathFactory, pytestconfig: pytest.Config
) -> Iterator[dict[str, Bundle]]:
    """Each image unpacked from its archive; its size and layers shown in the test output."""
    found = {}
    for name, archive in built.items():
        bundle = unpack(archive, tmp_path_factory.mktemp(name) / "bundle")
        found[name] = bundle
        line = (
            f"{name}: archive {archive.stat().st_size / 1e6:.0f} MB, "
            f"{len(bundle.layers)} layers, files {bundle.size_bytes / 1e6:.0f} MB"
        )
        show(pytestconfig, [line])
    yield found
    # About 1.2 GB of files: not left for pytest's last three temporary folders to keep.
    for bundle in found.values():
        shutil.rmtree(bundle.path)


def show(config: pytest.Config, lines: list[str]) -> None:
    """Lines in the test output even when it passes (pytest captures a fixture's prints)."""
    capture = config.pluginmanager.getplugin("capturemanager")
    with capture.global_and_fixture_disabled():
        for line in lines:
            print(line, flush=True)


def test_a_second_build_with_nothing_changed_reuses_every_image(built: dict[str, Path]) -> None:
    started = time.monotonic()
    done = build_images()
    took = time.monotonic() - started
    assert done.returncode == 0, done.stderr[-2000:]
    for image in images.IMAGES:
        assert f"reused {image.local_name(images.chart_version())}" in done.stdout, done.stdout
    assert "building" not in done.stdout
    assert took < WARM_BUILD_S, f"a build with nothing changed took {took:.0f} s"


def test_each_image_is_two_layers_over_the_base(bundles: dict[str, Bundle]) -> None:
    # One layer of the base, one of the Dockerfile's final stage (buildah squashes a stage's
    # steps): a new RUN or COPY must not add a layer of its own unnoticed.
    for name, bundle in bundles.items():
        assert len(bundle.layers) <= 2, f"{name}: {len(bundle.layers)} layers"


def test_the_operator_image_answers_as_the_chart_runs_it(
    bundles: dict[str, Bundle], runc: Runc
) -> None:
    bundle = bundles["tritonscale-operator"]
    runc_spec(
        bundle, ["tritonscale", "operator", "--help"], user=CHART_USERS["tritonscale-operator"]
    )
    done = runc.run(bundle)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "Usage: tritonscale operator" in done.stdout


def test_the_locust_image_answers_as_the_chart_runs_it(
    bundles: dict[str, Bundle], runc: Runc
) -> None:
    bundle = bundles["tritonscale-locust"]
    runc_spec(bundle, ["locust", "--version"], user=CHART_USERS["tritonscale-locust"])
    done = runc.run(bundle)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "locust 2." in (done.stdout + done.stderr)


def test_the_triton_image_serves_the_repository_models_as_the_chart_runs_it(
    bundles: dict[str, Bundle], runc: Runc, tmp_path: Path
) -> None:
    bundle = bundles["tritonscale-triton-cpu"]
    user = CHART_USERS["tritonscale-triton-cpu"]
    http, grpc, metrics = free_ports(3, LOOPBACK)
    key = "test-repository-key"
    # The chart's command and arguments (templates/triton-deployment.yaml), on free loopback
    # ports of the host's network instead of 8000-8002 in a pod's own.
    restricted = "model-repository,shared-memory,logging,trace:tritonscale-repository-key=" + key
    command = [
        "/bin/sh",
        "-c",
        'rm -f /dev/shm/triton_python_backend_shm_region_* && exec tritonserver "$@"',
        "tritonserver",
        "--model-repository=/models",
        "--model-control-mode=explicit",
        "--load-model=add_sub",
        "--load-model=pytorch",
        "--load-model=bls_async",
        f"--http-address={LOOPBACK}",
        f"--http-port={http}",
        f"--grpc-address={LOOPBACK}",
        f"--grpc-port={grpc}",
        f"--metrics-address={LOOPBACK}",
        f"--metrics-port={metrics}",
        "--exit-timeout-secs=5",
        "--rate-limit=execution_count",
        f"--http-restricted-api={restricted}",
        f"--grpc-restricted-protocol={restricted}",
        "--log-verbose=0",
    ]
    runc_spec(
        bundle,
        command,
        user=user,
        host_network=True,
        binds={
            str(REPO_ROOT / "models"): "/models",
            str(
                REPO_ROOT / "charts" / "tritonscale" / "files" / "scripts"
            ): "/opt/tritonscale/scripts",
        },
    )
    log = tmp_path / "tritonserver.log"
    url = f"http://{LOOPBACK}:{http}"
    with runc.started(bundle, log) as container:
        wait_until_ready(url, container.process, log)
        for model in ("add_sub", "bls_async"):
            outputs = infer(url, model, [1, 2, 3, 4], [4, 3, 2, 1])
            assert outputs == {"OUTPUT0": [5, 5, 5, 5], "OUTPUT1": [-3, -1, 1, 3]}, model
        # The chart's readiness probe: the image's python3 runs the chart's script.
        probe = ["python3", "/opt/tritonscale/scripts/triton_ready.py", f"--url={url}"]
        done = runc.exec(container.name, [*probe, "add_sub", "bls_async"], user=user)
        assert done.returncode == 0, done.stdout + done.stderr
        not_loaded = runc.exec(container.name, [*probe, "square_int32"], user=user)
        assert not_loaded.returncode == 1, not_loaded.stdout + not_loaded.stderr


def wait_until_ready(url: str, process: subprocess.Popen[bytes], log: Path) -> None:
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        if process.poll() is not None:
            pytest.fail(f"tritonserver exited ({process.returncode}): {log.read_text()[-3000:]}")
        try:
            with urllib.request.urlopen(f"{url}/v2/health/ready", timeout=5) as answer:
                if answer.status == 200:
                    return
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            pass
        time.sleep(0.5)
    pytest.fail(f"tritonserver in the image not ready after 180 s: {log.read_text()[-3000:]}")


def infer(url: str, model: str, first: list[float], second: list[float]) -> dict[str, list]:
    body = {
        "inputs": [
            {"name": "INPUT0", "datatype": "FP32", "shape": [4], "data": first},
            {"name": "INPUT1", "datatype": "FP32", "shape": [4], "data": second},
        ]
    }
    request = urllib.request.Request(
        f"{url}/v2/models/{model}/infer",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )
    try:
        with urllib.request.urlopen(request, timeout=30) as answer:
            outputs = json.load(answer)["outputs"]
    except urllib.error.HTTPError as error:
        pytest.fail(f"{model}: HTTP {error.code}: {error.read().decode(errors='replace')}")
    return {output["name"]: output["data"] for output in outputs}
