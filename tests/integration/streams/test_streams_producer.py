"""The worker's librdkafka producer (streams.producer) on the test broker: a keyed record lands
on the partition faust's partitioner gives its key (Kafka's murmur2), an explicit partition and
the headers are kept, the futures are set on the loop, a record Kafka refuses fails its future,
and nothing runs after ``close``."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import pytest
from confluent_kafka import Consumer, KafkaException, TopicPartition
from confluent_kafka.admin import NewTopic  # type: ignore[attr-defined]

from connectors.core.config import KafkaSettings
from connectors.core.kafka.clients import admin_client, consumer_config
from streams.partitioner import KeyPartitioner
from streams.producer import LibrdkafkaProducer

PARTITIONS = 6


@pytest.fixture
def topic(services: Any) -> str:
    name = f"streams-producer-{uuid.uuid4().hex[:8]}"
    kafka = KafkaSettings(bootstrap_servers=services.kafka.bootstrap_servers)
    admin = admin_client(kafka)  # held until the topic exists: its handle ends with it
    admin.create_topics([NewTopic(name, PARTITIONS, 1)])[name].result(30)
    return name


def _read(kafka: KafkaSettings, topic: str, count: int) -> list[Any]:
    consumer = Consumer(consumer_config(kafka, group_id=f"t-{uuid.uuid4().hex[:8]}"))
    try:
        consumer.assign([TopicPartition(topic, p, 0) for p in range(PARTITIONS)])
        found: list[Any] = []
        for _ in range(120):
            found += [m for m in consumer.consume(count, timeout=0.5) if not m.error()]
            if len(found) >= count:
                return found
        raise AssertionError(f"read {len(found)} of {count} records of {topic}")
    finally:
        consumer.close()


def test_records_keep_the_partitioners_partition_their_headers_and_their_order(
    services: Any, topic: str
) -> None:
    kafka = KafkaSettings(bootstrap_servers=services.kafka.bootstrap_servers)
    keys = [f"conversation-{n}@example.com".encode() for n in range(60)]

    async def send_all() -> None:
        producer = LibrdkafkaProducer(kafka, linger_s=0.01)
        futures = [
            await producer.send(topic, b"%d" % n, key=key, headers=[("n", b"%d" % n)])
            for n, key in enumerate(keys)
        ]
        futures.append(await producer.send(topic, b"pinned", key=b"any", partition=4))
        await asyncio.wait_for(asyncio.gather(*futures), 30)
        await producer.close()
        with pytest.raises(KafkaException, match="closed"):
            await producer.send(topic, b"late")

    asyncio.run(send_all())
    records = _read(kafka, topic, len(keys) + 1)
    partitioner = KeyPartitioner()
    everything = list(range(PARTITIONS))
    by_value = {m.value(): m for m in records}
    for n, key in enumerate(keys):
        record = by_value[b"%d" % n]
        assert record.key() == key
        assert record.partition() == partitioner(key, everything, everything), key
        assert record.headers() == [("n", b"%d" % n)]
    assert by_value[b"pinned"].partition() == 4
    # One partition's records in the order they were sent.
    for p in everything:
        sent = [int(m.value()) for m in records if m.partition() == p and m.value() != b"pinned"]
        assert sent == sorted(sent)


def test_a_record_kafka_refuses_fails_its_future(services: Any, topic: str) -> None:
    kafka = KafkaSettings(bootstrap_servers=services.kafka.bootstrap_servers)

    async def send_too_big() -> None:
        producer = LibrdkafkaProducer(kafka, linger_s=0.0)
        ok = await producer.send(topic, b"fine", key=b"k")
        await asyncio.wait_for(ok, 30)
        with pytest.raises(KafkaException, match=r"(?i)too large|size"):
            # Past message.max.bytes (1 MB, producer_config): refused at once or reported.
            refused = await producer.send(topic, b"x" * 2_000_000, key=b"k")
            await asyncio.wait_for(refused, 30)
        await producer.close()

    asyncio.run(send_too_big())
