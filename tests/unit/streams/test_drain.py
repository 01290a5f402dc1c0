"""The streams consumer's ``wait_first`` (streams.drain): faust awaits it for every record it hands
to the agents, ``wait_first(callback(message), suspend_flow.wait())``. A callback that finishes
at once is not wrapped in tasks; one that waits is raced against the suspend event as in mode's
own ``Service.wait_first``: a rebalance still interrupts it, and its result, its errors and what
its awaits receive are the same."""

from __future__ import annotations

import asyncio
import gc
import warnings
from typing import Any

import pytest
from mode.utils.locks import Event

from streams.app import _ReadCommittedConsumer


def _consumer() -> Any:
    """A consumer with only what ``wait_first`` reads (no Kafka, no faust app)."""
    consumer = object.__new__(_ReadCommittedConsumer)
    consumer._stopped = Event()
    consumer._crashed = Event()
    consumer._loop = asyncio.get_running_loop()
    return consumer


async def _instant(value: int) -> int:
    return value * 2


async def test_a_callback_that_finishes_at_once_makes_no_task_and_leaves_no_warning() -> None:
    consumer = _consumer()
    suspend = Event()
    tasks_before = asyncio.all_tasks()
    created: list[Any] = []
    loop = asyncio.get_running_loop()
    factory = loop.get_task_factory()
    loop.set_task_factory(
        lambda lp, coro, **kw: created.append(coro) or asyncio.Task(coro, loop=lp)
    )
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            callback = _instant(21)
            results = await consumer.wait_first(callback, suspend.wait())
            gc.collect()
    finally:
        loop.set_task_factory(factory)
    assert results.stopped is False
    assert results.results == [42]
    assert results.done == [callback]
    assert created == []
    assert asyncio.all_tasks() == tasks_before
    assert not [w for w in caught if "never awaited" in str(w.message)]


async def test_a_callback_that_waits_gets_what_its_awaits_give_and_returns_its_result() -> None:
    consumer = _consumer()
    gate: asyncio.Future[str] = asyncio.get_running_loop().create_future()
    seen: list[str] = []

    async def waits() -> str:
        seen.append(await gate)
        await asyncio.sleep(0)  # a bare yield as well as a future
        return seen[0].upper()

    asyncio.get_running_loop().call_later(0.01, gate.set_result, "flow resumed")
    results = await consumer.wait_first(waits(), Event().wait())
    assert results.stopped is False
    assert results.results == ["FLOW RESUMED"]
    assert seen == ["flow resumed"]


async def test_a_suspend_interrupts_a_callback_that_waits_and_cancels_it() -> None:
    consumer = _consumer()
    suspend = Event()
    cancelled: list[bool] = []

    async def blocked() -> None:
        try:
            await asyncio.Event().wait()  # a full stream queue that never drains
        except asyncio.CancelledError:
            cancelled.append(True)
            raise

    asyncio.get_running_loop().call_later(0.01, suspend.set)
    suspended = suspend.wait()
    results = await consumer.wait_first(blocked(), suspended)
    assert results.stopped is False
    assert results.done == [suspended]
    await asyncio.sleep(0)  # the cancellation reaches the callback
    assert cancelled == [True]


async def test_errors_of_the_callback_are_raised_before_and_after_it_waits() -> None:
    consumer = _consumer()

    async def fails_at_once() -> None:
        raise ValueError("undecodable key")

    async def fails_later() -> None:
        await asyncio.sleep(0.001)
        raise KeyError("no callback for this partition")

    suspend = Event()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with pytest.raises(ValueError, match="undecodable key"):
            await consumer.wait_first(fails_at_once(), suspend.wait())
        with pytest.raises(KeyError, match="no callback"):
            await consumer.wait_first(fails_later(), suspend.wait())
        gc.collect()
    assert not [w for w in caught if "never awaited" in str(w.message)]


async def test_a_stopped_consumer_reports_stopped_as_mode_does() -> None:
    consumer = _consumer()
    consumer._stopped.set()
    ran: list[bool] = []

    async def callback() -> None:
        ran.append(True)

    results = await consumer.wait_first(callback(), Event().wait())
    assert results.stopped is True
    assert results.results == []
