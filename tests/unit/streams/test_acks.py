"""Pipelined acknowledgements (streams.acks): changelog writes and offset commits wait for the
outputs sent before them, and a failed send is never committed past."""

from __future__ import annotations

import asyncio
from collections import defaultdict
from types import SimpleNamespace
from typing import Any

import pytest
from faust.types import TP

from streams.acks import OutputAcks
from streams.app import _ReadCommittedConsumer
from streams.errors import OutputLost
from streams.sends import ProducerSends

EVENTS = TP("mail.events", 0)


def _future() -> asyncio.Future[None]:
    return asyncio.get_running_loop().create_future()


async def test_a_changelog_write_waits_for_the_outputs_sent_before_it() -> None:
    acks, written = OutputAcks(), []
    command = _future()
    acks.hold([command])
    acks.defer(lambda: written.append("runs"))
    await asyncio.sleep(0)
    assert written == []  # not acknowledged yet: the dedupe mark must not become durable
    command.set_result(None)
    await acks.settled()
    assert written == ["runs"]


async def test_writes_keep_their_order_when_a_later_send_is_acknowledged_first() -> None:
    acks, written = OutputAcks(), []
    first, second = _future(), _future()
    acks.hold([first])
    acks.defer(lambda: written.append("state of mail 1"))
    acks.hold([second])
    acks.defer(lambda: written.append("state of mail 2"))
    second.set_result(None)
    await asyncio.sleep(0.01)
    assert written == []  # mail 2's write may not overtake mail 1's
    first.set_result(None)
    await acks.settled()
    assert written == ["state of mail 1", "state of mail 2"]


async def test_with_nothing_pending_a_write_runs_at_once() -> None:
    acks, written = OutputAcks(), []
    done = _future()
    done.set_result(None)
    acks.hold([done])
    acks.defer(lambda: written.append("now"))
    assert written == ["now"]


async def test_a_failed_send_drops_every_later_write_and_stops_the_worker() -> None:
    stopped: list[BaseException] = []

    async def on_failure(exc: BaseException) -> None:
        stopped.append(exc)

    acks, written = OutputAcks(on_failure=on_failure), []
    lost, fine = _future(), _future()
    acks.hold([lost])
    acks.defer(lambda: written.append("runs of the lost command"))
    acks.hold([fine])
    acks.defer(lambda: written.append("a later mail"))
    fine.set_result(None)
    lost.set_exception(ConnectionError("broker gone"))
    with pytest.raises(OutputLost, match="broker gone"):
        await acks.settled()
    assert written == []
    assert [type(e) for e in stopped] == [ConnectionError]
    acks.defer(lambda: written.append("after the failure"))
    assert written == []
    with pytest.raises(OutputLost):  # and at every later commit
        await acks.settled()


def _consumer(acks: OutputAcks, committed: list[dict[TP, int]]) -> Any:
    """faust's consumer with only what ``_commit_offsets`` touches (no Kafka)."""
    consumer: Any = object.__new__(_ReadCommittedConsumer)

    async def flush() -> None:
        return None

    async def commit(offsets: dict[TP, int]) -> bool:
        committed.append(dict(offsets))
        return True

    consumer.app = SimpleNamespace(
        output_acks=acks,
        sends=ProducerSends(lambda: None, acks),
        producer=SimpleNamespace(flush=flush),
        tables=SimpleNamespace(on_commit=lambda offsets: None),
        monitor=SimpleNamespace(on_tp_commit=lambda offsets: None),
    )
    consumer.assignment = lambda: {EVENTS}
    consumer._commit = commit
    consumer._committed_offset = defaultdict(lambda: None)
    consumer.in_transaction = False
    consumer.log = SimpleNamespace(dev=lambda *a: None, info=lambda *a: None)
    return consumer


async def test_an_offset_is_committed_only_after_the_sends_before_it_were_acknowledged() -> None:
    acks, committed = OutputAcks(), []
    consumer = _consumer(acks, committed)
    sent = _future()
    acks.hold([sent])
    commit = asyncio.ensure_future(consumer._commit_offsets({EVENTS: 8}))
    await asyncio.sleep(0.01)
    assert committed == [] and not commit.done()
    sent.set_result(None)
    assert await commit is True
    assert committed == [{EVENTS: 8}]


async def test_a_failed_send_is_not_committed_past() -> None:
    acks, committed = OutputAcks(), []
    consumer = _consumer(acks, committed)
    sent = _future()
    acks.hold([sent])
    sent.set_exception(ConnectionError("NotLeaderForPartition after retries"))
    with pytest.raises(OutputLost):
        await consumer._commit_offsets({EVENTS: 8})
    assert committed == []


async def test_a_later_batch_failing_first_keeps_the_writes_before_it() -> None:
    acks, written = OutputAcks(), []
    first, second = _future(), _future()
    acks.hold([first])
    acks.defer(lambda: written.append("mail 1"))
    acks.hold([second])
    acks.defer(lambda: written.append("mail 2"))
    second.set_exception(ConnectionError("broker gone"))
    await asyncio.sleep(0.01)
    assert written == [] and acks.failure is None  # mail 1's outputs may still be acknowledged
    first.set_result(None)
    with pytest.raises(OutputLost, match="broker gone"):
        await acks.settled()
    assert written == ["mail 1"]


async def test_settled_waits_only_for_what_was_held_before_it() -> None:
    acks = OutputAcks()
    first, later = _future(), _future()
    acks.hold([first])
    barrier = asyncio.ensure_future(acks.settled())
    await asyncio.sleep(0)  # the barrier is taken here
    acks.hold([later])
    first.set_result(None)
    await asyncio.wait_for(barrier, 1)  # the send held after the barrier does not hold it up
    assert not later.done()


async def test_a_write_that_raises_stops_the_worker_and_drops_the_later_writes() -> None:
    stopped: list[BaseException] = []

    async def on_failure(exc: BaseException) -> None:
        stopped.append(exc)

    def broken() -> None:
        raise RuntimeError("producer closed")

    acks, written = OutputAcks(on_failure=on_failure), []
    sent = _future()
    acks.hold([sent])
    acks.defer(broken)
    acks.defer(lambda: written.append("dedupe mark"))
    sent.set_result(None)
    with pytest.raises(OutputLost, match="producer closed"):
        await acks.settled()
    assert written == [] and [type(e) for e in stopped] == [RuntimeError]
