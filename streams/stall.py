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

import bisect
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
    committed: int | None = None  # the committed offset last seen, and since when
    committed_since: float = 0.0


@dataclass
class _Given:
    """What agents were given of one partition in one consumer generation: the exact offsets,
    as runs, until the generation settles (:meth:`StallGuard.expect`), and the last one.

    Exact, not a first and a last offset: records faust drops on their way to the agents leave
    holes, and a record in a hole came to the agents later (a re-seek) for the first time. Taken
    for one given before, it was skipped unhandled and faust committed past it (``bench streams
    --workers 3``: 75 and 77 records of two conversation partitions never answered). The runs
    are kept while the re-seek of a settled generation may hand the agents again what they were
    given since the rebalance; after that only holes inside them are filled in, so a generation
    that lasts for months keeps no more than its first seconds (``mail.events`` breaks a run at
    each transaction's commit marker). A record after them that comes again (a stall's seek) is
    handled again: the dedupe table keeps its outputs single.
    """

    generation: int
    runs: list[list[int]]  # [first, last] offsets, sorted, apart
    last: int
    settled: bool = False

    def add(self, offset: int) -> bool:
        """Record ``offset`` as given; False when it was given before."""
        runs = self.runs
        if offset > self.last:
            self.last = offset
            if not self.settled:
                if runs and runs[-1][1] + 1 == offset:
                    runs[-1][1] = offset
                else:
                    runs.append([offset, offset])
            return True
        at = bisect.bisect_right(runs, offset, key=_run_first) - 1
        if at >= 0 and offset <= runs[at][1]:
            return False
        if self.settled and (not runs or offset > runs[-1][1]):
            return True  # past the runs kept: not known, handled (again) to be safe
        if at >= 0 and runs[at][1] + 1 == offset:
            runs[at][1] = offset
        else:
            at += 1
            runs.insert(at, [offset, offset])
        if at + 1 < len(runs) and runs[at][1] + 1 == runs[at + 1][0]:
            runs[at][1] = runs.pop(at + 1)[1]
        return True

    def from_(self, offset: int) -> bool:
        """Whether every record from ``offset`` to the last one was given."""
        return bool(self.runs) and self.runs[-1][0] <= offset and not self.settled


def _run_first(run: list[int]) -> int:
    return run[0]


class StallGuard:
    """Per owned stream partition: the next offset an agent should be given, and since when."""

    def __init__(
        self, stall_s: float = STALL_S, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.stall_s = stall_s
        self.clock = clock
        self._watched: dict[Any, _Watched] = {}
        self._given: dict[Any, _Given] = {}
        self._generation: int | None = None
        #: The partitions the last :meth:`stalled` found by their commit.
        self.stuck: set[Any] = set()

    def expect(self, targets: Mapping[Any, int], generation: int | None = None) -> None:
        """A settled generation's re-seek: exactly these partitions, from these offsets (or
        from one past the last record given in ``generation``, when that is further)."""
        now = self.clock()
        self._watched = {}
        self._generation = generation
        for tp, offset in targets.items():
            given = self._given.get(tp)
            if given is not None and given.generation == generation:
                offset = max(offset, given.last + 1)
                given.settled = True
            self._watched[tp] = _Watched(offset, now)

    def given_from(self, tp: Any, generation: int, offset: int) -> bool:
        """Whether the agents were given every record of ``tp`` from ``offset`` on in
        ``generation`` (before it settled): then none was skipped, and a re-seek there would
        only read again what was handled (streams.app). A transaction marker of ``mail.events``
        breaks that (its offset is never given): such a partition is re-seeked, and what comes
        again is recognised (:meth:`delivered`)."""
        given = self._given.get(tp)
        return given is not None and given.generation == generation and given.from_(offset)

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
        re-seek comes a second time. Those are not handled twice (before, a rebalance during a
        backlog handled up to a second's worth of records again; each a "dedupe" SKIPPED event
        on mail.workflow); see :class:`_Given` for which are known.
        """
        given = self._given.get(tp)
        if given is None or given.generation != generation:
            self._given[tp] = _Given(generation, [[offset, offset]], offset)
            fresh = True
        else:
            fresh = given.add(offset)
        watched = self._watched.get(tp)
        if watched is not None:
            watched.since = self.clock()
            watched.next_offset = max(watched.next_offset, offset + 1)
        return fresh

    def stalled(
        self,
        highwater: Callable[[Any], int | None],
        committed: Callable[[Any], int | None] | None = None,
    ) -> dict[Any, int]:
        """The partitions whose end is past the next offset with nothing delivered for
        ``stall_s``, each with the offset to seek it to; with ``committed`` (the consumer's
        committed offset of a partition) also those whose commit is stuck (:meth:`_stuck`),
        with their committed offset (and in :attr:`stuck`)."""
        now = self.clock()
        found = {}
        self.stuck = set()
        for tp, watched in self._watched.items():
            offset = committed(tp) if committed is not None else None
            if offset is not None and self._stuck(tp, watched, offset, now):
                found[tp] = offset
                self.stuck.add(tp)
                continue
            end = highwater(tp)
            if end is None or end <= watched.next_offset:
                watched.since = now  # caught up: the clock runs from here
                continue
            if now - watched.since >= self.stall_s:
                found[tp] = watched.next_offset
        return found

    def _stuck(self, tp: Any, watched: _Watched, offset: int, now: float) -> bool:
        """Whether the committed ``offset`` of ``tp`` stayed for ``stall_s`` behind records the
        agents were given after it in this generation: a record there was never handed to
        them (faust dropped it, or took it for a gap), and faust's commit does not pass a
        hole (``Consumer._new_offset``), so the partition would never commit again while its
        deliveries go on. A seek to the committed offset hands the record over.

        No false alarm for a record that is slow to handle (the schema registry away): an
        agent is given one record after the other, so no later one was given meanwhile."""
        given = self._given.get(tp)
        behind = given is not None and given.generation == self._generation and given.last > offset
        if not behind or offset != watched.committed:
            watched.committed, watched.committed_since = offset, now
            return False
        return now - watched.committed_since >= self.stall_s

    async def check(self, consumer: Any, transactional: Iterable[str] = ()) -> dict[Any, int]:
        """Seek the stalled partitions of ``consumer`` (a faust consumer) again; returns them.

        ``transactional``: the topics written in transactions (their ends may be markers).
        """
        committed = getattr(consumer, "_committed_offset", {})
        stalled = self.stalled(consumer.highwater, committed.get)
        if not stalled:
            return {}
        topics = set(transactional)
        again: dict[Any, int] = {}
        stuck = self.stuck
        for tp, offset in stalled.items():
            watched = self._watched[tp]
            if tp not in stuck and tp.topic in topics:
                position = await consumer.position(tp)
                end = consumer.highwater(tp)
                if position is not None and end is not None and position >= end:
                    # The consumer read to the end and had nothing to deliver: a commit
                    # marker or aborted records. The end is where the next record will be.
                    watched.next_offset, watched.since = end, self.clock()
                    continue
            again[tp] = offset
        if not again:
            return {}
        now = self.clock()
        for tp, offset in again.items():
            watched = self._watched[tp]
            log.warning(
                "stream partition %s/%s stalled: %s for %.0f s; resumed and seeked to offset %d "
                "(end %s; faust: active=%s paused=%s buffered=%s read_offset=%s)",
                tp.topic,
                tp.partition,
                "its commit stayed behind records handed over after it"
                if tp in stuck
                else "nothing delivered while records wait",
                now - (watched.committed_since if tp in stuck else watched.since),
                offset,
                consumer.highwater(tp),
                tp in (getattr(consumer, "_active_partitions", None) or ()),
                tp in getattr(consumer, "_paused_partitions", ()),
                tp in getattr(consumer, "_buffered_partitions", ()),
                getattr(consumer, "_read_offset", {}).get(tp),
            )
        consumer.resume_partitions(list(again))
        await consumer.seek_wait(again)
        for tp in again:
            # the seek gets its own stall_s to deliver, and to commit
            self._watched[tp].since = self._watched[tp].committed_since = now
        return again
