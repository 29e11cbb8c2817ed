"""The flake hunter's reading of pytest's JUnit reports and its table."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.flake_hunt import HuntRecord, from_reports, main, outcomes, table

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


def test_hunts_run_in_parts_read_back_into_one_table(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # The same report with test_fails passing (its failure element commented out).
    passing = JUNIT.replace('<failure message="AssertionError', "<!-- ").replace(
        "trace</failure>", "-->"
    )
    first, second = tmp_path / "part-1", tmp_path / "part-2"
    for folder in (first, second):
        folder.mkdir()
    (first / "run-01.xml").write_text(passing)
    (first / "run-02-busy.xml").write_text(JUNIT)
    (second / "run-01.xml").write_text(JUNIT)
    records = {r.test: r for r in from_reports([first, second])}
    assert records["tests.test_a::test_passes"].failures == 0
    assert records["tests.test_a::test_passes"].runs == 3
    fails = records["tests.test_a::test_fails"]
    assert (fails.runs, fails.failures, fails.busy_failures) == (3, 2, 1)
    assert "tests.test_b::test_skipped" not in records

    assert main(["--table", str(first), str(second)]) == 1
    printed = capsys.readouterr().out.splitlines()
    assert printed[0] == "3 tests, 2 failed at least once"
    assert (
        "| tests.test_a::test_fails | 3 | 2 (1) | AssertionError: assert 'branch_embed' in {} |"
        in printed
    )
    with pytest.raises(SystemExit, match="no run-"):
        from_reports([tmp_path])
