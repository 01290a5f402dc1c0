"""Complaints (ARF feedback reports, RFC 5965) and unsubscribe requests. Pure.

Wire sample (the machine-readable part of an RFC 5965 report)::

    Content-Type: multipart/report; report-type=feedback-report; boundary="b"
    ...
    Content-Type: message/feedback-report

    Feedback-Type: abuse
    User-Agent: SomeGenerator/1.0
    Version: 1
    Original-Rcpt-To: <jane@example.org>

    --b
    Content-Type: message/rfc822      (or text/rfc822-headers: the reported message)

The complaining address is ``Original-Rcpt-To`` (RFC 5965 3.2, optional), else the ``To`` of the
reported message. A report counts only when it is about one of *our* messages (our Message-ID or
VERP address in it, :func:`connectors.smtp.bounce.correlate`), so a forged report about someone
else's mail suppresses nobody. Feedback types ``abuse`` and ``fraud`` are complaints; ``not-spam``,
``virus``, ``auth-failure`` (RFC 6591) and ``other`` are not.

Parsed with the stdlib email package: the one ARF library on PyPI (``arf-mime``) has had no
release since 2020, and a feedback report is a small MIME structure the package already splits
(``message/feedback-report`` parses as a header block).

An unsubscribe request is any mail addressed to the configured unsubscribe address (the mailto of
our ``List-Unsubscribe``); its ``From`` address is the one to suppress.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from email import message_from_bytes
from email.message import Message

from connectors.core.mail.addresses import parse_addresses
from connectors.smtp.bounce import MAX_BOUNCE_BYTES, correlate

COMPLAINT_TYPES = frozenset({"abuse", "fraud"})
_ADDRESS_HEADERS = ("To", "Delivered-To", "X-Original-To", "Envelope-To", "Cc")


@dataclass(frozen=True)
class Complaint:
    """One recipient who reported one of our messages."""

    recipient: str
    feedback_type: str
    command_id: str | None
    message_id: str | None


def is_feedback_report(msg: Message) -> bool:
    return (
        msg.get_content_type() == "multipart/report"
        and str(msg.get_param("report-type", "")).lower() == "feedback-report"
    )


def parse_complaints(raw: bytes, *, verp_domain: str | None = None) -> list[Complaint] | None:
    """The complaints in ``raw``; None when it is not a feedback report at all."""
    msg = message_from_bytes(raw[:MAX_BOUNCE_BYTES])
    if not is_feedback_report(msg):
        return None
    report = _feedback_fields(msg)
    if report is None:
        return []
    feedback_type = str(report.get("Feedback-Type", "")).strip().lower()
    if feedback_type not in COMPLAINT_TYPES:
        return []
    command_id, message_id = correlate(msg, verp_domain)
    if command_id is None:
        return []
    recipients = _addresses(report.get_all("Original-Rcpt-To") or [])
    if not recipients:
        reported = _reported_headers(msg)
        if reported is not None:
            recipients = _addresses(reported.get_all("To") or [])
    return [Complaint(r, feedback_type, command_id, message_id) for r in recipients]


def _feedback_fields(msg: Message) -> Message | None:
    for part in msg.walk():
        if part.get_content_type() == "message/feedback-report":
            payload = part.get_payload()
            if isinstance(payload, list) and payload and isinstance(payload[0], Message):
                return payload[0]
    return None


def _reported_headers(msg: Message) -> Message | None:
    for part in msg.walk():
        kind = part.get_content_type()
        if kind == "message/rfc822":
            payload = part.get_payload()
            if isinstance(payload, list) and payload and isinstance(payload[0], Message):
                return payload[0]
        if kind == "text/rfc822-headers":
            body = part.get_payload(decode=True)
            if isinstance(body, bytes):
                return message_from_bytes(body)
    return None


def _addresses(values: Sequence[object]) -> list[str]:
    found: dict[str, None] = {}
    # The strict parser (CVE-2023-27043): a crafted field yields no address rather than a wrong one.
    for parsed in parse_addresses([" ".join(str(v).split()) for v in values]):
        addr = str(parsed["address"] or "")
        if "@" in addr:
            found.setdefault(addr.strip().lower(), None)
    return list(found)


def unsubscriber(raw: bytes, unsubscribe_address: str) -> str | None:
    """The sender of ``raw`` when it is addressed to ``unsubscribe_address``; else None.

    Automatic mail (``Auto-Submitted`` other than ``no``, RFC 3834: out-of-office replies,
    reports) and mail from the null sender are no one's request.
    """
    msg = message_from_bytes(raw[:MAX_BOUNCE_BYTES])
    if str(msg.get("Auto-Submitted", "no")).strip().lower() != "no":
        return None
    if str(msg.get("Return-Path", "")).strip() == "<>":
        return None
    wanted = unsubscribe_address.lower()
    for header in _ADDRESS_HEADERS:
        if wanted in _addresses(msg.get_all(header) or []):
            senders = _addresses(msg.get_all("From") or [])
            return senders[0] if len(senders) == 1 else None
    return None
