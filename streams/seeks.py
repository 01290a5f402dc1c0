"""Records fetched before a seek of their partition are not handed on after it, and nothing is
committed past a record the agents were not given (:class:`SeekAwareConsumer`).

faust 0.15.3 hands a fetched batch to the agents record by record (its consumer's ``getmany``,
driven by ``_drain_messages``), yielding to the event loop between records. A seek that runs
meanwhile, such as the seek to the committed offsets at the end of a rebalance's recovery
(``Recovery._resume_streams`` -> ``Consumer.perform_seek``), moves aiokafka's position back,
but the rest of the batch fetched before it still flows on. Found with ``mailtap bench streams
--workers 2`` (the first worker kept conversation partitions 3-5 through the second worker's
join, with a backlog): the seek set faust's read offset of partition 3 to the committed 82, the
old batch went on at offset 675, and faust took 83-674 for a gap (offsets that hold no record,
as after a transaction marker: ``Consumer._add_gap``) and committed past them. The records
aiokafka then fetched again from 82 were below the read offset the old batch had moved on to
and faust dropped them ("DROPPED MESSAGE"): 586 mails of each of the three partitions were
never handled, committed as if they had been, and the worker idled with all of it "done".

So each seek is numbered in the consumer's own thread, where aiokafka fetches and seeks, with
the number of the last seek before each batch was fetched. :class:`SeekAwareThread` keeps the
numbers; :class:`SeekAwareConsumer` drops the records of a partition whose batch is older than
the partition's last seek (aiokafka fetches them again from the seek's offset), and puts the
read offset back to the seek's offset when the record being handled while the seek ran moved
it on. The order of a fetch and a seek in that thread is what decides, so a batch fetched after
the seek is never dropped (its records would be lost: aiokafka's position is past them).
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Callable, Iterable, Mapping, MutableMapping
from typing import Any

from aiokafka.errors import KafkaError
from faust.transport.drivers import aiokafka as aiokafka_driver

log = logging.getLogger(__name__)


class SeekAwareThread(aiokafka_driver.AIOKafkaConsumerThread):
    """faust's aiokafka consumer thread, numbering its seeks and its fetches."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        #: Seeks so far; the number of the last seek of each partition, and its offset.
        self.seeks = 0
        self.seeked_at: dict[Any, int] = {}
        self.seek_offsets: dict[Any, int] = {}
        #: ``seeks`` when the last batch was fetched.
        self.fetched_after = 0
        #: Partitions seeked whose first record since has not been handed on: the seek's offset.
        self.awaiting_first: dict[Any, int] = {}
        #: The first offsets of the stream partitions the last committed-offset seek found
        #: without a committed offset.
        self.first_offsets: dict[Any, int] = {}

    def mark_seeks(self, offsets: Iterable[tuple[Any, int]]) -> None:
        """Partitions seeked now, with their offsets (called where the seek happens)."""
        self.seeks += 1
        for tp, offset in offsets:
            self.seeked_at[tp] = self.seeks
            self.seek_offsets[tp] = offset
            self.awaiting_first[tp] = offset

    async def _fetch_records(self, *args: Any, **kwargs: Any) -> Any:
        records = await super()._fetch_records(*args, **kwargs)
        self.fetched_after = self.seeks  # in this thread: no seek between the fetch and here
        return records

    async def _seek_wait(self, consumer: Any, partitions: Mapping[Any, int]) -> None:
        # faust's _seek_wait seeks every partition before its first await.
        self.mark_seeks(partitions.items())
        await super()._seek_wait(consumer, partitions)

    def seek(self, partition: Any, offset: int) -> None:
        self.mark_seeks([(partition, offset)])
        super().seek(partition, offset)

    async def seek_to_committed(self) -> Mapping[Any, int]:
        return await self.call_thread(self._seek_to_committed)  # type: ignore[no-any-return]

    async def committed_offsets(self) -> Mapping[Any, int | None]:
        """The committed offset of each assigned partition (None: none), read in this thread;
        unlike :meth:`seek_to_committed`, nothing is seeked."""
        return await self.call_thread(self._committed_offsets)  # type: ignore[no-any-return]

    async def _committed_offsets(self) -> dict[Any, int | None]:
        consumer = self._ensure_consumer()
        return {tp: await consumer.committed(tp) for tp in consumer.assignment()}

    async def _seek_to_committed(self) -> Mapping[Any, int | None]:
        """aiokafka's ``seek_to_committed``, and a seek of each stream partition with no
        committed offset (or 0) to its first offset, which aiokafka leaves out (``if offset and
        offset > 0``): faust discards what it fetched of the stream partitions during a
        recovery and relies on this seek to fetch it again, so those records were never handed
        over until the settled generation's re-seek (streams.app), and the partition could not
        commit until then (:meth:`SeekAwareConsumer._new_offset`). The seeks are made
        together after the offsets were read (aiokafka awaits each partition's offset between
        its seeks, so a fetch could not be ordered against them). :attr:`first_offsets`: those
        first offsets."""
        consumer = self._ensure_consumer()
        committed = await self._committed_offsets()
        streams = self.consumer.app.topics.acks_enabled_for  # changelogs: faust's recovery's
        unset = [tp for tp, offset in committed.items() if not offset and streams(tp.topic)]
        try:
            first = await consumer.beginning_offsets(unset) if unset else {}
        except KafkaError as exc:  # the settled generation's re-seek seeks them (streams.app)
            log.warning("first offsets of %d stream partitions not read: %r", len(unset), exc)
            first = {}
        # None of a partition a rebalance took away meanwhile (aiokafka would raise).
        assigned = consumer.assignment()
        seeks = [(tp, offset) for tp, offset in committed.items() if offset and tp in assigned]
        seeks += [(tp, offset) for tp, offset in first.items() if tp in assigned]
        for tp, offset in seeks:
            consumer._fetcher.seek_to(tp, offset)
        self.mark_seeks(seeks)
        self.first_offsets = {tp: offset for tp, offset in first.items() if tp in assigned}
        return committed


class SeekAwareConsumer(aiokafka_driver.Consumer):
    """faust's aiokafka consumer, not handing on what a batch fetched before a seek holds of the
    seeked partition (use with :class:`SeekAwareThread`), and not committing a partition past
    records the agents were not given.

    faust commits a partition up to the end of the first run of acknowledged offsets, and checks
    that the run starts at the committed offset only when there is a committed offset other than
    0 (``Consumer._new_offset``: ``if committed_offset:``). A partition never committed (a new
    group, a new topic) or committed at 0 was committed past whatever the agents were not given
    before the run: ``bench streams --workers 3`` lost the first 702 records of a conversation
    partition that way (fetched during the recovery of the second generation and discarded, as
    faust does then; the first record given was 702, acknowledged, committed). Here such a
    partition commits only once its first offset is known (:attr:`start_offsets`: the earliest
    offset, read after faust's seek to the committed offsets and by the re-seek of a settled
    generation), and no partition commits over a run that does not start within one offset (a
    transaction marker) of that floor.
    """

    _thread: SeekAwareThread

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        #: The first offset of each assigned partition that has no committed offset (or 0).
        self.start_offsets: dict[Any, int] = {}

    async def committed_offsets(self) -> Mapping[Any, int | None]:
        """The committed offset of each assigned partition (None: none), nothing seeked."""
        return await self._thread.committed_offsets()

    async def commit_now(self) -> bool:
        """Commit what is acknowledged now; True when an offset was committed.

        faust's ``commit`` does nothing but wait when a commit is under way (``maybe_wait_for_
        commit_to_finish``), and that one's offsets were taken before it awaited the commit
        barrier (:mod:`streams.acks`): what was acknowledged meanwhile stayed uncommitted. At a
        rebalance that left every record a worker handled in the last second or so to the
        partition's next owner (``bench streams`` with 2 workers: the first one's revocation
        commit met the periodic one, and 1,100-1,200 mail events of the three partitions it
        gave away were forwarded and handled a second time). So this waits for a commit under
        way, then commits afresh."""
        for _ in range(3):  # another periodic commit may begin while this one waits
            await self.maybe_wait_for_commit_to_finish()
            if self._commit_fut is None:  # nothing under way: commit() takes the offsets now
                return await self.commit()
        return await self.commit()

    def ack(self, message: Any) -> bool:
        """faust's ``ack``, for a record an agent was given only (``message.tracked``).

        faust's pure-Python stream loop acknowledges the records it skips, which no agent
        handled: one fetched in an older generation, or one that arrives while flow control is
        off (``faust/streams.py``, ``_py_aiter``: ``value = skipped_value`` before the record is
        tracked, then ``event.ack()``). Acknowledged, they could be committed past after a
        rebalance. The compiled loop the worker runs (``faust._cython.streams``) does not
        acknowledge them; this keeps a worker whose compiled module did not load as safe."""
        if not message.tracked:
            return False
        return bool(super().ack(message))

    def getmany(self, timeout: float) -> AsyncIterator[tuple[Any, Any]]:
        return fresh_records(
            super().getmany(timeout), self._thread, self._read_offset, self._no_records
        )

    def _no_records(self, tp: Any, offset: int, first: int) -> None:
        """No record of ``tp`` from ``offset`` up to ``first``: a gap, as faust records one
        between two records read (it does not from a read offset of 0 or none, so a partition
        whose first records were compacted away or aborted never committed)."""
        if self.app.topics.acks_enabled_for(tp.topic):
            gaps = self._gap[tp]
            gaps.addi(offset, first)
            gaps.merge_overlaps()

    async def perform_seek(self) -> None:
        """faust's seek to the committed offsets (the end of a rebalance's recovery), which
        also seeks a partition without one to its first offset (:class:`SeekAwareThread`);
        from there such a partition may commit. (Known only at the settled generation's
        re-seek, a first generation that rebalanced before it settled committed nothing, and
        the next read all of it again: 6,440 of 12,000 mails handled twice in `bench streams`
        with 3 workers.)"""
        await super().perform_seek()
        assigned = self.assignment()
        self.start_offsets.update(
            {tp: o for tp, o in self._thread.first_offsets.items() if tp in assigned}
        )

    def _new_offset(self, tp: Any) -> int | None:
        floor = self._committed_offset[tp] or self.start_offsets.get(tp)
        if floor is None:
            return None  # where the partition starts is not known yet: nothing to commit
        acked = self._acked[tp]
        if acked:
            lowest = min(acked)
            gaps = self._gap[tp]
            if gaps:
                lowest = min(lowest, gaps.begin())
            if lowest - floor > 1:
                return None  # a record between the floor and the run was never acknowledged
        return super()._new_offset(tp)

    async def on_partitions_revoked(self, revoked: set[Any]) -> None:
        await super().on_partitions_revoked(revoked)
        for tp in revoked:
            self.start_offsets.pop(tp, None)
            self._thread.awaiting_first.pop(tp, None)


async def fresh_records(
    batch: AsyncIterator[tuple[Any, Any]],
    thread: Any,
    read_offset: MutableMapping[Any, Any],
    no_records: Callable[[Any, int, int], None] | None = None,
) -> AsyncIterator[tuple[Any, Any]]:
    """The records of one fetched ``batch`` (partition, message) that no seek made since the
    fetch supersedes. ``thread``: a :class:`SeekAwareThread` (its seek numbers); ``read_offset``:
    faust's read offsets, each set back to the seek's offset where the record in the agents'
    hands during the seek moved it on; ``no_records(tp, offset, first)``: called when the first
    record of ``tp`` fetched after its seek to ``offset`` is at ``first`` > ``offset``, so that
    no record is there in between (compacted away, aborted, a transaction marker)."""
    fetched: int | None = None
    handed: Any = None  # the partition of the record handed on last
    awaiting = thread.awaiting_first
    async for tp, message in batch:
        if fetched is None:
            fetched = thread.fetched_after
        if thread.seeks != fetched:  # a seek since the fetch: rare, checked per record
            if handed is not None:
                _keep_seek_offset(thread, read_offset, handed, fetched)
            if thread.seeked_at.get(tp, -1) > fetched:
                continue  # aiokafka fetches it again from the seek's offset
        if awaiting and tp in awaiting:
            sought = awaiting.pop(tp)
            if message.offset > sought and no_records is not None:
                no_records(tp, sought, message.offset)
        handed = tp
        yield tp, message
    if fetched is not None and handed is not None and thread.seeks != fetched:
        _keep_seek_offset(thread, read_offset, handed, fetched)


def _keep_seek_offset(
    thread: Any, read_offset: MutableMapping[Any, Any], tp: Any, fetched: int
) -> None:
    """The record of ``tp`` handed on last was in the agents' hands while ``tp`` was seeked;
    faust then set ``tp``'s read offset to that record's, past the seek's offset, and would drop
    the records fetched again from there: set it back."""
    if thread.seeked_at.get(tp, -1) > fetched:
        offset = thread.seek_offsets[tp]
        if offset > 0:
            read_offset[tp] = offset
        else:
            read_offset.pop(tp, None)
