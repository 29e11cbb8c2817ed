"""This machine's TCP sockets as the kernel lists them (/proc/net/tcp and tcp6), by local port."""

from __future__ import annotations

import ipaddress
from pathlib import Path

# The kernel's codes for the states the tests look at.
LISTEN = "0A"
TIME_WAIT = "06"

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address


def _address(hex_address: str) -> IPAddress:
    """/proc/net/tcp writes an address as 32-bit words in host (little-endian) byte order."""
    raw = bytes.fromhex(hex_address)
    words = b"".join(raw[i : i + 4][::-1] for i in range(0, len(raw), 4))
    return ipaddress.ip_address(words)


def sockets(port: int, state: str) -> list[IPAddress]:
    """The local addresses of the sockets on this local port in this state."""
    found = []
    for table in (Path("/proc/net/tcp"), Path("/proc/net/tcp6")):
        for line in table.read_text().splitlines()[1:]:
            fields = line.split()
            hex_address, hex_port = fields[1].split(":")
            if fields[3] == state and int(hex_port, 16) == port:
                found.append(_address(hex_address))
    return found


def is_loopback(address: IPAddress) -> bool:
    """Loopback, also as an IPv4 address mapped into IPv6 (how gRPC listens on 127.0.0.1)."""
    mapped = getattr(address, "ipv4_mapped", None)
    return address.is_loopback or (mapped is not None and mapped.is_loopback)
