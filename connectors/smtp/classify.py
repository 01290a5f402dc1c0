"""Per-recipient delivery outcomes from an SMTP transaction. Pure.

Rules (issue 4, RFC 5321 section 4.2.1 and RFC 3463):

- 2xx for the recipient and for the message -> SENT.
- 4xx (at RCPT, at MAIL FROM, after DATA, or a 421 greeting), a dropped connection or a timeout
  *before* the final "." -> DEFERRED: nothing was accepted, retry later.
- 5xx -> FAILED, never retried.
- A partial refusal at RCPT gives one outcome per recipient: the refused ones get their own reply,
  the others the verdict on the message.
- A dropped connection or a timeout *after* the final "." -> UNKNOWN: the relay may have taken
  the message. It is resent later with the same Message-ID, so receivers can deduplicate.

Wire sample of a partial refusal::

    C: RCPT TO:<a@example.org>      S: 250 2.1.5 OK
    C: RCPT TO:<b@example.org>      S: 550 5.1.1 <b@example.org>: user unknown
    C: DATA ... .                   S: 250 2.0.0 queued as 4F2A
    -> a@example.org SENT 250 2.0.0; b@example.org FAILED 550 5.1.1
"""

from __future__ import annotations

import enum
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from connectors.core.avro.replies import DeliveryStatusSymbol
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

_ENHANCED = re.compile(r"^\s*([245]\.\d{1,3}\.\d{1,3})\b")
MAX_DIAGNOSTIC = 1000


class DeliveryStatus(enum.Enum):
    """Symbols of the DeliveryEvent.status enum in schemas/DeliveryEvent.avsc."""

    _value_: DeliveryStatusSymbol  # the type of .value (a test holds the members to it)

    SENT = "SENT"
    DEFERRED = "DEFERRED"
    BOUNCED = "BOUNCED"
    FAILED = "FAILED"
    SUPPRESSED = "SUPPRESSED"
    UNKNOWN = "UNKNOWN"

    @property
    def final(self) -> bool:
        """A final status is never sent again; DEFERRED and UNKNOWN are resent."""
        return self not in (DeliveryStatus.DEFERRED, DeliveryStatus.UNKNOWN)


@dataclass(frozen=True)
class SmtpReply:
    """One reply line group from the relay."""

    code: int
    message: str


@dataclass(frozen=True)
class TransactionReport:
    """What the transport saw for one message when the session itself completed.

    ``refused`` has the RCPT replies that were not 2xx; ``data_reply`` is the reply to the final
    "." (None when every recipient was refused, so DATA was never sent).
    """

    refused: Mapping[str, SmtpReply]
    data_reply: SmtpReply | None


@dataclass(frozen=True)
class RecipientOutcome:
    recipient: str | None
    """None when the outcome concerns the whole command (e.g. it could not be rendered)."""
    status: DeliveryStatus
    smtp_code: int | None = None
    enhanced_status: str | None = None
    diagnostic: str | None = None
    published: bool = False
    """True when this outcome's DeliveryEvent is already on the delivery topic, written by
    another writer (the bounce reader's BOUNCED): the sink records the recipient as done in the
    command state and publishes no event of its own for it."""


def enhanced_status(message: str) -> str | None:
    """The RFC 3463 code at the start of a reply text, if any.

    >>> enhanced_status("5.1.1 <b@example.org>: Recipient address rejected")
    '5.1.1'
    >>> enhanced_status("Requested action not taken") is None
    True
    """
    match = _ENHANCED.match(message)
    return match.group(1) if match else None


def status_for_code(code: int) -> DeliveryStatus:
    if 200 <= code < 400:
        return DeliveryStatus.SENT
    if 400 <= code < 500:
        return DeliveryStatus.DEFERRED
    return DeliveryStatus.FAILED


def _outcome(recipient: str, code: int, message: str) -> RecipientOutcome:
    return RecipientOutcome(
        recipient=recipient,
        status=status_for_code(code),
        smtp_code=code,
        enhanced_status=enhanced_status(message),
        diagnostic=f"{code} {message}"[:MAX_DIAGNOSTIC],
    )


def classify_report(recipients: Sequence[str], report: TransactionReport) -> list[RecipientOutcome]:
    """Outcomes when the SMTP dialogue completed (whatever the codes were)."""
    refused = {k.lower(): v for k, v in report.refused.items()}
    outcomes = []
    for rcpt in recipients:
        reply = refused.get(rcpt.lower())
        if reply is None:
            if report.data_reply is None:
                raise ValueError(f"{rcpt} was neither refused nor covered by a DATA reply")
            reply = report.data_reply
        outcomes.append(_outcome(rcpt, reply.code, reply.message))
    return outcomes


def classify_error(recipients: Sequence[str], exc: SmtpTransportError) -> list[RecipientOutcome]:
    """Outcomes when the dialogue broke off with ``exc``; every recipient shares them."""
    if isinstance(exc, SmtpReplyError):
        return [_outcome(r, exc.code, exc.reply) for r in recipients]
    if isinstance(exc, SmtpUtf8UnsupportedError):
        # RFC 6531 3.2: without the extension the message must not be sent; 5.6.7 is the
        # RFC 6531 status for "non-ASCII addresses not permitted". Never retried.
        diagnostic = exc.message[:MAX_DIAGNOSTIC]
        return [
            RecipientOutcome(
                r, DeliveryStatus.FAILED, enhanced_status="5.6.7", diagnostic=diagnostic
            )
            for r in recipients
        ]
    if isinstance(exc, (SmtpDisconnectedError, SmtpTimeoutError)):
        if exc.stage is SmtpStage.AFTER_DATA:
            status = DeliveryStatus.UNKNOWN
            why = "no verdict after the final '.'; the relay may have accepted the message"
        else:
            status = DeliveryStatus.DEFERRED
            why = f"before the message was accepted ({exc.stage.value})"
        kind = "timeout" if isinstance(exc, SmtpTimeoutError) else "connection lost"
        diagnostic = f"{kind} {why}: {exc.message}"[:MAX_DIAGNOSTIC]
        return [RecipientOutcome(r, status, diagnostic=diagnostic) for r in recipients]
    # Authentication and TLS failures are ours, not the message's: keep it and retry, while the
    # sink reports the misconfiguration loudly (errors.sink_disposition says PERMANENT for the process).
    label = (
        "authentication"
        if isinstance(exc, SmtpAuthError)
        else "tls"
        if isinstance(exc, SmtpTlsError)
        else "smtp"
    )
    code = exc.code if isinstance(exc, SmtpAuthError) else None
    diagnostic = f"{label} failure: {exc.message}"[:MAX_DIAGNOSTIC]
    return [
        RecipientOutcome(r, DeliveryStatus.DEFERRED, smtp_code=code, diagnostic=diagnostic)
        for r in recipients
    ]
