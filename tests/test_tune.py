"""`tritonscale tune`: the policy file's checks, and the real console script against a real Triton."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests
import yaml
from click.testing import CliRunner

from tests.tooling import require_local_triton
from tritonscale.cli import main
from tritonscale.drivers.tune import load_config
from tritonscale.local.ports import free_port
from tritonscale.local.triton_server import LocalTriton
from tritonscale.triton.actuator import Actuator
from tritonscale.triton.endpoints import Endpoint

EXAMPLE = Path(__file__).resolve().parents[1] / "operator" / "examples" / "local" / "policies.yaml"
TRITONSCALE = Path(sys.executable).parent / "tritonscale"


def _config(**top: object) -> dict:
    config: dict = {
        "triton": {"http": ["127.0.0.1:8000"], "metrics": ["http://127.0.0.1:8002/metrics"]},
        "policies": [{"name": "adder", "spec": {"model": "add_sub"}}],
    }
    config.update(top)
    return config


def _run_cli(tmp_path: Path, text: str) -> tuple[int, str]:
    path = tmp_path / "policies.yaml"
    path.write_text(text)
    result = CliRunner().invoke(main, ["tune", "--config", str(path), "--metrics-port", "0"])
    return result.exit_code, result.output


@pytest.mark.unit
@pytest.mark.parametrize(
    ("text", "expected"),
    [
        pytest.param("policies: [", "invalid YAML at line 1", id="bad YAML names the line"),
        pytest.param(
            yaml.safe_dump(_config(colour="blue")),
            "colour is not a known field",
            id="an unknown top-level key is named",
        ),
        pytest.param(
            yaml.safe_dump(
                _config(
                    policies=[
                        {
                            "name": "a",
                            "spec": {"model": "add_sub", "minInstances": 5, "maxInstances": 2},
                        }
                    ]
                )
            ),
            "policies[0].spec: minInstances must be <= maxInstances (minInstances is 5, maxInstances is 2)",
            id="min above max names both fields",
        ),
        pytest.param(
            yaml.safe_dump(
                _config(policies=[{"name": "a", "spec": {"model": "add_sub", "maxInstance": 3}}])
            ),
            "policies[0].spec.maxInstance is not a known field",
            id="a misspelt spec field is named",
        ),
        pytest.param(
            yaml.safe_dump(_config(metrics={"source": "graphite"})),
            "metrics.source must be one of scrape, prometheus, got 'graphite'",
            id="an unknown metrics source",
        ),
        pytest.param(
            yaml.safe_dump(_config(metrics={"source": "prometheus"})),
            "metrics.prometheusUrl is required",
            id="prometheus without its URL",
        ),
        pytest.param(
            yaml.safe_dump(
                _config(
                    policies=[
                        {"name": "a", "spec": {"model": "add_sub"}},
                        {"name": "b", "spec": {"model": "add_sub"}},
                    ]
                )
            ),
            "two policies act on model 'add_sub'",
            id="two policies on one model",
        ),
        pytest.param(
            yaml.safe_dump(
                _config(triton={"http": ["a:8000", "b:8000"], "metrics": ["http://a:8002/metrics"]})
            ),
            "triton.metrics must have one URL per triton.http URL (2), got 1",
            id="metrics URLs do not pair with the HTTP URLs",
        ),
        pytest.param(
            yaml.safe_dump({**_config(), "planner": "model"}),
            "the file.planner is not a known field (known: triton, metrics, policies)",
            id="a field that is not the file's",
        ),
        pytest.param("", "the file must be a mapping", id="an empty file"),
        pytest.param(
            yaml.safe_dump(
                _config(
                    policies=[
                        {
                            "name": "a",
                            "spec": {
                                "model": "bls_async",
                                "targets": {"latency": {"quantile": 95, "milliseconds": 100}},
                            },
                        }
                    ]
                )
            ),
            "policies[0].spec.targets.latency.quantile: must be above 0 and below 1 (quantile is 95.0)",
            id="a latency quantile given as a percentage",
        ),
        pytest.param(
            yaml.safe_dump(
                _config(
                    policies=[
                        {"name": "root", "spec": {"model": "bls_async", "calls": ["add_sub"]}},
                        {
                            "name": "child",
                            "spec": {
                                "model": "add_sub",
                                "targets": {"latency": {"milliseconds": 100}},
                            },
                        },
                    ]
                )
            ),
            "policies[1].spec.targets.latency: only a pipeline's root may carry a latency"
            " objective, and add_sub is called by bls_async (set it on the root)",
            id="a latency objective on a model another policy calls",
        ),
    ],
)
def test_a_bad_policy_file_is_one_line_naming_file_and_field(
    tmp_path: Path, text: str, expected: str
) -> None:
    code, output = _run_cli(tmp_path, text)
    assert code != 0
    assert output.startswith("Error: ") and str(tmp_path / "policies.yaml") in output
    assert expected in output
    assert output.count("\n") == 1 and "Traceback" not in output


@pytest.mark.unit
def test_a_latency_objective_on_the_root_reads_into_its_spec(tmp_path: Path) -> None:
    path = tmp_path / "policies.yaml"
    root = {"model": "bls_async", "calls": ["add_sub"]}
    root["targets"] = {"latency": {"quantile": 0.99, "milliseconds": 250}}
    policies = [{"name": "root", "spec": root}, {"name": "child", "spec": {"model": "add_sub"}}]
    path.write_text(yaml.safe_dump(_config(policies=policies)))
    config = load_config(path)
    objective = config.policies[0].spec.targets.latency
    assert objective is not None
    assert (objective.quantile, objective.milliseconds) == (0.99, 250.0)
    assert config.policies[1].spec.targets.latency is None


@pytest.mark.unit
def test_a_missing_policy_file_is_one_line(tmp_path: Path) -> None:
    result = CliRunner().invoke(main, ["tune", "--config", str(tmp_path / "nope.yaml")])
    assert result.exit_code != 0 and "cannot read it" in result.output
    assert result.output.count("\n") == 1


@pytest.mark.unit
def test_the_example_policies_are_valid() -> None:
    config = load_config(EXAMPLE)
    assert [p.spec.model for p in config.policies] == [
        "pipeline_async",
        "branch_embed",
        "branch_classify",
        "branch_rank",
    ]
    assert all(p.spec.interval_seconds == 5 for p in config.policies)
    assert config.source == "scrape"


# ---- the real console script against a real Triton --------------------------------------


@pytest.fixture(scope="module")
def server() -> Iterator[LocalTriton]:
    require_local_triton()
    with LocalTriton(http_port=0, grpc_port=0, metrics_port=0, models=["add_sub"]) as triton:
        yield triton


def _policy_file(tmp_path: Path, server: LocalTriton, min_instances: int) -> Path:
    path = tmp_path / "policies.yaml"
    spec = {"model": "add_sub", "minInstances": min_instances, "intervalSeconds": 1}
    config = {
        "triton": {"http": [server.http_url], "metrics": [server.metrics_url]},
        "policies": [{"name": "adder", "spec": spec}],
    }
    path.write_text(yaml.safe_dump(config))
    return path


def _env(server: LocalTriton) -> dict[str, str]:
    return {**os.environ, "TRITONSCALE_REPOSITORY_KEY": server.repository_key}


async def test_tune_runs_the_loop_logs_decisions_and_exports_metrics(
    tmp_path: Path, server: LocalTriton
) -> None:
    endpoint = Endpoint("local", server.http_url)
    await Actuator(server.repository_key).apply([endpoint], "add_sub", 1)
    log = tmp_path / "decisions.jsonl"
    port = free_port()
    process = subprocess.Popen(
        [
            str(TRITONSCALE),
            "tune",
            "--config",
            str(_policy_file(tmp_path, server, 2)),
            "--decision-log",
            str(log),
            "--metrics-port",
            str(port),
            "--duration",
            "8",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=_env(server),
    )
    exported = ""
    deadline = time.monotonic() + 20
    while (
        process.poll() is None
        and time.monotonic() < deadline
        and "tritonscale_desired_instances{" not in exported
    ):
        try:
            exported = requests.get(f"http://127.0.0.1:{port}/metrics", timeout=1).text
        except requests.RequestException:
            await asyncio.sleep(0.2)
    output, _ = process.communicate(timeout=30)
    assert process.returncode == 0, output
    lines = output.splitlines()
    assert lines[0].startswith("tuning adder (add_sub) on 1 Triton(s), metrics from scrape")
    assert "add_sub 1 -> 2 TooFewInstances" in output
    records = [json.loads(line) for line in log.read_text().splitlines()]
    # The first tick applies 1 -> 2 (seconds on a busy machine); a later one reads it live.
    # How many ticks fit in the run is the machine's business, not this test's.
    assert len(records) >= 2, "no tick after the first one's change"
    assert records[0]["autoscaler"] == "adder" and records[0]["applied"][0]["ok"]
    assert records[-1]["current"] == 2
    assert (
        'tritonscale_desired_instances{autoscaler="adder",model="add_sub",namespace="local"} 2.0'
        in exported
    )
    assert await Actuator(server.repository_key).live_count(endpoint, "add_sub") == 2
    assert server.repository_key not in output


def test_sigterm_stops_tune_cleanly(tmp_path: Path, server: LocalTriton) -> None:
    process = subprocess.Popen(
        [
            str(TRITONSCALE),
            "tune",
            "--config",
            str(_policy_file(tmp_path, server, 1)),
            "--metrics-port",
            "0",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=_env(server),
    )
    assert process.stdout is not None
    first = process.stdout.readline()
    assert first.startswith("tuning adder")
    process.stdout.readline()  # the first tick's line
    process.send_signal(signal.SIGTERM)
    rest, _ = process.communicate(timeout=30)
    assert process.returncode == 0
    assert "stopped" in rest and "Traceback" not in rest
