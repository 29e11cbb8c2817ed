"""The `tritonscale` command line: thin adapters that parse options and delegate.

A user's mistake ends in one line on stderr and a non-zero exit, never a traceback:
commands raise `click.ClickException` (or an error type listed in `USER_ERRORS`).
"""

from __future__ import annotations

import importlib.util
import os
import sys
import time
from pathlib import Path

import click

from tritonscale import REPOSITORY_KEY_ENV, REPOSITORY_KEY_HEADER
from tritonscale.drivers.tune import TuneConfigError
from tritonscale.local.interrupts import stop_on_signals
from tritonscale.local.ports import LOOPBACK
from tritonscale.local.triton_server import DEFAULT_MODEL_REPOSITORY, LocalTriton, LocalTritonError
from tritonscale.triton.loads import DEFAULT_LOAD_DEADLINE_S

# `--load-deadline` of the operator and of tune: how long a tick waits for one load.
LOAD_DEADLINE_HELP = (
    "Seconds a tick waits for one load of a model on a pod (a normal reload takes about "
    "0.4-3.5 s); past it the tick reports ReloadTimeout, takes the larger of the two counts for "
    "what runs, and sends no other load of that model to that pod until Triton has answered."
)

# Errors that are the user's to fix (bad input, a busy port, a missing binary): one line.
USER_ERRORS: tuple[type[Exception], ...] = (LocalTritonError, TuneConfigError)


# What each optional extra of the package brings that a command imports. The base install
# (the operator's image) runs `operator` and `tune`; the other commands name the extra they
# miss in one line rather than failing on an import deep inside.
EXTRA_MODULES: dict[str, tuple[str, ...]] = {
    "server": ("pytriton",),
    "load": ("grpc",),
    "reports": ("matplotlib",),
}


def require_extras(*extras: str) -> None:
    """Stop the current command with one line naming the first extra that is not installed."""
    for extra in extras:
        absent = [name for name in EXTRA_MODULES[extra] if importlib.util.find_spec(name) is None]
        if absent:
            command = click.get_current_context().command_path
            raise click.ClickException(
                f"'{command}' needs the {extra} extra ({', '.join(absent)} not installed): "
                f"pip install 'tritonscale[{extra}]'"
            )


class _Group(click.Group):
    def invoke(self, ctx: click.Context) -> object:
        try:
            return super().invoke(ctx)
        except USER_ERRORS as error:
            raise click.ClickException(str(error)) from None


@click.group(cls=_Group, context_settings={"auto_envvar_prefix": "TRITONSCALE"})
@click.version_option(package_name="tritonscale")
def main() -> None:
    """Tritonscale: Triton async BLS pipelines with instance counts tuned from metrics."""


@main.command()
@click.option(
    "--model-repository",
    type=click.Path(file_okay=False, path_type=Path),
    default=DEFAULT_MODEL_REPOSITORY,
    show_default=True,
    help="Triton model repository to serve.",
)
@click.option("--http-port", type=click.IntRange(0, 65535), default=8000, show_default=True)
@click.option("--grpc-port", type=click.IntRange(0, 65535), default=8001, show_default=True)
@click.option("--metrics-port", type=click.IntRange(0, 65535), default=8002, show_default=True)
@click.option(
    "--http-address",
    default=LOOPBACK,
    show_default=True,
    help="Address the HTTP server binds; 0.0.0.0 lets other machines reach it.",
)
@click.option(
    "--grpc-address", default=LOOPBACK, show_default=True, help="Address the gRPC server binds."
)
@click.option(
    "--metrics-address",
    default=LOOPBACK,
    show_default=True,
    help="Address the metrics server binds.",
)
@click.option(
    "--model",
    "models",
    multiple=True,
    help="Load only this model (repeatable); default: every model of the repository.",
)
def serve(
    model_repository: Path,
    http_port: int,
    grpc_port: int,
    metrics_port: int,
    http_address: str,
    grpc_address: str,
    metrics_address: str,
    models: tuple[str, ...],
) -> None:
    """Run a local tritonserver on a model repository until Ctrl-C or SIGTERM."""
    require_extras("server")
    stop_on_signals()
    server = LocalTriton(
        model_repository,
        http_port=http_port,
        grpc_port=grpc_port,
        metrics_port=metrics_port,
        http_address=http_address,
        grpc_address=grpc_address,
        metrics_address=metrics_address,
        models=list(models) or None,
    )
    click.echo(f"starting tritonserver on {server.model_repository} ...")
    try:
        with server:
            names = models or server.ready_models()
            click.echo(
                f"ready in {server.startup_s:.1f} s: {len(names)} models ({', '.join(names)})\n"
                f"  HTTP    http://{server.http_url}\n"
                f"  gRPC    {server.grpc_url}\n"
                f"  metrics {server.metrics_url}\n"
                f"  log     {server.log_path}"
            )
            if os.environ.get(REPOSITORY_KEY_ENV):
                click.echo(f"model-repository API key: from ${REPOSITORY_KEY_ENV}")
            else:
                click.echo(
                    f"model-repository API key (header {REPOSITORY_KEY_HEADER}): "
                    f"{server.repository_key}"
                )
            while server.is_running():
                time.sleep(0.5)
            raise LocalTritonError(
                f"tritonserver stopped unexpectedly; see its log at {server.log_path}"
            )
    except KeyboardInterrupt:
        click.echo("stopped", err=True)


@main.command(context_settings={"show_default": True})
@click.option(
    "--namespace",
    "namespaces",
    show_envvar=True,
    multiple=True,
    help="Serve the autoscalers of this namespace (repeatable; from the environment: "
    "space-separated).",
)
@click.option(
    "--all-namespaces",
    show_envvar=True,
    is_flag=True,
    help="Serve every namespace (needs cluster-wide RBAC; see docs/rbac.md).",
)
@click.option(
    "--liveness",
    show_envvar=True,
    metavar="URL",
    help="Serve kopf's liveness probe here, e.g. http://0.0.0.0:8080/healthz.",
)
@click.option(
    "--readiness",
    show_envvar=True,
    metavar="URL",
    help="Serve the readiness probe here, e.g. http://0.0.0.0:8081/readyz: 200 once the "
    "watched objects are listed (or, with --peering, while a standby sees a live active peer).",
)
@click.option(
    "--metrics-port",
    show_envvar=True,
    type=click.IntRange(0, 65535),
    default=9102,
    show_default=True,
    help="Serve the operator's own Prometheus metrics on this port (0: off).",
)
@click.option(
    "--peering",
    show_envvar=True,
    metavar="NAME",
    help="KopfPeering object to coordinate replicas through; without it, run standalone.",
)
@click.option(
    "--priority",
    show_envvar=True,
    type=int,
    help="Peering priority (the highest live one acts); default: random, so replicas differ.",
)
@click.option(
    "--peering-lifetime",
    show_envvar=True,
    type=click.IntRange(min=15),
    default=60,
    show_default=True,
    help="Seconds a replica's peering record counts as alive: a standby takes over from a "
    "killed replica within about this long (records are renewed 5 to 10 s before expiry).",
)
@click.option(
    "--prometheus-url",
    show_envvar=True,
    metavar="URL",
    help="Prometheus to query for Triton's metrics; without it, scrape each pod's /metrics.",
)
@click.option(
    "--triton-http-port",
    show_envvar=True,
    type=click.IntRange(1, 65535),
    default=8000,
    show_default=True,
    help="Triton's HTTP port on a pod that names no container port 'http'.",
)
@click.option(
    "--triton-metrics-port",
    show_envvar=True,
    type=click.IntRange(1, 65535),
    default=8002,
    show_default=True,
    help="Triton's metrics port on a pod that names no container port 'metrics'.",
)
@click.option(
    "--load-deadline",
    "load_deadline_s",
    show_envvar=True,
    type=click.FloatRange(min=0, min_open=True),
    default=DEFAULT_LOAD_DEADLINE_S,
    show_default=True,
    help=LOAD_DEADLINE_HELP,
)
@click.option(
    "--total-shards",
    show_envvar=True,
    type=click.IntRange(min=1),
    default=1,
    show_default=True,
    help="Replicas that share the pod sets, each acting on its own share (a StatefulSet's).",
)
@click.option(
    "--shard",
    show_envvar=True,
    default="0",
    show_default=True,
    metavar="N|POD",
    help="This replica's share, 0 to total-shards - 1, or a StatefulSet pod's name "
    "(its ordinal, the number after the last '-').",
)
@click.option(
    "--verbose", is_flag=True, show_envvar=True, help="Log at debug level, every tick included."
)
def operator(
    namespaces: tuple[str, ...],
    all_namespaces: bool,
    liveness: str | None,
    readiness: str | None,
    metrics_port: int,
    peering: str | None,
    priority: int | None,
    peering_lifetime: int,
    prometheus_url: str | None,
    triton_http_port: int,
    triton_metrics_port: int,
    load_deadline_s: float,
    total_shards: int,
    shard: str,
    verbose: bool,
) -> None:
    """Run the Kubernetes operator: the InstanceGroupAutoscalers of the same pods tick as one
    pod set; with --total-shards, this replica acts on its share of the sets.

    The model-repository key comes from $TRITONSCALE_REPOSITORY_KEY (never the command line).
    """
    if namespaces and all_namespaces:
        raise click.UsageError("give --namespace or --all-namespaces, not both")
    if not namespaces and not all_namespaces:
        raise click.UsageError("name the namespaces to serve (--namespace NS) or --all-namespaces")
    # Imported here: kopf registers the handlers on import, which no other command wants.
    import kopf

    from tritonscale.drivers import kopf_operator as kopf_driver

    if liveness and (problem := kopf_driver.liveness_problem(liveness)):
        raise click.UsageError(problem)
    if readiness and (
        problem := kopf_driver.probe_url_problem(
            "--readiness", readiness, "http://0.0.0.0:8081/readyz"
        )
    ):
        raise click.UsageError(problem)
    try:
        share = kopf_driver.shard_of(shard, total_shards)
    except ValueError as error:
        raise click.UsageError(str(error)) from None
    if problem := kopf_driver.credentials_problem():
        raise click.ClickException(problem)
    kopf.configure(verbose=verbose, log_prefix=True)
    config = kopf_driver.DriverConfig(
        prometheus_url=prometheus_url or None,
        triton_http_port=triton_http_port,
        triton_metrics_port=triton_metrics_port,
        load_deadline_s=load_deadline_s,
        shard=share,
    )
    try:
        kopf_driver.run(
            config,
            namespaces=namespaces,
            clusterwide=all_namespaces,
            peering=peering or None,
            priority=priority,
            peering_lifetime_s=peering_lifetime,
            liveness=liveness or None,
            readiness_url=readiness or None,
            metrics_port=metrics_port or None,
        )
    except kopf_driver.OperatorError as error:
        raise click.ClickException(str(error)) from None


@main.group()
def dashboards() -> None:
    """The Grafana dashboards of dashboards/, without Grafana."""


@dashboards.command()
@click.option("--prometheus", "prometheus_url", required=True, help="Prometheus base URL.")
@click.option(
    "--dashboard",
    "names",
    multiple=True,
    help="Only this dashboard (file name without .json, or uid; repeatable). Default: all.",
)
@click.option(
    "--out",
    type=click.Path(file_okay=False, path_type=Path),
    default=Path("dashboard-previews"),
    show_default=True,
    help="Folder for the PNG files.",
)
@click.option("--range", "range_text", default="15m", show_default=True, help="Time range.")
@click.option(
    "--var",
    "variables",
    multiple=True,
    metavar="NAME=REGEX",
    help="Set a dashboard variable (repeatable), e.g. --var model=pipeline_async. "
    "Default: each variable's default, 'All' being .*.",
)
@click.option(
    "--dashboards-dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="Folder of dashboard JSON files; default: the checkout's dashboards/.",
)
def preview(
    prometheus_url: str,
    names: tuple[str, ...],
    out: Path,
    range_text: str,
    variables: tuple[str, ...],
    dashboards_dir: Path | None,
) -> None:
    """Draw each dashboard's panels from a live Prometheus into one PNG per dashboard."""
    require_extras("reports")
    # Imported here: the module pulls in matplotlib, which no other command needs.
    from tritonscale.reports import dashboards as dashboard_files

    overrides = {}
    for item in variables:
        name, sep, value = item.partition("=")
        if not sep or not name:
            raise click.BadParameter(f"'{item}' is not NAME=REGEX", param_hint="--var")
        overrides[name] = value
    try:
        paths = dashboard_files.preview(
            prometheus_url,
            out,
            names=names,
            range_text=range_text,
            dashboards_dir=dashboards_dir or dashboard_files.DEFAULT_DASHBOARDS_DIR,
            overrides=overrides,
        )
    except dashboard_files.DashboardError as error:
        raise click.ClickException(str(error)) from None
    for path in paths:
        click.echo(path)


@main.command()
@click.option(
    "--locust-csv",
    help="Locust's --csv PREFIX of a run with --csv-full-history (or its _stats_history.csv).",
)
@click.option(
    "--load-csv",
    type=click.Path(path_type=Path),
    help="An open-loop load's history, second by second (the demo's load.csv).",
)
@click.option(
    "--prometheus", "prometheus_url", help="Prometheus URL: Triton's metrics over the run."
)
@click.option(
    "--decisions",
    type=click.Path(path_type=Path),
    help="The local driver's JSON-lines decision log (tritonscale tune).",
)
@click.option(
    "--start",
    type=float,
    help="Window start for Prometheus (unix s); default: the inputs' first timestamp.",
)
@click.option("--end", type=float, help="Window end for Prometheus (unix s).")
@click.option(
    "--out",
    type=click.Path(file_okay=False, path_type=Path),
    default=Path("reports/run"),
    show_default=True,
    help="Folder for index.html and the PNG plots.",
)
def report(
    locust_csv: str | None,
    load_csv: Path | None,
    prometheus_url: str | None,
    decisions: Path | None,
    start: float | None,
    end: float | None,
    out: Path,
) -> None:
    """One HTML page with plots of a run: throughput, latency, queue time, instances."""
    require_extras("reports")
    from tritonscale.reports.report import ReportError, write_report

    if (start is None) != (end is None):
        raise click.ClickException("give both --start and --end, or neither")
    try:
        index = write_report(
            out,
            locust_csv=locust_csv,
            load_csv=load_csv,
            prometheus_url=prometheus_url,
            decisions=decisions,
            window=(start, end) if start is not None else None,
        )
    except ReportError as error:
        raise click.ClickException(str(error)) from None
    click.echo(f"report: {index}")


@main.command()
@click.option(
    "--config",
    "config_path",
    required=True,
    type=click.Path(dir_okay=False, path_type=Path),
    help="Policy file (YAML): Triton URLs, the metrics source, the policies.",
)
@click.option(
    "--metrics-port",
    type=click.IntRange(0, 65535),
    default=9102,
    show_default=True,
    help="Serve the operator's own metrics on this port; 0: off.",
)
@click.option(
    "--decision-log",
    type=click.Path(dir_okay=False, path_type=Path),
    help="Append one JSON line per tick to this file.",
)
@click.option(
    "--duration",
    type=click.FloatRange(min=0, min_open=True),
    help="Stop after this many seconds (default: until Ctrl-C or SIGTERM).",
)
@click.option(
    "--load-deadline",
    "load_deadline_s",
    type=click.FloatRange(min=0, min_open=True),
    default=DEFAULT_LOAD_DEADLINE_S,
    show_default=True,
    help=LOAD_DEADLINE_HELP,
)
def tune(
    config_path: Path,
    metrics_port: int,
    decision_log: Path | None,
    duration: float | None,
    load_deadline_s: float,
) -> None:
    """The local driver: run the policies of a YAML file against static Triton URLs."""
    from tritonscale.control.operator_metrics import OperatorMetrics
    from tritonscale.drivers import tune as tuning
    from tritonscale.triton.actuator import Actuator

    config = tuning.load_config(config_path)
    stop_on_signals()
    metrics = OperatorMetrics()
    server = None
    if metrics_port:
        try:
            server = metrics.serve(metrics_port)
        except OSError as error:
            raise click.ClickException(
                f"cannot serve metrics on port {metrics_port}: {error.strerror or error}"
            ) from None
    names = ", ".join(f"{p.name} ({p.spec.model})" for p in config.policies)
    click.echo(f"tuning {names} on {len(config.endpoints)} Triton(s), metrics from {config.source}")
    log = decision_log.open("a") if decision_log else None
    try:
        actuator = Actuator(load_deadline_s=load_deadline_s)
        tuner = tuning.Tuner(
            config, actuator=actuator, metrics=metrics, decision_log=log, echo=click.echo
        )
        tuner.run(duration)
    except KeyboardInterrupt:
        click.echo("stopped", err=True)
    finally:
        if log is not None:
            log.close()
        if server is not None:
            server.shutdown()


@main.command()
@click.option(
    "--out",
    type=click.Path(file_okay=False, path_type=Path),
    default=Path("reports/demo"),
    show_default=True,
    help="Folder for the decision log, the load's history and the report.",
)
def demo(out: Path) -> None:
    """The control loop on one machine in about four minutes: Triton, metrics, tune, and an
    open-loop load above what one instance each serves, first with the operator paused."""
    require_extras("server", "load", "reports")
    from tritonscale.local import demo as demonstration

    stop_on_signals()
    try:
        demonstration.run_demo(out, echo=click.echo)
    except demonstration.DemoError as error:
        raise click.ClickException(str(error)) from None
    except KeyboardInterrupt:
        click.echo("stopped", err=True)


if __name__ == "__main__":
    sys.exit(main())
