"""The local runtime: a real tritonserver, its errors, its locked repository API, live reloads."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import requests
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests.waiting import wait_for
from tritonscale import REPOSITORY_KEY_ENV, REPOSITORY_KEY_HEADER
from tritonscale.local.ports import free_ports
from tritonscale.local.triton_server import LocalTriton, LocalTritonError

ECHO_CONFIG = """
name: "{name}"
backend: "python"
input [ {{ name: "IN" data_type: TYPE_FP32 dims: [ 1 ] }} ]
output [ {{ name: "OUT" data_type: TYPE_FP32 dims: [ 1 ] }} ]
instance_group [ {{ count: 1 kind: KIND_CPU }} ]
"""

ECHO_MODEL = """
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        return [
            pb_utils.InferenceResponse(
                [pb_utils.Tensor("OUT", pb_utils.get_input_tensor_by_name(r, "IN").as_numpy())]
            )
            for r in requests
        ]
"""


def write_model(repository: Path, name: str, source: str = ECHO_MODEL) -> None:
    version = repository / name / "1"
    version.mkdir(parents=True)
    (repository / name / "config.pbtxt").write_text(ECHO_CONFIG.format(name=name))
    (version / "model.py").write_text(source)


def add_sub_inputs() -> list[httpclient.InferInput]:
    inputs = [httpclient.InferInput(n, [4], "FP32") for n in ("INPUT0", "INPUT1")]
    inputs[0].set_data_from_numpy(np.arange(4, dtype=np.float32))
    inputs[1].set_data_from_numpy(np.ones(4, dtype=np.float32))
    return inputs


def live_instance_count(server: LocalTriton, model: str) -> int:
    config = requests.get(f"http://{server.http_url}/v2/models/{model}/config", timeout=5).json()
    return sum(group["count"] for group in config["instance_group"])


def load_with_instances(server: LocalTriton, model: str, count: int) -> requests.Response:
    """The operator's actuation: the live config with only instance_group changed."""
    config = requests.get(f"http://{server.http_url}/v2/models/{model}/config", timeout=5).json()
    config["instance_group"] = [{"count": count, "kind": "KIND_CPU"}]
    return requests.post(
        f"http://{server.http_url}/v2/repository/models/{model}/load",
        json={"parameters": {"config": json.dumps(config)}},
        headers=server.repository_headers,
        timeout=60,
    )


def stub_processes(model_repository: Path) -> list[str]:
    """Python backend stubs still running for models of this repository."""
    found = subprocess.run(
        ["pgrep", "-a", "-f", f"triton_python_backend_stub {model_repository}"],
        capture_output=True,
        text=True,
    ).stdout
    return [line for line in found.splitlines() if line.strip()]


class TestStartup:
    def test_a_model_that_fails_to_load_is_named_with_tritons_reason(self, tmp_path: Path) -> None:
        write_model(tmp_path, "echo")
        write_model(tmp_path, "broken", source="import no_such_module_anywhere\n")
        server = LocalTriton(tmp_path, http_port=0, grpc_port=0, metrics_port=0)
        with pytest.raises(LocalTritonError) as raised:
            server.start()
        message = str(raised.value)
        assert "model 'broken' failed to load" in message
        assert "no_such_module_anywhere" in message
        assert "\n" not in message
        assert not server.is_running()

    def test_a_port_in_use_is_refused_before_starting(self, tmp_path: Path) -> None:
        write_model(tmp_path, "echo")
        with socket.socket() as busy:
            busy.bind(("0.0.0.0", 0))
            busy.listen()
            port = busy.getsockname()[1]
            server = LocalTriton(tmp_path, http_port=port, grpc_port=0, metrics_port=0)
            with pytest.raises(LocalTritonError, match=f"HTTP port {port} is already in use"):
                server.start()

    @pytest.mark.unit
    @pytest.mark.parametrize(
        ("addresses", "message"),
        [
            pytest.param({}, "the gRPC and metrics ports are both {port}", id="one address"),
            pytest.param(
                {"grpc_address": "0.0.0.0"},
                "the gRPC and metrics ports are both {port}",
                id="every address and one of them",
            ),
        ],
    )
    def test_two_listeners_on_one_port_are_refused_before_starting(
        self, tmp_path: Path, addresses: dict[str, str], message: str
    ) -> None:
        """Triton would exit with its usage and the reason last; this says it in one line."""
        write_model(tmp_path, "echo")
        http_port, port = free_ports(2)
        server = LocalTriton(
            tmp_path, http_port=http_port, grpc_port=port, metrics_port=port, **addresses
        )
        with pytest.raises(LocalTritonError) as raised:
            server.start()
        assert str(raised.value) == (
            message.format(port=port) + "; each needs its own (--grpc-port, --metrics-port)"
        )

    @pytest.mark.parametrize(
        ("extra_args", "reason"),
        [
            pytest.param(
                ["--no-such-option=1"],
                "tritonserver: unrecognized option '--no-such-option=1'",
                id="an option it does not know (named before its usage)",
            ),
            pytest.param(
                ["--http-thread-count=zero"],
                "Invalid option value. Got zero",
                id="a value it rejects (named after its usage)",
            ),
        ],
    )
    def test_a_command_line_tritonserver_refuses_is_named_by_its_reason(
        self, tmp_path: Path, extra_args: list[str], reason: str
    ) -> None:
        write_model(tmp_path, "echo")
        server = LocalTriton(
            tmp_path, http_port=0, grpc_port=0, metrics_port=0, extra_args=extra_args
        )
        with pytest.raises(LocalTritonError) as raised:
            server.start()
        assert str(raised.value) == f"tritonserver exited with code 1: {reason}"

    @pytest.mark.unit
    @pytest.mark.parametrize(
        ("addresses", "message"),
        [
            pytest.param(
                {"http_address": "localhost:8000"},
                "HTTP address 'localhost:8000' is not an IP address (e.g. 127.0.0.1 or 0.0.0.0)",
                id="not an IP address",
            ),
            pytest.param(
                {"grpc_address": "192.0.2.7"},  # TEST-NET-1: never an address of this machine
                "cannot listen on gRPC address 192.0.2.7: Cannot assign requested address",
                id="an address of another machine",
            ),
        ],
    )
    def test_an_address_it_cannot_listen_on_is_one_line(
        self, tmp_path: Path, addresses: dict[str, str], message: str
    ) -> None:
        with pytest.raises(LocalTritonError) as raised:
            LocalTriton(tmp_path, http_port=0, grpc_port=0, metrics_port=0, **addresses)
        assert str(raised.value) == message

    @pytest.mark.unit
    def test_ports_left_at_0_beside_a_named_one_are_drawn_together(
        self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """Drawn one by one, the kernel may hand out one port twice; here it always would."""
        monkeypatch.setattr("tritonscale.local.triton_server.free_port", lambda address: 40000)
        http_port = free_ports(1)[0]
        server = LocalTriton(tmp_path, http_port=http_port, grpc_port=0, metrics_port=0)
        ports = [server.http_port, server.grpc_port, server.metrics_port]
        assert ports[0] == http_port
        assert len(set(ports)) == 3 and 0 not in ports, ports

    @pytest.mark.parametrize("seen", ["before starting", "by tritonserver"])
    def test_a_port_of_its_own_choice_taken_meanwhile_is_chosen_again(
        self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, seen: str
    ) -> None:
        """Ports asked as 0 are chosen when the object is made; another process may bind one
        before tritonserver does (seen with a dozen servers starting at once)."""
        write_model(tmp_path, "echo")
        server = LocalTriton(tmp_path, http_port=0, grpc_port=0, metrics_port=0)
        chosen = server.grpc_port
        if seen == "by tritonserver":  # the check before starting misses it: Triton's bind fails
            monkeypatch.setattr(
                "tritonscale.local.triton_server.port_is_taken", lambda port, address: False
            )
        with socket.socket() as thief:
            thief.bind(("127.0.0.1", chosen))
            thief.listen()
            with server:
                assert server.grpc_port != chosen
                assert server.ready_models() == ["echo"]
                log = server.log_path.read_text(errors="replace")
        if seen == "by tritonserver":
            assert f"Socket '127.0.0.1:{chosen}' already in use" in log  # the first try's

    def test_a_server_that_crashes_while_starting_is_started_again(self, tmp_path: Path) -> None:
        """Triton 2.51's Python backend can abort the server while it starts stubs on a busy
        machine (boost::interprocess::lock_exception): here a model does the same, once."""
        crash_once = ECHO_MODEL.replace(
            "class TritonPythonModel:\n",
            "import os, signal, sys\n\n\nclass TritonPythonModel:\n"
            "    def initialize(self, args):\n"
            "        marker = os.path.join(os.path.dirname(__file__), 'crashed')\n"
            "        if not os.path.exists(marker):\n"
            "            open(marker, 'w').close()\n"
            "            print('terminate called after throwing an instance of '\n"
            "                  \"'boost::interprocess::lock_exception'\", file=sys.stderr, flush=True)\n"
            "            os.kill(os.getppid(), signal.SIGABRT)\n\n",
        )
        write_model(tmp_path, "echo", crash_once)
        with LocalTriton(tmp_path, http_port=0, grpc_port=0, metrics_port=0) as server:
            assert server.ready_models() == ["echo"]
            log = server.log_path.read_text(errors="replace")
        restarted = [line for line in log.splitlines() if line.startswith("tritonscale: ")]
        assert restarted == [
            "tritonscale: tritonserver exited with code -6: terminate called after throwing an "
            "instance of 'boost::interprocess::lock_exception'; starting it again (attempt 2)"
        ], restarted

    def test_a_killed_server_leaves_no_shared_memory_once_stopped(self, tmp_path: Path) -> None:
        write_model(tmp_path, "echo")
        server = LocalTriton(tmp_path, http_port=0, grpc_port=0, metrics_port=0).start()
        try:
            assert len(server.shm_regions()) == 1  # the stub's region
            assert server.process is not None
            os.killpg(server.process.pid, signal.SIGKILL)  # no chance to clean up itself
            server.process.wait(timeout=30)
            assert len(server.shm_regions()) == 1
        finally:
            server.stop()
        assert server.shm_regions() == []

    def test_a_missing_repository_is_a_clear_error(self, tmp_path: Path) -> None:
        with pytest.raises(LocalTritonError, match="model repository not found"):
            LocalTriton(tmp_path / "nowhere", http_port=0, grpc_port=0, metrics_port=0).start()

    def test_stopping_leaves_no_stub_process_behind(self, tmp_path: Path) -> None:
        write_model(tmp_path, "echo")
        write_model(tmp_path, "echo_two")
        with LocalTriton(tmp_path, http_port=0, grpc_port=0, metrics_port=0):
            assert len(stub_processes(tmp_path)) == 2
        assert stub_processes(tmp_path) == []


class TestRepositoryApiIsLocked:
    def test_http_load_without_the_header_is_refused(self, triton: LocalTriton) -> None:
        url = f"http://{triton.http_url}/v2/repository/models/add_sub/load"
        refused = requests.post(url, json={}, timeout=10)
        assert refused.status_code == 403
        assert REPOSITORY_KEY_HEADER in refused.text
        wrong = requests.post(url, json={}, headers={REPOSITORY_KEY_HEADER: "guess"}, timeout=10)
        assert wrong.status_code == 403

    def test_http_load_carrying_file_content_without_the_header_is_refused(
        self, triton: LocalTriton
    ) -> None:
        body = {
            "parameters": {
                "config": ECHO_CONFIG.format(name="intruder"),
                "file:1/model.py": "aW1wb3J0IG9zOyBvcy5zeXN0ZW0oImlkIik=",  # import os; os.system("id")
            }
        }
        url = f"http://{triton.http_url}/v2/repository/models/intruder/load"
        assert requests.post(url, json=body, timeout=10).status_code == 403
        assert requests.get(f"http://{triton.http_url}/v2/models/intruder/ready").status_code != 200

    def test_http_unload_without_the_header_is_refused_and_the_model_keeps_serving(
        self, triton: LocalTriton
    ) -> None:
        url = f"http://{triton.http_url}/v2/repository/models/add_sub/unload"
        assert requests.post(url, json={}, timeout=10).status_code == 403
        assert requests.get(f"http://{triton.http_url}/v2/models/add_sub/ready").status_code == 200

    def test_grpc_load_and_unload_without_the_header_are_refused(self, triton: LocalTriton) -> None:
        client = grpcclient.InferenceServerClient(triton.grpc_url)
        for call in (client.load_model, client.unload_model):
            with pytest.raises(InferenceServerException, match="restricted"):
                call("add_sub")
        assert client.is_model_ready("add_sub")
        # With the header the same call goes through.
        with pytest.raises(InferenceServerException, match="restricted"):
            client.load_model("add_sub", headers=triton.repository_headers)  # the HTTP name
        client.load_model("add_sub", headers=triton.grpc_repository_headers)
        assert client.is_model_ready("add_sub")


class TestLiveInstanceChange:
    def test_reload_with_an_instance_group_override_under_load_loses_nothing(
        self, triton: LocalTriton
    ) -> None:
        """The operator's one move: change instance_group in place while requests flow."""
        failures: list[str] = []
        successes = 0
        stop = threading.Event()
        lock = threading.Lock()

        def send_requests() -> None:
            nonlocal successes
            client = httpclient.InferenceServerClient(triton.http_url)
            while not stop.is_set():
                try:
                    result = client.infer("add_sub", add_sub_inputs())
                    assert result.as_numpy("OUTPUT0").tolist() == [1.0, 2.0, 3.0, 4.0]
                    with lock:
                        successes += 1
                except Exception as error:  # every kind of failure counts
                    with lock:
                        failures.append(repr(error))

        senders = [threading.Thread(target=send_requests) for _ in range(8)]
        for sender in senders:
            sender.start()
        # Requests answered before, between and after the two changes: each change is made
        # while requests flow, and the next waits for requests served at the new count.
        under_load = 20

        def answered(more: int):
            """A condition: `more` requests answered from now on (or a failure, which ends the
            wait for the assertion below to show)."""
            mark = successes
            return lambda: failures or successes >= mark + more

        try:
            wait_for(answered(under_load), f"{under_load} requests answered before the change")
            started = time.monotonic()
            response = load_with_instances(triton, "add_sub", 3)
            applied_s = time.monotonic() - started
            assert response.status_code == 200, response.text
            assert live_instance_count(triton, "add_sub") == 3
            wait_for(answered(under_load), f"{under_load} requests answered at 3 instances")
            assert load_with_instances(triton, "add_sub", 1).status_code == 200
            wait_for(answered(under_load), f"{under_load} requests answered back at 1 instance")
        finally:
            stop.set()
            for sender in senders:
                sender.join()
        assert failures == []
        assert successes > 50
        assert live_instance_count(triton, "add_sub") == 1
        print(f"instance_group 1 -> 3 applied in {applied_s:.2f} s under load")


class TestServeCommand:
    def run_serve(self, *args: str, env: dict[str, str] | None = None) -> subprocess.Popen[str]:
        return subprocess.Popen(
            [sys.executable, "-m", "tritonscale.cli", "serve", *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env={**os.environ, **(env or {})},
            start_new_session=True,
        )

    def test_serve_says_ready_serves_and_stops_cleanly_on_sigterm(self, tmp_path: Path) -> None:
        write_model(tmp_path, "echo")
        http_port, grpc_port, metrics_port = free_ports(3)
        serve = self.run_serve(
            f"--model-repository={tmp_path}",
            f"--http-port={http_port}",
            f"--grpc-port={grpc_port}",
            f"--metrics-port={metrics_port}",
            env={REPOSITORY_KEY_ENV: "from-the-environment"},
        )
        lines: list[str] = []
        assert serve.stdout is not None
        for line in serve.stdout:
            lines.append(line)
            if "model-repository API key" in line:
                break
        output = "".join(lines)
        assert "ready in" in output and "1 models (echo)" in output
        assert "from-the-environment" not in output  # a key from the environment is not echoed
        locked = requests.post(
            f"http://127.0.0.1:{http_port}/v2/repository/models/echo/load",
            json={},
            headers={REPOSITORY_KEY_HEADER: "from-the-environment"},
            timeout=30,
        )
        assert locked.status_code == 200
        os.kill(serve.pid, signal.SIGTERM)
        assert serve.wait(timeout=60) == 0
        assert stub_processes(tmp_path) == []

    def test_serve_on_a_busy_port_exits_with_one_line(self, tmp_path: Path) -> None:
        write_model(tmp_path, "echo")
        with socket.socket() as busy:
            busy.bind(("0.0.0.0", 0))
            busy.listen()
            port = busy.getsockname()[1]
            http_port, metrics_port = free_ports(2)
            serve = self.run_serve(
                f"--model-repository={tmp_path}",
                f"--http-port={http_port}",
                f"--grpc-port={port}",
                f"--metrics-port={metrics_port}",
            )
            output, _ = serve.communicate(timeout=60)
        assert serve.returncode != 0
        errors = [line for line in output.splitlines() if line.startswith("Error:")]
        assert errors == [
            f"Error: gRPC port {port} is already in use (another tritonserver?); "
            "choose another with --grpc-port"
        ]
        assert "Traceback" not in output


def test_a_model_folder_triton_cannot_read_is_named(tmp_path: Path) -> None:
    write_model(tmp_path, "echo")
    (tmp_path / "no_config" / "1").mkdir(parents=True)
    server = LocalTriton(tmp_path, http_port=0, grpc_port=0, metrics_port=0)
    with pytest.raises(LocalTritonError, match="model 'no_config' failed to load: Invalid model"):
        server.start()


def test_asking_for_a_model_the_repository_lacks_is_named(tmp_path: Path) -> None:
    write_model(tmp_path, "echo")
    server = LocalTriton(tmp_path, models=["nope"], http_port=0, grpc_port=0, metrics_port=0)
    with pytest.raises(LocalTritonError, match="model 'nope' not found in"):
        server.start()
