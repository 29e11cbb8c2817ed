"""`tritonscale report` from a real short run: Locust's CSV, Prometheus and tune's decision log."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from tests.tooling import missing
from tritonscale.cli import main
from tritonscale.local.ports import free_port
from tritonscale.local.prometheus_server import LocalPrometheus, prometheus_binary
from tritonscale.local.triton_server import LocalTriton
from tritonscale.reports.report import PLOTS, ReportError, write_report

REPO_ROOT = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class Run:
    locust_csv: Path
    decisions: Path
    prometheus_url: str


@pytest.fixture(scope="module")
def run(triton: LocalTriton, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Run]:
    """Locust on pipeline_async for 3 s while tune ticks and Prometheus scrapes Triton."""
    if prometheus_binary() is None:
        missing("prometheus not installed (Debian package 'prometheus')")
    folder = tmp_path_factory.mktemp("report-run")
    # min = max = 1: the driver decides and logs every tick, yet leaves the shared server's
    # counts alone.
    policies = {
        "triton": {"http": [triton.http_url], "metrics": [triton.metrics_url]},
        "metrics": {"source": "scrape"},
        "policies": [
            {
                "name": "pipeline-async",
                "spec": {
                    "model": "pipeline_async",
                    "minInstances": 1,
                    "maxInstances": 1,
                    "intervalSeconds": 1,
                    "metricsWindowSeconds": 1,
                },
            }
        ],
    }
    config = folder / "policies.yaml"
    config.write_text(yaml.safe_dump(policies))
    decisions = folder / "decisions.jsonl"
    target = triton.metrics_url.removeprefix("http://")
    with LocalPrometheus({"triton": [target]}, scrape_interval_s=0.5) as prometheus:
        prometheus.wait_for("nv_inference_count", timeout_s=30)
        tune = subprocess.Popen(
            [
                sys.executable, "-m", "tritonscale.cli", "tune", "--config", str(config),
                "--decision-log", str(decisions), "--metrics-port", "0", "--duration", "5",
            ],
            env={**os.environ, "TRITONSCALE_REPOSITORY_KEY": triton.repository_key},
            stdout=subprocess.DEVNULL,
        )  # fmt: skip
        locust = subprocess.run(
            [
                sys.executable, "-m", "locust", "-f", "loadtests/bls.py", "--headless",
                "--only-summary", "-u", "4", "-r", "8", "-t", "3s",
                "--host", f"http://{triton.http_url}", "--grpc-host", triton.grpc_url,
                "--workload", "pipeline_async", "--csv", str(folder / "run"),
                "--csv-full-history",
            ],
            cwd=REPO_ROOT, capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        ended = time.time()
        assert tune.wait(timeout=30) == 0
        assert locust.returncode == 0, locust.stderr[-2000:]
        # One more scrape covers the run's last second.
        prometheus.wait_for(f"timestamp(nv_inference_count) > {ended}", timeout_s=30)
        yield Run(folder / "run", decisions, prometheus.url)


def test_the_report_renders_every_plot_from_all_three_inputs(run: Run, tmp_path: Path) -> None:
    index = write_report(
        tmp_path,
        locust_csv=run.locust_csv,
        prometheus_url=run.prometheus_url,
        decisions=run.decisions,
    )
    page = index.read_text()
    for filename, *_ in PLOTS:
        image = tmp_path / filename
        assert image.stat().st_size > 1000, filename
        assert image.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        assert f'src="{filename}"' in page
    assert "No data" not in page
    assert "Locust requests" in page and "instance changes applied" in page


def test_the_command_writes_the_page_and_names_it(run: Run, tmp_path: Path) -> None:
    result = CliRunner().invoke(
        main,
        ["report", "--locust-csv", str(run.locust_csv), "--out", str(tmp_path / "out")],
    )
    assert result.exit_code == 0, result.output
    assert result.output.strip() == f"report: {tmp_path / 'out' / 'index.html'}"
    page = (tmp_path / "out" / "index.html").read_text()
    # Without Prometheus or a decision log, the page says what is missing.
    assert "queue time comes from Triton's metrics: give a Prometheus URL" in page
    assert (tmp_path / "out" / "throughput.png").stat().st_size > 1000


def _error(args: list[str]) -> str:
    result = CliRunner().invoke(main, ["report", *args])
    assert result.exit_code != 0
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in result.output, result.output
    return lines[0]


def test_bad_inputs_are_one_line_errors(run: Run, tmp_path: Path) -> None:
    assert "nothing to report" in _error([])
    assert "Locust stats history not found" in _error(["--locust-csv", str(tmp_path / "nope")])
    not_locust = tmp_path / "x_stats_history.csv"
    not_locust.write_text("a,b\n1,2\n")
    assert "is not a Locust stats history: no column 'Timestamp'" in _error(
        ["--locust-csv", str(not_locust)]
    )
    bad_log = tmp_path / "decisions.jsonl"
    bad_log.write_text('{"t": 1, "model": "m", "current": 1}\nnot json\n')
    assert "decisions.jsonl line 2: not a decision record" in _error(["--decisions", str(bad_log)])
    assert "decision log not found" in _error(["--decisions", str(tmp_path / "none.jsonl")])
    assert f"Prometheus at http://127.0.0.1:{(port := free_port())} is unreachable" in _error(
        ["--locust-csv", str(run.locust_csv), "--prometheus", f"http://127.0.0.1:{port}"]
    )
    assert "give both --start and --end" in _error(["--start", "1"])


def test_a_prometheus_window_without_data_is_a_note_not_an_error(run: Run, tmp_path: Path) -> None:
    index = write_report(tmp_path, prometheus_url=run.prometheus_url, window=(1000.0, 1010.0))
    assert "had no Triton metrics between" in index.read_text()
    with pytest.raises(ReportError, match="nothing to report"):
        write_report(tmp_path, prometheus_url=run.prometheus_url)
