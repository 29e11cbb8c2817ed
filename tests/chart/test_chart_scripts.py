"""The chart's two in-cluster scripts, run against a real tritonserver on models/.

files/scripts/triton_ready.py is the Triton pods' readiness probe; check_inference.py is
the `helm test` pod. Both are stdlib-only, so they run here as they run in the images.
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys

from tests.chart.helm import CHART

SCRIPTS = CHART / "files" / "scripts"


def run_script(name: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(SCRIPTS / name), *args], capture_output=True, text=True, timeout=60
    )


def test_ready_when_the_server_and_the_named_models_are(triton) -> None:
    done = run_script(
        "triton_ready.py", f"--url=http://{triton.http_url}", "bls_async", "pipeline_async"
    )
    assert done.returncode == 0, done.stdout + done.stderr


def test_not_ready_names_the_model_that_is_not(triton) -> None:
    done = run_script(
        "triton_ready.py", f"--url=http://{triton.http_url}", "bls_async", "no_such_model"
    )
    assert done.returncode == 1
    assert done.stdout.strip() == "not ready: /v2/models/no_such_model/ready"


def test_not_ready_when_nothing_listens() -> None:
    done = run_script("triton_ready.py", "--url=http://127.0.0.1:9", "--timeout=1")
    assert done.returncode == 1
    assert "/v2/health/ready" in done.stdout


def test_helm_test_inference_on_bls_async_passes(triton) -> None:
    done = run_script("check_inference.py", f"--url=http://{triton.http_url}", "--model=bls_async")
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.startswith("OK: bls_async")


def test_helm_test_inference_fails_on_a_model_with_another_interface(triton) -> None:
    done = run_script(
        "check_inference.py", f"--url=http://{triton.http_url}", "--model=bls_decoupled_sync"
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
