"""One HTML page with PNG plots from a load-test run.

Inputs, any combination:

- Locust's CSV stats history (`--csv PREFIX --csv-full-history` writes
  `PREFIX_stats_history.csv`): throughput, failures, users and the p50/p95/p99 latency of
  the whole run, second by second (Locust's percentiles there cover its last ~10 s).
- A Prometheus URL: Triton's metrics over the same window with `query_range`, per model:
  throughput, mean request latency, mean queue time, p95 (when Triton runs with
  `--metrics-config summary_latencies=true`), and the operator's
  `tritonscale_current_instances`.
- The local driver's JSON-lines decision log (`tritonscale tune`): the live and desired
  instance counts per model at each tick.
- An open-loop load's history (the demo's `load.csv`: `t`, `offered_rps`, `served_rps`,
  `failed_rps`, `p95_ms`, one row per second): what was offered against what was served, and
  the p95 counted from when each request was due.

`write_report(...)` renders `index.html` and one PNG per plot into a folder;
`tritonscale report` is its command line. Bad or missing inputs raise `ReportError`,
one line for a person.
"""

from __future__ import annotations

import csv
import html
import json
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only: no display on servers and in CI

import matplotlib.dates as mdates  # noqa: E402
import matplotlib.pyplot as plt  # noqa: E402

from tritonscale.metrics.prometheus_api import PrometheusApiError, prometheus_get  # noqa: E402

HISTORY_SUFFIX = "_stats_history.csv"
HISTORY_COLUMNS = (
    "Timestamp",
    "User Count",
    "Name",
    "Requests/s",
    "Failures/s",
    "50%",
    "95%",
    "99%",
)


class ReportError(Exception):
    """An input is missing or unreadable; the message is one line for a person."""


Series = list[tuple[float, float]]  # (unix seconds, value)


@dataclass
class RunData:
    """Everything the plots draw, each a time series keyed by what it shows."""

    throughput: dict[str, Series] = field(default_factory=dict)
    latency_ms: dict[str, Series] = field(default_factory=dict)
    queue_ms: dict[str, Series] = field(default_factory=dict)
    instances: dict[str, Series] = field(default_factory=dict)
    users: Series = field(default_factory=list)
    marks: list[tuple[float, str]] = field(default_factory=list)  # (unix s, label): phase starts
    notes: list[str] = field(default_factory=list)
    summary: dict[str, str] = field(default_factory=dict)

    def window(self) -> tuple[float, float] | None:
        times = [
            t
            for group in (self.throughput, self.latency_ms, self.queue_ms, self.instances)
            for series in group.values()
            for t, _ in series
        ] + [t for t, _ in self.users]
        return (min(times), max(times)) if times else None


# ---- Locust ---------------------------------------------------------------------------


def history_path(locust_csv: str | Path) -> Path:
    """The stats-history file of a Locust CSV prefix (or the file itself)."""
    path = Path(locust_csv)
    if path.is_file():
        return path
    candidate = Path(f"{locust_csv}{HISTORY_SUFFIX}")
    if candidate.is_file():
        return candidate
    raise ReportError(
        f"Locust stats history not found: {candidate} "
        "(run locust with --csv PREFIX --csv-full-history, and pass PREFIX)"
    )


def _number(text: str) -> float | None:
    try:
        value = float(text)
    except (TypeError, ValueError):
        return None  # Locust writes "N/A" before the first answer
    return value if math.isfinite(value) else None


def read_locust_history(locust_csv: str | Path, data: RunData) -> None:
    path = history_path(locust_csv)
    with path.open(newline="") as handle:
        reader = csv.DictReader(handle)
        missing = [c for c in HISTORY_COLUMNS if c not in (reader.fieldnames or [])]
        if missing:
            raise ReportError(f"{path} is not a Locust stats history: no column '{missing[0]}'")
        rows = [row for row in reader if row["Name"] == "Aggregated"]
    if not rows:
        raise ReportError(f"{path} has no 'Aggregated' rows: the run recorded no second")
    throughput: Series = []
    failures: Series = []
    for row in rows:
        t = _number(row["Timestamp"])
        if t is None:
            raise ReportError(f"{path}: bad Timestamp {row['Timestamp']!r}")
        data.users.append((t, _number(row["User Count"]) or 0.0))
        throughput.append((t, _number(row["Requests/s"]) or 0.0))
        failures.append((t, _number(row["Failures/s"]) or 0.0))
        for column, label in (("50%", "p50"), ("95%", "p95"), ("99%", "p99")):
            value = _number(row[column])
            if value is not None and row["Total Request Count"] not in ("0", ""):
                data.latency_ms.setdefault(f"Locust {label}", []).append((t, value))
    data.throughput["Locust requests/s"] = throughput
    data.throughput["Locust failures/s"] = failures
    last = rows[-1]
    data.summary.update(
        {
            "Locust requests": last.get("Total Request Count", "?"),
            "Locust failures": last.get("Total Failure Count", "?"),
            "Locust mean latency (ms)": f"{_number(last.get('Total Average Response Time', '')) or 0:.1f}",
            "peak users": f"{max(v for _, v in data.users):.0f}",
        }
    )


# ---- an open-loop load's history ------------------------------------------------------

LOAD_COLUMNS = ("t", "offered_rps", "served_rps", "failed_rps", "p95_ms")


def read_load_history(path: str | Path, data: RunData) -> None:
    path = Path(path)
    if not path.is_file():
        raise ReportError(f"load history not found: {path}")
    with path.open(newline="") as handle:
        reader = csv.DictReader(handle)
        missing = [c for c in LOAD_COLUMNS if c not in (reader.fieldnames or [])]
        if missing:
            raise ReportError(f"{path} is not a load history: no column '{missing[0]}'")
        rows = list(reader)
    if not rows:
        raise ReportError(f"{path} holds no row: the load ran for less than a second")
    columns = {"offered_rps": "offered requests/s", "served_rps": "served requests/s"}
    for number, row in enumerate(rows, start=2):
        t = _number(row["t"])
        if t is None:
            raise ReportError(f"{path} line {number}: bad t {row['t']!r}")
        for column, label in columns.items():
            data.throughput.setdefault(label, []).append((t, _number(row[column]) or 0.0))
        failed = _number(row["failed_rps"]) or 0.0
        data.throughput.setdefault("failed requests/s", []).append((t, failed))
        p95 = _number(row["p95_ms"])
        if p95 is not None:
            data.latency_ms.setdefault("client p95 (from when each request was due)", []).append(
                (t, p95)
            )
    offered = sum(_number(row["offered_rps"]) or 0.0 for row in rows)
    served = sum(_number(row["served_rps"]) or 0.0 for row in rows)
    data.summary.update({"requests offered": f"{offered:.0f}", "requests served": f"{served:.0f}"})


# ---- Prometheus -----------------------------------------------------------------------

# label -> PromQL; {w} is the rate window. Per model, as Triton labels its metrics.
PROMETHEUS_QUERIES: dict[str, tuple[str, str]] = {
    "throughput": (
        "sum by (model) (rate(nv_inference_request_success[{w}]))",
        "{model} requests/s",
    ),
    "latency_ms": (
        "sum by (model) (rate(nv_inference_request_duration_us[{w}])) / 1000"
        " / sum by (model) (rate(nv_inference_request_success[{w}]))",
        "{model} mean",
    ),
    "latency_p95": (
        'max by (model) (nv_inference_request_summary_us{{quantile="0.95"}}) / 1000',
        "{model} p95",
    ),
    "queue_ms": (
        "sum by (model) (rate(nv_inference_queue_duration_us[{w}])) / 1000"
        " / sum by (model) (rate(nv_inference_request_success[{w}]))",
        "{model}",
    ),
    "instances": ("min by (model) (tritonscale_current_instances)", "{model} (operator)"),
}


def query_range(url: str, promql: str, start: float, end: float, step: float) -> list[dict]:
    params = {"query": promql, "start": start, "end": end, "step": step}
    try:
        return prometheus_get(url, "query_range", params, timeout_s=15)["result"]
    except PrometheusApiError as error:
        raise ReportError(str(error)) from None


def read_prometheus(url: str, start: float, end: float, data: RunData, step: float = 1.0) -> None:
    window = f"{max(int(step * 5), 5)}s"
    found = 0
    for key, (template, label) in PROMETHEUS_QUERIES.items():
        promql = template.format(w=window)
        target = data.latency_ms if key == "latency_p95" else getattr(data, key)
        for result in query_range(url, promql, start, end, step):
            model = result["metric"].get("model", "all")
            series = [(float(t), float(v)) for t, v in result["values"] if math.isfinite(float(v))]
            # Idle models (every value 0) would only clutter the plots.
            if series and (key == "instances" or any(v for _, v in series)):
                target[label.format(model=model)] = series
                found += 1
    if not found:
        data.notes.append(
            f"Prometheus at {url} had no Triton metrics between "
            f"{_clock(start)} and {_clock(end)} UTC"
        )


# ---- decision log ---------------------------------------------------------------------


def read_decisions(path: str | Path, data: RunData) -> None:
    path = Path(path)
    if not path.is_file():
        raise ReportError(f"decision log not found: {path}")
    live: dict[str, Series] = {}
    desired: dict[str, Series] = {}
    changes = 0
    for number, line in enumerate(path.read_text().splitlines(), start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
            t = float(record["t"])
            model = str(record["model"])
        except (ValueError, KeyError, TypeError):
            raise ReportError(
                f"{path} line {number}: not a decision record (JSON with 't' and 'model')"
            ) from None
        if record.get("current") is not None:
            live.setdefault(model, []).append((t, float(record["current"])))
        if record.get("desired") is not None:
            desired.setdefault(model, []).append((t, float(record["desired"])))
        changes += sum(1 for pod in record.get("applied") or () if pod.get("ok"))
    if not live and not desired:
        raise ReportError(f"{path} holds no decision with an instance count")
    for model, series in live.items():
        data.instances[f"{model} live"] = series
    for model, series in desired.items():
        data.instances[f"{model} desired"] = series
    data.summary["instance changes applied"] = str(changes)


# ---- rendering ------------------------------------------------------------------------


def _clock(t: float) -> str:
    return datetime.fromtimestamp(t, timezone.utc).strftime("%H:%M:%S")


def _plot(
    path: Path,
    title: str,
    ylabel: str,
    groups: dict[str, Series],
    *,
    steps: bool = False,
    users: Series | None = None,
    marks: Sequence[tuple[float, str]] = (),
    log_when_wide: bool = False,
) -> None:
    figure, axes = plt.subplots(figsize=(12, 4))
    axes.set_prop_cycle(color=plt.cm.tab20.colors)  # many models: 20 distinct colours
    for label, series in sorted(groups.items()):
        times = [datetime.fromtimestamp(t, timezone.utc) for t, _ in series]
        values = [v for _, v in series]
        if steps:
            axes.step(times, values, where="post", label=label)
        else:
            axes.plot(times, values, label=label)
    if users:
        twin = axes.twinx()
        twin.plot(
            [datetime.fromtimestamp(t, timezone.utc) for t, _ in users],
            [v for _, v in users],
            color="grey",
            linestyle=":",
            label="users",
        )
        twin.set_ylabel("users")
        twin.legend(loc="lower left", bbox_to_anchor=(1.08, 0.0), fontsize="small")
    for t, label in marks:
        when = datetime.fromtimestamp(t, timezone.utc)
        axes.axvline(when, color="black", linestyle=":", linewidth=0.8)
        axes.annotate(
            label,
            (when, 1.0),
            xycoords=("data", "axes fraction"),
            xytext=(3, -3),
            textcoords="offset points",
            va="top",
            fontsize="small",
        )
    axes.set_title(title)
    axes.set_ylabel(ylabel)
    axes.set_xlabel("time (UTC)")
    axes.xaxis.set_major_formatter(mdates.DateFormatter("%H:%M:%S"))
    values = [v for series in groups.values() for _, v in series if v > 0]
    if log_when_wide and values and max(values) > 100 * min(values):
        # A backlog's seconds beside a served request's milliseconds: both stay readable.
        axes.set_yscale("log")
    axes.grid(alpha=0.3)
    # Beside the plot: with many models a legend inside would hide the lines.
    axes.legend(
        loc="upper left", bbox_to_anchor=(1.01 if not users else 1.08, 1.0), fontsize="small"
    )
    figure.tight_layout()
    figure.savefig(path, dpi=90)
    plt.close(figure)


PLOTS = (
    # file, title, y label, RunData field, step plot
    ("throughput.png", "Throughput", "requests/s", "throughput", False),
    (
        "latency.png",
        "Latency (from the client: Locust or the open-loop load; per model from Triton)",
        "ms",
        "latency_ms",
        False,
    ),
    ("queue.png", "Queue time per request (Triton)", "ms", "queue_ms", False),
    ("instances.png", "Instances per model", "instances", "instances", True),
)


def render(data: RunData, out_dir: str | Path, title: str = "Tritonscale load-test report") -> Path:
    """Write index.html and the PNGs into `out_dir`; return the HTML file's path."""
    out = Path(out_dir)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise ReportError(f"cannot create {out}: {error.strerror}") from None
    sections = []
    for filename, plot_title, ylabel, attribute, steps in PLOTS:
        groups = getattr(data, attribute)
        if not groups:
            sections.append(
                f"<h2>{html.escape(plot_title)}</h2><p class=note>No data: "
                f"{_missing_reason(attribute)}</p>"
            )
            continue
        users = data.users if attribute == "throughput" else None
        _plot(
            out / filename,
            plot_title,
            ylabel,
            groups,
            steps=steps,
            users=users,
            marks=data.marks,
            log_when_wide=attribute == "latency_ms",
        )
        sections.append(
            f"<h2>{html.escape(plot_title)}</h2>"
            f'<img src="{filename}" alt="{html.escape(plot_title)}" width="900">'
        )
    window = data.window()
    summary = dict(data.summary)
    if window:
        summary = {
            "window (UTC)": f"{_clock(window[0])} to {_clock(window[1])}",
            "duration (s)": f"{window[1] - window[0]:.0f}",
            **summary,
        }
    rows = "".join(
        f"<tr><th>{html.escape(k)}</th><td>{html.escape(v)}</td></tr>" for k, v in summary.items()
    )
    notes = "".join(f"<p class=note>{html.escape(n)}</p>" for n in data.notes)
    page = f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>{html.escape(title)}</title>
<style>body{{font-family:sans-serif;max-width:960px;margin:2em auto}}
th{{text-align:left;padding-right:2em}} .note{{color:#666}}</style></head>
<body><h1>{html.escape(title)}</h1>
<p>Generated {datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M:%S")} UTC by <code>tritonscale report</code>.</p>
<table>{rows}</table>{notes}
{"".join(sections)}
</body></html>
"""
    index = out / "index.html"
    index.write_text(page)
    return index


def _missing_reason(attribute: str) -> str:
    return {
        "throughput": "give a Locust CSV, a load history or a Prometheus URL",
        "latency_ms": "give a Locust CSV, a load history or a Prometheus URL",
        "queue_ms": "queue time comes from Triton's metrics: give a Prometheus URL",
        "instances": "give the local driver's decision log, or a Prometheus that scrapes the operator",
    }[attribute]


def write_report(
    out_dir: str | Path,
    *,
    locust_csv: str | Path | None = None,
    prometheus_url: str | None = None,
    decisions: str | Path | None = None,
    window: Sequence[float] | None = None,
    step_s: float = 1.0,
    load_csv: str | Path | None = None,
    title: str = "Tritonscale load-test report",
    marks: Sequence[tuple[float, str]] = (),
) -> Path:
    """Read the inputs and render the page; returns the HTML path.

    The Prometheus window is `window` (start, end unix seconds) when given, else the span of
    the other inputs. `marks` ((unix s, label), such as the start of each phase of a load)
    are drawn on every plot.
    """
    if not (locust_csv or load_csv or decisions or (prometheus_url and window)):
        raise ReportError(
            "nothing to report: give a Locust CSV prefix, a load history, a decision log, "
            "or a Prometheus URL with a time window"
        )
    data = RunData(marks=list(marks))
    if locust_csv:
        read_locust_history(locust_csv, data)
    if load_csv:
        read_load_history(load_csv, data)
    if decisions:
        read_decisions(decisions, data)
    if prometheus_url:
        span = tuple(window) if window else data.window()
        if span is None:
            raise ReportError("no time window for Prometheus: the inputs hold no timestamps")
        start, end = float(span[0]), float(span[1])
        if end <= start:
            end = start + step_s
        read_prometheus(prometheus_url, start, min(end, time.time()), data, step=step_s)
    return render(data, out_dir, title)
