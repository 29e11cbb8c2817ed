"""A real Prometheus on loopback, with a temporary config, for tests, the demo and benchmarks.

Debian's `prometheus` package (2.42) installs the binary but, in a container, starts no
service: we run our own, scraping the given targets, with its data in a temporary folder.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path
from types import TracebackType
from typing import Any

import requests
import yaml

from tritonscale.local.ports import free_port
from tritonscale.metrics.prometheus_api import PrometheusApiError, prometheus_get

PROMETHEUS_BINARY = "prometheus"


class LocalPrometheusError(RuntimeError):
    """Prometheus could not start or answer; one line for a person."""


def prometheus_binary() -> str | None:
    """The prometheus executable, or None when it is not installed."""
    return shutil.which(PROMETHEUS_BINARY) or (
        "/usr/bin/prometheus" if Path("/usr/bin/prometheus").is_file() else None
    )


class LocalPrometheus:
    """Prometheus scraping `scrape_targets` ({job: ["host:port", ...]}) every `scrape_interval_s`.

    Targets whose port serves metrics under another path take "host:port/path".
    `labels` ({job: {label: value}}) are added to every series of a job's targets, as
    Kubernetes service discovery adds `namespace` and `pod`: the recording rules join
    Triton's series to the operator's on `namespace` (the local driver's is "local").
    Stop and start it again (same port, same data) to simulate an outage.
    """

    def __init__(
        self,
        scrape_targets: dict[str, list[str]],
        *,
        scrape_interval_s: float = 1.0,
        rule_files: list[str | os.PathLike[str]] | None = None,
        labels: dict[str, dict[str, str]] | None = None,
        port: int = 0,
        startup_timeout_s: float = 30.0,
    ) -> None:
        self.scrape_targets = scrape_targets
        self.scrape_interval_s = scrape_interval_s
        self.rule_files = [str(Path(f).resolve()) for f in rule_files or []]
        self.labels = labels or {}
        self.port = port or free_port()
        self.startup_timeout_s = startup_timeout_s
        self.process: subprocess.Popen[bytes] | None = None
        self._workdir = Path(tempfile.mkdtemp(prefix="tritonscale-prometheus-"))

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def log_path(self) -> Path:
        return self._workdir / "prometheus.log"

    def config(self) -> dict[str, Any]:
        interval = f"{int(self.scrape_interval_s * 1000)}ms"
        jobs = []
        for job, targets in self.scrape_targets.items():
            by_path: dict[str, list[str]] = {}
            for target in targets:
                address, _, path = target.partition("/")
                by_path.setdefault("/" + path if path else "/metrics", []).append(address)
            for index, (path, addresses) in enumerate(sorted(by_path.items())):
                jobs.append(
                    {
                        "job_name": job if index == 0 else f"{job}-{index}",
                        "metrics_path": path,
                        "scrape_interval": interval,
                        "scrape_timeout": interval,
                        "static_configs": [
                            {"targets": addresses, "labels": dict(self.labels.get(job, {}))}
                        ],
                    }
                )
        return {
            "global": {"scrape_interval": interval, "evaluation_interval": interval},
            "rule_files": self.rule_files,
            "scrape_configs": jobs,
        }

    def start(self) -> LocalPrometheus:
        binary = prometheus_binary()
        if binary is None:
            raise LocalPrometheusError(
                "prometheus not found: apt-get install prometheus (Debian's package), "
                "or use the direct-scrape metrics source"
            )
        config_path = self._workdir / "prometheus.yml"
        config_path.write_text(yaml.safe_dump(self.config()))
        log = open(self.log_path, "ab")  # noqa: SIM115 - the child holds it
        self.process = subprocess.Popen(
            [
                binary,
                f"--config.file={config_path}",
                f"--storage.tsdb.path={self._workdir / 'data'}",
                f"--web.listen-address=127.0.0.1:{self.port}",
                "--web.enable-lifecycle",
                "--storage.tsdb.retention.time=1d",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        log.close()
        deadline = time.monotonic() + self.startup_timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                tail = self.log_path.read_text(errors="replace").strip().splitlines()[-1:]
                raise LocalPrometheusError(f"prometheus exited: {' '.join(tail)}")
            with contextlib.suppress(requests.RequestException):
                if requests.get(f"{self.url}/-/ready", timeout=1).status_code == 200:
                    return self
            time.sleep(0.2)
        self.stop()
        raise LocalPrometheusError(f"prometheus not ready after {self.startup_timeout_s:.0f} s")

    def stop(self) -> None:
        process, self.process = self.process, None
        if process is None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait(timeout=5)

    def close(self) -> None:
        """Stop and delete the data."""
        self.stop()
        shutil.rmtree(self._workdir, ignore_errors=True)

    def _api(self, path: str, params: dict[str, Any]) -> Any:
        try:
            return prometheus_get(self.url, path, params)
        except PrometheusApiError as error:
            raise LocalPrometheusError(str(error)) from None

    def query(self, promql: str) -> list[dict[str, Any]]:
        """An instant query's result vector (or matrix/scalar data as Prometheus returns it)."""
        return self._api("query", {"query": promql})["result"]

    def query_range(
        self, promql: str, start: float, end: float, step: float
    ) -> list[dict[str, Any]]:
        return self._api(
            "query_range", {"query": promql, "start": start, "end": end, "step": step}
        )["result"]

    def wait_for(self, promql: str, timeout_s: float = 30.0) -> list[dict[str, Any]]:
        """Poll until the query returns a non-empty result; raise with the query if it never does."""
        deadline = time.monotonic() + timeout_s
        while True:
            result = self.query(promql)
            if result:
                return result
            if time.monotonic() > deadline:
                raise LocalPrometheusError(f"no data after {timeout_s:.0f} s for: {promql}")
            time.sleep(min(1.0, self.scrape_interval_s))

    def __enter__(self) -> LocalPrometheus:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
