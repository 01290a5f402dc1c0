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
        self._committed_offset: dict[TP, int] = {}

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


async def test_a_commit_stuck_behind_records_handed_over_after_it_is_seeked_to(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Records 83-674 never reached the agents (faust dropped them), 675 on did: faust's commit
    stays at 83 for good while deliveries go on, so the stall by deliveries never shows."""
    clock = Clock()
    guard = StallGuard(stall_s=30, clock=clock)
    guard.expect({CONVERSATIONS: 83}, generation=2)
    consumer = FakeConsumer({CONVERSATIONS: 2000})
    consumer._committed_offset[CONVERSATIONS] = 83
    for offset in range(675, 705):
        guard.delivered(CONVERSATIONS, offset, 2)
        clock.now += 1
        assert await guard.check(consumer) == {}  # delivered within the second
    for offset in range(705, 720):  # 30 s since the commit was last seen to move
        guard.delivered(CONVERSATIONS, offset, 2)
    clock.now += 1
    with caplog.at_level(logging.WARNING, "streams.stall"):
        assert await guard.check(consumer) == {CONVERSATIONS: 83}
    assert consumer.seeks == [{CONVERSATIONS: 83}]
    (line,) = caplog.messages
    assert "its commit stayed behind records handed over after it" in line
    assert "offset 83" in line
    guard.delivered(CONVERSATIONS, 83, 2)  # the seek handed it over, and the commit moves on
    consumer._committed_offset[CONVERSATIONS] = 720
    consumer.ends[CONVERSATIONS] = 720  # and nothing waits
    clock.now += 60
    assert await guard.check(consumer) == {}


async def test_a_commit_waiting_for_a_slow_record_or_moving_on_is_not_stuck() -> None:
    clock = Clock()
    guard = StallGuard(stall_s=30, clock=clock)
    guard.expect({CONVERSATIONS: 10}, generation=2)
    consumer = FakeConsumer({CONVERSATIONS: 11})
    consumer._committed_offset[CONVERSATIONS] = 10
    guard.delivered(CONVERSATIONS, 10, 2)  # in the agent's hands for minutes (registry away)
    for _ in range(10):
        clock.now += 20
        assert await guard.check(consumer) == {}
    consumer.ends[CONVERSATIONS] = 50
    for offset in range(11, 40):  # a busy partition: the commit follows the deliveries
        guard.delivered(CONVERSATIONS, offset, 2)
        consumer._committed_offset[CONVERSATIONS] = offset - 3
        clock.now += 20
        assert await guard.check(consumer) == {}
    # records given in an older generation say nothing of this one's commit
    guard.expect({CONVERSATIONS: 36}, generation=3)
    consumer._committed_offset[CONVERSATIONS] = 36
    clock.now += 120
    consumer.ends[CONVERSATIONS] = 36
    assert await guard.check(consumer) == {}
    assert consumer.seeks == []


def given(guard: StallGuard, offsets: list[int] | range, generation: int = 2) -> list[bool]:
    return [guard.delivered(CONVERSATIONS, o, generation=generation) for o in offsets]


def test_a_record_in_a_hole_of_what_was_given_is_fresh_when_it_comes() -> None:
    """bench streams --workers 3: faust dropped records 4-9 on their way to the agents, gave
    10-20; the stall guard's seek to the committed 4 brought 4-20 again. 4-9 were skipped as
    given (first <= offset <= last) and committed past: never answered."""
    guard = StallGuard()
    assert all(given(guard, [*range(0, 4), *range(10, 21)]))
    assert not guard.given_from(CONVERSATIONS, 2, 4)  # a hole after 4: re-seek it
    assert given(guard, range(4, 22)) == [True] * 6 + [False] * 11 + [True]
    assert guard.given_from(CONVERSATIONS, 2, 0)  # all of 0-21 now


def test_transaction_markers_make_a_partition_re_seeked_and_recognised() -> None:
    guard = StallGuard()
    records = [0, 1, 3, 4, 6, 7]  # a commit marker at 2 and at 5: never given
    assert all(given(guard, records))
    assert not guard.given_from(CONVERSATIONS, 2, 0)
    assert given(guard, records) == [False] * 6  # the re-seek's second delivery: not again
    assert guard.given_from(CONVERSATIONS, 2, 6)


def test_what_is_kept_stops_growing_when_the_generation_settles() -> None:
    guard = StallGuard()
    assert all(given(guard, [0, 1, 3, 4, 8]))  # holes at 2, 5-7 before the settle
    guard.expect({CONVERSATIONS: 0}, generation=2)
    runs = guard._given[CONVERSATIONS].runs
    assert runs == [[0, 1], [3, 4], [8, 8]]
    # months of transactions: one marker each, nothing more is kept
    assert all(given(guard, [o for o in range(9, 30_000) if o % 3]))
    assert runs == [[0, 1], [3, 4], [8, 8]]
    assert given(guard, [6, 5, 7, 2]) == [True] * 4  # a seek brings the holes: handled
    assert runs == [[0, 8]]
    assert given(guard, [5, 100]) == [False, True]  # 100: not kept, handled again to be safe
    assert guard._watched[CONVERSATIONS].next_offset == 29_999 + 1
