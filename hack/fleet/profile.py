"""Where the operator's CPU goes on a fleet: py-spy's samples of its steady state, by part.

    python -m hack.fleet.profile --pods 1000 [--source prometheus] [--seconds 60]
                                 [--out reports/fleet-profile.json]

Brings a fleet up (`hack.fleet`: the stand-in Triton pods, a real API server and the
operator), waits `--warmup` seconds for the operator's steady state, then records py-spy's
raw stacks of the operator process for `--seconds` while reading its CPU time from /proc over
the same span. Each busy sample goes to the first part in PARTS one of its frames matches
(samples waiting in the event loop's select are idle), so a part's cores are its share of
the busy samples times the operator's measured cores. It prints the parts and writes them,
with the /metrics reads per pod and interval, to `--out`.

Needs py-spy (`pip install -e '.[profile]'`) and root (the fleet's network namespace; py-spy
reads the operator's memory).
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from hack.fleet import build, netns
from hack.fleet.fleet import Fleet, FleetConfig, remove_workdir
from tritonscale.local.interrupts import stop_on_signals

# (part, substrings of a frame's text): the first part with a match in any frame of a stack
# takes the sample, so a part listed earlier wins over its callers listed later (a status
# write made from the set tick counts as a status write).
PARTS: tuple[tuple[str, tuple[str, ...]], ...] = (
    (
        "own metrics (exposition)",
        ("prometheus_client/exposition.py", "prometheus_client/registry.py", "operator_metrics"),
    ),
    ("status writes", ("status.py", "patching.py", "CustomObjectsApi")),
    ("healer", ("healing.py",)),
    ("actuator (configs, loads)", ("actuator.py",)),
    ("parse /metrics", ("metrics_text.py", "prometheus_client/parser.py")),
    ("Prometheus source", ("metrics/prometheus.py",)),
    ("scrape bookkeeping", ("metrics/scrape.py",)),
    ("HTTP client (other)", ("aiohttp/",)),
    ("policy and planning", ("tritonscale/core/",)),
    ("set tick", ("tritonscale/control/",)),
    ("driver (kopf handlers, daemons)", ("tritonscale/drivers/",)),
    ("kopf (other)", ("kopf/",)),
    ("event loop (other)", ("asyncio/",)),
)
IDLE = "idle (select)"


def part_of(stack: str) -> str:
    """The part a sample's stack (py-spy's raw format: frames joined by ';', root first)
    counts for."""
    leaf = stack.rsplit(";", 1)[-1]
    if "select" in leaf.lower() or leaf.startswith("_worker (concurrent/futures/thread.py"):
        return IDLE  # the loop waiting for I/O, or a worker thread waiting for work
    for part, patterns in PARTS:
        if any(p in stack for p in patterns):
            return part
    return "other"


def parts(raw_lines: Iterable[str]) -> tuple[int, collections.Counter[str]]:
    """All samples, and the samples per part, of py-spy's raw output ('stack count' lines)."""
    counts: collections.Counter[str] = collections.Counter()
    total = 0
    for line in raw_lines:
        stack, _, n = line.rstrip("\n").rpartition(" ")
        if stack and n.isdigit():
            counts[part_of(stack)] += int(n)
            total += int(n)
    return total, counts


def cpu_seconds(pid: int) -> float:
    """User plus system CPU seconds the process has used."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def metrics_reads(fleet: Fleet) -> int:
    return int(fleet.state()["requests"].get("metrics", 0))


def profile(fleet: Fleet, seconds: int, rate: int, py_spy: str) -> dict[str, Any]:
    pid = fleet.operator_pid
    with tempfile.TemporaryDirectory() as tmp:
        raw = Path(tmp) / "raw.txt"
        reads0, cpu0, t0 = metrics_reads(fleet), cpu_seconds(pid), time.monotonic()
        done = subprocess.run(
            [py_spy, "record", "--pid", str(pid), "--rate", str(rate), "--duration",
             str(seconds), "--format", "raw", "--nonblocking", "--output", str(raw)],
            capture_output=True, text=True,
        )  # fmt: skip
        elapsed = time.monotonic() - t0
        cores = (cpu_seconds(pid) - cpu0) / elapsed
        reads = metrics_reads(fleet) - reads0
        if done.returncode != 0 or not raw.exists():
            raise SystemExit(f"py-spy failed: {done.stderr.strip().splitlines()[-1:]}")
        total, counts = parts(raw.read_text().splitlines())
    busy = total - counts.pop(IDLE, 0)
    share = {part: n / busy for part, n in counts.most_common()} if busy else {}
    intervals = elapsed / fleet.config.interval_s
    return {
        "pods": fleet.config.pods,
        "source": fleet.config.source,
        "seconds": round(elapsed, 1),
        "samples": total,
        "busy_samples": busy,
        "operator_cores": round(cores, 3),
        "operator_rss_mib": round(rss_mib(pid), 1),
        "metrics_reads_per_pod_and_interval": round(reads / fleet.config.pods / intervals, 2),
        "share_of_busy": {part: round(s, 3) for part, s in share.items()},
        "cores": {part: round(s * cores, 3) for part, s in share.items()},
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--pods", type=int, default=1000)
    p.add_argument("--source", choices=("scrape", "prometheus"), default="scrape")
    p.add_argument("--interval", type=int, default=15, help="The autoscalers' intervalSeconds")
    p.add_argument("--warmup", type=int, default=90, help="Seconds before sampling")
    p.add_argument("--seconds", type=int, default=60, help="Seconds sampled")
    p.add_argument("--rate", type=int, default=50, help="py-spy's samples per second")
    p.add_argument("--out", type=Path, default=Path("reports/fleet-profile.json"))
    args = p.parse_args(argv)
    py_spy = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
    if not Path(py_spy).exists():
        print("py-spy not found: pip install -e '.[profile]'", file=sys.stderr)
        return 2
    if not netns.inside():
        build.build_before_namespace()
        return netns.reexec("hack.fleet.profile", sys.argv[1:] if argv is None else argv)
    stop_on_signals()
    workdir = Path(tempfile.mkdtemp(prefix="tritonscale-fleet-"))
    config = FleetConfig(pods=args.pods, source=args.source, interval_s=args.interval)
    try:
        with Fleet(config, workdir, progress=lambda line: print(line, flush=True)) as fleet:
            print(f"profile: fleet up; sampling after {args.warmup} s", flush=True)
            time.sleep(args.warmup)
            fleet.state()  # fails if a process died
            print(f"profile: sampling the operator for {args.seconds} s", flush=True)
            result = profile(fleet, args.seconds, args.rate, py_spy)
    finally:
        remove_workdir(workdir)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    print(
        f"operator: {result['operator_cores']} cores, {result['operator_rss_mib']} MiB, "
        f"{result['metrics_reads_per_pod_and_interval']} /metrics reads per pod and interval"
    )
    for part, cores in result["cores"].items():
        print(f"  {100 * result['share_of_busy'][part]:5.1f} %  {cores:6.3f} cores  {part}")
    print(f"written: {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
