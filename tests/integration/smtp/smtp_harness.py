"""Helpers for the SMTP sink's integration tests: config, commands in, events out."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from typing import Any

from confluent_kafka import OFFSET_BEGINNING, Consumer, Producer, TopicPartition

from connectors.core.avro.serde import AvroSerde
from connectors.core.config import MailtapConfig, config_from_dict
from connectors.core.kafka.clients import consumer_config, producer_config
from connectors.core.kafka.topics import ensure_topics
from connectors.smtp.config import SmtpSinkSettings
from connectors.smtp.lanes import PRODUCER_COMPRESSION
from connectors.smtp.sink import SmtpSink

#: Generous upper bounds for waiting on results; never asserted as durations.
WAIT_S = 90.0


def sink_config(
    bootstrap: str, unique: str, smtp_port: int, **smtp: Any
) -> tuple[MailtapConfig, SmtpSinkSettings, dict[str, Any]]:
    raw: dict[str, Any] = {
        "kafka": {
            "bootstrap_servers": bootstrap,
            "partitions": 2,
            "topics": {
                "commands": f"mail.commands.{unique}",
                "retry_prefix": f"mail.commands.{unique}.retry",
                "dlq": f"mail.commands.{unique}.dlq",
                "delivery": f"mail.delivery.{unique}",
                "suppressions": f"mail.suppressions.{unique}",
            },
        },
        "health": {"port": 0},
        "smtp": {
            "host": "127.0.0.1",
            "port": smtp_port,
            "security": "plain",
            "from_address": "mailtap@example.com",
            "group_id": f"sink-{unique}",
            "state_topic": f"mailtap.sink.state.{unique}",
            "instance_id": f"test-{unique}",
            "retry_tiers": ["1s", "2s"],
            "max_lifetime": "1h",
            "command_timeout": 10,
            "data_timeout": 10,
            "pool_size": 2,
            **smtp,
        },
    }
    cfg = config_from_dict(raw)
    return cfg, cfg.section("smtp", SmtpSinkSettings), raw


def command(to: list[str], *, command_id: str | None = None, **overrides: Any) -> dict[str, Any]:
    value: dict[str, Any] = {
        "schema_version": 1,
        "command_id": command_id or uuid.uuid4().hex,
        "kind": "REPLY",
        "workflow": "ack",
        "step": "reply",
        "event_key": "evt-1",
        "from": {"name": "Support", "address": "support@example.com"},
        "to": [{"name": None, "address": a} for a in to],
        "cc": [],
        "bcc": [],
        "reply_to": [],
        "subject": "Re: your request",
        "text_body": "We got it.",
        "html_body": None,
        "attachments": [],
        "in_reply_to": "orig-1@example.org",
        "references": [],
        "auto_submitted": "auto-replied",
        "created_at": datetime.now(UTC),
    }
    value.update(overrides)
    return value


def produce_commands(cfg: MailtapConfig, commands: list[dict[str, Any]]) -> None:
    """Create the topics (the broker does not auto-create them) and write the commands."""
    ensure_topics(cfg.kafka, retry_tiers=cfg.section("smtp", SmtpSinkSettings).retry_tiers)
    serde = AvroSerde.for_schema("ReplyCommand", cfg.kafka)
    producer = Producer(producer_config(cfg.kafka, compression_type=PRODUCER_COMPRESSION))
    topic = cfg.kafka.topics.commands
    errors: list[Any] = []

    def delivered(err: Any, _msg: Any) -> None:
        if err is not None:
            errors.append(err)

    for value in commands:
        producer.produce(
            topic,
            key=value["command_id"].encode(),
            value=serde.encode(value, topic),
            on_delivery=delivered,
        )
    assert producer.flush(30) == 0
    assert errors == [], errors


class TopicReader:
    """Reads a topic from the beginning (read_committed), accumulating records.

    Partitions are assigned directly (no group join), so :meth:`drain` can read "everything
    committed so far" deterministically: up to each partition's last stable offset.
    """

    def __init__(self, cfg: MailtapConfig, topic: str, decode: bool = True) -> None:
        self.topic = topic
        self.records: list[tuple[str | None, Any, list[tuple[str, bytes]]]] = []
        self._serde = AvroSerde.for_schema("DeliveryEvent", cfg.kafka) if decode else None
        self._consumer = Consumer(consumer_config(cfg.kafka, f"reader-{uuid.uuid4().hex[:8]}"))
        partitions = self._consumer.list_topics(topic, timeout=30).topics[topic].partitions
        self._partitions = [TopicPartition(topic, p, OFFSET_BEGINNING) for p in sorted(partitions)]
        self._consumer.assign(self._partitions)

    def drain(self, timeout: float = WAIT_S) -> None:
        """Read until every partition is at its last stable offset (as of this call)."""
        ends = {
            tp.partition: self._consumer.get_watermark_offsets(tp, timeout=30, cached=False)[1]
            for tp in self._partitions
        }
        deadline = time.monotonic() + timeout
        while True:
            positions = self._consumer.position([TopicPartition(self.topic, p) for p in ends])
            if all(tp.offset >= ends[tp.partition] or ends[tp.partition] == 0 for tp in positions):
                return
            assert time.monotonic() < deadline, f"could not read {self.topic} to its end"
            self.poll(0.2)

    def poll(self, seconds: float = 0.2) -> None:
        for msg in self._consumer.consume(500, timeout=seconds):
            if msg.error():
                continue
            key = msg.key().decode() if msg.key() else None
            value = msg.value()
            decoded = self._serde.decode(value) if self._serde and value else value
            self.records.append((key, decoded, list(msg.headers() or [])))

    @property
    def values(self) -> list[Any]:
        return [v for _, v, _ in self.records]

    def close(self) -> None:
        self._consumer.close()


async def run_until(
    sink: SmtpSink,
    events: TopicReader,
    done: Callable[[list[dict[str, Any]]], bool],
    timeout: float = WAIT_S,
) -> list[dict[str, Any]]:
    """Run the sink in this loop until ``done(events)``; returns the events."""
    sink.start()
    try:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            await sink.poll_once()
            events.poll(0.05)
            if done(events.values):
                return events.values
            await asyncio.sleep(0)
        raise AssertionError(f"condition not reached; events so far: {events.values}")
    finally:
        await sink.close()


def by_recipient(events: list[dict[str, Any]]) -> dict[str | None, list[dict[str, Any]]]:
    out: dict[str | None, list[dict[str, Any]]] = {}
    for event in events:
        out.setdefault(event["recipient"], []).append(event)
    return out


def statuses(events: list[dict[str, Any]], recipient: str) -> list[str]:
    return [e["status"] for e in events if e["recipient"] == recipient]


def partitions_of(topic: str, count: int) -> Iterator[TopicPartition]:
    for p in range(count):
        yield TopicPartition(topic, p)
