"""Ticket intake: acknowledge a new request with a ticket number; keep its thread on that ticket.

Copy this module to write your own workflow: a function, decorated with ``@workflow(name,
options=Model)``, that reads the mail and acts through ``ctx`` only.

Behaviour:

- A mail that belongs to no known ticket opens one. The number is derived from the mail's
  identity key (8 base32 characters of its sha256), so a replay gives the same number and the
  same acknowledgement command id. The acknowledgement answers in the thread and carries the tag
  ``[#NUMBER]`` in its subject.
- A later mail attaches to an existing ticket when its In-Reply-To/References name a mail of
  that ticket, or its subject carries the ``[#NUMBER]`` tag. It opens no new ticket; with
  ``acknowledge_followups`` (default) it gets a short "added to your ticket" answer.
- Status events on ``mail.workflow`` (key: the ticket number): ``TICKET_OPENED``,
  ``TICKET_UPDATED``.
- A ticket has no closing step: one whose last mail is older than
  ``streams.state_retention_days`` counts as final and is deleted with its thread entries
  (:func:`expire_tickets`); a later mail with its tag opens a new ticket.

State (keys inside this workflow's space of the state table)::

    ticket/<NUMBER>       {"id", "opened_by", "subject", "requester", "opened_at",
                           "updated_at" (the last mail's observed_at), "mails": [keys]}
    thread/<message-id>   "<NUMBER>"     (every mail of the ticket, so deep threads still attach)

Configuration::

    streams:
      workflows:
        ticket_intake:
          options: {acknowledge_followups: true, team_name: "Helpdesk"}
"""

from __future__ import annotations

import datetime as dt
import re
from typing import Any

from connectors.core.config import StrictModel
from streams.mail import MailView
from streams.workflow import WorkflowContext, WorkflowState, reply_subject, short_id, workflow

NAME = "ticket_intake"
TAG = re.compile(r"\[#([A-Z2-7]{8})\]")


class TicketIntakeOptions(StrictModel):
    acknowledge_followups: bool = True
    """Answer mails that attach to an existing ticket (one short reply each)."""
    team_name: str = "Support"
    """Signature of the acknowledgements."""


def ticket_number(event_key: str) -> str:
    """Stable ticket number of the mail that opened the ticket: 8 base32 characters."""
    return short_id(event_key)


def tagged_subject(subject: str | None, number: str) -> str:
    """``Re: <subject> [#NUMBER]``, without doubling the prefix or the tag."""
    text = reply_subject(subject)
    return text if f"[#{number}]" in text else f"{text} [#{number}]"


def find_ticket(mail: MailView, ctx: WorkflowContext) -> dict[str, Any] | None:
    """The ticket this mail belongs to: by Message-ID chain first, then by subject tag."""
    for mid in (mail.message_id, *mail.thread_ids):
        number = ctx.state.get(f"thread/{mid}") if mid else None
        if number:
            found: dict[str, Any] | None = ctx.state.get(f"ticket/{number}")
            if found:
                return found
    for number in TAG.findall(mail.subject or ""):
        tagged: dict[str, Any] | None = ctx.state.get(f"ticket/{number}")
        if tagged:
            return tagged
    return None


def expire_tickets(state: WorkflowState, before: dt.datetime) -> None:
    """Delete tickets whose last mail was observed before ``before``, and their threads."""
    for key, ticket in state.items("ticket/"):
        last = ticket.get("updated_at") or ticket["opened_at"]
        if dt.datetime.fromisoformat(last) < before:
            state.delete(key)
    for key, number in state.items("thread/"):
        if state.get(f"ticket/{number}") is None:
            state.delete(key)


@workflow(NAME, options=TicketIntakeOptions, expire=expire_tickets)
def ticket_intake(mail: MailView, ctx: WorkflowContext) -> None:
    ticket = find_ticket(mail, ctx)
    # A ticket opened by this very mail means a replay after a partial commit: open it again,
    # which repeats the same command ids.
    if ticket is None or ticket["opened_by"] == mail.key:
        _open(mail, ctx)
    else:
        _attach(mail, ctx, ticket)


def _greeting(mail: MailView) -> str:
    name = mail.sender.name if mail.sender and mail.sender.name else None
    return f"Hello {name}," if name else "Hello,"


def _open(mail: MailView, ctx: WorkflowContext) -> None:
    options: TicketIntakeOptions = ctx.options
    number = ticket_number(mail.key)
    ctx.reply(
        "acknowledge",
        f"{_greeting(mail)}\n\n"
        f"thank you for your message. We opened ticket #{number} for it.\n"
        f"Please keep [#{number}] in the subject of further mails about this request;\n"
        f"answers in this thread are added to the ticket automatically.\n\n"
        f"-- \n{options.team_name}\n",
        subject=tagged_subject(mail.subject, number),
    )
    ctx.state.set(
        f"ticket/{number}",
        {
            "id": number,
            "opened_by": mail.key,
            "subject": mail.subject,
            "requester": mail.reply_address.address if mail.reply_address else None,
            "opened_at": mail.observed_at.isoformat(),
            "mails": [mail.key],
        },
    )
    if mail.message_id:
        ctx.state.set(f"thread/{mail.message_id}", number)
    ctx.emit(
        "TICKET_OPENED",
        {
            "requester": mail.reply_address.address if mail.reply_address else None,
            "subject": mail.subject,
        },
        instance_id=number,
    )


def _attach(mail: MailView, ctx: WorkflowContext, ticket: dict[str, Any]) -> None:
    options: TicketIntakeOptions = ctx.options
    number = str(ticket["id"])
    mails = list(ticket.get("mails") or [])
    if mail.key not in mails:
        mails.append(mail.key)
    # Mails of a thread may be read out of order: the ticket's age is that of its latest mail.
    last = dt.datetime.fromisoformat(ticket.get("updated_at") or ticket["opened_at"])
    updated = max(last, mail.observed_at).isoformat()
    ctx.state.set(f"ticket/{number}", {**ticket, "mails": mails, "updated_at": updated})
    if mail.message_id:
        ctx.state.set(f"thread/{mail.message_id}", number)
    if options.acknowledge_followups:
        ctx.reply(
            "followup",
            f"{_greeting(mail)}\n\n"
            f"your message was added to ticket #{number}.\n\n-- \n{options.team_name}\n",
            subject=tagged_subject(mail.subject, number),
        )
    ctx.emit(
        "TICKET_UPDATED",
        {"from": mail.sender.address if mail.sender else None, "mails": len(mails)},
        instance_id=number,
    )
