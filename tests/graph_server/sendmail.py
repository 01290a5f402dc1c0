"""``POST /v1.0/users/{id}/sendMail`` of the Graph test server, and bounces as NDR mail.

https://learn.microsoft.com/en-us/graph/api/user-sendmail:

- JSON: ``{"message": {subject, body {contentType, content}, toRecipients, ccRecipients,
  bccRecipients, replyTo, internetMessageHeaders}, "saveToSentItems": true}``;
- MIME: ``Content-Type: text/plain`` and the MIME message base64-encoded as the body; a body
  that is not base64 gets ``400 ErrorMimeContentInvalidBase64String`` "Invalid base64 string
  for MIME content.";
- success is ``202 Accepted`` with no body: the message is queued, nothing says whether it
  reached anyone. ``saveToSentItems`` (default true) keeps a copy in Sent Items.

What "sent" means here: the message is recorded in ``GraphTestServer.sent`` (for tests to
read), delivered into the inbox of each recipient that is a mailbox of this server, and for a
recipient a test marked as bouncing (``bounce_recipient``) a non-delivery report lands in the
sender's inbox later, as Exchange Online reports undeliverable mail
(https://learn.microsoft.com/en-us/exchange/mail-flow-best-practices/non-delivery-reports-in-exchange-online/non-delivery-reports-in-exchange-online):
a ``multipart/report; report-type=delivery-status`` (RFC 3464) from the postmaster, with a
``message/delivery-status`` part (``Final-Recipient``, ``Action: failed``, ``Status``,
``Diagnostic-Code``) and the original's headers as ``text/rfc822-headers``.
"""

from __future__ import annotations

import base64
import binascii
import email
import email.policy
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime
from email.message import EmailMessage
from email.utils import format_datetime, make_msgid
from typing import TYPE_CHECKING, Any

from aiohttp import web

from .auth import Principal
from .errors import GraphError
from .mailbox import Mailbox

if TYPE_CHECKING:
    from .server import GraphTestServer


@dataclass(frozen=True)
class SentMail:
    """One accepted sendMail call."""

    sender: str
    recipients: tuple[str, ...]  # To, Cc and Bcc
    mime: bytes
    saved_to_sent_items: bool
    json_message: dict[str, Any] | None  # None for the MIME variant


@dataclass(frozen=True)
class Bounce:
    status: str  # RFC 3463 enhanced status, "5.1.1"
    diagnostic: str  # the SMTP answer, "550 5.1.1 RESOLVER.ADR.RecipNotFound; not found"


class SendMail:
    """The sendMail extension of the server."""

    def __init__(self, server: GraphTestServer) -> None:
        self.server = server
        self.sent: list[SentMail] = []
        self.bouncing: dict[str, Bounce] = {}

    def install(self, app: web.Application) -> None:
        return None

    async def close(self) -> None:
        return None

    async def dispatch(
        self,
        request: web.Request,
        path: str,
        mailbox: Mailbox | None,
        rest: list[str],
        principal: Principal,
    ) -> web.StreamResponse | None:
        if mailbox is None or [s.lower() for s in rest] != ["sendmail"]:
            return None
        if request.method != "POST":
            raise GraphError(405, "BadRequest", "sendMail is a POST action.")
        content_type = request.content_type
        raw = await request.read()
        if content_type == "text/plain":
            try:
                mime = base64.b64decode(raw, validate=True)
            except (binascii.Error, ValueError):
                mime = b""
            if not mime or b"\n" not in mime:
                raise GraphError(
                    400,
                    "ErrorMimeContentInvalidBase64String",
                    "Invalid base64 string for MIME content.",
                )
            sent = self._send_mime(mailbox, mime, save=True)
        elif content_type == "application/json":
            try:
                body = await request.json()
                message = body["message"]
                if not isinstance(message, dict):
                    raise TypeError
            except (ValueError, KeyError, TypeError):
                raise GraphError(
                    400, "ErrorInvalidRequest", "The request body must carry a 'message' object."
                ) from None
            save = body.get("saveToSentItems", True) not in (False, "false", "False")
            sent = self._send_json(mailbox, message, save)
        else:
            raise GraphError(
                415,
                "UnsupportedMediaType",
                f"sendMail takes application/json or text/plain, not {content_type}.",
            )
        self._deliver(mailbox, sent)
        return web.Response(status=202)

    # -- building the message ----------------------------------------------------------------------

    def _send_json(self, mailbox: Mailbox, message: dict[str, Any], save: bool) -> SentMail:
        def addresses(name: str) -> list[str]:
            found = []
            for recipient in message.get(name) or []:
                address = (recipient.get("emailAddress") or {}).get("address")
                if not address:
                    raise GraphError(
                        400, "ErrorInvalidRecipients", f"A recipient in {name} has no address."
                    )
                found.append(str(address))
            return found

        to, cc, bcc = (
            addresses("toRecipients"),
            addresses("ccRecipients"),
            addresses("bccRecipients"),
        )
        if not (to or cc or bcc):
            raise GraphError(
                400,
                "ErrorInvalidRecipients",
                "At least one recipient isn't valid., A message can't be sent because it contains no recipients.",
            )
        out = EmailMessage()
        out["From"] = mailbox.address
        if to:
            out["To"] = ", ".join(to)
        if cc:
            out["Cc"] = ", ".join(cc)
        reply_to = addresses("replyTo")
        if reply_to:
            out["Reply-To"] = ", ".join(reply_to)
        out["Subject"] = str(message.get("subject") or "")
        out["Date"] = format_datetime(datetime.now(UTC))
        out["Message-ID"] = make_msgid(domain=mailbox.address.split("@")[-1])
        for header in message.get("internetMessageHeaders") or []:
            name = str(header.get("name", ""))
            # "Only headers starting with x- or X- can be added" (message resource).
            if not name.lower().startswith("x-"):
                raise GraphError(
                    400,
                    "InvalidInternetMessageHeader",
                    f"The internet message header name '{name}' should start with 'x-' or 'X-'.",
                )
            out[name] = str(header.get("value", ""))
        body = message.get("body") or {}
        subtype = "html" if str(body.get("contentType", "text")).lower() == "html" else "plain"
        out.set_content(str(body.get("content") or ""), subtype=subtype)
        mime = out.as_bytes(policy=email.policy.SMTP)
        return self._record(mailbox, mime, tuple(to + cc + bcc), save, message)

    def _send_mime(self, mailbox: Mailbox, mime: bytes, save: bool) -> SentMail:
        parsed = email.message_from_bytes(mime, policy=email.policy.default)
        recipients: list[str] = []
        for name in ("To", "Cc", "Bcc"):
            for header in parsed.get_all(name, []):
                recipients.extend(
                    a.addr_spec for a in getattr(header, "addresses", ()) if a.addr_spec
                )
        if not recipients:
            raise GraphError(
                400,
                "ErrorInvalidRecipients",
                "At least one recipient isn't valid., A message can't be sent because it contains no recipients.",
            )
        # Exchange strips Bcc from what recipients get; the sender's copy keeps it.
        return self._record(mailbox, mime, tuple(recipients), save, None)

    def _record(
        self,
        mailbox: Mailbox,
        mime: bytes,
        recipients: tuple[str, ...],
        save: bool,
        message: dict[str, Any] | None,
    ) -> SentMail:
        sent = SentMail(mailbox.address, recipients, mime, save, message)
        with self.server.store.cond:
            self.sent.append(sent)
            self.server.store.cond.notify_all()
        return sent

    # -- where it goes ---------------------------------------------------------------------------

    def _deliver(self, mailbox: Mailbox, sent: SentMail) -> None:
        store = self.server.store
        if sent.saved_to_sent_items:
            store.add_message(mailbox.address, sent.mime, folder="sentitems", is_read=True)
        for recipient in sent.recipients:
            bounce = self.bouncing.get(recipient.lower())
            if bounce is not None:
                store.add_message(
                    mailbox.address,
                    non_delivery_report(mailbox.address, recipient, bounce, sent.mime),
                )
                continue
            target = store.mailbox(recipient)
            if target is not None and not target.deleted:
                store.add_message(target.address, _without_bcc(sent.mime))


def _without_bcc(mime: bytes) -> bytes:
    parsed = email.message_from_bytes(mime, policy=email.policy.default)
    del parsed["Bcc"]
    return parsed.as_bytes(policy=email.policy.SMTP)


def non_delivery_report(sender: str, recipient: str, bounce: Bounce, original: bytes) -> bytes:
    """An RFC 3464 delivery status notification for ``recipient``, as Exchange Online sends it.

    Written out by hand: the stdlib generator wants ``message/delivery-status`` payloads as
    lists of header blocks, and the wire form is short::

        Content-Type: multipart/report; report-type=delivery-status; boundary="..."
        --...  text/plain (the human part)
        --...  message/delivery-status (Reporting-MTA; Final-Recipient, Action, Status, Diagnostic-Code)
        --...  text/rfc822-headers (the original's header block)
    """
    domain = sender.split("@")[-1]
    headers_end = original.find(b"\r\n\r\n")
    original_headers = original[: headers_end + 2] if headers_end >= 0 else original
    parsed = email.message_from_bytes(original, policy=email.policy.default)
    subject = str(parsed.get("Subject", ""))
    message_id = str(parsed.get("Message-ID", "") or "")
    boundary = f"ndr-{uuid.uuid4().hex}"
    host = f"{uuid.uuid4().hex[:8].upper()}.prod.outlook.com"
    lines = [
        f"From: Microsoft Outlook <MicrosoftExchange329e71ec88ae4615bbc36ab6ce41109e@{domain}>",
        f"To: {sender}",
        f"Subject: Undeliverable: {subject}",
        f"Date: {format_datetime(datetime.now(UTC))}",
        f"Message-ID: {make_msgid(domain=domain)}",
        "Auto-Submitted: auto-replied",
        *([f"In-Reply-To: {message_id}", f"References: {message_id}"] if message_id else []),
        "MIME-Version: 1.0",
        f'Content-Type: multipart/report; report-type=delivery-status; boundary="{boundary}"',
        "",
        f"--{boundary}",
        "Content-Type: text/plain; charset=utf-8",
        "",
        f"Your message to {recipient} couldn't be delivered.",
        "",
        bounce.diagnostic,
        "",
        f"--{boundary}",
        "Content-Type: message/delivery-status",
        "",
        f"Reporting-MTA: dns;{host}",
        "",
        f"Final-Recipient: rfc822;{recipient}",
        "Action: failed",
        f"Status: {bounce.status}",
        f"Diagnostic-Code: smtp;{bounce.diagnostic}",
        "",
        f"--{boundary}",
        "Content-Type: text/rfc822-headers",
        "",
    ]
    head = "\r\n".join(lines).encode() + b"\r\n"
    return head + original_headers.rstrip(b"\r\n") + f"\r\n\r\n--{boundary}--\r\n".encode()
