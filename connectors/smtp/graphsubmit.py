"""What a reply becomes on Microsoft Graph's ``sendMail``, and what Graph's answer means. Pure.

The request (https://learn.microsoft.com/en-us/graph/api/user-sendmail, "Example 4: send a new
message using MIME format")::

    POST /v1.0/users/support@contoso.com/sendMail
    Content-Type: text/plain

    RnJvbTogU3VwcG9ydCA8c3VwcG9ydEBjb250b3NvLmNvbT4NClRvOiBhQGV4YW1wbGUub3Jn...   (base64 MIME)

    HTTP/1.1 202 Accepted

The MIME variant, not the JSON one: only MIME carries the headers a reply needs (``Message-ID``,
``In-Reply-To``, ``References``, ``Auto-Submitted``, ``List-Unsubscribe``); the JSON message
takes custom headers only when their name starts with ``x-`` (message resource,
``internetMessageHeaders``). Exchange reads the recipients from the MIME headers, so the
recipients of this attempt (:attr:`RenderedMessage.recipients`: without the suppressed ones, or
only the pending ones of a retry) are written there, Bcc included (Exchange removes the Bcc
header from what recipients get).

The answer, per recipient (Graph answers for the whole message, never per recipient):

=======================================  ==============================================================
202 Accepted                             SENT: queued by Exchange Online, "it does not indicate that the
                                         request processing has completed" (user-sendmail); a recipient
                                         that later bounces comes back as an NDR in the sending mailbox
429, 503, 504                            DEFERRED (throttling, learn.microsoft.com/graph/throttling); the
                                         transport holds further sends until ``Retry-After`` has passed
401, 403 ``ErrorAccessDenied``, 404     DEFERRED: ours, not the message's (a revoked secret, Mail.Send
on the sending mailbox                   not granted, ``smtp.graph.user`` wrong or unlicensed); the sink
                                         says so loudly, the retry tiers keep the mail until fixed
other 4xx                                FAILED: the message cannot be sent as it is (invalid recipients,
                                         invalid MIME, too large)
other 5xx                                UNKNOWN: Graph may have queued it; resent with the same Message-ID
=======================================  ==============================================================
"""

from __future__ import annotations

import base64
import email.parser
from collections.abc import Sequence
from email.headerregistry import AddressHeader
from email.message import EmailMessage

from connectors.smtp.classify import MAX_DIAGNOSTIC, DeliveryStatus, RecipientOutcome
from connectors.smtp.render import SMTP_POLICY, SMTPUTF8_POLICY, RenderedMessage

#: Answers that mean "busy, try later" (throttling: "429 Too Many Requests", "503 Service
#: Unavailable", "504 Gateway Timeout", each with Retry-After when Graph knows how long).
THROTTLED = frozenset({429, 503, 504})
#: 403 codes that are the application's permissions, not the message: fix the tenant, keep it.
ACCESS_CODES = frozenset({"ErrorAccessDenied", "Authorization_RequestDenied", "AccessDenied"})
#: 404 codes of the sending mailbox itself (a wrong ``smtp.graph.user``, a mailbox deleted or
#: unlicensed): every message would fail alike, so it is configuration, not the message.
MAILBOX_CODES = frozenset({"ErrorInvalidUser", "MailboxNotEnabledForRESTAPI", "ResourceNotFound"})
#: Graph's REST requests are limited to 4 MB ("Attach large files to Outlook messages": a single
#: POST carries under 3 MB of attachment); the MIME travels base64-encoded, 4/3 of its size.
MAX_REQUEST_BYTES = 4 * 1024 * 1024
_RECIPIENT_HEADERS = ("To", "Cc", "Bcc")


def request_body(rendered: RenderedMessage) -> bytes:
    """The base64 ``text/plain`` body of the request: :func:`submission_mime` encoded."""
    return base64.b64encode(submission_mime(rendered))


def submission_mime(rendered: RenderedMessage) -> bytes:
    """The rendered message with To/Cc/Bcc naming exactly this attempt's recipients.

    Unchanged when the headers already do (the usual case: no Bcc, nothing suppressed, a first
    attempt); otherwise To and Cc lose the recipients not sent to this time and a Bcc header
    names the envelope recipients the headers do not show. The body is kept byte for byte.
    """
    data = rendered.data
    split = data.find(b"\r\n\r\n")
    head, body = (data[: split + 2], data[split + 2 :]) if split >= 0 else (data, b"")
    header_policy = SMTPUTF8_POLICY if rendered.smtputf8 else SMTP_POLICY
    parsed = email.parser.BytesHeaderParser(policy=header_policy).parsebytes(head)
    wanted = {r.lower() for r in rendered.recipients}
    shown: dict[str, list[str]] = {}
    for name in _RECIPIENT_HEADERS:
        header = parsed.get(name)
        addresses = header.addresses if isinstance(header, AddressHeader) else ()
        shown[name] = [a.addr_spec.lower() for a in addresses]
    listed = {a for values in shown.values() for a in values}
    if listed == wanted and not shown["Bcc"]:
        return data
    message = EmailMessage(policy=header_policy)
    for name, value in parsed.items():
        if name.title() not in _RECIPIENT_HEADERS:
            message[name] = value
            continue
        header = parsed.get(name)
        kept = [
            a
            for a in (header.addresses if isinstance(header, AddressHeader) else ())
            if a.addr_spec.lower() in wanted
        ]
        if kept and name.title() != "Bcc":
            message[name] = kept
    visible = {a for name in ("To", "Cc") for a in shown[name]}
    hidden = [r for r in rendered.recipients if r.lower() not in visible]
    if hidden:
        message["Bcc"] = ", ".join(hidden)
    folded = b"".join(header_policy.fold_binary(k, v) for k, v in message.items())
    return folded + body


def accepted(recipients: Sequence[str]) -> list[RecipientOutcome]:
    """202: queued by Exchange Online for every recipient."""
    diagnostic = (
        "202 Accepted by Microsoft Graph sendMail: queued by Exchange Online; a bounce comes "
        "back as an NDR in the sending mailbox"
    )
    return [RecipientOutcome(r, DeliveryStatus.SENT, diagnostic=diagnostic) for r in recipients]


def refused(
    recipients: Sequence[str], status: int, code: str, message: str
) -> list[RecipientOutcome]:
    """Outcomes of a non-2xx answer (``code``/``message``: Graph's ``error`` object)."""
    text = f"Microsoft Graph sendMail answered {status} {code}: {message}".rstrip(": ")
    if status in THROTTLED:
        outcome = DeliveryStatus.DEFERRED
    elif is_access_problem(status, code):
        outcome = DeliveryStatus.DEFERRED
        text = f"{text} (the application's access, not the message: check smtp.graph)"
    elif 400 <= status < 500:
        outcome = DeliveryStatus.FAILED
    else:
        outcome = DeliveryStatus.UNKNOWN
        text = f"{text} (Graph may have queued the message)"
    return [RecipientOutcome(r, outcome, diagnostic=text[:MAX_DIAGNOSTIC]) for r in recipients]


def is_access_problem(status: int, code: str) -> bool:
    """A refusal of the application or its mailbox (credentials, Mail.Send, an access policy,
    a sending mailbox that does not exist), not of the message."""
    return (
        status == 401
        or (status == 403 and code in ACCESS_CODES)
        or (status == 404 and code in MAILBOX_CODES)
    )


def unanswered(recipients: Sequence[str], why: str, *, maybe_sent: bool) -> list[RecipientOutcome]:
    """No answer: UNKNOWN when the request went out whole (Graph may have queued it), else
    DEFERRED (nothing was accepted)."""
    status = DeliveryStatus.UNKNOWN if maybe_sent else DeliveryStatus.DEFERRED
    return [RecipientOutcome(r, status, diagnostic=why[:MAX_DIAGNOSTIC]) for r in recipients]
