"""Records fetched before a seek of their partition are not handed on after it.

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

from collections.abc import AsyncIterator, Iterable, Mapping, MutableMapping
from typing import Any

from faust.transport.drivers import aiokafka as aiokafka_driver


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

    def mark_seeks(self, offsets: Iterable[tuple[Any, int]]) -> None:
        """Partitions seeked now, with their offsets (called where the seek happens)."""
        self.seeks += 1
        for tp, offset in offsets:
            self.seeked_at[tp] = self.seeks
            self.seek_offsets[tp] = offset

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

    async def _seek_to_committed(self) -> Mapping[Any, int]:
        """aiokafka's ``seek_to_committed``, its seeks made together after the committed offsets
        were read (aiokafka's own awaits each partition's offset between its seeks, so a fetch
        could not be ordered against them)."""
        consumer = self._ensure_consumer()
        committed = {}
        for tp in consumer.assignment():
            committed[tp] = await consumer.committed(tp)
        # Like aiokafka: no committed offset (or 0), no seek (streams.app re-seeks those); and
        # none of a partition a rebalance took away meanwhile (aiokafka would raise).
        assigned = consumer.assignment()
        seeks = [
            (tp, offset)
            for tp, offset in committed.items()
            if offset and offset > 0 and tp in assigned
        ]
        for tp, offset in seeks:
            consumer._fetcher.seek_to(tp, offset)
        self.mark_seeks(seeks)
        return committed


class SeekAwareConsumer(aiokafka_driver.Consumer):
    """faust's aiokafka consumer, not handing on what a batch fetched before a seek holds of the
    seeked partition (use with :class:`SeekAwareThread`)."""

    _thread: SeekAwareThread

    def getmany(self, timeout: float) -> AsyncIterator[tuple[Any, Any]]:
        return fresh_records(super().getmany(timeout), self._thread, self._read_offset)


async def fresh_records(
    batch: AsyncIterator[tuple[Any, Any]], thread: Any, read_offset: MutableMapping[Any, Any]
) -> AsyncIterator[tuple[Any, Any]]:
    """The records of one fetched ``batch`` (partition, message) that no seek made since the
    fetch supersedes. ``thread``: a :class:`SeekAwareThread` (its seek numbers); ``read_offset``:
    faust's read offsets, each set back to the seek's offset where the record in the agents'
    hands during the seek moved it on."""
    fetched: int | None = None
    handed: Any = None  # the partition of the record handed on last
    async for tp, message in batch:
        if fetched is None:
            fetched = thread.fetched_after
        if thread.seeks != fetched:  # a seek since the fetch: rare, checked per record
            if handed is not None:
                _keep_seek_offset(thread, read_offset, handed, fetched)
            if thread.seeked_at.get(tp, -1) > fetched:
                continue  # aiokafka fetches it again from the seek's offset
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
