"""The sink against a scripted relay and a real Kafka: one test per case of issue 4."""

from __future__ import annotations

from typing import Any

import pytest
from smtp_harness import TopicReader, command, produce_commands, run_until, sink_config, statuses
from smtp_scripted_server import ScriptedRelay

from connectors.smtp.identity import message_id_for
from connectors.smtp.retry import HEADER_ATTEMPT, HEADER_ERROR_REASON
from connectors.smtp.sink import SmtpSink
from mailtap.dev import DevServices

FINAL = {"SENT", "FAILED", "BOUNCED", "SUPPRESSED"}


def final_for(events: list[dict[str, Any]], recipients: list[str]) -> bool:
    return all(any(e["recipient"] == r and e["status"] in FINAL for e in events) for r in recipients)


async def test_250_sent_with_event_fields(services: DevServices, unique: str, relay: ScriptedRelay) -> None:
    cfg, settings, _ = sink_config(services.bootstrap_servers, unique, relay.port)
    cmd = command(["alice@example.org", "bob@example.org"])
    produce_commands(cfg, [cmd])
    events = TopicReader(cfg, cfg.kafka.topics.delivery)
    got = await run_until(SmtpSink(cfg, settings), events, lambda ev: len(ev) >= 2)
    assert sorted(e["recipient"] for e in got) == ["alice@example.org", "bob@example.org"]
    for event in got:
        assert event["status"] == "SENT"
        assert event["command_id"] == cmd["command_id"]
        assert event["message_id"] == message_id_for(cmd["command_id"], "example.com")
        assert (event["smtp_code"], event["enhanced_status"], event["attempt"]) == (250, "2.0.0", 1)
        assert event["workflow"] == "ack" and event["event_key"] == "evt-1"
    (accepted,) = relay.handler.snapshot()
    assert accepted.message_id == f"<{message_id_for(cmd['command_id'], 'example.com')}>"
    assert accepted.mail_from == "mailtap@example.com"
    assert b"In-Reply-To: <orig-1@example.org>" in accepted.data
    assert [k for k, *_ in events.records] == [cmd["command_id"]] * 2
    events.close()
