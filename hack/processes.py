"""Processes the local cluster's tooling starts and stops, and what it tells a person of them.

Every component (etcd, the API server, a kubelet, a go build) runs as a process of its own,
recorded by pid and binary in a state file so that a later `down` can stop it: `is_running`
tells a live one from a reused pid, `stop_pids` stops a set of them by process group, and
`last_meaningful_line` / `first_error` pick from a log or a command's output the line a person
needs. `ClusterError` is what the tooling beneath hack.cluster raises when one of them fails.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import time
from collections.abc import Sequence
from pathlib import Path


class ClusterError(RuntimeError):
    """The local cluster or a tool of it could not be built, started or stopped; one line
    for a person."""


def dying_with_parent(command: Sequence[str], signal_name: str = "KILL") -> list[str]:
    """COMMAND, started through util-linux's `setpriv --pdeathsig`, which asks the kernel to
    send it SIGKILL (or `signal_name`) when this process dies, then execs it: no component (or
    go build) outlives a crashed or killed run. (Measured here: it outlives the thread that
    started it; only the process's end kills it.) Not a `preexec_fn`: Python code between fork
    and exec is unsafe in a process with threads, and a child once died of a segfault in
    threading's after-fork hook there while a test thread had gevent loaded."""
    setpriv = shutil.which("setpriv")
    if setpriv is None:  # util-linux is essential in Debian; elsewhere, no such guard
        return list(command)
    return [setpriv, "--pdeathsig", signal_name, "--", *command]


def first_error(output: str) -> str:
    """The first line of a command's output (go, openssl) that says what went wrong (not
    progress, not a header)."""
    for line in output.splitlines():
        line = line.strip()
        # `go build -v` prints bare package paths; downloads and "# pkg" headers are noise.
        if " " not in line or line.startswith(("# ", "go: downloading", "go: extracting")):
            continue
        return line
    lines = [line for line in output.splitlines() if line.strip()]
    return lines[-1].strip() if lines else "no output"


def last_meaningful_line(log: Path) -> str:
    """What a person needs from a dead component's log: its last error, else its last line."""
    try:
        lines = [line.strip() for line in log.read_text(errors="replace").splitlines()]
    except FileNotFoundError:
        return "no log"
    for line in reversed(lines):
        # etcd logs JSON lines (zap).
        if line.startswith("{") and re.search(r'"level":"(error|fatal|panic)"', line):
            with contextlib.suppress(ValueError):
                entry = json.loads(line)
                return " ".join(str(entry[k]) for k in ("msg", "error") if k in entry)
        # klog E/F lines, cobra's "Error: unknown flag", Go panics.
        if re.match(r"[EF]\d{4} ", line) or line.startswith(("Error:", "panic:")):
            return line
    # A bad flag: the message comes before the usage text.
    if "Usage:" in lines:
        lines = lines[: lines.index("Usage:")]
    lines = [line for line in lines if line]
    return lines[-1] if lines else "empty log"


def is_running(pid: int, binary: str) -> bool:
    """True while `pid` is a live (not zombie) process running `binary`: a recorded pid
    may have been reused by an unrelated process since."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0].decode()
    except (FileNotFoundError, ProcessLookupError, UnicodeDecodeError):
        return False
    state = stat.rsplit(")", 1)[1].split()[0]
    return state not in ("Z", "X") and cmdline == binary


def stop_pids(
    pids: dict[str, int], binaries_by_name: dict[str, str], grace_s: float
) -> dict[str, int]:
    """SIGTERM each component's process group, SIGKILL what is left after `grace_s`, and
    verify that none remains; return the ones that were running."""
    live = {name: pid for name, pid in pids.items() if is_running(pid, binaries_by_name[name])}
    running = dict(live)
    for pid in live.values():
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while live and time.monotonic() < deadline:
        time.sleep(0.1)
        live = {n: p for n, p in live.items() if is_running(p, binaries_by_name[n])}
    for pid in live.values():
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pid, signal.SIGKILL)
    deadline = time.monotonic() + 5
    while live and time.monotonic() < deadline:
        time.sleep(0.1)
        live = {n: p for n, p in live.items() if is_running(p, binaries_by_name[n])}
    if live:
        raise ClusterError(f"could not stop {', '.join(f'{n} (pid {p})' for n, p in live.items())}")
    return running
