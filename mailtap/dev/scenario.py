"""The demo's sample mail: a ticket, its follow-up, an approval round trip and an auto-reply.

Pure functions (strings in, bytes out) so the same mails serve the demo, the pipeline tests and
the e2e benchmark. Every mail carries an ``Authentication-Results`` header of the demo's border
MTA (authserv-id :data:`AUTHSERV_ID`), as a real MTA would add, so the sender-authentication
guard runs for real. :func:`streams_section` is the streams configuration that answers them;
``mailtap dev up --secure`` writes it too, which is why this module is in the dev package (the
demo imports dev, never the other way round).
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from email.message import EmailMessage
from email.utils import format_datetime

AUTHSERV_ID = "mx.demo.example"
SUPPORT = "support@example.com"
APPROVALS = "approvals@example.com"
HELPDESK = "helpdesk@example.com"
APPROVER = "boss@example.com"
CUSTOMER = "alice@customer.example"
REQUESTER = "carol@example.com"
VACATION = "dave@customer.example"


@dataclass(frozen=True)
class SampleMail:
    label: str
    raw: bytes
    message_id: str
    #: Replies this mail should cause (received by the SMTP server), for the summary.
    expected_replies: int


def _mail(
    *,
    sender: str,
    sender_name: str,
    to: str,
    subject: str,
    body: str,
    message_id: str,
    in_reply_to: str | None = None,
    references: tuple[str, ...] = (),
    extra: dict[str, str] | None = None,
    attachment: tuple[str, str, bytes] | None = None,
) -> bytes:
    msg = EmailMessage()
    domain = sender.rpartition("@")[2]
    msg["Return-Path"] = f"<{sender}>"
    msg["Authentication-Results"] = (
        f"{AUTHSERV_ID}; dkim=pass header.d={domain}; spf=pass smtp.mailfrom={sender}; "
        f"dmarc=pass header.from={domain}"
    )
    msg["From"] = f"{sender_name} <{sender}>"
    msg["To"] = to
    msg["Subject"] = subject
    msg["Date"] = format_datetime(dt.datetime.now(dt.UTC))
    msg["Message-ID"] = f"<{message_id}>"
    if in_reply_to:
        msg["In-Reply-To"] = f"<{in_reply_to}>"
    if references:
        msg["References"] = " ".join(f"<{r}>" for r in references)
    for name, value in (extra or {}).items():
        msg[name] = value
    msg.set_content(body)
    if attachment:
        filename, ctype, data = attachment
        maintype, _, subtype = ctype.partition("/")
        msg.add_attachment(data, maintype=maintype, subtype=subtype, filename=filename)
    return bytes(msg)


def ticket_request(run: str) -> SampleMail:
    mid = f"ticket-{run}@customer.example"
    raw = _mail(
        sender=CUSTOMER,
        sender_name="Alice Martin",
        to=SUPPORT,
        subject="Printer on floor 3 prints blank pages",
        body="Hello,\n\nsince this morning the printer on floor 3 only prints blank pages.\n\nAlice",
        message_id=mid,
    )
    return SampleMail("ticket request", raw, mid, 1)


def ticket_followup(run: str, request: SampleMail) -> SampleMail:
    mid = f"ticket-followup-{run}@customer.example"
    raw = _mail(
        sender=CUSTOMER,
        sender_name="Alice Martin",
        to=SUPPORT,
        subject="Re: Printer on floor 3 prints blank pages",
        body="It also shows error E-42 now.\n\n> since this morning the printer...",
        message_id=mid,
        in_reply_to=request.message_id,
        references=(request.message_id,),
    )
    return SampleMail("follow-up in the ticket's thread", raw, mid, 1)


def approval_request(run: str) -> SampleMail:
    mid = f"expense-{run}@example.com"
    raw = _mail(
        sender=REQUESTER,
        sender_name="Carol Dupont",
        to=APPROVALS,
        subject="Expense report: client visit Lyon, 412,80 EUR",
        body="Please approve my expenses for the client visit in Lyon (receipt attached).\n\nCarol",
        message_id=mid,
        attachment=("receipt-lyon.pdf", "application/pdf", b"%PDF-1.4\n% demo receipt\n"),
    )
    # An acknowledgement to the requester and the forward to the approver.
    return SampleMail("approval request", raw, mid, 2)


def approver_answer(
    run: str, forward_message_id: str, forward_references: tuple[str, ...]
) -> SampleMail:
    mid = f"decision-{run}@example.com"
    raw = _mail(
        sender=APPROVER,
        sender_name="Bob Boss",
        to=APPROVALS,
        subject="Re: Expense report: client visit Lyon, 412,80 EUR",
        body="APPROVE\n\nFine, thanks for the receipt.\n\n> Please approve my expenses...",
        message_id=mid,
        in_reply_to=forward_message_id,
        references=(*forward_references, forward_message_id),
    )
    # The decision to the requester and a confirmation to the approver.
    return SampleMail("approver's answer", raw, mid, 2)


def auto_reply(run: str, request: SampleMail) -> SampleMail:
    mid = f"vacation-{run}@customer.example"
    raw = _mail(
        sender=VACATION,
        sender_name="Dave (away)",
        to=SUPPORT,
        subject="Automatic reply: out of office",
        body="I am out of the office until Monday.",
        message_id=mid,
        in_reply_to=request.message_id,
        extra={"Auto-Submitted": "auto-replied", "X-Auto-Response-Suppress": "All"},
    )
    return SampleMail("auto-reply (must be ignored)", raw, mid, 0)


def streams_section(run_scoped_app_id: str) -> dict[str, object]:
    """The ``streams`` config of the demo: two routing rules, the two built-in workflows."""
    return {
        "app_id": run_scoped_app_id,
        "from_address": {"name": "mailtap demo", "address": HELPDESK},
        "own_addresses": [SUPPORT, APPROVALS],
        "auth_policy": "authserv",
        "authserv_id": AUTHSERV_ID,
        "tick_interval_seconds": 1.0,
        # Every demo run writes as the same customers on the same worker state: with the default
        # (5 replies per sender and hour) the sixth run within an hour would be rate-limited.
        # The approver gets a forward per request: staff that workflows write to by
        # configuration are not limited per recipient (their mail still counts per sender).
        "rate_limit": {
            "max_replies": 1000,
            "window_seconds": 3600,
            "exempt_recipients": [APPROVER],
        },
        "rules": [
            {"name": "approvals", "match": {"recipient": APPROVALS}, "workflow": "approval"},
            {"name": "support", "match": {"recipient": SUPPORT}, "workflow": "ticket_intake"},
        ],
        "workflows": {
            "approval": {
                "options": {
                    "approver": APPROVER,
                    # Only an answer signed by example.com decides (the demo's MTA header says so).
                    "approver_dkim_domains": ["example.com"],
                    "reminder_after_seconds": 3600,
                }
            },
            "ticket_intake": {"options": {"team_name": "Helpdesk (demo)"}},
        },
    }
