"""The sink with ``kafka.tracing.enabled`` against a scripted relay and a real Kafka (issue 13
item 6): a command's trace goes on to each DeliveryEvent and through the retry tiers, so every
attempt of one mail stays in its trace."""

from __future__ import annotations

from typing import Any

from confluent_kafka import Producer
from smtp_harness import TopicReader, command, run_until, sink_config
from smtp_scripted_server import ScriptedRelay

from connectors.core.avro.serde import AvroSerde
from connectors.core.config import config_from_dict
from connectors.core.kafka.clients import producer_config
from connectors.core.kafka.topics import ensure_topics
from connectors.smtp.config import SmtpSinkSettings
from connectors.smtp.sink import SmtpSink
from mailtap.dev import DevServices

TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
PARENT = f"00-{TRACE}-00f067aa0ba902b7-01"


def _trace(headers: list[tuple[str, bytes]]) -> str | None:
    parent = dict(headers).get("traceparent")
    return parent.decode().split("-")[1] if parent else None


async def test_a_commands_trace_reaches_every_delivery_event_and_retry(
    services: DevServices, unique: str, relay: ScriptedRelay
) -> None:
    _, _, raw = sink_config(services.bootstrap_servers, unique, relay.port)
    raw["kafka"]["tracing"] = {"enabled": True}
    cfg = config_from_dict(raw)
    settings = cfg.section("smtp", SmtpSinkSettings)
    ensure_topics(cfg.kafka, retry_tiers=settings.retry_tiers)
    serde = AvroSerde.for_schema("ReplyCommand", cfg.kafka)
    traced, deferred = command(["alice@example.org"]), command(["rcpt450@example.org"])
    producer = Producer(producer_config(cfg.kafka))
    topic = cfg.kafka.topics.commands
    for cmd, headers in ((traced, [("traceparent", PARENT.encode())]), (deferred, None)):
        producer.produce(
            topic, key=cmd["command_id"].encode(), value=serde.encode(cmd, topic), headers=headers
        )
    assert producer.flush(30) == 0

    events = TopicReader(cfg, cfg.kafka.topics.delivery)

    def done(values: list[dict[str, Any]]) -> bool:
        sent = any(v["command_id"] == traced["command_id"] for v in values)
        return sent and any(
            v["command_id"] == deferred["command_id"] and v["attempt"] == 2 for v in values
        )

    await run_until(SmtpSink(cfg, settings), events, done)
    by_command: dict[str, list[tuple[int, str | None]]] = {}
    for key, value, headers in events.records:
        assert key is not None
        by_command.setdefault(key, []).append((value["attempt"], _trace(headers)))

    # A command that came with a trace: its delivery event is in that trace.
    assert by_command[traced["command_id"]] == [(1, TRACE)]
    # A command without one (produced by something that does not trace): the sink starts a
    # trace at the send, and the retry and the second attempt stay in it.
    attempts = by_command[deferred["command_id"]][:2]
    assert [a for a, _ in attempts] == [1, 2]
    first_trace = attempts[0][1]
    assert first_trace is not None and first_trace != TRACE
    assert attempts[1][1] == first_trace
    retries = TopicReader(cfg, f"{cfg.kafka.topics.retry_prefix}.1s", decode=False)
    retries.drain()
    assert [_trace(h) for _, _, h in retries.records] == [first_trace]
    for reader in (events, retries):
        reader.close()
