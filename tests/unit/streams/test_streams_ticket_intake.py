"""ticket_intake: stable numbers, replay, thread attachment by References and by subject tag."""

from __future__ import annotations

import datetime as dt
from typing import Any

from streams.testing import EPOCH, WorkflowHarness, mail_record
from streams.workflows.ticket_intake import ticket_number

SETTINGS: dict[str, Any] = {
    "from_address": {"address": "help@example.com", "name": "Helpdesk"},
    "auth_policy": "none",
    "rules": [{"match": {"recipient": "support@example.com"}, "workflow": "ticket_intake"}],
}


def later(minutes: int) -> dt.datetime:
    return EPOCH + dt.timedelta(minutes=minutes)


def test_new_request_gets_one_threaded_ack_with_a_ticket_number() -> None:
    harness = WorkflowHarness(SETTINGS)
    request = mail_record(message_id="req@example.com", sender=("Ann", "ann@example.com"))
    out = harness.deliver(request)
    number = ticket_number(request["key"])
    (ack,) = out.commands
    assert ack["step"] == "acknowledge"
    assert ack["subject"] == f"Re: Printer on floor 3 is broken [#{number}]"
    assert ack["in_reply_to"] == "req@example.com"
    assert ack["references"] == ["req@example.com"]
    assert f"ticket #{number}" in ack["text_body"] and ack["text_body"].startswith("Hello Ann,")
    assert [(e["status"], e["instance_id"]) for e in out.events] == [("TICKET_OPENED", number)]


def test_replay_gives_the_same_ticket_and_command_id() -> None:
    request = mail_record()
    first = WorkflowHarness(SETTINGS).deliver(request)
    # A worker that lost nothing but replays from the start: dedupe absorbs it.
    harness = WorkflowHarness(SETTINGS)
    harness.deliver(request)
    again = harness.deliver({**request, "change": "UPDATED"})
    assert again.commands == [] and again.events == [] and again.already_ran == "ticket_intake"
    # A worker whose state was lost (or never committed): same number, same command id.
    rebuilt = WorkflowHarness(SETTINGS).deliver(request)
    assert [c["command_id"] for c in rebuilt.commands] == [c["command_id"] for c in first.commands]
    assert rebuilt.events == first.events


def test_replay_after_state_write_but_before_dedupe_mark_repeats_the_same_ack() -> None:
    harness = WorkflowHarness(SETTINGS)
    request = mail_record()
    first = harness.deliver(request)
    harness.tables.runs.clear()  # crash between the state write and the dedupe mark
    second = harness.deliver(request)
    assert [c["command_id"] for c in second.commands] == [c["command_id"] for c in first.commands]
    assert second.events[0]["status"] == "TICKET_OPENED"


def test_followup_in_thread_attaches_without_a_new_ticket() -> None:
    harness = WorkflowHarness(SETTINGS)
    request = mail_record(message_id="req@example.com")
    number = ticket_number(request["key"])
    harness.deliver(request)
    # The requester answers our ack: References = ack's References + ack's Message-ID.
    followup = mail_record(
        message_id="f1@example.com",
        subject=f"Re: Printer on floor 3 is broken [#{number}]",
        in_reply_to="ack-1@mailtap",
        references=["req@example.com", "ack-1@mailtap"],
        observed_at=later(5),
    )
    out = harness.deliver(followup)
    (ack,) = out.commands
    assert ack["step"] == "followup"
    assert ack["subject"] == f"Re: Printer on floor 3 is broken [#{number}]"
    assert ack["in_reply_to"] == "f1@example.com"
    assert [(e["status"], e["instance_id"]) for e in out.events] == [("TICKET_UPDATED", number)]
    assert harness.statuses().count("TICKET_OPENED") == 1
    ticket = harness.tables.state[f"ticket_intake/ticket/{number}"]
    assert ticket["mails"] == [request["key"], followup["key"]]


def test_deeper_thread_attaches_through_the_followup() -> None:
    harness = WorkflowHarness(SETTINGS)
    request = mail_record(message_id="req@example.com")
    harness.deliver(request)
    harness.deliver(
        mail_record(message_id="f1@x", in_reply_to="req@example.com", observed_at=later(1))
    )
    out = harness.deliver(
        mail_record(
            message_id="f2@x", in_reply_to="f1@x", references=["f1@x"], observed_at=later(2)
        )
    )
    assert out.events[0]["status"] == "TICKET_UPDATED"
    assert out.events[0]["instance_id"] == ticket_number(request["key"])


def test_subject_tag_attaches_a_mail_outside_the_thread() -> None:
    harness = WorkflowHarness(SETTINGS)
    request = mail_record()
    number = ticket_number(request["key"])
    harness.deliver(request)
    out = harness.deliver(
        mail_record(
            subject=f"More info [#{number}]", observed_at=later(3), sender="bob@example.com"
        )
    )
    assert out.events[0]["status"] == "TICKET_UPDATED"
    assert out.commands[0]["subject"] == f"Re: More info [#{number}]"


def test_unknown_tag_opens_a_new_ticket() -> None:
    harness = WorkflowHarness(SETTINGS)
    out = harness.deliver(mail_record(subject="Hello [#AAAAAAAA]"))
    assert out.events[0]["status"] == "TICKET_OPENED"
    assert out.events[0]["instance_id"] != "AAAAAAAA"


def test_followup_acknowledgement_can_be_switched_off() -> None:
    settings = {
        **SETTINGS,
        "workflows": {"ticket_intake": {"options": {"acknowledge_followups": False}}},
    }
    harness = WorkflowHarness(settings)
    harness.deliver(mail_record(message_id="req@x"))
    out = harness.deliver(mail_record(message_id="f@x", in_reply_to="req@x", observed_at=later(1)))
    assert out.commands == [] and out.events[0]["status"] == "TICKET_UPDATED"


def test_auto_reply_in_the_thread_is_ignored() -> None:
    harness = WorkflowHarness(SETTINGS)
    harness.deliver(mail_record(message_id="req@x"))
    out = harness.deliver(
        mail_record(
            message_id="ooo@x",
            in_reply_to="req@x",
            subject="Out of office",
            guard_headers={"auto_submitted": "auto-replied"},
            observed_at=later(1),
        )
    )
    assert out.commands == [] and out.events[0]["status"] == "SKIPPED"


def test_ticket_numbers_stay_what_they_were() -> None:
    # Pinned: the first 8 base32 characters of sha256(event key); replays and the tickets
    # already opened depend on them.
    assert ticket_number("demo/mid:a@b") == "MGXD74U4"
    assert ticket_number("bench/bench-x-1@customer.example") == "M4OBPVOU"
