"""The fault proxy (tests and `mailtap soak`) against a loopback echo server: it forwards, a cut
resets, a stall holds bytes until resumed, and it keeps working once the process has more than
1024 descriptors open (select() could not; `mailtap soak` with 100 mailboxes got there)."""

from __future__ import annotations

import contextlib
import socket
import threading
from collections.abc import Iterator

import pytest

from mailtap.dev.tcp_proxy import TcpProxy
from tests.support.scaleout import wait_until


@pytest.fixture
def echo() -> Iterator[int]:
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(16)

    def serve(conn: socket.socket) -> None:
        with conn, contextlib.suppress(OSError):
            while data := conn.recv(4096):
                conn.sendall(data)

    def accept() -> None:
        with contextlib.suppress(OSError):
            while True:
                conn, _ = server.accept()
                threading.Thread(target=serve, args=(conn,), daemon=True).start()

    threading.Thread(target=accept, daemon=True).start()
    yield server.getsockname()[1]
    server.close()


def roundtrip(port: int, payload: bytes = b"ping", timeout: float = 5.0) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as sock:
        sock.sendall(payload)
        return sock.recv(4096)


def test_forwards_and_a_cut_resets_open_connections(echo: int) -> None:
    with TcpProxy("127.0.0.1", echo) as proxy:
        assert roundtrip(proxy.port) == b"ping"
        # The closed connection's pumps notice the end within a poll interval; until they do,
        # cut() would count (and reset) that pair too (CI saw 2 on a loaded machine).
        wait_until(lambda: proxy.open_connections == 0, "the closed pair forgotten", 10)
        sock = socket.create_connection(("127.0.0.1", proxy.port), timeout=5)
        sock.sendall(b"a")
        assert sock.recv(10) == b"a"
        assert proxy.cut() == 1
        with pytest.raises(OSError):
            sock.sendall(b"b")
            if not sock.recv(10):
                raise ConnectionResetError("closed")
        sock.close()
        assert roundtrip(proxy.port) == b"ping"  # new connections are still accepted


def test_a_stall_holds_the_bytes_until_resumed(echo: int) -> None:
    with TcpProxy("127.0.0.1", echo) as proxy:
        sock = socket.create_connection(("127.0.0.1", proxy.port), timeout=0.5)
        proxy.stall()
        sock.sendall(b"held")
        with pytest.raises(TimeoutError):
            sock.recv(10)
        proxy.resume()
        sock.settimeout(5)
        assert sock.recv(10) == b"held"
        sock.close()


def test_descriptors_past_1024_still_forward(echo: int) -> None:
    hog = [open("/dev/null") for _ in range(1100)]  # noqa: SIM115 - closed below
    try:
        with TcpProxy("127.0.0.1", echo) as proxy:
            assert roundtrip(proxy.port) == b"ping"
    finally:
        for handle in hog:
            handle.close()
