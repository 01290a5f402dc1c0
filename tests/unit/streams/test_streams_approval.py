"""approval: forward, decision round trip, reminders from the timer, replay, forged answers."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest

from streams.mail import MailView
from streams.testing import EPOCH, WorkflowHarness, mail_record
from streams.workflows.approval import approval_id, parse_decision

BOSS = "boss@example.com"
SETTINGS: dict[str, Any] = {
    "from_address": {"address": "approvals-bot@example.com"},
    "auth_policy": "none",
    "rules": [{"match": {"recipient": "approvals@example.com"}, "workflow": "approval"}],
    "workflows": {
        "approval": {
            "options": {
                "approver": BOSS,
                "approver_name": "The Boss",
                "reminder_after_seconds": 3600,
                "max_reminders": 2,
            }
        }
    },
}
RECEIPT = {
    "filename": "receipt.pdf",
    "content_type": "application/pdf",
    "size": 2048,
    "sha256": "ab" * 32,
    "uri": "file:///claims/attachment/ab",
}


def at(minutes: float) -> dt.datetime:
    return EPOCH + dt.timedelta(minutes=minutes)


def request() -> dict[str, Any]:
    return mail_record(
        message_id="req@example.com",
        sender=("Ann", "ann@example.com"),
        to=["approvals@example.com"],
        subject="Expense: train tickets 84 EUR",
        text_body="Please approve my train tickets.",
        attachments=[RECEIPT],
    )


def answer(text: str, minutes: float = 30, sender: str = BOSS, **kw: Any) -> dict[str, Any]:
    aid = approval_id(request()["key"])
    return mail_record(
        message_id=f"ans-{minutes}@example.com",
        sender=sender,
        to=["approvals@example.com"],
        subject=f"Re: [APPROVAL {aid}] Expense: train tickets 84 EUR",
        text_body=text,
        in_reply_to="fwd-1@mailtap",
        references=["req@example.com", "fwd-1@mailtap"],
        observed_at=at(minutes),
        **kw,
    )


def test_request_is_forwarded_to_the_approver_and_acknowledged() -> None:
    harness = WorkflowHarness(SETTINGS)
    out = harness.deliver(request())
    aid = approval_id(request()["key"])
    forward, ack = out.commands
    assert forward["kind"] == "FORWARD" and forward["step"] == "request"
    assert forward["to"] == [{"name": "The Boss", "address": BOSS}]
    assert forward["subject"] == f"[APPROVAL {aid}] Expense: train tickets 84 EUR"
    assert forward["attachments"] == [RECEIPT]
    assert forward["references"] == ["req@example.com"]
    assert "APPROVE or REJECT" in forward["text_body"]
    assert "Please approve my train tickets." in forward["text_body"]
    assert ack["kind"] == "REPLY" and ack["to"][0]["address"] == "ann@example.com"
    assert ack["in_reply_to"] == "req@example.com"
    assert [e["status"] for e in out.events] == ["APPROVAL_REQUESTED"]


@pytest.mark.parametrize(
    ("text", "decision"),
    [
        ("APPROVE", "APPROVED"),
        ("approved, enjoy the trip", "APPROVED"),
        ("Reject - too expensive", "REJECTED"),
        ("\n\nREJECTED\n\nOn Mon, Ann wrote:\n> APPROVE", "REJECTED"),
    ],
)
def test_round_trip_decision_reaches_the_requester_in_her_thread(text: str, decision: str) -> None:
    harness = WorkflowHarness(SETTINGS)
    harness.deliver(request())
    out = harness.deliver(answer(text))
    to_requester, confirmation = out.commands
    assert to_requester["step"] == "decision"
    assert to_requester["to"] == [{"name": "Ann", "address": "ann@example.com"}]
    assert to_requester["in_reply_to"] == "req@example.com"
    assert to_requester["references"] == ["req@example.com"]
    assert to_requester["subject"] == "Re: Expense: train tickets 84 EUR"
    assert decision.lower() in to_requester["text_body"]
    assert confirmation["to"][0]["address"] == BOSS
    assert confirmation["in_reply_to"] == answer(text)["message_id"]
    assert [e["status"] for e in out.events] == [decision]
    assert (
        harness.tables.state[f"approval/request/{approval_id(request()['key'])}"]["status"]
        == decision
    )


def test_comment_of_the_approver_is_passed_on_without_the_quote() -> None:
    harness = WorkflowHarness(SETTINGS)
    harness.deliver(request())
    out = harness.deliver(answer("Approve.\nNext time book earlier.\n\n> Please approve my train"))
    assert "Next time book earlier." in out.commands[0]["text_body"]
    assert "Please approve my train" not in out.commands[0]["text_body"]


def test_answer_found_by_subject_tag_when_references_are_lost() -> None:
    harness = WorkflowHarness(SETTINGS)
    harness.deliver(request())
    mail = answer("REJECT")
    mail["in_reply_to"], mail["references"] = None, []
    out = harness.deliver(mail)
    assert [e["status"] for e in out.events] == ["REJECTED"]


def test_unclear_answer_asks_again_and_keeps_the_request_pending() -> None:
    harness = WorkflowHarness(SETTINGS)
    harness.deliver(request())
    aid = approval_id(request()["key"])
    out = harness.deliver(answer("Let me think about it", minutes=10))
    assert [c["step"] for c in out.commands] == ["unclear"]
    assert harness.tables.state[f"approval/request/{aid}"]["status"] == "PENDING"
    later = harness.deliver(answer("ok, APPROVE", minutes=20))
    assert [e["status"] for e in later.events] == ["APPROVED"]


def test_second_answer_is_told_the_request_was_decided() -> None:
    harness = WorkflowHarness(SETTINGS)
    harness.deliver(request())
    harness.deliver(answer("APPROVE", minutes=10))
    out = harness.deliver(answer("REJECT", minutes=20))
    assert [c["step"] for c in out.commands] == ["already-decided"]
    assert "APPROVED" in out.commands[0]["text_body"]


def test_answer_from_someone_else_does_not_decide() -> None:
    harness = WorkflowHarness(SETTINGS)
    harness.deliver(request())
    out = harness.deliver(answer("APPROVE", sender="ann@example.com"))
    assert [c["step"] for c in out.commands] == ["status"]
    assert "waiting for a decision" in out.commands[0]["text_body"]
    assert "APPROVED" not in harness.statuses()


def test_forged_approval_fails_sender_authentication() -> None:
    settings = {**SETTINGS, "auth_policy": "authserv", "authserv_id": "mx.example.com"}
    harness = WorkflowHarness(settings)
    trusted = {"authentication_results": ["mx.example.com; dmarc=pass header.from=example.com"]}
    req = request()
    req["guard_headers"]["authentication_results"] = trusted["authentication_results"]
    harness.deliver(req)
    forged = answer("APPROVE")  # no Authentication-Results from our MTA
    out = harness.deliver(forged)
    assert out.commands == []
    assert out.events[0]["attributes"]["guard"] == "sender_authentication"
    genuine = answer("APPROVE", minutes=40, guard_headers=trusted)
    assert [e["status"] for e in harness.deliver(genuine).events] == ["APPROVED"]


def test_reminders_go_out_after_the_delay_up_to_the_maximum() -> None:
    harness = WorkflowHarness(SETTINGS)
    harness.deliver(request())
    aid = approval_id(request()["key"])
    assert harness.tick(at(59)).commands == []
    first = harness.tick(at(61))
    (reminder,) = first.commands
    assert reminder["kind"] == "SEND" and reminder["step"] == "reminder-1"
    assert reminder["to"][0]["address"] == BOSS
    assert reminder["subject"] == f"Reminder: [APPROVAL {aid}] Expense: train tickets 84 EUR"
    assert reminder["references"] == ["req@example.com"]
    assert reminder["event_key"] == request()["key"]
    assert [e["status"] for e in first.events] == ["APPROVAL_REMINDED"]
    assert harness.tick(at(62)).commands == []  # one reminder per period
    assert [c["step"] for c in harness.tick(at(125)).commands] == ["reminder-2"]
    assert harness.tick(at(600)).commands == []  # max_reminders reached


def test_reminder_after_restart_without_its_state_has_the_same_command_id() -> None:
    harness = WorkflowHarness(SETTINGS)
    harness.deliver(request())
    before = harness.tables.state.copy()
    first = harness.tick(at(61))
    harness.tables.state = before  # the reminder's state write was lost in a crash
    again = harness.tick(at(70))
    assert [c["command_id"] for c in again.commands] == [c["command_id"] for c in first.commands]


def test_no_reminder_after_a_decision_and_a_late_answer_still_decides() -> None:
    harness = WorkflowHarness(SETTINGS)
    harness.deliver(request())
    harness.tick(at(61))
    out = harness.deliver(answer("APPROVE", minutes=90))
    assert [e["status"] for e in out.events] == ["APPROVED"]
    assert harness.tick(at(200)).commands == []


def test_full_round_trip_replayed_gives_identical_command_ids() -> None:
    mails = [request(), answer("REJECT")]
    first = WorkflowHarness(SETTINGS)
    for mail in mails:
        first.deliver(mail)
    second = WorkflowHarness(SETTINGS)
    for mail in mails:
        second.deliver(mail)
    ids = [c["command_id"] for c in first.commands]
    assert ids == [c["command_id"] for c in second.commands] and len(set(ids)) == 4
    for mail in mails:  # replay onto the same tables: nothing new
        assert second.deliver(mail).commands == []


def test_replay_of_the_answer_after_a_partial_commit_decides_again_identically() -> None:
    harness = WorkflowHarness(SETTINGS)
    harness.deliver(request())
    first = harness.deliver(answer("APPROVE"))
    harness.tables.runs.clear()
    second = harness.deliver(answer("APPROVE"))
    assert [c["command_id"] for c in second.commands] == [c["command_id"] for c in first.commands]


def test_parse_decision_prefers_body_over_subject() -> None:
    mail = MailView.from_record(mail_record(subject="Re: approve?", text_body="REJECT"))
    assert parse_decision(mail) == ("REJECTED", "REJECT")
    empty = MailView.from_record(mail_record(subject="APPROVED", text_body=""))
    assert parse_decision(empty) == ("APPROVED", "")


def test_a_replay_in_another_order_emits_the_same_command_ids() -> None:
    """A worker with empty state may read the approver's answer before the request (they are
    on different partitions). It must not forward the answer as a new request, and the decision
    must reach the requester with the id it had in order, so the sink sends nothing new."""
    in_order = WorkflowHarness(SETTINGS)
    expected = {c["command_id"] for c in in_order.deliver(request()).commands}
    expected |= {c["command_id"] for c in in_order.deliver(answer("APPROVE")).commands}

    reversed_order = WorkflowHarness(SETTINGS)
    early = reversed_order.deliver(answer("APPROVE")).commands
    assert [c["to"][0]["address"] for c in early] == [BOSS]  # one answer, no forward to himself
    late = reversed_order.deliver(request()).commands
    produced = {c["command_id"] for c in [*early, *late]}
    assert produced == expected
    decision = next(c for c in late if c["step"] == "decision")
    assert decision["to"][0]["address"] == "ann@example.com"
    assert decision["in_reply_to"] == "req@example.com"
    statuses = [e["status"] for e in reversed_order.events]
    assert "APPROVED" in statuses


# -- issue 17, item 2: who may approve -------------------------------------------------------

MX = "mx.example.com"
SIGNED = f"{MX}; dkim=pass header.d=example.com; dmarc=pass header.from=example.com"
SPF_ONLY = f"{MX}; spf=pass smtp.mailfrom=relay@example.com; dmarc=pass header.from=example.com"


def strict_harness() -> WorkflowHarness:
    options = {
        **SETTINGS["workflows"]["approval"]["options"],
        "approver_dkim_domains": ["example.com"],
    }
    return WorkflowHarness(
        {
            **SETTINGS,
            "auth_policy": "authserv",
            "authserv_id": MX,
            "workflows": {"approval": {"options": options}},
        }
    )


def authenticated(
    record: dict[str, Any], header: str, return_path: str | None = None
) -> dict[str, Any]:
    record["guard_headers"]["authentication_results"] = [header]
    record["guard_headers"]["return_path"] = return_path
    return record


def test_an_answer_without_the_named_dkim_signature_decides_nothing_and_gets_no_reply() -> None:
    harness = strict_harness()
    harness.deliver(authenticated(request(), SIGNED))
    out = harness.deliver(authenticated(answer("APPROVE"), SPF_ONLY))
    assert out.commands == []
    (event,) = out.events
    assert event["status"] == "APPROVAL_REFUSED"
    assert "no verified DKIM signature of example.com" in event["attributes"]["reason"]
    assert (
        harness.tables.state[f"approval/request/{approval_id(request()['key'])}"]["status"]
        == "PENDING"
    )
    genuine = harness.deliver(authenticated(answer("APPROVE", minutes=40), SIGNED))
    assert [e["status"] for e in genuine.events] == ["APPROVED"]


def test_an_early_answer_without_the_named_dkim_signature_is_not_kept() -> None:
    harness = strict_harness()
    out = harness.deliver(authenticated(answer("APPROVE"), SPF_ONLY))
    assert out.commands == [] and [e["status"] for e in out.events] == ["APPROVAL_REFUSED"]
    later = harness.deliver(authenticated(request(), SIGNED))
    assert "APPROVED" not in [e["status"] for e in later.events]


@pytest.mark.parametrize(
    ("header", "return_path"),
    [
        # The requester's own mail system signs for example.com, the envelope is hers.
        (
            f"{MX}; dkim=pass header.d=example.com; spf=pass smtp.mailfrom=ann@example.com; "
            "dmarc=pass header.from=example.com",
            None,
        ),
        (SIGNED, "<ann@example.com>"),
    ],
)
def test_the_requester_cannot_approve_her_own_request(header: str, return_path: str | None) -> None:
    harness = strict_harness()
    harness.deliver(authenticated(request(), SIGNED, "<ann@example.com>"))
    out = harness.deliver(authenticated(answer("APPROVE"), header, return_path))
    assert out.commands == []
    (event,) = out.events
    assert event["status"] == "APPROVAL_REFUSED"
    assert "nobody decides their own request" in event["attributes"]["reason"]


def test_an_early_answer_sent_by_the_requester_is_refused_when_the_request_arrives() -> None:
    harness = strict_harness()
    harness.deliver(authenticated(answer("APPROVE"), SIGNED, "<ann@example.com>"))
    later = harness.deliver(authenticated(request(), SIGNED, "<ann@example.com>"))
    assert [e["status"] for e in later.events] == ["APPROVAL_REQUESTED", "APPROVAL_REFUSED"]
    assert [c["step"] for c in later.commands] == ["request", "received"]


# -- issue 17, item 5: unsafe attachment names; the acknowledgement says what was emitted ------


def test_attachment_names_are_made_safe_and_the_ack_lists_what_went() -> None:
    harness = WorkflowHarness(SETTINGS)
    evil = {
        **RECEIPT,
        "filename": "receipt\r\nBcc: x@attacker.example\r\n.pdf",
        "content_type": "application/pdf; x=\r\n",
    }
    lost = {**RECEIPT, "filename": "scan.png", "uri": None}
    record = request()
    record["attachments"] = [evil, lost]
    forward, ack = harness.deliver(record).commands
    assert [a["filename"] for a in forward["attachments"]] == [
        "receipt Bcc: x@attacker.example .pdf"
    ]
    assert forward["attachments"][0]["content_type"] == "application/octet-stream"
    assert "was passed on to The Boss" in ack["text_body"]
    assert "Attachments passed on: receipt Bcc: x@attacker.example .pdf\n" in ack["text_body"]
    assert "Not passed on (not stored, please send them again): scan.png" in ack["text_body"]
    assert "was sent to" not in ack["text_body"]


def test_approval_ids_stay_what_they_were() -> None:
    # Pinned: the first 8 base32 characters of sha256(event key), as stored in the state.
    assert approval_id("demo/mid:a@b") == "MGXD74U4"
