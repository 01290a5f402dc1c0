"""Bounded table state: final state older than ``streams.state_retention_days`` is swept, and
the conversation key that places a mail's state (``connectors.core.mail.conversation``)."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest

from connectors.core.errors import ConfigError
from connectors.core.mail.conversation import conversation_key
from streams.testing import EPOCH, WorkflowHarness, mail_record
from streams.workflows.approval import approval_id
from streams.workflows.ticket_intake import ticket_number

BOSS = "boss@example.com"
SETTINGS: dict[str, Any] = {
    "from_address": {"address": "help@example.com"},
    "auth_policy": "none",
    "state_retention_days": 30,
    "rules": [
        {"match": {"recipient": "approvals@example.com"}, "workflow": "approval"},
        {"match": {"recipient": "support@example.com"}, "workflow": "ticket_intake"},
    ],
    "workflows": {"approval": {"options": {"approver": BOSS, "reminder_after_seconds": 3600}}},
}


def days(n: float) -> dt.datetime:
    return EPOCH + dt.timedelta(days=n)


def ticket_story() -> list[dict[str, Any]]:
    opening = mail_record(message_id="t1@example.com")
    followup = mail_record(
        message_id="t2@example.com",
        in_reply_to="ack@mailtap",
        references=["t1@example.com", "ack@mailtap"],
        observed_at=days(10),
    )
    return [opening, followup]


def approval_story() -> list[dict[str, Any]]:
    request = mail_record(
        message_id="req@example.com", to=["approvals@example.com"], subject="Hotel"
    )
    answer = mail_record(
        message_id="ans@example.com",
        sender=BOSS,
        to=["approvals@example.com"],
        subject=f"Re: [APPROVAL {approval_id(request['key'])}] Hotel",
        text_body="APPROVE",
        in_reply_to="fwd@mailtap",
        references=["req@example.com", "fwd@mailtap"],
        observed_at=days(1),
    )
    return [request, answer]


def pending_request() -> dict[str, Any]:
    return mail_record(
        message_id="pending@example.com", to=["approvals@example.com"], subject="Laptop"
    )


def test_state_shrinks_after_the_retention_and_a_replay_inside_it_sends_nothing_twice() -> None:
    harness = WorkflowHarness(SETTINGS)
    mails = [*ticket_story(), *approval_story(), pending_request()]
    for mail in mails:
        harness.deliver(mail)
    sent = {c["command_id"] for c in harness.commands}
    number = ticket_number(mails[0]["key"])
    full_state, full_runs = dict(harness.tables.state), dict(harness.tables.runs)

    # 29 days on, every mail is inside the window: nothing goes, and a replay of every mail
    # meets its dedupe mark.
    assert harness.sweep(days(29)).state == {}
    assert harness.tables.state == full_state and len(harness.tables.runs) == len(full_runs)
    statuses = harness.statuses()
    assert all(harness.deliver(mail).already_ran for mail in mails)
    assert {c["command_id"] for c in harness.commands} == sent
    assert harness.statuses() == statuses

    # The clock moves past the retention of every final state: it becomes tombstones.
    harness.sweep(days(45))
    assert harness.tables.runs == {}
    left = sorted(harness.tables.state)
    pending = f"approval/request/{approval_id(mails[-1]['key'])}"
    # The undecided request stays (not final), with the thread entry that finds it.
    assert left == [pending, "approval/thread/pending@example.com"]
    assert f"ticket_intake/ticket/{number}" in full_state


def test_a_followup_keeps_its_ticket_alive() -> None:
    harness = WorkflowHarness(SETTINGS)
    opening, followup = ticket_story()
    harness.deliver(opening)
    harness.deliver(followup)
    number = ticket_number(opening["key"])
    # 31 days after the opening, 21 after the follow-up: the ticket is not final yet.
    harness.sweep(days(31))
    assert f"ticket_intake/ticket/{number}" in harness.tables.state
    assert "ticket_intake/thread/t1@example.com" in harness.tables.state
    harness.sweep(days(41))
    assert not [k for k in harness.tables.state if k.startswith("ticket_intake/")]


def test_retention_must_be_positive() -> None:
    with pytest.raises((ValueError, ConfigError), match="state_retention_days"):
        WorkflowHarness({**SETTINGS, "state_retention_days": 0})


@pytest.mark.parametrize(
    ("fields", "expected"),
    [
        ({"references": ["<Root@X>", "<p@x>"], "in_reply_to": "<p@x>"}, "root@x"),
        ({"references": [], "in_reply_to": "<Parent@x>"}, "parent@x"),
        ({"references": [], "in_reply_to": None}, "own@x"),
        ({"references": [], "in_reply_to": None, "message_id": None}, "acct/fingerprint"),
    ],
)
def test_conversation_key_from_one_mail(fields: dict[str, Any], expected: str) -> None:
    record = {"key": "acct/fingerprint", "message_id": "<Own@x>", **fields}
    assert conversation_key(record) == expected


def test_every_mail_of_both_built_in_conversations_shares_its_key() -> None:
    assert len({conversation_key(m) for m in ticket_story()}) == 1
    assert len({conversation_key(m) for m in approval_story()}) == 1


def test_a_followup_read_late_does_not_make_the_ticket_older() -> None:
    harness = WorkflowHarness(SETTINGS)
    opening, followup = ticket_story()  # the follow-up was observed on day 10
    late = mail_record(
        message_id="t3@example.com",
        in_reply_to="t1@example.com",
        references=["t1@example.com"],
        observed_at=days(5),
    )
    for mail in (opening, followup, late):
        harness.deliver(mail)
    harness.sweep(days(38))  # the day-5 mail is past the retention, the day-10 one is not
    assert f"ticket_intake/ticket/{ticket_number(opening['key'])}" in harness.tables.state
