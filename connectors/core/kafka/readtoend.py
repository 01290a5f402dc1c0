"""Reading a topic to its end: every record written before the read started, then stop.

"The end" is each partition's end *as of the start of the read*: the high watermark, or for a
read_committed reader the last stable offset (where the first transaction still open begins;
records behind it are not readable yet). The read of a partition is over when the consumer's
position reaches that end — the position skips transaction markers, which the offset of the
last record does not — or at its end-of-partition event. Waiting for the end of the stream
instead never finishes on a topic others keep writing to (the offsets topic that every mailbox
commits to, a busy events topic), and the end-of-partition event alone comes only one fetch
after the last record, which a consumer with the default ``fetch.wait.max.ms`` waits 500 ms for.

Finding the ends and reading both ride out what a healthy cluster answers for a moment (a topic
created a moment ago without a leader yet, a moved leader, a slow request: see
:mod:`connectors.core.kafka.retry`); the whole read is bounded by a timeout that ends with
:class:`KafkaTimeout` naming the topics, and a stop request of the process ends it at once.

    consumer = Consumer(consumer_config(kafka, "mailtap-x", fetch_wait_max_ms=10))
    try:
        for msg in read_to_end(consumer, kafka, [TopicPartition(topic, 0, 0)], timeout=30):
            take(msg.key(), msg.value())
    finally:
        consumer.close()
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence

from confluent_kafka import (
    OFFSET_BEGINNING,
    Consumer,
    IsolationLevel,
    KafkaError,
    Message,
    TopicPartition,
)
from confluent_kafka.admin import (  # type: ignore[attr-defined]  # re-exported, no __all__
    AdminClient,
    OffsetSpec,
)

from connectors.core.config import KafkaSettings
from connectors.core.kafka.clients import admin_client, cluster_metadata, raise_if_stopping
from connectors.core.kafka.errors import KafkaTimeout, TopicReadError
from connectors.core.kafka.retry import is_retriable, retry_retriable

log = logging.getLogger(__name__)

#: ``(topic, partition)``
Where = tuple[str, int]

#: Records asked for per ``consume`` call: the batch a caller's loop body sees at a time.
BATCH = 1000
#: Longest a ``consume`` call waits when nothing comes: a stop request and the deadline are
#: checked at least this often.
WAIT_S = 0.1
#: One ListOffsets request's own timeout; a request that times out is asked again until the
#: read's deadline.
LIST_OFFSETS_TIMEOUT_S = 10.0


def partition_ends(
    kafka: KafkaSettings,
    partitions: Iterable[TopicPartition],
    *,
    committed: bool,
    deadline: float,
    admin: AdminClient | None = None,
) -> dict[Where, int]:
    """Each partition's end now: the last stable offset when ``committed`` (what a read_committed
    reader can reach), else the high watermark. Retriable errors are retried until ``deadline``."""
    parts = [TopicPartition(tp.topic, tp.partition) for tp in partitions]
    if not parts:
        return {}
    given = admin
    level = IsolationLevel.READ_COMMITTED if committed else IsolationLevel.READ_UNCOMMITTED
    topics = ", ".join(sorted({tp.topic for tp in parts}))

    def ask() -> dict[Where, int]:
        nonlocal given
        # A retry asks with a new client: librdkafka's admin client keeps the leader epoch it
        # cached, so after a leader moved it was answered FENCED_LEADER_EPOCH for 60 s (45
        # attempts) on a 2-broker cluster whose leaders moved (issue 29).
        client, given = (given if given is not None else admin_client(kafka)), None
        asked = {tp: OffsetSpec.latest() for tp in parts}  # type: ignore[no-untyped-call]
        answers = client.list_offsets(
            asked, isolation_level=level, request_timeout=LIST_OFFSETS_TIMEOUT_S
        )
        return {(tp.topic, tp.partition): f.result().offset for tp, f in answers.items()}

    return retry_retriable(ask, deadline, f"finding the end of {topics}")


def topic_partitions(
    client: Consumer, kafka: KafkaSettings, topic: str, timeout: float
) -> list[int] | None:
    """The partitions of ``topic``, or None when it does not exist. A topic whose metadata
    carries another error (no leader elected yet, a moment after its creation) is asked again
    until ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        found = cluster_metadata(client, kafka, timeout, topic).topics.get(topic)
        error = None if found is None else found.error
        if found is None or (
            error is not None and error.code() == KafkaError.UNKNOWN_TOPIC_OR_PART
        ):
            return None
        if error is None and found.partitions:
            return sorted(found.partitions)
        if time.monotonic() + WAIT_S > deadline:
            raise KafkaTimeout(f"topic {topic} has no usable metadata yet ({error})")
        raise_if_stopping()
        time.sleep(WAIT_S)


def unread(start: int, end: int) -> bool:
    """Whether a partition read from ``start`` has records before ``end``.

    ``start`` may be logical: OFFSET_BEGINNING reads whatever the partition holds; OFFSET_END
    (also what ``offsets_for_times`` answers for "nothing that recent") reads nothing; a stored
    or invalid offset is resolved by the consumer, so only the end-of-partition event can tell.
    """
    if end <= 0:
        return False
    if start >= 0:
        return start < end
    return start == OFFSET_BEGINNING or start < -1


def still_short(
    positions: Iterable[TopicPartition], ends: Mapping[Where, int], pending: set[Where]
) -> set[Where]:
    """The ``pending`` partitions whose position has not reached their end yet (an unknown
    position, negative, has not)."""
    reached = {
        (tp.topic, tp.partition)
        for tp in positions
        if tp.offset >= 0 and tp.offset >= ends[(tp.topic, tp.partition)]
    }
    return pending - reached


def read_to_end(
    consumer: Consumer,
    kafka: KafkaSettings,
    starts: Sequence[TopicPartition],
    timeout: float,
    *,
    committed: bool = True,
) -> Iterator[Message]:
    """Assign ``starts`` (partitions with their start offsets) to ``consumer`` and yield every
    record from there up to each partition's end as found when the iteration starts.

    ``committed`` must match the consumer's ``isolation.level`` (read_committed, the default of
    ``consumer_config``). The position alone ends the read; with ``enable.partition.eof`` the
    end-of-partition event ends it too (for a start offset the consumer resolves, such as a
    stored one, the position says nothing before the first fetch). Records past an end that
    arrive in the same fetch are yielded too (the position is past them: dropping them would
    lose them for a caller that goes on consuming). The consumer stays assigned afterwards.
    Raises :class:`KafkaTimeout` when the end is not reached within ``timeout`` seconds,
    :class:`TopicReadError` on an error a retry cannot cure.
    """
    for batch in read_batches_to_end(consumer, kafka, starts, timeout, committed=committed):
        yield from batch


def read_batches_to_end(
    consumer: Consumer,
    kafka: KafkaSettings,
    starts: Sequence[TopicPartition],
    timeout: float,
    *,
    committed: bool = True,
) -> Iterator[list[Message]]:
    """:func:`read_to_end`, the records in the batches they were fetched in (up to
    :data:`BATCH`, never empty), for a caller that stores them a batch at a time."""
    deadline = time.monotonic() + timeout
    topics = ", ".join(sorted({tp.topic for tp in starts}))
    ends = partition_ends(kafka, starts, committed=committed, deadline=deadline)
    pending = {
        (tp.topic, tp.partition)
        for tp in starts
        if unread(tp.offset, ends[(tp.topic, tp.partition)])
    }
    consumer.assign(list(starts))
    while pending:
        raise_if_stopping()
        if time.monotonic() > deadline:
            raise KafkaTimeout(
                f"reading {topics} did not reach its end within {timeout:.0f}s "
                f"({len(pending)} partitions short of it)"
            )
        records = []
        for msg in consumer.consume(BATCH, WAIT_S):
            error = msg.error()
            if error is None:
                records.append(msg)
            elif error.code() == KafkaError._PARTITION_EOF:
                pending.discard((str(msg.topic()), msg.partition() or 0))
            elif is_retriable(error):
                log.debug("reading %s: %s; the consumer retries", topics, error.str())
            else:
                raise TopicReadError(f"reading {topics}: {error.str()}")
        if records:
            yield records
        if pending:
            positions = consumer.position([TopicPartition(t, p) for t, p in pending])
            pending = still_short(positions, ends, pending)
