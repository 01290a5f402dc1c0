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

The topic is co-partitioned with ``mail.commands``: a command's state record goes to the
partition *number* of the command's record (and its retry records too), so the instance that owns
partition P of the commands owns every record about those commands, and on an assignment it reads
back (``read_committed``) only the state partitions it was given -- start-up and rebalances do not
grow with the other instances' share. :func:`check_copartitioned` refuses to start when the counts
differ. It is a dedicated topic rather than ``mail.delivery`` because it has to be written in the
same transaction as the consumer offsets and be small to read back.

Retention: a ``DONE`` state older than ``smtp.state_retention`` becomes a tombstone (written
transactionally, like every state record), so the topic holds the commands of the retention window,
not every command ever sent. A command older than the retention is refused unsent by the sink
(its state may be gone), see :mod:`connectors.smtp.sink`.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Collection, Iterable
from dataclasses import dataclass, field
from typing import Literal

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaException, TopicPartition
from confluent_kafka.admin import NewTopic  # type: ignore[attr-defined]

from connectors.core.config import KafkaSettings
from connectors.core.errors import ConfigError
from connectors.core.kafka.clients import (
    admin_client,
    cluster_metadata,
    consumer_config,
    raise_if_stopping,
)
from connectors.core.kafka.readtoend import read_to_end, topic_partitions
from connectors.core.kafka.topics import COMPACTED

log = logging.getLogger(__name__)

Phase = Literal["INTENT", "SCHEDULED", "DONE"]
_STATE_JSON = json.JSONEncoder(separators=(",", ":"))
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
        # The fields by hand, in declaration order (the bytes dataclasses.asdict gave): asdict
        # deep-copies recursively, and this runs twice per mail (INTENT, then the outcome).
        data = {
            "phase": self.phase,
            "attempt": self.attempt,
            "message_id": self.message_id,
            "pending": list(self.pending) if self.pending is not None else None,
            "updated_ms": self.updated_ms,
        }
        return _STATE_JSON.encode(data).encode("utf-8")

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


def ensure_state_topic(
    kafka: KafkaSettings, topic: str, partitions: int, timeout: float = 30.0
) -> None:
    """Create the state topic with ``partitions`` (the commands topic's count) when missing."""
    admin = admin_client(kafka)
    if topic in cluster_metadata(admin, kafka, timeout).topics:
        return
    futures = admin.create_topics(
        [NewTopic(topic, partitions, kafka.replication_factor, config=dict(COMPACTED))],
        operation_timeout=timeout,
    )
    for fut in futures.values():
        try:
            fut.result()
        except KafkaException as exc:
            if exc.args[0].name() != "TOPIC_ALREADY_EXISTS":
                raise
    log.info("state topic %s created", topic)


def partition_counts(kafka: KafkaSettings, topics: Iterable[str]) -> dict[str, int]:
    """``{topic: partition count}`` of the topics that exist (missing ones are left out)."""
    admin = admin_client(kafka)
    existing = cluster_metadata(admin, kafka, 30).topics
    return {t: len(existing[t].partitions) for t in topics if t in existing}


#: How long the sink waits for a topic that was just created (by it, or by another component at
#: the same moment) to show in the broker's metadata.
NEW_TOPIC_WAIT_S = 30.0


def partition_count(kafka: KafkaSettings, topic: str, timeout: float = NEW_TOPIC_WAIT_S) -> int:
    """The partition count of ``topic``, which must exist: a topic created a moment ago is not
    in every metadata answer at once (another component may have created it as this one asked),
    so it is asked again until ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        counts = partition_counts(kafka, [topic])
        if topic in counts:
            return counts[topic]
        if time.monotonic() > deadline:
            raise ConfigError(
                f"topic {topic} does not exist {timeout:.0f}s after it was ensured; "
                "create it with `mailtap topics ensure`"
            )
        raise_if_stopping()
        time.sleep(0.2)


def check_copartitioned(counts: dict[str, int], commands: str) -> None:
    """Refuse to start when a retry tier or the state topic has another partition count than
    ``commands``: state and retries live on the command's partition number."""
    expected = counts[commands]
    wrong = {t: n for t, n in counts.items() if n != expected}
    if wrong:
        listed = ", ".join(f"{t} has {n}" for t, n in sorted(wrong.items()))
        raise ConfigError(
            f"the SMTP sink keeps a command's state and its retries on the partition number of "
            f"the command, so its topics need as many partitions as {commands} ({expected}), "
            f"but {listed}: give them {expected} partitions (kafka-topics.sh --alter --partitions "
            f"for a topic with fewer; recreate one with more), or use new topic names"
        )


@dataclass
class StateStore:
    """The in-memory copy of the state partitions this instance owns: command id -> state."""

    states: dict[str, CommandState] = field(default_factory=dict)
    partitions: dict[str, int] = field(default_factory=dict)
    """The state partition of each command (= its commands partition number)."""

    def get(self, cid: str) -> CommandState | None:
        return self.states.get(cid)

    def put(self, cid: str, partition: int, state: CommandState) -> None:
        self.states[cid] = state
        self.partitions[cid] = partition

    def remove(self, cid: str) -> None:
        self.states.pop(cid, None)
        self.partitions.pop(cid, None)

    def replace(self, loaded: StateStore) -> None:
        self.states, self.partitions = loaded.states, loaded.partitions

    def drop_partitions(self, numbers: Collection[int]) -> None:
        for cid in [c for c, p in self.partitions.items() if p in numbers]:
            self.remove(cid)

    def expired(self, now_ms: int, retention_ms: int) -> list[tuple[str, int]]:
        """``(command id, partition)`` of the DONE states last updated before the retention."""
        cutoff = now_ms - retention_ms
        return [
            (cid, self.partitions[cid])
            for cid, state in self.states.items()
            if state.phase == "DONE" and state.updated_ms < cutoff
        ]

    def __len__(self) -> int:
        return len(self.states)


def read_state(
    kafka: KafkaSettings,
    topic: str,
    partitions: Collection[int] | None = None,
    *,
    timeout: float = STATE_READ_TIMEOUT_S,
) -> StateStore:
    """The latest state of every command on ``partitions`` (None: all); tombstones remove.

    Reads up to the last stable offset.
    """
    store = StateStore()
    if partitions is not None and not partitions:
        return store
    consumer = Consumer(consumer_config(kafka, group_id=f"{topic}.reader"))
    try:
        wanted = [
            p
            for p in topic_partitions(consumer, kafka, topic, 30) or []
            if partitions is None or p in partitions
        ]
        starts = [TopicPartition(topic, p, OFFSET_BEGINNING) for p in wanted]
        for msg in read_to_end(consumer, starts, timeout):
            key = msg.key()
            if key is not None:
                value = msg.value()
                cid = key.decode("utf-8")
                if value is None:
                    store.remove(cid)
                else:
                    store.put(cid, msg.partition() or 0, CommandState.from_bytes(value))
        log.info("state read back topic=%s partitions=%s commands=%d", topic, wanted, len(store))
        return store
    finally:
        consumer.close()
