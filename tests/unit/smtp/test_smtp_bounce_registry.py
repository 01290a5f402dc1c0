"""The bounce reader waits for an unreachable schema registry: it reads the batch again and
commits nothing meanwhile, instead of ending (which took the whole sink down until the registry
came back: `mailtap soak`, registry-down faults) or skipping a DSN."""

from __future__ import annotations

import threading
from typing import Any

from confluent_kafka import TopicPartition

from connectors.core.errors import RegistryUnavailable
from connectors.smtp.bounce_reader import BounceReader


class Record:
    def __init__(self, offset: int, partition: int = 2) -> None:
        self._offset, self._partition = offset, partition

    def error(self) -> None:
        return None

    def key(self) -> bytes:
        return b"other/mid:%d@example.com" % self._offset

    def value(self) -> bytes:
        return b"\x00\x00\x00\x00\x01\x02"

    def topic(self) -> str:
        return "mail.events"

    def partition(self) -> int:
        return self._partition

    def offset(self) -> int:
        return self._offset


class Consumer:
    """Hands out the batch from its position; `seek` moves the position back."""

    def __init__(self, records: list[Record]) -> None:
        self.records = records
        self.position = records[0].offset()
        self.seeks: list[tuple[str, int, int]] = []

    def consume(self, num: int, timeout: float) -> list[Record]:
        batch = [r for r in self.records if r.offset() >= self.position][:num]
        if batch:
            self.position = batch[-1].offset() + 1
        return batch

    def seek(self, tp: TopicPartition) -> None:
        self.seeks.append((tp.topic, tp.partition, tp.offset))
        self.position = tp.offset

    def consumer_group_metadata(self) -> object:
        return object()


class Producer:
    def __init__(self) -> None:
        self.calls: list[str] = []
        self.offsets: list[tuple[str, int, int]] = []

    def begin_transaction(self) -> None:
        self.calls.append("begin")

    def produce(self, topic: str, key: bytes, value: bytes) -> None:
        self.calls.append(f"produce {topic}")

    def send_offsets_to_transaction(self, positions: list[TopicPartition], *_: Any) -> None:
        self.offsets += [(p.topic, p.partition, p.offset) for p in positions]

    def commit_transaction(self, timeout: float) -> None:
        self.calls.append("commit")

    def abort_transaction(self, timeout: float) -> None:
        self.calls.append("abort")


class Serde:
    """Unavailable for the first ``outages`` calls."""

    def __init__(self, outages: int, value: dict[str, Any]) -> None:
        self.outages, self.value, self.calls = outages, value, 0

    def _call(self) -> dict[str, Any]:
        self.calls += 1
        if self.calls <= self.outages:
            raise RegistryUnavailable("the schema registry did not answer: connection refused")
        return self.value

    def decode(self, value: bytes, topic: str = "") -> dict[str, Any]:
        return self._call()

    def encode(self, value: dict[str, Any], topic: str = "") -> bytes:
        self._call()
        return b"encoded"


def reader(records: list[Record], events_serde: Serde) -> BounceReader:
    r = BounceReader.__new__(BounceReader)  # the loop's steps, with stand-in Kafka clients
    r._consumer = Consumer(records)  # type: ignore[assignment]
    r._producer = Producer()  # type: ignore[assignment]
    r._stop = threading.Event()
    r._stop.set()  # no real wait between the attempts
    r.events_serde = events_serde  # type: ignore[assignment]
    r.accounts = {"bounces"}
    r.suppressions = None
    r.metrics = None
    r.published = r.suppressed = r.uncorrelated = 0

    class Topics:
        delivery = "mail.delivery"
        suppressions = "mail.suppressions"

    class Kafka:
        topics = Topics

    class Config:
        kafka = Kafka

    r.config = Config  # type: ignore[assignment]
    return r


def test_a_batch_read_while_the_registry_is_down_is_read_again_and_committed_after() -> None:
    # A mail of another account: decoded, not a bounce; its offsets are committed all the same.
    serde = Serde(outages=1, value={"account": "other", "change": "ADDED"})
    r = reader([Record(10), Record(11)], serde)
    assert r.poll_once() == 0
    consumer, producer = r._consumer, r._producer
    assert consumer.seeks == [("mail.events", 2, 10)]  # type: ignore[attr-defined]
    assert producer.calls == []  # type: ignore[attr-defined]  # nothing begun, nothing committed
    assert r.poll_once() == 2
    assert producer.calls == ["begin", "commit"]  # type: ignore[attr-defined]
    assert producer.offsets == [("mail.events", 2, 12)]  # type: ignore[attr-defined]


def test_an_outage_while_writing_the_bounced_events_aborts_and_reads_again() -> None:
    r = reader([Record(10)], Serde(outages=0, value={}))
    r._bounces_in = lambda record, entries: [{"command_id": "c1"}]  # type: ignore[method-assign, assignment, return-value]
    r.delivery_serde = Serde(outages=1, value={})  # type: ignore[assignment]
    assert r.poll_once() == 0
    assert r._producer.calls == ["begin", "abort"]  # type: ignore[attr-defined]
    assert r._consumer.seeks == [("mail.events", 2, 10)]  # type: ignore[attr-defined]
    assert r.poll_once() == 1
    assert r._producer.calls[-2:] == ["produce mail.delivery", "commit"]  # type: ignore[attr-defined]
    assert r.published == 1
