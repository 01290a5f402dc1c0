"""Bounce (DSN) recognition and correlation to the command that caused it. Pure.

Recognition: RFC 3464 ``multipart/report; report-type=delivery-status`` is read field by field
(Final-Recipient, Action, Status, Diagnostic-Code); the non-standard formats (qmail's QSBMF, old
Exchange, Yahoo, Exim, ...) are recognised by flufl.bounce, and we then pick the status and the
diagnostic out of the text around each recipient.

Wire sample (the delivery-status part of an RFC 3464 report)::

    Reporting-MTA: dns; mx.example.org

    Final-Recipient: rfc822; nobody@example.org
    Action: failed
    Status: 5.1.1
    Diagnostic-Code: smtp; 550 5.1.1 <nobody@example.org>: Recipient address rejected

Correlation, first match wins:

1. VERP: the bounce was addressed to ``bounce+<token>@<verp_domain>`` (To, Delivered-To,
   X-Original-To, Envelope-To), see :mod:`connectors.smtp.identity`;
2. our Message-ID ``<mailtap.<token>@...>`` anywhere in the returned headers or text
   (message/rfc822, text/rfc822-headers, or the quoted copy of non-standard formats), or in the
   bounce's own In-Reply-To/References. Both encodings are reversible: no lookup table is needed.

Hard vs soft: a 5.x.x status or a permanent failure is HARD; a 4.x.x status or ``Action: delayed``
is SOFT.
"""

from __future__ import annotations

import enum
import re
from collections.abc import Iterator
from dataclasses import dataclass
from email import message_from_bytes
from email.message import Message
from email.utils import getaddresses

from flufl.bounce import all_failures

from connectors.core.avro.replies import BounceTypeSymbol
from connectors.smtp.classify import MAX_DIAGNOSTIC, enhanced_status
from connectors.smtp.identity import (
    MESSAGE_ID_PREFIX,
    command_id_from_message_id,
    command_id_from_verp,
)

MAX_BOUNCE_BYTES = 2_000_000
"""Larger reports are cut before parsing: the email package is slow on hostile input (PITFALLS)."""

_OUR_MESSAGE_ID = re.compile(
    rf"<({re.escape(MESSAGE_ID_PREFIX)}[A-Za-z0-9_.=-]+@[A-Za-z0-9.-]+)>", re.IGNORECASE
)
_STATUS = re.compile(r"\b([245]\.\d{1,3}\.\d{1,3})\b")
_SMTP_CODE = re.compile(r"(?<![\d.])([245]\d\d)(?=[ -])")
_VERP_HEADERS = ("Delivered-To", "X-Original-To", "Envelope-To", "To")


class BounceType(enum.Enum):
    """Symbols of the DeliveryEvent.bounce_type enum in schemas/DeliveryEvent.avsc."""

    _value_: BounceTypeSymbol  # the type of .value (a test holds the members to it)

    HARD = "HARD"
    SOFT = "SOFT"


@dataclass(frozen=True)
class Bounce:
    """One bounced recipient of one of our messages."""

    recipient: str
    bounce_type: BounceType
    command_id: str | None
    """None when the report could not be correlated to a command."""
    message_id: str | None
    """Our outgoing Message-ID (without brackets) when the report quoted it."""
    status: str | None
    smtp_code: int | None
    diagnostic: str | None


@dataclass
class _Detail:
    status: str | None = None
    smtp_code: int | None = None
    diagnostic: str | None = None
    delayed: bool = False


def parse_bounce(raw: bytes, *, verp_domain: str | None = None) -> list[Bounce]:
    """All bounced recipients in ``raw``; empty when it is not a bounce."""
    msg = message_from_bytes(raw[:MAX_BOUNCE_BYTES])
    details = _dsn_details(msg)
    temporary, permanent = all_failures(msg)
    recipients: dict[str, bool] = {}  # address -> permanent
    for raw_addr in temporary:
        recipients[raw_addr.decode("ascii").lower()] = False
    for raw_addr in permanent:
        recipients[raw_addr.decode("ascii").lower()] = True
    for addr, detail in details.items():
        recipients.setdefault(addr, not detail.delayed)
    if not recipients:
        return []
    command_id, message_id = _correlate(msg, verp_domain)
    text = _all_text(msg)
    bounces = []
    for addr, is_permanent in recipients.items():
        detail = details.get(addr) or _text_detail(text, addr)
        soft = detail.delayed or (detail.status or "").startswith("4") or not is_permanent
        if detail.status and detail.status.startswith("5"):
            soft = False
        bounces.append(
            Bounce(
                recipient=addr,
                bounce_type=BounceType.SOFT if soft else BounceType.HARD,
                command_id=command_id,
                message_id=message_id,
                status=detail.status,
                smtp_code=detail.smtp_code,
                diagnostic=detail.diagnostic,
            )
        )
    return bounces


def _dsn_details(msg: Message) -> dict[str, _Detail]:
    """Per-recipient fields of every message/delivery-status part (RFC 3464 section 2.3)."""
    details: dict[str, _Detail] = {}
    for part in msg.walk():
        if part.get_content_type() != "message/delivery-status" or not part.is_multipart():
            continue
        blocks = part.get_payload()
        assert isinstance(blocks, list)
        for block in blocks:
            if not isinstance(block, Message):
                continue
            recipient = _recipient_field(block)
            action = str(block.get("Action", "")).strip().lower()
            if recipient is None or not action.startswith(("failed", "delayed", "error")):
                continue
            diagnostic = _unfold(block.get("Diagnostic-Code"))
            if diagnostic and ";" in diagnostic:
                diagnostic = diagnostic.split(";", 1)[1].strip()
            status = _STATUS.search(str(block.get("Status", "")))
            code = _SMTP_CODE.search(diagnostic or "")
            details[recipient] = _Detail(
                status=status.group(1) if status else enhanced_status(diagnostic or ""),
                smtp_code=int(code.group(1)) if code else None,
                diagnostic=(diagnostic or None) and diagnostic[:MAX_DIAGNOSTIC],
                delayed=action.startswith("delayed"),
            )
    return details


def _recipient_field(block: Message) -> str | None:
    for name in ("Final-Recipient", "Original-Recipient"):
        value = _unfold(block.get(name))
        if value:
            _, _, addr = value.rpartition(";")
            addr = addr.strip().strip("<>").lower()
            if "@" in addr:
                return addr
    return None


def _unfold(value: object) -> str | None:
    return " ".join(str(value).split()) if value is not None else None


def _text_detail(text: str, recipient: str) -> _Detail:
    """Status and diagnostic near the recipient in a non-standard report's text.

    The address can appear several times (a quoted "To:" line, then the failure paragraph): the
    first occurrence followed by a status or reply code wins, else the first one.
    """
    lower = text.lower()
    found: _Detail | None = None
    start = lower.find(recipient)
    while start >= 0:
        lines = [ln.strip() for ln in text[start : start + 600].splitlines()[:5] if ln.strip()]
        snippet = " ".join(lines)
        status = _STATUS.search(snippet)
        code = _SMTP_CODE.search(snippet)
        detail = _Detail(
            status=status.group(1) if status else None,
            smtp_code=int(code.group(1)) if code else None,
            diagnostic=snippet[:MAX_DIAGNOSTIC] or None,
        )
        if status or code:
            return detail
        found = found or detail
        start = lower.find(recipient, start + len(recipient))
    return found or _Detail()


def _parts(msg: Message) -> Iterator[Message]:
    yield from msg.walk()


def _all_text(msg: Message) -> str:
    chunks = []
    for part in _parts(msg):
        if part.is_multipart():
            continue
        payload = part.get_payload(decode=True)
        if isinstance(payload, bytes):
            chunks.append(payload.decode("utf-8", "replace"))
    return "\n".join(chunks)


def _correlate(msg: Message, verp_domain: str | None) -> tuple[str | None, str | None]:
    message_id = _find_our_message_id(msg)
    if verp_domain:
        for header in _VERP_HEADERS:
            for _, addr in getaddresses([str(v) for v in msg.get_all(header) or []]):
                command_id = command_id_from_verp(addr, verp_domain)
                if command_id:
                    return command_id, message_id
    if message_id:
        return command_id_from_message_id(message_id), message_id
    return None, None


def _find_our_message_id(msg: Message) -> str | None:
    """Our Message-ID in the returned message: inner headers first, then any text."""
    for part in _parts(msg):
        if part is msg:
            continue
        for value in part.get_all("Message-ID") or []:
            match = _OUR_MESSAGE_ID.search(str(value))
            if match:
                return match.group(1)
    for header in ("In-Reply-To", "References"):
        match = _OUR_MESSAGE_ID.search(str(msg.get(header, "")))
        if match:
            return match.group(1)
    match = _OUR_MESSAGE_ID.search(_all_text(msg))
    return match.group(1) if match else None


def correlate(msg: Message, verp_domain: str | None) -> tuple[str | None, str | None]:
    """``(command id, our Message-ID)`` of the message a report is about (see the module doc)."""
    return _correlate(msg, verp_domain)
