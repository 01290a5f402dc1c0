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

from confluent_kafka import Consumer, ConsumerGroupTopicPartitions, KafkaError, TopicPartition

from connectors.core.config import KafkaSettings
from connectors.core.kafka.clients import admin_client, consumer_config

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


def _partitions(consumer: Consumer, topic: str) -> list[int]:
    metadata = consumer.list_topics(topic, timeout=10)
    found = metadata.topics.get(topic)
    if found is None or found.error is not None:
        return []
    return sorted(found.partitions)


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
            kafka, group_id=f"mailtap-scan-{uuid.uuid4().hex[:8]}", enable_partition_eof=True
        )
    )
    try:
        partitions = _partitions(consumer, topic)
        if not partitions:
            return
        if since_ms is None:
            start = [TopicPartition(topic, p, 0) for p in partitions]
        else:
            start = consumer.offsets_for_times(
                [TopicPartition(topic, p, since_ms) for p in partitions], timeout=10
            )
        pending = set()
        assign = []
        for tp in start:
            low, high = consumer.get_watermark_offsets(
                TopicPartition(topic, tp.partition), timeout=10
            )
            offset = tp.offset if tp.offset >= 0 else high  # -1: nothing that recent
            if offset < high:
                pending.add(tp.partition)
                assign.append(TopicPartition(topic, tp.partition, max(offset, low)))
        if not assign:
            return
        consumer.assign(assign)
        deadline = time.monotonic() + timeout
        while pending:
            if time.monotonic() > deadline:
                raise TimeoutError(f"reading {topic} did not reach its end within {timeout:.0f}s")
            msg = consumer.poll(0.5)
            if msg is None:
                continue
            err = msg.error()
            if err is not None:
                if err.code() == KafkaError._PARTITION_EOF:
                    pending.discard(msg.partition())
                    continue
                raise RuntimeError(f"reading {topic}: {err}")
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
    consumer = Consumer(consumer_config(kafka, group_id=f"mailtap-lag-{uuid.uuid4().hex[:8]}"))
    lags: dict[str, dict[int, int | None]] = {}
    try:
        for topic in topics:
            lags[topic] = {}
            for p in _partitions(consumer, topic):
                _, high = consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)
                done = committed.get((topic, p))
                lags[topic][p] = None if done is None or done < 0 else max(0, high - done)
    finally:
        consumer.close()
    return lags
