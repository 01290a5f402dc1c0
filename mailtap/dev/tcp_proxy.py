"""A loopback TCP proxy with fault controls, for tests and `mailtap soak` (no tc netem or
toxiproxy on these machines).

    with TcpProxy("127.0.0.1", dovecot_port) as proxy:
        connect to proxy.port ...
        proxy.stall()    # stop forwarding both ways; connections stay open (a silent peer)
        proxy.resume()
        proxy.cut()      # reset every open connection (new ones are still accepted)
        proxy.delay = 0.2  # seconds added before forwarding each chunk
        proxy.refuse = True  # close new connections at once

``TcpProxy(host, port, tls=server_context)`` terminates TLS (implicit TLS, as on port 993) in
front of a plaintext server: a TLS endpoint with a test certificate (trustme).

Threaded: one accept thread, two pump threads per connection. A stalled pump does not read, so
the bytes wait in the kernel's buffers exactly as they would behind a dead middlebox.
"""

from __future__ import annotations

import contextlib
import select
import socket
import ssl
import struct
import threading
import time
from types import TracebackType

_POLL_S = 0.05
_CHUNK = 65536


class TcpProxy:
    def __init__(
        self,
        target_host: str,
        target_port: int,
        listen_host: str = "127.0.0.1",
        tls: ssl.SSLContext | None = None,
    ) -> None:
        self.target = (target_host, target_port)
        self.tls = tls
        self.handshake_failures = 0
        self._server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._server.bind((listen_host, 0))
        self._server.listen(64)
        self.host = listen_host
        self.port: int = self._server.getsockname()[1]
        self.delay = 0.0
        self.refuse = False
        self.accepted = 0
        self._stalled = threading.Event()
        self._closed = threading.Event()
        self._lock = threading.Lock()
        self._pairs: list[tuple[socket.socket, socket.socket]] = []
        self._threads: list[threading.Thread] = []
        self._acceptor = threading.Thread(target=self._accept_loop, daemon=True, name="tcp-proxy")

    def __enter__(self) -> TcpProxy:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def start(self) -> TcpProxy:
        self._acceptor.start()
        return self

    # --- controls ------------------------------------------------------------------------------

    def stall(self) -> None:
        self._stalled.set()

    def resume(self) -> None:
        self._stalled.clear()

    @property
    def stalled(self) -> bool:
        return self._stalled.is_set()

    def cut(self) -> int:
        """Reset every open connection (RST, not FIN). Returns how many were cut."""
        with self._lock:
            pairs, self._pairs = self._pairs, []
        for client, upstream in pairs:
            for sock in (client, upstream):
                _reset(sock)
        return len(pairs)

    @property
    def open_connections(self) -> int:
        with self._lock:
            return len(self._pairs)

    def close(self) -> None:
        self._closed.set()
        with contextlib.suppress(OSError):
            self._server.close()
        self.cut()
        for thread in self._threads:
            thread.join(2)

    # --- plumbing ------------------------------------------------------------------------------

    def _accept_loop(self) -> None:
        while not self._closed.is_set():
            try:
                if not _readable(self._server):
                    continue
                client, _ = self._server.accept()
            except OSError:
                return
            if self.refuse:
                _reset(client)
                continue
            if self.tls is not None:
                try:
                    client.settimeout(5)
                    client = self.tls.wrap_socket(client, server_side=True)
                    client.settimeout(None)
                except (OSError, ssl.SSLError):
                    self.handshake_failures += 1
                    _reset(client)
                    continue
            try:
                upstream = socket.create_connection(self.target, timeout=5)
            except OSError:
                _reset(client)
                continue
            self.accepted += 1
            pair = (client, upstream)
            with self._lock:
                self._pairs.append(pair)
                # A long run (`mailtap soak`) opens thousands of connections: forget ended pumps.
                self._threads = [t for t in self._threads if t.is_alive()]
            ended = threading.Semaphore(0)
            for src, dst in ((client, upstream), (upstream, client)):
                thread = threading.Thread(
                    target=self._pump, args=(src, dst, pair, ended), daemon=True
                )
                self._threads.append(thread)
                thread.start()

    def _pump(
        self,
        src: socket.socket,
        dst: socket.socket,
        pair: tuple[socket.socket, socket.socket],
        ended: threading.Semaphore,
    ) -> None:
        try:
            while not self._closed.is_set():
                if self._stalled.is_set():
                    time.sleep(_POLL_S)
                    continue
                buffered = isinstance(src, ssl.SSLSocket) and src.pending() > 0
                if not buffered and not _readable(src):
                    continue
                data = src.recv(_CHUNK)
                if not data:
                    break
                if self.delay:
                    time.sleep(self.delay)
                while self._stalled.is_set() and not self._closed.is_set():
                    time.sleep(_POLL_S)
                dst.sendall(data)
        except (OSError, ValueError):  # ValueError: poll() on a socket cut() just closed
            pass
        finally:
            with contextlib.suppress(OSError):
                dst.shutdown(socket.SHUT_WR)
            # The second pump of a pair to end closes both sockets (no descriptor leak).
            if ended.acquire(blocking=False):
                self._forget(pair)
            else:
                ended.release()

    def _forget(self, pair: tuple[socket.socket, socket.socket]) -> None:
        with self._lock:
            if pair in self._pairs:
                self._pairs.remove(pair)
        for sock in pair:
            with contextlib.suppress(OSError):
                sock.close()


def _readable(sock: socket.socket) -> bool:
    """poll(2), not select(2): select cannot watch a descriptor numbered 1024 or more, which a
    proxy of hundreds of connections (`mailtap soak`: 200 IMAP folders) reaches; every pump
    past it then ended at once and the client saw EOF."""
    poller = select.poll()
    poller.register(sock, select.POLLIN | select.POLLPRI)
    return bool(poller.poll(_POLL_S * 1000))


def _reset(sock: socket.socket) -> None:
    with contextlib.suppress(OSError):
        # SO_LINGER 0: close() sends RST, like a middlebox dropping the connection state.
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    with contextlib.suppress(OSError):
        sock.close()
