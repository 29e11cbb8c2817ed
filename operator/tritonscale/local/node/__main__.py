"""`python -m tritonscale.local.node`: run the node stand-in in the foreground."""

from __future__ import annotations

import argparse
import signal
import sys
import threading
from pathlib import Path

from tritonscale.local.node import Node, NodeError


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tritonscale.local.node",
        description="A kubelet stand-in that runs the pods bound to it as local processes.",
    )
    parser.add_argument("--kubeconfig", type=Path, default=Path(".cluster/kubeconfig"))
    parser.add_argument("--name", default="tritonscale-node")
    args = parser.parse_args(argv)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    try:
        with Node(args.kubeconfig, name=args.name, progress=print):
            print("node stand-in running; Ctrl-C stops it and every pod it runs")
            while not stop.wait(1.0):
                pass
    except NodeError as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
