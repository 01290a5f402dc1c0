"""mailtap.trace.find: which records belong to the mail a query names, in which order, and the
verdict; pure, on records as read from the topics."""

from __future__ import annotations

import datetime as dt

from connectors.core.config import TopicNames
from mailtap.trace import TopicRecord, find

T0 = dt.datetime(2026, 12, 5, 9, 0, tzinfo=dt.UTC)
TOPICS = TopicNames()


def at(seconds: int) -> dt.datetime:
    return T0 + dt.timedelta(seconds=seconds)


def rec(topic: str, key: str | None, value: dict | None, offset: int = 0) -> TopicRecord:
    return TopicRecord(topic, 0, offset, int(T0.timestamp() * 1000), key, value)


def mail(key: str, message_id: str, seconds: int, change: str = "ADDED") -> TopicRecord:
    value = {
        "key": key,
        "message_id": message_id,
        "change": change,
        "subject": "Printer broken",
        "from": {"address": "ann@example.com", "name": None},
        "observed_at": at(seconds),
    }
    return rec("mail.events", key, value)


def flow(
    instance: str, status: str, event_key: str | None, seconds: int, **attrs: str
) -> TopicRecord:
    value = {
        "instance_id": instance,
        "workflow": "ticket_intake",
        "status": status,
        "event_key": event_key,
        "attributes": attrs,
        "occurred_at": at(seconds),
    }
    return rec("mail.workflow", instance, value)


def command(
    command_id: str, event_key: str, seconds: int, step: str = "acknowledge"
) -> TopicRecord:
    value = {
        "command_id": command_id,
        "kind": "REPLY",
        "workflow": "ticket_intake",
        "step": step,
        "event_key": event_key,
        "to": [{"address": "ann@example.com", "name": None}],
        "subject": "Re: Printer broken [#T1]",
        "created_at": at(seconds),
    }
    return rec("mail.commands", command_id, value)


def delivery(command_id: str, status: str, seconds: int) -> TopicRecord:
    value = {
        "command_id": command_id,
        "status": status,
        "recipient": "ann@example.com",
        "smtp_code": 250,
        "diagnostic": None,
        "occurred_at": at(seconds),
    }
    return rec("mail.delivery", command_id, value)


# Written out of order, as partitions hand them over; two unrelated mails around them.
RECORDS = [
    delivery("c1", "SENT", 4),
    mail("acct/m1@example.com", "m1@example.com", 0),
    command("c1", "acct/m1@example.com", 2),
    flow("T1", "TICKET_OPENED", "acct/m1@example.com", 2),
    mail("acct/m2@example.com", "m2@example.com", 5),
    flow("acct/m2@example.com", "SKIPPED", "acct/m2@example.com", 6, guard="max_reply_age"),
    mail("acct/m1@example.com", "m1@example.com", 9, change="UPDATED"),
    flow("T1", "TICKET_UPDATED", "acct/m3@example.com", 10),
    mail("acct/m4@example.com", "m4@example.com", 11),
]


def test_by_message_id_the_mail_its_workflow_command_and_delivery_in_time_order() -> None:
    trace = find(RECORDS, "<m1@example.com>", TOPICS)
    assert trace.matched_by == "message-id"
    assert trace.event_keys == ["acct/m1@example.com"]
    assert [(s.kind, s.at) for s in trace.steps] == [
        ("mail", at(0)),
        ("workflow", at(2)),  # cause before effect when the times are equal
        ("command", at(2)),
        ("delivery", at(4)),
        ("mail", at(9)),
    ]
    assert trace.verdict == "reply SENT to ann@example.com"
    assert "SENT ann@example.com 250" in trace.steps[3].line()


def test_a_message_id_matches_without_brackets_and_case_insensitively() -> None:
    assert find(RECORDS, "M1@EXAMPLE.COM", TOPICS).event_keys == ["acct/m1@example.com"]


def test_by_ticket_number_every_mail_of_the_ticket() -> None:
    trace = find(RECORDS, "#T1", TOPICS)
    assert trace.matched_by == "workflow instance"
    assert trace.event_keys == ["acct/m1@example.com", "acct/m3@example.com"]
    statuses = [s.record.value["status"] for s in trace.steps if s.kind == "workflow"]
    assert statuses == ["TICKET_OPENED", "TICKET_UPDATED"]


def test_by_command_id_and_by_mail_key() -> None:
    by_command = find(RECORDS, "c1", TOPICS)
    assert by_command.matched_by == "command id"
    assert by_command.event_keys == ["acct/m1@example.com"]
    by_key = find(RECORDS, "acct/m2@example.com", TOPICS)
    assert by_key.matched_by == "mail key"
    assert by_key.verdict == "no reply: SKIPPED by max_reply_age"
    assert "guard=max_reply_age" in by_key.steps[-1].line()


def test_a_mail_the_worker_has_not_reached_and_a_query_that_matches_nothing() -> None:
    waiting = find(RECORDS, "m4@example.com", TOPICS)
    assert [s.kind for s in waiting.steps] == ["mail"]
    assert waiting.verdict.startswith("no workflow event yet")
    nothing = find(RECORDS, "<nobody@example.com>", TOPICS)
    assert (nothing.matched_by, nothing.steps, nothing.verdict) == (None, [], "nothing matches")


def test_a_tombstone_is_a_step_of_its_mail() -> None:
    # A tombstone has no value: its time is the record's timestamp.
    gone = TopicRecord(
        "mail.events", 0, 7, int(at(20).timestamp() * 1000), "acct/m1@example.com", None
    )
    records = [*RECORDS, gone]
    trace = find(records, "acct/m1@example.com", TOPICS)
    assert trace.steps[-1].record.value is None
    assert "tombstone" in trace.steps[-1].line()


def test_json_carries_the_match_and_every_step() -> None:
    out = find(RECORDS, "c1", TOPICS).as_json()
    assert out["matched_by"] == "command id"
    assert [s["kind"] for s in out["steps"]] == ["mail", "workflow", "command", "delivery", "mail"]
    assert out["steps"][2]["key"] == "c1"
