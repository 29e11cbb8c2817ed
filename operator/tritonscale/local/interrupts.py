"""Stopping a local run the same way whether it is Ctrl-C or `kill`.

    stop_on_signals()   # before starting a tritonserver, a Prometheus or a tune subprocess

Python stops on SIGINT through KeyboardInterrupt, so `with` blocks and `finally` clauses stop
the processes a run started; on SIGTERM it dies at once and leaves them running. A process
started as a background job of a script also inherits SIGINT ignored, and Python then leaves
it ignored, so `kill -INT` would not stop it at all. Both signals raise KeyboardInterrupt here.
"""

from __future__ import annotations

import signal
import types


def stop_on_signals() -> None:
    """Turn SIGTERM and SIGINT into KeyboardInterrupt (main thread only)."""

    def handler(signum: int, frame: types.FrameType | None) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, handler)
    signal.signal(signal.SIGINT, handler)
