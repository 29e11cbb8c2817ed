"""The Prometheus rules: promtool accepts them, promtool's unit tests cover every alert
(firing and staying quiet), each alert tells a person on call what to do, and every metric
they read is one Triton or the operator really exports.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest
import requests
import yaml

from tests.tooling import require_tool
from tritonscale.control.operator_metrics import OperatorMetrics
from tritonscale.local.triton_server import LocalTriton
from tritonscale.metrics import queries

RULES_DIR = Path(__file__).resolve().parents[1] / "dashboards" / "rules"
RULES = RULES_DIR / "tritonscale.rules.yaml"
UNIT_TESTS = sorted((RULES_DIR / "tests").glob("*.yaml"))
GROUPS = yaml.safe_load(RULES.read_text())["groups"]
ALERTS = [rule for group in GROUPS for rule in group["rules"] if "alert" in rule]
RECORDS = [rule for group in GROUPS for rule in group["rules"] if "record" in rule]
# Exported only where there are GPUs (Triton) or the DCGM exporter runs.
GPU_METRIC_NAMES = {"nv_gpu_utilization", "DCGM_FI_DEV_GPU_UTIL"}
# Exported by a decoupled model itself (python_backend custom metrics), not by Triton.
MODEL_METRIC_NAMES = {queries.STREAMS_IN_FLIGHT}


def test_promtool_checks_the_rules() -> None:
    promtool = require_tool("promtool")
    run = subprocess.run([promtool, "check", "rules", str(RULES)], capture_output=True, text=True)
    assert run.returncode == 0, run.stdout + run.stderr
    assert f"SUCCESS: {len(ALERTS) + len(RECORDS)} rules found" in run.stdout


@pytest.mark.parametrize("unit_test", UNIT_TESTS, ids=lambda p: p.name)
def test_promtool_unit_tests_pass(unit_test: Path) -> None:
    promtool = require_tool("promtool")
    run = subprocess.run(
        [promtool, "test", "rules", unit_test.name],
        cwd=unit_test.parent,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 0, run.stdout + run.stderr


def _alert_cases() -> dict[str, list[list]]:
    cases: dict[str, list[list]] = {}
    for path in UNIT_TESTS:
        for test in yaml.safe_load(path.read_text())["tests"]:
            for case in test.get("alert_rule_test", []):
                cases.setdefault(case["alertname"], []).append(case.get("exp_alerts") or [])
    return cases


@pytest.mark.unit
@pytest.mark.parametrize("alert", ALERTS, ids=lambda rule: rule["alert"])
def test_every_alert_is_tested_firing_and_quiet(alert: dict) -> None:
    cases = _alert_cases().get(alert["alert"], [])
    assert any(cases), f"{alert['alert']}: no unit test where it fires"
    assert any(not expected for expected in cases), f"{alert['alert']}: no test where it is quiet"


@pytest.mark.unit
@pytest.mark.parametrize("alert", ALERTS, ids=lambda rule: rule["alert"])
def test_every_alert_says_what_happened_and_what_to_do(alert: dict) -> None:
    assert alert["labels"]["severity"] in ("critical", "warning")
    assert re.fullmatch(r"\d+m", alert["for"]), "a `for:` in minutes keeps blips from paging"
    annotations = alert["annotations"]
    assert 15 <= len(annotations["summary"]) <= 120 and "\n" not in annotations["summary"]
    # Something to check or do, in the words of the description.
    assert re.search(r"\b(check|open|raise|fix|look)\b", annotations["description"], re.I)


@pytest.mark.unit
def test_the_recording_rules_are_the_ones_the_signals_define() -> None:
    # The generated group holds exactly queries.recording_rules(), expression for expression
    # (tests/test_dashboards.py checks the file byte for byte against the generator).
    assert [(rule["record"], rule["expr"].strip()) for rule in RECORDS] == [
        (rule.record, rule.expr) for rule in queries.recording_rules()
    ]


@pytest.mark.unit
def test_no_rule_relabels_series_for_a_development_setup() -> None:
    # Labels a local setup needs come from its scrape config, not from production rules.
    for rule in ALERTS + RECORDS:
        assert "label_replace" not in rule["expr"], rule.get("alert") or rule.get("record")


@pytest.mark.unit
def test_recording_rules_follow_the_naming_convention() -> None:
    for rule in RECORDS:
        assert re.fullmatch(r"triton:[a-z_]+:[a-z0-9_]+", rule["record"]), rule["record"]


def _operator_sample_names() -> set[str]:
    """What the real operator_metrics module exports, by metric type."""
    names = set()
    for family in OperatorMetrics().registry.collect():
        suffixes = {
            "counter": ["_total"],
            "histogram": ["_bucket", "_sum", "_count"],
        }.get(family.type, [""])
        names |= {family.name + suffix for suffix in suffixes}
    return names


def test_rules_read_only_metrics_that_really_exist(triton: LocalTriton) -> None:
    text = requests.get(triton.metrics_url, timeout=10).text
    triton_names = {
        re.split(r"[{\s]", line, maxsplit=1)[0]
        for line in text.splitlines()
        if line.strip() and not line.startswith("#")
    }
    known = triton_names | _operator_sample_names() | GPU_METRIC_NAMES | MODEL_METRIC_NAMES | {"up"}
    recorded = {rule["record"] for rule in RECORDS}
    for rule in ALERTS + RECORDS:
        names = set(
            re.findall(r"\b(?:nv_[a-z_]+|DCGM_[A-Z_]+|tritonscale_[a-z_]+|up)\b", rule["expr"])
        )
        names |= set(re.findall(r"\btriton:[a-z_]+:[a-z0-9_]+", rule["expr"])) - recorded
        unknown = names - known
        assert not unknown, f"{rule.get('alert') or rule.get('record')}: {sorted(unknown)}"
