"""Helpers of the Exchange source tests: the config they run with and read_committed readers."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

from confluent_kafka import Consumer, KafkaError, TopicPartition

from connectors.core.avro.serde import AvroSerde
from connectors.core.config import KafkaSettings
from connectors.core.kafka.clients import consumer_config
from connectors.core.kafka.offsets import wait_transactions_settled
from tests.ews_server import EwsTestServer
from tests.ews_server.fixture import PASSWORD, USER

__all__ = [
    "ACCOUNT",
    "PASSWORD",
    "USER",
    "read_events",
    "read_topic",
    "source_config",
]

ACCOUNT = "ops"
#: A read_committed reader ends at the last stable offset (LSO), and the broker answers a commit
#: *before* it writes the transaction's markers (the coordinator writes them afterwards; measured
#: here: the LSO still behind the end right after commit_transaction() returned in 91 of 200
#: commits, for up to 0.19 s under load). A read started right after a source's last commit can
#: therefore end before that commit; the readers below wait for it to settle, this long at most.
SETTLE_S = 60.0


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
    kafka: KafkaSettings, topic: str, isolation: str = "read_committed", *, settled: bool = True
) -> list[tuple[bytes, bytes | None]]:
    """Every (key, value) of ``topic`` up to its end. read_committed waits for the transactions
    open on the topic to end first (``wait_transactions_settled``); ``settled=False`` reads what
    is committed now (a test that leaves a crashed writer's transaction open on purpose)."""
    if isolation == "read_committed" and settled:
        wait_transactions_settled(kafka, topic, SETTLE_S)
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
            error = msg.error()
            if error is not None:
                # Only the end of a partition ends it; any other error is a failure to read.
                assert error.code() == KafkaError._PARTITION_EOF, f"reading {topic}: {error}"
                eof.add(msg.partition())
                continue
            out.append((msg.key(), msg.value()))
        return out
    finally:
        consumer.close()


def read_events(kafka: KafkaSettings, *, settled: bool = True) -> list[tuple[str, dict[str, Any]]]:
    serde = AvroSerde.for_schema("MailEvent", kafka)
    return [
        (key.decode(), serde.decode(value))
        for key, value in read_topic(kafka, kafka.topics.events, settled=settled)
        if value is not None
    ]
