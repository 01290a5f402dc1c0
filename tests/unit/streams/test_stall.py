"""streams.stall: a stream partition faust stops delivering is seeked again, once per stall;
a transactional topic's end past its last record (markers, aborted records) is accepted."""

from __future__ import annotations

import logging
from typing import Any

import pytest
from aiokafka import TopicPartition as TP

from streams.stall import StallGuard

EVENTS = TP("mail.events", 2)
CONVERSATIONS = TP("app-mail-events-by-conversation", 1)


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


class FakeConsumer:
    """faust's consumer as the guard uses it: ends, positions, resume and seek_wait."""

    def __init__(self, ends: dict[TP, int], positions: dict[TP, int] | None = None) -> None:
        self.ends = ends
        self.positions = positions or {}
        self.resumed: list[TP] = []
        self.seeks: list[dict[TP, int]] = []
        self._paused_partitions = {CONVERSATIONS}

    def highwater(self, tp: TP) -> int | None:
        return self.ends.get(tp)

    async def position(self, tp: TP) -> int | None:
        return self.positions.get(tp)

    def resume_partitions(self, tps: Any) -> None:
        self.resumed.extend(tps)

    async def seek_wait(self, partitions: dict[TP, int]) -> None:
        self.seeks.append(dict(partitions))


async def test_a_partition_with_records_and_no_delivery_is_seeked_again(
    caplog: pytest.LogCaptureFixture,
) -> None:
    clock = Clock()
    guard = StallGuard(stall_s=30, clock=clock)
    guard.expect({CONVERSATIONS: 1})
    consumer = FakeConsumer({CONVERSATIONS: 2})  # the record at offset 1 waits
    clock.now += 29
    assert await guard.check(consumer) == {}  # not yet
    clock.now += 1
    with caplog.at_level(logging.WARNING, "streams.stall"):
        assert await guard.check(consumer) == {CONVERSATIONS: 1}
    assert consumer.resumed == [CONVERSATIONS] and consumer.seeks == [{CONVERSATIONS: 1}]
    (line,) = caplog.messages
    assert "stalled" in line and "offset 1" in line and "paused=True" in line
    clock.now += 10
    assert await guard.check(consumer) == {}  # the seek gets its own stall_s to deliver
    guard.delivered(CONVERSATIONS, 1)  # it did
    clock.now += 60
    assert await guard.check(consumer) == {}  # caught up: the end is the next offset
    assert len(consumer.seeks) == 1


async def test_deliveries_keep_a_busy_partition_from_being_seeked() -> None:
    clock = Clock()
    guard = StallGuard(stall_s=30, clock=clock)
    guard.expect({CONVERSATIONS: 0})
    consumer = FakeConsumer({CONVERSATIONS: 1000})
    for offset in range(10):
        clock.now += 20
        guard.delivered(CONVERSATIONS, offset)
        assert await guard.check(consumer) == {}
    clock.now += 30
    assert await guard.check(consumer) == {CONVERSATIONS: 10}  # then nothing for 30 s


async def test_a_partition_stalled_again_is_seeked_again() -> None:
    clock = Clock()
    guard = StallGuard(stall_s=30, clock=clock)
    guard.expect({CONVERSATIONS: 5})
    consumer = FakeConsumer({CONVERSATIONS: 6}, positions={CONVERSATIONS: 6})
    clock.now += 30
    await guard.check(consumer)
    clock.now += 30  # the seek delivered nothing: a non-transactional topic has no markers
    assert await guard.check(consumer) == {CONVERSATIONS: 5}
    assert consumer.seeks == [{CONVERSATIONS: 5}, {CONVERSATIONS: 5}]


async def test_a_transactional_end_past_the_last_record_is_taken_as_the_next_offset() -> None:
    clock = Clock()
    guard = StallGuard(stall_s=30, clock=clock)
    guard.expect({EVENTS: 4})
    # Offset 4 is a commit marker (or aborted records): the end is 5, the consumer read it.
    consumer = FakeConsumer({EVENTS: 5}, positions={EVENTS: 5})
    clock.now += 30
    assert await guard.check(consumer, transactional=["mail.events"]) == {}
    consumer.ends[EVENTS] = 7  # a new transaction: one record and its marker
    consumer.positions[EVENTS] = 7
    guard.delivered(EVENTS, 5)
    clock.now += 300
    assert await guard.check(consumer, transactional=["mail.events"]) == {}
    assert consumer.seeks == []
    # A record aiokafka holds back: the position stays behind the end.
    consumer.ends[EVENTS] = 9
    clock.now += 30
    assert await guard.check(consumer, transactional=["mail.events"]) == {EVENTS: 7}
    assert consumer.seeks == [{EVENTS: 7}]


async def test_only_the_settled_generation_is_watched() -> None:
    clock = Clock()
    guard = StallGuard(stall_s=30, clock=clock)
    consumer = FakeConsumer({CONVERSATIONS: 9})
    guard.delivered(CONVERSATIONS, 3)  # nothing expected yet: ignored
    clock.now += 60
    assert await guard.check(consumer) == {}
    guard.expect({CONVERSATIONS: 9})
    guard.forget()  # a rebalance began
    clock.now += 60
    assert await guard.check(consumer) == {}


def test_given_from_says_whether_a_generation_was_delivered_from_an_offset_on() -> None:
    guard = StallGuard()
    assert not guard.given_from(CONVERSATIONS, 3, 0)  # nothing given: maybe skipped
    guard.delivered(CONVERSATIONS, 4, generation=2)
    guard.delivered(CONVERSATIONS, 5, generation=3)  # the first of generation 3
    guard.delivered(CONVERSATIONS, 6, generation=3)
    assert guard.given_from(CONVERSATIONS, 3, 5)
    assert guard.given_from(CONVERSATIONS, 3, 6)  # began before: nothing skipped from 6 on
    assert not guard.given_from(CONVERSATIONS, 3, 4)  # 4 may have been fetched and dropped
    assert not guard.given_from(CONVERSATIONS, 4, 5)  # another generation's deliveries
    assert not guard.given_from(EVENTS, 3, 0)


async def test_a_partition_read_past_the_target_is_watched_from_its_last_delivery() -> None:
    clock = Clock()
    guard = StallGuard(stall_s=30, clock=clock)
    for offset in range(10):
        guard.delivered(CONVERSATIONS, offset, generation=3)
    guard.expect({CONVERSATIONS: 0}, generation=3)
    consumer = FakeConsumer({CONVERSATIONS: 10})  # all of it handled: nothing to seek
    clock.now += 60
    assert await guard.check(consumer) == {}
    consumer.ends[CONVERSATIONS] = 11
    clock.now += 30
    assert await guard.check(consumer) == {CONVERSATIONS: 10}


def test_a_record_given_again_in_its_generation_is_not_fresh() -> None:
    # The re-seek of a settled generation goes back to the committed offset: what came since
    # the rebalance comes again, and only the records the generation skipped are new.
    guard = StallGuard()
    assert [guard.delivered(CONVERSATIONS, o, generation=2) for o in (5, 6, 7)] == [True] * 3
    # re-seeked to 3: 3 and 4 were skipped, 5 to 7 were handled, 8 is new
    again = [guard.delivered(CONVERSATIONS, o, generation=2) for o in range(3, 9)]
    assert again == [True, True, False, False, False, True]
    assert guard.given_from(CONVERSATIONS, 2, 5)
    # the next generation starts afresh: everything it is given is new to it
    assert guard.delivered(CONVERSATIONS, 6, generation=3)
    assert guard.delivered(CONVERSATIONS, 7, generation=3)
