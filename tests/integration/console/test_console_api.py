"""``/api/v1`` of ``mailtap run console`` against a running pipeline (conftest.py): every
endpoint with both roles, a wrong token, bad input answered with a 4xx JSON error and nothing
changed, and each action's effect read back from Kafka (the audit trail, the mailboxes topic,
the reply of a replayed command at the SMTP server)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from connectors.core.source.ownership.catalog import ADDED, read_changes
from mailtap.commands.topicscan import scan
from mailtap.components import wait_for
from mailtap.trace import read_records
from tests.integration.console.conftest import OPERATOR_TOKEN, VIEWER_TOKEN, ConsoleStack

pytestmark = pytest.mark.integration


def audit(stack: ConsoleStack) -> list[dict[str, Any]]:
    """The audit trail as compaction leaves it: the last record of each action, in order."""
    kafka = stack.cfg.kafka
    entries: dict[str, dict[str, Any]] = {}
    for seen in scan(kafka, kafka.topics.audit):
        if seen.value:
            entry = json.loads(seen.value)
            entries[entry["id"]] = entry
    return list(entries.values())


def error_of(answer: Any, status: int) -> str:
    assert answer["error_code"] == status, answer
    assert isinstance(answer["message"], str) and answer["message"], answer
    return str(answer["message"])


def test_no_or_wrong_token_is_401_and_the_openapi_document_lists_the_api(
    console_stack: ConsoleStack,
) -> None:
    for token in (None, "wrong-" + "x" * 40):
        status, answer = console_stack.call("GET", "/api/v1/mailboxes", token=token)
        assert "bearer token" in error_of(answer, 401) and status == 401
    status, answer = console_stack.call(
        "GET", "/api/v1/dlq", token=None, headers={"Authorization": f"Basic {VIEWER_TOKEN}"}
    )
    assert status == 401
    status, document = console_stack.call("GET", "/api/v1/openapi.json", token=None)
    assert status == 200
    paths = set(document["paths"])
    for path in (
        "/api/v1/mailboxes",
        "/api/v1/mailboxes/{source}/{account}/{folder}/pause",
        "/api/v1/dlq/{record}/replay",
        "/api/v1/suppressions",
        "/api/v1/deliveries",
        "/api/v1/workflows",
        "/api/v1/lag",
        "/api/v1/health",
    ):
        assert path in paths, sorted(paths)
    status, me = console_stack.call("GET", "/api/v1/", token=VIEWER_TOKEN)
    assert (status, me["you"]) == (200, {"name": "victor", "role": "viewer"})


def test_mailboxes_status_lag_health_and_workflows_read_by_a_viewer(
    console_stack: ConsoleStack,
) -> None:
    name = f"imap/{console_stack.account}/INBOX"
    status, page = console_stack.call("GET", "/api/v1/mailboxes", token=VIEWER_TOKEN)
    assert status == 200
    rows = {row["mailbox"]: row for row in page["items"]}
    assert name in rows, page
    row = rows[name]
    assert row["cursor"]["last_uid"] >= 1
    assert sum(row["events_per_hour"]) >= 1 and len(row["events_per_hour"]) == 24
    assert row["origin"] == "configuration" and row["last_event_at"]
    # From the IMAP source's /healthz: its worker state and the age of its last sync.
    assert row["age_of"] == "healthz" and row["state"] in ("IDLE", "POLLING", "SYNCING"), row
    status, one = console_stack.call(
        "GET", f"/api/v1/mailboxes/imap/{console_stack.account}/INBOX", token=VIEWER_TOKEN
    )
    assert status == 200 and one["mailbox"] == name

    status, summary = console_stack.call("GET", "/api/v1/status", token=VIEWER_TOKEN)
    assert status == 200 and summary["deliveries_in_window"].get("SENT", 0) >= 1
    assert sum(summary["deliveries_per_hour"]["SENT"]) == summary["deliveries_in_window"]["SENT"]

    status, lag = console_stack.call("GET", "/api/v1/lag", token=VIEWER_TOKEN)
    assert status == 200
    assert f"sink-{console_stack.run}" in lag["groups"]
    assert f"streams-{console_stack.run}" in lag["groups"]

    status, health = console_stack.call("GET", "/api/v1/health", token=VIEWER_TOKEN)
    assert status == 200
    ((url, answer),) = health["instances"].items()
    assert url.endswith("/healthz") and answer["ok"] is True, health

    status, runs = console_stack.call("GET", "/api/v1/workflows", token=VIEWER_TOKEN)
    assert status == 200
    assert any(r["workflow"] == "ticket_intake" for r in runs["items"]), runs


def test_unknown_mailbox_malformed_json_oversized_body_are_4xx_and_change_nothing(
    console_stack: ConsoleStack,
) -> None:
    kafka = console_stack.cfg.kafka
    before_changes = read_changes(kafka)
    before_audit = len(audit(console_stack))

    status, answer = console_stack.call("PUT", "/api/v1/mailboxes/imap/nobody/INBOX/pause")
    assert status == 404 and "unknown mailbox imap/nobody/INBOX" in error_of(answer, 404)
    status, answer = console_stack.call("GET", "/api/v1/mailboxes/imap/nobody/INBOX")
    assert status == 404
    status, answer = console_stack.call("PUT", "/api/v1/mailboxes/smtp/x/INBOX/pause")
    assert status == 404 and "unknown source" in error_of(answer, 404)
    status, answer = console_stack.call("POST", "/api/v1/mailboxes", raw=b'{"source": "imap",')
    assert status == 400 and "not valid JSON" in error_of(answer, 400)
    status, answer = console_stack.call(
        "POST", "/api/v1/mailboxes", body={"source": "imap", "account": "x", "folder": "A", "y": 1}
    )
    assert status == 400 and "body.y" in error_of(answer, 400)
    status, answer = console_stack.call(
        "POST", "/api/v1/mailboxes", body={"source": "imap", "account": "nobody", "folder": "A"}
    )
    assert status == 400 and "not in the imap section" in error_of(answer, 400)
    big = {"source": "imap", "account": console_stack.account, "folder": "x" * 5000}
    status, answer = console_stack.call("POST", "/api/v1/mailboxes", body=big)
    assert status == 413 and "larger than 4096 bytes" in error_of(answer, 413)
    status, answer = console_stack.call("GET", "/api/v1/dlq/zero")
    assert status == 400 and "PARTITION:OFFSET" in error_of(answer, 400)
    status, answer = console_stack.call("POST", "/api/v1/dlq/0:999999/replay")
    assert status == 404 and "no record 0:999999" in error_of(answer, 404)
    status, answer = console_stack.call("GET", "/api/v1/mailboxes?page=0")
    assert status == 400
    status, answer = console_stack.call("GET", "/api/v1/deliveries")
    assert status == 400 and "query.q" in error_of(answer, 400)

    assert read_changes(kafka) == before_changes
    assert len(audit(console_stack)) == before_audit  # refused before anything was recorded


def test_a_viewer_cannot_act(console_stack: ConsoleStack) -> None:
    record = console_stack.dead_commands[-1]
    for method, path, body in (
        ("POST", f"/api/v1/dlq/{record}/replay", None),
        ("POST", f"/api/v1/dlq/{record}/drop", {"reason": "x"}),
        ("PUT", f"/api/v1/mailboxes/imap/{console_stack.account}/INBOX/pause", None),
        ("POST", "/api/v1/suppressions", {"address": "x@example.com"}),
    ):
        status, answer = console_stack.call(method, path, token=VIEWER_TOKEN, body=body)
        assert status == 403 and "viewer role" in error_of(answer, 403), path
    status, page = console_stack.call("GET", "/api/v1/dlq?per_page=500", token=VIEWER_TOKEN)
    assert record in {r["id"] for r in page["items"]}


def test_dlq_list_show_replay_and_drop(console_stack: ConsoleStack) -> None:
    replayed, dropped = console_stack.dead_commands[0], console_stack.dead_commands[1]
    status, page = console_stack.call("GET", "/api/v1/dlq?per_page=1&page=2", token=VIEWER_TOKEN)
    assert status == 200 and page["per_page"] == 1 and len(page["items"]) == 1
    assert page["total"] >= 4
    status, shown = console_stack.call("GET", f"/api/v1/dlq/{replayed}", token=VIEWER_TOKEN)
    assert status == 200 and shown["reason"].startswith("550 5.1.1")
    assert shown["value"]["record"]["command_id"] == shown["key"]
    command_id = shown["key"]

    status, answer = console_stack.call("POST", f"/api/v1/dlq/{console_stack.dead_source}/replay")
    assert status == 409 and "source dead letter" in error_of(answer, 409)

    status, answer = console_stack.call("POST", f"/api/v1/dlq/{replayed}/replay")
    assert status == 200 and answer["id"] == replayed, answer
    status, answer = console_stack.call("POST", f"/api/v1/dlq/{replayed}/replay")
    assert status == 409 and "already handled" in error_of(answer, 409)
    status, answer = console_stack.call(
        "POST", f"/api/v1/dlq/{dropped}/drop", body={"reason": "customer called"}
    )
    assert status == 200
    status, page = console_stack.call("GET", "/api/v1/dlq?per_page=500")
    open_ids = {r["id"] for r in page["items"]}
    assert replayed not in open_ids and dropped not in open_ids
    assert console_stack.dead_commands[2] in open_ids

    # The replayed command reached the running sink and was SENT.
    kafka = console_stack.cfg.kafka

    def sent() -> bool:
        return any(
            r.key == command_id and (r.value or {}).get("status") == "SENT"
            for r in read_records(kafka, [kafka.topics.delivery])
        )

    assert wait_for(sent, 90, interval=2), "the replayed command was not delivered"
    trail = {(a["action"], a["target"]): a for a in audit(console_stack)}
    assert trail[("dlq.replay", replayed)]["who"] == "olga"
    assert trail[("dlq.replay", replayed)]["outcome"] == "done"
    assert trail[("dlq.drop", dropped)]["params"] == {"reason": "customer called"}


def test_mailbox_pause_and_resume_through_the_mailboxes_topic(console_stack: ConsoleStack) -> None:
    account = console_stack.account
    path = f"/api/v1/mailboxes/imap/{account}/INBOX"
    status, answer = console_stack.call("PUT", path + "/pause")
    assert (status, answer["done"]) == (200, "pause"), answer
    status, row = console_stack.call("GET", path)
    assert row["origin"] == "removed"
    status, answer = console_stack.call("POST", path + "/resume")
    assert status == 405  # Kafka Connect's verbs: PUT …/resume
    status, answer = console_stack.call("PUT", path + "/resume")
    assert status == 200
    status, row = console_stack.call("GET", path)
    assert row["origin"] == "configuration"
    changes = {str(u): s for u, s in read_changes(console_stack.cfg.kafka).items()}
    assert changes[f"imap/{account}/INBOX"] == ADDED
    actions = [a["action"] for a in audit(console_stack) if a["target"] == f"imap/{account}/INBOX"]
    assert actions[-2:] == ["mailbox.pause", "mailbox.resume"]


def test_suppressions_add_list_remove(console_stack: ConsoleStack) -> None:
    address = f"nobody-{console_stack.run}@customer.example"
    status, answer = console_stack.call(
        "POST", "/api/v1/suppressions", body={"address": "not an address"}
    )
    assert status == 400
    status, answer = console_stack.call(
        "POST", "/api/v1/suppressions", body={"address": address, "reason": "NOPE"}
    )
    assert status == 400 and "unknown reason" in error_of(answer, 400)
    status, answer = console_stack.call(
        "POST", "/api/v1/suppressions", body={"address": address, "note": "asked us to stop"}
    )
    assert status == 201 and answer == {"address": address, "suppressed": True}
    status, page = console_stack.call("GET", "/api/v1/suppressions", token=VIEWER_TOKEN)
    entry = next(e for e in page["items"] if e["address"] == address)
    assert entry["reason"] == "MANUAL" and entry["source"] == "console:olga"
    status, answer = console_stack.call("DELETE", f"/api/v1/suppressions/{address}")
    assert status == 200 and answer["suppressed"] is False
    status, answer = console_stack.call("DELETE", f"/api/v1/suppressions/{address}")
    assert status == 404
    status, page = console_stack.call("GET", "/api/v1/suppressions", token=VIEWER_TOKEN)
    assert address not in {e["address"] for e in page["items"]}


def test_one_mails_story_from_event_to_delivery(console_stack: ConsoleStack) -> None:
    status, story = console_stack.call(
        "GET", f"/api/v1/deliveries?q=<{console_stack.ticket_message_id}>", token=VIEWER_TOKEN
    )
    assert status == 200, story
    assert story["matched_by"] == "message-id"
    kinds = [s["kind"] for s in story["steps"]]
    assert kinds.index("mail") < kinds.index("workflow") < kinds.index("command")
    assert kinds.index("command") < kinds.index("delivery")
    assert story["verdict"].startswith("reply SENT")
    status, answer = console_stack.call("GET", "/api/v1/deliveries?q=nothing-like-this")
    assert status == 404 and "nothing matches" in error_of(answer, 404)


def test_tokens_never_appear_in_answers_or_the_log(console_stack: ConsoleStack) -> None:
    status, page = console_stack.call("GET", "/api/v1/mailboxes")
    assert status == 200
    text = json.dumps(page)
    assert OPERATOR_TOKEN not in text and VIEWER_TOKEN not in text
    log = console_stack.console.log_path.read_text()
    assert OPERATOR_TOKEN not in log and VIEWER_TOKEN not in log
    assert "password" not in text
