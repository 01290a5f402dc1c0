"""Helpers of the Exchange source tests: the config they run with and read_committed readers."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

from confluent_kafka import Consumer, TopicPartition

from connectors.core.config import KafkaSettings
from connectors.core.kafka import consumer_config
from connectors.core.serde import AvroSerde
from tests.ews_server import EwsTestServer
from tests.ews_server.fixture import PASSWORD, USER

__all__ = ["ACCOUNT", "PASSWORD", "USER", "read_events", "read_topic", "source_config"]

ACCOUNT = "ops"


def source_config(
    kafka: KafkaSettings, ews: EwsTestServer, claims: Path, **ews_overrides: Any
) -> dict[str, Any]:
    account = {
        "name": ACCOUNT,
        "service_endpoint": ews.url,
        "email": USER,
        "auth": "basic",
        "password": PASSWORD,
        "start": "all",
    }
    account.update(ews_overrides.pop("account", {}))
    section = {
        "accounts": [account],
        "connection_timeout_minutes": 1,
        "stream_read_timeout_seconds": 5,
        "backoff_initial_seconds": 0.1,
        "backoff_cap_seconds": 1.0,
        **ews_overrides,
    }
    return {
        "kafka": kafka.model_dump(mode="json"),
        "claim_check": {"url": claims.as_uri()},
        "health": {"port": 0},
        "ews": section,
    }


def read_topic(
    kafka: KafkaSettings, topic: str, isolation: str = "read_committed"
) -> list[tuple[bytes, bytes | None]]:
    """Every (key, value) of ``topic`` up to its end."""
    consumer = Consumer(
        consumer_config(
            kafka,
            group_id=f"t-{uuid.uuid4().hex[:6]}",
            isolation_level=isolation,
            enable_partition_eof=True,
        )
    )
    try:
        parts = consumer.list_topics(topic, timeout=10).topics[topic].partitions
        consumer.assign([TopicPartition(topic, p, 0) for p in parts])
        out: list[tuple[bytes, bytes | None]] = []
        eof: set[int] = set()
        while eof != set(parts):
            msg = consumer.poll(10)
            assert msg is not None, f"no end of partition seen on {topic}"
            if msg.error():
                eof.add(msg.partition())
                continue
            out.append((msg.key(), msg.value()))
        return out
    finally:
        consumer.close()


def read_events(kafka: KafkaSettings) -> list[tuple[str, dict[str, Any]]]:
    serde = AvroSerde.for_schema("MailEvent", kafka)
    return [
        (key.decode(), serde.decode(value))
        for key, value in read_topic(kafka, kafka.topics.events)
        if value is not None
    ]
