"""Hunt tests that pass by luck: run the tests that start something real several times, quiet
and then with the other core busy, and print a table of every test that failed even once.

    python -m tests.flake_hunt                        # every test not marked unit, 5 + 5 runs
    python -m tests.flake_hunt --runs 3 tests/test_demo.py tests/test_no_gain.py
    python -m tests.flake_hunt --table part-1 part-2  # one table from hunts run in parts

A "busy" run starts one CPU hog per spare core (a Python busy loop, niced to 0 like the tests)
before pytest and stops it after, so the tests meet the contention CI's shared machines give
them. Each run writes a JUnit XML file under --out; the table (test, runs, failures, first
failure's message) goes to stdout and, as JSON, to OUT/flake_hunt.json. Exit status 1 when a
test failed in any run: every failure is a defect to fix, never a retry.

The whole hunt takes hours on two cores; it can run in parts (a few test files each, on
different days), each with its own --out, and `--table` then reads the parts' JUnit files
back into one table without running anything.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from dataclasses import asdict, dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
HOG = "while True: pass"


@dataclass
class HuntRecord:
    test: str
    runs: int = 0
    failures: int = 0
    busy_failures: int = 0
    first_failure: str = ""


def outcomes(junit: Path) -> dict[str, str | None]:
    """test id -> None when it passed, else the first line of its failure or error; skipped
    tests are left out (in CI a skip is a failure of its own, reported by the run itself)."""
    found: dict[str, str | None] = {}
    for case in ET.parse(junit).getroot().iter("testcase"):
        test = f"{case.get('classname', '')}::{case.get('name', '')}"
        problem = case.find("failure")
        if problem is None:
            problem = case.find("error")
        if case.find("skipped") is not None and problem is None:
            continue
        if problem is None:
            found[test] = None
        else:
            message = (problem.get("message") or problem.text or "failed").strip()
            found[test] = message.splitlines()[0][:200] if message else "failed"
    return found


def start_hogs() -> list[subprocess.Popen]:
    spare = max(1, (os.cpu_count() or 2) - 1)
    return [subprocess.Popen([sys.executable, "-c", HOG]) for _ in range(spare)]


def run_once(
    index: int, total: int, busy: bool, selection: list[str], out: Path, pytest_args: list[str]
) -> dict[str, str | None]:
    junit = out / f"run-{index:02d}{'-busy' if busy else ''}.xml"
    command = [
        sys.executable,
        "-m",
        "pytest",
        "-q",
        "-p",
        "no:cacheprovider",
        f"--junitxml={junit}",
    ]
    command += pytest_args + selection
    # A run takes minutes and prints nothing until it ends: say which one is under way.
    print(
        f"run {index}/{total}{' (other core busy)' if busy else ''}: started "
        f"{time.strftime('%H:%M:%S')}",
        flush=True,
    )
    hogs = start_hogs() if busy else []
    started = time.monotonic()
    try:
        result = subprocess.run(command, cwd=REPO, capture_output=True, text=True)
    finally:
        for hog in hogs:
            hog.kill()
            hog.wait()
    tail = [line for line in result.stdout.splitlines() if line.strip()][-1:] or ["(no output)"]
    print(
        f"run {index}/{total}{' (other core busy)' if busy else ''}: {tail[0]} "
        f"[{time.monotonic() - started:.0f} s]",
        flush=True,
    )
    if not junit.is_file():
        # pytest died before writing its report: the whole run counts as one failure.
        return {"<the run itself>": f"pytest exited {result.returncode}: {result.stderr[-200:]}"}
    return outcomes(junit)


def count(records: dict[str, HuntRecord], found: dict[str, str | None], busy: bool) -> None:
    """Add one run's outcomes (`outcomes`) to the records."""
    for test, failure in found.items():
        record = records.setdefault(test, HuntRecord(test))
        record.runs += 1
        if failure is not None:
            record.failures += 1
            record.busy_failures += busy
            record.first_failure = record.first_failure or failure


def ranked(records: dict[str, HuntRecord]) -> list[HuntRecord]:
    return sorted(records.values(), key=lambda r: (-r.failures, r.test))


def hunt(selection: list[str], runs: int, busy_runs: int, out: Path, pytest_args: list[str]):
    out.mkdir(parents=True, exist_ok=True)
    records: dict[str, HuntRecord] = {}
    plan = [False] * runs + [True] * busy_runs
    for index, busy in enumerate(plan, start=1):
        count(records, run_once(index, len(plan), busy, selection, out, pytest_args), busy)
    return ranked(records)


def from_reports(folders: list[Path]) -> list[HuntRecord]:
    """The records of hunts already run: every run-NN[-busy].xml in `folders`."""
    records: dict[str, HuntRecord] = {}
    for folder in folders:
        reports = sorted(folder.glob("run-*.xml"))
        if not reports:
            raise SystemExit(f"flake_hunt: no run-*.xml in {folder}")
        for junit in reports:
            count(records, outcomes(junit), busy=junit.stem.endswith("-busy"))
    return ranked(records)


def table(records: list[HuntRecord]) -> list[str]:
    failed = [r for r in records if r.failures]
    lines = [
        f"{len(records)} tests, {len(failed)} failed at least once",
        "| test | runs | failures (busy) | first failure |",
        "|---|---|---|---|",
    ]
    for record in failed:
        lines.append(
            f"| {record.test} | {record.runs} | {record.failures} ({record.busy_failures}) | "
            f"{record.first_failure.replace('|', '/')} |"
        )
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("selection", nargs="*", help="test files or ids (default: not unit)")
    parser.add_argument("--runs", type=int, default=5, help="quiet runs (default 5)")
    parser.add_argument("--busy-runs", type=int, help="runs with the other core busy (= --runs)")
    parser.add_argument("--out", type=Path, default=REPO / "reports" / "flake-hunt")
    parser.add_argument(
        "--table",
        type=Path,
        nargs="+",
        metavar="OUT",
        help="run nothing: one table from the JUnit files of earlier hunts' --out folders",
    )
    args, pytest_args = parser.parse_known_args(argv)
    if args.table:
        records = from_reports(args.table)
        print("\n".join(table(records)))
        return 1 if any(record.failures for record in records) else 0
    if not args.selection:
        pytest_args = ["-m", "not unit", *pytest_args]
    busy_runs = args.runs if args.busy_runs is None else args.busy_runs
    records = hunt(args.selection, args.runs, busy_runs, args.out, pytest_args)
    lines = table(records)
    print("\n".join(lines))
    (args.out / "flake_hunt.json").write_text(
        json.dumps([asdict(record) for record in records], indent=2)
    )
    return 1 if any(record.failures for record in records) else 0


if __name__ == "__main__":
    sys.exit(main())
