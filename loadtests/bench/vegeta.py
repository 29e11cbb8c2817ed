"""An outside load generator checks the project's own: vegeta against OpenLoopLoad and Locust.

    python -m loadtests.bench.vegeta            # full, about 12 minutes
    python -m loadtests.bench.vegeta --quick    # under a minute (CI)

vegeta (github.com/tsenart/vegeta, built by hack/vegeta/build.py) is an open-loop HTTP load
generator written by others: if it sees what the project's generators see at the same rates,
the project's numbers do not come from its own tools. One tritonserver serves add_sub,
pipeline_async, pipeline_sync and the pipelines' branches. For each model the capacity is
measured first (the project's closed loop, `capacity_in_flight` requests in flight over
gRPC), then at each rate (fractions of it: some below, one above) five runs, one after the
other for `seconds` each, in an order reversed at every other rate so that a drift of the
shared machine does not always favour the same one. Each run differs from the one before it
in this list in one thing:

- `vegeta`: `vegeta attack -rate=R -duration=D` on `POST /v2/models/{m}/infer` with a JSON
  body (the KServe v2 protocol, inputs as JSON lists; eight different bodies in vegeta's JSON
  target format, base64), `vegeta report -type=json`. Open loop at a constant pace; it waits
  for the answers still out after D, and its throughput is the successful requests over the
  attack and that wait. Latency from when a request was sent. At most `max_in_flight`
  requests out and HTTP_CONNECTIONS connections, as OpenLoopLoad over HTTP.
- `loadgen_http`: the project's OpenLoopLoad over HTTP (tritonclient.http.aio, with the
  binary tensor extension), paced as vegeta paces: the like-for-like comparison, only the
  client differs. Its latency counts from when a request was due; after D it sends nothing
  more and waits for the answers still out, and its served rate is counted over D and that
  wait, as vegeta's.
- `loadgen_grpc`: the same over gRPC (tritonclient.grpc.aio): the protocol's effect.
- `loadgen_grpc_poisson`: OpenLoopLoad as the demo and the benchmarks run it, gRPC with
  random (Poisson) arrivals: the arrival process's effect (bursts queue more than a pace).
- `locust_http`: Locust as a user runs it (`locust -f loadtests/bls.py --headless --protocol
  http`), made to offer the rate with `--user-rate`: U users (one per `locust_user_period_s`
  of the rate, at least 2), each paced to R/U requests/s from a random phase (Locust starts
  the users together; paced from their start they would send in bursts of U). Statistics
  are reset once every user has started (`--reset-stats`). Still a closed loop: a user whose
  answer comes later than its period sends the next at once but never catches up, so above
  the capacity Locust offers U / latency, not R, and its latency stays near U / capacity
  where an open loop's grows with the backlog. It also checks every answer.

Per model and rate the JSON holds each generator's offered and served rate, success ratio,
p50/p95/p99, client CPU per request and the server's CPU per request, their ratios to
vegeta's, and a flag for each ratio more than 10 % from 1. Result:
reports/bench/vegeta.json (+ .png).
"""

from __future__ import annotations

import base64
import json
import math
import resource
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from hack.vegeta import build as vegeta_build
from loadtests.bench import common
from tritonscale.local.loadgen import HTTP_CONNECTIONS, input_arrays
from tritonscale.local.triton_server import LocalTriton

MODELS = ("add_sub", "pipeline_async", "pipeline_sync")
BRANCHES = ("branch_embed", "branch_classify", "branch_rank")
# name -> (protocol, arrivals) of the project's OpenLoopLoad runs.
LOADGEN_RUNS = {
    "loadgen_http": ("http", "paced"),
    "loadgen_grpc": ("grpc", "paced"),
    "loadgen_grpc_poisson": ("grpc", "poisson"),
}
GENERATORS = ("vegeta", *LOADGEN_RUNS, "locust_http")
TOLERANCE = 0.10  # a ratio to vegeta's further than this from 1 is flagged
PAYLOADS = 8  # distinct request bodies per model, as OpenLoopLoad keeps

QUICK: dict[str, Any] = {
    "models": ["add_sub"],
    "fractions": [0.1],
    "seconds": 2,
    "capacity_in_flight": 8,
    "capacity_seconds": 1.0,
    "max_in_flight": 2000,
    "timeout_s": 30,
    "locust_user_period_s": 0.25,
    "pause_s": 0.5,
}
FULL: dict[str, Any] = {
    "models": list(MODELS),
    # 1.2 x the capacity measured at 32 in flight was not above it (the pipelines served all
    # of it), hence 64 in flight and 1.5.
    "fractions": [0.3, 0.7, 1.5],
    "seconds": 10,
    "capacity_in_flight": 64,
    "capacity_seconds": 5.0,
    # Above the capacity the backlog grows by at most (1.5 - 1) x capacity x 10 s: 5 x
    # capacity, under this bound for every model here, so neither open loop drops or holds
    # back a request (OpenLoopLoad drops beyond it, vegeta would wait for a free worker).
    "max_in_flight": 10000,
    "timeout_s": 30,
    "locust_user_period_s": 0.25,
    "pause_s": 1.0,
}


# ---- vegeta ---------------------------------------------------------------------------------


def request_body(arrays: dict[str, np.ndarray]) -> bytes:
    """A KServe v2 inference request with the inputs as JSON lists (no binary extension)."""
    inputs = [
        {
            "name": name,
            "shape": list(array.shape),
            "datatype": "FP32",
            "data": array.flatten().tolist(),
        }
        for name, array in arrays.items()
    ]
    return json.dumps({"inputs": inputs}).encode()


def vegeta_targets(url: str, model: str, seed: int = 0) -> str:
    """vegeta's JSON target format, one target a line: PAYLOADS different bodies of `model`'s
    inputs (one row for the pipelines), which vegeta sends round-robin."""
    rng = np.random.default_rng(seed)
    lines = []
    for _ in range(PAYLOADS):
        body = request_body(input_arrays(model, 1, rng))
        target = {
            "method": "POST",
            "url": f"http://{url}/v2/models/{model}/infer",
            "body": base64.b64encode(body).decode(),
            "header": {"Content-Type": ["application/json"]},
        }
        lines.append(json.dumps(target))
    return "\n".join(lines) + "\n"


def vegeta_run(
    vegeta: Path, triton: LocalTriton, model: str, rate: int, settings: dict[str, Any]
) -> dict[str, Any]:
    """`vegeta attack` at `rate` for `seconds`, read back with `vegeta report -type=json`."""
    seconds, timeout_s = settings["seconds"], settings["timeout_s"]
    with tempfile.TemporaryDirectory(prefix="bench-vegeta-") as folder:
        targets = Path(folder) / "targets.json"
        targets.write_text(vegeta_targets(triton.http_url, model))
        results = Path(folder) / "results.bin"
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        started = time.monotonic()
        attack = subprocess.run(
            [
                str(vegeta),
                "attack",
                "-format=json",
                f"-targets={targets}",
                f"-rate={rate}/1s",
                f"-duration={seconds}s",
                f"-timeout={timeout_s}s",
                # The same bounds as OpenLoopLoad's: requests out at once, and connections (a
                # request beyond them waits for one; its latency counts the wait). Unbounded,
                # vegeta opened one per request waiting above the capacity: thousands, and
                # the server served add_sub at 650 req/s with 412 timeouts where gRPC
                # clients got 1,169.
                f"-max-workers={settings['max_in_flight']}",
                f"-max-connections={HTTP_CONNECTIONS}",
                f"-output={results}",
            ],
            capture_output=True,
            text=True,
            timeout=seconds + timeout_s + 60,
        )
        wall = time.monotonic() - started
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        if attack.returncode != 0:
            raise SystemExit(f"bench: vegeta attack failed: {_last_line(attack.stderr)}")
        report = subprocess.run(
            [str(vegeta), "report", "-type=json", str(results)],
            capture_output=True,
            text=True,
            timeout=60,
        )
        if report.returncode != 0:
            raise SystemExit(f"bench: vegeta report failed: {_last_line(report.stderr)}")
    metrics = json.loads(report.stdout)
    latencies = metrics["latencies"]  # nanoseconds, over every request (failed ones too)
    requests = int(metrics["requests"])
    succeeded = round(metrics["success"] * requests)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return {
        "protocol": "http (JSON)",
        "loop": "open, paced",
        "requests": requests,
        "failures": requests - succeeded,
        "offered_rps": round(metrics["rate"], 2),
        "served_rps": round(metrics["throughput"], 2),
        "success_ratio": round(metrics["success"], 4),
        "p50_ms": round(latencies["50th"] / 1e6, 3),
        "p95_ms": round(latencies["95th"] / 1e6, 3),
        "p99_ms": round(latencies["99th"] / 1e6, 3),
        "client_cpu_ms_per_request": _per_request(cpu, requests),
        "wall_s": round(wall, 2),
        "status_codes": metrics.get("status_codes", {}),
        "errors": (metrics.get("errors") or [])[:3],
    }


def _last_line(text: str) -> str:
    lines = [line for line in text.strip().splitlines() if line.strip()]
    return lines[-1] if lines else "no output"


def _per_request(seconds: float, requests: int) -> float | None:
    return round(1000 * seconds / requests, 3) if requests else None


# ---- the project's generators -------------------------------------------------------------


def loadgen_run(
    triton: LocalTriton,
    model: str,
    rate: int,
    protocol: str,
    arrivals: str,
    settings: dict[str, Any],
) -> dict[str, Any]:
    """OpenLoopLoad at `rate` for `seconds`, then its answers still out; counted as vegeta
    counts: the requests sent, and those served over the run and that wait."""
    url = triton.http_url if protocol == "http" else triton.grpc_url
    load = common.OpenLoopLoad(
        url,
        model,
        rows=1,
        protocol=protocol,
        arrivals=arrivals,
        max_in_flight=settings["max_in_flight"],
        timeout_s=settings["timeout_s"],
    )
    cpu_before = time.process_time()
    with load:
        start = time.time()
        load.set_rate(rate)
        time.sleep(settings["seconds"])
        end = time.time()
        load.drain(timeout_s=settings["timeout_s"] + 5)
        stats = load.stats(start, time.time())
        # vegeta's span: to the last answer, not to when drain() noticed it.
        span_s = max(end, load.last_answer_at or end) - start
    # This process runs nothing else meanwhile: its CPU is the generator's.
    cpu = time.process_time() - cpu_before
    sent = stats.offered - stats.dropped
    return {
        "protocol": f"{protocol} (tritonclient.{protocol}.aio)",
        "loop": f"open, {arrivals}",
        "requests": sent,
        "failures": stats.failed,
        "dropped": stats.dropped,
        "offered_rps": round(sent / (end - start), 2),
        "served_rps": round(stats.served / span_s, 2),
        "success_ratio": round(stats.served / sent, 4) if sent else None,
        "p50_ms": _round(stats.p50_ms),
        "p95_ms": _round(stats.p95_ms),
        "p99_ms": _round(stats.p99_ms),
        "client_cpu_ms_per_request": _per_request(cpu, sent),
        "wall_s": round(time.time() - start, 2),
        "last_error": load.last_error,
    }


def locust_users(rate: int, settings: dict[str, Any]) -> int:
    """Enough users that each is paced at one request per `locust_user_period_s` or slower:
    while answers come within that period, U users x R/U each offer R."""
    return max(2, math.ceil(rate * settings["locust_user_period_s"]))


def locust_http_run(
    triton: LocalTriton, model: str, rate: int, settings: dict[str, Any]
) -> dict[str, Any]:
    users = locust_users(rate, settings)
    row = common.locust_run(
        triton,
        model,  # loadtests/bls.py names each workload after its model
        users,
        # A second more, for Locust's start: the statistics restart once every user is up.
        settings["seconds"] + 1,
        protocol="http",
        extra_args=["--user-rate", f"{rate / users:.6f}", "--payload", "1", "--reset-stats"],
    )
    requests, failures = row["requests"], row["failures"]
    return {
        "protocol": "http (tritonclient.http, gevent)",
        "loop": f"closed, {users} users paced at {rate / users:.2f}/s each",
        "users": users,
        "requests": requests,
        "failures": failures,
        # Locust's rate counts failed requests too.
        "offered_rps": row["throughput_rps"],
        "served_rps": round(row["throughput_rps"] * (requests - failures) / requests, 2)
        if requests
        else 0.0,
        "success_ratio": round((requests - failures) / requests, 4) if requests else None,
        "p50_ms": row["p50_ms"],
        "p95_ms": row["p95_ms"],
        "p99_ms": row["p99_ms"],
        "client_cpu_ms_per_request": row["client_cpu_ms_per_request"],
        "wall_s": row["wall_s"],
    }


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 3)


# ---- the comparison -----------------------------------------------------------------------


def compare(runs: dict[str, dict[str, Any]]) -> tuple[dict[str, dict[str, Any]], list[str]]:
    """Each generator's served rate and percentiles over vegeta's, and a flag for each ratio
    further than TOLERANCE from 1."""
    reference = runs["vegeta"]
    ratios: dict[str, dict[str, Any]] = {}
    flags = []
    for generator, run in runs.items():
        if generator == "vegeta":
            continue
        ratios[generator] = {
            key: common.ratio(run[f"{key}_ms"] if key != "served" else run["served_rps"], base)
            for key, base in (
                ("served", reference["served_rps"]),
                ("p50", reference["p50_ms"]),
                ("p95", reference["p95_ms"]),
                ("p99", reference["p99_ms"]),
            )
        }
        for key, value in ratios[generator].items():
            if value is not None and abs(value - 1) > TOLERANCE:
                flags.append(f"{generator} {key} x{value:.2f}")
    return ratios, flags


def measure_point(
    vegeta: Path,
    triton: LocalTriton,
    model: str,
    rate: int,
    order: tuple[str, ...],
    settings: dict[str, Any],
) -> dict[str, Any]:
    server = common.ServerCpu(triton)
    runs: dict[str, dict[str, Any]] = {}
    for generator in order:
        before = server.per_process()
        if generator == "vegeta":
            run = vegeta_run(vegeta, triton, model, rate, settings)
        elif generator == "locust_http":
            run = locust_http_run(triton, model, rate, settings)
        else:
            protocol, arrivals = LOADGEN_RUNS[generator]
            run = loadgen_run(triton, model, rate, protocol, arrivals, settings)
        run["server_cpu_ms_per_request"] = _per_request(
            server.spent(before, server.per_process()), run["requests"] - run["failures"]
        )
        runs[generator] = run
        common.progress(
            f"    {generator}: offered {run['offered_rps']:.0f}, served {run['served_rps']:.0f} "
            f"req/s, p50/p95/p99 {run['p50_ms'] or 0:.1f}/{run['p95_ms'] or 0:.1f}/"
            f"{run['p99_ms'] or 0:.1f} ms, {run['failures']} failed"
        )
        # Whatever a generator left queued in the server is not the next one's.
        time.sleep(settings["pause_s"])
    ordered = {generator: runs[generator] for generator in GENERATORS}
    ratios, flags = compare(ordered)
    return {
        "rate_rps": rate,
        "order": list(order),
        "generators": ordered,
        "ratios": ratios,
        "flags": flags,
    }


def run(triton: LocalTriton, settings: dict[str, Any], vegeta: Path) -> dict[str, Any]:
    instances = common.Instances(triton)
    by_model = []
    point_index = 0
    for model in settings["models"]:
        capacity = common.measure(
            triton.grpc_url,
            model,
            concurrency=settings["capacity_in_flight"],
            seconds=settings["capacity_seconds"],
            warmup_s=0.5,
        )
        if capacity.requests == 0:
            raise SystemExit(f"bench: {model} served nothing: {capacity.first_error}")
        common.progress(
            f"  {model}: capacity {capacity.throughput_rps:.0f} req/s "
            f"({settings['capacity_in_flight']} in flight over gRPC)"
        )
        points = []
        for fraction in settings["fractions"]:
            rate = max(1, round(fraction * capacity.throughput_rps))
            order = GENERATORS if point_index % 2 == 0 else tuple(reversed(GENERATORS))
            point_index += 1
            common.progress(f"  {model} at {rate} req/s ({fraction:g} x capacity):")
            point = measure_point(vegeta, triton, model, rate, order, settings)
            point["fraction_of_capacity"] = fraction
            points.append(point)
        by_model.append(
            {
                "model": model,
                "instances": instances.get(model),
                "capacity_rps": round(capacity.throughput_rps, 2),
                "capacity": capacity.to_dict(),
                "points": points,
            }
        )
    flags = [
        f"{m['model']} at {p['rate_rps']}: {flag}"
        for m in by_model
        for p in m["points"]
        for flag in p["flags"]
    ]
    return {
        "settings": settings,
        "vegeta_version": vegeta_build.VERSION,
        "generators": list(GENERATORS),
        "tolerance": TOLERANCE,
        "by_model": by_model,
        "flags": flags,
    }


def plot(result: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    models = result["by_model"]
    figure, axes = plt.subplots(2, len(models), figsize=(4.5 * len(models), 7), squeeze=False)
    for column, model in enumerate(models):
        rates = [p["rate_rps"] for p in model["points"]]
        served, latency = axes[0][column], axes[1][column]
        for generator in result["generators"]:
            runs = [p["generators"][generator] for p in model["points"]]
            served.plot(rates, [r["served_rps"] for r in runs], "o-", label=generator)
            latency.plot(rates, [r["p95_ms"] for r in runs], "o-", label=generator)
        served.plot(rates, rates, ":", color="grey", label="offered")
        served.axvline(model["capacity_rps"], color="grey", alpha=0.4)
        served.set_title(f"{model['model']} (capacity {model['capacity_rps']:.0f} req/s)")
        served.set_ylabel("served req/s")
        latency.set_ylabel("p95 ms")
        latency.set_yscale("log")
        latency.set_xlabel("offered req/s")
        for axis in (served, latency):
            axis.grid(alpha=0.3)
    axes[0][0].legend(fontsize=8)
    figure.suptitle("vegeta against the project's generators, same rates, one server")
    figure.tight_layout()
    figure.savefig(path, dpi=90)
    plt.close(figure)


def main(argv: list[str] | None = None) -> None:
    args = common.parser(__doc__.splitlines()[0]).parse_args(argv)
    settings = QUICK if args.quick else FULL
    try:
        vegeta = vegeta_build.build(progress=common.progress)
    except vegeta_build.VegetaBuildError as error:
        raise SystemExit(f"bench: {error}") from None
    with common.local_triton([*MODELS, *BRANCHES]) as triton:
        result = run(triton, settings, vegeta)
    common.write_outputs("vegeta", result, args, plot)


if __name__ == "__main__":
    main()
