"""streams.seeks: the records of a batch fetched before a seek of their partition are not handed
on after it, and the read offset the record in the agents' hands moved on goes back to the
seek's offset (else faust took the rest for a gap, committed past it, and dropped the records
fetched again: 586 mails per partition never handled in ``bench streams --workers 2``)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

from aiokafka import TopicPartition as TP

from streams.seeks import SeekAwareThread, fresh_records

KEPT = TP("app-mail-events-by-conversation", 3)
OTHER = TP("app-mail-events-by-conversation", 1)


def thread() -> SeekAwareThread:
    t = object.__new__(SeekAwareThread)  # its numbering only: no faust service behind it
    t.seeks, t.seeked_at, t.seek_offsets, t.fetched_after = 0, {}, {}, 0
    return t


async def source(records: list[tuple[TP, int]]) -> AsyncIterator[tuple[TP, int]]:
    for record in records:
        yield record


def drain(
    t: SeekAwareThread,
    records: list[tuple[TP, int]],
    read_offset: dict[TP, int],
    seek_during: tuple[TP, int] | None = None,
    seek: tuple[TP, int] = (KEPT, 82),
) -> list[tuple[TP, int]]:
    """faust's _drain_messages over one batch: each record handed to the agents, the read offset
    set to it afterwards; ``seek`` made (as perform_seek makes it) while ``seek_during`` is in
    the agents' hands."""

    async def run() -> list[tuple[TP, int]]:
        handed = []
        async for tp, offset in fresh_records(source(records), t, read_offset):
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


def test_the_committed_offset_seek_numbers_its_seeks_and_skips_what_aiokafka_skips() -> None:
    empty, never = TP("mail.events", 0), TP("mail.events", 5)
    consumer = FakeAiokafka({KEPT: 82, OTHER: 40, empty: 0, never: None}, lost=OTHER)
    t = thread()
    t._ensure_consumer = lambda: consumer  # type: ignore[method-assign]
    committed: Any = asyncio.run(t._seek_to_committed())
    assert committed == {KEPT: 82, OTHER: 40, empty: 0, never: None}
    # OTHER was revoked meanwhile (aiokafka raises on its seek); 0 and None are not sought,
    # as aiokafka's own seek_to_committed does not (streams.app re-seeks those)
    assert consumer.sought == {KEPT: 82}
    assert t.seeks == 1 and t.seeked_at == {KEPT: 1} and t.seek_offsets == {KEPT: 82}
