"""Local TCP ports: a free one, and whether one is taken, checked the way a server binds it.

After a server stops, the connections it closed sit in TIME_WAIT for about a minute. A
server binds with SO_REUSEADDR (Triton, Prometheus and Python's HTTP servers all do), so
those connections do not stop it from starting again; a check that binds without the option
would call the port taken although nothing listens. Every local server starter and the demo
use these functions.

A server with several ports draws them together (`free_ports`): the kernel may hand out a
port it handed out a moment ago once that socket is closed, so ports drawn one after the
other can come out the same (seen: Triton refusing a gRPC and a metrics port that were one).
"""

from __future__ import annotations

import errno
import socket
from collections.abc import Sequence

LOOPBACK = "127.0.0.1"


def _family(host: str) -> socket.AddressFamily:
    return socket.AF_INET6 if ":" in host else socket.AF_INET


def free_port(host: str = LOOPBACK) -> int:
    """A TCP port that nothing listens on right now on host (the kernel's choice)."""
    with socket.socket(_family(host), socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


def free_ports(count: int, host: str | Sequence[str] = LOOPBACK) -> list[int]:
    """`count` free TCP ports, no two the same, on host (or on hosts[i] for the i-th).

    Each is drawn while the ones before it are still bound, so the kernel cannot hand one out
    twice; one that another host's draw already got is drawn again.
    """
    hosts = [host] * count if isinstance(host, str) else list(host)
    if len(hosts) != count:
        raise ValueError(f"{count} ports asked for {len(hosts)} hosts")
    held: list[socket.socket] = []
    ports: list[int] = []
    try:
        for where in hosts:
            while True:
                sock = socket.socket(_family(where), socket.SOCK_STREAM)
                held.append(sock)
                sock.bind((where, 0))
                port = sock.getsockname()[1]
                if port not in ports:
                    ports.append(port)
                    break
        return ports
    finally:
        for sock in held:
            sock.close()


def port_is_taken(port: int, host: str = LOOPBACK) -> bool:
    """Whether a server could not bind host:port now because another one listens there.

    Any other reason not to bind (an address not on this machine, a port below 1024 without
    the right) raises the OSError.
    """
    with socket.socket(_family(host), socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError as error:
            if error.errno == errno.EADDRINUSE:
                return True
            raise
        return False
