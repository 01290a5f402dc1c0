"""Approval: a request goes to an approver, whose APPROVE or REJECT goes back to the requester.

Copy this module for workflows that wait for someone: a class with ``on_mail`` (mail-driven
steps) and ``on_tick`` (time-driven steps), its pending work kept in ``ctx.state``.

Behaviour:

1. A request (any routed mail that is not an answer to a known approval) is forwarded to the
   configured approver, attachments included (names made safe, ``safe_filename``), with the
   tag ``[APPROVAL <ID>]`` in the subject. The requester gets an acknowledgement
   (``acknowledge_requests``) that says only what the same step emitted: that the request was
   passed on, and which attachments went with it. The id is derived from the request's
   identity key, so a replay repeats the same commands.
2. The approver answers in the thread (the forward carries the request's Message-ID in its
   References; the subject tag is the fallback). The first unquoted line that says APPROVE(D) or
   REJECT(ED) decides; the rest of the unquoted text goes to the requester as a comment. The
   requester gets the decision as a reply to the original request; the approver gets a
   confirmation (``confirm_decisions``). An answer that says neither gets a "please answer
   APPROVE or REJECT" reply; an answer to a decided request is told so.
3. While a request is pending, a reminder goes to the approver every ``reminder_after_seconds``
   (at most ``max_reminders``). The reminder number is derived from the elapsed time, so its
   command id is stable across restarts and a re-sent reminder is absorbed by the sink.
4. Mail from anyone else in a pending request's thread gets a status answer.

Who may decide (every rule must hold; ``streams/README.md`` states them for operators):

- the answer passed the sender-authentication guard, like every mail: ``require`` is
  ``dmarc-pass`` for this workflow unless configured (``trusted-ar`` or ``dkim-aligned`` are
  the alternatives; never ``none`` in production). That authenticates the From
  *domain* only: anyone who may send as ``someone@example.com`` passes for every address of it;
- its From is exactly the approver's address (``approver``, case-insensitive);
- with ``approver_dkim_domains`` set, it carries a verified DKIM signature whose ``d=`` is one
  of them (``ctx.authentication.dkim_domains``): name a domain only the approver's mail system
  signs with, so that a colleague who can write ``From: boss@...`` (through a relay the SPF
  record allows) cannot decide;
- it does not come from the requester: an answer whose envelope sender (``smtp.mailfrom`` or
  Return-Path) or From is one of the request's addresses (From, answer address, envelope
  sender) decides nothing, so nobody approves their own request.

An answer from the approver's address that breaks a rule decides nothing and gets no reply (we
do not write to an address that may be forged); ``APPROVAL_REFUSED`` says why. The routing rule
must send the approver's answers to this workflow too (route on the mailbox, not on "has an
attachment").

Status events (key: the approval id): ``APPROVAL_REQUESTED``, ``APPROVAL_REMINDED``,
``APPROVED``, ``REJECTED``, ``APPROVAL_UNCLEAR``, ``APPROVAL_REFUSED`` (key: the request's id
when known, else the answer's mail key; attribute ``reason``).

Retention (``expire``): a decided request whose decision is older than
``streams.state_retention_days`` is deleted with its thread entry, and so is an early answer
that old whose request never came; a pending request is kept.

State::

    request/<ID>          {"id", "status", "requester": ThreadRef, "event_key", "subject",
                           "requested_at": epoch seconds, "reminders": n,
                           "requester_addresses": [...], "decided_by", ...}
    thread/<message-id>   "<ID>"   (the request's Message-ID)

Configuration::

    streams:
      workflows:
        approval:
          require: dmarc-pass
          options: {approver: boss@example.com, approver_dkim_domains: [example.com],
                    reminder_after_seconds: 86400, max_reminders: 3}
"""

from __future__ import annotations

import datetime as dt
import re
from typing import Any, Literal

from pydantic import Field

from connectors.core.config import StrictModel
from streams.mail import Address, MailView, ThreadRef
from streams.workflow import (
    WorkflowContext,
    WorkflowState,
    forwardable_attachments,
    one_line,
    reply_subject,
    safe_filename,
    short_id,
    workflow,
)

NAME = "approval"
TAG = re.compile(r"\[APPROVAL ([A-Z2-7]{8})\]")
PENDING = "PENDING"
Decision = Literal["APPROVED", "REJECTED"]

_DECISION = re.compile(r"\b(APPROVED?|REJECT(?:ED)?)\b", re.IGNORECASE)
#: Where quoted history starts in common clients (Gmail/Thunderbird, Outlook, our forward).
_QUOTE_START = re.compile(
    r"^(On .+ wrote:|Am .+ schrieb .+:|-{2,} ?(Original Message|Forwarded message) ?-{2,}"
    r"|From: .+)\s*$",
    re.IGNORECASE,
)


class ApprovalOptions(StrictModel):
    approver: str = Field(description="address of the approver")
    approver_name: str | None = None
    approver_dkim_domains: list[str] = Field(
        default_factory=list,
        description=(
            "when set, an answer decides only with a verified DKIM signature of one of these "
            "domains (d=, exact); empty: the sender-authentication guard alone"
        ),
    )
    reminder_after_seconds: float = Field(default=86400.0, gt=0)
    max_reminders: int = Field(default=3, ge=0)
    acknowledge_requests: bool = True
    confirm_decisions: bool = True


def approval_id(event_key: str) -> str:
    return short_id(event_key)


def fresh_text(body: str | None) -> list[str]:
    """The lines of an answer above the quoted history."""
    lines: list[str] = []
    for line in (body or "").splitlines():
        stripped = line.strip()
        if stripped.startswith(">") or _QUOTE_START.match(stripped):
            break
        lines.append(line.rstrip())
    while lines and not lines[-1]:
        lines.pop()
    return lines


def parse_decision(mail: MailView) -> tuple[Decision | None, str]:
    """(decision, comment) from the unquoted text; the subject only when the text says nothing.

    >>> import datetime as dt
    >>> m = MailView.from_record({"key": "k", "account": "a", "source": {}, "guard_headers": {},
    ...     "text_body": "Approved, thanks.\\n\\nOn Mon, Ann wrote:\\n> please REJECT or APPROVE",
    ...     "observed_at": dt.datetime(2026, 1, 1, tzinfo=dt.timezone.utc)})
    >>> parse_decision(m)
    ('APPROVED', 'Approved, thanks.')
    """
    lines = fresh_text(mail.text_body)
    for text in [*lines, TAG.sub("", mail.subject or "")]:
        found = _DECISION.search(text)
        if found:
            decision: Decision = (
                "APPROVED" if found.group(1).upper().startswith("APPROVE") else "REJECTED"
            )
            return decision, "\n".join(lines).strip()
    return None, "\n".join(lines).strip()


@workflow(NAME, options=ApprovalOptions)
class Approval:
    def on_mail(self, mail: MailView, ctx: WorkflowContext) -> None:
        options: ApprovalOptions = ctx.options
        request = self._find(mail, ctx)
        sender = mail.sender.normalized if mail.sender else ""
        from_approver = sender == options.approver.strip().lower()
        if from_approver:
            refusal = _unverified(ctx, options)
            if refusal is not None:
                _refuse(mail, ctx, request, refusal)
                return
        if request is None and from_approver:
            # The approver never asks themself for approval: this answers a request we do not
            # know yet (a replay with empty state reads the thread's mails in another order).
            self._early_answer(mail, ctx)
        elif request is None or request["event_key"] == mail.key:
            self._request(mail, ctx)
        elif from_approver:
            self._answer(mail, ctx, request)
        else:
            self._status(mail, ctx, request)

    def on_tick(self, ctx: WorkflowContext) -> None:
        options: ApprovalOptions = ctx.options
        now = ctx.now.timestamp()
        for key, request in ctx.state.items("request/"):
            if request["status"] != PENDING:
                continue
            due = min(
                int((now - request["requested_at"]) // options.reminder_after_seconds),
                options.max_reminders,
            )
            if due <= request["reminders"]:
                continue
            ref = ThreadRef.from_state(request["requester"])
            ctx.send(
                f"reminder-{due}",
                [_approver(options)],
                f"Reminder: [APPROVAL {request['id']}] {one_line(request['subject'])}",
                f"The request [APPROVAL {request['id']}] from {_who(ref)} is still waiting "
                f"for your decision.\nAnswer this mail with APPROVE or REJECT.\n",
                event_key=request["event_key"],
                thread=ref,
            )
            ctx.state.set(key, {**request, "reminders": due})
            ctx.emit(
                "APPROVAL_REMINDED",
                {"reminder": due},
                instance_id=request["id"],
                event_key=request["event_key"],
            )

    def expire(self, state: WorkflowState, before: dt.datetime) -> None:
        cutoff = before.timestamp()
        for key, request in state.items("request/"):
            if request["status"] != PENDING and request.get("decided_at", cutoff) < cutoff:
                state.delete(key)
        for key, early in state.items("early/"):
            if early.get("decided_at", cutoff) < cutoff:
                state.delete(key)
        for key, aid in state.items("thread/"):
            if state.get(f"request/{aid}") is None:
                state.delete(key)

    # -- steps ------------------------------------------------------------------------------

    def _find(self, mail: MailView, ctx: WorkflowContext) -> dict[str, Any] | None:
        for mid in (mail.message_id, *mail.thread_ids):
            aid = ctx.state.get(f"thread/{mid}") if mid else None
            if aid:
                found: dict[str, Any] | None = ctx.state.get(f"request/{aid}")
                if found:
                    return found
        for aid in TAG.findall(mail.subject or ""):
            tagged: dict[str, Any] | None = ctx.state.get(f"request/{aid}")
            if tagged:
                return tagged
        return None

    def _request(self, mail: MailView, ctx: WorkflowContext) -> None:
        options: ApprovalOptions = ctx.options
        aid = approval_id(mail.key)
        ref = mail.thread_ref()
        passed_on = [safe_filename(a.filename) for a in forwardable_attachments(mail)]
        left_out = [safe_filename(a.filename) for a in mail.attachments if not a.uri]
        files = ", ".join(passed_on) or "none"
        ctx.forward(
            "request",
            [_approver(options)],
            f"{_who(ref)} asks for your approval.\n\n"
            f"Subject: {one_line(mail.subject)}\nAttachments: {files}\n\n"
            f"Answer this mail with APPROVE or REJECT on the first line; what you write below\n"
            f"it is passed on to the requester as your comment.\n",
            subject=f"[APPROVAL {aid}] {one_line(mail.subject) or '(no subject)'}",
        )
        if options.acknowledge_requests:
            # Says only what this step emitted (the forward command, in the same outcome): not
            # that the approver has it, and no attachment that did not go with it.
            missing = (
                f"Not passed on (not stored, please send them again): {', '.join(left_out)}\n"
                if left_out
                else ""
            )
            ctx.reply(
                "received",
                f"Your request was passed on to {options.approver_name or options.approver} "
                f"for approval (reference [APPROVAL {aid}]).\n"
                f"Attachments passed on: {files}\n{missing}"
                f"You will get the decision by mail.\n",
            )
        ctx.state.set(
            f"request/{aid}",
            {
                "id": aid,
                "status": PENDING,
                "event_key": mail.key,
                "requester": ref.to_state(),
                "subject": mail.subject,
                "requested_at": mail.observed_at.timestamp(),
                "reminders": 0,
                "requester_addresses": sorted(_identities(mail, ctx)),
            },
        )
        if mail.message_id:
            ctx.state.set(f"thread/{mail.message_id}", aid)
        ctx.emit(
            "APPROVAL_REQUESTED",
            {"requester": _who(ref), "approver": options.approver, "subject": mail.subject},
            instance_id=aid,
        )
        early = ctx.state.get(f"early/{mail.message_id}") or ctx.state.get(f"early/{aid}")
        if early:
            request = ctx.state.get(f"request/{aid}")
            own = _own_request(request, early.get("decided_by_addresses") or ())
            if own is not None:
                ctx.emit("APPROVAL_REFUSED", {"reason": own}, instance_id=aid)
            else:
                self._decide(ctx, request, early["decision"], early["comment"], early)

    def _early_answer(self, mail: MailView, ctx: WorkflowContext) -> None:
        """Keep the approver's decision until its request arrives; :meth:`_request` applies it.

        The decision reaches the requester with the command id it would have had in order
        (derived from the answer's key), so a replay in another order sends nothing new.
        """
        decision, comment = parse_decision(mail)
        if decision is not None:
            early = {
                "decision": decision,
                "comment": comment,
                "event_key": mail.key,
                "decided_by": mail.sender.address if mail.sender else None,
                "decided_at": mail.observed_at.timestamp(),
                "decided_by_addresses": sorted(_identities(mail, ctx)),
            }
            for ref in [*mail.thread_ids, *TAG.findall(mail.subject or "")]:
                ctx.state.set(f"early/{ref}", early)
        ctx.reply(
            "unknown-request",
            "No pending approval request matches your answer"
            + ("; it will be applied when the request arrives.\n" if decision else ".\n"),
        )

    def _answer(self, mail: MailView, ctx: WorkflowContext, request: dict[str, Any]) -> None:
        options: ApprovalOptions = ctx.options
        aid = request["id"]
        # decided_by_key == this mail: a replay after a partial commit; decide again, same ids.
        if request["status"] != PENDING and request.get("decided_by_key") != mail.key:
            ctx.reply(
                "already-decided",
                f"[APPROVAL {aid}] was already decided: {request['status']}. Nothing changed.\n",
            )
            return
        own = _own_request(request, _identities(mail, ctx))
        if own is not None:
            _refuse(mail, ctx, request, own)
            return
        decision, comment = parse_decision(mail)
        if decision is None:
            ctx.reply(
                "unclear",
                f"Your answer to [APPROVAL {aid}] did not say APPROVE or REJECT.\n"
                f"Please answer again with one of these words on the first line.\n",
            )
            ctx.emit("APPROVAL_UNCLEAR", {"from": options.approver}, instance_id=aid)
            return
        answer = {
            "event_key": mail.key,
            "decided_by": mail.sender.address if mail.sender else None,
            "decided_at": mail.observed_at.timestamp(),
        }
        self._decide(ctx, request, decision, comment, answer)
        if options.confirm_decisions:
            requester = ThreadRef.from_state(request["requester"])
            ctx.reply(
                "confirmation",
                f"Recorded: [APPROVAL {aid}] {decision}. {_who(requester)} was informed.\n",
            )

    def _decide(
        self,
        ctx: WorkflowContext,
        request: dict[str, Any],
        decision: Decision,
        comment: str,
        answer: dict[str, Any],
    ) -> None:
        """Tell the requester and record the decision; ``answer`` names the approver's mail."""
        options: ApprovalOptions = ctx.options
        aid = request["id"]
        requester = ThreadRef.from_state(request["requester"])
        verb = "approved" if decision == "APPROVED" else "rejected"
        note = f"\n\nComment from the approver:\n{comment}\n" if comment else "\n"
        ctx.reply(
            "decision",
            f'Your request [APPROVAL {aid}] "{one_line(request["subject"])}" was {verb} by '
            f"{options.approver_name or options.approver}.{note}",
            thread=requester,
            subject=reply_subject(requester.subject),
            event_key=answer["event_key"],
        )
        ctx.state.set(
            f"request/{aid}",
            {
                **request,
                "status": decision,
                "decided_by": answer["decided_by"],
                "decided_at": answer["decided_at"],
                "decided_by_key": answer["event_key"],
            },
        )
        ctx.emit(
            decision,
            {"decided_by": options.approver, "requester": _who(requester)},
            instance_id=aid,
            event_key=answer["event_key"],
        )

    def _status(self, mail: MailView, ctx: WorkflowContext, request: dict[str, Any]) -> None:
        state = (
            "is waiting for a decision"
            if request["status"] == PENDING
            else (f"was {request['status'].lower()}")
        )
        ctx.reply("status", f"Your request [APPROVAL {request['id']}] {state}.\n")


def _unverified(ctx: WorkflowContext, options: ApprovalOptions) -> str | None:
    """Why a mail from the approver's address may not decide, or None when it may."""
    wanted = {d.strip().lower().rstrip(".") for d in options.approver_dkim_domains}
    if not wanted:
        return None
    signed = ctx.authentication.dkim_domains if ctx.authentication else frozenset()
    if signed & wanted:
        return None
    return (
        f"no verified DKIM signature of {', '.join(sorted(wanted))} "
        f"(signed by: {', '.join(sorted(signed)) or 'nobody'})"
    )


def _identities(mail: MailView, ctx: WorkflowContext) -> set[str]:
    """The addresses a mail speaks for: From, the answer address and the envelope sender."""
    found = {a.normalized for a in (mail.sender, mail.reply_address) if a is not None}
    auth = ctx.authentication
    envelope = auth.envelope_from if auth else mail.guard_headers.return_path
    envelope = (envelope or "").strip().strip("<>").strip().lower()
    if "@" in envelope:
        found.add(envelope)
    return found


def _own_request(request: dict[str, Any], deciders: Any) -> str | None:
    """Why ``deciders`` (addresses of an answer) may not decide ``request``, or None."""
    mine = set(request.get("requester_addresses") or ())
    ref = ThreadRef.from_state(request["requester"])
    if ref.reply_address is not None:
        mine.add(ref.reply_address.normalized)
    same = mine & set(deciders)
    if same:
        return (
            f"sent by the requester ({', '.join(sorted(same))}): nobody decides their own request"
        )
    return None


def _refuse(
    mail: MailView, ctx: WorkflowContext, request: dict[str, Any] | None, reason: str
) -> None:
    """No decision, no reply (the approver's address may be forged): only the event says why."""
    ctx.emit(
        "APPROVAL_REFUSED",
        {"reason": reason, "from": mail.sender.address if mail.sender else None},
        instance_id=request["id"] if request else mail.key,
    )


def _approver(options: ApprovalOptions) -> Address:
    return Address(options.approver, options.approver_name)


def _who(ref: ThreadRef) -> str:
    return ref.reply_address.address if ref.reply_address else "(unknown sender)"
