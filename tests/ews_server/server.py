"""A protocol-faithful Exchange Web Services server on loopback, for tests.

SOAP 1.1 over real HTTP/1.1 (``http.server.ThreadingHTTPServer``), answering what exchangelib 5.6
sends to an Exchange Server 2016 endpoint: GetFolder, Subscribe (streaming), GetStreamingEvents,
GetItem, FindItem, Unsubscribe. Any other operation (``SyncFolderItems`` included) is recorded in
``requests`` and answered with an ``ErrorInvalidOperation`` SOAP fault.

Authentication: Basic and ``Bearer`` (OAuth2, ``add_token``) per request; NTLM per connection as
IIS does it (``ntlm_user_file``, see ``ntlm.py``). ``tls=`` serves HTTPS.

``GetStreamingEvents`` is a long-lived chunked response: one complete SOAP envelope per chunk —
notifications as they happen, ``ConnectionStatus`` ``OK`` keep-alives every ``keepalive_seconds``,
and a final ``ConnectionStatus`` ``Closed`` once ``ConnectionTimeout`` minutes have passed. Test time
runs faster than wall-clock minutes: ``seconds_per_minute`` scales ``ConnectionTimeout``.

Fault injection (all thread-safe, callable while clients are connected):

- ``drop_streams()``: reset (or FIN, ``how="fin"``) open streaming connections mid-response;
- ``cut_next_notification()``: write half of the next notification envelope, then reset; the
  events in it are lost for the subscription, as on a real server;
- ``expire_subscription(id)``: the subscription is gone (``ErrorSubscriptionNotFound`` next time);
  open streams for it end with ``ConnectionStatus`` ``Closed``;
- ``deliver(..., notify=False)``: "missed events" — the item exists but no event mentions it
  (``update_item`` / ``move_item`` / ``copy_item`` / ``delete_item`` take ``notify=False`` too:
  the change happens, no event ever tells);
- ``fail_requests(count, status=503)``: plain HTTP errors for the next requests (optionally one
  operation only), or EWS SOAP faults such as ``ErrorServerBusy`` with ``soap_code=``;
- ``stall_streams()``: stop writing on open (and new) streams but keep the sockets open.

Usage::

    with EwsTestServer(seconds_per_minute=2.0, keepalive_seconds=0.5) as ews:
        ews.add_mailbox("user@example.com", "secret")
        item = ews.deliver("user@example.com", mime_bytes)
"""

from __future__ import annotations

import base64
import itertools
import logging
import select
import socket
import ssl
import struct
import threading
import time
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from datetime import datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from .mailbox import Event, ExchangeStore, Item, Mailbox, Subscription
from .ntlm import NtlmAcceptor, NtlmFailed, write_user_file
from .operations import OPERATIONS
from .soap import (
    ResponseError,
    SoapFault,
    child,
    envelope,
    error_message,
    ews_datetime,
    fault_envelope,
    m,
    operation_response,
    s,
    success_message,
    t,
)

log = logging.getLogger(__name__)

ENDPOINT_PATH = "/EWS/Exchange.asmx"
_CHALLENGE_SENT = "<ntlm challenge sent>"


@dataclass
class RequestRecord:
    operation: str
    address: str | None
    status: int
    body: bytes = field(repr=False, default=b"")


@dataclass
class _HttpFailure:
    remaining: int
    status: int
    operation: str | None
    retry_after: int | None
    soap_code: str | None


@dataclass
class _Stream:
    """One open GetStreamingEvents response."""

    stream_id: int
    sub_ids: list[str]
    generations: dict[str, int]
    sock: socket.socket
    drop: str | None = None  # "reset" | "fin"
    stalled: bool = False
    pending_close: list[str] = field(default_factory=list)


class EwsTestServer:
    def __init__(
        self,
        *,
        seconds_per_minute: float = 60.0,
        keepalive_seconds: float = 20.0,
        subscription_idle_seconds: float = 30 * 60,
        host: str = "127.0.0.1",
        port: int = 0,
        tls: ssl.SSLContext | None = None,
        ntlm_user_file: Path | None = None,
    ) -> None:
        self.store = ExchangeStore(subscription_idle_seconds=subscription_idle_seconds)
        self.seconds_per_minute = seconds_per_minute
        self.keepalive_seconds = keepalive_seconds
        self.requests: list[RequestRecord] = []
        #: NTLM handshakes completed (NEGOTIATE, CHALLENGE, AUTHENTICATE), one per connection.
        self.ntlm_handshakes = 0
        self._tokens: dict[str, str] = {}
        self._passwords: dict[str, str] = {}
        self.ntlm_user_file = ntlm_user_file
        self._failures: list[_HttpFailure] = []
        self._streams: dict[int, _Stream] = {}
        self._stream_ids = itertools.count(1)
        self._cut_next = False
        self._stall_new = False
        self._closing = False
        self._host = host
        self._httpd = ThreadingHTTPServer((host, port), _Handler)
        self._httpd.daemon_threads = True
        self._scheme = "http"
        if tls is not None:
            # Handshakes happen on accept; a client that rejects the certificate only costs
            # that accept (socketserver swallows the OSError).
            self._httpd.socket = tls.wrap_socket(self._httpd.socket, server_side=True)
            self._scheme = "https"
        self._httpd.ews = self  # type: ignore[attr-defined]
        self._thread: threading.Thread | None = None

    # -- lifecycle -----------------------------------------------------------------------------

    @property
    def url(self) -> str:
        return f"{self._scheme}://{self._host}:{self._httpd.server_port}{ENDPOINT_PATH}"

    def start(self) -> EwsTestServer:
        self._thread = threading.Thread(target=self._httpd.serve_forever, name="ews-server")
        self._thread.daemon = True
        self._thread.start()
        return self

    def stop(self) -> None:
        with self.store.cond:
            self._closing = True
            self.store.cond.notify_all()
        self._httpd.shutdown()
        self._httpd.server_close()
        if self._thread is not None:
            self._thread.join()

    def __enter__(self) -> EwsTestServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- state -------------------------------------------------------------------------------

    def add_mailbox(self, address: str, password: str) -> Mailbox:
        mailbox = self.store.add_mailbox(address, password)
        if self.ntlm_user_file is not None:
            self._passwords[mailbox.address] = password
            write_user_file(self.ntlm_user_file, self._passwords.items())
        return mailbox

    def add_token(self, token: str, address: str) -> None:
        """Accept ``Authorization: Bearer <token>`` (OAuth2) for ``address``."""
        self._tokens[token] = address.lower()

    def deliver(
        self,
        address: str,
        mime: bytes,
        *,
        folder: str = "inbox",
        received: datetime | None = None,
        notify: bool = True,
    ) -> Item:
        return self.store.deliver(address, mime, folder=folder, received=received, notify=notify)

    def update_item(
        self,
        address: str,
        item_id: str,
        *,
        is_read: bool | None = None,
        categories: list[str] | None = None,
        flag_status: int | None = None,
        notify: bool = True,
    ) -> Item:
        """A client marks the item read/unread, sets its categories or its follow-up flag
        (``flag_status``: PidTagFlagStatus, 2 flagged, 1 complete, 0 none) (``UpdateItem``)."""
        return self.store.update_item(
            address,
            item_id,
            is_read=is_read,
            categories=categories,
            flag_status=flag_status,
            notify=notify,
        )

    def move_item(self, address: str, item_id: str, folder: str, *, notify: bool = True) -> Item:
        """A client moves the item (``MoveItem``); it gets a new ItemId."""
        return self.store.move_item(address, item_id, folder, notify=notify)

    def copy_item(self, address: str, item_id: str, folder: str, *, notify: bool = True) -> Item:
        """A client copies the item (``CopyItem``); the copy has its own ItemId."""
        return self.store.copy_item(address, item_id, folder, notify=notify)

    def delete_item(self, address: str, item_id: str, *, notify: bool = True) -> None:
        """A client deletes the item for good (``DeleteItem``, ``HardDelete``)."""
        self.store.delete_item(address, item_id, notify=notify)

    def operations(self) -> list[str]:
        with self.store.cond:
            return [r.operation for r in self.requests]

    def subscription_ids(self, address: str | None = None, *, alive: bool = True) -> list[str]:
        with self.store.cond:
            self.store.expire_idle()
            return [
                sid
                for sid, sub in self.store.subscriptions.items()
                if (not alive or sub.alive) and (address is None or sub.address == address.lower())
            ]

    def open_streams(self, sub_id: str | None = None) -> int:
        with self.store.cond:
            return sum(1 for st in self._streams.values() if sub_id is None or sub_id in st.sub_ids)

    def wait_until(self, predicate: Any, timeout: float = 30.0) -> bool:
        """Wait until ``predicate()`` is true, re-checking after every server event (and at
        least every 0.1 s). The predicate runs without the server's lock held, so it may be
        slow (a Kafka read) without stalling the server."""
        deadline = time.monotonic() + timeout
        while not predicate():
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return False
            with self.store.cond:
                self.store.cond.wait(min(remaining, 0.1))
        return True

    # -- fault injection ----------------------------------------------------------------------

    def drop_streams(self, how: str = "reset") -> int:
        """Abort every open streaming response without its final chunk; returns how many."""
        if how not in ("reset", "fin"):
            raise ValueError("how must be 'reset' or 'fin'")
        with self.store.cond:
            for st in self._streams.values():
                st.drop = how
            self.store.cond.notify_all()
            return len(self._streams)

    def cut_next_notification(self) -> None:
        with self.store.cond:
            self._cut_next = True

    def expire_subscription(self, sub_id: str) -> None:
        self.store.kill_subscription(sub_id)

    def fail_requests(
        self,
        count: int = 1,
        *,
        status: int = 503,
        operation: str | None = None,
        retry_after: int | None = None,
        soap_code: str | None = None,
    ) -> None:
        with self.store.cond:
            self._failures.append(_HttpFailure(count, status, operation, retry_after, soap_code))

    def clear_failures(self) -> None:
        """Forget the failures ``fail_requests`` still had to inject."""
        with self.store.cond:
            self._failures.clear()

    def stall_streams(self, stalled: bool = True) -> None:
        """Stop (or resume) writing on open streams and on streams opened from now on."""
        with self.store.cond:
            self._stall_new = stalled
            for st in self._streams.values():
                st.stalled = stalled
            self.store.cond.notify_all()

    # -- request handling (called from handler threads) ----------------------------------------

    def _take_failure(self, operation: str) -> _HttpFailure | None:
        with self.store.cond:
            for failure in self._failures:
                if failure.remaining > 0 and failure.operation in (None, operation):
                    failure.remaining -= 1
                    return failure
            return None

    def _authenticate(self, header: str | None) -> str | None:
        if not header:
            return None
        scheme, _, value = header.partition(" ")
        if scheme.lower() == "bearer":
            return self._tokens.get(value.strip())
        if scheme.lower() != "basic":
            return None
        try:
            user, _, password = base64.b64decode(value).decode().partition(":")
        except (ValueError, UnicodeDecodeError):
            return None
        user = user.rsplit("\\", 1)[-1].lower()  # DOMAIN\user or user@domain
        mailbox = self.store.mailboxes.get(user)
        return user if mailbox is not None and mailbox.password == password else None

    def _mailbox_of_principal(self, principal: str) -> str | None:
        """``\\user@example.com`` or ``EXAMPLE\\user`` (what NTLM authenticated) -> address."""
        name = principal.rsplit("\\", 1)[-1].lower()
        for address in self.store.mailboxes:
            if name in (address, address.split("@")[0]):
                return address
        return None

    def _record(self, operation: str, address: str | None, status: int, body: bytes) -> None:
        with self.store.cond:
            self.requests.append(RequestRecord(operation, address, status, body))
            self.store.cond.notify_all()


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "Microsoft-IIS/10.0"
    sys_version = ""

    @property
    def ews(self) -> EwsTestServer:
        return self.server.ews  # type: ignore[attr-defined,no-any-return]

    def log_message(self, format: str, *args: Any) -> None:
        log.debug("ews-server: " + format, *args)

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length", "0"))
        raw = self.rfile.read(length)
        if self.path.split("?")[0].lower() != ENDPOINT_PATH.lower():
            self._send(404, b"Not Found", "text/plain")
            return
        address = self._authenticated_address()
        if address is _CHALLENGE_SENT:
            return
        try:
            request = ET.fromstring(raw)
            body = request.find(s("Body"))
            operation_elem = body[0] if body is not None and len(body) else None
        except ET.ParseError:
            operation_elem = None
        operation = operation_elem.tag.rsplit("}", 1)[-1] if operation_elem is not None else "?"
        if address is None:
            self.ews._record(operation, None, 401, raw)
            self._send(401, b"", "text/plain", self._auth_offers())
            return
        failure = self.ews._take_failure(operation)
        if failure is not None:
            self.ews._record(operation, address, failure.status, raw)
            self._send_failure(failure)
            return
        if operation_elem is None:
            self.ews._record(operation, address, 500, raw)
            self._send_fault(
                SoapFault("ErrorSchemaValidation", "The request is not a SOAP message.")
            )
            return
        if operation == "GetStreamingEvents":
            self.ews._record(operation, address, 200, raw)
            _StreamWriter(self, address, operation_elem).run()
            return
        handler = OPERATIONS.get(operation)
        if handler is None:
            self.ews._record(operation, address, 500, raw)
            text = f"{operation} is not implemented by the EWS test server."
            self._send_fault(SoapFault("ErrorInvalidOperation", text))
            return
        try:
            response = handler(self.ews.store, address, operation_elem)
        except SoapFault as fault:
            self.ews._record(operation, address, 500, raw)
            self._send_fault(fault)
            return
        except ResponseError as e:
            response = operation_response(operation, [error_message(operation, e.code, e.text)])
        self.ews._record(operation, address, 200, raw)
        headers = []
        if operation == "Subscribe":
            # Exchange pins a subscription to its mailbox server with this cookie.
            headers.append(("Set-Cookie", "X-BackEndOverrideCookie=EXCH01~1942050431; path=/"))
        self._send(200, envelope(response), "text/xml; charset=utf-8", headers)

    def _authenticated_address(self) -> str | None:
        """The mailbox of this request: Basic or Bearer per request, NTLM per connection.

        Returns ``_CHALLENGE_SENT`` when this request was an NTLM NEGOTIATE, answered with the
        401 challenge (the handler instance lives as long as the connection)."""
        header = self.headers.get("Authorization")
        scheme = (header or "").split(" ", 1)[0].lower()
        if scheme in ("ntlm", "negotiate") and self.ews.ntlm_user_file is not None:
            acceptor = getattr(self, "_ntlm", None) or NtlmAcceptor(self.ews.ntlm_user_file)
            self._ntlm = acceptor
            try:
                challenge, principal = acceptor.step(header or "")
            except NtlmFailed:
                return None
            if challenge is not None:
                self._send(401, b"", "text/plain", [("WWW-Authenticate", challenge)])
                return _CHALLENGE_SENT
            self._connection_address = self.ews._mailbox_of_principal(principal or "")
            with self.ews.store.cond:
                self.ews.ntlm_handshakes += 1
            return self._connection_address
        if header:
            return self.ews._authenticate(header)
        return getattr(self, "_connection_address", None)

    def _auth_offers(self) -> list[tuple[str, str]]:
        offers = [("WWW-Authenticate", 'Basic realm="ews"')]
        if self.ews.ntlm_user_file is not None:
            offers[:0] = [("WWW-Authenticate", "NTLM"), ("WWW-Authenticate", "Negotiate")]
        return offers

    def _send(
        self,
        status: int,
        payload: bytes,
        content_type: str,
        headers: list[tuple[str, str]] | None = None,
    ) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(payload)))
        for name, value in headers or []:
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(payload)

    def _send_fault(self, fault: SoapFault) -> None:
        self._send(500, fault_envelope(fault.code, fault.text), "text/xml; charset=utf-8")

    def _send_failure(self, failure: _HttpFailure) -> None:
        if failure.soap_code is not None:
            self._send_fault(SoapFault(failure.soap_code, "Injected fault."))
            return
        headers = []
        if failure.retry_after is not None:
            headers.append(("Retry-After", str(failure.retry_after)))
        page = b"<html><body><h1>Service Unavailable</h1></body></html>"
        self._send(failure.status, page, "text/html", headers)


class _StreamWriter:
    """Writes one GetStreamingEvents response: chunked, one SOAP envelope per chunk."""

    def __init__(self, handler: _Handler, address: str, request: ET.Element) -> None:
        self.handler = handler
        self.ews = handler.ews
        self.store = handler.ews.store
        self.address = address
        self.request = request

    def run(self) -> None:
        sub_ids = [e.text or "" for e in self.request.iter(t("SubscriptionId"))]
        try:
            minutes = int(self.request.findtext(m("ConnectionTimeout"), "0"))
        except ValueError:
            minutes = 0
        self._start_chunked()
        if not 1 <= minutes <= 30:
            self._finish_with_error("ErrorInvalidArgument", "ConnectionTimeout must be 1-30.", [])
            return
        with self.store.cond:
            subs = [self.store.live_subscription(sid) for sid in sub_ids]
            missing = [sid for sid, sub in zip(sub_ids, subs, strict=True) if sub is None]
            if not missing:
                stream = self._attach([sub for sub in subs if sub is not None])
        if missing:
            text = "The specified subscription was not found."
            self._finish_with_error("ErrorSubscriptionNotFound", text, missing)
            return
        try:
            self._loop(stream, time.monotonic() + minutes * self.ews.seconds_per_minute)
        except OSError:
            log.debug("ews-server: stream %s: client went away", stream.stream_id)
        finally:
            self._detach(stream)

    # -- attach / detach ------------------------------------------------------------------------

    def _attach(self, subs: list[Subscription]) -> _Stream:
        generations = {}
        for sub in subs:
            sub.generation += 1
            sub.open_connections += 1
            generations[sub.subscription_id] = sub.generation
        stream = _Stream(
            next(self.ews._stream_ids),
            [sub.subscription_id for sub in subs],
            generations,
            self.handler.connection,
            stalled=self.ews._stall_new,
        )
        self.ews._streams[stream.stream_id] = stream
        self.store.cond.notify_all()  # a previous connection for these subscriptions must end
        return stream

    def _detach(self, stream: _Stream) -> None:
        with self.store.cond:
            self.ews._streams.pop(stream.stream_id, None)
            for sid in stream.sub_ids:
                sub = self.store.subscriptions[sid]
                sub.open_connections -= 1
                sub.last_detached = time.monotonic()
            self.store.cond.notify_all()

    # -- the loop -------------------------------------------------------------------------------

    def _loop(self, stream: _Stream, deadline: float) -> None:
        next_keepalive = time.monotonic() + self.ews.keepalive_seconds
        while True:
            action, payload = self._next_action(stream, deadline, next_keepalive)
            if action == "drop":
                self._abort(payload == "reset")
                return
            if action == "stalled":
                if self._client_gone():
                    return
                continue
            if action == "cut":
                self._write_chunk(payload[: len(payload) // 2], declared=len(payload))
                self._abort(reset=True)
                return
            self._write_chunk(payload)
            if action in ("closed", "superseded"):
                self._end_chunked()
                return
            if action == "keepalive":
                next_keepalive = time.monotonic() + self.ews.keepalive_seconds

    def _next_action(
        self, stream: _Stream, deadline: float, next_keepalive: float
    ) -> tuple[str, Any]:
        with self.store.cond:
            while True:
                if self.ews._closing:
                    return "drop", "fin"
                if stream.drop is not None:
                    return "drop", stream.drop
                if stream.stalled:
                    self.store.cond.wait(0.2)
                    return "stalled", None
                superseded = [
                    sid
                    for sid in stream.sub_ids
                    if self.store.subscriptions[sid].generation != stream.generations[sid]
                ]
                if superseded:
                    text = "New event stream connection opened for this subscription."
                    message = error_message(
                        "GetStreamingEvents", "ErrorNewEventStreamConnectionOpened", text
                    )
                    _error_subscription_ids(message, superseded)
                    return "superseded", _streaming_envelope(message)
                events = {
                    sid: self.store.subscriptions[sid].pending
                    for sid in stream.sub_ids
                    if self.store.subscriptions[sid].pending
                }
                if events:
                    for sid in events:
                        self.store.subscriptions[sid].pending = []
                    payload = _notifications_envelope(events)
                    if self.ews._cut_next:
                        self.ews._cut_next = False
                        return "cut", payload
                    return "notify", payload
                now = time.monotonic()
                dead = [sid for sid in stream.sub_ids if not self.store.subscriptions[sid].alive]
                if now >= deadline or dead:
                    return "closed", _status_envelope("Closed")
                if now >= next_keepalive:
                    return "keepalive", _status_envelope("OK")
                self.store.cond.wait(min(deadline, next_keepalive) - now)

    # -- HTTP framing ---------------------------------------------------------------------------

    def _start_chunked(self) -> None:
        h = self.handler
        h.send_response(200)
        h.send_header("Content-Type", "text/xml; charset=utf-8")
        h.send_header("Transfer-Encoding", "chunked")
        h.send_header("X-BEServer", "EXCH01")
        h.end_headers()
        h.wfile.flush()

    def _write_chunk(self, data: bytes, declared: int | None = None) -> None:
        """One HTTP chunk; ``declared`` announces more bytes than written (a cut-off chunk)."""
        w = self.handler.wfile
        w.write(f"{declared or len(data):X}\r\n".encode() + data)
        if declared is None:
            w.write(b"\r\n")
        w.flush()

    def _end_chunked(self) -> None:
        self.handler.wfile.write(b"0\r\n\r\n")
        self.handler.wfile.flush()

    def _finish_with_error(self, code: str, text: str, sub_ids: list[str]) -> None:
        message = error_message("GetStreamingEvents", code, text)
        _error_subscription_ids(message, sub_ids)
        try:
            self._write_chunk(_streaming_envelope(message))
            self._end_chunked()
        except OSError:
            pass

    def _abort(self, reset: bool) -> None:
        sock = self.handler.connection
        try:
            if reset:
                # SO_LINGER 0: close() sends RST, like a load balancer killing the connection.
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            else:
                sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self.handler.close_connection = True
        sock.close()

    def _client_gone(self) -> bool:
        sock = self.handler.connection
        try:
            readable, _, _ = select.select([sock], [], [], 0)
            return bool(readable) and sock.recv(1, socket.MSG_PEEK) == b""
        except OSError:
            return True


# -- streaming envelopes (messages.xsd GetStreamingEventsResponseMessageType) ----------------------


def _streaming_envelope(message: ET.Element) -> bytes:
    return envelope(operation_response("GetStreamingEvents", [message]))


def _status_envelope(status: str) -> bytes:
    message = success_message("GetStreamingEvents")
    child(message, m("ConnectionStatus"), status)
    return _streaming_envelope(message)


def _error_subscription_ids(message: ET.Element, sub_ids: list[str]) -> None:
    if sub_ids:
        ids = child(message, m("ErrorSubscriptionIds"))
        for sid in sub_ids:
            child(ids, m("SubscriptionId"), sid)


def _notifications_envelope(events: dict[str, list[Event]]) -> bytes:
    message = success_message("GetStreamingEvents")
    notifications = child(message, m("Notifications"))
    for sid, batch in events.items():
        notification = child(notifications, m("Notification"))
        child(notification, t("SubscriptionId"), sid)
        child(notification, t("PreviousWatermark"), batch[0].watermark)
        child(notification, t("MoreEvents"), "false")
        for event in batch:
            elem = child(notification, t(event.kind))
            child(elem, t("Watermark"), event.watermark)
            child(elem, t("TimeStamp"), ews_datetime(event.timestamp))
            if event.item_id is not None:
                child(elem, t("ItemId"), Id=event.item_id[0], ChangeKey=event.item_id[1])
            if event.folder_id is not None:
                child(elem, t("FolderId"), Id=event.folder_id[0], ChangeKey=event.folder_id[1])
            parent_id, parent_ck = event.parent_folder_id
            child(elem, t("ParentFolderId"), Id=parent_id, ChangeKey=parent_ck)
            if event.old_item_id is not None:
                child(elem, t("OldItemId"), Id=event.old_item_id[0], ChangeKey=event.old_item_id[1])
            if event.old_parent_folder_id is not None:
                old_id, old_ck = event.old_parent_folder_id
                child(elem, t("OldParentFolderId"), Id=old_id, ChangeKey=old_ck)
            if event.unread_count is not None:
                child(elem, t("UnreadCount"), str(event.unread_count))
    return _streaming_envelope(message)
