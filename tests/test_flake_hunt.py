"""The flake hunter's reading of pytest's JUnit reports and its table."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.flake_hunt import HuntRecord, outcomes, table

pytestmark = pytest.mark.unit

JUNIT = """<?xml version="1.0" encoding="utf-8"?>
<testsuites><testsuite name="pytest" tests="4">
<testcase classname="tests.test_a" name="test_passes" time="0.1"/>
<testcase classname="tests.test_a" name="test_fails" time="0.1">
<failure message="AssertionError: assert 'branch_embed' in {}&#10;second line">trace</failure>
</testcase>
<testcase classname="tests.test_b" name="test_errors" time="0.1">
<error message="failed on setup with &quot;TimeoutError&quot;">trace</error></testcase>
<testcase classname="tests.test_b" name="test_skipped" time="0.0">
<skipped message="no helm">skip</skipped></testcase>
</testsuite></testsuites>
"""


def test_each_test_reads_as_passed_or_its_first_failure_line(tmp_path: Path) -> None:
    junit = tmp_path / "run.xml"
    junit.write_text(JUNIT)
    assert outcomes(junit) == {
        "tests.test_a::test_passes": None,
        "tests.test_a::test_fails": "AssertionError: assert 'branch_embed' in {}",
        "tests.test_b::test_errors": 'failed on setup with "TimeoutError"',
    }


def test_the_table_lists_only_the_tests_that_failed() -> None:
    records = [
        HuntRecord("t::flaky", runs=10, failures=2, busy_failures=1, first_failure="a | b"),
        HuntRecord("t::steady", runs=10),
    ]
    lines = table(records)
    assert lines[0] == "2 tests, 1 failed at least once"
    assert lines[3:] == ["| t::flaky | 10 | 2 (1) | a / b |"]
