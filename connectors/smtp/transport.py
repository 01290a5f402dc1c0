"""Talking to the relay: the only module that imports aiosmtplib.

A bounded pool of reusable sessions. Each send runs one SMTP transaction and reports what the
relay said in our own types (:class:`~connectors.smtp.classify.TransactionReport`); every
aiosmtplib exception leaves as a :class:`~connectors.smtp.errors.SmtpTransportError` tagged with
the stage it happened in.

DATA is driven in steps (the DATA command, the content, then the final ".") instead of
``SMTP.data()``, because only then do we know whether a timeout or a drop happened before the
relay could have accepted the message (DEFERRED) or after the final "." (UNKNOWN, resend later
with the same Message-ID). A send may be *staged*: everything but the final "." goes out at once,
the "." only when the caller says so (the sink: once the message's INTENT is committed), in the
content's own write when the caller has said so by then. Until
the "." the relay can accept nothing; a session dropped in between is one the relay discards
(RFC 5321 4.1.1.4: the mail data is only complete at the "."), and it is never reused.

Security: ``tls`` is implicit TLS, ``starttls`` must succeed (a relay that does not offer it is an
error, never a silent fallback), certificates are always verified (system store or ``ca_file``).
"""

from __future__ import annotations

import asyncio
import logging
import re
import ssl
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import aiosmtplib
from aiosmtplib import (
    SMTPAuthenticationError,
    SMTPConnectResponseError,
    SMTPException,
    SMTPRecipientRefused,
    SMTPResponseException,
    SMTPSenderRefused,
    SMTPServerDisconnected,
    SMTPTimeoutError,
)

from connectors.smtp.classify import (
    RecipientOutcome,
    SmtpReply,
    TransactionReport,
    classify_error,
    classify_report,
)
from connectors.smtp.config import SmtpSinkSettings
from connectors.smtp.errors import (
    SmtpAuthError,
    SmtpDisconnectedError,
    SmtpReplyError,
    SmtpStage,
    SmtpTimeoutError,
    SmtpTlsError,
    SmtpTransportError,
    SmtpUtf8UnsupportedError,
)
from connectors.smtp.render import RenderedMessage

log = logging.getLogger(__name__)

_LEADING_DOT = re.compile(rb"(?m)^\.")
#: The line that ends the mail data (RFC 5321 4.1.1.4).
_END_OF_DATA = b".\r\n"
#: Replies after which the relay closes the session (RFC 5321 3.8: 421 "service not available").
_CLOSING_CODES = {421}
#: A dot-atom local part and an ASCII domain (RFC 5321 4.1.2): the addresses our render makes
#: for plain ASCII mail. For these aiosmtplib's quote_address (email.utils.parseaddr, then its
#: injection check) returns ``<address>`` unchanged, at ~25 us a call on every MAIL and RCPT;
#: anything else still goes through it.
_PLAIN_ADDRESS = re.compile(
    r"[A-Za-z0-9!#$%&'*+/=?^_`{|}~-]+(?:\.[A-Za-z0-9!#$%&'*+/=?^_`{|}~-]+)*"
    r"@[A-Za-z0-9-]+(?:\.[A-Za-z0-9-]+)*"
)
_MAIL_OK = 250
_RCPT_OK = (250, 251)


def tls_context(settings: SmtpSinkSettings) -> ssl.SSLContext:
    """Verifying context: hostname checked against ``settings.host``; never optional."""
    context = ssl.create_default_context(cafile=settings.ca_file)
    context.check_hostname = True
    context.verify_mode = ssl.CERT_REQUIRED
    return context


def dot_stuff(data: bytes) -> bytes:
    """RFC 5321 4.5.2 transparency, plus the terminating "."; ``data`` already ends in CRLF."""
    if not data.endswith(b"\r\n"):
        data += b"\r\n"
    return _LEADING_DOT.sub(b"..", data) + b".\r\n"


def smtp_path(address: str) -> bytes | None:
    """``<address>`` for a plain ASCII address, as aiosmtplib's quote_address makes it; None
    for any other (which aiosmtplib quotes and checks itself).

    >>> smtp_path("bounce+c-1@example.com"), smtp_path("Ann <a@example.com>")
    (b'<bounce+c-1@example.com>', None)
    """
    if _PLAIN_ADDRESS.fullmatch(address) is None:
        return None
    return b"<" + address.encode("ascii") + b">"


def _translate(exc: BaseException, stage: SmtpStage) -> SmtpTransportError:
    """aiosmtplib/OS exception -> ours, keeping the cause chain."""
    result: SmtpTransportError
    if isinstance(exc, SmtpTransportError):
        return exc
    if isinstance(exc, SMTPAuthenticationError):
        result = SmtpAuthError(exc.code, exc.message)
    elif isinstance(exc, SMTPTimeoutError | asyncio.TimeoutError):
        result = SmtpTimeoutError(str(exc) or "timed out", stage=stage)
    elif isinstance(exc, ssl.SSLError):
        result = SmtpTlsError(f"TLS failed: {exc}", stage=stage)
    elif isinstance(exc, SMTPConnectResponseError | SMTPResponseException):
        result = SmtpReplyError(exc.code, exc.message, stage=stage)
    elif isinstance(exc, SMTPServerDisconnected | ConnectionError | OSError):
        result = SmtpDisconnectedError(str(exc) or type(exc).__name__, stage=stage)
    elif isinstance(exc, SMTPException):
        message = str(exc)
        if "STARTTLS" in message.upper():
            result = SmtpTlsError(f"STARTTLS required but failed: {message}", stage=stage)
        else:
            result = SmtpDisconnectedError(message, stage=stage)
    else:
        raise exc
    result.__cause__ = exc
    return result


class SmtpSession:
    """One connected, authenticated SMTP session, used by one sender at a time."""

    def __init__(self, client: aiosmtplib.SMTP, settings: SmtpSinkSettings) -> None:
        self._client = client
        self._settings = settings
        self.sent = 0
        self._staged: dict[str, SmtpReply] | None = None
        """Between :meth:`stage` and :meth:`finish`: the recipients refused so far."""
        self.final_dot_sent = False
        """Between :meth:`stage` and :meth:`finish`: the final "." went with the content."""

    @classmethod
    async def open(cls, settings: SmtpSinkSettings, context: ssl.SSLContext | None) -> SmtpSession:
        client = aiosmtplib.SMTP(
            hostname=settings.host,
            port=settings.port,
            use_tls=settings.security == "tls",
            start_tls=False,
            tls_context=context if settings.security != "plain" else None,
            local_hostname=settings.local_hostname,
            timeout=settings.command_timeout,
        )
        try:
            await client.connect(timeout=settings.connect_timeout)
            if settings.security == "starttls":
                await client.starttls(tls_context=context, timeout=settings.connect_timeout)
                # RFC 3207 4.2: forget what was learnt before TLS; the AUTH list may differ.
                await client.ehlo(timeout=settings.connect_timeout)
            await cls._authenticate(client, settings)
        except BaseException as exc:
            client.close()
            if isinstance(exc, asyncio.CancelledError):
                raise
            raise _translate(exc, SmtpStage.CONNECT) from exc
        return cls(client, settings)

    @staticmethod
    async def _authenticate(client: aiosmtplib.SMTP, settings: SmtpSinkSettings) -> None:
        if not settings.username:
            return
        mechanism = settings.auth_mechanism
        if mechanism == "XOAUTH2" or (mechanism == "auto" and settings.oauth2_token):
            assert settings.oauth2_token is not None
            await client.auth_xoauth2(settings.username, settings.oauth2_token.get_secret_value())
            return
        password = settings.password.get_secret_value() if settings.password else ""
        if mechanism == "PLAIN":
            await client.auth_plain(settings.username, password)
        elif mechanism == "LOGIN":
            await client.auth_login(settings.username, password)
        else:
            await client.login(settings.username, password)

    @property
    def usable(self) -> bool:
        """Connected and not inside a staged DATA (whose content a next MAIL would extend)."""
        return self._client.is_connected and self._staged is None

    def close(self) -> None:
        self._client.close()

    async def quit(self) -> None:
        try:
            await self._client.quit(timeout=5)
        except (TimeoutError, SMTPException, OSError):
            self._client.close()

    async def transact(self, message: RenderedMessage) -> TransactionReport:
        """MAIL, RCPT per recipient, DATA; raises SmtpTransportError (session then closed)."""
        return await self.stage(message) or await self.finish()

    async def stage(
        self, message: RenderedMessage, ready: asyncio.Event | None = None
    ) -> TransactionReport | None:
        """MAIL, RCPT per recipient, DATA and the content: all but the final ".".

        Returns the report when the transaction ended here (every recipient refused), else
        None, and :meth:`finish` sends the "." (the relay can accept nothing before it) and
        reads the verdict. When ``ready`` is already set as the content goes out, the "."
        goes with it, in the same write, and :meth:`finish` only reads the verdict.
        Raises SmtpTransportError (the session then closed, or reset when the relay refused).
        """
        stage = SmtpStage.ENVELOPE
        settings = self._settings
        options: list[str] = []
        encoding = "ascii"
        try:
            if message.smtputf8:
                options = await self._smtputf8_options()
                encoding = "utf-8"
            try:
                await self._mail(message.envelope_from, options, encoding)
            except SMTPSenderRefused as exc:
                await self._reset_after(exc.code)
                raise SmtpReplyError(exc.code, exc.message, stage=stage) from exc
            refused: dict[str, SmtpReply] = {}
            for rcpt in message.recipients:
                try:
                    await self._rcpt(rcpt, encoding)
                except SMTPRecipientRefused as exc:
                    refused[rcpt] = SmtpReply(exc.code, exc.message)
                    if exc.code in _CLOSING_CODES:
                        self.close()
                        raise SmtpReplyError(exc.code, exc.message, stage=stage) from exc
            if len(refused) == len(message.recipients):
                await self._reset_after(0)
                return TransactionReport(refused, None)
            stage = SmtpStage.DATA
            start = await self._client.execute_command(b"DATA", timeout=settings.command_timeout)
            if start.code != 354:
                await self._reset_after(start.code)
                raise SmtpReplyError(start.code, start.message, stage=stage)
            protocol = self._client.protocol
            if protocol is None:
                raise SMTPServerDisconnected("connection lost before the content was sent")
            # The content without its terminating "." (written by finish()): nothing is
            # accepted yet, and until then the session is no one else's (usable is False).
            # With the go-ahead given already, the "." goes now: the same bytes in one write.
            self._staged = refused
            content = dot_stuff(message.data)
            self.final_dot_sent = ready is not None and ready.is_set()
            protocol.write(content if self.final_dot_sent else content[: -len(_END_OF_DATA)])
        except (SmtpReplyError, SmtpUtf8UnsupportedError):
            raise
        except Exception as exc:
            self.close()
            raise _translate(exc, stage) from exc
        return None

    async def finish(self) -> TransactionReport:
        """The final "." of a staged transaction and the relay's verdict on it."""
        refused, self._staged = self._staged, None
        assert refused is not None, "finish() without a staged transaction"
        try:
            # From here on the relay may take responsibility for the message at any moment.
            protocol = self._client.protocol
            if protocol is None:
                raise SMTPServerDisconnected("connection lost before the final '.' was sent")
            if not self.final_dot_sent:
                protocol.write(_END_OF_DATA)
            self.final_dot_sent = False
            reply = await protocol.read_response(timeout=self._settings.data_timeout)
        except Exception as exc:
            self.close()
            raise _translate(exc, SmtpStage.AFTER_DATA) from exc
        if reply.code in _CLOSING_CODES:
            self.close()
        self.sent += 1
        return TransactionReport(refused, SmtpReply(reply.code, reply.message))

    async def _mail(self, sender: str, options: list[str], encoding: str) -> None:
        """MAIL FROM: aiosmtplib's ``mail()``, or the same command without its address parsing
        once the session has said EHLO and the address is a plain one (see smtp_path)."""
        client, timeout = self._client, self._settings.command_timeout
        path = smtp_path(sender)
        if options or path is None or client.is_ehlo_or_helo_needed:
            await client.mail(sender, options=options, encoding=encoding, timeout=timeout)
            return
        reply = await client.execute_command(b"MAIL", b"FROM:" + path, timeout=timeout)
        if reply.code != _MAIL_OK:
            raise SMTPSenderRefused(reply.code, reply.message, sender)

    async def _rcpt(self, recipient: str, encoding: str) -> None:
        """RCPT TO: as :meth:`_mail`, aiosmtplib's ``rcpt()`` or the same without its parsing."""
        client, timeout = self._client, self._settings.command_timeout
        path = smtp_path(recipient)
        if path is None or client.is_ehlo_or_helo_needed:
            await client.rcpt(recipient, encoding=encoding, timeout=timeout)
            return
        reply = await client.execute_command(b"RCPT", b"TO:" + path, timeout=timeout)
        if reply.code not in _RCPT_OK:
            raise SMTPRecipientRefused(reply.code, reply.message, recipient)

    async def _smtputf8_options(self) -> list[str]:
        """MAIL FROM parameters for a message that needs SMTPUTF8, if the relay offers it."""
        # aiosmtplib sends EHLO lazily, inside mail(): the extensions are only known after it.
        if self._client.is_ehlo_or_helo_needed:
            await self._client.ehlo(timeout=self._settings.command_timeout)
        if not self._client.supports_extension("smtputf8"):
            raise SmtpUtf8UnsupportedError(
                f"the relay {self._settings.host}:{self._settings.port} does not offer SMTPUTF8 "
                f"(RFC 6531), which an address with a non-ASCII local part needs; nothing was sent",
                stage=SmtpStage.ENVELOPE,
            )
        # RFC 6531 3.4: SMTPUTF8 on MAIL FROM; the UTF-8 headers make the content 8-bit too.
        options = ["SMTPUTF8"]
        if self._client.supports_extension("8bitmime"):
            options.append("BODY=8BITMIME")
        return options

    async def _reset_after(self, code: int) -> None:
        """RSET so the session can carry the next message; a 421 (or a failed RSET) closes it."""
        if code in _CLOSING_CODES:
            self.close()
            return
        try:
            await self._client.rset(timeout=self._settings.command_timeout)
        except (TimeoutError, SMTPException, OSError):
            self.close()


class SmtpConnectionPool:
    """At most ``pool_size`` sessions; idle ones are reused, broken ones replaced.

    A session the relay closed while idle shows up as a disconnect at MAIL FROM; that is retried
    once on a fresh session, because nothing of the message has been sent yet.
    """

    def __init__(self, settings: SmtpSinkSettings) -> None:
        self._settings = settings
        self._context = tls_context(settings) if settings.security != "plain" else None
        self._slots = asyncio.Semaphore(settings.pool_size)
        self._idle: list[SmtpSession] = []
        self._open_failure: SmtpTransportError | None = None
        self.opened = 0
        self.dots_with_content = 0
        """Staged sends whose go-ahead came before their content went out, so their final "."
        went in the same write: one write, and one relay wake-up, fewer."""
        self.description = f"{settings.host}:{settings.port}"

    def start(self) -> None:
        """Nothing to check before the first send: sessions open on demand."""

    def reset_breaker(self) -> None:
        """Allow opening sessions again after a failure (called once per batch by the sink).

        Until then, a failure to reach the relay (refused, timeout, TLS, auth) is raised at once
        for every further session needed, instead of each waiting for its own timeout.
        """
        self._open_failure = None

    @asynccontextmanager
    async def session(self) -> AsyncIterator[tuple[SmtpSession, bool]]:
        """A session and whether it was reused; returned to the pool if still usable."""
        async with self._slots:
            reused = False
            session: SmtpSession | None = None
            while self._idle:
                candidate = self._idle.pop()
                if candidate.usable:
                    session, reused = candidate, True
                    break
            if session is None:
                if self._open_failure is not None:
                    raise self._open_failure
                try:
                    session = await SmtpSession.open(self._settings, self._context)
                except SmtpReplyError:
                    raise  # the relay answered (e.g. 421 busy): worth trying again
                except SmtpTransportError as exc:
                    self._open_failure = exc
                    raise
                self.opened += 1
                log.info("smtp session opened host=%s open=%d", self._settings.host, self.opened)
            try:
                yield session, reused
            finally:
                if session.usable:
                    self._idle.append(session)
                else:
                    session.close()  # dropped, or left inside a staged DATA: the relay discards it

    async def send(
        self, message: RenderedMessage, ready: asyncio.Event | None = None
    ) -> TransactionReport:
        """One SMTP transaction. With ``ready``, all but the final "." is sent at once and the
        "." once ``ready`` is set: the relay reads the envelope and the content meanwhile (the
        sink's INTENT commit), and accepts nothing before. (Set by the time the content goes,
        the "." goes with it.) Cancelled while waiting, the session
        is closed, so the relay discards the message."""
        for try_fresh in (False, True):
            async with self.session() as (session, reused):
                try:
                    report = await session.stage(message, ready)
                    if report is not None:
                        return report
                    if session.final_dot_sent:
                        self.dots_with_content += 1
                    elif ready is not None:
                        await ready.wait()
                    return await session.finish()
                except SmtpDisconnectedError as exc:
                    stale = reused and not try_fresh and exc.stage is SmtpStage.ENVELOPE
                    if not stale:
                        raise
                    log.info("reused smtp session was closed by the relay; reconnecting")
        raise AssertionError("unreachable")

    async def deliver(
        self, message: RenderedMessage, ready: asyncio.Event | None = None
    ) -> list[RecipientOutcome]:
        """:meth:`send`, its report or error classified per recipient (connectors.smtp.classify)."""
        try:
            report = await self.send(message, ready)
        except SmtpTransportError as exc:
            if isinstance(exc, SmtpAuthError | SmtpTlsError):
                log.error("relay refused us (check smtp settings): %s", exc)
            return classify_error(message.recipients, exc)
        return classify_report(message.recipients, report)

    async def close(self) -> None:
        idle, self._idle = self._idle, []
        await asyncio.gather(*(s.quit() for s in idle), return_exceptions=True)
