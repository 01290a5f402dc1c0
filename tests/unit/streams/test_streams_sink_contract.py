"""Every command the built-in workflows emit renders with the SMTP sink's renderer, threaded.

The two sides only share the Avro contract; this catches a command the sink would refuse
(header injection checks, Message-ID syntax, attachments) before the whole pipeline does.
"""

from __future__ import annotations

import datetime as dt
import hashlib
from email import message_from_bytes, policy
from typing import Any

from connectors.core.avro.serde import AvroSerde
from connectors.smtp.render import render
from streams.testing import EPOCH, WorkflowHarness, mail_record

SETTINGS: dict[str, Any] = {
    "from_address": {"name": "Helpdesk", "address": "help@example.com"},
    "auth_policy": "none",
    "rules": [
        {"match": {"recipient": "approvals@example.com"}, "workflow": "approval"},
        {"match": {"recipient": "support@example.com"}, "workflow": "ticket_intake"},
    ],
    "workflows": {
        "approval": {"options": {"approver": "boss@example.com", "reminder_after_seconds": 60}}
    },
}
PDF = b"%PDF-1.4 receipt"
RECEIPT = {
    "filename": "receipt.pdf",
    "content_type": "application/pdf",
    "size": len(PDF),
    "sha256": hashlib.sha256(PDF).hexdigest(),
    "uri": "file:///claims/receipt",
}


def test_all_builtin_commands_render_as_threaded_auto_replies() -> None:
    harness = WorkflowHarness(SETTINGS)
    harness.deliver(mail_record(message_id="t1@example.com", subject="Ünïcode printer 🖨"))
    harness.deliver(
        mail_record(message_id="t2@example.com", in_reply_to="t1@example.com", observed_at=EPOCH)
    )
    harness.deliver(
        mail_record(
            message_id="a1@example.com",
            to=["approvals@example.com"],
            subject="Expense",
            attachments=[RECEIPT],
        )
    )
    harness.tick(EPOCH + dt.timedelta(seconds=90))
    harness.deliver(
        mail_record(
            message_id="a2@example.com",
            sender="boss@example.com",
            to=["approvals@example.com"],
            subject="Re: Expense",
            text_body="APPROVE",
            references=["a1@example.com"],
            observed_at=EPOCH + dt.timedelta(minutes=3),
        )
    )
    steps = {(c["workflow"], c["step"]) for c in harness.commands}
    assert steps == {
        ("ticket_intake", "acknowledge"),
        ("ticket_intake", "followup"),
        ("approval", "request"),
        ("approval", "received"),
        ("approval", "reminder-1"),
        ("approval", "decision"),
        ("approval", "confirmation"),
    }
    serde = AvroSerde.for_schema("ReplyCommand")
    for command in harness.commands:
        decoded = serde.decode(serde.encode(command, "mail.commands"))  # as the sink reads it
        rendered = render(decoded, fetch_blob={RECEIPT["uri"]: PDF}.__getitem__)
        msg = message_from_bytes(rendered.data, policy=policy.default)
        assert msg["Auto-Submitted"] == "auto-replied"
        original = command["in_reply_to"] or command["references"][-1]
        assert f"<{original}>" in str(msg["References"])
        if command["kind"] == "FORWARD":
            assert [p.get_filename() for p in msg.iter_attachments()] == ["receipt.pdf"]
