"""A TLS gate in front of the real schema registry, as a company puts one (an ingress, nginx):
HTTPS with its own server certificate, a client certificate required (mTLS), HTTP basic auth
checked, every request that passes forwarded to the registry as it came.

The registry of the dev stack (Apicurio) would need an OIDC server for its own basic auth; the
gate gives mailtap's registry client the same conversation a secured registry has: a TLS
handshake that needs the CA and the client certificate, ``401`` for a wrong password, the
registry's own answers otherwise.

Example::

    gate = RegistryGate(upstream, ca, server_pair, "mailtap", "secret").start()
    url = gate.url  # https://127.0.0.1:PORT/apis/ccompat/v7
    ...
    gate.stop()
"""

from __future__ import annotations

import base64
import ssl
import threading
import urllib.error
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import urlsplit

from mailtap.dev.certs import KeyPair

#: The upstream registry answers within this many seconds when it is up (a registration).
UPSTREAM_TIMEOUT_S = 30.0


class RegistryGate:
    """HTTPS + client certificate + basic auth in front of ``upstream`` (a registry URL)."""

    def __init__(
        self, upstream: str, ca: Path, server: KeyPair, username: str, password: str
    ) -> None:
        parts = urlsplit(upstream)
        self._upstream_root = f"{parts.scheme}://{parts.netloc}"
        self._path = parts.path
        self._expected = "Basic " + base64.b64encode(f"{username}:{password}".encode()).decode()
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH, cafile=str(ca))
        context.verify_mode = ssl.CERT_REQUIRED
        context.load_cert_chain(str(server.certificate), str(server.key))
        self._context = context
        #: HTTP status -> number of answers the gate itself gave (401) or forwarded.
        self.answers: dict[int, int] = {}
        self._lock = threading.Lock()
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self._server.socket = context.wrap_socket(self._server.socket, server_side=True)
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"https://127.0.0.1:{self._server.server_address[1]}{self._path}"

    def start(self) -> RegistryGate:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(10)

    def _count(self, status: int) -> None:
        with self._lock:
            self.answers[status] = self.answers.get(status, 0) + 1

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        gate = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: object) -> None:
                pass  # the test reads gate.answers; stderr lines would only be noise

            def _forward(self) -> None:
                if self.headers.get("Authorization") != gate._expected:
                    gate._count(401)
                    body = b'{"error_code": 401, "message": "Unauthorized"}'
                    self.send_response(401)
                    self.send_header("WWW-Authenticate", 'Basic realm="registry"')
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(body)))
                    self.end_headers()
                    self.wfile.write(body)
                    return
                length = int(self.headers.get("Content-Length") or 0)
                data = self.rfile.read(length) if length else None
                request = urllib.request.Request(
                    gate._upstream_root + self.path, data=data, method=self.command
                )
                for name in ("Content-Type", "Accept"):
                    if self.headers.get(name):
                        request.add_header(name, self.headers[name])
                try:
                    with urllib.request.urlopen(request, timeout=UPSTREAM_TIMEOUT_S) as answer:
                        status, body, kind = answer.status, answer.read(), answer.headers
                except urllib.error.HTTPError as exc:
                    status, body, kind = exc.code, exc.read(), exc.headers
                gate._count(status)
                self.send_response(status)
                self.send_header("Content-Type", kind.get("Content-Type", "application/json"))
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            do_GET = do_POST = do_PUT = do_DELETE = _forward

        return Handler
