"""The source offsets topic (``mailtap.offsets``): where every source's resume position lives.

Kafka Connect's model (KIP-618): a record's *source partition* names the stream it came from, its
*source offset* says how far that stream has been read. Both are canonical JSON so any tool can read
them, and the topic is compacted so only the newest offset per partition is kept.

Wire sample::

    key   {"account":"demo","folder":"INBOX","source":"imap"}
    value {"highestmodseq":12,"last_uid":42,"uidvalidity":1700000000}
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable, Mapping
from concurrent.futures import Future
from typing import Any

from confluent_kafka import Consumer, IsolationLevel, KafkaError, KafkaException, TopicPartition
from confluent_kafka.admin import (  # type: ignore[attr-defined]  # re-exported, no __all__
    AdminClient,
    OffsetSpec,
)

from connectors.core.config import KafkaSettings
from connectors.core.kafka.clients import admin_client, consumer_config
from connectors.core.kafka.errors import KafkaTimeout
from connectors.core.kafka.readtoend import Where, read_to_end, topic_partitions
from connectors.core.kafka.retry import is_retriable, retry_retriable

log = logging.getLogger(__name__)

SourcePartition = Mapping[str, Any]
SourceOffset = Mapping[str, Any]

#: Reading the offsets topic waits for open transactions on it to settle (``settled``; read_committed
#: stops at the last stable offset). Our own writer's init_transactions() aborts our zombie's open
#: transaction first, and another source's crashed one ends at its transaction timeout, so a
#: longer wait means the cluster is unwell: fail the read (the caller retries) rather than hang.
READ_TIMEOUT_S = 60.0
#: A read slower than this says so in the log (it delays every mailbox start waiting for it).
SLOW_READ_S = 1.0


def canonical_json(value: Mapping[str, Any]) -> bytes:
    """Sorted keys, no spaces: the same partition always gives the same bytes (compaction key).

    >>> canonical_json({"folder": "INBOX", "account": "demo"})
    b'{"account":"demo","folder":"INBOX"}'
    """
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


def wait_transactions_settled(kafka: KafkaSettings, topic: str, timeout: float) -> None:
    """Wait until every transaction open on ``topic`` now has ended (committed or aborted): until
    each partition's last stable offset reaches that partition's end as of the call.

    A read_committed reader that starts after this sees every record committed before the call,
    including the newest commits, whose markers the broker writes after answering the commit.
    Raises TimeoutError after ``timeout`` seconds. A topic that does not exist has nothing open.
    """
    admin = admin_client(kafka)
    deadline = time.monotonic() + timeout
    target: dict[Where, int] | None = None
    while True:
        try:
            metadata = admin.list_topics(topic, timeout=10).topics.get(topic)
            elected = None if metadata is None else metadata.error
            if elected is not None and is_retriable(elected):  # an election: not "no topic"
                raise KafkaException(elected)
            if metadata is None or metadata.error is not None or not metadata.partitions:
                return
            parts = [TopicPartition(topic, p) for p in metadata.partitions]
            if target is None:
                target = _ends(kafka, admin, parts, committed=False, deadline=deadline)
            stable = _ends(kafka, admin, parts, committed=True, deadline=deadline)
            if all(stable.get(p, -1) >= end for p, end in target.items()):
                return
            waiting = f"last stable offsets {stable}, ends {target}"
        except KafkaException as exc:
            error: KafkaError = exc.args[0]
            if not is_retriable(error):
                raise
            waiting = error.str()
            admin = admin_client(kafka)  # fresh metadata and leader epochs (see _ends)
        if time.monotonic() > deadline:
            raise KafkaTimeout(
                f"{topic}: transactions open on it did not end within {timeout:.0f}s ({waiting})"
            )
        time.sleep(0.1)


def _ends(
    kafka: KafkaSettings,
    admin: AdminClient,
    parts: list[TopicPartition],
    *,
    committed: bool,
    deadline: float,
) -> dict[Where, int]:
    """Each partition's end now: the last stable offset when ``committed``, else the high
    watermark. Retriable errors are retried until ``deadline``."""
    level = IsolationLevel.READ_COMMITTED if committed else IsolationLevel.READ_UNCOMMITTED
    given: AdminClient | None = admin

    def ask() -> dict[Where, int]:
        nonlocal given
        # A retry asks with a new client: librdkafka's admin client keeps the leader epoch it
        # cached, so after a leader moved it was answered FENCED_LEADER_EPOCH for 60 s (45
        # attempts) on a 2-broker cluster whose leaders moved (issue 29).
        client, given = (given if given is not None else admin_client(kafka)), None
        asked = {tp: OffsetSpec.latest() for tp in parts}  # type: ignore[no-untyped-call]
        answers = client.list_offsets(asked, isolation_level=level, request_timeout=10)
        return {(tp.topic, tp.partition): int(f.result().offset) for tp, f in answers.items()}

    return retry_retriable(ask, deadline, f"finding the ends of {parts[0].topic}")


class OffsetStore:
    """Reads the newest committed offset of every source partition."""

    def __init__(self, kafka: KafkaSettings) -> None:
        self._kafka = kafka

    def read_all(
        self, timeout: float = READ_TIMEOUT_S, *, settled: bool = False
    ) -> dict[bytes, dict[str, Any]]:
        """``{canonical partition json: offset dict}``; a tombstone removes the partition.

        A read_committed read ends at the last stable offset: records committed behind a
        transaction that is still open (another source's, on this one shared topic) are not
        seen, nor, for a moment, the newest commits (the broker writes a transaction's markers
        after it has answered the commit). ``settled`` first waits until every transaction open
        on the topic now has ended, as Kafka Connect reads its offsets topic at start-up
        (KIP-618), so that the result holds every offset committed before the call.
        """
        topic = self._kafka.topics.offsets
        started = time.monotonic()
        if settled:
            wait_transactions_settled(self._kafka, topic, timeout)
        settling = time.monotonic() - started
        consumer = Consumer(
            consumer_config(
                self._kafka,
                group_id=self._kafka.qualify("mailtap-offsets-reader"),
                enable_partition_eof=True,
                # The end is the fetch that finds nothing more: answered at once, not held
                # by the broker for fetch.wait.max.ms (500 ms) hoping for new records.
                fetch_wait_max_ms=10,
            )
        )
        offsets: dict[bytes, dict[str, Any]] = {}
        try:
            partitions = topic_partitions(consumer, self._kafka, topic, 10) or []
            # The end as of now (the last stable offset): a reader that waited for the end of
            # the stream instead chases it for as long as other mailboxes keep committing (one
            # partition, a commit per batch of every mailbox), and never sees its end-of-file.
            starts = [TopicPartition(topic, p, 0) for p in partitions]
            for msg in read_to_end(consumer, starts, timeout):
                key = msg.key()
                if key is None:
                    continue
                value = msg.value()
                if value is None:
                    offsets.pop(key, None)
                else:
                    offsets[key] = json.loads(value)
        finally:
            consumer.close()
        took = time.monotonic() - started
        if took > SLOW_READ_S:
            log.info(
                "reading %s took %.1fs (%.1fs waiting for open transactions to end, "
                "%d partitions' cursors)",
                topic,
                took,
                settling,
                len(offsets),
            )
        return offsets

    def read(self, partition: SourcePartition) -> dict[str, Any] | None:
        return self.read_all().get(canonical_json(partition))


Offsets = Mapping[bytes, Mapping[str, Any]]


class SharedReads:
    """One read of the offsets topic for the mailboxes that ask at about the same time.

    Every mailbox reads its cursor once its ``init_transactions`` has fenced its previous owner,
    and the read has to start *after* that. When many mailboxes start together (a start-up, a
    failover moving dozens), each reading the whole topic on its own costs N reads that all wait
    on the same broker. Here a caller joins the read that has not started yet (there is at most
    one waiting) and gets its result: a read that started after the caller asked, so it holds
    everything committed before the call, its own fenced predecessor's abort included. While a
    read runs, new callers gather for the next one. The result is shared: do not change it.

        reads = SharedReads(lambda: OffsetStore(kafka).read_all(settled=True))
        cursor = reads().get(key)
    """

    def __init__(self, read: Callable[[], Offsets]) -> None:
        self._read = read
        self._lock = threading.Lock()  # guards _next
        self._running = threading.Lock()  # held by the read in flight
        self._next: Future[Offsets] | None = None

    def __call__(self) -> Offsets:
        mine: Future[Offsets] = Future()
        with self._lock:
            joined = self._next
            if joined is None:
                self._next = mine
        if joined is not None:
            return joined.result()
        with self._running:
            with self._lock:
                self._next = None  # from here on, callers wait for a read that starts later
            try:
                mine.set_result(self._read())
            except BaseException as exc:  # every caller of this read sees its failure
                mine.set_exception(exc)
        return mine.result()
