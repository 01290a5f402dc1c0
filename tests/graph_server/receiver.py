"""A recording HTTPS webhook endpoint for tests of the Graph test server's notifications.

It answers the validation handshake as the webhooks page asks (200, ``text/plain``, the
decoded token) and records every notification collection; ``status``, ``delay`` and
``echo_validation`` make it misbehave (a 5xx, a slow answer past Graph's 3 s, a failed
handshake). stdlib ``http.server`` on a daemon thread, TLS with a certificate from
``GraphTestServer.issue_webhook_certificate``.
"""

from __future__ import annotations

import json
import ssl
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

from .server import GraphTestServer


class WebhookReceiver:
    def __init__(self, graph: GraphTestServer, folder: Path) -> None:
        pair = graph.issue_webhook_certificate(folder)
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        context.load_cert_chain(pair.certificate, pair.key)
        self.validations: list[str] = []
        self.collections: list[tuple[str, dict[str, Any]]] = []  # (path, body)
        self.status = 202
        self.delay = 0.0
        self.echo_validation = True
        self.cond = threading.Condition()
        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
        self._httpd.daemon_threads = True
        self._httpd.socket = context.wrap_socket(self._httpd.socket, server_side=True)
        self._httpd.receiver = self  # type: ignore[attr-defined]
        self._thread = threading.Thread(target=self._httpd.serve_forever, daemon=True)

    def url(self, path: str = "/notify") -> str:
        return f"https://127.0.0.1:{self._httpd.server_port}{path}"

    def __enter__(self) -> WebhookReceiver:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join(10)

    def notifications(self, path: str | None = None) -> list[dict[str, Any]]:
        with self.cond:
            return [n for p, body in self.collections if path in (None, p) for n in body["value"]]

    def wait_for(
        self, count: int, path: str | None = None, timeout: float = 15.0
    ) -> list[dict[str, Any]]:
        deadline = time.monotonic() + timeout
        with self.cond:
            while len(self.notifications(path)) < count and time.monotonic() < deadline:
                self.cond.wait(0.1)
        return self.notifications(path)


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:
        return None

    def do_POST(self) -> None:
        receiver: WebhookReceiver = self.server.receiver  # type: ignore[attr-defined]
        body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
        parts = urlsplit(self.path)
        token = parse_qs(parts.query).get("validationToken")
        if token:
            with receiver.cond:
                receiver.validations.append(token[0])
                receiver.cond.notify_all()
            answer = token[0] if receiver.echo_validation else "wrong"
            self._answer(200, answer.encode(), "text/plain")
            return
        if receiver.delay:
            time.sleep(receiver.delay)
        with receiver.cond:
            receiver.collections.append((parts.path, json.loads(body)))
            receiver.cond.notify_all()
        self._answer(receiver.status, b"", "text/plain")

    def _answer(self, status: int, payload: bytes, content_type: str) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)
