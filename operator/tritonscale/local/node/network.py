"""The node's pod network: a bridge, and a network namespace with a veth pair per pod.

Each stand-in takes a free slot N (a lock file, so that several stand-ins on one machine,
each with its own control plane, never meet): bridge `tsnN-br` holding 10.244.N.1/24, the
gateway, in the machine's own network namespace; pod P gets namespace `tsnN-P` with its own
loopback and `eth0` at 10.244.N.P, the other end `tsnN-vP` on the bridge. The machine, and
so the tests and every pod, reach each pod's address; nothing leaves the machine.

There is no kube-proxy: pods reach the API server through `ApiForwarder`, which listens on
the gateway at port 443 and forwards to the API server's loopback port (the pods' hosts
files name the gateway `kubernetes.default.svc`, a name in the API server's certificate).

Everything carries the slot's prefix; `clean_leftovers` removes the namespaces, links and
processes of any slot whose lock no live stand-in holds (a crashed run's).
"""

from __future__ import annotations

import contextlib
import fcntl
import ipaddress
import os
import shutil
import signal
import socket
import socketserver
import subprocess
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from tritonscale.local.node.errors import NodeError

PREFIX = "tsn"
SLOTS = 64
POD_OCTETS = range(2, 255)  # .1 is the gateway
API_PORT = 443


def ip(*args: str, check: bool = True) -> str:
    """One `ip` command; a failure is a NodeError naming it."""
    result = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30)
    if check and result.returncode != 0:
        raise NodeError(f"ip {' '.join(args)} failed: {result.stderr.strip() or result.stdout}")
    return result.stdout


def require_network_tools() -> None:
    if os.geteuid() != 0:
        raise NodeError("the node stand-in needs root (it creates network and mount namespaces)")
    for tool in ("ip", "nsenter", "unshare", "mount", "chroot"):
        if shutil.which(tool) is None:
            raise NodeError(f"{tool} not found on PATH (Debian: iproute2, util-linux, coreutils)")


@dataclass
class Slot:
    """One stand-in's share of the machine: a number, a lock and the names derived from it."""

    number: int
    lock_file: object
    run_dir: Path

    @property
    def prefix(self) -> str:
        return f"{PREFIX}{self.number}-"

    @property
    def bridge(self) -> str:
        return f"{self.prefix}br"

    @property
    def subnet(self) -> ipaddress.IPv4Network:
        return ipaddress.IPv4Network(f"10.244.{self.number}.0/24")

    @property
    def gateway(self) -> str:
        return str(self.subnet.network_address + 1)

    def address(self, octet: int) -> str:
        return str(self.subnet.network_address + octet)

    def netns(self, octet: int) -> str:
        return f"{self.prefix}{octet}"

    def host_veth(self, octet: int) -> str:
        return f"{self.prefix}v{octet}"

    @property
    def state_dir(self) -> Path:
        """Pods' folders (volumes, logs): hidden from the pods themselves."""
        return self.run_dir / f"slot-{self.number}"

    @property
    def images_dir(self) -> Path:
        """The images' programs: outside state_dir, since pods run them."""
        return self.run_dir / f"slot-{self.number}-images"

    def release(self) -> None:
        lock, self.lock_file = self.lock_file, None
        if lock is not None:
            lock.close()  # closing drops the flock


def _try_lock(run_dir: Path, number: int) -> object | None:
    lock = open(run_dir / f"slot-{number}.lock", "w")  # noqa: SIM115 - held while the slot is
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        lock.close()
        return None
    return lock


def take_slot(run_dir: Path) -> Slot:
    """The first slot no live stand-in holds, with everything a dead one left cleaned away."""
    run_dir.mkdir(parents=True, exist_ok=True)
    for number in range(SLOTS):
        lock = _try_lock(run_dir, number)
        if lock is not None:
            slot = Slot(number, lock, run_dir)
            clean_slot(slot)
            return slot
    raise NodeError(f"all {SLOTS} node slots are taken (lock files in {run_dir})")


def _slots_with_leftovers(run_dir: Path) -> set[int]:
    """Slot numbers that own a namespace, a link or a folder on this machine."""
    names = [line.split()[0] for line in ip("netns", "list", check=False).splitlines() if line]
    names += [
        line.split(":")[1].strip().split("@")[0]
        for line in ip("-o", "link", "show", check=False).splitlines()
        if ":" in line
    ]
    names += [path.name for path in run_dir.glob("slot-*") if path.is_dir()]
    numbers = set()
    for name in names:
        head = name.removeprefix("slot-") if name.startswith("slot-") else name
        if name.startswith(PREFIX):
            head = name[len(PREFIX) :]
        digits = head.split("-")[0]
        if digits.isdigit() and (name.startswith(PREFIX) or name.startswith("slot-")):
            numbers.add(int(digits))
    return {number for number in numbers if number < SLOTS}


def clean_leftovers(run_dir: Path) -> list[str]:
    """Remove what stand-ins that died left behind, in every slot no live one holds."""
    run_dir.mkdir(parents=True, exist_ok=True)
    removed: list[str] = []
    for number in sorted(_slots_with_leftovers(run_dir)):
        lock = _try_lock(run_dir, number)
        if lock is not None:
            slot = Slot(number, lock, run_dir)
            try:
                removed += clean_slot(slot)
            finally:
                slot.release()
    return removed


def _kill_namespace_processes(netns: str) -> None:
    for _ in range(50):
        pids = [int(pid) for pid in ip("netns", "pids", netns, check=False).split()]
        if not pids:
            return
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.1)
    raise NodeError(f"processes in network namespace {netns} survive SIGKILL")


def clean_slot(slot: Slot) -> list[str]:
    """Every namespace, link, process and folder with this slot's prefix; returns their names."""
    removed = []
    for line in ip("netns", "list", check=False).splitlines():
        name = line.split()[0] if line.strip() else ""
        if name.startswith(slot.prefix):
            _kill_namespace_processes(name)
            ip("netns", "delete", name, check=False)
            removed.append(name)
    for line in ip("-o", "link", "show", check=False).splitlines():
        name = line.split(":")[1].strip().split("@")[0] if ":" in line else ""
        if name.startswith(slot.prefix):
            ip("link", "delete", name, check=False)
            removed.append(name)
    for folder in (slot.state_dir, slot.images_dir):
        if folder.exists():
            shutil.rmtree(folder, ignore_errors=True)
            removed.append(str(folder))
    return removed


def create_bridge(slot: Slot) -> None:
    ip("link", "add", slot.bridge, "type", "bridge")
    ip("addr", "add", f"{slot.gateway}/{slot.subnet.prefixlen}", "dev", slot.bridge)
    ip("link", "set", slot.bridge, "up")


def create_pod_network(slot: Slot, octet: int) -> tuple[str, str]:
    """A namespace with loopback up and eth0 on the bridge; returns (namespace, address)."""
    netns, veth, address = slot.netns(octet), slot.host_veth(octet), slot.address(octet)
    ip("netns", "add", netns)
    try:
        ip("link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", netns)
        ip("link", "set", veth, "master", slot.bridge, "up")
        ip("-n", netns, "addr", "add", f"{address}/{slot.subnet.prefixlen}", "dev", "eth0")
        ip("-n", netns, "link", "set", "lo", "up")
        ip("-n", netns, "link", "set", "eth0", "up")
        ip("-n", netns, "route", "add", "default", "via", slot.gateway)
    except NodeError:
        delete_pod_network(slot, octet)
        raise
    return netns, address


def delete_pod_network(slot: Slot, octet: int) -> None:
    """Kill what still runs in the namespace, then delete it (its veth pair goes with it)."""
    netns = slot.netns(octet)
    _kill_namespace_processes(netns)
    ip("netns", "delete", netns, check=False)
    ip("link", "delete", slot.host_veth(octet), check=False)


# ------------------------------------------------------------------ API server access


class _Forward(socketserver.BaseRequestHandler):
    def handle(self) -> None:
        server: ApiForwarder = self.server  # type: ignore[assignment]
        try:
            upstream = socket.create_connection(server.upstream, timeout=10)
        except OSError:
            return
        upstream.settimeout(None)
        self.request.settimeout(None)
        pump = threading.Thread(target=_pipe, args=(upstream, self.request), daemon=True)
        pump.start()
        _pipe(self.request, upstream)
        pump.join(timeout=5)
        upstream.close()


def _pipe(source: socket.socket, target: socket.socket) -> None:
    try:
        while data := source.recv(65536):
            target.sendall(data)
    except OSError:
        pass
    with contextlib.suppress(OSError):
        target.shutdown(socket.SHUT_WR)


class ApiForwarder(socketserver.ThreadingTCPServer):
    """TCP from gateway:443 to the API server on loopback; TLS passes through untouched."""

    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, listen: tuple[str, int], upstream: tuple[str, int]) -> None:
        super().__init__(listen, _Forward)
        self.upstream = upstream
        self._thread = threading.Thread(
            target=self.serve_forever, kwargs={"poll_interval": 0.2}, daemon=True,
            name="tritonscale-node-api-forwarder",
        )  # fmt: skip

    def start(self) -> ApiForwarder:
        self._thread.start()
        return self

    def stop(self) -> None:
        self.shutdown()
        self.server_close()
        self._thread.join(timeout=5)
