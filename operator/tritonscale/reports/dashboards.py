"""The Grafana dashboards of dashboards/, read without Grafana: their queries, and PNG previews.

    tritonscale dashboards preview --prometheus http://127.0.0.1:9090 --out previews/

`queries()` lists every panel query of a dashboard; `substitute()` fills in the variables
the way Grafana does on opening it (each variable's default; "All" is `.*`, which in
Prometheus also matches series without the label) and `$__rate_interval` with Grafana's
rule; `preview()` runs the queries against a live Prometheus and draws each dashboard as
one image, panels where Grafana would put them. Tests use the same functions to prove
every query against a real Prometheus.
"""

from __future__ import annotations

import json
import math
import re
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from tritonscale.metrics.prometheus_api import PrometheusApiError, prometheus_get

DEFAULT_DASHBOARDS_DIR = Path("dashboards")  # in the current directory (a checkout)
DEFAULT_SCRAPE_INTERVAL_S = 15.0  # Prometheus' own default, when its config cannot be read
POINTS_PER_PANEL = 200
LEGEND_SERIES = 8  # a preview legend shows the series with the highest means


class DashboardError(RuntimeError):
    """A preview could not be made; the message is one line for a person."""


@dataclass(frozen=True)
class Query:
    """One query of one panel, as the dashboard JSON holds it (variables unsubstituted)."""

    dashboard: str  # the file's stem, e.g. "triton-overview"
    panel: str  # the panel's title
    panel_type: str  # timeseries, stat, ...
    unit: str
    ref_id: str
    expr: str
    legend: str


# ---- reading dashboards ----------------------------------------------------------------
def load_dashboards(directory: Path = DEFAULT_DASHBOARDS_DIR) -> dict[str, dict[str, Any]]:
    """Every dashboard JSON of `directory`, by file stem."""
    if not directory.is_dir():
        raise DashboardError(f"dashboards folder not found: {directory}")
    found = {}
    for path in sorted(directory.glob("*.json")):
        try:
            found[path.stem] = json.loads(path.read_text())
        except json.JSONDecodeError as error:
            raise DashboardError(f"{path} is not valid JSON: {error}") from None
    if not found:
        raise DashboardError(f"no dashboards (*.json) in {directory}")
    return found


def select(
    dashboards: dict[str, dict[str, Any]], names: Iterable[str]
) -> dict[str, dict[str, Any]]:
    """The named dashboards (by file stem or uid); all of them when `names` is empty."""
    names = list(names)
    if not names:
        return dashboards
    by_uid = {board.get("uid"): stem for stem, board in dashboards.items()}
    chosen = {}
    for name in names:
        stem = name if name in dashboards else by_uid.get(name)
        if stem is None:
            raise DashboardError(
                f"unknown dashboard '{name}'; choose from: {', '.join(sorted(dashboards))}"
            )
        chosen[stem] = dashboards[stem]
    return chosen


def panels(dashboard: dict[str, Any]) -> list[dict[str, Any]]:
    """The dashboard's panels in order, rows included, collapsed rows' panels after their row."""
    flat = []
    for panel in dashboard.get("panels", []):
        flat.append(panel)
        flat.extend(panel.get("panels", []) if panel.get("type") == "row" else [])
    return flat


def queries(dashboard: dict[str, Any], name: str = "") -> list[Query]:
    """Every Prometheus query of every panel, then of every annotation."""
    found = []
    for panel in panels(dashboard):
        unit = panel.get("fieldConfig", {}).get("defaults", {}).get("unit", "")
        for query in panel.get("targets", []):
            found.append(
                Query(
                    dashboard=name,
                    panel=panel.get("title", ""),
                    panel_type=panel.get("type", ""),
                    unit=unit,
                    ref_id=query.get("refId", ""),
                    expr=query.get("expr", ""),
                    legend=query.get("legendFormat", ""),
                )
            )
    for annotation in dashboard.get("annotations", {}).get("list", []):
        if annotation.get("expr"):
            found.append(
                Query(
                    dashboard=name,
                    panel=f"annotation: {annotation.get('name', '')}",
                    panel_type="annotation",
                    unit="",
                    ref_id="",
                    expr=annotation["expr"],
                    legend=annotation.get("titleFormat", ""),
                )
            )
    return found


# ---- variables -------------------------------------------------------------------------
def variable_defaults(dashboard: dict[str, Any]) -> dict[str, str]:
    """Each variable's value on opening the dashboard, as a regex; the datasource is left out."""
    values = {}
    for variable in dashboard.get("templating", {}).get("list", []):
        if variable.get("type") == "datasource":
            continue
        current = variable.get("current", {}).get("value", "$__all")
        chosen = current if isinstance(current, list) else [current]
        if not chosen or "$__all" in chosen or "All" in chosen:
            values[variable["name"]] = variable.get("allValue") or ".*"
        else:
            values[variable["name"]] = "|".join(re.escape(str(v)) for v in chosen)
    return values


def rate_interval_s(step_s: float, scrape_interval_s: float) -> float:
    """Grafana's $__rate_interval: max($__interval + scrape interval, 4 x scrape interval)."""
    return max(step_s + scrape_interval_s, 4 * scrape_interval_s)


def duration(seconds: float) -> str:
    """A PromQL duration (whole milliseconds: PromQL takes no fractions)."""
    millis = max(1, round(seconds * 1000))
    return f"{millis // 1000}s" if millis % 1000 == 0 else f"{millis}ms"


def substitute(
    expr: str,
    variables: dict[str, str],
    *,
    rate_interval: str,
    interval: str | None = None,
    range_: str | None = None,
) -> str:
    """`expr` with Grafana's built-ins and the dashboard's variables filled in."""
    builtins = {
        "__rate_interval": rate_interval,
        "__interval": interval or rate_interval,
        "__range": range_ or rate_interval,
    }
    values = {**variables, **builtins}

    def replace(match: re.Match[str]) -> str:
        name = match.group("braced") or match.group("bracketed") or match.group("plain")
        return values.get(name, match.group(0))

    pattern = r"\$\{(?P<braced>\w+)(?::\w+)?\}|\[\[(?P<bracketed>\w+)\]\]|\$(?P<plain>\w+)"
    return re.sub(pattern, replace, expr)


# ---- Prometheus ------------------------------------------------------------------------
class Prometheus:
    """The little of Prometheus' HTTP API a preview needs; failures are one-line errors."""

    def __init__(self, url: str, timeout_s: float = 30.0) -> None:
        self.url = url.rstrip("/")
        self.timeout_s = timeout_s

    def _get(self, path: str, params: dict[str, Any] | None = None) -> Any:
        try:
            return prometheus_get(
                self.url, path.removeprefix("/api/v1/"), params, timeout_s=self.timeout_s
            )
        except PrometheusApiError as error:
            raise DashboardError(str(error)) from None

    def scrape_interval_s(self) -> float:
        """The global scrape interval from Prometheus' config (what $__rate_interval builds on)."""
        try:
            config = yaml.safe_load(self._get("/api/v1/status/config")["yaml"])
            return parse_duration(config["global"]["scrape_interval"])
        except (DashboardError, KeyError, TypeError, ValueError, yaml.YAMLError):
            # A proxy may hide the config endpoint; Prometheus' default is a fair guess.
            return DEFAULT_SCRAPE_INTERVAL_S

    def check(self) -> None:
        """Raise a one-line DashboardError unless `url` answers PromQL."""
        self._get("/api/v1/query", {"query": "1"})

    def query_range(self, expr: str, start: float, end: float, step_s: float) -> list[dict]:
        data = self._get(
            "/api/v1/query_range", {"query": expr, "start": start, "end": end, "step": step_s}
        )
        return data["result"]


_UNITS_S = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800, "y": 31536000}


def parse_duration(text: str) -> float:
    """Seconds of a Prometheus duration like "15m", "1h30m", "500ms"."""
    parts = re.findall(r"(\d+(?:\.\d+)?)(ms|s|m|h|d|w|y)", text.strip())
    if not parts or "".join(n + u for n, u in parts) != text.strip():
        raise ValueError(f"not a duration: '{text}' (use e.g. 30s, 15m, 1h)")
    return sum(float(number) * _UNITS_S[unit] for number, unit in parts)


# ---- drawing ---------------------------------------------------------------------------
def _scale(unit: str, largest: float) -> tuple[float, str]:
    """A factor and a label that make `unit` readable at the size of `largest`."""
    if unit == "µs":
        if largest >= 1e6:
            return 1e-6, "s"
        return (1e-3, "ms") if largest >= 1e3 else (1, "µs")
    if unit == "bytes":
        for factor, label in ((2**30, "GiB"), (2**20, "MiB"), (2**10, "KiB")):
            if largest >= factor:
                return 1 / factor, label
        return 1, "B"
    if unit == "percentunit":
        return 100, "%"
    return 1, {"reqps": "req/s", "watt": "W", "s": "s"}.get(unit, "")


def _legend(template: str, labels: dict[str, str]) -> str:
    text = re.sub(r"\{\{\s*(\w+)\s*\}\}", lambda m: labels.get(m.group(1), ""), template)
    text = " ".join(text.split())
    return text or json.dumps(labels, sort_keys=True)


@dataclass
class _Series:
    legend: str
    times: list[float]
    values: list[float]


def _fetch(
    prometheus: Prometheus,
    panel: dict[str, Any],
    variables: dict[str, str],
    start: float,
    end: float,
    step_s: float,
    rate_interval: str,
) -> tuple[list[_Series], str | None]:
    series, errors = [], []
    for query in panel.get("targets", []):
        expr = substitute(
            query.get("expr", ""),
            variables,
            rate_interval=rate_interval,
            interval=duration(step_s),
            range_=duration(end - start),
        )
        try:
            result = prometheus.query_range(expr, start, end, step_s)
        except DashboardError as error:
            if "cannot reach" in str(error):
                raise
            errors.append(str(error))
            continue
        for item in result:
            points = [(float(t), float(v)) for t, v in item["values"]]
            series.append(
                _Series(
                    _legend(query.get("legendFormat", ""), item["metric"]),
                    [t for t, _ in points],
                    [v for _, v in points],
                )
            )
    return series, (errors[0] if errors else None)


def _finite(values: list[float]) -> list[float]:
    return [v for v in values if math.isfinite(v)]


def _draw_panel(ax: Any, panel: dict[str, Any], series: list[_Series], error: str | None) -> None:
    unit = panel.get("fieldConfig", {}).get("defaults", {}).get("unit", "")
    ax.set_title(panel.get("title", ""), fontsize=9, loc="left")
    ax.tick_params(labelsize=7)
    drawn = [s for s in series if _finite(s.values)]
    if error or not drawn:
        ax.set_xticks([])
        ax.set_yticks([])
        ax.text(
            0.5,
            0.5,
            error or "no data",
            ha="center",
            va="center",
            fontsize=8,
            color="firebrick" if error else "grey",
            wrap=True,
            transform=ax.transAxes,
        )
        return
    largest = max(abs(v) for s in drawn for v in _finite(s.values))
    factor, label = _scale(unit, largest)
    if panel.get("type") == "stat":
        last = _finite(drawn[0].values)[-1] * factor
        ax.set_xticks([])
        ax.set_yticks([])
        ax.text(
            0.5,
            0.45,
            f"{last:.3g} {label}".strip(),
            ha="center",
            va="center",
            fontsize=20,
            transform=ax.transAxes,
        )
        ax.plot(drawn[0].times, [v * factor for v in drawn[0].values], alpha=0.3)
        return
    start = min(s.times[0] for s in drawn)
    ranked = sorted(drawn, key=lambda s: -sum(_finite(s.values)) / len(_finite(s.values)))
    for index, item in enumerate(ranked):
        minutes = [(t - start) / 60 for t in item.times]
        ax.plot(
            minutes,
            [v * factor for v in item.values],
            linewidth=1,
            label=item.legend if index < LEGEND_SERIES else None,
        )
    ax.set_ylabel(label, fontsize=7)
    ax.set_xlabel("minutes", fontsize=7)
    if min(_finite([v for s in drawn for v in s.values])) >= 0:
        ax.set_ylim(bottom=0)
    title = f" (top {LEGEND_SERIES} of {len(drawn)})" if len(drawn) > LEGEND_SERIES else ""
    ax.legend(fontsize=6, loc="upper left", title=title.strip() or None, title_fontsize=6)


def render(
    dashboard: dict[str, Any],
    prometheus: Prometheus,
    out: Path,
    *,
    range_s: float,
    end: float | None = None,
    overrides: dict[str, str] | None = None,
) -> Path:
    """Draw one dashboard from live data as a PNG laid out like Grafana's 24-column grid.

    `overrides` replace variables' defaults (regexes, as Grafana would substitute them).
    """
    from matplotlib.figure import Figure  # imported here: only previews need matplotlib
    from matplotlib.gridspec import GridSpec

    end = time.time() if end is None else end
    start = end - range_s
    step_s = max(1.0, range_s / POINTS_PER_PANEL)
    rate_interval = duration(rate_interval_s(step_s, prometheus.scrape_interval_s()))
    variables = variable_defaults(dashboard)
    variables.update({k: v for k, v in (overrides or {}).items() if k in variables})
    laid_out = [p for p in panels(dashboard) if "gridPos" in p]
    rows = max(p["gridPos"]["y"] + p["gridPos"]["h"] for p in laid_out)
    figure = Figure(figsize=(22, 0.42 * rows + 1), layout="constrained")
    figure.suptitle(
        f"{dashboard.get('title', '')}  |  last {duration(range_s)} from {prometheus.url}"
        f"  |  $__rate_interval = {rate_interval}",
        fontsize=12,
    )
    grid = GridSpec(rows, 24, figure=figure)
    for panel in laid_out:
        pos = panel["gridPos"]
        ax = figure.add_subplot(
            grid[pos["y"] : pos["y"] + pos["h"], pos["x"] : pos["x"] + pos["w"]]
        )
        if panel.get("type") == "row":
            ax.axis("off")
            ax.text(0, 0.5, panel.get("title", ""), fontsize=11, weight="bold", va="center")
            continue
        series, error = _fetch(prometheus, panel, variables, start, end, step_s, rate_interval)
        _draw_panel(ax, panel, series, error)
    out.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(out, dpi=80)
    return out


def preview(
    prometheus_url: str,
    out_dir: Path,
    *,
    names: Iterable[str] = (),
    range_text: str = "15m",
    dashboards_dir: Path = DEFAULT_DASHBOARDS_DIR,
    overrides: dict[str, str] | None = None,
) -> list[Path]:
    """One PNG per chosen dashboard in `out_dir`, drawn from `prometheus_url`'s data."""
    try:
        range_s = parse_duration(range_text)
    except ValueError as error:
        raise DashboardError(str(error)) from None
    chosen = select(load_dashboards(dashboards_dir), names)
    known = {name for board in chosen.values() for name in variable_defaults(board)}
    unknown = sorted(set(overrides or {}) - known)
    if unknown:
        raise DashboardError(
            f"unknown variable '{unknown[0]}'; these dashboards have: {', '.join(sorted(known))}"
        )
    prometheus = Prometheus(prometheus_url)
    prometheus.check()  # fail fast, in one line, before drawing anything
    return [
        render(board, prometheus, out_dir / f"{stem}.png", range_s=range_s, overrides=overrides)
        for stem, board in chosen.items()
    ]
