"""Pipelined acknowledgements: sends are not awaited one by one, yet nothing is committed, and
no table write reaches its changelog, before the outputs it depends on were acknowledged.

Why: awaiting each send's acknowledgement before the next record cost a broker round trip per
record and hop (the worker idled ~90 % of the time at ~100 events/s, issue 29). The guarantees
of :mod:`streams.app` are kept by ordering instead of waiting:

- :meth:`OutputAcks.hold` takes the futures of a record's sends (the re-keyed record; the
  commands and workflow events) without waiting for them;
- :meth:`OutputAcks.defer` takes a changelog write (a table change made after those sends);
  it runs only once every future held before it was acknowledged, in the order given. The
  in-memory table is updated at once, so the next record of the conversation sees it; after
  a crash the tables are rebuilt from the changelog, which then holds only writes whose
  outputs are durable;
- :meth:`OutputAcks.settled` is the commit barrier: the consumer awaits it before it commits
  any offset (``_ReadCommittedConsumer._commit_offsets``), so an offset is committed only
  after every send of every record up to it succeeded and its changelog writes were queued;
  the consumer then awaits :meth:`streams.sends.ProducerSends.settled`, the acknowledgements
  of those changelog records (a refused one fails the barrier through :meth:`OutputAcks.fail`).

A failed send poisons the barrier: later changelog writes are dropped (the in-memory state is
ahead of what was sent, and the worker stops), :meth:`settled` raises :class:`OutputLost`
from then on, so no offset is committed past the record, and ``on_failure`` stops the worker.
A restart re-reads from the last committed offset and re-emits the same command ids.

>>> import asyncio
>>> async def demo() -> list[str]:
...     acks, done = OutputAcks(), []
...     sent = asyncio.get_running_loop().create_future()
...     acks.hold([sent])
...     acks.defer(lambda: done.append("changelog"))
...     done.append("before ack")
...     sent.set_result(None)
...     await acks.settled()
...     return done
>>> asyncio.run(demo())
['before ack', 'changelog']
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Awaitable, Callable, Iterable
from functools import partial
from typing import Any

from streams.errors import OutputLost

log = logging.getLogger(__name__)


class _Batch:
    """Sends held together and the changelog writes that wait for them (and for all before)."""

    __slots__ = ("error", "pending", "writes")

    def __init__(self, pending: int) -> None:
        self.pending = pending  # sends not acknowledged yet
        self.error: BaseException | None = None  # the first send of the batch that failed
        self.writes: list[Callable[[], None]] = []


class OutputAcks:
    """The commit barrier and the changelog gate of one worker (see the module docs).

    The batches wait in a queue, oldest first; each send's future counts its batch down from a
    done callback, and the batches at the head whose sends all settled release their writes in
    order. One callback per send, not one task per batch (issue 29: the task per record, its
    ``gather`` and its wake-ups were ~4 % of a worker's CPU).
    """

    def __init__(
        self, on_failure: Callable[[BaseException], Awaitable[None]] | None = None
    ) -> None:
        self._on_failure = on_failure
        self._batches: deque[_Batch] = deque()
        self._appended = 0  # batches held so far
        self._released = 0  # of those, settled (their writes ran or were dropped)
        self._waiters: deque[tuple[int, asyncio.Future[None]]] = deque()
        self._stopping: asyncio.Future[None] | None = None
        self.failure: BaseException | None = None
        self.held = 0
        """Sends held so far (a figure for tests and metrics)."""

    def hold(self, futures: Iterable[Awaitable[Any]]) -> None:
        """Take the futures of sends just made; later :meth:`defer` writes wait for them."""
        pending = [asyncio.ensure_future(f) for f in futures if not _succeeded(f)]
        self.held += len(pending)
        if not pending:
            return
        batch = _Batch(len(pending))
        self._batches.append(batch)
        self._appended += 1
        settle = partial(self._settle, batch)
        for future in pending:
            future.add_done_callback(settle)

    def defer(self, write: Callable[[], None]) -> None:
        """Run ``write`` once everything held so far is acknowledged (now, when it is)."""
        if self.failure is not None:
            return  # the worker stops; nothing past the lost output may become durable
        if self._batches:
            self._batches[-1].writes.append(write)
        else:
            write()

    async def settled(self) -> None:
        """Wait until every send held so far is acknowledged and the writes behind it ran.

        Raises :class:`OutputLost` when one of them failed (then and at every later call).
        """
        if self._released < self._appended:
            waiter = asyncio.get_running_loop().create_future()
            self._waiters.append((self._appended, waiter))
            # shield: a commit cancelled by a rebalance must not cancel the waiter of another.
            await asyncio.shield(waiter)
        if self._stopping is not None:
            await asyncio.shield(self._stopping)
        if self.failure is not None:
            raise OutputLost(f"an output was not acknowledged by Kafka: {self.failure!r}")

    def fail(self, exc: BaseException) -> asyncio.Future[None] | None:
        """A send Kafka refused: nothing deferred runs from now on and :meth:`settled` raises;
        returns the task of ``on_failure``, which stops the worker (for the first failure only).
        """
        if self.failure is not None:
            return None
        self.failure = exc
        log.error("an output was not acknowledged, the worker stops: %r", exc)
        if self._on_failure is None:
            return None
        return asyncio.ensure_future(self._on_failure(exc))

    def _settle(self, batch: _Batch, future: asyncio.Future[Any]) -> None:
        batch.pending -= 1
        if batch.error is None:
            if future.cancelled():
                batch.error = asyncio.CancelledError("output send cancelled")
            else:
                batch.error = future.exception()
        # In order: a batch's writes never overtake an earlier batch's, and a failure is acted
        # on when its batch is the oldest (the writes of the batches before it are durable).
        batches = self._batches
        while batches and (batches[0].pending == 0 or batches[0].error is not None):
            head = batches.popleft()
            if head.error is not None:
                stopping = self.fail(head.error)
                if stopping is not None:
                    self._stopping = stopping
            for write in head.writes:
                if self.failure is not None:
                    break
                try:
                    write()
                except Exception as exc:  # a write that cannot be queued is a lost output
                    stopping = self.fail(exc)
                    if stopping is not None:
                        self._stopping = stopping
            head.writes.clear()
            self._released += 1
        waiters = self._waiters
        while waiters and waiters[0][0] <= self._released:
            _, waiter = waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)


def _succeeded(future: Awaitable[Any]) -> bool:
    return (
        isinstance(future, asyncio.Future)
        and future.done()
        and not future.cancelled()
        and future.exception() is None
    )
