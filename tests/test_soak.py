"""The soak (loadtests/soak.py) in its quick mode: it runs, checks answers, samples and plots.

The full soak (10 minutes and more) is a benchmark, not a test: see docs/reliability.md.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tests.tooling import require_local_triton

SOAK = Path(__file__).resolve().parents[1] / "loadtests" / "soak.py"


def test_the_quick_soak_serves_without_failures_and_reports_memory(tmp_path: Path) -> None:
    require_local_triton()
    done = subprocess.run(
        [
            sys.executable,
            str(SOAK),
            "--quick",
            "--duration",
            "8",
            "--users",
            "2",
            "--out",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    report = json.loads((tmp_path / "soak.json").read_text())
    summary = report["summary"]
    assert summary["requests_ok"] > 0
    assert summary["requests_failed"] == 0 and summary["wrong_answers"] == 0
    assert summary["control_loop"] is True and summary["tune_exit_code"] == 0
    assert (tmp_path / "decisions.jsonl").read_text().strip()  # tritonscale tune ran and logged
    assert len(report["samples"]) >= 4
    first = report["samples"][0]
    # Five stubs (the pipeline, its twin and three branches), each with its own shm region.
    assert first["stubs"] == 5 and first["shm_regions"] == 5
    assert first["stub_rss_bytes"] > 0 and first["shm_bytes"] > 0
    assert summary["shm_leaked_regions_max"] == 0
    assert {tick["model"] for tick in report["ticks"]} == {
        "pipeline_async",
        "branch_embed",
        "branch_classify",
        "branch_rank",
    }
    assert (tmp_path / "soak.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_a_bad_option_is_one_line_and_a_non_zero_exit() -> None:
    done = subprocess.run(
        [sys.executable, str(SOAK), "--users", "0"], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 2
    assert "must be positive" in done.stderr and "Traceback" not in done.stderr
