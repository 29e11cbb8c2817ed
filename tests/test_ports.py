"""The one port check: a port is taken while a server listens on it, and free again as soon as
the server has stopped, although the connections it closed still wait in TIME_WAIT."""

from __future__ import annotations

import http.server
import socket
import threading
import time
import urllib.request

import pytest

from tests import netstat
from tritonscale.local.ports import LOOPBACK, free_port, free_ports, port_is_taken

pytestmark = pytest.mark.unit


class _Hello(http.server.BaseHTTPRequestHandler):
    """HTTP/1.0: the server closes each connection after answering, as Triton does when asked."""

    def do_GET(self) -> None:
        self.send_response(200)
        self.end_headers()
        self.wfile.write(b"hello")

    def log_message(self, *args: object) -> None:
        pass


def _wait_for_time_wait(port: int, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not netstat.sockets(port, netstat.TIME_WAIT):
        assert time.monotonic() < deadline, f"no connection on port {port} reached TIME_WAIT"
        time.sleep(0.05)


def test_a_stopped_servers_port_is_free_while_its_closed_connections_wait() -> None:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Hello)
    port = server.server_address[1]
    thread = threading.Thread(target=server.serve_forever, name="hello-server", daemon=True)
    thread.start()
    try:
        assert port_is_taken(port)
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=10) as answer:
            assert answer.read() == b"hello"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)
    assert not thread.is_alive(), "the HTTP server did not stop"
    _wait_for_time_wait(port)
    # The case: a bind without SO_REUSEADDR (the demo's old check) still fails ...
    with socket.socket() as plain, pytest.raises(OSError):
        plain.bind(("127.0.0.1", port))
    # ... while a server, which sets it, can bind: the port is free.
    assert not port_is_taken(port)


def test_a_port_listened_on_all_addresses_is_taken_on_loopback_too() -> None:
    with socket.socket() as listener:
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("0.0.0.0", 0))
        listener.listen()
        port = listener.getsockname()[1]
        assert port_is_taken(port)
        assert port_is_taken(port, "0.0.0.0")


def test_a_free_port_is_not_taken() -> None:
    port = free_port()
    assert 0 < port < 65536
    assert not port_is_taken(port)


def test_an_address_of_another_machine_is_an_error_not_a_taken_port() -> None:
    with pytest.raises(OSError, match="Cannot assign requested address"):
        port_is_taken(free_port(), "192.0.2.7")  # TEST-NET-1: never this machine's


def test_ports_drawn_together_are_never_the_same() -> None:
    """One after the other, the kernel may hand out again a port it just handed out (a server
    with two ports that came out the same would not start); drawn together, it cannot."""
    ports = free_ports(64)
    assert len(set(ports)) == 64
    assert all(not port_is_taken(port) for port in ports)  # released once drawn


def test_ports_are_drawn_on_each_hosts_address() -> None:
    ports = free_ports(3, [LOOPBACK, "0.0.0.0", LOOPBACK])
    assert len(set(ports)) == 3
    with pytest.raises(ValueError, match="3 ports asked for 2 hosts"):
        free_ports(3, [LOOPBACK, LOOPBACK])
