"""Local TCP ports: a free one, and whether one is taken, checked the way a server binds it.

After a server stops, the connections it closed sit in TIME_WAIT for about a minute. A
server binds with SO_REUSEADDR (Triton, Prometheus and Python's HTTP servers all do), so
those connections do not stop it from starting again; a check that binds without the option
would call the port taken although nothing listens. Every local server starter and the demo
use these two functions.
"""

from __future__ import annotations

import errno
import socket

LOOPBACK = "127.0.0.1"


def _family(host: str) -> socket.AddressFamily:
    return socket.AF_INET6 if ":" in host else socket.AF_INET


def free_port(host: str = LOOPBACK) -> int:
    """A TCP port that nothing listens on right now on host (the kernel's choice)."""
    with socket.socket(_family(host), socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


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
