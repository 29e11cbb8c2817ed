"""A network namespace of the fleet's own: all of 127.0.0.0/8 is its loopback.

    sys.exit(netns.reexec("loadtests.bench.fleet", sys.argv[1:]))   # unless netns.inside()

The fleet's pods get addresses from 127.64.0.0/10 (hack.fleet.fleet.POD_CIDR), and its
Triton stand-in listens on 0.0.0.0:8000 and :8002: in a namespace of their own these never
meet the host's ports. `reexec` creates the namespace (`ip netns add`, the loopback up), runs
`python -m MODULE ARGS` inside it (`ip netns exec`), and deletes it afterwards, also when the
run fails or is stopped. Root only. The inner run dies with the outer one (SIGTERM, so that
its own clean-up runs); whatever still runs in the namespace when it has ended is killed.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import types

from hack.processes import dying_with_parent

ENV = "TRITONSCALE_FLEET_NETNS"


class NetnsError(RuntimeError):
    """The namespace could not be made; one line for a person."""


def inside() -> bool:
    """Whether this process runs in a fleet namespace (made by `reexec`)."""
    return bool(os.environ.get(ENV))


def _ip(*args: str) -> None:
    done = subprocess.run(["ip", *args], capture_output=True, text=True)
    if done.returncode != 0:
        raise NetnsError(f"ip {' '.join(args)} failed: {done.stderr.strip() or done.returncode}")


def reexec(module: str, args: list[str], name: str | None = None) -> int:
    """Run `python -m module args` in a fresh namespace; its exit code. SIGTERM and SIGINT
    are passed on to it as SIGTERM, and the namespace goes once it has ended."""
    if os.geteuid() != 0:
        raise NetnsError("a network namespace needs root (ip netns add)")
    name = name or f"tritonscale-fleet-{os.getpid()}"
    _ip("netns", "add", name)
    try:
        _ip("netns", "exec", name, "ip", "link", "set", "lo", "up")
        child = subprocess.Popen(
            dying_with_parent(
                ["ip", "netns", "exec", name, sys.executable, "-m", module, *args], "TERM"
            ),
            env={**os.environ, ENV: name},
        )

        def forward(signum: int, frame: types.FrameType | None) -> None:
            child.send_signal(signal.SIGTERM)

        signal.signal(signal.SIGTERM, forward)
        signal.signal(signal.SIGINT, forward)
        return child.wait()
    finally:
        _kill_left_over(name)
        _ip("netns", "delete", name)


def _kill_left_over(name: str) -> None:
    """Whatever still runs in the namespace (a process started in a session of its own that
    outlived a killed run) ends with it."""
    listed = subprocess.run(["ip", "netns", "pids", name], capture_output=True, text=True)
    for pid in listed.stdout.split():
        with contextlib.suppress(ProcessLookupError):
            os.kill(int(pid), signal.SIGKILL)


def current() -> str:
    """The name of the fleet namespace this process runs in ("" outside one)."""
    return os.environ.get(ENV, "")
