"""Bring a fleet up and keep it until Ctrl-C (in a network namespace of its own; root).

    python -m hack.fleet --pods 20 [--source prometheus] [--interval 15]

The fleet's kubeconfig and logs are in the printed folder; from the host, reach the API
server with `ip netns exec NAMESPACE kubectl --kubeconfig FOLDER/cluster/kubeconfig ...`.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

from hack.fleet import build, netns
from hack.fleet.fleet import Fleet, FleetConfig, remove_workdir
from tritonscale.local.interrupts import stop_on_signals


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="A fleet of fake Triton pods and the operator.")
    p.add_argument("--pods", type=int, default=20)
    p.add_argument("--source", choices=("scrape", "prometheus"), default="scrape")
    p.add_argument("--interval", type=int, default=15, help="The autoscalers' intervalSeconds")
    p.add_argument("--rate", type=float, default=8.0, help="Requests/s per pod and model")
    args = p.parse_args(argv)
    if not netns.inside():
        build.build_before_namespace()
        return netns.reexec("hack.fleet", sys.argv[1:] if argv is None else argv)
    stop_on_signals()
    workdir = Path(tempfile.mkdtemp(prefix="tritonscale-fleet-"))
    config = FleetConfig(
        pods=args.pods, source=args.source, interval_s=args.interval, base_rate=args.rate
    )
    print(f"fleet: {workdir} (network namespace {netns.current()})", flush=True)
    try:
        with Fleet(config, workdir, progress=lambda line: print(line, flush=True)) as fleet:
            print("fleet: up; Ctrl-C to stop", flush=True)
            while True:
                time.sleep(5)
                fleet.state()  # fails if a process died
    except KeyboardInterrupt:
        print("fleet: stopped", flush=True)
    remove_workdir(workdir)
    return 0


if __name__ == "__main__":
    sys.exit(main())
