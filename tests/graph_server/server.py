"""A protocol-faithful Microsoft Graph (mail) server on loopback, for tests.

HTTPS (``tls.py``: MSAL accepts only an https authority) served by aiohttp on its own event
loop in a daemon thread of the test process, so it ends with the process (``remote.py`` runs it
as a process of its own). One origin serves both the identity platform (``identity.py``) and
Graph (``/v1.0/...``); point MSAL at ``authority`` with ``instance_discovery=False`` and a
session trusting ``ca_file`` (``fixture.trusting_session``), the Graph client at ``graph_url``.

This module is the request pipeline every Graph call goes through (bearer check, injected
failures, mailbox resolution and access, throttling) and the test-side API. The endpoints live
in extensions: ``mail.py`` (mail folders, delta, messages, ``$value``), ``subscriptions.py``
(change notifications), ``sendmail.py``, ``control.py`` (the test-side API over HTTP).

Every call needs ``Authorization: Bearer`` (401 ``InvalidAuthenticationToken`` otherwise;
https://learn.microsoft.com/en-us/graph/errors); an app reads the mailboxes its application
access policy allows (403 ``ErrorAccessDenied``;
https://learn.microsoft.com/en-us/graph/auth-limit-mailbox-access), a delegated token only its
user's; a deleted mailbox answers 404.

Throttling (https://learn.microsoft.com/en-us/graph/throttling,
https://learn.microsoft.com/en-us/graph/throttling-limits#outlook-service-limits): more than
``mailbox_concurrency`` (4) requests of one app in flight on one mailbox get ``429`` with
``Retry-After`` and ``ApplicationThrottled`` / "MailboxConcurrency"; so do requests past
``mailbox_request_limit`` (10,000) in ``mailbox_request_window`` (10 minutes).

Fault switches (thread-safe, callable while clients are connected): ``fail_requests`` (429 /
503 / 504 with ``Retry-After``), ``expire_delta_tokens`` (``syncStateNotFound`` or
``resyncRequired`` with ``Location``), ``replay_changes`` (the same change twice),
``expire_access_tokens``, ``revoke_refresh_tokens``, ``revoke_access`` (403),
``delete_mailbox`` (404), ``slow_responses`` / ``hold_responses`` (requests in flight).

Usage::

    with GraphTestServer() as graph:
        graph.add_mailbox("user@example.com")
        graph.register_app("app-id", secret="s3cret")
        message = graph.add_message("user@example.com", mime_bytes)
"""

from __future__ import annotations

import asyncio
import logging
import math
import re
import tempfile
import threading
import time
import uuid
from collections import Counter, deque
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any, Protocol

from aiohttp import web

from .auth import Principal, TokenIssuer
from .control import ControlApi
from .delivery import Delivery, NotificationDelivery
from .delta import DeltaTracker
from .errors import GraphError
from .identity import IdentityEndpoints
from .mail import MailEndpoints
from .mailbox import GraphStore, Mailbox, MailFolder, Message
from .resources import (
    error_json,
)
from .sendmail import Bounce, SendMail, SentMail
from .subscriptions import ChangeNotifications, Subscription
from .tls import CertificatePair, server_tls

log = logging.getLogger(__name__)

DEFAULT_TENANT = "0f4a4b2c-5d6e-4f70-8a91-b2c3d4e5f607"
#: Outlook's limit: "4 concurrent requests" per app per mailbox (throttling-limits).
MAILBOX_CONCURRENCY = 4
#: "10,000 API requests in a 10 minute period" per app per mailbox (throttling-limits).
MAILBOX_REQUEST_LIMIT = 10_000
MAILBOX_REQUEST_WINDOW = 600.0


@dataclass
class RequestRecord:
    method: str
    path: str
    query: str
    status: int
    client_id: str | None


@dataclass
class _Failure:
    remaining: int
    status: int
    retry_after: int | None
    path_contains: str | None
    code: str | None = None
    message: str | None = None


class ServerExtension(Protocol):
    """A part of the server in its own module (change notifications, sendMail)."""

    def install(self, app: web.Application) -> None:
        """Add routes outside ``/v1.0`` (called before the server starts)."""

    async def dispatch(
        self,
        request: web.Request,
        path: str,
        mailbox: Mailbox | None,
        rest: list[str],
        principal: Principal,
    ) -> web.StreamResponse | None:
        """Answer a Graph call it owns (after auth and throttling), or None."""

    async def close(self) -> None:
        """Stop background work (called on the server's loop at shutdown)."""


class GraphTestServer:
    def __init__(
        self,
        *,
        tenant: str = DEFAULT_TENANT,
        host: str = "127.0.0.1",
        port: int = 0,
        token_lifetime: float = 3599.0,
        mailbox_concurrency: int = MAILBOX_CONCURRENCY,
        mailbox_request_limit: int = MAILBOX_REQUEST_LIMIT,
        mailbox_request_window: float = MAILBOX_REQUEST_WINDOW,
        state_dir: Path | None = None,
        event_hubs_bootstrap: str | None = None,
        webhook_ca_files: tuple[Path, ...] = (),
        allow_http_webhooks: bool = False,
        notification_retry_initial: float = 0.5,
        notification_retry_window: float = 60.0,
    ) -> None:
        """``event_hubs_bootstrap``: the Kafka broker that stands for every Event Hubs
        namespace; ``webhook_ca_files``: CAs the notification sender trusts besides this
        server's own (``issue_webhook_certificate``); ``notification_retry_*``: the resend
        schedule of undelivered notifications (Graph: "for up to 4 hours"), in seconds."""
        self.store = GraphStore()
        self.tokens = TokenIssuer(tenant, token_lifetime)
        self.delta = DeltaTracker(self.store)
        self.tenant = tenant
        self.mailbox_concurrency = mailbox_concurrency
        self.requests: list[RequestRecord] = []
        self._host = host
        self._port = port
        self._failures: list[_Failure] = []
        self._in_flight: Counter[tuple[str, str]] = Counter()
        self._recent: dict[tuple[str, str], deque[float]] = {}
        self.mailbox_request_limit = mailbox_request_limit
        self.mailbox_request_window = mailbox_request_window
        self._slow_seconds = 0.0
        self._held: asyncio.Event | None = None  # set on the server's loop: released
        self._tmp: tempfile.TemporaryDirectory[str] | None = None
        if state_dir is None:
            self._tmp = tempfile.TemporaryDirectory(prefix="graph-server-")
            state_dir = Path(self._tmp.name)
        self._tls = server_tls(state_dir / "tls")
        self._loop: asyncio.AbstractEventLoop | None = None
        self._runner: web.AppRunner | None = None
        self._thread: threading.Thread | None = None
        self.delivery = NotificationDelivery(
            trust=[self._tls.ca_file, *webhook_ca_files],
            event_hubs_bootstrap=event_hubs_bootstrap,
            retry_initial=notification_retry_initial,
            retry_window=notification_retry_window,
            allow_http=allow_http_webhooks,
        )
        self.delivery.on_delivery = self._notify_waiters
        self.notifications = ChangeNotifications(self, self.delivery)
        self.mail_submission = SendMail(self)
        self._extensions: list[ServerExtension] = [
            self.notifications,
            self.mail_submission,
            ControlApi(self),
            MailEndpoints(self),
            IdentityEndpoints(self),
        ]

    # -- lifecycle -----------------------------------------------------------------------------

    @property
    def url(self) -> str:
        """``https://127.0.0.1:PORT``: the origin of both login and Graph."""
        return f"https://{self._host}:{self._port}"

    @property
    def authority(self) -> str:
        """MSAL's ``authority`` (use ``instance_discovery=False`` and ``verify=ca_file``)."""
        return f"{self.url}/{self.tenant}"

    @property
    def graph_url(self) -> str:
        """The Graph root, as ``https://graph.microsoft.com/v1.0`` is on the real service."""
        return f"{self.url}/v1.0"

    @property
    def ca_file(self) -> Path:
        """The PEM CA certificate clients must trust."""
        return self._tls.ca_file

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        assert self._loop is not None, "server not started"
        return self._loop

    def start(self) -> GraphTestServer:
        ready = threading.Event()
        failure: list[BaseException] = []

        def run() -> None:
            loop = asyncio.new_event_loop()
            self._loop = loop
            try:
                loop.run_until_complete(self._serve())
            except BaseException as e:
                failure.append(e)
                ready.set()
                return
            ready.set()
            loop.run_forever()
            loop.run_until_complete(self._shutdown())
            loop.close()

        self._thread = threading.Thread(target=run, name="graph-server", daemon=True)
        self._thread.start()
        if not ready.wait(30) or failure:
            raise RuntimeError(f"the Graph test server did not start: {failure}")
        return self

    def stop(self) -> None:
        if self._loop is not None and self._thread is not None:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(30)
        if self._tmp is not None:
            self._tmp.cleanup()

    def __enter__(self) -> GraphTestServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    async def _serve(self) -> None:
        app = web.Application(client_max_size=150 * 1024 * 1024)
        app.router.add_route("*", "/v1.0/{tail:.*}", self._graph)
        for extension in self._extensions:
            extension.install(app)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self._host, self._port, ssl_context=self._tls.context)
        await site.start()
        sockets = site._server.sockets  # type: ignore[union-attr]
        self._port = sockets[0].getsockname()[1]

    async def _shutdown(self) -> None:
        for extension in self._extensions:
            await extension.close()
        if self._runner is not None:
            await self._runner.cleanup()

    # -- state (test side) ---------------------------------------------------------------------

    def add_mailbox(self, address: str) -> Mailbox:
        return self.store.add_mailbox(address)

    def add_folder(
        self, address: str, display_name: str, parent: str = "msgfolderroot"
    ) -> MailFolder:
        return self.store.add_folder(address, display_name, parent)

    def folder_id(self, address: str, ref: str) -> str:
        """The id of a folder by well-known or display name (``inbox``, ``Processed``)."""
        with self.store.cond:
            folder = self.store.require_mailbox(address).folder(ref)
            if folder is None:
                raise KeyError(f"no folder {ref!r} in {address}")
            return folder.folder_id

    def register_app(
        self,
        client_id: str,
        *,
        secret: str | None = None,
        certificate_pem: bytes | None = None,
        mailboxes: set[str] | None = None,
    ) -> None:
        """An app registration with ``Mail.Read`` (application) consented; ``mailboxes``
        limits it as an application access policy does."""
        with self.store.cond:
            self.tokens.register_app(
                client_id, secret=secret, certificate_pem=certificate_pem, mailboxes=mailboxes
            )

    def issue_refresh_token(self, client_id: str, user: str) -> str:
        """A refresh token for delegated access to ``user``'s mailbox (the user consented)."""
        with self.store.cond:
            return self.tokens.issue_refresh_token(client_id, user)

    def add_message(
        self,
        address: str,
        mime: bytes,
        *,
        folder: str = "inbox",
        received: datetime | None = None,
        is_read: bool = False,
        notify: bool = True,
    ) -> Message:
        """Deliver raw MIME bytes; ``notify=False``: no change notification tells of it."""
        return self.store.add_message(
            address, mime, folder=folder, received=received, is_read=is_read, notify=notify
        )

    def update_message(
        self,
        address: str,
        message_id: str,
        *,
        is_read: bool | None = None,
        flag_status: str | None = None,
        categories: list[str] | None = None,
        notify: bool = True,
    ) -> Message:
        """Mark read/unread, flag (``notFlagged``/``flagged``/``complete``), categorize."""
        return self.store.update_message(
            address,
            message_id,
            is_read=is_read,
            flag_status=flag_status,
            categories=categories,
            notify=notify,
        )

    def move_message(
        self, address: str, message_id: str, folder: str, *, notify: bool = True
    ) -> Message:
        return self.store.move_message(address, message_id, folder, notify=notify)

    def delete_message(self, address: str, message_id: str, *, notify: bool = True) -> None:
        self.store.delete_message(address, message_id, notify=notify)

    def messages(self, address: str, folder: str = "inbox") -> list[Message]:
        with self.store.cond:
            mailbox = self.store.require_mailbox(address)
            target = mailbox.folder(folder)
            if target is None:
                raise KeyError(f"no folder {folder!r} in {address}")
            return self.store.messages_in(mailbox, target)

    def wait_until(self, predicate: Any, timeout: float = 30.0) -> bool:
        """Wait until ``predicate()`` is true, re-checking after every server change and at
        least every 0.1 s; the predicate runs without the server's lock."""
        deadline = time.monotonic() + timeout
        while not predicate():
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return False
            with self.store.cond:
                self.store.cond.wait(min(remaining, 0.1))
        return True

    def request_paths(self) -> list[str]:
        with self.store.cond:
            return [r.path for r in self.requests]

    def issue_webhook_certificate(self, folder: Path) -> CertificatePair:
        """A server certificate for 127.0.0.1/localhost signed by this server's CA, which the
        notification sender trusts: for a test's HTTPS webhook endpoint."""
        return self._tls.issue(folder)

    # -- sendMail (test side) --------------------------------------------------------------------

    @property
    def sent(self) -> list[SentMail]:
        """Every message accepted by ``sendMail`` (202), oldest first."""
        with self.store.cond:
            return list(self.mail_submission.sent)

    def bounce_recipient(
        self,
        address: str,
        *,
        status: str = "5.1.1",
        diagnostic: str = "550 5.1.1 RESOLVER.ADR.RecipNotFound; not found",
    ) -> None:
        """Mail sent to ``address`` is accepted (202) and then bounces: an NDR lands in the
        sender's inbox."""
        with self.store.cond:
            self.mail_submission.bouncing[address.lower()] = Bounce(status, diagnostic)

    # -- change notifications (test side) --------------------------------------------------------

    def subscriptions(self, address: str | None = None) -> list[Subscription]:
        """Live subscriptions (of a mailbox)."""
        with self.store.cond:
            return [
                s
                for s in self.notifications.subscriptions.values()
                if s.alive() and (address is None or s.address == address.lower())
            ]

    @property
    def deliveries(self) -> list[Delivery]:
        """Every delivery attempt so far (validation requests are not in it)."""
        with self.store.cond:
            return list(self.delivery.deliveries)

    @property
    def dropped_notifications(self) -> list[dict[str, Any]]:
        with self.store.cond:
            return list(self.notifications.dropped)

    def drop_notifications(self, count: int | None = None) -> None:
        """Lose the next ``count`` change notifications (``None``: all, until
        ``drop_notifications(0)``); no lifecycle event tells (send ``missed`` for that)."""
        self.notifications.drop(count)

    def send_lifecycle_event(self, subscription_id: str, event: str) -> None:
        """``reauthorizationRequired`` (pauses notifications until reauthorized or renewed),
        ``subscriptionRemoved`` (the subscription is gone), ``missed``."""
        self.notifications.lifecycle(subscription_id, event)

    def expire_subscription(self, subscription_id: str) -> None:
        """The subscription ends now, silently (as one not renewed in time)."""
        self.notifications.expire(subscription_id)

    def _notify_waiters(self) -> None:
        with self.store.cond:
            self.store.cond.notify_all()

    # -- fault switches ------------------------------------------------------------------------

    def fail_requests(
        self,
        count: int = 1,
        *,
        status: int = 429,
        retry_after: int | None = 1,
        path_contains: str | None = None,
        code: str | None = None,
        message: str | None = None,
    ) -> None:
        """The next ``count`` Graph calls (whose path contains ``path_contains``) fail with
        ``status`` (429, 503 or 504) and ``Retry-After`` (throttling; errors#http-status-codes).
        Another 4xx/5xx needs Graph's error ``code`` and ``message`` for it (errors: e.g. 400
        ``ErrorInvalidRecipients``, 500 ``generalException``), and has no Retry-After."""
        if status not in (429, 503, 504):
            if not (400 <= status < 600 and code and message):
                raise ValueError(
                    "status must be 429, 503 or 504, or a 4xx/5xx with code and message"
                )
            retry_after = None
        with self.store.cond:
            self._failures.append(
                _Failure(count, status, retry_after, path_contains, code, message)
            )

    def clear_failures(self) -> None:
        with self.store.cond:
            self._failures.clear()

    def expire_delta_tokens(
        self,
        address: str | None = None,
        folder: str | None = None,
        *,
        code: str = "syncStateNotFound",
    ) -> int:
        """Every delta/skip token issued so far (of a mailbox, of a folder) is dead: the next
        use answers ``410 Gone`` with ``code`` (``syncStateNotFound``: expired;
        ``resyncRequired``: a reset, with a ``Location`` header holding the initial query)."""
        if code not in ("syncStateNotFound", "resyncRequired"):
            raise ValueError("code must be syncStateNotFound or resyncRequired")
        with self.store.cond:
            folder_id = self.folder_id(address, folder) if address and folder else None
            return self.delta.expire(address=address, folder_id=folder_id, code=code)

    def replay_changes(self, address: str, folder: str = "inbox") -> None:
        """The next delta round of the folder returns the previous round's last page again
        (delta-query-overview, "Replays": the same change twice)."""
        with self.store.cond:
            self.delta.replay_next_round(address, self.folder_id(address, folder))

    def expire_access_tokens(self) -> int:
        """Every access token issued so far is expired (401 until the client gets a new one)."""
        with self.store.cond:
            return self.tokens.expire_access_tokens()

    def revoke_refresh_tokens(self, user: str | None = None) -> None:
        with self.store.cond:
            self.tokens.revoke_refresh_tokens(user)

    def revoke_access(self, client_id: str, address: str) -> None:
        """The app may no longer read ``address`` (an application access policy now excludes
        it): ``403 ErrorAccessDenied`` (https://learn.microsoft.com/en-us/graph/auth-limit-mailbox-access)."""
        with self.store.cond:
            app = self.tokens.apps[client_id]
            if app.mailboxes is None:
                app.mailboxes = {
                    m for m in self.store.mailboxes if not self.store.mailboxes[m].deleted
                }
            app.mailboxes.discard(address.lower())

    def delete_mailbox(self, address: str) -> None:
        """The mailbox is gone (user deleted or unlicensed): 404 on every call."""
        self.store.delete_mailbox(address)

    def slow_responses(self, seconds: float) -> None:
        """Hold every Graph call ``seconds`` before answering (requests pile up in flight)."""
        with self.store.cond:
            self._slow_seconds = seconds

    def hold_responses(self) -> None:
        """Hold every Graph call (after auth and throttling checks) until
        ``release_responses()``: requests pile up in flight, deterministically."""
        with self.store.cond:
            if self._held is None:
                self._held = asyncio.Event()

    def release_responses(self) -> None:
        with self.store.cond:
            held, self._held = self._held, None
        if held is not None:
            self.loop.call_soon_threadsafe(held.set)

    def in_flight(self, client_id: str, address: str) -> int:
        """Calls of ``client_id`` on ``address`` being served now (the concurrency limit's count)."""
        with self.store.cond:
            return self._in_flight[(client_id, address.lower())]

    # -- Graph -----------------------------------------------------------------------------------

    async def _graph(self, request: web.Request) -> web.StreamResponse:
        path = _normalise(request.match_info["tail"])
        principal: Principal | None = None
        client_request_id = request.headers.get("client-request-id")
        slot: tuple[str, str] | None = None
        try:
            principal = self._principal(request)
            failure = self._take_failure(path)
            if failure is not None:
                raise failure
            mailbox, rest = self._route_mailbox(path, principal)
            if mailbox is not None:
                slot = (principal.client_id, mailbox.address.lower())
                with self.store.cond:
                    self._count_request(slot)
                    if self._in_flight[slot] >= self.mailbox_concurrency:
                        slot = None
                        raise GraphError(
                            429,
                            "ApplicationThrottled",
                            "Application is over its MailboxConcurrency limit.",
                            {"Retry-After": "1"},
                        )
                    self._in_flight[slot] += 1
            if self._slow_seconds:
                await asyncio.sleep(self._slow_seconds)
            if self._held is not None:
                await self._held.wait()
            response = await self._dispatch(request, path, mailbox, rest, principal)
        except GraphError as e:
            headers = dict(e.headers)
            if e.status == 401:
                # What Graph sends with a 401 (a hint where to get a token).
                headers["WWW-Authenticate"] = (
                    'Bearer realm="", authorization_uri="https://login.microsoftonline.com/'
                    'common/oauth2/authorize", client_id="00000003-0000-0000-c000-000000000000"'
                )
            response = web.json_response(
                error_json(e.code, e.message, client_request_id), status=e.status, headers=headers
            )
        finally:
            if slot is not None:
                with self.store.cond:
                    self._in_flight[slot] -= 1
        response.headers["request-id"] = response.headers.get("request-id", "") or _request_id()
        if client_request_id:
            response.headers["client-request-id"] = client_request_id
        with self.store.cond:
            self.requests.append(
                RequestRecord(
                    request.method,
                    "/v1.0/" + request.match_info["tail"],
                    request.query_string,
                    response.status,
                    principal.client_id if principal else None,
                )
            )
            self.store.cond.notify_all()
        return response

    def _count_request(self, slot: tuple[str, str]) -> None:
        """Outlook's rate limit: ``mailbox_request_limit`` (10,000) requests per app and
        mailbox in ``mailbox_request_window`` (10 minutes); over it, 429 until the oldest
        request leaves the window. Throttled requests count too ("Microsoft Graph continues
        to log resource usage while a client is being throttled", throttling)."""
        now = time.monotonic()
        recent = self._recent.setdefault(slot, deque())
        while recent and recent[0] <= now - self.mailbox_request_window:
            recent.popleft()
        recent.append(now)
        if len(recent) > self.mailbox_request_limit:
            wait = recent[-self.mailbox_request_limit] + self.mailbox_request_window - now
            raise GraphError(
                429,
                "ApplicationThrottled",
                "Application is over its request limit for this mailbox.",
                {"Retry-After": str(max(1, math.ceil(wait)))},
            )

    def _principal(self, request: web.Request) -> Principal:
        header = request.headers.get("Authorization", "")
        scheme, _, value = header.partition(" ")
        with self.store.cond:
            principal, message = self.tokens.principal(
                value.strip() if scheme.lower() == "bearer" else ""
            )
        if principal is None:
            raise GraphError(401, "InvalidAuthenticationToken", message)
        return principal

    def _take_failure(self, path: str) -> GraphError | None:
        with self.store.cond:
            for failure in self._failures:
                if failure.remaining > 0 and (
                    failure.path_contains is None or failure.path_contains in path
                ):
                    failure.remaining -= 1
                    headers = {}
                    if failure.retry_after is not None:
                        headers["Retry-After"] = str(failure.retry_after)
                    code, text = {
                        429: ("TooManyRequests", "Please retry again later."),
                        503: ("serviceNotAvailable", "The service is temporarily unavailable."),
                        504: ("generalException", "The gateway timed out."),
                    }.get(failure.status, (failure.code or "", failure.message or ""))
                    return GraphError(failure.status, code, text, headers)
        return None

    def _route_mailbox(self, path: str, principal: Principal) -> tuple[Mailbox | None, list[str]]:
        """``users/{id}/...`` or ``me/...`` -> (mailbox, the segments after it)."""
        segments = path.split("/")
        if segments[0].lower() == "me":
            if principal.user is None:
                raise GraphError(
                    400,
                    "BadRequest",
                    "/me request is only valid with delegated authentication flow.",
                )
            ref, rest = principal.user, segments[1:]
        elif segments[0].lower() == "users" and len(segments) >= 2:
            ref, rest = segments[1], segments[2:]
        else:
            return None, segments
        with self.store.cond:
            mailbox = self.store.mailbox(ref)
            if mailbox is None:
                raise GraphError(404, "ErrorInvalidUser", f"The requested user '{ref}' is invalid.")
            if mailbox.deleted:
                raise GraphError(
                    404,
                    "MailboxNotEnabledForRESTAPI",
                    "The mailbox is either inactive, soft-deleted, or is hosted on-premise.",
                )
            allowed = self._may_read(principal, mailbox)
        if not allowed:
            raise GraphError(
                403, "ErrorAccessDenied", "Access is denied. Check credentials and try again."
            )
        return mailbox, rest

    def _may_read(self, principal: Principal, mailbox: Mailbox) -> bool:
        address = mailbox.address.lower()
        if principal.user is not None:
            return principal.user == address  # delegated: the signed-in user's own mailbox
        app = self.tokens.apps.get(principal.client_id)
        return app is not None and (app.mailboxes is None or address in app.mailboxes)

    async def _dispatch(
        self,
        request: web.Request,
        path: str,
        mailbox: Mailbox | None,
        rest: list[str],
        principal: Principal,
    ) -> web.StreamResponse:
        for extension in self._extensions:
            handled = await extension.dispatch(request, path, mailbox, rest, principal)
            if handled is not None:
                return handled
        raise GraphError(400, "BadRequest", f"Resource not found for the segment '{path}'.")


_KEY_SEGMENT = re.compile(r"(\w+)\('([^']*)'\)")


def _normalise(tail: str) -> str:
    """``mailfolders('X')/messages`` -> ``mailfolders/X/messages`` (OData key syntax)."""
    return _KEY_SEGMENT.sub(lambda m: f"{m.group(1)}/{m.group(2)}", tail).strip("/")


def _request_id() -> str:
    return str(uuid.uuid4())
