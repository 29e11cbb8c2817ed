"""What the benchmarks share: a local Triton, instance counts, the load generators,
progress lines, JSON results and plots.

The load generators are tritonscale.local.loadgen's, over `tritonclient.grpc.aio`: `measure`
keeps a fixed number of requests in flight (closed loop) for one measurement, `SteadyClosedLoop`
keeps them in flight for a whole run (the windows of a tuner's benchmark are spans of it: users'
traffic does not pause between two measurements), `measure_stream` does the same over one
gRPC stream (decoupled models), `OpenLoopLoad` sends at a rate;
one process, no gevent, so that at these rates the generator is not the bottleneck
(bench/loadgen_headroom.py measures how far that holds). `measure(..., path=...)` runs the
same closed loop on the path a model's users take: unary gRPC, unary HTTP, or a gRPC stream
per user.
"""

from __future__ import annotations

import argparse
import asyncio
import csv
import json
import os
import platform
import resource
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import tritonclient.grpc
import tritonclient.grpc.aio
import tritonclient.http
import tritonclient.http.aio
import yaml

from tritonscale.core.spec import AutoscalerSpec, InvalidSpec
from tritonscale.local.interrupts import stop_on_signals
from tritonscale.local.loadgen import (
    CLIENT_PATHS,
    Inputs,
    Measurement,
    OpenLoopLoad,
    SteadyClosedLoop,
    measure,
    measure_stream,
)
from tritonscale.local.triton_server import LocalTriton
from tritonscale.triton.actuator import Actuator
from tritonscale.triton.endpoints import Endpoint

REPO_ROOT = Path(__file__).resolve().parents[2]
RESULTS_DIR = REPO_ROOT / "reports" / "bench"
# The InstanceGroupAutoscaler examples, one object per model: where a pipeline's calls are
# written down (`spec.calls`), and so where the benchmarks read them.
SPEC_EXAMPLES = REPO_ROOT / "operator" / "examples"

# The load generators live in tritonscale.local.loadgen (the demo uses them too).
__all__ = [
    "CLIENT_PATHS",
    "Inputs",
    "Measurement",
    "OpenLoopLoad",
    "SteadyClosedLoop",
    "measure",
    "measure_stream",
]


def pipeline_inputs(rows: int = 1) -> Callable[[np.random.Generator], Inputs]:
    return lambda rng: {"FEATURES": rng.standard_normal((rows, 64), dtype=np.float32)}


def pair_inputs(rng: np.random.Generator) -> Inputs:
    return {"INPUT0": rng.random(4, dtype=np.float32), "INPUT1": rng.random(4, dtype=np.float32)}


def stream_count_inputs(count: int = 4) -> Callable[[np.random.Generator], Inputs]:
    return lambda rng: {"IN": np.array([count], dtype=np.int32)}


# ---- a pipeline, from its specs ------------------------------------------------------


def pipeline_models(root: str, examples: Path = SPEC_EXAMPLES) -> tuple[str, ...]:
    """`root` and the models it calls through BLS, in the order its spec lists them: the
    `spec.calls` of the InstanceGroupAutoscaler example for `root` (`examples`/*.yaml), read
    as the operator reads a spec. ValueError, in one sentence, when no example names `root`,
    its spec is invalid, or it calls nothing (a root with no calls is no pipeline)."""
    for path in sorted(examples.glob("*.yaml")):
        document = yaml.safe_load(path.read_text())
        spec = document.get("spec") if isinstance(document, dict) else None
        if not isinstance(spec, dict) or spec.get("model") != root:
            continue
        try:
            calls = AutoscalerSpec.from_dict(spec).calls
        except InvalidSpec as error:
            raise ValueError(f"{path.name}: {error}") from error
        if not calls:
            raise ValueError(f"{path.name}: {root} calls no model (spec.calls is empty)")
        return (root, *calls)
    raise ValueError(
        f"no InstanceGroupAutoscaler under {examples} names model {root!r}: add one whose "
        "spec.calls lists the models it calls"
    )


# ---- the server and its instance counts ---------------------------------------------


@contextmanager
def local_triton(models: list[str] | None = None) -> Iterator[LocalTriton]:
    # A benchmark stopped with kill or Ctrl-C stops its tritonserver and its tune on the way
    # out, instead of leaving them running for the next one.
    stop_on_signals()
    progress(f"starting tritonserver ({', '.join(models) if models else 'all models'}) ...")
    with LocalTriton(http_port=0, grpc_port=0, metrics_port=0, models=models) as triton:
        progress(f"  ready in {triton.startup_s:.1f} s (gRPC {triton.grpc_url})")
        try:
            yield triton
        except Exception as error:
            # A server that died mid-run (a crash in a backend) is the cause, not the step that
            # found it unreachable: one line that says so, and where its log is.
            code = triton.process.poll() if triton.process is not None else None
            if code is None:
                raise
            how = f"signal {-code}" if code < 0 else f"code {code}"
            raise SystemExit(
                f"tritonserver exited ({how}) while the benchmark ran: {triton.last_error()} "
                f"(log: {triton.log_path}); it was found by: {error}"
            ) from None


class Instances:
    """Sets instance counts through the operator's actuator (live config, new instance_group,
    repository load with the key header) and remembers how long each change took."""

    def __init__(self, triton: LocalTriton) -> None:
        self.actuator = Actuator(triton.repository_key)
        self.endpoint = Endpoint("local", triton.http_url)
        self.change_seconds: list[float] = []
        self.original: dict[str, int] = {}

    def set(self, counts: Mapping[str, int]) -> None:
        for model, count in counts.items():
            self.original.setdefault(model, self.get(model))
            result = asyncio.run(self.actuator.apply_one(self.endpoint, model, count))
            if result is None:
                continue
            if not result.ok:
                raise SystemExit(
                    f"bench: setting {model} to {count} instances failed: {result.reason}"
                )
            self.change_seconds.append(result.seconds)

    def get(self, model: str) -> int:
        return asyncio.run(self.actuator.live_count(self.endpoint, model))

    def restore(self) -> None:
        """Every model this object changed back to its count before the first change."""
        for model, count in self.original.items():
            asyncio.run(self.actuator.apply_one(self.endpoint, model, count))


# ---- the local driver under load ---------------------------------------------------


def start_tune(triton: LocalTriton, config: Path, log: Path, output: Path) -> subprocess.Popen:
    """`tritonscale tune` on a policy file, as a user runs it: a process of its own (so that
    the load generator and the driver do not share one interpreter), its output in `output`."""
    env = {**os.environ, "TRITONSCALE_REPOSITORY_KEY": triton.repository_key}
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "tritonscale.cli",
            "tune",
            "--config",
            str(config),
            "--decision-log",
            str(log),
            "--metrics-port",
            "0",
        ],
        stdout=output.open("w"),
        stderr=subprocess.STDOUT,
        env=env,
    )


def wait_for_first_tick(
    tune: subprocess.Popen, log: Path, output: Path, timeout_s: float = 120.0
) -> None:
    """Until `tritonscale tune` has logged its first tick (it logs every one): a run timed
    from its start would otherwise give its first seconds to the interpreter starting, more
    of them on a busy machine. Exits with the tune's last line where it stops or hangs."""
    deadline = time.monotonic() + timeout_s
    while not read_decisions(log)[0].strip():
        exit_if_stopped(tune, output)
        if time.monotonic() > deadline:
            raise SystemExit(
                f"bench: tritonscale tune logged no tick in {timeout_s:.0f} s: {_tail(output)}"
            )
        time.sleep(0.1)


def exit_if_stopped(tune: subprocess.Popen, output: Path) -> None:
    """Exit the benchmark, with the tune's last line, where `tritonscale tune` has stopped."""
    if tune.poll() is not None:
        raise SystemExit(f"bench: tritonscale tune exited ({tune.returncode}): {_tail(output)}")


def _tail(output: Path) -> list[str]:
    return output.read_text().strip().splitlines()[-1:] if output.exists() else []


def stop_tune(tune: subprocess.Popen) -> None:
    """Stop `tritonscale tune` as a user does (SIGTERM); kill it if it has not gone in 30 s."""
    tune.send_signal(signal.SIGTERM)
    try:
        tune.wait(timeout=30)
    except subprocess.TimeoutExpired:
        tune.kill()


def read_decisions(log: Path) -> tuple[str, list[dict[str, Any]]]:
    """The decision log `tritonscale tune` wrote: its text and its records (none if absent)."""
    text = log.read_text() if log.exists() else ""
    return text, [json.loads(line) for line in text.splitlines() if line.strip()]


def steady_load(triton: LocalTriton, model: str, settings: Mapping[str, Any]) -> SteadyClosedLoop:
    """The benchmark's closed loop on `model` (`settings["concurrency"]` requests of
    `settings["rows"]` rows in flight), not yet started: one load for the whole run, so that
    no window drains the queues the next one starts with."""
    return SteadyClosedLoop(
        triton.grpc_url,
        model,
        pipeline_inputs(settings["rows"]),
        concurrency=settings["concurrency"],
    )


def steady_window(load: SteadyClosedLoop, settings: Mapping[str, Any]) -> Measurement:
    """One configuration's window on the running load: `settings["warmup_s"]` for the queues
    to settle at the new counts, then `settings["static_seconds"]` measured."""
    load.window(settings["warmup_s"])
    return load.window(settings["static_seconds"])


def closed_loop_windows(
    load: SteadyClosedLoop,
    instances: Instances,
    settings: dict,
    seconds: float,
    started: float,
    tune: subprocess.Popen | None,
    label: str,
    models: Sequence[str],
) -> list[dict[str, Any]]:
    """Windows of `settings["window_s"]` on the running closed loop `load` for `seconds`, one
    after another with no gap, each with the counts of `models` read after it (`tune`: the
    driver that must stay up meanwhile; None for a static configuration). The load runs on
    between windows and after the last: its queues never drain on the benchmark's account."""

    def driver_up() -> None:
        if tune is not None and tune.poll() is not None:
            raise SystemExit(f"bench: tritonscale tune exited with code {tune.returncode}")

    timeline = []
    window_start = time.monotonic()
    end = window_start + seconds
    while window_start < end:
        m = load.window(settings["window_s"], start=window_start, stop_early=driver_up)
        window_start += settings["window_s"]
        counts = {name: instances.get(name) for name in models}
        timeline.append(
            {
                "t_s": round(window_start - started, 2),
                "phase": label,
                "throughput_rps": round(m.throughput_rps, 2),
                "p95_ms": round(m.p95_ms, 2) if m.p95_ms else None,
                "failures": m.failures,
                "instances": counts,
                "total_instances": sum(counts.values()),
            }
        )
        progress(
            f"  {label} t={timeline[-1]['t_s']:.0f}s: {m.throughput_rps:.1f} rps, "
            f"instances {counts}"
        )
    return timeline


def first_held(
    timeline: Sequence[Mapping[str, Any]],
    phase: str,
    best: Sequence[Mapping[str, int]],
    since: float,
) -> float | None:
    """Seconds from `since` to the end of the first window of `phase` (closed_loop_windows)
    that ran on one of the `best` splits (best_splits; None: never)."""
    held = next((w for w in timeline if w["phase"] == phase and w["instances"] in best), None)
    return round(held["t_s"] - since, 2) if held else None


# Two splits whose rates measured again are within this share of each other serve as much:
# the goals' own tolerance (a tuner is to serve at least 0.98 of the best split), which the
# simulator applies too (loadtests/sim/summary.py: "at 0.98 of the best"). Below it the
# recheck's rounds tell them apart: on this machine one rechecked split's mean over 8 windows
# of 2 s has a standard error of 1 to 3 % (sd of a window 12 to 37 req/s at 440 req/s, 7
# December), so splits closer than 2 % are swapped by the recheck from one run to the next.
AT_BEST_SHARE = 0.98


def best_splits(rechecked: Mapping[str, Any]) -> list[dict[str, int]]:
    """The recheck's contenders (best_static_rechecked) that serve as much as its best: its
    best first, then those within AT_BEST_SHARE of it."""
    bar = AT_BEST_SHARE * rechecked["throughput_rps"]
    tied = [c["instances"] for c in rechecked["contenders"] if c["throughput_rps"] >= bar]
    return [rechecked["instances"], *(c for c in tied if c != rechecked["instances"])]


# Rounds of the tuner measured against its own counts held without it (tuner_against_its_split).
TUNER_ROUNDS = 4


def tuner_against_its_split(
    load: SteadyClosedLoop,
    instances: Instances,
    settings: dict,
    tune: subprocess.Popen,
    models: Sequence[str],
    seconds: float,
) -> dict[str, Any]:
    """What running the tuner costs or gains on the split it holds, measured in turns so that
    the machine's drift falls on both sides: TUNER_ROUNDS rounds of a span with `tune` running
    and a span with it stopped (SIGSTOP: no tick, no scrape, no load; the counts it left stay),
    the order reversed every other round, `seconds` in all on the running load.

    On a shared 2-core machine the throughput of one split swung by 15 % within 90 s with other
    work beside it (314 to 436 req/s over windows of 2 s), more than the 2 % the tuner is judged
    by: a mean over the tuner's last windows set against a bar measured minutes later compares
    the machine's moments, not the tuner. Where the tuner changes its counts in a running span,
    the span shows it (`changed`), and the loss it costs is in its rate."""
    span = seconds / (2 * TUNER_ROUNDS)
    cpu_before, started = _process_cpu_s(tune.pid), time.monotonic()
    running: list[float] = []
    stopped: list[float] = []
    splits: list[dict[str, int]] = []
    try:
        for round_index in range(TUNER_ROUNDS):
            turns = ("running", "stopped") if round_index % 2 == 0 else ("stopped", "running")
            for turn in turns:
                tune.send_signal(signal.SIGCONT if turn == "running" else signal.SIGSTOP)
                windows = closed_loop_windows(
                    load, instances, settings, span, time.monotonic(), None, f"tuner {turn}",
                    models,
                )  # fmt: skip
                (running if turn == "running" else stopped).extend(
                    w["throughput_rps"] for w in windows
                )
                splits += [w["instances"] for w in windows]
    finally:
        tune.send_signal(signal.SIGCONT)
    running_rps, stopped_rps = statistics.mean(running), statistics.mean(stopped)
    cpu_s = _process_cpu_s(tune.pid) - cpu_before
    return {
        # The tuner's CPU over its running spans (half of the time), in cores: on a machine of
        # two cores shared with the server and the load, what it takes from them.
        "tuner_cores": round(cpu_s / ((time.monotonic() - started) / 2), 3),
        "running_rps": round(running_rps, 2),
        "stopped_rps": round(stopped_rps, 2),
        "running_over_stopped": ratio(running_rps, stopped_rps),
        "instances": splits[-1],
        "changed": any(split != splits[0] for split in splits),
        "running_window_rps": running,
        "stopped_window_rps": stopped,
    }


def _process_cpu_s(pid: int) -> float:
    """CPU seconds (user and system) a running process has used, from /proc."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def tuner_vs_best(held: Mapping[str, Any], rechecked: Mapping[str, Any]) -> float | None:
    """The tuner's rate over the rechecked best's (best_static_rechecked), from ratios whose
    two sides were each measured in turns, so that the machine's drift cancels: running over
    stopped on the counts it holds (`held`: tuner_against_its_split), times those counts over
    the best among the recheck's contenders. None where the tuner changed its counts while
    measured, or holds counts the recheck did not measure (not within its contenders: far from
    the best)."""
    mine = next((c for c in rechecked["contenders"] if c["instances"] == held["instances"]), None)
    if held["changed"] or mine is None or held["running_over_stopped"] is None:
        return None
    return ratio(held["running_over_stopped"] * mine["throughput_rps"], rechecked["throughput_rps"])


# The sweep's configurations measured again: those within this share of its best, at most
# RECHECKED of them, in turns over RECHECK_ROUNDS rounds.
CONTENDER_SHARE = 0.9
RECHECKED = 3
RECHECK_ROUNDS = 4


def best_static_rechecked(
    load: SteadyClosedLoop,
    instances: Instances,
    settings: dict,
    sweep: Sequence[tuple[Mapping[str, int], float]],
    models: Sequence[str],
    held: Mapping[str, int] | None = None,
) -> dict[str, Any]:
    """The bar a tuner's steady state is held to: the sweep's leading configurations
    ((counts, req/s) pairs) measured again as the tuner's runs are, and the best of them.
    `held`, the counts the tuner held, is measured with them wherever the sweep did not rank
    it among its leaders: a sweep of short samples on a busy machine can put the best 10 %
    low (7 December: 3/2/1/1 left out of a recheck at load 13, then measured best in the
    tuner's own windows), and the tuner's split against the best is then still measured in
    turns rather than not at all.

    The sweep's best is the highest of many short samples, so it is biased upwards (the
    winner's curse), and two configurations a few per cent apart may swap places from one
    run to the next; its windows also have a warm-up the tuner's do not. So every
    configuration within CONTENDER_SHARE of the best (at most RECHECKED) is measured again,
    right after the tuner's run, in the same windows of the same running load (the counts
    read after each) for `settings["recheck_s"]` in all; `window_rps` shows each one's spread.
    Two contenders a few per cent apart are told apart only if the machine's drift does not
    decide it: they are measured in turns, RECHECK_ROUNDS rounds with the order reversed every
    other round, and the window after each change is left out (the queue settles to the new
    counts, as it does after a tuner's step)."""
    ranked = sorted(sweep, key=lambda row: -row[1])
    contenders = [row for row in ranked if row[1] >= CONTENDER_SHARE * ranked[0][1]][:RECHECKED]
    if held is not None and all(dict(counts) != held for counts, _ in contenders):
        contenders.append(next((row for row in ranked if dict(row[0]) == held), (held, None)))
    rounds = RECHECK_ROUNDS if len(contenders) > 1 else 1
    rates_of: list[list[float]] = [[] for _ in contenders]
    for round_index in range(rounds):
        turns = list(enumerate(contenders))
        for index, (counts, _) in turns if round_index % 2 == 0 else turns[::-1]:
            instances.set(dict(counts))
            if rounds > 1:
                load.window(settings["window_s"])  # settling after the change: left out
            windows = closed_loop_windows(
                load, instances, settings, settings["recheck_s"] / rounds, time.monotonic(),
                None, "static", models,
            )  # fmt: skip
            rates_of[index] += [w["throughput_rps"] for w in windows]
    rechecked = []
    for (counts, swept_rps), rates in zip(contenders, rates_of, strict=True):
        mean = statistics.mean(rates)
        spread = statistics.stdev(rates) if len(rates) > 1 else 0.0
        rechecked.append(
            {
                "instances": dict(counts),
                "sweep_rps": swept_rps,
                "throughput_rps": round(mean, 2),
                "stdev_rps": round(spread, 2),
                "window_rps": rates,
            }
        )
        swept = "not in the sweep" if swept_rps is None else f"sweep {swept_rps:.1f}"
        progress(f"  again: {dict(counts)}: {mean:.1f} rps ({swept})")
    best = max(rechecked, key=lambda row: row["throughput_rps"])
    return {**best, "contenders": rechecked}


# ---- Locust as a user runs it ------------------------------------------------------------


def locust_run(
    triton: LocalTriton,
    workload: str,
    users: int,
    seconds: float,
    *,
    protocol: str = "grpc",
    extra_args: Sequence[str] = (),
) -> dict[str, Any]:
    """Locust headless (`loadtests/bls.py`, one process) on `workload` for `seconds`: its
    Aggregated row and the CPU the process used. Users all start within a tenth of a second."""
    with tempfile.TemporaryDirectory(prefix="bench-locust-") as folder:
        prefix = Path(folder) / "run"
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        started = time.monotonic()
        completed = subprocess.run(
            [
                sys.executable,
                "-m",
                "locust",
                "-f",
                "loadtests/bls.py",
                "--headless",
                "--only-summary",
                "-u",
                str(users),
                "-r",
                str(max(users, 1) * 10),
                "-t",
                f"{seconds:g}s",
                "--host",
                f"http://{triton.http_url}",
                "--grpc-host",
                triton.grpc_url,
                "--workload",
                workload,
                "--protocol",
                protocol,
                "--csv",
                str(prefix),
                *extra_args,
            ],
            cwd=REPO_ROOT,
            capture_output=True,
            text=True,
            timeout=seconds + 60,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
        wall = time.monotonic() - started
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        if completed.returncode not in (0, 1):
            tail = (completed.stderr.strip().splitlines() or ["no output"])[-1]
            raise SystemExit(f"bench: locust failed (exit {completed.returncode}): {tail}")
        with open(f"{prefix}_stats.csv", newline="") as handle:
            row = next(r for r in csv.DictReader(handle) if r["Name"] == "Aggregated")
    requests = int(row["Request Count"])
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return {
        "throughput_rps": round(float(row["Requests/s"]), 3),
        "requests": requests,
        "failures": int(row["Failure Count"]),
        "p50_ms": float(row["50%"]),
        "p95_ms": float(row["95%"]),
        "p99_ms": float(row["99%"]),
        # Whole process, start-up included: an upper bound per request.
        "client_cpu_ms_per_request": round(1000 * cpu / requests, 3) if requests else None,
        "wall_s": round(wall, 2),
    }


# ---- command line, progress, results ----------------------------------------------------


def parser(description: str) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=description)
    p.add_argument(
        "--quick",
        action="store_true",
        help="A tiny run that proves the benchmark works (CI); its numbers mean little",
    )
    p.add_argument("--out", type=Path, help="Result JSON (default: reports/bench/NAME.json)")
    p.add_argument("--no-plot", action="store_true", help="Skip the PNG")
    return p


def budget_arguments(
    description: str,
    budget_help: str,
    models: Sequence[str] | None,
    quick: Mapping[str, Any],
    full: Mapping[str, Any],
    argv: list[str] | None = None,
    *,
    default_root: str | None = None,
) -> tuple[argparse.Namespace, dict[str, Any]]:
    """The command line of a benchmark whose `models` share an instance budget: `parser`'s
    options and `--budget`. Returns the arguments and the run's settings: `quick`'s with
    --quick, else `full`'s, with the budget given (at least one instance per model).

    With `default_root` (and `models` None) the pipeline is chosen on the command line:
    `--root MODEL` (default `default_root`), the models being it and those its spec calls
    (pipeline_models); the settings carry it as `root`."""
    p = parser(description)
    p.add_argument("--budget", type=int, help=budget_help)
    if default_root is not None:
        p.add_argument(
            "--root",
            default=default_root,
            metavar="MODEL",
            help=f"the pipeline's root (default {default_root}): it takes FEATURES rows as "
            "pipeline_async does, and the models it calls come from its spec's calls "
            f"({SPEC_EXAMPLES.relative_to(REPO_ROOT)}/*.yaml)",
        )
    p.add_argument(
        "--costs",
        type=parse_costs,
        default={},
        metavar="MODEL=MS,...",
        help=f"the branches' emulated execution time ({COST_PARAMETER} in their config.pbtxt), "
        "e.g. branch_embed=5,branch_rank=20: the bottleneck moves with them",
    )
    args = p.parse_args(argv)
    settings = dict(quick if args.quick else full)
    settings["costs"] = args.costs
    if default_root is not None:
        try:
            models = pipeline_models(args.root)
        except ValueError as error:
            p.error(f"--root {args.root}: {error}")
        settings["root"] = args.root
    assert models is not None, "budget_arguments needs models or a default root"
    if args.budget is not None:
        settings["budget"] = args.budget
    if settings["budget"] < len(models):
        p.error(
            f"--budget must be at least {len(models)} (one instance per model of "
            f"{', '.join(models)}), got {settings['budget']}"
        )
    return args, settings


# ---- the branches' emulated costs ---------------------------------------------------

# The parameter of models/branch_*/config.pbtxt that sets how long a branch holds a batch.
COST_PARAMETER = "emulated_compute_ms"


def parse_costs(text: str) -> dict[str, float]:
    """`branch_embed=5,branch_rank=20` -> {"branch_embed": 5.0, "branch_rank": 20.0}."""
    costs: dict[str, float] = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        model, sep, value = item.partition("=")
        try:
            ms = float(value)
        except ValueError:
            ms = -1.0
        if not sep or not model or ms < 0:
            raise argparse.ArgumentTypeError(f"{item!r} is not MODEL=MS (milliseconds, at least 0)")
        costs[model.strip()] = ms
    return costs


@contextmanager
def emulated_costs(triton: LocalTriton, costs: Mapping[str, float]) -> Iterator[None]:
    """Each model of `costs` reloaded with its emulated execution time set (its live config,
    `COST_PARAMETER` changed), and back to its own once done. Later loads of other instance
    counts keep it: the actuator changes only the instance group of the live config."""
    from tritonscale.triton.client import TritonClient

    endpoint = Endpoint("local", triton.http_url)
    originals: dict[str, dict[str, Any]] = {}
    with TritonClient(endpoint, triton.repository_key) as client:
        try:
            for model, ms in costs.items():
                config = client.model_config(model)
                if COST_PARAMETER not in config.get("parameters", {}):
                    raise SystemExit(f"bench: {model} has no {COST_PARAMETER} parameter to set")
                originals[model] = config
                changed = json.loads(json.dumps(config))
                changed["parameters"][COST_PARAMETER] = {"string_value": f"{ms:g}"}
                progress(f"{model}: {COST_PARAMETER} {ms:g}")
                client.load(model, changed)
            yield
        finally:
            for model, config in originals.items():
                live = client.model_config(model)
                live["parameters"][COST_PARAMETER] = config["parameters"][COST_PARAMETER]
                client.load(model, live)


def progress(line: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {line}", flush=True)


def machine() -> dict[str, Any]:
    return {
        "cpus": os.cpu_count(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "load_average_at_start": [round(x, 2) for x in os.getloadavg()],
    }


def write_result(name: str, result: dict[str, Any], out: Path | None) -> Path:
    path = out or RESULTS_DIR / f"{name}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    document = {
        "benchmark": name,
        "command": " ".join(["python -m", f"loadtests.bench.{name}", *sys.argv[1:]]),
        "finished": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "machine": machine(),
        **result,
    }
    path.write_text(json.dumps(document, indent=2) + "\n")
    progress(f"wrote {path}")
    return path


def plot_path(json_path: Path) -> Path:
    return json_path.with_suffix(".png")


def write_outputs(
    name: str,
    result: dict[str, Any],
    args: argparse.Namespace,
    plot: Callable[[dict[str, Any], Path], None],
    decision_log: str | None = None,
) -> Path:
    """`write_result` to --out, the driver's decision log beside the JSON (NAME.decisions.jsonl,
    for `tritonscale report --decisions`) when there is one, and the plot unless --no-plot."""
    path = write_result(name, result, args.out)
    if decision_log is not None:
        path.with_suffix(".decisions.jsonl").write_text(decision_log)
    if not args.no_plot:
        plot(result, plot_path(path))
    return path


def ratio(a: float | None, b: float | None) -> float | None:
    return round(a / b, 3) if a is not None and b else None


def set_parameters(triton: LocalTriton, model: str, parameters: Mapping[str, str]) -> None:
    """Reload `model` with these config.pbtxt parameters changed (the rest of its live config
    kept), through the repository API with the key header."""
    client = tritonclient.http.InferenceServerClient(triton.http_url)
    try:
        config = client.get_model_config(model)
        for key, value in parameters.items():
            config.setdefault("parameters", {})[key] = {"string_value": str(value)}
        client.load_model(model, headers=triton.repository_headers, config=json.dumps(config))
    finally:
        client.close()


class ServerCpu:
    """CPU seconds spent by the server and its Python stubs (its process group), from /proc:
    on a shared machine, CPU per request is steadier than requests per second."""

    def __init__(self, triton: LocalTriton) -> None:
        assert triton.process is not None, "the server is not running"
        self.group = triton.process.pid
        self.ticks_per_s = os.sysconf("SC_CLK_TCK")

    def per_process(self) -> dict[int, float]:
        """CPU seconds so far of each process of the group, by PID."""
        seconds = {}
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:  # the process ended meanwhile
                continue
            # After the name: state, ppid, pgrp, ..., utime (12th), stime (13th).
            if int(fields[2]) == self.group:
                seconds[int(entry.name)] = (int(fields[11]) + int(fields[12])) / self.ticks_per_s
        return seconds

    @staticmethod
    def spent(before: dict[int, float], after: dict[int, float]) -> float:
        """CPU seconds spent between two readings. A process that ended in between (a stub
        replaced by a reload) drops out of `after`, so only the processes alive at the end
        count: subtracting its whole past would make the total negative."""
        return sum(seconds - before.get(pid, 0.0) for pid, seconds in after.items())
