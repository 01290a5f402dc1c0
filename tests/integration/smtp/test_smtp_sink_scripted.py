"""The sink against a scripted relay and a real Kafka: one test per case of issue 4."""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import pytest
from confluent_kafka import Producer
from smtp_harness import (
    WAIT_S,
    TopicReader,
    command,
    produce_commands,
    run_until,
    sink_config,
    statuses,
)
from smtp_scripted_server import ScriptedRelay

from connectors.core.avro.serde import AvroSerde
from connectors.core.kafka.clients import producer_config
from connectors.smtp.config import SuppressionSettings
from connectors.smtp.identity import message_id_for
from connectors.smtp.retry import HEADER_ATTEMPT, HEADER_ERROR_REASON, HEADER_RECIPIENTS
from connectors.smtp.sink import SmtpSink
from connectors.smtp.suppression import after_bounce
from connectors.smtp.suppression import record as suppression_record
from mailtap.components import wait_for
from mailtap.dev import DevServices

FINAL = {"SENT", "FAILED", "BOUNCED", "SUPPRESSED"}


def final_for(events: list[dict[str, Any]], recipients: list[str]) -> bool:
    return all(
        any(e["recipient"] == r and e["status"] in FINAL for e in events) for r in recipients
    )


async def test_250_sent_with_event_fields(
    services: DevServices, unique: str, relay: ScriptedRelay
) -> None:
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


def retry_records(cfg: Any, tier: str) -> TopicReader:
    return TopicReader(cfg, f"{cfg.kafka.topics.retry_prefix}.{tier}", decode=False)


def header(headers: list[tuple[str, bytes]], name: str) -> str:
    return dict(headers)[name].decode()


@pytest.mark.parametrize("local", ["rcpt421", "rcpt450", "data451", "data452"])
async def test_4xx_is_deferred_and_retried_through_the_tiers(
    services: DevServices, unique: str, relay: ScriptedRelay, local: str
) -> None:
    cfg, settings, _ = sink_config(services.bootstrap_servers, unique, relay.port)
    rcpt = f"{local}@example.org"
    cmd = command([rcpt])
    produce_commands(cfg, [cmd])
    events = TopicReader(cfg, cfg.kafka.topics.delivery)
    got = await run_until(
        SmtpSink(cfg, settings), events, lambda ev: any(e["attempt"] == 3 for e in ev)
    )
    first, second, third = got[:3]
    code = int(local[-3:])
    for n, event in enumerate((first, second, third), start=1):
        assert (event["status"], event["attempt"], event["smtp_code"]) == ("DEFERRED", n, code)
        assert (
            event["next_attempt_at"] is not None and event["next_attempt_at"] > event["occurred_at"]
        )
    # attempt 1 failed -> tier 1s carries attempt 2; attempt 2 failed -> tier 2s carries attempt 3
    tier1, tier2 = retry_records(cfg, "1s"), retry_records(cfg, "2s")
    for reader in (tier1, tier2):
        reader.drain()
    assert [header(h, HEADER_ATTEMPT) for _, _, h in tier1.records] == ["2"]
    assert [header(h, HEADER_ATTEMPT) for _, _, h in tier2.records][:1] == ["3"]
    assert all(k == cmd["command_id"] for k, _, _ in tier1.records + tier2.records)
    assert relay.handler.snapshot() == []
    for reader in (events, tier1, tier2):
        reader.close()


@pytest.mark.parametrize(
    ("local", "code", "enhanced"),
    [("rcpt550", 550, "5.1.1"), ("data552", 552, "5.3.4"), ("data554", 554, "5.7.1")],
)
async def test_5xx_is_failed_and_never_retried(
    services: DevServices, unique: str, relay: ScriptedRelay, local: str, code: int, enhanced: str
) -> None:
    cfg, settings, _ = sink_config(services.bootstrap_servers, unique, relay.port)
    failing, later = command([f"{local}@example.org"]), command(["ok@example.org"])
    produce_commands(cfg, [failing])
    events = TopicReader(cfg, cfg.kafka.topics.delivery)
    sink = SmtpSink(cfg, settings)
    await run_until(sink, events, lambda ev: len(ev) >= 1)
    # A later command on the same topic proves the sink moved on without retrying the first.
    produce_commands(cfg, [later])
    got = await run_until(
        SmtpSink(cfg, settings),
        events,
        lambda ev: any(e["command_id"] == later["command_id"] for e in ev),
    )
    (event,) = [e for e in got if e["command_id"] == failing["command_id"]]
    assert (event["status"], event["smtp_code"], event["enhanced_status"]) == (
        "FAILED",
        code,
        enhanced,
    )
    assert event["next_attempt_at"] is None
    tier1 = retry_records(cfg, "1s")
    tier1.drain()
    assert tier1.records == []
    events.close()
    tier1.close()


async def test_partial_refusal_gives_one_outcome_per_recipient(
    services: DevServices, unique: str, relay: ScriptedRelay
) -> None:
    cfg, settings, _ = sink_config(services.bootstrap_servers, unique, relay.port)
    cmd = command(["ok@example.org", "rcpt550@example.org"])
    produce_commands(cfg, [cmd])
    events = TopicReader(cfg, cfg.kafka.topics.delivery)
    got = await run_until(SmtpSink(cfg, settings), events, lambda ev: len(ev) >= 2)
    assert statuses(got, "ok@example.org") == ["SENT"]
    assert statuses(got, "rcpt550@example.org") == ["FAILED"]
    assert [a.rcpt_tos for a in relay.handler.snapshot()] == [("ok@example.org",)]
    events.close()


async def test_partial_deferral_retries_only_the_deferred_recipient(
    services: DevServices, unique: str, relay: ScriptedRelay
) -> None:
    cfg, settings, _ = sink_config(services.bootstrap_servers, unique, relay.port)
    cmd = command(["ok@example.org", "rcpt450@example.org"])
    produce_commands(cfg, [cmd])
    events = TopicReader(cfg, cfg.kafka.topics.delivery)
    got = await run_until(
        SmtpSink(cfg, settings),
        events,
        lambda ev: len([e for e in ev if e["recipient"] == "rcpt450@example.org"]) >= 2,
    )
    assert statuses(got, "ok@example.org") == ["SENT"]
    assert statuses(got, "rcpt450@example.org")[:2] == ["DEFERRED", "DEFERRED"]
    assert [a.rcpt_tos for a in relay.handler.snapshot()] == [("ok@example.org",)]
    tier1 = retry_records(cfg, "1s")
    tier1.drain()
    (record,) = tier1.records
    assert header(record[2], HEADER_RECIPIENTS) == '["rcpt450@example.org"]'
    events.close()
    tier1.close()


async def test_flaky_relay_succeeds_on_the_third_attempt(
    services: DevServices, unique: str, relay: ScriptedRelay
) -> None:
    cfg, settings, _ = sink_config(services.bootstrap_servers, unique, relay.port)
    cmd = command(["flaky2@example.org"])
    produce_commands(cfg, [cmd])
    events = TopicReader(cfg, cfg.kafka.topics.delivery)
    got = await run_until(
        SmtpSink(cfg, settings), events, lambda ev: final_for(ev, ["flaky2@example.org"])
    )
    assert [(e["status"], e["attempt"]) for e in got] == [
        ("DEFERRED", 1),
        ("DEFERRED", 2),
        ("SENT", 3),
    ]
    assert len({e["message_id"] for e in got}) == 1
    events.close()


async def test_disconnect_mid_session_is_deferred(
    services: DevServices, unique: str, relay: ScriptedRelay
) -> None:
    cfg, settings, _ = sink_config(services.bootstrap_servers, unique, relay.port)
    dropped, fine = command(["drop@example.org"]), command(["ok@example.org"])
    produce_commands(cfg, [dropped, fine])
    events = TopicReader(cfg, cfg.kafka.topics.delivery)
    got = await run_until(
        SmtpSink(cfg, settings),
        events,
        lambda ev: final_for(ev, ["ok@example.org"]) and len(statuses(ev, "drop@example.org")) >= 2,
    )
    first = next(e for e in got if e["recipient"] == "drop@example.org")
    assert (first["status"], first["smtp_code"]) == ("DEFERRED", None)
    assert "connection lost before the message was accepted" in first["diagnostic"]
    assert statuses(got, "ok@example.org") == ["SENT"]
    events.close()


async def test_stall_after_final_dot_is_unknown_and_resent_with_the_same_message_id(
    services: DevServices, unique: str, relay: ScriptedRelay
) -> None:
    cfg, settings, _ = sink_config(services.bootstrap_servers, unique, relay.port, data_timeout=1)
    cmd = command(["stall@example.org"])
    produce_commands(cfg, [cmd])
    events = TopicReader(cfg, cfg.kafka.topics.delivery)
    got = await run_until(
        SmtpSink(cfg, settings), events, lambda ev: final_for(ev, ["stall@example.org"])
    )
    assert [(e["status"], e["attempt"]) for e in got] == [("UNKNOWN", 1), ("SENT", 2)]
    message_id = message_id_for(cmd["command_id"], "example.com")
    assert {e["message_id"] for e in got} == {message_id}
    # The relay got the content twice with the same Message-ID (it accepted the first one late).
    assert relay.handler.deliveries[f"<{message_id}>"] == 2
    events.close()


@pytest.mark.parametrize("bounce", ["hard", "soft"])
async def test_a_resend_after_its_own_bounce_sends_nothing_and_publishes_nothing_more(
    services: DevServices, unique: str, relay: ScriptedRelay, bounce: str
) -> None:
    """The relay accepted the mail but the sink recorded no outcome (here: the 250 came after
    data_timeout; in `mailtap soak`: a broker kill between the "." and the commit), so the
    command is UNKNOWN and resent later. Meanwhile its DSN came back, and the bounce reader
    published BOUNCED and suppressed the address for this command. The resend must not mail the
    address again nor publish SUPPRESSED: that would be a second final outcome of one command
    (the soak's ``two-final-deliveries``: [BOUNCED, UNKNOWN, SUPPRESSED]). A soft bounce that
    suppressed nobody yet (``suppressed: false``) is the same: its BOUNCED is published, and the
    resend's SENT would be a second final outcome."""
    cfg, settings, _ = sink_config(
        services.bootstrap_servers, unique, relay.port, data_timeout=1, retry_tiers=["2s"]
    )
    cmd = command(["stall@example.org"])
    produce_commands(cfg, [cmd])
    events = TopicReader(cfg, cfg.kafka.topics.delivery)
    sink = SmtpSink(cfg, settings)
    cid = str(cmd["command_id"])

    async def poll_until(done: Callable[[], bool]) -> None:
        deadline = time.monotonic() + WAIT_S
        while not done():
            assert time.monotonic() < deadline, events.values
            await sink.poll_once()
            events.poll(0.05)

    sink.start()
    try:
        await poll_until(lambda: [e["status"] for e in events.values] == ["UNKNOWN"])
        assert sink.suppressions is not None
        serde = AvroSerde.for_schema("Suppression", cfg.kafka)
        topic = cfg.kafka.topics.suppressions
        if bounce == "hard":
            entry = suppression_record(
                "stall@example.org",
                reason="HARD_BOUNCE",
                now=datetime.now(UTC),
                detail="5.1.1 550 5.1.1 <stall@example.org>: Recipient address rejected",
                source="bounce-reader",
                command_id=cid,
            )
        else:
            counted = after_bounce(
                None,
                "stall@example.org",
                hard=False,
                status="4.2.2",
                detail="mailbox full",
                command_id=cid,
                now=datetime.now(UTC),
                settings=SuppressionSettings(soft_bounce_limit=3),
            )
            assert counted is not None and not counted["suppressed"]
            entry = counted
        producer = Producer(producer_config(cfg.kafka))
        producer.produce(topic, key=b"stall@example.org", value=serde.encode(entry, topic))
        assert producer.flush(30) == 0
        table = sink.suppressions
        assert wait_for(lambda: table.get("stall@example.org") is not None, WAIT_S)
        await poll_until(
            lambda: (state := sink.states.get(cid)) is not None and state.phase == "DONE"
        )
        events.drain()
    finally:
        await sink.close()
    assert [(e["status"], e["attempt"]) for e in events.values] == [("UNKNOWN", 1)]
    message_id = message_id_for(cid, "example.com")
    assert relay.handler.deliveries[f"<{message_id}>"] == 1  # the stalled first copy only
    events.close()


async def test_max_lifetime_ends_failed_and_dead_lettered(
    services: DevServices, unique: str, relay: ScriptedRelay
) -> None:
    cfg, settings, _ = sink_config(
        services.bootstrap_servers, unique, relay.port, max_lifetime="3s"
    )
    cmd = command(["data451@example.org"])
    produce_commands(cfg, [cmd])
    events = TopicReader(cfg, cfg.kafka.topics.delivery)
    got = await run_until(
        SmtpSink(cfg, settings), events, lambda ev: final_for(ev, ["data451@example.org"])
    )
    assert [e["status"] for e in got][:-1] == ["DEFERRED"] * (len(got) - 1)
    last = got[-1]
    assert last["status"] == "FAILED" and last["next_attempt_at"] is None
    assert "max lifetime" in last["diagnostic"] and "451" in last["diagnostic"]
    dlq = TopicReader(cfg, cfg.kafka.topics.dlq, decode=False)
    dlq.drain()
    (record,) = dlq.records
    assert record[0] == cmd["command_id"]
    assert "max lifetime" in header(record[2], HEADER_ERROR_REASON)
    assert header(record[2], "mailtap.error.class") == "GiveUp"
    events.close()
    dlq.close()


async def test_header_injection_is_failed_before_sending(
    services: DevServices, unique: str, relay: ScriptedRelay
) -> None:
    cfg, settings, _ = sink_config(services.bootstrap_servers, unique, relay.port)
    cmd = command(["ok@example.org"], subject="Hi\r\nBcc: victim@example.net")
    produce_commands(cfg, [cmd])
    events = TopicReader(cfg, cfg.kafka.topics.delivery)
    (event,) = await run_until(SmtpSink(cfg, settings), events, lambda ev: len(ev) >= 1)
    assert (event["status"], event["recipient"]) == ("FAILED", None)
    assert "subject: control character" in event["diagnostic"]
    assert relay.handler.snapshot() == []
    events.close()


async def test_replay_of_mail_commands_sends_nothing_new(
    services: DevServices, unique: str, relay: ScriptedRelay
) -> None:
    cfg, settings, _raw = sink_config(services.bootstrap_servers, unique, relay.port)
    cmds = [command([f"user{i}@example.org"]) for i in range(5)] + [
        command(["rcpt550@example.org"])
    ]
    produce_commands(cfg, cmds)
    events = TopicReader(cfg, cfg.kafka.topics.delivery)
    await run_until(SmtpSink(cfg, settings), events, lambda ev: len(ev) >= 6)
    assert len(relay.handler.snapshot()) == 5
    # A new consumer group reads mail.commands from the beginning: a full replay.
    replay_cfg, replay_settings, _ = sink_config(
        services.bootstrap_servers, unique, relay.port, group_id=f"replay-{unique}"
    )
    replay = SmtpSink(replay_cfg, replay_settings)
    await run_until(replay, events, lambda _ev: replay.records_total >= 6)
    assert replay.records_total == 6
    assert len(relay.handler.snapshot()) == 5
    events.drain()
    assert len(events.values) == 6
    events.close()


async def test_new_commands_are_not_stuck_behind_a_waiting_retry(
    services: DevServices, unique: str, relay: ScriptedRelay
) -> None:
    cfg, settings, _ = sink_config(
        services.bootstrap_servers, unique, relay.port, retry_tiers=["1h"], max_lifetime="1d"
    )
    waiting = command(["data451@example.org"])
    produce_commands(cfg, [waiting])
    events = TopicReader(cfg, cfg.kafka.topics.delivery)
    sink = SmtpSink(cfg, settings)
    sink.start()
    deadline = time.monotonic() + WAIT_S

    async def until(condition: Callable[[], bool]) -> None:
        while not condition():
            assert time.monotonic() < deadline, events.values
            await sink.poll_once()
            events.poll(0.05)

    try:
        await until(lambda: len(events.values) >= 1)
        fresh = command(["ok@example.org"])
        produce_commands(cfg, [fresh])
        await until(lambda: any(e["command_id"] == fresh["command_id"] for e in events.values))
        # The retry record was read, found not due, and its partition parked until due time.
        await until(lambda: bool(sink.gate.paused))
        assert [p[0] for p in sink.gate.paused] == [f"{cfg.kafka.topics.retry_prefix}.1h"]
    finally:
        await sink.close()
    assert [(e["command_id"], e["status"]) for e in events.values] == [
        (waiting["command_id"], "DEFERRED"),
        (fresh["command_id"], "SENT"),
    ]
    events.close()


async def test_undecodable_command_is_dead_lettered_and_the_sink_moves_on(
    services: DevServices, unique: str, relay: ScriptedRelay
) -> None:
    cfg, settings, _ = sink_config(services.bootstrap_servers, unique, relay.port)
    produce_commands(cfg, [])
    producer = Producer(producer_config(cfg.kafka))
    producer.produce(cfg.kafka.topics.commands, key=b"garbage-1", value=b"\x00not avro at all")
    producer.flush(30)
    after = command(["ok@example.org"])
    produce_commands(cfg, [after])
    events = TopicReader(cfg, cfg.kafka.topics.delivery)
    (event,) = await run_until(SmtpSink(cfg, settings), events, lambda ev: len(ev) >= 1)
    assert (event["command_id"], event["status"]) == (after["command_id"], "SENT")
    dlq = TopicReader(cfg, cfg.kafka.topics.dlq, decode=False)
    dlq.drain()
    ((key, value, headers),) = dlq.records
    assert (key, value) == ("garbage-1", b"\x00not avro at all")
    assert "undecodable ReplyCommand" in header(headers, HEADER_ERROR_REASON)
    assert header(headers, "mailtap.error.topic") == cfg.kafka.topics.commands
    events.close()
    dlq.close()


async def test_unreachable_relay_defers_the_batch_without_a_timeout_per_message(
    services: DevServices, unique: str
) -> None:
    # A listener that accepts and never greets: every session open ends in the connect timeout.
    listener = socket.create_server(("127.0.0.1", 0))
    accepted: list[socket.socket] = []

    def accept() -> None:
        with contextlib.suppress(OSError):
            while True:
                accepted.append(listener.accept()[0])

    threading.Thread(target=accept, daemon=True).start()
    port = listener.getsockname()[1]
    cfg, settings, _ = sink_config(
        services.bootstrap_servers, unique, port, connect_timeout=1, pool_size=2, batch_size=50
    )
    cmds = [command([f"user{i}@example.org"]) for i in range(6)]
    produce_commands(cfg, cmds)
    events = TopicReader(cfg, cfg.kafka.topics.delivery)
    try:
        got = await run_until(SmtpSink(cfg, settings), events, lambda ev: len(ev) >= 6)
    finally:
        listener.close()
        for conn in accepted:
            conn.close()
    assert {(e["status"], e["attempt"]) for e in got[:6]} == {("DEFERRED", 1)}
    assert all("timeout before the message was accepted (connect)" in e["diagnostic"] for e in got)
    # At most one connection per pool slot per batch, not one per message.
    assert len(accepted) <= 2 * len({e["occurred_at"] for e in got[:6]})
    events.close()


async def test_throttled_domain_is_deferred_not_waited_for(
    services: DevServices, unique: str, relay: ScriptedRelay
) -> None:
    cfg, settings, _ = sink_config(
        services.bootstrap_servers,
        unique,
        relay.port,
        domain_rates={"slow.example": {"per_minute": 1, "burst": 1}},
        max_rate_wait=0.5,
        retry_tiers=["1h"],
        max_lifetime="1d",
    )
    cmds = [command([f"u{i}@slow.example"]) for i in range(3)] + [command(["x@fast.example"])]
    produce_commands(cfg, cmds)
    events = TopicReader(cfg, cfg.kafka.topics.delivery)
    got = await run_until(SmtpSink(cfg, settings), events, lambda ev: len(ev) >= 4)
    by_status: dict[str, list[str]] = {}
    for event in got:
        by_status.setdefault(event["status"], []).append(event["recipient"])
    # fast.example is not limited; slow.example gets one message now, the others are deferred.
    sent = set(by_status["SENT"])
    assert "x@fast.example" in sent and len(sent - {"x@fast.example"}) == 1
    assert {r.split("@")[1] for r in sent - {"x@fast.example"}} == {"slow.example"}
    assert len(by_status["DEFERRED"]) == 2
    assert {r.split("@")[1] for r in by_status["DEFERRED"]} == {"slow.example"}
    assert all("rate limit" in e["diagnostic"] for e in got if e["status"] == "DEFERRED")
    assert len(relay.handler.snapshot()) == 2
    events.close()
