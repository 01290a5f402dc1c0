"""Sends straight to the producer (streams.sends): changelog records keep their order and faust's
bytes, the commit waits for their acknowledgements, and a refused one stops the worker."""

from __future__ import annotations

import asyncio
import datetime as dt
from typing import Any

import pytest
from faust.serializers import codecs

from streams.acks import OutputAcks
from streams.errors import OutputLost
from streams.sends import ProducerSends, table_bytes


class FakeProducer:
    """aiokafka's producer as ProducerSends uses it: ``send`` returns the ack's future; the send
    of a key in ``blocked`` waits (a partition's batch full) until ``release``."""

    def __init__(self) -> None:
        self.sent: list[tuple[str, int | None, bytes | None, bytes | None]] = []
        self.acks: list[asyncio.Future[None]] = []
        self.blocked: set[bytes] = set()
        self.released = asyncio.Event()
        self.refuse: Exception | None = None

    async def send(
        self,
        topic: str,
        value: bytes | None,
        *,
        key: bytes | None,
        partition: int | None,
        headers: Any,
    ) -> asyncio.Future[None]:
        if self.refuse is not None:
            raise self.refuse
        if key in self.blocked:
            await self.released.wait()
        self.sent.append((topic, partition, key, value))
        self.acks.append(asyncio.get_running_loop().create_future())
        return self.acks[-1]

    def ack_all(self) -> None:
        for ack in self.acks:
            if not ack.done():
                ack.set_result(None)


def _sends(on_failure: Any = None) -> tuple[ProducerSends, FakeProducer, OutputAcks]:
    producer, acks = FakeProducer(), OutputAcks(on_failure=on_failure)
    return ProducerSends(lambda: producer, acks), producer, acks


async def test_changelog_records_reach_the_producer_in_order_even_when_one_send_blocks() -> None:
    sends, producer, _ = _sends()
    producer.blocked.add(b"state")
    sends.queue("state-changelog", 1, b"state", b"1")
    sends.queue("runs-changelog", 1, b"run", b"2")  # the dedupe mark, last
    await asyncio.sleep(0.01)
    assert producer.sent == []  # the mark does not overtake the blocked state record
    assert sends.queued == 2
    producer.released.set()
    await asyncio.sleep(0.01)
    assert [key for _, _, key, _ in producer.sent] == [b"state", b"run"]
    assert sends.queued == 0


async def test_settled_waits_for_the_acknowledgement_of_every_record_queued_before_it() -> None:
    sends, producer, _ = _sends()
    sends.queue("runs-changelog", 0, b"k", b"v")
    settled = asyncio.ensure_future(sends.settled())
    await asyncio.sleep(0.01)
    assert len(producer.sent) == 1 and not settled.done()  # handed over, not acknowledged
    producer.ack_all()
    await settled


async def test_a_refused_changelog_record_stops_the_worker_and_is_never_committed_past() -> None:
    stopped: list[BaseException] = []

    async def on_failure(exc: BaseException) -> None:
        stopped.append(exc)

    sends, producer, acks = _sends(on_failure)
    sends.queue("state-changelog", 0, b"state", b"1")
    await asyncio.sleep(0)
    producer.acks[0].set_exception(ConnectionError("NOT_ENOUGH_REPLICAS after retries"))
    with pytest.raises(OutputLost, match="NOT_ENOUGH_REPLICAS"):
        await sends.settled()
    await asyncio.sleep(0)
    assert [type(e) for e in stopped] == [ConnectionError]
    written: list[str] = []
    acks.defer(lambda: written.append("a later mail's dedupe mark"))
    sends.queue("runs-changelog", 0, b"run", b"2")
    await asyncio.sleep(0.01)
    assert written == [] and len(producer.sent) == 1  # nothing after it becomes durable
    with pytest.raises(OutputLost):
        await acks.settled()


async def test_a_send_the_producer_raises_on_stops_the_worker() -> None:
    stopped: list[BaseException] = []

    async def on_failure(exc: BaseException) -> None:
        stopped.append(exc)

    sends, producer, _ = _sends(on_failure)
    producer.refuse = TimeoutError("no metadata for the changelog topic")
    sends.queue("state-changelog", 0, b"state", b"1")
    sends.queue("runs-changelog", 0, b"run", b"2")
    with pytest.raises(OutputLost, match="no metadata"):
        await sends.settled()
    assert [type(e) for e in stopped] == [TimeoutError] and sends.queued == 0


async def test_a_record_handler_waits_while_too_many_records_wait_for_the_producer() -> None:
    sends, producer, _ = _sends()
    producer.blocked.add(b"0")
    for n in range(3):
        sends.queue("rates-changelog", 0, str(n).encode(), b"v")
    waiting = asyncio.ensure_future(sends.wait_for_room(limit=1))
    await asyncio.sleep(0.01)
    assert not waiting.done()
    producer.released.set()
    await asyncio.wait_for(waiting, 1)
    await sends.wait_for_room(limit=1)  # room now: returns at once


@pytest.mark.parametrize(
    "obj",
    [
        "ticket_intake/thread/root@example.com",
        {"commands": ["ab" * 32], "at": 1764000000.25},
        {"times": [1.5, 2.0], "clock": 3.0, "note": "Grüße \u2028"},
        {"status": None, "open": True, "count": 12, "ids": [[1, 2], {"é": '\x00 "q"'}]},
        1e21,
    ],
)
def test_table_records_keep_the_bytes_of_fausts_json_codec(obj: Any) -> None:
    """Recovery decodes them with faust's codec; a key must be the same bytes as before for
    compaction to replace the records older versions wrote."""
    assert table_bytes(obj) == codecs.dumps("json", obj)
    assert codecs.loads("json", table_bytes(obj)) == obj


def test_a_value_json_cannot_hold_is_written_as_fausts_codec_writes_it() -> None:
    at = dt.datetime(2026, 12, 6, 15, 0, 0, 250000, tzinfo=dt.UTC)
    assert table_bytes({"at": at}) == codecs.dumps("json", {"at": at})
