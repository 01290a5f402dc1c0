"""The SMTP sink: ReplyCommands in, mail out, a DeliveryEvent for every outcome.

Lifecycle (one asyncio task; Kafka calls are short and made between SMTP rounds):

1. start: create the state topic if missing, ``init_transactions()`` (aborts whatever a previous
   process with the same instance id left open), read the state topic back, subscribe to
   ``mail.commands`` and every retry tier topic (one consumer, group ``smtp.group_id``).
2. per batch of records:
   a. retry records not yet due: pause their partition and seek back to them, to be resumed at
      due time -- other tiers and new commands keep flowing;
   b. drop what the state says is finished (DONE, SCHEDULED) or was already claimed in the batch;
      an INTENT left by a dead process becomes an UNKNOWN outcome and is rescheduled;
   c. render; a RenderError is a FAILED outcome with its reason;
   d. **intent transaction**: state INTENT for each command about to be sent, committed;
   e. send concurrently (pool size = concurrency, rate limits per relay and domain);
   f. **outcome transaction**: DeliveryEvents (one per recipient), the new state, retry or DLQ
      records, and the consumer offsets, in one Kafka transaction (KIP-447 style, fenced by the
      consumer group generation).

A crash between d and f leaves INTENT: on restart the record is consumed again (its offset was
not committed) and the attempt is reported UNKNOWN and resent later with the same Message-ID.
Everything before d is repeatable; everything after f is recorded.

Test hook: ``MAILTAP_SMTP_SINK_TEST_HOOK=kill_after_intent|kill_after_send`` makes the process
SIGKILL itself at that point (after the first batch that gets there). Never set it in production.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import socket
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from confluent_kafka import Consumer, KafkaException, Message, Producer, TopicPartition

from connectors.core.config import MailtapConfig
from connectors.core.kafka import consumer_config, ensure_topics, producer_config
from connectors.core.serde import AvroSerde
from connectors.smtp.classify import (
    MAX_DIAGNOSTIC,
    DeliveryStatus,
    RecipientOutcome,
    classify_error,
    classify_report,
)
from connectors.smtp.config import SmtpSinkSettings
from connectors.smtp.errors import RenderError, SmtpAuthError, SmtpTlsError, SmtpTransportError
from connectors.smtp.identity import message_id_for
from connectors.smtp.ratelimit import SendRateLimiter
from connectors.smtp.render import BlobFetcher, RenderedMessage, render
from connectors.smtp.retry import (
    DueGate,
    GiveUp,
    Retry,
    RetryInfo,
    dlq_headers,
    expired,
    plan_next,
)
from connectors.smtp.state import CommandState, ensure_state_topic, read_state
from connectors.smtp.transport import SmtpConnectionPool

log = logging.getLogger(__name__)

TEST_HOOK_ENV = "MAILTAP_SMTP_SINK_TEST_HOOK"
#: Poll timeout: short, so due retries are resumed and a stop request is seen promptly.
POLL_TIMEOUT_S = 0.2
PRODUCER_COMPRESSION = "lz4"
#: Attempts to commit a transaction that failed with a retriable error.
COMMIT_RETRIES = 5


def _now() -> datetime:
    return datetime.now(UTC)


def _ms(when: datetime) -> int:
    return int(when.timestamp() * 1000)


@dataclass
class Work:
    """One command to act on in this batch."""

    record: Message
    command: dict[str, Any]
    attempt: int
    recipients: tuple[str, ...] | None
    message_id: str | None = None
    rendered: RenderedMessage | None = None
    outcomes: list[RecipientOutcome] = field(default_factory=list)
    recovered: bool = False
    """True when this is an INTENT left by a dead process: no send, outcome UNKNOWN."""
    last_error: str | None = None
    """Diagnostic of the previous attempt (from the retry record's headers)."""
    given_up: str | None = None
    """Why the command was given up before this attempt (max lifetime): FAILED + DLQ."""

    @property
    def command_id(self) -> str:
        return str(self.command["command_id"])


class SmtpSink:
    """Consumes commands and sends them; see the module docstring for the lifecycle."""

    def __init__(
        self,
        config: MailtapConfig,
        settings: SmtpSinkSettings,
        *,
        fetch_blob: BlobFetcher | None = None,
        clock: Callable[[], datetime] = _now,
    ) -> None:
        self.config = config
        self.settings = settings
        self.kafka = config.kafka
        self.topics = config.kafka.topics
        self.fetch_blob = fetch_blob
        self.clock = clock
        self.retry_topics = {
            f"{self.topics.retry_prefix}.{tier}": tier for tier, _ in settings.tier_delays
        }
        self.commands_serde = AvroSerde.for_schema("ReplyCommand", config.kafka)
        self.delivery_serde = AvroSerde.for_schema("DeliveryEvent", config.kafka)
        self.pool = SmtpConnectionPool(settings)
        self.limiter = SendRateLimiter(settings.rate, settings.domain_rates)
        self.gate = DueGate()
        self.states: dict[str, CommandState] = {}
        self.instance_id = settings.instance_id or socket.gethostname()
        self.sent_total = 0
        self.records_total = 0
        self.events_total = 0
        self._hook = os.environ.get(TEST_HOOK_ENV, "")
        self._producer: Producer | None = None
        self._consumer: Consumer | None = None

    # --- start / stop -------------------------------------------------------------------------

    def start(self) -> None:
        ensure_topics(self.kafka, retry_tiers=self.settings.retry_tiers)
        ensure_state_topic(self.kafka, self.settings.state_topic)
        producer = Producer(
            producer_config(
                self.kafka,
                transactional_id=f"{self.settings.group_id}.{self.instance_id}",
                # lz4, not the core default zstd: a broker whose zstd-jni native library cannot
                # load (seen on the local dev broker: UnsatisfiedLinkError) fails every zstd batch
                # with an UNKNOWN error; lz4 is pure Java on the broker side.
                compression_type=PRODUCER_COMPRESSION,
            )
        )
        producer.init_transactions(60)
        self._producer = producer
        self.states = read_state(self.kafka, self.settings.state_topic)
        consumer = Consumer(
            consumer_config(
                self.kafka,
                self.settings.group_id,
                # One SMTP round may take minutes when the relay is slow (data_timeout).
                max_poll_interval_ms=600_000,
                # Static membership: a restarted instance takes its partitions back at once
                # instead of waiting for the dead member's session to time out.
                group_instance_id=self.instance_id,
            )
        )
        consumer.subscribe(
            [self.topics.commands, *self.retry_topics],
            on_assign=self._on_assign,
            on_revoke=self._on_revoke,
        )
        self._consumer = consumer
        log.info(
            "smtp sink started instance=%s relay=%s:%d tiers=%s states=%d",
            self.instance_id,
            self.settings.host,
            self.settings.port,
            ",".join(self.settings.retry_tiers),
            len(self.states),
        )

    def _on_assign(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        # Another instance may have finished commands of these partitions: read the state again.
        if self._producer is not None and self.states is not None:
            self.states = read_state(self.kafka, self.settings.state_topic)
        log.info("assigned %s", sorted((p.topic, p.partition) for p in partitions))

    def _on_revoke(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        self.gate.forget([(p.topic, p.partition) for p in partitions])
        log.info("revoked %s", sorted((p.topic, p.partition) for p in partitions))

    async def close(self) -> None:
        await self.pool.close()
        if self._consumer is not None:
            self._consumer.close()
            self._consumer = None
        if self._producer is not None:
            self._producer.flush(10)
            self._producer = None

    async def run(self, stop: asyncio.Event) -> None:
        """Process until ``stop`` is set; always closes."""
        self.start()
        try:
            while not stop.is_set():
                await self.poll_once()
        finally:
            await self.close()

    async def poll_once(self) -> int:
        """One poll and (if anything came) one batch; returns the number of records seen."""
        assert self._consumer is not None
        self._resume_due()
        records = self._consumer.consume(self.settings.batch_size, timeout=POLL_TIMEOUT_S)
        if records:
            await self._process(records)
            self.records_total += len(records)
        else:
            await asyncio.sleep(0)
        return len(records)

    def _resume_due(self) -> None:
        assert self._consumer is not None
        due = self.gate.release_due(_ms(self.clock()))
        if due:
            self._consumer.resume([TopicPartition(t, p) for t, p in due])
            log.debug("resumed %s", due)

    # --- one batch ----------------------------------------------------------------------------

    async def _process(self, records: Sequence[Message]) -> None:
        assert self._consumer is not None
        now = self.clock()
        offsets: dict[tuple[str, int], int] = {}
        held: set[tuple[str, int]] = set()
        claimed: set[str] = set()
        work: list[Work] = []
        dead: list[tuple[Message, str, str]] = []
        for record in records:
            if record.error():
                log.warning("consumer error: %s", record.error())
                continue
            topic, partition, offset = record.topic(), record.partition(), record.offset()
            assert topic is not None and partition is not None and offset is not None
            tp = (topic, partition)
            if tp in held:
                continue
            info = RetryInfo.from_headers(record.headers()) if topic in self.retry_topics else None
            if info is not None and info.due_ms > _ms(now):
                # Not due: park the partition at this record; later ones are due later still.
                held.add(tp)
                offsets[tp] = offset
                self._consumer.pause([TopicPartition(topic, partition)])
                self._consumer.seek(TopicPartition(topic, partition, offset))
                self.gate.hold(topic, partition, info.due_ms)
                continue
            offsets[tp] = offset + 1
            item = self._admit(record, info, claimed, dead)
            if item is not None:
                work.append(item)

        to_send = [w for w in work if not w.recovered and self._prepare(w, now)]
        if to_send:
            self._transaction(lambda: self._write_intents(to_send), offsets=None)
            self._test_hook("kill_after_intent")
            await asyncio.gather(*(self._send(w) for w in to_send))
            self._test_hook("kill_after_send")
        self._transaction(lambda: self._write_outcomes(work, dead, now), offsets=offsets)

    def _admit(
        self,
        record: Message,
        info: RetryInfo | None,
        claimed: set[str],
        dead: list[tuple[Message, str, str]],
    ) -> Work | None:
        """Decode and decide from the state whether this record still needs action."""
        try:
            command = self.commands_serde.decode(record.value() or b"", record.topic() or "")
        except Exception as exc:
            dead.append((record, f"undecodable ReplyCommand: {exc}", type(exc).__name__))
            return None
        cid = str(command["command_id"])
        if cid in claimed:
            return None
        state = self.states.get(cid)
        attempt = info.attempt if info is not None else 1
        if state is None:
            # A retry record without state only happens when the state topic was lost: send.
            item = Work(
                record,
                command,
                attempt=attempt,
                recipients=info.recipients if info is not None else None,
                last_error=info.last_error if info is not None else None,
            )
        elif state is not None and state.phase == "INTENT" and state.attempt == attempt:
            item = Work(
                record,
                command,
                attempt=attempt,
                recipients=state.pending,
                message_id=state.message_id,
                recovered=True,
            )
        elif (
            state is not None
            and info is not None
            and state.phase == "SCHEDULED"
            and state.attempt == attempt - 1
        ):
            item = Work(
                record,
                command,
                attempt=attempt,
                recipients=info.recipients,
                last_error=info.last_error,
            )
        else:
            log.debug("skip command_id=%s state=%s attempt=%d", cid, state, attempt)
            return None
        claimed.add(cid)
        return item

    def _prepare(self, item: Work, now: datetime) -> bool:
        """Render; False (with outcomes set) when there is nothing to send."""
        created = item.command.get("created_at")
        if (
            item.attempt > 1
            and isinstance(created, datetime)
            and expired(created, now, self.settings.max_lifetime_seconds)
        ):
            item.given_up = (
                f"gave up: max lifetime {self.settings.max_lifetime} reached before attempt "
                f"{item.attempt}"
            )
            diagnostic = f"{item.given_up}; last: {item.last_error}"[:MAX_DIAGNOSTIC]
            item.outcomes = [
                RecipientOutcome(r, DeliveryStatus.FAILED, diagnostic=diagnostic)
                for r in item.recipients or self._all_recipients(item.command)
            ]
            return False
        try:
            item.rendered = render(
                item.command,
                fetch_blob=self.fetch_blob,
                verp_domain=self.settings.verp_domain,
                return_path=self.settings.from_address,
                recipients=item.recipients,
            )
        except RenderError as exc:
            log.warning("render failed command_id=%s reason=%s", item.command_id, exc.reason)
            item.outcomes = [RecipientOutcome(None, DeliveryStatus.FAILED, diagnostic=exc.reason)]
            return False
        if len(item.rendered.data) > self.settings.max_message_bytes:
            item.outcomes = [
                RecipientOutcome(
                    r,
                    DeliveryStatus.FAILED,
                    diagnostic=f"message of {len(item.rendered.data)} bytes exceeds "
                    f"smtp.max_message_bytes={self.settings.max_message_bytes}",
                )
                for r in item.rendered.recipients
            ]
            item.rendered = None
            return False
        item.message_id = item.rendered.message_id
        return True

    @staticmethod
    def _all_recipients(command: dict[str, Any]) -> list[str]:
        seen: dict[str, None] = {}
        for field_name in ("to", "cc", "bcc"):
            for addr in command.get(field_name) or []:
                seen.setdefault(str(addr["address"]), None)
        return list(seen)

    async def _send(self, item: Work) -> None:
        rendered = item.rendered
        assert rendered is not None
        await self.limiter.acquire(rendered.recipients)
        try:
            report = await self.pool.send(rendered)
            item.outcomes = classify_report(rendered.recipients, report)
            self.sent_total += 1
        except SmtpTransportError as exc:
            if isinstance(exc, SmtpAuthError | SmtpTlsError):
                log.error("relay refused us (check smtp settings): %s", exc)
            item.outcomes = classify_error(rendered.recipients, exc)
        log.info(
            "sent command_id=%s attempt=%d outcomes=%s",
            item.command_id,
            item.attempt,
            ",".join(f"{o.recipient}:{o.status.value}" for o in item.outcomes),
        )

    # --- Kafka writes -------------------------------------------------------------------------

    def _transaction(
        self, write: Callable[[], None], offsets: dict[tuple[str, int], int] | None
    ) -> None:
        producer, consumer = self._producer, self._consumer
        assert producer is not None and consumer is not None
        producer.begin_transaction()
        try:
            write()
            if offsets:
                producer.send_offsets_to_transaction(
                    [TopicPartition(t, p, o) for (t, p), o in offsets.items()],
                    consumer.consumer_group_metadata(),
                )
            for attempt in range(COMMIT_RETRIES):
                try:
                    producer.commit_transaction()
                    return
                except KafkaException as exc:
                    if not exc.args[0].retriable() or attempt == COMMIT_RETRIES - 1:
                        raise
        except KafkaException as exc:
            # Abort and stop: on restart the records are consumed again and any INTENT written
            # before is reported UNKNOWN (never silently lost, never silently duplicated).
            if exc.args[0].txn_requires_abort():
                producer.abort_transaction()
            raise

    def _put_state(self, cid: str, state: CommandState) -> None:
        assert self._producer is not None
        self._produce(self.settings.state_topic, cid, state.to_bytes(), None)
        self.states[cid] = state

    def _write_intents(self, items: Sequence[Work]) -> None:
        now_ms = _ms(self.clock())
        for item in items:
            assert item.rendered is not None
            self._put_state(
                item.command_id,
                CommandState(
                    "INTENT",
                    item.attempt,
                    item.rendered.message_id,
                    item.rendered.recipients,
                    now_ms,
                ),
            )

    def _write_outcomes(
        self, items: Sequence[Work], dead: Sequence[tuple[Message, str, str]], now: datetime
    ) -> None:
        for record, reason, error_class in dead:
            self._dead_letter(record, reason, error_class)
        for item in items:
            if item.recovered:
                item.outcomes = [
                    RecipientOutcome(
                        r,
                        DeliveryStatus.UNKNOWN,
                        diagnostic="the sink stopped between intent and outcome; "
                        "the relay may have accepted the message",
                    )
                    for r in item.recipients or self._all_recipients(item.command)
                ]
            self._write_item(item, now)

    def _write_item(self, item: Work, now: datetime) -> None:
        cid = item.command_id
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
                    RetryInfo(plan.attempt, _ms(plan.due), pending, last_error).to_headers(),
                )
                self._put_state(
                    cid, CommandState("SCHEDULED", item.attempt, message_id, pending, _ms(now))
                )
            else:
                assert isinstance(plan, GiveUp)
                outcomes = [self._given_up(o, plan.reason) for o in outcomes]
                self._dead_letter(item.record, f"{plan.reason}; last: {last_error}", "GiveUp")
                self._put_state(cid, CommandState("DONE", item.attempt, message_id, (), _ms(now)))
        else:
            if item.given_up:
                reason = f"{item.given_up}; last: {item.last_error}"
                self._dead_letter(item.record, reason, "GiveUp")
            self._put_state(cid, CommandState("DONE", item.attempt, message_id, (), _ms(now)))
        for outcome in outcomes:
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
        event = {
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
            None,
        )
        self.events_total += 1

    def _dead_letter(self, record: Message, reason: str, error_class: str) -> None:
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
        log.warning("dead-lettered key=%s reason=%s", key, reason)

    def _produce(
        self,
        topic: str,
        key: str | None,
        value: bytes | None,
        headers: Sequence[tuple[str, bytes]] | None,
    ) -> None:
        assert self._producer is not None
        while True:
            try:
                self._producer.produce(
                    topic,
                    key=key.encode() if key else None,
                    value=value,
                    headers=list(headers) if headers else None,
                )
                return
            except BufferError:
                self._producer.poll(0.1)

    def _test_hook(self, point: str) -> None:
        if self._hook == point:
            log.warning("test hook %s: killing the process", point)
            logging.shutdown()
            os.kill(os.getpid(), signal.SIGKILL)
