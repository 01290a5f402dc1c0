"""The transport against real aiosmtpd servers: TLS (implicit, STARTTLS, no fallback), certificate
verification, AUTH PLAIN/LOGIN/XOAUTH2, session reuse and reconnect. No Kafka needed."""

from __future__ import annotations

import asyncio
import base64
import ssl
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import trustme
from aiosmtpd.controller import Controller
from aiosmtpd.smtp import SMTP, AuthResult, Envelope, LoginPassword, Session
from smtp_scripted_server import free_port

from connectors.core.errors import Disposition
from connectors.smtp.classify import DeliveryStatus, classify_error
from connectors.smtp.config import SmtpSinkSettings
from connectors.smtp.errors import SmtpAuthError, SmtpStage, SmtpTlsError, sink_disposition
from connectors.smtp.render import render
from connectors.smtp.transport import SmtpConnectionPool

USER, PASSWORD, TOKEN = "relay-user@example.com", "s3cret", "ya29.token"


class Recording:
    def __init__(self) -> None:
        self.messages: list[tuple[str, bool, Any]] = []
        self.close_after_data = False

    async def handle_DATA(self, server: SMTP, session: Session, envelope: Envelope) -> str:
        assert server.transport is not None
        tls = server.transport.get_extra_info("ssl_object") is not None
        self.messages.append((str(envelope.mail_from), tls, session.auth_data))
        if self.close_after_data:
            # Drop the session right after the reply: the next send finds a stale connection.
            asyncio.get_running_loop().call_soon(server.transport.close)  # type: ignore[union-attr]
        return "250 2.0.0 queued"

    async def auth_XOAUTH2(self, server: SMTP, args: list[str]) -> AuthResult:
        raw = base64.b64decode(args[1]).decode() if len(args) > 1 else ""
        ok = raw == f"user={USER}\x01auth=Bearer {TOKEN}\x01\x01"
        return AuthResult(success=ok, handled=False, auth_data=("xoauth2", USER) if ok else None)


def authenticator(
    server: Any, session: Any, envelope: Any, mechanism: str, data: Any
) -> AuthResult:
    ok = isinstance(data, LoginPassword) and (data.login, data.password) == (
        USER.encode(),
        PASSWORD.encode(),
    )
    # handled=False: let aiosmtpd answer 535 itself (its default assumes we already replied).
    return AuthResult(
        success=ok, handled=False, auth_data=(mechanism, data.login.decode()) if ok else None
    )


@pytest.fixture(scope="module")
def ca() -> trustme.CA:
    return trustme.CA()


@pytest.fixture(scope="module")
def ca_file(ca: trustme.CA, tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("ca") / "ca.pem"
    ca.cert_pem.write_to_path(str(path))
    return path


def server_context(ca: trustme.CA, host: str = "localhost") -> ssl.SSLContext:
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca.issue_cert(host).configure_cert(context)
    return context


def start(handler: Recording, **kwargs: Any) -> tuple[Controller, int]:
    port = free_port()
    controller = Controller(handler, hostname="127.0.0.1", port=port, **kwargs)
    controller.start()
    return controller, port


def settings(port: int, **overrides: Any) -> SmtpSinkSettings:
    base: dict[str, Any] = {
        "host": "localhost",
        "port": port,
        "security": "starttls",
        "from_address": "mailtap@example.com",
        "connect_timeout": 10,
        "command_timeout": 10,
        "data_timeout": 10,
        "pool_size": 1,
    }
    base.update(overrides)
    return SmtpSinkSettings.model_validate(base)


def message(i: int = 0) -> Any:
    return render(
        {
            "command_id": f"t{i}",
            "from": {"name": None, "address": "support@example.com"},
            "to": [{"name": None, "address": "a@example.org"}],
            "subject": "hi",
            "text_body": "x",
            "auto_submitted": None,
        },
        return_path="mailtap@example.com",
    )


@pytest.fixture
def starttls_server(ca: trustme.CA) -> Iterator[tuple[Recording, int]]:
    handler = Recording()
    controller, port = start(
        handler,
        tls_context=server_context(ca),
        require_starttls=True,
        authenticator=authenticator,
        auth_require_tls=True,
    )
    yield handler, port
    controller.stop()


async def send_all(pool: SmtpConnectionPool, count: int = 1) -> None:
    try:
        for i in range(count):
            report = await pool.send(message(i))
            assert report.data_reply is not None and report.data_reply.code == 250
    finally:
        await pool.close()


@pytest.mark.parametrize("mechanism", ["auto", "PLAIN", "LOGIN"])
async def test_starttls_with_verified_certificate_and_password_auth(
    starttls_server: tuple[Recording, int], ca_file: Path, mechanism: str
) -> None:
    handler, port = starttls_server
    pool = SmtpConnectionPool(
        settings(
            port, ca_file=str(ca_file), username=USER, password=PASSWORD, auth_mechanism=mechanism
        )
    )
    await send_all(pool, 3)
    assert [m[:2] for m in handler.messages] == [("mailtap@example.com", True)] * 3
    assert {m[2][1] for m in handler.messages} == {USER}
    assert pool.opened == 1  # one session, reused


async def test_xoauth2(starttls_server: tuple[Recording, int], ca_file: Path) -> None:
    handler, port = starttls_server
    pool = SmtpConnectionPool(
        settings(port, ca_file=str(ca_file), username=USER, oauth2_token=TOKEN)
    )
    await send_all(pool)
    assert handler.messages[0][2] == ("xoauth2", USER)


async def test_wrong_password_is_an_auth_error(
    starttls_server: tuple[Recording, int], ca_file: Path
) -> None:
    _, port = starttls_server
    pool = SmtpConnectionPool(settings(port, ca_file=str(ca_file), username=USER, password="nope"))
    with pytest.raises(SmtpAuthError) as caught:
        await send_all(pool)
    assert caught.value.code == 535
    assert sink_disposition(caught.value) is Disposition.PERMANENT


async def test_untrusted_certificate_is_refused(starttls_server: tuple[Recording, int]) -> None:
    handler, port = starttls_server
    pool = SmtpConnectionPool(settings(port))  # system CA store: does not know the test CA
    with pytest.raises(SmtpTlsError) as caught:
        await send_all(pool)
    assert caught.value.stage is SmtpStage.CONNECT
    assert sink_disposition(caught.value) is Disposition.PERMANENT
    (outcome,) = classify_error(["a@example.org"], caught.value)
    assert outcome.status is DeliveryStatus.DEFERRED
    assert handler.messages == []


async def test_certificate_for_another_host_is_refused(ca: trustme.CA, ca_file: Path) -> None:
    handler = Recording()
    controller, port = start(
        handler, tls_context=server_context(ca, "other.example"), require_starttls=True
    )
    try:
        with pytest.raises(SmtpTlsError):
            await send_all(SmtpConnectionPool(settings(port, ca_file=str(ca_file))))
    finally:
        controller.stop()
    assert handler.messages == []


async def test_starttls_never_falls_back_to_plain(ca_file: Path) -> None:
    handler = Recording()
    controller, port = start(handler)  # no tls_context: STARTTLS not offered
    try:
        with pytest.raises(SmtpTlsError, match="STARTTLS"):
            await send_all(SmtpConnectionPool(settings(port, ca_file=str(ca_file))))
    finally:
        controller.stop()
    assert handler.messages == []


async def test_implicit_tls(ca: trustme.CA, ca_file: Path) -> None:
    handler = Recording()
    controller, port = start(handler, ssl_context=server_context(ca))
    try:
        await send_all(SmtpConnectionPool(settings(port, security="tls", ca_file=str(ca_file))), 2)
    finally:
        controller.stop()
    assert [m[1] for m in handler.messages] == [True, True]


async def test_reconnects_when_the_relay_dropped_an_idle_session() -> None:
    handler = Recording()
    handler.close_after_data = True
    controller, port = start(handler)
    pool = SmtpConnectionPool(settings(port, host="127.0.0.1", security="plain"))
    try:
        await send_all(pool, 3)
    finally:
        controller.stop()
    assert len(handler.messages) == 3
    assert pool.opened == 3


class Contents(Recording):
    """Keeps what each accepted message said, to tell them apart."""

    def __init__(self) -> None:
        super().__init__()
        self.data: list[bytes] = []

    async def handle_DATA(self, server: SMTP, session: Session, envelope: Envelope) -> str:
        self.data.append(envelope.original_content or b"")
        return await super().handle_DATA(server, session, envelope)


async def test_a_staged_send_is_accepted_only_after_its_final_dot() -> None:
    handler = Contents()
    controller, port = start(handler)
    pool = SmtpConnectionPool(settings(port, host="127.0.0.1", security="plain"))
    ready = asyncio.Event()
    try:
        sending = asyncio.create_task(pool.send(message(1), ready))
        await asyncio.sleep(0.5)  # envelope and content are on the relay's side by now
        assert not sending.done() and handler.messages == []
        ready.set()
        report = await sending
        assert report.data_reply is not None and report.data_reply.code == 250
        assert len(handler.data) == 1 and b"Message-ID: <mailtap.t1@" in handler.data[0]
    finally:
        await pool.close()
        controller.stop()


async def test_a_send_given_its_go_ahead_before_its_content_ends_it_in_the_same_write() -> None:
    """The sink's go-ahead (the INTENT committed) often comes while MAIL, RCPT and DATA are
    still under way: the "." then goes with the content, and the relay gets the same message."""
    handler = Contents()
    controller, port = start(handler)
    pool = SmtpConnectionPool(settings(port, host="127.0.0.1", security="plain"))
    ready, later = asyncio.Event(), asyncio.Event()
    ready.set()
    # Rendered once: a command without created_at is dated when rendered, and two renders a
    # second apart differ (CI, stop 38: 02:57:22 against 02:57:23).
    rendered = message(1)
    try:
        report = await pool.send(rendered, ready)
        assert report.data_reply is not None and report.data_reply.code == 250
        assert pool.dots_with_content == 1
        staged = asyncio.create_task(pool.send(rendered, later))  # the same message, staged
        await asyncio.sleep(0.5)
        assert not staged.done() and len(handler.data) == 1
        later.set()
        await staged
        assert pool.dots_with_content == 1
    finally:
        await pool.close()
        controller.stop()
    assert len(handler.data) == 2 and handler.data[0] == handler.data[1]
    assert pool.opened == 1  # the session carried both


async def test_a_staged_send_cancelled_before_its_final_dot_is_discarded_not_reused() -> None:
    """The sink cancels the staged sends of a round whose commit failed: the relay must drop
    that content, and the session must not carry the next message inside the old DATA."""
    handler = Contents()
    controller, port = start(handler)
    pool = SmtpConnectionPool(settings(port, host="127.0.0.1", security="plain"))
    try:
        staged = asyncio.create_task(pool.send(message(1), asyncio.Event()))
        await asyncio.sleep(0.5)
        staged.cancel()
        with pytest.raises(asyncio.CancelledError):
            await staged
        await send_all(pool)  # closes the pool
    finally:
        controller.stop()
    assert len(handler.data) == 1
    assert b"Message-ID: <mailtap.t0@" in handler.data[0]
    assert b"mailtap.t1@" not in handler.data[0] and handler.data[0].count(b"Message-ID:") == 1
    assert pool.opened == 2  # the staged session was closed, a new one carried message 0
