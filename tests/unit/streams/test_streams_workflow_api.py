"""The workflow API: command ids, threading, subjects, buffered state, registry; the pipeline
around it (unrouted, skips published, failures contained, outputs valid Avro)."""

from __future__ import annotations

import datetime as dt
import hashlib
from typing import Any

import pytest

from connectors.core.avro.serde import AvroSerde
from streams.config import AddressSettings
from streams.errors import HeaderInjectionError
from streams.mail import Address, MailView
from streams.pipeline import MemoryTables, Pipeline
from streams.testing import EPOCH, WorkflowHarness, mail_record
from streams.workflow import (
    ANSWER,
    WorkflowContext,
    WorkflowState,
    command_id,
    forward_subject,
    reply_subject,
    workflow,
)

FROM = AddressSettings(address="help@example.com", name="Help")


def context(mail: MailView | None, table: dict[str, Any] | None = None) -> WorkflowContext:
    return WorkflowContext(
        workflow="wf",
        event_key=mail.key if mail else None,
        mail=mail,
        options=None,
        from_address=FROM,
        state=WorkflowState("wf", table if table is not None else {}),
        now=EPOCH,
    )


def test_command_id_is_sha256_of_key_workflow_step() -> None:
    expected = hashlib.sha256(b"k\x1fwf\x1fack").hexdigest()
    assert command_id("k", "wf", "ack") == expected
    assert command_id("k", "wf", "ack2") != expected


@pytest.mark.parametrize(
    ("subject", "expected"),
    [
        ("Printer", "Re: Printer"),
        ("Re: Printer", "Re: Printer"),
        ("RE: Printer", "RE: Printer"),
        ("AW: Drucker", "AW: Drucker"),
        ("Re[2]: x", "Re[2]: x"),
        ("Regarding the printer", "Re: Regarding the printer"),
        (None, "Re: (no subject)"),
        ("two\r\n lines", "Re: two lines"),
    ],
)
def test_reply_subject_is_prefixed_once(subject: str | None, expected: str) -> None:
    assert reply_subject(subject) == expected


def test_forward_subject() -> None:
    assert forward_subject("Fwd: x") == "Fwd: x"
    assert forward_subject("x") == "Fwd: x"


def test_reply_threads_on_the_original() -> None:
    mail = MailView.from_record(
        mail_record(message_id="m3@x", in_reply_to="m2@x", references=["m1@x", "m2@x"])
    )
    ctx = context(mail)
    cid = ctx.reply("ack", "thanks")
    (cmd,) = ctx.commands
    assert cid == command_id(mail.key, "wf", ANSWER) == cmd["command_id"]
    assert cmd["step"] == "ack"
    assert cmd["kind"] == "REPLY"
    assert cmd["in_reply_to"] == "m3@x"
    assert cmd["references"] == ["m1@x", "m2@x", "m3@x"]
    assert cmd["subject"] == "Re: Printer on floor 3 is broken"
    assert cmd["auto_submitted"] == "auto-replied"
    assert cmd["to"] == [{"name": None, "address": "ann@example.com"}]
    assert cmd["from"] == {"name": "Help", "address": "help@example.com"}
    assert cmd["created_at"] == EPOCH


def test_reply_goes_to_reply_to_when_present() -> None:
    record = mail_record()
    record["reply_to"] = [{"name": None, "address": "team@example.com"}]
    ctx = context(MailView.from_record(record))
    ctx.reply("ack", "x")
    assert ctx.commands[0]["to"][0]["address"] == "team@example.com"


def test_a_step_name_is_used_once_per_event() -> None:
    ctx = context(MailView.from_record(mail_record()))
    ctx.forward("ask", [Address("boss@example.com", None)], "x")
    with pytest.raises(ValueError, match="used twice"):
        ctx.forward("ask", [Address("boss@example.com", None)], "y")


def test_a_mail_gets_one_answer_whatever_the_branch() -> None:
    """A replay in another order may take another step; the answer id must not change."""
    mail = MailView.from_record(mail_record())
    first, second = context(mail), context(mail)
    assert first.reply("acknowledge", "new ticket") == second.reply("followup", "added")
    with pytest.raises(ValueError, match="second answer"):
        first.reply("other", "z")
    # An answer to another thread or recipient is a command of its own step.
    other = first.reply("decision", "ok", to=[Address("carol@example.com", None)])
    assert other == command_id(mail.key, "wf", "decision")


def test_addresses_with_line_breaks_are_refused() -> None:
    record = mail_record(sender=("Ann\r\nBcc: everyone@example.com", "ann@example.com"))
    ctx = context(MailView.from_record(record))
    with pytest.raises(HeaderInjectionError):
        ctx.reply("ack", "x")


def test_forward_quotes_the_mail_and_passes_attachments_by_uri() -> None:
    attachment = {
        "filename": "receipt.pdf",
        "content_type": "application/pdf",
        "size": 10,
        "sha256": "ab",
        "uri": "file:///c/ab",
    }
    inline = {"filename": None, "content_type": "image/png", "size": 1, "sha256": "cd", "uri": None}
    ctx = context(
        MailView.from_record(mail_record(message_id="m1@x", attachments=[attachment, inline]))
    )
    ctx.forward("fwd", [MailView.from_record(mail_record()).sender], "Please approve.")  # type: ignore[list-item]
    (cmd,) = ctx.commands
    assert cmd["kind"] == "FORWARD"
    assert cmd["subject"] == "Fwd: Printer on floor 3 is broken"
    assert (
        "Please approve." in cmd["text_body"] and "It prints only blank pages." in cmd["text_body"]
    )
    assert cmd["attachments"] == [attachment]
    assert cmd["references"] == ["m1@x"] and cmd["in_reply_to"] is None


def test_state_writes_are_buffered_and_namespaced() -> None:
    table: dict[str, Any] = {"wf/a": 1, "other/a": 2}
    state = WorkflowState("wf", table)
    assert state.get("a") == 1
    state.set("b", {"x": 1})
    state.delete("a")
    assert state.get("a") is None and state.get("b") == {"x": 1}
    assert list(state.items()) == [("b", {"x": 1})]
    assert table == {"wf/a": 1, "other/a": 2}
    assert state.writes == {"wf/b": {"x": 1}, "wf/a": None}


def test_reply_in_on_tick_needs_a_mail() -> None:
    ctx = context(None)
    with pytest.raises(RuntimeError, match="need a mail"):
        ctx.reply("x", "y")


# -- pipeline -------------------------------------------------------------------------------

SETTINGS: dict[str, Any] = {
    "from_address": {"address": "help@example.com"},
    "auth_policy": "none",
    "rate_limit": {"max_replies": 2, "window_seconds": 3600},
    "rules": [{"match": {"recipient": "support@example.com"}, "workflow": "ticket_intake"}],
}


def test_unrouted_mail_is_recorded_not_dropped() -> None:
    harness = WorkflowHarness(SETTINGS)
    out = harness.deliver(mail_record(to=["sales@example.com"], subject="Offer"))
    assert out.commands == []
    (event,) = out.events
    assert event["status"] == "UNROUTED" and event["workflow"] == "routing"
    assert event["attributes"]["subject"] == "Offer"


def test_tombstones_are_ignored() -> None:
    harness = WorkflowHarness(SETTINGS)
    out = harness.deliver(None)
    assert out.commands == [] and out.events == []


def test_loop_guard_skip_is_published_and_the_mail_is_not_marked_as_run() -> None:
    harness = WorkflowHarness(SETTINGS)
    out = harness.deliver(mail_record(guard_headers={"auto_submitted": "auto-replied"}))
    assert out.commands == []
    (event,) = out.events
    assert event["status"] == "SKIPPED"
    assert event["attributes"]["guard"] == "auto_submitted"
    assert harness.tables.runs == {}


def test_rate_limit_stops_the_third_mail_of_a_sender_within_the_window() -> None:
    harness = WorkflowHarness(SETTINGS)
    for i in range(3):
        harness.deliver(
            mail_record(subject=f"Issue {i}", observed_at=EPOCH + dt.timedelta(minutes=i))
        )
    assert len(harness.commands) == 2
    assert harness.events[-1]["attributes"]["guard"] == "rate_limit"


def test_a_failing_workflow_is_contained_and_reported() -> None:
    @workflow("explodes_for_test")
    def explodes(mail: MailView, ctx: WorkflowContext) -> None:
        ctx.reply("ack", "never sent")
        raise RuntimeError("boom")

    harness = WorkflowHarness({**SETTINGS, "rules": [{"workflow": "explodes_for_test"}]})
    out = harness.deliver(mail_record())
    assert out.commands == [] and out.state == {} and out.runs == {}
    assert out.events[0]["status"] == "FAILED"
    assert out.events[0]["attributes"]["error"] == "RuntimeError: boom"


def test_outputs_are_valid_avro_of_the_v1_contract() -> None:
    harness = WorkflowHarness(SETTINGS)
    harness.deliver(mail_record(subject="Löschen 🗑"))
    commands = AvroSerde.for_schema("ReplyCommand")
    events = AvroSerde.for_schema("WorkflowEvent")
    for cmd in harness.commands:
        assert commands.decode(commands.encode(cmd, "mail.commands")) == cmd
    for event in harness.events:
        assert events.decode(events.encode(event, "mail.workflow")) == event


def test_table_writes_wait_for_apply() -> None:
    harness = WorkflowHarness(SETTINGS)
    tables = MemoryTables()
    outcome = harness.pipeline.process(mail_record(), tables)
    assert outcome.commands and tables.state == {} and tables.runs == {}
    Pipeline.apply(outcome, tables)
    assert tables.runs and tables.state


def _latest_by_key(events: list[dict[str, Any]]) -> dict[str, str]:
    """What a compacted mail.workflow keeps: the last status per record key (instance id)."""
    return {e["instance_id"]: e["status"] for e in events}


@pytest.mark.parametrize("late_s", [60, 3 * 86400], ids=["soon", "after-max-reply-age"])
def test_a_mail_read_again_leaves_its_workflow_status_standing(late_s: int) -> None:
    # A workflow step emitted under the default instance id (the mail key) is the status a
    # compacted mail.workflow keeps for that mail. Reading the mail again (a flag change, a
    # rescan, a replay, the re-read after a rebalance) used to publish a SKIPPED event under
    # the same key, and compaction then kept "SKIPPED dedupe" (or "max_reply_age", once the
    # mail was old) in place of what the workflow said. The worker counts the repeat instead.
    @workflow("reports_for_test")
    def reports(mail: MailView, ctx: WorkflowContext) -> None:
        ctx.reply("ack", "your report is on its way")
        ctx.emit("REPORT_SENT", {"to": "ann@example.com"})

    read_at = EPOCH

    harness = WorkflowHarness(
        {**SETTINGS, "rules": [{"workflow": "reports_for_test"}]}, clock=lambda: read_at
    )
    mail = mail_record()
    first = harness.deliver(mail)
    assert [e["status"] for e in first.events] == ["REPORT_SENT"]

    read_at = EPOCH + dt.timedelta(seconds=late_s)
    again = harness.deliver({**mail, "change": "UPDATED", "flags": ["\\Seen"]})

    assert again.commands == [] and again.events == []
    assert again.already_ran == "reports_for_test"
    assert _latest_by_key(harness.events) == {mail["key"]: "REPORT_SENT"}
    assert len(harness.commands) == 1
