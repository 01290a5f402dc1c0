"""The sink's idempotency state: one record per command id on a compacted topic.

Topic ``mailtap.sink.state`` (``smtp.state_topic``), key = command id, value = JSON::

    {"phase": "INTENT", "attempt": 2, "message_id": "mailtap.3f2a@example.com",
     "pending": ["b@example.org"], "updated_ms": 1764432000000}

Phases: ``INTENT`` is written (and committed) *before* attempt ``attempt`` is sent; the outcome
transaction replaces it with ``SCHEDULED`` (a retry record for attempt+1 exists) or ``DONE`` (every
recipient is final: SENT, FAILED, or given up). A command whose state is ``DONE`` or ``SCHEDULED``
is never sent from ``mail.commands`` again, whatever is replayed; an ``INTENT`` found at start-up
means the previous process died between intent and outcome: that attempt is UNKNOWN and the mail is
resent later with the same Message-ID.

The whole topic is read (``read_committed``) at start and on every partition assignment, like
Kafka Connect's offset topic. It is a dedicated topic rather than ``mail.delivery`` because it has
to be written in the same transaction as the consumer offsets and be tiny to read back.
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import asdict, dataclass
from typing import Literal

from confluent_kafka import Consumer, KafkaException, TopicPartition
from confluent_kafka.admin import NewTopic  # type: ignore[attr-defined]

from connectors.core.config import KafkaSettings
from connectors.core.kafka import (
    COMPACTED,
    admin_client,
    cluster_metadata,
    consumer_config,
    raise_if_stopping,
)

log = logging.getLogger(__name__)

Phase = Literal["INTENT", "SCHEDULED", "DONE"]
#: How long reading the state topic back may take before start-up fails loudly.
STATE_READ_TIMEOUT_S = 120.0


@dataclass(frozen=True)
class CommandState:
    phase: Phase
    attempt: int
    message_id: str | None = None
    pending: tuple[str, ...] | None = None
    updated_ms: int = 0

    def to_bytes(self) -> bytes:
        data = asdict(self)
        data["pending"] = list(self.pending) if self.pending is not None else None
        return json.dumps(data, separators=(",", ":")).encode("utf-8")

    @classmethod
    def from_bytes(cls, raw: bytes) -> CommandState:
        data = json.loads(raw)
        pending = data.get("pending")
        return cls(
            phase=data["phase"],
            attempt=int(data["attempt"]),
            message_id=data.get("message_id"),
            pending=tuple(pending) if pending is not None else None,
            updated_ms=int(data.get("updated_ms", 0)),
        )


def ensure_state_topic(kafka: KafkaSettings, topic: str, timeout: float = 30.0) -> None:
    admin = admin_client(kafka)
    if topic in cluster_metadata(admin, kafka, timeout).topics:
        return
    futures = admin.create_topics(
        [NewTopic(topic, kafka.partitions, kafka.replication_factor, config=dict(COMPACTED))],
        operation_timeout=timeout,
    )
    for fut in futures.values():
        try:
            fut.result()
        except KafkaException as exc:
            if exc.args[0].name() != "TOPIC_ALREADY_EXISTS":
                raise
    log.info("state topic %s created", topic)


def read_state(
    kafka: KafkaSettings, topic: str, *, timeout: float = STATE_READ_TIMEOUT_S
) -> dict[str, CommandState]:
    """Every command's latest state (tombstones remove). Reads up to the last stable offset."""
    consumer = Consumer(consumer_config(kafka, group_id=f"{topic}.reader"))
    try:
        metadata = cluster_metadata(consumer, kafka, 30, topic)
        partitions = sorted(metadata.topics[topic].partitions)
        ends: dict[int, int] = {}
        assignment = []
        for partition in partitions:
            tp = TopicPartition(topic, partition)
            # With isolation.level=read_committed the "high" watermark librdkafka returns is the
            # last stable offset, so an aborted or open transaction does not make us wait for it.
            low, high = consumer.get_watermark_offsets(tp, timeout=30, cached=False)
            if high > low:
                ends[partition] = high
                assignment.append(TopicPartition(topic, partition, low))
        states: dict[str, CommandState] = {}
        if not assignment:
            return states
        consumer.assign(assignment)
        deadline = time.monotonic() + timeout
        while ends:
            raise_if_stopping()
            if time.monotonic() > deadline:
                raise TimeoutError(f"reading {topic} back took longer than {timeout:g}s")
            for msg in consumer.consume(1000, timeout=0.5):
                if msg.error():
                    continue
                key = msg.key()
                if key is not None:
                    value = msg.value()
                    cid = key.decode("utf-8")
                    if value is None:
                        states.pop(cid, None)
                    else:
                        states[cid] = CommandState.from_bytes(value)
            for tp in consumer.position([TopicPartition(topic, p) for p in list(ends)]):
                if tp.offset >= ends[tp.partition]:
                    del ends[tp.partition]
        log.info("state read back topic=%s commands=%d", topic, len(states))
        return states
    finally:
        consumer.close()
