"""The rounds of one batch: ``pool_size`` send slots, each round one transaction on a lane.

The sink (:mod:`connectors.smtp.sink`) decides what a batch needs; :class:`DeliveryRounds` sends
it and records every outcome as it comes in (see :meth:`DeliveryRounds.deliver`), on the sink's
commit lanes (:mod:`connectors.smtp.lanes`).

Checkpoints (:mod:`connectors.core.checkpoints`, where the kill -9 tests crash): ``after_intent``
(a round with intents has committed, their sends not done) and ``after_send`` (every send in
flight has its reply, those outcomes not recorded yet).
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections import deque
from collections.abc import Callable, Coroutine, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from confluent_kafka import Consumer, Message, TopicPartition

from connectors.core import checkpoints
from connectors.smtp.config import SmtpSinkSettings
from connectors.smtp.recorder import DeliveryRecorder, Work

__all__ = ["GROUP_WAIT_S", "DeliveryRounds", "Round"]

log = logging.getLogger(__name__)

#: Cap of an outcome's wait for the replies of its group (see DeliveryRounds.deliver): a slow
#: send (a rate limit, a slow relay) must not hold the other outcomes, and their slots, for long.
GROUP_WAIT_S = 0.05

#: Renders and sends one command, its final "." only once the given event is set.
Send = Callable[[Work, float, asyncio.Event], Coroutine[Any, Any, None]]


@dataclass
class Round:
    """One transaction of :meth:`DeliveryRounds.deliver` on one lane."""

    lane: DeliveryRecorder
    finished: Sequence[Work]
    dead: Sequence[tuple[Message, str, str]]
    starting: Sequence[Work]
    """Commands whose INTENT this round records; they are sent once it has committed."""
    offsets: dict[tuple[str, int], int] | None
    surplus: int = 0
    """Slots freed by this round's outcomes and not taken by its intents: free once committed."""
    committed: asyncio.Event = field(default_factory=asyncio.Event)
    """Set once the round has committed: the final "." of its ``starting`` may go out."""


class DeliveryRounds:
    """Runs the rounds of each batch; counts the transactions written."""

    def __init__(
        self, settings: SmtpSinkSettings, *, clock: Callable[[], datetime], send: Send
    ) -> None:
        self.settings = settings
        self.clock = clock
        self._send = send
        self.rounds_total = 0
        """Transactions written (each records a group of outcomes and intents)."""

    async def deliver(
        self,
        lanes: Sequence[DeliveryRecorder],
        to_send: Sequence[Work],
        known: Sequence[Work],
        dead: Sequence[tuple[Message, str, str]],
        offsets: dict[tuple[str, int], int],
        *,
        consumer: Consumer,
        budget_s: float,
        stop: asyncio.Event | None,
    ) -> None:
        """Send through ``pool_size`` slots, recording each outcome as soon as it is known.

        A command holds a slot from the round that records its INTENT to the round that records
        its outcome, so at most ``pool_size`` commands are ever INTENT at once: a kill -9 leaves
        at most that many UNKNOWN (and resent), however large the batch. A round is one
        transaction on one of the COMMIT_LANES producers: the outcomes that came in (a pool's
        worth, or what came within GROUP_WAIT_S) and the intents of the commands taking the
        slots these outcomes free (or slots already free), so about a quarter of a transaction
        per mail with the default pool. The sends of a round's intents start with the round,
        render and go as far as DATA and the content while the round commits in a worker
        thread, and write their final "." once it has committed: the relay reads them while
        the broker commits, and can accept none of them before their INTENT is recorded. A
        slot freed by a round's outcome is only taken by that round's intents, or by later
        rounds once it has committed, so whichever rounds a kill interrupts, the INTENTs
        without an outcome never exceed ``pool_size``. The consumer offsets go with the last
        round, once every other round has committed.
        """
        queue = deque(to_send)
        unsent, replied = list(known), list[Work]()  # outcomes not yet in a round
        dead_letters = list(dead)
        sending: dict[asyncio.Task[None], Work] = {}
        rounds: dict[asyncio.Task[None], Round] = {}
        idle = list(lanes)
        free = self.settings.pool_size
        group = self.settings.pool_size
        group_deadline = math.inf
        started = time.monotonic()
        try:
            while True:
                stopping = stop is not None and stop.is_set()
                if queue and (stopping or time.monotonic() - started > budget_s):
                    # A stop request (SIGTERM) ends the batch as soon as the sends in flight
                    # have their outcomes: the rest is the next owner's, unsent here.
                    self._put_back(
                        queue, offsets, "stop requested" if stopping else "", consumer, budget_s
                    )
                    queue.clear()
                if not queue and not sending and not rounds:
                    round_ = Round(idle[0], [*unsent, *replied], dead_letters, [], offsets)
                    await self._record(round_, consumer)
                    return
                # Nothing is recorded while every lane is busy: what comes in meanwhile joins
                # the next round. A round also waits (at most GROUP_WAIT_S) for a pool's worth
                # of replies when the sends in flight can still make one: one transaction per
                # pool of mails. Once nothing is left to start, the outcomes wait for the last
                # round.
                grouped = (
                    len(replied) >= group
                    or len(replied) + len(sending) < group
                    or time.monotonic() >= group_deadline
                )
                while idle and queue and grouped and (unsent or replied or dead_letters or free):
                    # The slots of ``replied`` go to this round's intents first.
                    count = min(free + len(replied), len(queue))
                    round_ = Round(
                        # The lane idle longest: its last markers are most likely written.
                        idle.pop(0),
                        [*unsent, *replied],
                        dead_letters,
                        [queue.popleft() for _ in range(count)],
                        None,
                        surplus=max(0, len(replied) - count),
                    )
                    free -= max(0, count - len(replied))
                    unsent, replied, dead_letters = [], [], []
                    rounds[asyncio.create_task(self._record(round_, consumer))] = round_
                    group_deadline = math.inf
                    # The sends start now and stop before their final "." until the round has
                    # committed: the relay reads envelopes and contents while the broker commits.
                    budget = max(0.0, self.settings.max_rate_wait - (time.monotonic() - started))
                    for item in round_.starting:
                        task = asyncio.create_task(self._send(item, budget, round_.committed))
                        sending[task] = item
                done, _ = await asyncio.wait(
                    [*sending, *rounds],
                    timeout=max(0.0, group_deadline - time.monotonic()) if replied else None,
                    return_when=asyncio.FIRST_COMPLETED,
                )
                for task in done:
                    if task in sending:
                        if not replied:
                            group_deadline = time.monotonic() + GROUP_WAIT_S
                        replied.append(sending.pop(task))
                        task.result()  # an unexpected error stops the sink, as a failed record does
                        continue
                    round_ = rounds.pop(task)
                    task.result()
                    idle.append(round_.lane)
                    free += round_.surplus
                    if round_.starting:
                        checkpoints.reached("after_intent")
                    round_.committed.set()
                if replied and not sending:
                    checkpoints.reached("after_send")
        finally:
            for task in sending:
                task.cancel()
            await asyncio.gather(*sending, *rounds, return_exceptions=True)

    def _put_back(
        self,
        unstarted: Sequence[Work],
        offsets: dict[tuple[str, int], int],
        why: str,
        consumer: Consumer,
        budget_s: float,
    ) -> None:
        """Leave ``unstarted`` (no INTENT yet) to the next batch: the batch's offsets stop before
        the first of them on each partition, and the consumer goes back there. Records after it
        that were handled without a send (skipped, recovered, dead-lettered) come again: the
        state skips the first two; an undecodable one is dead-lettered a second time."""
        first: dict[tuple[str, int], int] = {}
        for item in unstarted:
            topic, partition, offset = (
                item.record.topic(),
                item.record.partition(),
                item.record.offset(),
            )
            assert topic is not None and partition is not None and offset is not None
            first[(topic, partition)] = min(first.get((topic, partition), offset), offset)
        for (topic, partition), offset in first.items():
            offsets[(topic, partition)] = min(offsets[(topic, partition)], offset)
            consumer.seek(TopicPartition(topic, partition, offset))
        log.log(
            logging.INFO if why else logging.WARNING,
            "%s: %d commands left to the next batch",
            why or f"batch ran past {budget_s:.0f}s (half of max.poll.interval.ms)",
            len(unstarted),
        )

    async def _record(self, round_: Round, consumer: Consumer) -> None:
        """One transaction: the round's outcomes and dead letters, its intents, its offsets."""
        now = self.clock()
        recorder = round_.lane

        def write() -> None:
            recorder.write_outcomes(round_.finished, round_.dead, now)
            recorder.write_intents(round_.starting)

        # The records are queued here, in the loop (the state store is the loop's); the commit
        # waits for the broker in a thread (librdkafka releases the GIL), the sends go on.
        recorder.stage(write)
        await asyncio.to_thread(recorder.commit, round_.offsets, consumer)
        self.rounds_total += 1
