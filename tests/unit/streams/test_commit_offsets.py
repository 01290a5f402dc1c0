"""The streams worker commits ``mail.events`` up to what it processed, across the offsets a
read_committed consumer never sees (the commit marker after each source transaction).

faust's own gap bookkeeping counted the record read after a gap twice, so each commit advanced
one transaction only: in a 60-minute soak the group's committed offset fell 400 s behind while
both workers were idle. These drive faust's bookkeeping the way its fetch loop does
(``faust/transport/consumer.py``: ``_add_gap`` when an offset is skipped, ``ack`` per processed
record, ``_new_offset`` per commit)."""

from __future__ import annotations

import asyncio
from collections import defaultdict
from typing import Any

from faust.transport.drivers.aiokafka import Consumer as FaustConsumer
from faust.types import TP
from intervaltree import IntervalTree

from streams.app import _ReadCommittedConsumer

TOPIC_PARTITION = TP("mail.events", 0)


def _bookkeeping(cls: type) -> Any:
    """A consumer with only the offset bookkeeping faust's __init__ sets up (no Kafka)."""
    consumer = object.__new__(cls)
    consumer._gap = defaultdict(IntervalTree)
    consumer._acked = defaultdict(list)
    consumer._acked_index = defaultdict(set)
    consumer._committed_offset = defaultdict(lambda: None)
    # Where the partition starts, as the settled generation's re-seek finds it (streams.seeks:
    # a partition never committed commits only from there).
    consumer.start_offsets = {TOPIC_PARTITION: 0}
    return consumer


def _read_and_ack(consumer: Any, offsets: list[int], last_read: int | None) -> None:
    """What faust's fetch loop and a stream do for each record: a gap before it is recorded,
    then the processed record is acked."""

    async def run() -> None:
        r_offset = last_read
        for offset in offsets:
            if r_offset is not None and offset - r_offset > 1:
                await consumer._add_gap(TOPIC_PARTITION, r_offset + 1, offset)
            r_offset = offset
            if offset not in consumer._acked_index[TOPIC_PARTITION]:
                consumer._acked_index[TOPIC_PARTITION].add(offset)
                consumer._acked[TOPIC_PARTITION].append(offset)

    asyncio.run(run())


def _commit(consumer: Any) -> int | None:
    new = consumer._new_offset(TOPIC_PARTITION)
    if new is not None:
        consumer._committed_offset[TOPIC_PARTITION] = new
    return new


# 10 transactions of 2 records each, a commit marker after each: records at 0,1, 3,4, 6,7, ...
RECORDS = [t * 3 + i for t in range(10) for i in range(2)]
END = 30  # the last marker is at 29


def test_one_commit_covers_every_record_processed_across_the_markers() -> None:
    consumer = _bookkeeping(_ReadCommittedConsumer)
    _read_and_ack(consumer, RECORDS, last_read=None)
    assert _commit(consumer) == RECORDS[-1] + 1


def test_faust_alone_advances_one_transaction_per_commit() -> None:
    """The fault the subclass mends: this is what the soak measured."""
    consumer = _bookkeeping(FaustConsumer)
    _read_and_ack(consumer, RECORDS, last_read=None)
    # 0, 1, marker 2 and 3, which the gap before it listed a second time: the duplicate ends the run
    assert _commit(consumer) == 4
    assert _commit(consumer) == 7  # one more transaction per commit


def test_commits_keep_up_batch_after_batch() -> None:
    consumer = _bookkeeping(_ReadCommittedConsumer)
    last = None
    for start in range(0, len(RECORDS), 4):
        batch = RECORDS[start : start + 4]
        _read_and_ack(consumer, batch, last_read=last)
        last = batch[-1]
        assert _commit(consumer) == batch[-1] + 1


def test_a_record_not_processed_yet_holds_the_commit_back() -> None:
    consumer = _bookkeeping(_ReadCommittedConsumer)
    # 4 is read but still being processed: not acked
    asyncio.run(consumer._add_gap(TOPIC_PARTITION, 2, 3))
    for offset in (0, 1, 3, 6):
        consumer._acked_index[TOPIC_PARTITION].add(offset)
        consumer._acked[TOPIC_PARTITION].append(offset)
    asyncio.run(consumer._add_gap(TOPIC_PARTITION, 5, 6))
    assert _commit(consumer) == 4
