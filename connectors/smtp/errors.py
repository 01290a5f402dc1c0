"""Errors of the SMTP sink: one root, transport failures tagged with the SMTP stage they hit.

The transport (the only module importing aiosmtplib) translates every aiosmtplib exception into one
of these, so :mod:`connectors.smtp.classify` decides outcomes from our own types only. The stage
matters: a timeout while waiting for the reply to the final "." means the relay may already have
taken the message (RFC 5321 section 4.1.1.4 puts responsibility on the server once it answers 250,
and we cannot know whether it did), while a timeout before DATA means nothing was accepted.
"""

from __future__ import annotations

import enum

from connectors.core.errors import (
    AuthenticationError,
    ConfigError,
    DataError,
    Disposition,
    MailtapError,
)
from connectors.core.errors import classify as core_classify


class SmtpStage(enum.Enum):
    """Where in the SMTP session a failure happened."""

    CONNECT = "connect"
    """TCP connect, greeting, EHLO, STARTTLS, AUTH."""
    ENVELOPE = "envelope"
    """MAIL FROM / RCPT TO."""
    DATA = "data"
    """The DATA command, before the server answered 354: no content was sent."""
    AFTER_DATA = "after_data"
    """Content and the final "." were written; waiting for the server's verdict."""


class SmtpSinkError(MailtapError):
    """Root of every error the SMTP sink raises on purpose."""


class AddressError(SmtpSinkError, ValueError):
    """Not an address that can be put on the suppression list."""


class RenderError(SmtpSinkError, DataError):
    """A command cannot be turned into a safe message (CR/LF injection, invalid address...).

    Never retried: the sink turns it into a FAILED delivery event with :attr:`reason`.
    """

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class SmtpTransportError(SmtpSinkError):
    """A failure talking to the relay, with the stage it happened in."""

    def __init__(self, message: str, *, stage: SmtpStage) -> None:
        super().__init__(message)
        self.stage = stage
        self.message = message


class SmtpReplyError(SmtpTransportError):
    """The relay answered with an error reply (4xx/5xx) for the whole transaction."""

    def __init__(self, code: int, message: str, *, stage: SmtpStage) -> None:
        super().__init__(f"{code} {message}", stage=stage)
        self.code = code
        self.reply = message


class SmtpDisconnectedError(SmtpTransportError):
    """The connection dropped (or could not be opened)."""


class SmtpTimeoutError(SmtpTransportError):
    """The relay did not answer in time."""


class SmtpTlsError(SmtpTransportError):
    """TLS could not be established or verified (STARTTLS must succeed; no downgrade)."""


class SmtpUtf8UnsupportedError(SmtpTransportError):
    """The message needs SMTPUTF8 (a non-ASCII local part) and the relay does not offer it."""


class SmtpAuthError(SmtpTransportError, AuthenticationError):
    """The relay refused our credentials."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(f"{code} {message}", stage=SmtpStage.CONNECT)
        self.code = code
        self.reply = message


class GraphTokenError(SmtpSinkError):
    """No token for the ``smtp.graph`` application: refused by the token endpoint
    (``refused``: a wrong secret, an unknown client) or the endpoint unreachable."""

    def __init__(self, message: str, *, refused: bool) -> None:
        super().__init__(message)
        self.message = message
        self.refused = refused


class GraphSetupError(SmtpSinkError, ConfigError):
    """The ``smtp.graph`` application cannot send at all (found at start): fix the config."""


def sink_disposition(exc: BaseException) -> Disposition:
    """RETRY / PERMANENT / DATA for a failure of the sink itself (not a per-recipient outcome).

    Per-recipient outcomes (SENT, DEFERRED, FAILED, UNKNOWN) are decided in
    :mod:`connectors.smtp.classify`; this answers "what should the *process* do about it":
    a bad message is DATA (FAILED event, move on), bad credentials or a bad certificate are
    PERMANENT (say so loudly, back off to the cap), a 5xx for the whole session is PERMANENT for that
    message, anything else is RETRY.
    """
    if isinstance(exc, RenderError | SmtpUtf8UnsupportedError):
        return Disposition.DATA
    if isinstance(exc, SmtpAuthError):
        return Disposition.PERMANENT
    if isinstance(exc, SmtpReplyError):
        return Disposition.PERMANENT if exc.code >= 500 else Disposition.RETRY
    if isinstance(exc, SmtpTlsError):
        return core_classify(exc.__cause__ or exc)
    if isinstance(exc, SmtpTransportError):
        return Disposition.RETRY
    return core_classify(exc)
