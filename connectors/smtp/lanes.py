"""The sink's commit lanes: transactional producers, each committing its own rounds in turn.

A producer has one transaction at a time and, right after a commit, its next one is often
refused by the coordinator still writing the markers of the last (CONCURRENT_TRANSACTIONS,
retried by librdkafka after ~20 ms, measured in ~1 of 5 back-to-back commits). In turn, each
producer's commits are two rounds apart; a round cut short by
:data:`~connectors.smtp.rounds.GROUP_WAIT_S` does not hold the next one either.

Every lane writes through its own :class:`~connectors.smtp.recorder.DeliveryRecorder`; they share
one :class:`~connectors.smtp.state.StateStore`, the in-memory copy of the state topic.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime

from confluent_kafka import KafkaException, Producer

from connectors.core.avro.serde import AvroSerde
from connectors.core.config import KafkaSettings
from connectors.core.kafka.clients import init_transactions, producer_config
from connectors.core.kafka.permissions import denied_transactional_id
from connectors.smtp.config import SmtpSinkSettings
from connectors.smtp.metrics import SinkMetrics
from connectors.smtp.recorder import DeliveryRecorder
from connectors.smtp.state import StateStore

__all__ = ["COMMIT_LANES", "PRODUCER_COMPRESSION", "CommitLanes"]

#: Transactional producers of one sink, taken in turn (see the module docstring).
COMMIT_LANES = 2
PRODUCER_COMPRESSION = "lz4"


class CommitLanes:
    """The recorders of one sink instance, one per lane; the first also writes outside batches."""

    def __init__(
        self,
        kafka: KafkaSettings,
        settings: SmtpSinkSettings,
        *,
        instance_id: str,
        delivery_serde: AvroSerde,
        states: StateStore,
        clock: Callable[[], datetime],
        metrics: SinkMetrics,
    ) -> None:
        self.kafka = kafka
        self.settings = settings
        self.instance_id = instance_id
        self.delivery_serde = delivery_serde
        self.states = states
        self.clock = clock
        self.metrics = metrics
        self.recorders: list[DeliveryRecorder] = []
        self._events_closed = 0

    def transactional_id(self, lane: int) -> str:
        """``<group_id>.<instance_id>`` for the first lane (the id of earlier versions, so an
        upgraded instance still fences its predecessor), ``#<lane>`` appended for the others
        (``#`` is in no host name, so no other instance's id can be one of these)."""
        base = f"{self.settings.group_id}.{self.instance_id}"
        return base if lane == 0 else f"{base}#{lane}"

    def open(self) -> None:
        """One transactional producer per lane; ``init_transactions`` fences a predecessor."""
        for lane in range(COMMIT_LANES):
            producer = Producer(
                producer_config(
                    self.kafka,
                    transactional_id=self.transactional_id(lane),
                    # lz4, not the core default zstd: a broker whose zstd-jni native library
                    # cannot load (seen on the local dev broker: UnsatisfiedLinkError) fails
                    # every zstd batch with an UNKNOWN error; lz4 is pure Java on the broker.
                    compression_type=PRODUCER_COMPRESSION,
                )
            )
            try:
                init_transactions(producer, self.kafka, 60)
            except KafkaException as exc:
                # Refused before the first command is read: the sentence names the prefixed
                # ACL mailtap acls prints (connectors.core.kafka.permissions).
                refused = denied_transactional_id(
                    self.kafka,
                    exc,
                    self.transactional_id(lane),
                    prefix=f"{self.settings.group_id}.",
                )
                raise refused or exc from None
            self.recorders.append(
                DeliveryRecorder(
                    producer,
                    self.settings,
                    self.kafka.topics,
                    self.delivery_serde,
                    self.clock,
                    self.metrics,
                    tracing=self.kafka.tracing.enabled,
                    states=self.states,
                )
            )

    @property
    def first(self) -> DeliveryRecorder:
        """The first lane's recorder: the transactions outside a batch (pruning) go through it."""
        if not self.recorders:
            raise RuntimeError("the sink is not started")
        return self.recorders[0]

    @property
    def events_total(self) -> int:
        """DeliveryEvents written by this sink's lanes, closed ones included."""
        return self._events_closed + sum(r.events_total for r in self.recorders)

    def close(self) -> None:
        for recorder in self.recorders:
            recorder.producer.flush(10)
            self._events_closed += recorder.events_total
        self.recorders = []
