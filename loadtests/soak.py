"""Soak: steady load on pipeline_async for a long time, with the control loop on.

    python loadtests/soak.py                      # 10 minutes, reports/soak/soak.{json,png}
    python loadtests/soak.py --quick              # 20 s: proves it works (CI runs this)
    python loadtests/soak.py --duration 3600 --users 12 --out reports/soak-1h

It starts its own Triton (LocalTriton, free ports, the pipeline and its branches), sends
pipeline_async requests from `--users` closed-loop gRPC users, and checks every answer
bit for bit against pipeline_sync's (the twins are bit-identical per row, whatever the
batching). Meanwhile the local driver runs as a user runs it, `tritonscale tune` with a
policy file for pipeline_async and each branch (ticks every `--interval` seconds: a healing
check, the direct-scrape source, the real actuator; a decision log). Every `--sample-every` seconds it samples, for this
server only (its process group):

- `/dev/shm`: the Python backend's regions (each stub's region is its second argument; the
  server names them with its own prefix) its live stubs use (bytes allocated), and regions of earlier stubs still on disk (leaks);
- the RSS of every stub process and of tritonserver, from /proc.

It writes JSON (every sample, every tick's line, the summary) and a PNG plot, prints the
summary, and exits non-zero on any failed request or wrong answer.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import tritonclient.grpc as grpcclient
import yaml

from tritonscale import REPOSITORY_KEY_ENV
from tritonscale.local.triton_server import LocalTriton
from tritonscale.triton.actuator import Actuator
from tritonscale.triton.endpoints import Endpoint

MODEL = "pipeline_async"
BRANCHES = ["branch_embed", "branch_classify", "branch_rank"]
SERVED = [MODEL, "pipeline_sync", *BRANCHES]
OUTPUTS = ["EMBEDDING", "LABEL_PROBS", "SCORE"]


def policies(interval_s: float) -> list[dict[str, Any]]:
    """The autoscalers of the soak: the pipeline and each branch, 1..4 instances."""
    common = {
        "selector": {"matchLabels": {"app.kubernetes.io/component": "triton"}},
        "minInstances": 1,
        "maxInstances": 4,
        "intervalSeconds": max(1, round(interval_s)),
        "metricsWindowSeconds": max(5, round(3 * interval_s)),
        "behavior": {"scaleDown": {"stabilizationWindowSeconds": 60}},
    }
    pipeline = {**common, "model": MODEL, "calls": BRANCHES}
    return [pipeline, *({**common, "model": branch} for branch in BRANCHES)]


# ---- what the server's processes use --------------------------------------------------------


def _group_processes(group: int) -> list[tuple[int, list[str]]]:
    """(pid, argv) of the live processes of a process group."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        pid = int(entry)
        try:
            if os.getpgid(pid) != group:
                continue
            with open(f"/proc/{pid}/cmdline", "rb") as cmdline:
                argv = [a.decode(errors="replace") for a in cmdline.read().split(b"\0") if a]
        except (OSError, ProcessLookupError):
            continue
        if argv:
            found.append((pid, argv))
    return found


def _rss_bytes(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/status") as status:
            for line in status:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def _allocated_bytes(path: Path) -> int:
    try:
        return path.stat().st_blocks * 512  # what tmpfs really holds, not the file's size
    except OSError:
        return 0


@dataclass
class Sampler:
    """Samples shm and memory of one server's processes."""

    group: int
    seen_regions: set[str] = field(default_factory=set)

    def sample(self, t: float) -> dict[str, Any]:
        stubs: dict[str, int] = {}
        live_regions = set()
        server_rss = 0
        for pid, argv in _group_processes(self.group):
            if argv[0].endswith("triton_python_backend_stub"):
                model = argv[1].split("/")[-3] if len(argv) > 1 else "?"
                stubs[f"{model}:{pid}"] = _rss_bytes(pid)
                # python_backend starts a stub as `stub MODEL_PATH SHM_REGION ...`.
                if len(argv) > 2:
                    live_regions.add(argv[2].lstrip("/"))
            elif argv[0].endswith("tritonserver"):
                server_rss = _rss_bytes(pid)
        self.seen_regions |= live_regions
        shm = Path("/dev/shm")
        leaked = [r for r in self.seen_regions - live_regions if (shm / r).exists()]
        return {
            "t": round(t, 2),
            "stubs": len(stubs),
            "stub_rss_bytes": sum(stubs.values()),
            "max_stub_rss_bytes": max(stubs.values(), default=0),
            "server_rss_bytes": server_rss,
            "shm_regions": len(live_regions),
            "shm_bytes": sum(_allocated_bytes(shm / r) for r in live_regions),
            "shm_leaked_regions": len(leaked),
            "shm_leaked_bytes": sum(_allocated_bytes(shm / r) for r in leaked),
        }


# ---- the load ------------------------------------------------------------------------------


@dataclass
class Tally:
    ok: int = 0
    failed: int = 0
    wrong: int = 0
    latencies_s: list[float] = field(default_factory=list)
    errors: dict[str, int] = field(default_factory=dict)
    per_second: dict[int, int] = field(default_factory=dict)  # second of the run -> successes
    failed_at_s: list[float] = field(default_factory=list)  # when each failure was sent


class Users:
    """Closed-loop gRPC users; every answer is compared bit for bit with the reference."""

    def __init__(
        self,
        grpc_url: str,
        inputs: list[np.ndarray],
        reference: list[dict[str, np.ndarray]],
        users: int,
    ) -> None:
        self.grpc_url = grpc_url
        self.inputs = inputs
        self.reference = reference
        self.users = users
        self.tally = Tally()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self.started = time.monotonic()

    def _user(self, index: int) -> None:
        client = grpcclient.InferenceServerClient(self.grpc_url)
        requested = [grpcclient.InferRequestedOutput(name) for name in OUTPUTS]
        turn = index
        try:
            while not self._stop.is_set():
                case = turn % len(self.inputs)
                turn += 1
                features = grpcclient.InferInput("FEATURES", list(self.inputs[case].shape), "FP32")
                features.set_data_from_numpy(self.inputs[case])
                sent = time.monotonic()
                outcome, why = "ok", ""
                try:
                    result = client.infer(MODEL, [features], outputs=requested, client_timeout=30)
                    expected = self.reference[case]
                    if not all(np.array_equal(result.as_numpy(n), expected[n]) for n in OUTPUTS):
                        outcome, why = "wrong", "outputs differ from pipeline_sync's"
                except Exception as error:  # every failure is counted
                    outcome, why = "failed", " ".join(str(error).split())[:160]
                done = time.monotonic()
                with self._lock:
                    tally = self.tally
                    if outcome == "ok":
                        tally.ok += 1
                        tally.latencies_s.append(done - sent)
                        second = int(done - self.started)
                        tally.per_second[second] = tally.per_second.get(second, 0) + 1
                    else:
                        tally.failed_at_s.append(round(sent - self.started, 2))
                        tally.failed += outcome == "failed"
                        tally.wrong += outcome == "wrong"
                        tally.errors[why] = tally.errors.get(why, 0) + 1
                if outcome != "ok":
                    time.sleep(0.05)
        finally:
            client.close()

    def start(self) -> None:
        self.started = time.monotonic()
        for index in range(self.users):
            thread = threading.Thread(target=self._user, args=(index,), daemon=True)
            thread.start()
            self._threads.append(thread)

    def stop(self) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout=40)


def reference_answers(
    grpc_url: str, rng: np.random.Generator, cases: int
) -> tuple[list[np.ndarray], list[dict[str, np.ndarray]]]:
    """Inputs of 1-4 rows and pipeline_sync's answers to them."""
    client = grpcclient.InferenceServerClient(grpc_url)
    inputs, answers = [], []
    try:
        for _ in range(cases):
            rows = int(rng.integers(1, 5))
            features = rng.standard_normal((rows, 64)).astype(np.float32)
            tensor = grpcclient.InferInput("FEATURES", [rows, 64], "FP32")
            tensor.set_data_from_numpy(features)
            result = client.infer("pipeline_sync", [tensor])
            inputs.append(features)
            answers.append({name: result.as_numpy(name) for name in OUTPUTS})
    finally:
        client.close()
    return inputs, answers


# ---- the control loop -------------------------------------------------------------------------


class ControlLoop:
    """The local driver, `tritonscale tune`, as a user runs it: it scales and it heals.

    `tune` ticks every policy each `intervalSeconds` (reconcile: a healing check of the model
    on the pod, the direct-scrape source, the real actuator) and appends each tick, with its
    healing actions, to a decision log.
    """

    def __init__(self, server: LocalTriton, interval_s: float, out: Path) -> None:
        self.server = server
        self.interval_s = interval_s
        self.config_path = out / "policies.yaml"
        self.decision_log = out / "decisions.jsonl"
        self.tune_log = out / "tune.log"
        self.lines: list[dict[str, Any]] = []
        self.heals: list[dict[str, Any]] = []
        self._tune: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        config = {
            "triton": {"http": [self.server.http_url], "metrics": [self.server.metrics_url]},
            "metrics": {"source": "scrape"},
            "policies": [
                {"name": spec["model"].replace("_", "-"), "spec": spec}
                for spec in policies(self.interval_s)
            ],
        }
        self.config_path.write_text(yaml.safe_dump(config, sort_keys=False))
        self.decision_log.unlink(missing_ok=True)
        env = {**os.environ, REPOSITORY_KEY_ENV: self.server.repository_key}
        with open(self.tune_log, "wb") as log:
            self._tune = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "tritonscale.cli",
                    "tune",
                    "--config",
                    str(self.config_path),
                    "--metrics-port",
                    "0",
                    "--decision-log",
                    str(self.decision_log),
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
            )

    def stop(self) -> None:
        if self._tune is not None:
            self._tune.send_signal(signal.SIGTERM)
            try:
                self._tune.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self._tune.kill()
                self._tune.wait(timeout=10)
        if self.decision_log.exists():
            for line in self.decision_log.read_text().splitlines():
                tick = json.loads(line)
                self.lines.append(
                    {
                        "t": tick["t"],
                        "model": tick["model"],
                        "current": tick["current"],
                        "desired": tick["desired"],
                        "reason": tick["reason"],
                        "applied": any(p["ok"] for p in tick["applied"]),
                    }
                )
                for heal in tick.get("healing", []):
                    self.heals.append(heal)
                    print(f"  tune healing: {tick['time']} {heal['message']}", flush=True)
                if tick["applied"]:
                    print(
                        f"  tune: {tick['time']} {tick['model']} {tick['current']} -> "
                        f"{tick['desired']} {tick['reason']}",
                        flush=True,
                    )

    @property
    def tune_exit_code(self) -> int | None:
        return self._tune.returncode if self._tune is not None else None


def kill_one_stub(group: int, model: str) -> int:
    """kill -9 the first stub of `model` in the server's process group; its PID."""
    for pid, argv in sorted(_group_processes(group)):
        if argv[0].endswith("triton_python_backend_stub") and f"/{model}/" in argv[1]:
            os.kill(pid, signal.SIGKILL)
            return pid
    raise RuntimeError(f"no stub of {model} to kill")


# ---- the run -------------------------------------------------------------------------------


def run(args: argparse.Namespace) -> dict[str, Any]:
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    with LocalTriton(models=SERVED, http_port=0, grpc_port=0, metrics_port=0) as server:
        assert server.process is not None
        sampler = Sampler(os.getpgid(server.process.pid))
        inputs, reference = reference_answers(server.grpc_url, np.random.default_rng(7), 32)
        users = Users(server.grpc_url, inputs, reference, args.users)
        control = ControlLoop(server, args.interval, out) if args.control else None
        samples = [sampler.sample(0.0)]
        print(
            f"soak: {args.duration:.0f} s, {args.users} users on {MODEL}, control loop "
            f"{'on' if control else 'off'}, Triton at {server.grpc_url} (gRPC)",
            flush=True,
        )
        users.start()
        if control:
            control.start()
        started, started_unix = time.monotonic(), time.time()
        fault: dict[str, Any] = {}
        if args.kill_stub:

            def inject() -> None:
                at = round(time.monotonic() - started, 2)
                pid = kill_one_stub(sampler.group, args.kill_stub)
                fault.update(model=args.kill_stub, killed_at_s=at, pid=pid)
                print(f"  fault: kill -9 {args.kill_stub}'s stub (pid {pid}) at {at} s", flush=True)

            injector = threading.Timer(args.kill_at, inject)
            injector.start()
        try:
            while (elapsed := time.monotonic() - started) < args.duration:
                time.sleep(min(args.sample_every, max(0.1, args.duration - elapsed)))
                samples.append(sampler.sample(time.monotonic() - started))
                last = samples[-1]
                if args.verbose:
                    print(
                        f"  t={last['t']:6.0f}s ok={users.tally.ok} failed={users.tally.failed} "
                        f"stubs={last['stubs']} stub_rss={last['stub_rss_bytes'] / 2**20:.0f}MiB "
                        f"shm={last['shm_bytes'] / 2**20:.1f}MiB",
                        flush=True,
                    )
        finally:
            if args.kill_stub:
                injector.cancel()
            users.stop()
            if control:
                control.stop()
        instances = {
            name: asyncio.run(
                Actuator(server.repository_key).live_count(Endpoint("local", server.http_url), name)
            )
            for name in [MODEL, *BRANCHES]
        }
    summary = summarize(args, users.tally, samples, instances, control)
    if fault:
        after = [t for t in users.tally.failed_at_s if t >= fault["killed_at_s"]]
        fault["requests_failed"] = len(after)
        fault["last_failure_sent_at_s"] = max(after) if after else None
        summary["fault"] = fault
    report = {
        "summary": summary,
        "samples": samples,
        "ticks": control.lines if control else [],
        "healing": control.heals if control else [],
        "errors": users.tally.errors,
    }
    (out / "soak.json").write_text(json.dumps(report, indent=1))
    ticks = [{**t, "t": round(t["t"] - started_unix, 2)} for t in report["ticks"]]
    plot(samples, users.tally, ticks, out / "soak.png", summary)
    return summary


def _half_max(samples: list[dict[str, Any]], key: str) -> tuple[float, float]:
    """The largest value of the first and of the second half of the run (after warm-up)."""
    body = samples[1:] or samples
    middle = len(body) // 2
    first, second = body[: max(1, middle)], body[middle:] or body
    return max(s[key] for s in first), max(s[key] for s in second)


def summarize(
    args: argparse.Namespace,
    tally: Tally,
    samples: list[dict[str, Any]],
    instances: dict[str, int],
    control: ControlLoop | None,
) -> dict[str, Any]:
    latencies = sorted(tally.latencies_s)

    def quantile(q: float) -> float | None:
        if not latencies:
            return None
        return round(1000 * latencies[min(len(latencies) - 1, int(q * len(latencies)))], 1)

    mib = 2**20
    stub_first, stub_second = _half_max(samples, "stub_rss_bytes")
    single_first, single_second = _half_max(samples, "max_stub_rss_bytes")
    shm_first, shm_second = _half_max(samples, "shm_bytes")
    return {
        "duration_s": args.duration,
        "users": args.users,
        "control_loop": bool(control),
        "requests_ok": tally.ok,
        "requests_failed": tally.failed,
        "wrong_answers": tally.wrong,
        "throughput_rps": round(tally.ok / args.duration, 1),
        "latency_p50_ms": quantile(0.5),
        "latency_p95_ms": quantile(0.95),
        "latency_p99_ms": quantile(0.99),
        "stub_rss_mib": {
            "start": round(samples[0]["stub_rss_bytes"] / mib, 1),
            "max_first_half": round(stub_first / mib, 1),
            "max_second_half": round(stub_second / mib, 1),
            "end": round(samples[-1]["stub_rss_bytes"] / mib, 1),
        },
        # The largest single stub: the number that must stay flat (totals follow scaling).
        "largest_stub_rss_mib": {
            "start": round(samples[0]["max_stub_rss_bytes"] / mib, 1),
            "max_first_half": round(single_first / mib, 1),
            "max_second_half": round(single_second / mib, 1),
        },
        "server_rss_mib": {
            "start": round(samples[0]["server_rss_bytes"] / mib, 1),
            "max": round(max(s["server_rss_bytes"] for s in samples) / mib, 1),
            "end": round(samples[-1]["server_rss_bytes"] / mib, 1),
        },
        "shm_mib": {
            "start": round(samples[0]["shm_bytes"] / mib, 2),
            "max_first_half": round(shm_first / mib, 2),
            "max_second_half": round(shm_second / mib, 2),
            "end": round(samples[-1]["shm_bytes"] / mib, 2),
        },
        "shm_leaked_regions_max": max(s["shm_leaked_regions"] for s in samples),
        # Per live region: the totals follow the stub count; a region that grows shows here.
        "shm_per_region_mib_max": round(
            max(s["shm_bytes"] / max(1, s["shm_regions"]) for s in samples) / mib, 2
        ),
        "stubs": {"min": min(s["stubs"] for s in samples), "max": max(s["stubs"] for s in samples)},
        "instances_at_end": instances,
        "scale_events": sum(1 for line in control.lines if line["applied"]) if control else 0,
        "control_ticks": len(control.lines) if control else 0,
        "tune_exit_code": control.tune_exit_code if control else None,
        "healing_actions": len(control.heals) if control else 0,
    }


def plot(
    samples: list[dict[str, Any]],
    tally: Tally,
    ticks: list[dict[str, Any]],
    path: Path,
    summary: dict[str, Any],
) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    t = [s["t"] for s in samples]
    mib = 2**20
    figure, axes = plt.subplots(4, 1, figsize=(10, 11), sharex=True)
    seconds = sorted(tally.per_second)[:-1]  # the last second is cut short by the stop
    axes[0].plot(seconds, [tally.per_second[s] for s in seconds], lw=0.8)
    axes[0].set_ylabel("successful req/s")
    axes[0].set_title(
        f"soak: {summary['requests_ok']} ok, {summary['requests_failed']} failed, "
        f"{summary['wrong_answers']} wrong; p95 {summary['latency_p95_ms']} ms"
    )
    axes[1].plot(t, [s["stub_rss_bytes"] / mib for s in samples], label="all stubs")
    axes[1].plot(t, [s["server_rss_bytes"] / mib for s in samples], label="tritonserver")
    axes[1].set_ylabel("RSS (MiB)")
    axes[1].legend(loc="upper left")
    axes[2].plot(t, [s["shm_bytes"] / mib for s in samples], label="live regions")
    axes[2].plot(t, [s["shm_leaked_bytes"] / mib for s in samples], label="leaked regions")
    axes[2].set_ylabel("/dev/shm (MiB)")
    axes[2].legend(loc="upper left")
    for model in [MODEL, *BRANCHES]:
        mine = [t for t in ticks if t["model"] == model and t["current"] is not None]
        axes[3].step(
            [t["t"] for t in mine], [t["current"] for t in mine], where="post", label=model
        )
    axes[3].set_ylabel("instances (tune)")
    axes[3].set_xlabel("seconds")
    axes[3].legend(loc="upper left", fontsize="small")
    for axis in axes:
        axis.set_ylim(bottom=0)
        axis.grid(alpha=0.3)
    figure.tight_layout()
    figure.savefig(path, dpi=90)
    plt.close(figure)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--duration", type=float, help="seconds of load (default 600)")
    parser.add_argument(
        "--quick", action="store_true", help="20 s (or --duration), sampled often: proves it works"
    )
    parser.add_argument("--users", type=int, default=8, help="closed-loop users")
    parser.add_argument("--interval", type=float, default=5.0, help="control period, s")
    parser.add_argument("--sample-every", type=float, default=5.0, help="sampling period, s")
    parser.add_argument("--no-control", dest="control", action="store_false")
    parser.add_argument("--out", default="reports/soak", help="folder for soak.json/png")
    parser.add_argument("--verbose", action="store_true", help="print every sample")
    parser.add_argument(
        "--kill-stub", metavar="MODEL", help="fault: kill -9 this model's stub once (tune heals)"
    )
    parser.add_argument("--kill-at", type=float, help="fault: when, in s (default: half way)")
    args = parser.parse_args(argv)
    if args.quick:
        args.duration = args.duration or 20.0
        args.sample_every, args.interval = 2.0, 2.0
    args.duration = args.duration or 600.0
    if args.kill_at is None:
        args.kill_at = args.duration / 2
    if args.kill_stub and not args.control:
        parser.error("--kill-stub needs the control loop (tune heals): drop --no-control")
    if args.duration <= 0 or args.users < 1 or args.sample_every <= 0 or args.interval <= 0:
        parser.error("--duration, --users, --interval and --sample-every must be positive")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        summary = run(args)
    except KeyboardInterrupt:
        print("soak: interrupted", file=sys.stderr)
        return 130
    except Exception as error:  # a soak that cannot run says why in one line
        print(f"soak: {type(error).__name__}: {error}", file=sys.stderr)
        return 2
    print(json.dumps(summary, indent=1))
    print(f"soak: wrote {Path(args.out) / 'soak.json'} and {Path(args.out) / 'soak.png'}")
    if summary["wrong_answers"] or (summary["requests_failed"] and not args.kill_stub):
        print("soak: FAILED: requests failed or answers were wrong", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
