"""Everything the sink writes to Kafka: state, delivery events, retry and dead-letter records.

The sink decides; this module records. Two kinds of transactions (see :mod:`connectors.smtp.sink`):

- :meth:`DeliveryRecorder.write_intents`: one ``INTENT`` state record per command about to be sent;
- :meth:`DeliveryRecorder.write_outcomes`: per command, one DeliveryEvent per recipient (keyed by
  command id on ``mail.delivery``), then either a retry record on the tier topic plus state
  ``SCHEDULED``, or state ``DONE`` (with a dead-letter record when the command was given up);
- :meth:`DeliveryRecorder.write_tombstones`: DONE states past the retention.

State and retry records go to the partition number of the command's record (the topics are
co-partitioned, :mod:`connectors.smtp.state`): whoever owns the command owns its state.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from confluent_kafka import Consumer, KafkaException, Message, Producer, TopicPartition

from connectors.core import tracing
from connectors.core.avro.replies import DeliveryEvent
from connectors.core.avro.serde import AvroSerde
from connectors.core.config import TopicNames
from connectors.core.kafka.transactions import COMMIT_TIMEOUT_S
from connectors.core.kafka.watchdog import SEND_OFFSETS_TIMEOUT_S, bounded
from connectors.smtp.classify import MAX_DIAGNOSTIC, DeliveryStatus, RecipientOutcome
from connectors.smtp.config import SmtpSinkSettings
from connectors.smtp.identity import message_id_for
from connectors.smtp.metrics import SinkMetrics
from connectors.smtp.retry import GiveUp, Retry, RetryInfo, dlq_headers, plan_next
from connectors.smtp.state import CommandState, StateStore

#: Attempts to commit a transaction that failed with a retriable error.
COMMIT_RETRIES = 5
#: Every transactional call is bounded (confluent-kafka's default is to wait forever): found by
#: `mailtap soak` (seed 25), a sink whose Kafka connections were reset mid-transaction waited in
#: send_offsets_to_transaction for minutes while /healthz still said ok. A timeout raises,
#: the transaction is aborted and the sink stops; its restart reports the intents UNKNOWN.
TXN_CALL_TIMEOUT_S = COMMIT_TIMEOUT_S

log = logging.getLogger(__name__)


def now_utc() -> datetime:
    return datetime.now(UTC)


def to_ms(when: datetime) -> int:
    return int(when.timestamp() * 1000)


def all_recipients(command: dict[str, Any]) -> list[str]:
    """to + cc + bcc addresses of a command, first occurrence kept."""
    seen: dict[str, None] = {}
    for field_name in ("to", "cc", "bcc"):
        for addr in command.get(field_name) or []:
            seen.setdefault(str(addr["address"]), None)
    return list(seen)


@dataclass
class Work:
    """One command to act on in this batch."""

    record: Message
    command: dict[str, Any]
    attempt: int
    recipients: tuple[str, ...] | None
    message_id: str | None = None
    outcomes: list[RecipientOutcome] = field(default_factory=list)
    recovered: bool = False
    """True when this is an INTENT left by a dead process: no send, outcome UNKNOWN."""
    last_error: str | None = None
    """Diagnostic of the previous attempt (from the retry record's headers)."""
    refused: str | None = None
    """Why the command is not sent at all (older than the state retention): FAILED, no DLQ."""
    given_up: str | None = None
    """Why the command was given up before this attempt (max lifetime): FAILED + DLQ."""
    trace: list[tuple[str, bytes]] = field(default_factory=list)
    """Headers of the send's span (tracing on and a send made)."""

    @property
    def command_id(self) -> str:
        return str(self.command["command_id"])


class DeliveryRecorder:
    """Writes through one transactional producer; keeps the in-memory copy of the state topic."""

    def __init__(
        self,
        producer: Producer,
        settings: SmtpSinkSettings,
        topics: TopicNames,
        delivery_serde: AvroSerde,
        clock: Callable[[], datetime] = now_utc,
        metrics: SinkMetrics | None = None,
        *,
        tracing: bool = False,
        states: StateStore | None = None,
    ) -> None:
        self.producer = producer
        self.tracing = tracing
        self.metrics = metrics or SinkMetrics()
        self.settings = settings
        self.topics = topics
        self.delivery_serde = delivery_serde
        self.clock = clock
        self.states = states if states is not None else StateStore()
        """The in-memory copy of the state topic; shared by the recorders of one sink."""
        self.events_total = 0

    def transaction(
        self,
        write: Callable[[], None],
        offsets: dict[tuple[str, int], int] | None = None,
        consumer: Consumer | None = None,
    ) -> None:
        """Run ``write`` (and commit ``offsets`` for ``consumer``) in one Kafka transaction."""
        self.stage(write)
        self.commit(offsets, consumer)

    def stage(self, write: Callable[[], None]) -> None:
        """Begin a transaction and run ``write`` in it (quick: the records are only queued).

        The sink calls this in its event loop and :meth:`commit` in a worker thread, so the
        in-memory state and the counters are only ever changed by one thread.
        """
        self.producer.begin_transaction()
        try:
            write()
        except BaseException:
            self.producer.abort_transaction(TXN_CALL_TIMEOUT_S)
            raise

    def commit(
        self,
        offsets: dict[tuple[str, int], int] | None = None,
        consumer: Consumer | None = None,
    ) -> None:
        """Commit the staged transaction (with ``offsets`` for ``consumer``); blocks."""
        producer = self.producer
        try:
            if offsets:
                positions = [TopicPartition(t, p, o) for (t, p), o in offsets.items()]
                group = consumer.consumer_group_metadata() if consumer else None
                bounded(
                    lambda: producer.send_offsets_to_transaction(
                        positions, group, SEND_OFFSETS_TIMEOUT_S
                    ),
                    SEND_OFFSETS_TIMEOUT_S,
                    "send_offsets_to_transaction (smtp sink)",
                )
            for attempt in range(COMMIT_RETRIES):
                try:
                    producer.commit_transaction(TXN_CALL_TIMEOUT_S)
                    return
                except KafkaException as exc:
                    if not exc.args[0].retriable() or attempt == COMMIT_RETRIES - 1:
                        raise
        except KafkaException as exc:
            # Abort and stop: on restart the records are consumed again and any INTENT written
            # before is reported UNKNOWN (never silently lost, never silently duplicated).
            if exc.args[0].txn_requires_abort():
                producer.abort_transaction(TXN_CALL_TIMEOUT_S)
            raise

    def put_state(self, item: Work, state: CommandState) -> None:
        partition = item.record.partition() or 0
        self._produce(self.settings.state_topic, item.command_id, state.to_bytes(), None, partition)
        self.states.put(item.command_id, partition, state)

    def write_tombstones(self, expired: Sequence[tuple[str, int]]) -> None:
        for cid, partition in expired:
            self._produce(self.settings.state_topic, cid, None, None, partition)
            self.states.remove(cid)

    def write_intents(self, items: Sequence[Work]) -> None:
        now_ms = to_ms(self.clock())
        for item in items:
            state = CommandState("INTENT", item.attempt, item.message_id, item.recipients, now_ms)
            self.put_state(item, state)

    def write_outcomes(
        self, items: Sequence[Work], dead: Sequence[tuple[Message, str, str]], now: datetime
    ) -> None:
        for record, reason, error_class in dead:
            self.dead_letter(record, reason, error_class)
        for item in items:
            if item.recovered:
                item.outcomes = [
                    RecipientOutcome(
                        r,
                        DeliveryStatus.UNKNOWN,
                        diagnostic="the sink stopped between intent and outcome; "
                        "the relay may have accepted the message",
                    )
                    for r in item.recipients or all_recipients(item.command)
                ]
            self._write_item(item, now)

    def _write_item(self, item: Work, now: datetime) -> None:
        cid = item.command_id
        if self.tracing and not item.trace:
            # No send (recovered, given up, unrenderable): the outcome is still in the trace.
            item.trace = tracing.child_headers("smtp.outcome", item.record.headers())
        message_id = item.message_id or self._derived_message_id(item.command)
        pending = tuple(o.recipient for o in item.outcomes if not o.status.final and o.recipient)
        next_at: datetime | None = None
        outcomes = item.outcomes
        if pending:
            created = item.command.get("created_at")
            plan = plan_next(
                failed_attempt=item.attempt,
                created_at=created if isinstance(created, datetime) else now,
                now=now,
                tiers=self.settings.tier_delays,
                max_lifetime=self.settings.max_lifetime_seconds,
                max_attempts=self.settings.max_attempts,
            )
            last_error = next((o.diagnostic for o in outcomes if o.recipient in pending), None)
            if isinstance(plan, Retry):
                next_at = plan.due
                self._produce(
                    f"{self.topics.retry_prefix}.{plan.tier}",
                    cid,
                    item.record.value(),
                    [
                        *RetryInfo(plan.attempt, to_ms(plan.due), pending, last_error).to_headers(),
                        *item.trace,
                    ],
                    item.record.partition() or 0,
                )
                self.metrics.retries.labels(plan.tier).inc()
                self.put_state(
                    item, CommandState("SCHEDULED", item.attempt, message_id, pending, to_ms(now))
                )
            else:
                assert isinstance(plan, GiveUp)
                outcomes = [self._given_up(o, plan.reason) for o in outcomes]
                self.dead_letter(item.record, f"{plan.reason}; last: {last_error}", "GiveUp")
                self.put_state(item, CommandState("DONE", item.attempt, message_id, (), to_ms(now)))
        elif not item.refused:
            # A refused command (older than the state retention) gets no state: it would only
            # grow the topic again, and a later replay of it is refused by its age anyway.
            if item.given_up:
                reason = f"{item.given_up}; last: {item.last_error}"
                self.dead_letter(item.record, reason, "GiveUp")
            self.put_state(item, CommandState("DONE", item.attempt, message_id, (), to_ms(now)))
        for outcome in outcomes:
            if outcome.published:
                continue  # its event is on the delivery topic already (the bounce reader's)
            self._emit(
                item, outcome, message_id, next_at if not outcome.status.final else None, now
            )

    @staticmethod
    def _given_up(outcome: RecipientOutcome, reason: str) -> RecipientOutcome:
        if outcome.status.final:
            return outcome
        return RecipientOutcome(
            outcome.recipient,
            DeliveryStatus.FAILED,
            outcome.smtp_code,
            outcome.enhanced_status,
            f"{reason}; last: {outcome.diagnostic}"[:MAX_DIAGNOSTIC],
        )

    def _derived_message_id(self, command: dict[str, Any]) -> str | None:
        sender = str((command.get("from") or {}).get("address", ""))
        domain = sender.rpartition("@")[2]
        return message_id_for(str(command["command_id"]), domain) if domain else None

    def _emit(
        self,
        item: Work,
        outcome: RecipientOutcome,
        message_id: str | None,
        next_at: datetime | None,
        now: datetime,
    ) -> None:
        event: DeliveryEvent = {
            "schema_version": 1,
            "command_id": item.command_id,
            "message_id": message_id,
            "recipient": outcome.recipient,
            "status": outcome.status.value,
            "smtp_code": outcome.smtp_code,
            "enhanced_status": outcome.enhanced_status,
            "diagnostic": outcome.diagnostic,
            "bounce_type": None,
            "attempt": item.attempt,
            "next_attempt_at": next_at,
            "workflow": item.command.get("workflow"),
            "event_key": item.command.get("event_key"),
            "occurred_at": now,
        }
        self._produce(
            self.topics.delivery,
            item.command_id,
            self.delivery_serde.encode(event, self.topics.delivery),
            item.trace,
        )
        self.events_total += 1
        self.metrics.outcomes.labels(outcome.status.value).inc()

    def dead_letter(self, record: Message, reason: str, error_class: str) -> None:
        key = record.key()
        self._produce(
            self.topics.dlq,
            key.decode("utf-8", "replace") if key else None,
            record.value(),
            dlq_headers(
                record.headers(),
                reason=reason,
                error_class=error_class,
                topic=record.topic() or "",
                partition=record.partition() or 0,
                offset=record.offset() or 0,
            ),
        )
        self.metrics.dlq_records.inc()
        log.warning("dead-lettered key=%s reason=%s", key, reason)

    def _produce(
        self,
        topic: str,
        key: str | None,
        value: bytes | None,
        headers: Sequence[tuple[str, bytes]] | None,
        partition: int | None = None,
    ) -> None:
        while True:
            try:
                self.producer.produce(
                    topic,
                    key=key.encode() if key else None,
                    value=value,
                    headers=list(headers) if headers else None,
                    # -1: librdkafka's partitioner picks (RD_KAFKA_PARTITION_UA).
                    partition=partition if partition is not None else -1,
                )
                return
            except BufferError:
                self.producer.poll(0.1)
