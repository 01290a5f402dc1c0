"""streams.seeks: the records of a batch fetched before a seek of their partition are not handed
on after it, and the read offset the record in the agents' hands moved on goes back to the
seek's offset (else faust took the rest for a gap, committed past it, and dropped the records
fetched again: 586 mails per partition never handled in ``bench streams --workers 2``)."""

from __future__ import annotations

import asyncio
from collections import defaultdict
from collections.abc import AsyncIterator
from types import SimpleNamespace
from typing import Any, NamedTuple

import pytest
from aiokafka import TopicPartition as TP
from aiokafka.errors import KafkaTimeoutError
from faust.types.tuples import ConsumerMessage
from intervaltree import IntervalTree

from streams.seeks import SeekAwareConsumer, SeekAwareThread, fresh_records

KEPT = TP("app-mail-events-by-conversation", 3)
OTHER = TP("app-mail-events-by-conversation", 1)


def thread() -> SeekAwareThread:
    t = object.__new__(SeekAwareThread)  # its numbering only: no faust service behind it
    t.seeks, t.seeked_at, t.seek_offsets, t.fetched_after = 0, {}, {}, 0
    t.awaiting_first = {}
    return t


class Message(NamedTuple):
    offset: int


async def source(records: list[tuple[TP, int]]) -> AsyncIterator[tuple[TP, Message]]:
    for tp, offset in records:
        yield tp, Message(offset)


def drain(
    t: SeekAwareThread,
    records: list[tuple[TP, int]],
    read_offset: dict[TP, int],
    seek_during: tuple[TP, int] | None = None,
    seek: tuple[TP, int] = (KEPT, 82),
    gaps: list[tuple[TP, int, int]] | None = None,
) -> list[tuple[TP, int]]:
    """faust's _drain_messages over one batch: each record handed to the agents, the read offset
    set to it afterwards; ``seek`` made (as perform_seek makes it) while ``seek_during`` is in
    the agents' hands. ``gaps``: what ``no_records`` was told."""

    told = [] if gaps is None else gaps

    def no_records(tp: TP, offset: int, first: int) -> None:
        told.append((tp, offset, first))

    async def run() -> list[tuple[TP, int]]:
        handed = []
        async for tp, message in fresh_records(source(records), t, read_offset, no_records):
            offset = message.offset
            handed.append((tp, offset))
            if (tp, offset) == seek_during:
                t.mark_seeks([seek])
                read_offset[seek[0]] = seek[1]
            read_offset[tp] = offset
        return handed

    return asyncio.run(run())


def interleaved(kept: range, other: range) -> list[tuple[TP, int]]:
    out: list[tuple[TP, int]] = []
    for a, b in zip(kept, other, strict=False):
        out += [(KEPT, a), (OTHER, b)]
    return out


def test_a_seek_while_a_batch_is_handed_on_stops_the_batch_for_that_partition() -> None:
    t, read_offset = thread(), {}
    batch = interleaved(range(83, 700), range(10, 627))
    handed = drain(t, batch, read_offset, seek_during=(KEPT, 674))
    kept = [o for tp, o in handed if tp == KEPT]
    assert kept == list(range(83, 675))  # 675 on: fetched again from 82 by aiokafka
    assert [o for tp, o in handed if tp == OTHER] == list(range(10, 627))
    # faust set it to 674 after the record in hand; back to 82, or 83-673 fetched again
    # would be below it and dropped
    assert read_offset[KEPT] == 82


def test_the_last_record_of_the_batch_in_hand_during_the_seek() -> None:
    t, read_offset = thread(), {}
    drain(t, [(KEPT, 5), (KEPT, 6)], read_offset, seek_during=(KEPT, 6), seek=(KEPT, 2))
    assert read_offset[KEPT] == 2


def test_a_seek_to_the_beginning_leaves_no_read_offset() -> None:
    t, read_offset = thread(), {}
    drain(t, [(KEPT, 5), (KEPT, 6)], read_offset, seek_during=(KEPT, 5), seek=(KEPT, 0))
    assert KEPT not in read_offset


def test_a_batch_fetched_after_the_seek_is_handed_on_whole() -> None:
    t = thread()
    t.mark_seeks([(KEPT, 82)])
    t.fetched_after = t.seeks  # the fetch came after the seek in the consumer's thread
    records = [(KEPT, o) for o in range(82, 90)]
    assert drain(t, records, {}) == records


def test_a_seek_of_another_partition_drops_nothing_of_this_one() -> None:
    t, read_offset = thread(), {}
    records = [(KEPT, o) for o in range(0, 10)]
    handed = drain(t, records, read_offset, seek_during=(KEPT, 3), seek=(OTHER, 7))
    assert handed == records
    assert read_offset[KEPT] == 9


class FakeAiokafka:
    """aiokafka's consumer as the committed-offset seek uses it; a rebalance takes ``lost``
    away while the committed offsets are read."""

    def __init__(self, committed: dict[TP, int | None], lost: TP | None = None) -> None:
        self._committed, self._lost = committed, lost
        self._assigned = set(committed)
        self.sought: dict[TP, int] = {}
        self._fetcher = self

    def assignment(self) -> set[TP]:
        return set(self._assigned)

    async def committed(self, tp: TP) -> int | None:
        await asyncio.sleep(0)
        if self._lost is not None:
            self._assigned.discard(self._lost)
        return self._committed[tp]

    def seek_to(self, tp: TP, offset: int) -> None:
        self.sought[tp] = offset

    async def beginning_offsets(self, tps: list[TP]) -> dict[TP, int]:
        return {tp: 3 for tp in tps}


def test_the_committed_offset_seek_also_seeks_what_aiokafka_leaves_out() -> None:
    """aiokafka's seek_to_committed seeks no partition without a committed offset (or at 0),
    and faust discards what it fetched during a recovery: those records never came until the
    settled generation's re-seek."""
    empty, never = TP("mail.events", 0), TP("mail.events", 5)
    changelog = TP("app-state-changelog", 5)  # faust's recovery reads those itself
    consumer = FakeAiokafka(
        {KEPT: 82, OTHER: 40, empty: 0, never: None, changelog: None}, lost=OTHER
    )
    t = thread()
    t._ensure_consumer = lambda: consumer  # type: ignore[method-assign]
    t.consumer = SimpleNamespace(  # type: ignore[assignment]
        app=SimpleNamespace(topics=SimpleNamespace(acks_enabled_for=lambda n: "log" not in n))
    )
    committed: Any = asyncio.run(t._seek_to_committed())
    assert committed == {KEPT: 82, OTHER: 40, empty: 0, never: None, changelog: None}
    # OTHER was revoked meanwhile (aiokafka raises on its seek)
    assert consumer.sought == {KEPT: 82, empty: 3, never: 3}
    assert t.seeks == 1 and set(t.seeked_at) == {KEPT, empty, never}
    assert t.seek_offsets == {KEPT: 82, empty: 3, never: 3}
    assert t.first_offsets == {empty: 3, never: 3}


class Commits(SeekAwareConsumer):
    """The consumer's commit bookkeeping alone (faust's state for it, no service)."""

    def __init__(self) -> None:
        self._acked = defaultdict(list)
        self._acked_index = defaultdict(set)
        self._gap = defaultdict(IntervalTree)
        self._committed_offset = defaultdict(lambda: None)
        self.start_offsets = {}

    def ack_all(self, tp: TP, offsets: range) -> None:
        self._acked[tp].extend(offsets)
        self._acked_index[tp].update(offsets)


def test_a_partition_never_committed_commits_only_from_where_it_starts() -> None:
    """bench streams --workers 3: records 0-701 of a conversation partition were fetched and
    discarded during a recovery, 702 on were given and acknowledged; faust, with no committed
    offset to compare, committed 702 on and 0-701 were never handled."""
    c = Commits()
    c.ack_all(KEPT, range(702, 800))
    assert c._new_offset(KEPT) is None  # where it starts is not known yet
    c.start_offsets[KEPT] = 0  # the settled generation's re-seek: the earliest offset
    assert c._new_offset(KEPT) is None  # 0-701 were not acknowledged
    c.ack_all(KEPT, range(0, 702))
    assert c._new_offset(KEPT) == 800


def test_a_commit_at_zero_is_a_floor_too() -> None:
    c = Commits()
    c._committed_offset[KEPT] = 0  # faust skips its check for a committed offset of 0
    c.start_offsets[KEPT] = 0
    c.ack_all(KEPT, range(5, 9))
    assert c._new_offset(KEPT) is None
    c.ack_all(KEPT, range(0, 5))
    assert c._new_offset(KEPT) == 9


def test_a_transaction_marker_or_a_gap_at_the_floor_still_commits() -> None:
    c = Commits()
    c._committed_offset[KEPT] = 40  # offset 40 is a commit marker
    c.ack_all(KEPT, range(41, 45))
    assert c._new_offset(KEPT) == 45
    c._committed_offset[KEPT] = 45
    c._gap[KEPT].addi(45, 50)  # aborted records 45-49, read past by the consumer
    c.ack_all(KEPT, range(50, 52))
    assert c._new_offset(KEPT) == 52


NEW = TP("mail.events", 4)


class Seeking(Commits):
    """faust's seek to the committed offsets, which found two stream partitions without a
    committed offset (:class:`SeekAwareThread` sought them to their first offsets)."""

    def __init__(self) -> None:
        super().__init__()
        self._read_offset = defaultdict(lambda: None)
        self.committed = {KEPT: 40, OTHER: 0, NEW: None}
        self._thread = thread()

    def assignment(self) -> set[TP]:
        return set(self.committed) - {LOST}

    async def seek_to_committed(self) -> dict[TP, int | None]:
        self._thread.first_offsets = {OTHER: 7, NEW: 7, LOST: 7}
        return dict(self.committed)


LOST = TP("mail.events", 5)  # revoked by a rebalance during the seek


def test_a_partition_without_a_committed_offset_commits_from_its_first_offset() -> None:
    c = Seeking()
    asyncio.run(c.perform_seek())
    assert c.start_offsets == {OTHER: 7, NEW: 7}
    c.ack_all(NEW, range(7, 12))
    assert c._new_offset(NEW) == 12
    c.ack_all(OTHER, range(9, 12))  # 7 and 8 not handed over: no commit over them
    assert c._new_offset(OTHER) is None


def test_the_first_record_after_a_seek_says_what_holds_no_record() -> None:
    """A partition whose first records were compacted away (or aborted): sought to its first
    offset 0, the first record fetched is 11. faust records no gap from a read offset of 0 or
    none, so the partition never committed (its floor, 0, stayed short of the run from 11)."""
    t, gaps = thread(), []
    t.mark_seeks([(KEPT, 0), (OTHER, 5)])
    t.fetched_after = t.seeks
    drain(t, [(KEPT, 11), (OTHER, 5), (KEPT, 12), (OTHER, 6)], {}, gaps=gaps)
    assert gaps == [(KEPT, 0, 11)]  # OTHER's first record is at its offset: nothing to say
    drain(t, [(KEPT, 20)], {}, gaps=gaps)  # only the first record after a seek tells
    assert gaps == [(KEPT, 0, 11)]


def test_a_partition_whose_first_records_are_gone_commits() -> None:
    c = Seeking()
    c._thread.awaiting_first = {NEW: 7}
    c.app = SimpleNamespace(topics=SimpleNamespace(acks_enabled_for=lambda topic: True))
    c.start_offsets[NEW] = 7
    c.ack_all(NEW, range(19, 25))
    assert c._new_offset(NEW) is None  # 7-18: not known to hold no record yet
    c._no_records(NEW, 7, 19)
    assert c._new_offset(NEW) == 25


def test_first_offsets_not_read_leave_those_partitions_to_the_settled_re_seek(
    caplog: pytest.LogCaptureFixture,
) -> None:
    class Unanswered(FakeAiokafka):
        async def beginning_offsets(self, tps: list[TP]) -> dict[TP, int]:
            raise KafkaTimeoutError()

    never = TP("mail.events", 5)
    consumer = Unanswered({KEPT: 82, never: None})
    t = thread()
    t._ensure_consumer = lambda: consumer  # type: ignore[method-assign]
    t.consumer = SimpleNamespace(  # type: ignore[assignment]
        app=SimpleNamespace(topics=SimpleNamespace(acks_enabled_for=lambda n: True))
    )
    committed: Any = asyncio.run(t._seek_to_committed())  # a broker slow to answer: no crash
    assert committed == {KEPT: 82, never: None}
    assert consumer.sought == {KEPT: 82} and t.first_offsets == {}
    assert "first offsets of 1 stream partitions not read" in caplog.text


class Committing(Commits):
    """faust's ``commit`` over :class:`Commits`; its offsets are taken before the commit
    barrier (``barrier``: the outputs' acknowledgements), as faust takes them."""

    def __init__(self) -> None:
        super().__init__()
        self.app = SimpleNamespace(client_only=False)
        self._commit_fut = None
        self.commits: list[int] = []
        self.barrier: asyncio.Future[None] | None = None

    async def force_commit(self, topics: Any = None, start_new_transaction: bool = True) -> bool:
        offset = self._new_offset(KEPT)
        if self.barrier is not None:
            await self.barrier
        if offset is None:
            return False
        self.commits.append(offset)
        self._committed_offset[KEPT] = offset
        return True


@pytest.mark.parametrize("commit_now", [True, False])
def test_a_commit_at_a_rebalance_also_commits_what_a_commit_under_way_left(
    commit_now: bool,
) -> None:
    """bench streams --workers 2: the revocation's commit met the periodic one, which had taken
    its offsets before awaiting the barrier; faust's ``commit`` only waited for it, and the
    next owner handled again the ~380 records per partition acknowledged meanwhile."""

    async def run() -> list[int]:
        c = Committing()
        c.loop = asyncio.get_running_loop()
        c._committed_offset[KEPT] = 100
        c.ack_all(KEPT, range(100, 110))
        c.barrier = asyncio.get_running_loop().create_future()
        periodic = asyncio.create_task(c.commit())
        await asyncio.sleep(0)  # it took 110 and awaits the barrier
        c.ack_all(KEPT, range(110, 150))  # the agents went on meanwhile
        revoking = asyncio.create_task(c.commit_now() if commit_now else c.commit())
        await asyncio.sleep(0)
        c.barrier.set_result(None)
        c.barrier = None
        await asyncio.gather(periodic, revoking)
        return c.commits

    assert asyncio.run(run()) == ([110, 150] if commit_now else [110])


def test_a_record_no_agent_was_given_is_not_acknowledged() -> None:
    """faust's pure-Python stream loop acknowledges a record it skips (fetched in an older
    generation, or while flow control was off) before tracking it: no agent handled it, and
    acknowledged, a commit could go past it."""
    c = Commits()
    c.app = SimpleNamespace(topics=SimpleNamespace(acks_enabled_for=lambda topic: True))
    c._unacked_messages = set()
    c._waiting_for_ack = None
    c._n_acked = 0
    skipped = ConsumerMessage(KEPT.topic, KEPT.partition, 7, 0.0, 0, None, b"k", b"v", None)
    given = ConsumerMessage(KEPT.topic, KEPT.partition, 8, 0.0, 0, None, b"k", b"v", None)
    given.tracked = True  # what the stream loop sets when an agent gets the record
    assert skipped.tracked is False
    assert c.ack(skipped) is False
    assert c.ack(given) is True
    assert c._acked[KEPT] == [8]
