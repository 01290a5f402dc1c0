"""Read a topic (or its last hour) to its current end, and a consumer group's lag: the Kafka side
of ``mailtap status`` and ``mailtap dlq``, usable from any machine that reaches the cluster.

Reads are ``read_committed`` (sources and the sink write in transactions) with a throw-away group
that never commits, so looking never moves anyone's position.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass

from confluent_kafka import Consumer, ConsumerGroupTopicPartitions, TopicPartition

from connectors.core.config import KafkaSettings
from connectors.core.kafka.clients import admin_client, consumer_config
from connectors.core.kafka.readtoend import read_to_end, topic_partitions
from connectors.core.kafka.retry import retry_retriable

#: A read stops with an error rather than hanging when the end is not reached in this time.
READ_TIMEOUT_S = 60.0


@dataclass(frozen=True)
class Seen:
    """One record as read: where it sits and what it holds."""

    topic: str
    partition: int
    offset: int
    timestamp_ms: int
    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, bytes], ...]

    def header(self, name: str) -> str | None:
        for k, v in self.headers:
            if k == name:
                return v.decode("utf-8", "replace") if v is not None else None
        return None


def scan(
    kafka: KafkaSettings,
    topic: str,
    *,
    since_ms: int | None = None,
    timeout: float = READ_TIMEOUT_S,
) -> Iterator[Seen]:
    """Every committed record of ``topic`` (from ``since_ms`` when given) up to the current end."""
    consumer = Consumer(
        consumer_config(
            kafka,
            group_id=kafka.qualify(f"mailtap-scan-{uuid.uuid4().hex[:8]}"),
            enable_partition_eof=True,
        )
    )
    deadline = time.monotonic() + timeout
    try:
        partitions = topic_partitions(consumer, kafka, topic, 10)
        if not partitions:
            return
        starts = [TopicPartition(topic, p, 0 if since_ms is None else since_ms) for p in partitions]
        if since_ms is not None:  # offset -1 where nothing is that recent: read nothing there
            starts = retry_retriable(
                lambda: consumer.offsets_for_times(starts, timeout=10),
                deadline,
                f"finding the offsets of {topic} at {since_ms}",
            )
        for msg in read_to_end(consumer, starts, deadline - time.monotonic()):
            raw_headers = msg.headers() or []
            pairs = raw_headers.items() if isinstance(raw_headers, dict) else raw_headers
            yield Seen(
                topic,
                msg.partition() or 0,
                msg.offset() or 0,
                msg.timestamp()[1],
                msg.key(),
                msg.value(),
                tuple((k, v.encode() if isinstance(v, str) else v or b"") for k, v in pairs),
            )
    finally:
        consumer.close()


def group_lag(
    kafka: KafkaSettings, group: str, topics: list[str]
) -> dict[str, dict[int, int | None]]:
    """``{topic: {partition: lag}}`` of a consumer group; None where it never committed."""
    admin = admin_client(kafka)
    futures = admin.list_consumer_group_offsets([ConsumerGroupTopicPartitions(group)])
    committed = {
        (tp.topic, tp.partition): tp.offset
        for tp in futures[group].result(timeout=30).topic_partitions or []
    }
    consumer = Consumer(
        consumer_config(kafka, group_id=kafka.qualify(f"mailtap-lag-{uuid.uuid4().hex[:8]}"))
    )
    lags: dict[str, dict[int, int | None]] = {}
    try:
        for topic in topics:
            lags[topic] = {}
            for p in topic_partitions(consumer, kafka, topic, 10) or []:
                _, high = consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)
                done = committed.get((topic, p))
                lags[topic][p] = None if done is None or done < 0 else max(0, high - done)
    finally:
        consumer.close()
    return lags
