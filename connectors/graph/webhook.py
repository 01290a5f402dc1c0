"""The built-in webhook endpoint for Graph's change notifications (``notifications.mode:
webhook``). A notification only wakes a folder up for a delta round: it is never the source of
truth, so what this endpoint loses (a restart, a dropped connection, Graph giving up after 4
hours of retries) the periodic sweep finds.

What it answers (learn.microsoft.com/graph/change-notifications-delivery-webhooks):

- ``POST <path>?validationToken=<token>``: the validation handshake of a new subscription:
  ``200``, ``text/plain``, the token URL-decoded, within 10 s;
- ``POST /notify`` with ``{"value": [{"subscriptionId", "clientState", "changeType", ...}]}``:
  ``202`` at once (Graph wants an answer within 3 s); a notification whose ``clientState`` is not
  ours is ignored (someone else's, or forged: it cannot make us publish anything, only sync);
- ``POST /lifecycle`` with ``{"value": [{"subscriptionId", "clientState", "lifecycleEvent"}]}``
  (learn.microsoft.com/graph/change-notifications-lifecycle-events): ``reauthorizationRequired``,
  ``subscriptionRemoved`` and ``missed`` are handed to ``on_lifecycle``.
"""

from __future__ import annotations

import json
import logging
import ssl
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

from connectors.graph.config import NotificationSettings
from connectors.graph.inbox import NotificationInbox

log = logging.getLogger(__name__)

__all__ = ["WebhookListener"]

#: A notification collection is small (ids, no resource data); a bigger body is refused.
MAX_BODY_BYTES = 1_000_000


class WebhookListener:
    """The HTTP(S) listener; what a collection means is the inbox's."""

    def __init__(self, settings: NotificationSettings, inbox: NotificationInbox) -> None:
        self.inbox = inbox
        self._httpd = ThreadingHTTPServer((settings.listen_host, settings.listen_port), _Handler)
        self._httpd.daemon_threads = True
        self._httpd.listener = self  # type: ignore[attr-defined]
        if settings.certificate_file is not None and settings.key_file is not None:
            context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
            context.load_cert_chain(settings.certificate_file, settings.key_file)
            self._httpd.socket = context.wrap_socket(self._httpd.socket, server_side=True)
        self._thread = threading.Thread(
            target=self._httpd.serve_forever, name="graph-webhook", daemon=True
        )

    @property
    def port(self) -> int:
        return int(self._httpd.server_address[1])

    def start(self) -> None:
        self._thread.start()
        log.info("graph webhook listening on port %d", self.port)

    def stop(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join(10)


class _Handler(BaseHTTPRequestHandler):
    server: ThreadingHTTPServer

    def do_POST(self) -> None:
        listener: WebhookListener = self.server.listener  # type: ignore[attr-defined]
        parts = urlsplit(self.path)
        token = parse_qs(parts.query).get("validationToken")
        length = int(self.headers.get("Content-Length") or 0)
        if length > MAX_BODY_BYTES:
            self._answer(413, b"")
            return
        body = self.rfile.read(length) if length else b""
        if token:
            self._answer(200, token[0].encode(), "text/plain")
            return
        try:
            parsed = json.loads(body or b"{}")
        except ValueError:
            self._answer(400, b"")
            return
        listener.inbox.collection(parsed)
        self._answer(202, b"")

    def _answer(self, status: int, body: bytes, content_type: str = "text/plain") -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        log.debug("graph webhook: " + format, *args)
