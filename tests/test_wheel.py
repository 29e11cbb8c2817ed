"""The wheel, installed for real into fresh environments, run from outside the checkout.

The base install (no extras) must run `tritonscale operator` and `tritonscale tune` and hold
neither Locust nor matplotlib; the server and load extras must run `tritonscale serve`.
Each command runs in a temporary directory with no PYTHONPATH, so nothing of the checkout
is on any path. Slow: each environment is a real pip install (from pip's cache when warm).
"""

from __future__ import annotations

import asyncio
import json
import queue
import shutil
import signal
import subprocess
import threading
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests
import yaml
from packaging.utils import canonicalize_name

from hack import lock
from tests.test_local_triton import stub_processes
from tests.tooling import require_local_triton
from tests.venvs import REPO_ROOT, Environment, clean_environment, megabytes
from tritonscale import REPOSITORY_KEY_ENV
from tritonscale.local.ports import free_ports
from tritonscale.local.triton_server import LocalTriton
from tritonscale.triton.actuator import Actuator
from tritonscale.triton.endpoints import Endpoint

pytestmark = pytest.mark.slow

# What the operator's image must not carry: the load, report and server extras. (tritonclient
# and its numpy are in the base: the operator drives Triton's repository API through it.)
NOT_IN_THE_BASE = {"locust", "matplotlib", "nvidia-pytriton", "grpcio"}
ADD_SUB_REQUEST = {
    "inputs": [
        {"name": "INPUT0", "datatype": "FP32", "shape": [4], "data": [1, 2, 3, 4]},
        {"name": "INPUT1", "datatype": "FP32", "shape": [4], "data": [10, 20, 30, 40]},
    ]
}


def run(environment: Environment, *args: str, cwd: Path, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [environment.bin("tritonscale"), *args],
        cwd=cwd,
        env=clean_environment(**env),
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_the_wheel_holds_the_package_and_its_metadata_only(wheel: Path) -> None:
    names = zipfile.ZipFile(wheel).namelist()
    outside = [n for n in names if not n.startswith(("tritonscale/", "tritonscale-"))]
    assert outside == []
    assert "tritonscale/cli.py" in names and "tritonscale/core/policy.py" in names
    # The local cluster (Go sources, its bring-up, the node) is development tooling, kept in
    # hack/; the wheel is what the operator image installs, so the image holds none of it.
    tooling = [n for n in names if n.endswith((".go", "go.mod", "go.sum", "cluster.py"))]
    assert tooling == [] and not any("demo_k8s" in n or "hack/" in n for n in names)
    assert not any(n.startswith("tritonscale/local/node") for n in names), "a node in the wheel"


def test_the_base_install_holds_the_operator_and_no_extra(
    base_install: Environment, tmp_path: Path
) -> None:
    packages = base_install.packages()
    assert "tritonscale" in packages
    # Installed as the image installs it: the lock's distributions and the package, no other.
    locked = set(lock.pins(lock.LOCK.read_text()))
    assert {canonicalize_name(name) for name in packages} == locked | {"tritonscale"}
    assert {name.lower() for name in packages} & NOT_IN_THE_BASE == set()
    size = megabytes(base_install.size_bytes())
    print(f"base install: {len(packages)} distributions, {size} MB: {packages}")

    where = subprocess.run(
        [str(base_install.python), "-c", "import tritonscale; print(tritonscale.__file__)"],
        cwd=tmp_path,
        env=clean_environment(),
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout.strip()
    assert Path(where).is_relative_to(base_install.path), "the package came from the checkout"

    help_text = run(base_install, "operator", "--help", cwd=tmp_path)
    assert help_text.returncode == 0, help_text.stderr
    assert "--all-namespaces" in help_text.stdout and "--prometheus-url" in help_text.stdout


def test_the_base_install_tunes_a_real_triton(base_install: Environment, tmp_path: Path) -> None:
    require_local_triton()  # the test's own environment has the server extra; the base has not
    with LocalTriton(http_port=0, grpc_port=0, metrics_port=0, models=["add_sub"]) as server:
        spec = {"model": "add_sub", "minInstances": 2, "intervalSeconds": 1}
        config = {
            "triton": {"http": [server.http_url], "metrics": [server.metrics_url]},
            "policies": [{"name": "adder", "spec": spec}],
        }
        (tmp_path / "policies.yaml").write_text(yaml.safe_dump(config))
        tuned = run(
            base_install,
            *("tune", "--config", "policies.yaml", "--decision-log", "decisions.jsonl"),
            *("--metrics-port", "0", "--duration", "4"),
            cwd=tmp_path,
            **{REPOSITORY_KEY_ENV: server.repository_key},
        )
        assert tuned.returncode == 0, tuned.stdout + tuned.stderr
        assert "add_sub 1 -> 2 TooFewInstances" in tuned.stdout
        records = [
            json.loads(line) for line in (tmp_path / "decisions.jsonl").read_text().splitlines()
        ]
        assert records and records[-1]["current"] == 2
        live = asyncio.run(
            Actuator(server.repository_key).live_count(
                Endpoint("local", server.http_url), "add_sub"
            )
        )
        assert live == 2


@pytest.mark.parametrize(
    ("args", "extra", "absent"),
    [
        pytest.param(("serve",), "server", "pytriton", id="serve needs the server"),
        pytest.param(("demo",), "server", "pytriton", id="demo needs the server first"),
        pytest.param(("report",), "reports", "matplotlib", id="report needs matplotlib"),
        pytest.param(
            ("dashboards", "preview", "--prometheus", "http://127.0.0.1:9"),
            "reports",
            "matplotlib",
            id="dashboard previews need matplotlib",
        ),
    ],
)
def test_a_command_whose_extra_is_missing_names_it_in_one_line(
    base_install: Environment, tmp_path: Path, args: tuple[str, ...], extra: str, absent: str
) -> None:
    done = run(base_install, *args, cwd=tmp_path)
    command = " ".join(["tritonscale", *(a for a in args if not a.startswith(("-", "http")))])
    assert done.returncode == 1
    assert done.stdout == ""
    assert done.stderr == (
        f"Error: '{command}' needs the {extra} extra ({absent} not installed): "
        f"pip install 'tritonscale[{extra}]'\n"
    )


# ---- the server and load extras: `tritonscale serve` from another directory ----------------


@pytest.fixture(scope="module")
def serve_install(wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Environment:
    path = tmp_path_factory.mktemp("serve") / "venv"
    return Environment.create(path, f"{wheel}[server,load]", compile_bytecode=False)


@pytest.fixture
def model_repository(tmp_path: Path) -> Path:
    """The checkout's models/ copied away, so the server reads nothing of the checkout."""
    return Path(shutil.copytree(REPO_ROOT / "models", tmp_path / "repository"))


class Lines:
    """A process's output lines, read on a thread so that a silent process cannot hang a test."""

    def __init__(self, process: subprocess.Popen[str]) -> None:
        self.seen: list[str] = []
        self._queue: queue.Queue[str | None] = queue.Queue()
        self._thread = threading.Thread(target=self._read, args=(process,), daemon=True)
        self._thread.start()

    def _read(self, process: subprocess.Popen[str]) -> None:
        assert process.stdout is not None
        for line in process.stdout:
            self._queue.put(line)
        self._queue.put(None)

    def wait_for(self, marker: str, timeout_s: float, what: str) -> None:
        try:
            while (line := self._queue.get(timeout=timeout_s)) is not None:
                self.seen.append(line)
                if marker in line:
                    return
        except queue.Empty:
            pass
        pytest.fail(f"{what}: no line with {marker!r} within {timeout_s:.0f} s; got {self.seen}")

    def rest(self) -> str:
        self._thread.join(timeout=10)
        while not self._queue.empty():
            if (line := self._queue.get()) is not None:
                self.seen.append(line)
        return "".join(self.seen)


@pytest.fixture
def served(serve_install: Environment, tmp_path: Path) -> Iterator[list]:
    """Processes the test starts; any still running at the end is stopped (and the test fails)."""
    processes: list[subprocess.Popen[str]] = []
    yield processes
    for process in processes:
        if process.poll() is None:
            # SIGTERM first: serve stops its tritonserver (in a session of its own, which a
            # SIGKILL of serve would leave running).
            process.terminate()
            try:
                process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(timeout=30)


@pytest.mark.parametrize(
    ("stop_signal", "models", "model"),
    [
        pytest.param(
            signal.SIGINT, ("bls_async", "add_sub", "pytorch"), "bls_async", id="BLS, Ctrl-C"
        ),
        pytest.param(signal.SIGTERM, ("add_sub",), "add_sub", id="one model, SIGTERM"),
    ],
)
def test_serve_from_another_directory_answers_and_stops_cleanly(
    serve_install: Environment,
    model_repository: Path,
    served: list,
    tmp_path: Path,
    stop_signal: signal.Signals,
    models: tuple[str, ...],
    model: str,
) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    http_port, grpc_port, metrics_port = free_ports(3)
    command = (
        [serve_install.bin("tritonscale"), "serve"]
        + ["--model-repository", str(model_repository), "--http-port", str(http_port)]
        + ["--grpc-port", str(grpc_port), "--metrics-port", str(metrics_port)]
        + [f"--model={name}" for name in models]
    )
    if stop_signal == signal.SIGINT:
        # Started as a script's background job is (and as CI may start the tests): with SIGINT
        # ignored, which Python keeps unless told otherwise. `kill -INT` must still stop it.
        command = ["sh", "-c", 'trap "" INT; exec "$@"', "serve", *command]
    process = subprocess.Popen(
        command,
        cwd=elsewhere,
        env=clean_environment(),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    served.append(process)
    lines = Lines(process)
    lines.wait_for("model-repository API key", 120, "tritonscale serve did not get ready")

    answer = requests.post(
        f"http://127.0.0.1:{http_port}/v2/models/{model}/infer", json=ADD_SUB_REQUEST, timeout=30
    )
    assert answer.status_code == 200, answer.text
    outputs = {o["name"]: o["data"] for o in answer.json()["outputs"]}
    assert outputs == {"OUTPUT0": [11, 22, 33, 44], "OUTPUT1": [-9, -18, -27, -36]}

    process.send_signal(stop_signal)
    try:
        code = process.wait(timeout=90)
    except subprocess.TimeoutExpired:
        pytest.fail(f"tritonscale serve did not stop within 90 s of {stop_signal.name}")
    output = lines.rest()
    assert code == 0, output
    assert output.rstrip().endswith("stopped") and "Traceback" not in output
    assert stub_processes(model_repository) == []
