"""The worker's producer: confluent-kafka's (librdkafka), behind the ``send`` that
:class:`streams.sends.ProducerSends` calls.

Why: faust's producer is aiokafka's, which builds, batches, frames and sends every record in
Python on the worker's event loop: its ``send``, the batch accumulator, the sender task and the
connection were ~19 % of a worker's CPU in ``mailtap bench streams`` (py-spy, issue 29), for the
eight-odd records each mail causes (its forward onto the conversation topic, the commands and
workflow events, the tables' changelog records). librdkafka does that in C, in threads of its
own; here a send is one ``produce`` call, and its acknowledgement a future set on the loop.

What is kept:

- each record's bytes, headers and partition: an explicit one as given, else librdkafka's
  ``murmur2_random``, Kafka's default partitioner (what
  :class:`streams.partitioner.KeyPartitioner` computes for faust's producer, and the SMTP sink
  relies on for the co-partitioned commands);
- ``acks=all`` and the order of one partition's records (an idempotent producer);
- the commit barrier (:mod:`streams.acks`): it waits on these futures as it did on aiokafka's,
  and a record Kafka refuses (or that times out, ``message.timeout.ms``) fails its future,
  which stops the worker (:class:`~streams.errors.OutputLost`).

The connection is :func:`connectors.core.kafka.clients.producer_config`'s, so the cluster's
security (SASL_SSL, mTLS, OAUTHBEARER) and ``client_properties`` apply as to every other
component; the ACLs are those faust's producer needed already (WRITE on the topics written).
faust's own producer stays: faust starts it, flushes it before each commit and stops it; nothing
of ours sends on it any more.

Threads: records are produced from the loop; one thread polls librdkafka for delivery reports
(and its logs) and hands each poll's reports to the loop at once (one wake-up per poll, not per
record). faust's flushes of its own producer (a rebalance, the stop) flush this one too; the
thread ends with :meth:`LibrdkafkaProducer.close`, at the app's stop, after the last commit.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from functools import partial

from confluent_kafka import KafkaError, KafkaException, Message, Producer

from connectors.core.config import KafkaSettings
from connectors.core.kafka.clients import producer_config

log = logging.getLogger(__name__)

#: How long one poll for delivery reports blocks (the GIL is released meanwhile): reports come
#: back within it of the broker's answer; also how long ``close`` waits for the thread.
POLL_S = 0.05
#: librdkafka's queue full (BufferError): the send waits this long and tries again.
QUEUE_FULL_WAIT_S = 0.005
#: The bytes librdkafka may hold unsent (its default is 1 GB): past it ``produce`` raises
#: BufferError and the handler waits, as aiokafka's ``send`` waited for a full batch.
QUEUE_MAX_KBYTES = 32 * 1024
#: How long the stop waits for records still unacknowledged (none after the last commit).
CLOSE_FLUSH_S = 10.0


class LibrdkafkaProducer:
    """aiokafka's ``send`` over a confluent-kafka producer made at the first send."""

    def __init__(self, kafka: KafkaSettings, *, linger_s: float) -> None:
        self._config = producer_config(
            kafka,
            linger_ms=int(linger_s * 1000),
            partitioner="murmur2_random",
            queue_buffering_max_kbytes=QUEUE_MAX_KBYTES,
        )
        self._producer: Producer | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._reports: list[tuple[asyncio.Future[None], KafkaError | None]] = []
        self._lock = threading.Lock()
        self._closing = threading.Event()
        self._thread: threading.Thread | None = None

    async def send(
        self,
        topic: str,
        value: bytes | None,
        *,
        key: bytes | None = None,
        partition: int | None = None,
        headers: list[tuple[str, str | bytes | None]] | None = None,
    ) -> asyncio.Future[None]:
        """Hand one record to librdkafka; returns the future of its acknowledgement."""
        producer = self._started()
        assert self._loop is not None
        future: asyncio.Future[None] = self._loop.create_future()
        on_delivery = partial(self._delivered, future)
        while True:
            try:
                producer.produce(
                    topic,
                    value,
                    key,
                    partition=-1 if partition is None else partition,
                    on_delivery=on_delivery,
                    headers=headers,
                )
                return future
            except BufferError:  # QUEUE_MAX_KBYTES unsent: let librdkafka send some first
                await asyncio.sleep(QUEUE_FULL_WAIT_S)

    def _started(self) -> Producer:
        if self._closing.is_set():
            raise KafkaException(KafkaError(KafkaError._DESTROY, "the producer was closed"))
        if self._producer is None:
            self._loop = asyncio.get_running_loop()
            self._producer = Producer(self._config)
            self._thread = threading.Thread(
                target=self._poll, args=(self._producer,), name="streams-producer", daemon=True
            )
            self._thread.start()
        return self._producer

    def _delivered(
        self, future: asyncio.Future[None], err: KafkaError | None, _msg: Message
    ) -> None:
        # In the polling thread (or the one flushing): the loop sets the futures.
        with self._lock:
            self._reports.append((future, err))

    def _poll(self, producer: Producer) -> None:
        while not self._closing.is_set():
            producer.poll(POLL_S)
            self._hand_over()

    def _hand_over(self) -> None:
        with self._lock:
            reports, self._reports = self._reports, []
        if not reports or self._loop is None:
            return
        try:
            self._loop.call_soon_threadsafe(_settle, reports)
        except RuntimeError:  # the loop is closed: nobody waits for these any more
            log.debug("%d delivery reports after the loop closed", len(reports))

    async def flush(self) -> None:
        """Wait until every record handed so far was acknowledged or failed (at most
        :data:`CLOSE_FLUSH_S`); their futures are set soon after, by the polling thread."""
        if self._producer is not None:
            left = await asyncio.to_thread(self._producer.flush, CLOSE_FLUSH_S)
            if left:
                log.warning("%d records still unacknowledged after %.0f s", left, CLOSE_FLUSH_S)

    async def close(self) -> None:
        """Deliver what is still unacknowledged (at most :data:`CLOSE_FLUSH_S`), then end the
        polling thread. A send after this raises."""
        self._closing.set()
        await self.flush()
        if self._thread is not None:
            await asyncio.to_thread(self._thread.join, POLL_S * 4)
        self._hand_over()


def _settle(reports: list[tuple[asyncio.Future[None], KafkaError | None]]) -> None:
    for future, err in reports:
        if future.done():
            continue
        if err is None:
            future.set_result(None)
        else:
            future.set_exception(KafkaException(err))
