"""The worker's records sent straight to its producer, without faust's per-send machinery.

Why: each record through faust's ``Topic.send`` / ``send_soon`` built a ``FutureMessage`` and a
``PendingMessage``, ran the value through faust's serializer registry, called the sensors twice
and chained two callbacks; a changelog record also went through faust's ``ProducerBuffer``, whose
conductor stopped delivering records while more than 100 waited (``wait_until_ebb``) and then
waited for them one ``wait_for`` at a time (py-spy, ``mailtap bench streams``, issue 29: those
paths were about a fifth of the worker's CPU per mail, about eight records a mail). Here a send
is one call of the producer's ``send``: librdkafka's, :mod:`streams.producer` (faust's
aiokafka producer was the next fifth).

What is kept: a table record keeps the bytes of faust's ``json`` codec (``faust.utils.json.dumps``,
what the table's recovery reads) and, without a partition of its own, the partition faust's
partitioner gives its key (``Producer.key_partition``). What is left out: faust's sensors
(nothing of ours reads them) and the changelog callback that records a persisted offset (a
no-op on the ``memory://`` store).

Changelog records (:meth:`ProducerSends.queue`) are handed to the producer in the order they
were queued, by one task, once the outputs before them were acknowledged
(:meth:`streams.acks.OutputAcks.defer`). Their acknowledgements are watched too: one Kafka
refuses stops the worker (:meth:`~streams.acks.OutputAcks.fail`), and :meth:`ProducerSends.settled`
— part of the commit barrier — waits for every record queued before it.
"""

from __future__ import annotations

import asyncio
import json
from collections import deque
from collections.abc import Callable
from typing import Any

from faust.utils import json as faust_json

from connectors.core import tracing
from streams.acks import OutputAcks
from streams.errors import OutputLost

#: Changelog records queued and not yet handed to the producer beyond which a record's handler
#: waits (:meth:`ProducerSends.wait_for_room`): the producer blocks while a partition's batch is
#: full, and the queue must not grow without bound meanwhile (faust's buffer stopped at 100).
QUEUE_LIMIT = 2000


def _table_json() -> Callable[[Any], str]:
    """faust's ``json`` codec, or (without orjson, with the standard ``json`` module: faust's
    ``dumps`` is then ``json.dumps(obj, cls=faust's JSONEncoder, separators=(",", ":"))``)
    one such encoder built once, which writes the same text without building an encoder per
    call (issue 29: that was ~40 % of a changelog record's JSON, ten times a short key's)."""
    if (
        getattr(faust_json, "orjson", None) is not None
        or getattr(faust_json, "json", None) is not json
    ):
        dumps: Callable[[Any], str] = faust_json.dumps
        return dumps
    encode: Callable[[Any], str] = faust_json.JSONEncoder(separators=(",", ":")).encode
    return encode


_TABLE_JSON = _table_json()


def table_bytes(obj: Any) -> bytes:
    """A table key or value as faust's ``json`` codec writes it (``faust.serializers.codecs``)."""
    return _TABLE_JSON(obj).encode()


class ProducerSends:
    """One worker's sends through the producer ``producer()`` returns: an object with
    aiokafka's ``send`` (:class:`streams.producer.LibrdkafkaProducer`)."""

    def __init__(self, producer: Callable[[], Any], acks: OutputAcks) -> None:
        self._producer = producer
        self._acks = acks
        self._queue: deque[tuple[str, int | None, bytes | None, bytes | None]] = deque()
        self._markers: deque[tuple[int, asyncio.Future[None]]] = deque()
        self._queued = 0  # records queued so far
        self._handed = 0  # of those, handed to the producer (or dropped after a failure)
        self._drain: asyncio.Task[None] | None = None
        self._unacked: set[asyncio.Future[Any]] = set()
        self._room = asyncio.Event()

    async def send(
        self,
        topic: str,
        key: bytes | None,
        value: bytes | None,
        *,
        partition: int | None = None,
        headers: tracing.RecordHeaders = None,
    ) -> asyncio.Future[Any]:
        """Hand one record to the producer; returns the future of its acknowledgement."""
        future: asyncio.Future[Any] = await self._producer().send(
            topic, value, key=key, partition=partition, headers=_kafka_headers(headers)
        )
        return future

    def queue(
        self, topic: str, partition: int | None, key: bytes | None, value: bytes | None
    ) -> None:
        """Send a changelog record after those queued before it (not awaited)."""
        if self._acks.failure is not None:
            return  # the worker stops; nothing past the lost output may become durable
        self._queue.append((topic, partition, key, value))
        self._queued += 1
        if self._drain is None or self._drain.done():
            self._drain = asyncio.ensure_future(self._hand_over())

    @property
    def queued(self) -> int:
        """Records queued and not yet handed to the producer."""
        return self._queued - self._handed

    async def wait_for_room(self, limit: int = QUEUE_LIMIT) -> None:
        """Wait while more than ``limit`` records wait to be handed to the producer."""
        while self.queued > limit and self._acks.failure is None:
            self._room.clear()
            await self._room.wait()

    async def settled(self) -> None:
        """Wait until every changelog record queued so far was acknowledged.

        Raises :class:`OutputLost` when a send failed (this one or any other the worker made).
        """
        if self._handed < self._queued:
            marker = asyncio.get_running_loop().create_future()
            self._markers.append((self._queued, marker))
            await asyncio.shield(marker)
        unacked = list(self._unacked)
        if unacked:
            await asyncio.wait(unacked)
        if self._acks.failure is not None:
            raise OutputLost(f"an output was not acknowledged by Kafka: {self._acks.failure!r}")

    async def _hand_over(self) -> None:
        try:
            while self._queue:
                topic, partition, key, value = self._queue.popleft()
                if self._acks.failure is None:
                    future = await self.send(topic, key, value, partition=partition)
                    self._unacked.add(future)
                    future.add_done_callback(self._acknowledged)
                self._handed += 1
                self._wake()
        except Exception as exc:  # the producer refused it (closed, metadata timeout)
            self._queue.clear()
            self._handed = self._queued
            self._wake()
            stopping = self._acks.fail(exc)
            if stopping is not None:
                await stopping

    def _wake(self) -> None:
        self._room.set()
        while self._markers and self._markers[0][0] <= self._handed:
            _, marker = self._markers.popleft()
            if not marker.done():
                marker.set_result(None)

    def _acknowledged(self, future: asyncio.Future[Any]) -> None:
        self._unacked.discard(future)
        if future.cancelled():
            exc: BaseException | None = asyncio.CancelledError("changelog send cancelled")
        else:
            exc = future.exception()
        if exc is not None:
            self._acks.fail(exc)  # at once: a settled() woken by this future must see it


def _kafka_headers(headers: tracing.RecordHeaders) -> list[tuple[str, bytes]] | None:
    """Headers as the producer takes them: ``(name, bytes)`` pairs, or None for none."""
    if not headers:
        return None
    return [
        (name, v.encode() if isinstance(v, str) else (v or b""))
        for name, v in tracing.header_pairs(headers)
    ]
