"""`kill` stops a local run as Ctrl-C does: the processes it started are stopped on the way out,
also when the run was started as a background job (SIGINT inherited ignored)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

# A run that starts a child and stops it in `finally`, as the benchmarks' `with` blocks do;
# it prints the child's pid once it waits.
RUN = """
import subprocess, sys, time
from tritonscale.local.interrupts import stop_on_signals
stop_on_signals()
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
try:
    print(child.pid, flush=True)
    time.sleep(60)
finally:
    child.terminate()
    child.wait()
"""


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] != "Z"


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_signal_stops_the_run_and_its_children(signum: int) -> None:
    run = subprocess.Popen(
        [sys.executable, "-c", RUN],
        stdout=subprocess.PIPE,
        text=True,
        # As a background job of a script: SIGINT ignored from the start.
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN),
    )
    child = 0
    try:
        assert run.stdout is not None
        child = int(run.stdout.readline())
        run.send_signal(signum)
        run.wait(timeout=10)
        deadline = time.monotonic() + 10
        while _alive(child) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not _alive(child), f"the run's child {child} outlived it after {signum.name}"
    finally:
        run.kill()
        run.wait()
        if child and _alive(child):
            os.kill(child, signal.SIGKILL)
