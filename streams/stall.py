"""A stream partition that stops being delivered while it has records is seeked again.

faust 0.15.3 can leave a partition of a live worker undelivered: in the scale-out test
(tests/integration/streams/test_streams_scale_out.py, about 1 run in 12 on 2 loaded cores) a
surviving worker owned a conversation partition through two generations, was re-seeked to its
committed offset in both, and never delivered the record waiting there; its other partitions ran
on and ``/healthz`` stayed green, so the reply was never sent. faust's consumer decides per batch
what reaches the agents (its active and paused partition sets, its read offsets, the batch cut at
a generation change: faust/transport/consumer.py ``getmany`` and ``_drain_messages``), and a
record aiokafka handed over and faust did not pass on is not fetched again until a seek.

:class:`StallGuard` watches what the agents themselves were given. For each stream partition the
worker owns it knows the next offset an agent should see (the re-seek's target after a
rebalance, then one past the last record delivered). When the partition's end stays beyond that
for ``stall_s`` with nothing delivered, the guard resumes the partition in faust's books and
seeks it to that offset in the consumer's thread; processed records that come again meet the
dedupe table (streams.app). It logs the faust state it found, so the next occurrence says why.

``mail.events`` is written in transactions: a commit marker takes the offset after a
transaction's last record and an aborted transaction's records are never delivered. So there a
partition's end may sit past the next offset with nothing to deliver: when the consumer's
position has reached the end, the guard takes the end as the next offset instead of seeking
(:meth:`StallGuard.check`). There it finds only records aiokafka holds back (position behind the
end); records faust took and dropped look like markers.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

log = logging.getLogger(__name__)

#: No delivery for this long while records wait: the partition is stalled.
STALL_S = 30.0


@dataclass
class _Watched:
    next_offset: int
    since: float  # the last delivery (or expectation, or seek) on the partition


@dataclass
class _Given:
    """What agents were given of one partition in one consumer generation."""

    generation: int
    first: int
    last: int


class StallGuard:
    """Per owned stream partition: the next offset an agent should be given, and since when."""

    def __init__(
        self, stall_s: float = STALL_S, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.stall_s = stall_s
        self.clock = clock
        self._watched: dict[Any, _Watched] = {}
        self._given: dict[Any, _Given] = {}

    def expect(self, targets: Mapping[Any, int], generation: int | None = None) -> None:
        """A settled generation's re-seek: exactly these partitions, from these offsets (or
        from one past the last record given in ``generation``, when that is further)."""
        now = self.clock()
        self._watched = {}
        for tp, offset in targets.items():
            given = self._given.get(tp)
            if given is not None and given.generation == generation:
                offset = max(offset, given.last + 1)
            self._watched[tp] = _Watched(offset, now)

    def given_from(self, tp: Any, generation: int, offset: int) -> bool:
        """Whether the agents were given ``tp`` in ``generation`` starting at or before
        ``offset``: then no record from ``offset`` on was skipped before the first delivery,
        and a re-seek there would only read again what was handled (streams.app)."""
        given = self._given.get(tp)
        return given is not None and given.generation == generation and given.first <= offset

    def forget(self) -> None:
        """A rebalance began: nothing is watched until the next generation settles."""
        self._watched = {}

    def delivered(self, tp: Any, offset: int, generation: int = 0) -> bool:
        """An agent was given the record at ``offset`` of ``tp``, fetched in ``generation``
        (faust passes a stream only records of the current generation); False when it was
        given that record before in this generation: the agent handled it then.

        Records come again after the re-seek of a settled generation (streams.app): faust may
        have skipped records before the generation's first delivery, so the partition goes
        back to its committed offset, and what was delivered between the rebalance and the
        re-seek comes a second time. Those, between the generation's first and last record
        given, are not handled twice (before, a rebalance during a backlog handled up to a
        second's worth of records again; each a "dedupe" SKIPPED event on mail.workflow).
        """
        given = self._given.get(tp)
        fresh = True
        if given is None or given.generation != generation:
            self._given[tp] = _Given(generation, offset, offset)
        elif given.first <= offset <= given.last:
            fresh = False
        elif offset > given.last:
            given.last = offset
        # else below ``first``: a record the generation skipped, given now (the range stays)
        watched = self._watched.get(tp)
        if watched is not None:
            watched.since = self.clock()
            watched.next_offset = max(watched.next_offset, offset + 1)
        return fresh

    def stalled(self, highwater: Callable[[Any], int | None]) -> dict[Any, int]:
        """The partitions whose end is past the next offset with nothing delivered for
        ``stall_s``, each with the offset to seek it to."""
        now = self.clock()
        found = {}
        for tp, watched in self._watched.items():
            end = highwater(tp)
            if end is None or end <= watched.next_offset:
                watched.since = now  # caught up: the clock runs from here
                continue
            if now - watched.since >= self.stall_s:
                found[tp] = watched.next_offset
        return found

    async def check(self, consumer: Any, transactional: Iterable[str] = ()) -> dict[Any, int]:
        """Seek the stalled partitions of ``consumer`` (a faust consumer) again; returns them.

        ``transactional``: the topics written in transactions (their ends may be markers).
        """
        stalled = self.stalled(consumer.highwater)
        if not stalled:
            return {}
        topics = set(transactional)
        again: dict[Any, int] = {}
        for tp, offset in stalled.items():
            if tp.topic in topics:
                position = await consumer.position(tp)
                end = consumer.highwater(tp)
                if position is not None and end is not None and position >= end:
                    # The consumer read to the end and had nothing to deliver: a commit
                    # marker or aborted records. The end is where the next record will be.
                    watched = self._watched[tp]
                    watched.next_offset, watched.since = end, self.clock()
                    continue
            again[tp] = offset
        if not again:
            return {}
        for tp, offset in again.items():
            log.warning(
                "stream partition %s/%s stalled: nothing delivered for %.0f s with records "
                "from offset %d (end %s); resumed and seeked there again "
                "(faust: active=%s paused=%s buffered=%s read_offset=%s)",
                tp.topic,
                tp.partition,
                self.clock() - self._watched[tp].since,
                offset,
                consumer.highwater(tp),
                tp in (getattr(consumer, "_active_partitions", None) or ()),
                tp in getattr(consumer, "_paused_partitions", ()),
                tp in getattr(consumer, "_buffered_partitions", ()),
                getattr(consumer, "_read_offset", {}).get(tp),
            )
        consumer.resume_partitions(list(again))
        await consumer.seek_wait(again)
        now = self.clock()
        for tp in again:
            self._watched[tp].since = now  # the seek gets its own stall_s to deliver
        return again
