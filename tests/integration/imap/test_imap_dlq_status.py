"""A source dead letter made by the real IMAP source (a mail whose base64 body is broken), seen
through ``mailtap dlq`` and ``mailtap status``: listed with its mailbox and error kind, shown with
the raw mail, refused by replay (a source dead letter holds a mail, not an event), and counted per
mailbox next to the cursor and the events of the last hour."""

from __future__ import annotations

import json
from typing import Any

import pytest
from click.testing import CliRunner
from imap_harness import ImapHarness, make_mail, running, wait_for

from mailtap.cli import main

pytestmark = pytest.mark.integration

BROKEN = (
    b"From: a@example.org\r\nTo: b@example.org\r\nMessage-ID: <b64-dlq@x>\r\nSubject: broken\r\n"
    b"Content-Type: text/plain\r\nContent-Transfer-Encoding: base64\r\n\r\n"
    b"!!!not*base64===\r\nYWJj=ZGVm\r\n"
)


def run(*args: str) -> str:
    result = CliRunner().invoke(main, list(args))
    assert result.exit_code == 0, result.output + repr(result.exception)
    return result.output


def test_source_dead_letter_in_dlq_and_status(imap: ImapHarness) -> None:
    imap.append([make_mail(f"ok-{imap.unique}@x", "fine"), BROKEN])
    with running(imap):
        wait_for(lambda: imap.cursor_at(2), "both mails")
    config = str(imap.write_config())

    (row,) = [json.loads(line) for line in run("dlq", "list", "-c", config, "--json").splitlines()]
    assert row["kind"] == "source" and row["error_class"] == "parse_error"
    assert row["mailbox"].endswith("/INBOX") and row["mailbox"].startswith("imap/")
    shown: dict[str, Any] = json.loads(run("dlq", "show", "-c", config, row["id"]))
    assert "!!!not*base64===" in shown["value"]["raw_head"]
    assert shown["headers"]["mailtap.error.kind"] == "parse_error"
    replayed = run("dlq", "replay", "-c", config)
    assert "a source dead letter" in replayed and "0 to replay" in replayed

    report = json.loads(run("status", "-c", config, "--json"))
    (name,) = report["mailboxes"]
    box = report["mailboxes"][name]
    assert name == row["mailbox"]
    assert box["cursor"]["last_uid"] == 2
    assert box["events_in_window"] == 2  # the broken mail still gives an event (parse_error set)
    assert box["dlq_records"] == 1
    assert report["commands_dlq_records"] == 0
