"""read_to_end against the real broker: it ends at the end as of the call on a topic others keep
writing to, stops before a transaction still open (read_committed) and reads past it when asked
for uncommitted records, and reads a topic created a moment ago (no leader known yet) instead of
failing on it."""

from __future__ import annotations

import logging
import threading

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import NewTopic  # type: ignore[attr-defined]

from connectors.core.config import KafkaSettings
from connectors.core.kafka.clients import admin_client, consumer_config, producer_config
from connectors.core.kafka.readtoend import read_to_end, topic_partitions
from connectors.core.kafka.topics import DELETED, TopicSpec, ensure_topic_specs
from mailtap.dev import DevServices


def _kafka(services: DevServices) -> KafkaSettings:
    return KafkaSettings(bootstrap_servers=services.kafka.bootstrap_servers)


def _topic_with(services: DevServices, name: str, partitions: int, values: list[bytes]) -> str:
    """A new topic holding ``values``."""
    kafka = _kafka(services)
    ensure_topic_specs(kafka, [TopicSpec(name, partitions, DELETED)])
    _produce(kafka, name, values)
    return name


def _read(kafka: KafkaSettings, topic: str, *, committed: bool = True) -> list[bytes]:
    level = "read_committed" if committed else "read_uncommitted"
    consumer = Consumer(
        consumer_config(kafka, "read-to-end-test", isolation_level=level, fetch_wait_max_ms=10)
    )
    try:
        partitions = topic_partitions(consumer, kafka, topic, 30) or []
        starts = [TopicPartition(topic, p, 0) for p in partitions]
        return [m.value() or b"" for m in read_to_end(consumer, starts, 30)]
    finally:
        consumer.close()


def _produce(kafka: KafkaSettings, topic: str, values: list[bytes]) -> None:
    producer = Producer(producer_config(kafka))
    for value in values:
        producer.produce(topic, value=value)
    assert producer.flush(30) == 0


def test_the_read_ends_while_another_writer_keeps_writing(
    services: DevServices, unique: str
) -> None:
    kafka = _kafka(services)
    before = [f"before-{i}".encode() for i in range(50)]
    topic = _topic_with(services, f"readtoend.busy.{unique}", 2, before)
    stop = threading.Event()
    written = [0]

    def busy() -> None:
        producer = Producer(producer_config(kafka, linger_ms=0))
        while not stop.is_set():
            producer.produce(topic, value=b"during")
            producer.poll(0)
            written[0] += 1
            stop.wait(0.001)
        producer.flush(10)

    thread = threading.Thread(target=busy, daemon=True)
    thread.start()
    try:
        while written[0] < 100:  # the other writer is writing
            stop.wait(0.05)
        read = _read(kafka, topic)
    finally:
        stop.set()
        thread.join(30)
    assert set(before) <= set(read)  # everything written before the call, and the read ended
    print(f"\n{written[0]} records written by the other writer; the read took {len(read)}")


def test_read_committed_stops_before_an_open_transaction(
    services: DevServices, unique: str
) -> None:
    kafka = _kafka(services)
    topic = _topic_with(services, f"readtoend.txn.{unique}", 1, [b"committed"])
    producer = Producer(producer_config(kafka, transactional_id=f"readtoend-{unique}"))
    producer.init_transactions(30)
    producer.begin_transaction()
    producer.produce(topic, value=b"open")
    producer.flush(30)
    try:
        assert _read(kafka, topic) == [b"committed"]
        assert _read(kafka, topic, committed=False) == [b"committed", b"open"]
    finally:
        producer.abort_transaction(30)


def test_a_topic_created_a_moment_ago_reads_to_its_end(services: DevServices, unique: str) -> None:
    kafka = _kafka(services)
    admin = admin_client(kafka)
    for n in range(5):
        topic = f"readtoend.fresh.{unique}.{n}"
        admin.create_topics([NewTopic(topic, 3, 1)])[topic].result(30)
        # No wait for leaders: the read rides out what the broker answers meanwhile.
        assert _read(kafka, topic) == []
        _produce(kafka, topic, [b"one", b"two"])
        assert sorted(_read(kafka, topic)) == [b"one", b"two"]


def test_finding_the_end_rides_out_a_topic_that_exists_only_a_moment_later(
    services: DevServices, unique: str, caplog: pytest.LogCaptureFixture
) -> None:
    kafka = _kafka(services)
    topic = f"readtoend.later.{unique}"
    admin = admin_client(kafka)
    retry_log = logging.getLogger("connectors.core.kafka.retry")
    met_missing = threading.Event()

    class FirstRetry(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            if "retrying" in record.getMessage():
                met_missing.set()

    def create_later() -> None:
        # Once the read has met the missing topic: a fixed 0.5 s pause lost the race when the
        # consumer took longer than that to ask (CI under load), and nothing was retried.
        met_missing.wait(30)
        admin.create_topics([NewTopic(topic, 1, 1)])[topic].result(30)

    seen = FirstRetry()
    retry_log.addHandler(seen)
    creator = threading.Thread(target=create_later)
    creator.start()
    consumer = Consumer(consumer_config(kafka, "read-to-end-test", fetch_wait_max_ms=10))
    try:
        with caplog.at_level(logging.DEBUG, logger="connectors.core.kafka.retry"):
            read = list(read_to_end(consumer, [TopicPartition(topic, 0, 0)], 30))
    finally:
        consumer.close()
        creator.join(30)
        retry_log.removeHandler(seen)
    assert read == []
    retried = [r.getMessage() for r in caplog.records if "retrying" in r.getMessage()]
    assert retried and all(f"finding the end of {topic}" in m for m in retried), retried
