"""Handing a fetched record to the agents without four tasks per record.

faust's consumer hands each record it fetched to the conductor with
``await self.wait_first(callback(message), self.suspend_flow.wait())``
(``Consumer._drain_messages``): mode's ``Service.wait_first`` wraps the callback, the
suspend event and the service's stopped and crashed events in a task each, waits for the first
with ``asyncio.wait`` and cancels the other three. The callback almost never waits: it decodes
the record and puts it on a stream's queue (``faust.transport.conductor``). Per record that was
four tasks made, run and cancelled, twice per mail (``mail.events`` and the conversation
topic): in ``bench streams``, ``wait_first`` and the event loop's turns for its tasks were about
a fifth of a worker's busy CPU (py-spy, 2026-12-07).

:func:`first_step` runs the callback's first step in the caller: if the callback finishes
there (the usual case), its result is the winner, as faust's own path would have returned it,
and the other waits are never started. If it waits (flow control during a rebalance, a full
stream queue, the producer's buffer), :class:`Resumed` carries the started coroutine on, and
faust's ``wait_first`` races it against the suspend event as before, so a rebalance still
interrupts a callback that waits.
"""

from __future__ import annotations

import inspect
from collections.abc import Coroutine, Generator
from typing import Any


class Resumed:
    """The rest of a coroutine whose first step already ran (it yielded ``pending``): awaiting
    this yields ``pending`` to the task, then drives the coroutine on as ``await`` would."""

    __slots__ = ("coro", "pending")

    def __init__(self, coro: Coroutine[Any, Any, Any], pending: Any) -> None:
        self.coro = coro
        self.pending = pending

    def __await__(self) -> Generator[Any, Any, Any]:
        coro, pending = self.coro, self.pending
        self.pending = None
        while True:
            try:
                sent = yield pending
            except GeneratorExit:
                coro.close()
                raise
            except BaseException as exc:  # a cancellation or an error thrown in by the task
                try:
                    pending = coro.throw(exc)
                except StopIteration as done:
                    return done.value
            else:
                try:
                    pending = coro.send(sent)
                except StopIteration as done:
                    return done.value


#: What :func:`first_step` returns for a callback that finished in its first step.
FINISHED = object()


def first_step(first: object) -> tuple[object, Any]:
    """Run ``first``'s first step if it is a coroutine.

    Returns ``(FINISHED, result)`` when it finished there, ``(Resumed(...), None)`` when it
    waits, and ``(first, None)`` unchanged when it is not a coroutine. An exception of that step
    is raised here.
    """
    if not inspect.iscoroutine(first):
        return first, None
    try:
        pending = first.send(None)
    except StopIteration as done:
        return FINISHED, done.value
    return Resumed(first, pending), None


def close_unstarted(awaitables: tuple[object, ...]) -> None:
    """Close coroutines that will never be awaited (no "was never awaited" warning)."""
    for awaitable in awaitables:
        if inspect.iscoroutine(awaitable):
            awaitable.close()
