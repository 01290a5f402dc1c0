"""The SMTP sink: ReplyCommands in, mail out, a DeliveryEvent for every outcome.

Lifecycle (one asyncio task; Kafka calls are short and made between SMTP rounds):

1. start: create the state topic if missing, ``init_transactions()`` (aborts whatever a previous
   process with the same instance id left open), subscribe to
   ``mail.commands`` and every retry tier topic (one consumer, group ``smtp.group_id``, static
   membership); on every partition assignment the state topic is read back whole.
2. per batch of records:
   a. retry records not yet due: pause their partition and seek back to them, to be resumed at
      due time -- other tiers and new commands keep flowing;
   b. drop what the state says is finished (DONE, SCHEDULED) or was already claimed in the batch;
      an INTENT left by a dead process becomes an UNKNOWN outcome and is rescheduled;
   c. **intent transaction**: state INTENT (attempt, Message-ID, pending recipients) for each
      command about to be sent, committed;
   d. render and send concurrently (pool size = concurrency, rate limits per relay and domain);
      a RenderError is a FAILED outcome with its reason, and nothing is sent;
   e. **outcome transaction**: DeliveryEvents (one per recipient), the new state, retry or DLQ
      records, and the consumer offsets, in one Kafka transaction (KIP-447 style, fenced by the
      consumer group generation).

A crash between c and e leaves INTENT: on restart the record is consumed again (its offset was
not committed) and the attempt is reported UNKNOWN and resent later with the same Message-ID.
Everything before c is repeatable; everything after e is recorded.

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
from datetime import datetime

from confluent_kafka import Consumer, Message, Producer, TopicPartition

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
from connectors.smtp.metrics import SinkMetrics
from connectors.smtp.ratelimit import SendRateLimiter
from connectors.smtp.recorder import DeliveryRecorder, Work, all_recipients, now_utc, to_ms
from connectors.smtp.render import BlobFetcher, normalize_address, render
from connectors.smtp.retry import DueGate, RetryInfo, expired
from connectors.smtp.state import ensure_state_topic, read_state
from connectors.smtp.transport import SmtpConnectionPool

log = logging.getLogger(__name__)

TEST_HOOK_ENV = "MAILTAP_SMTP_SINK_TEST_HOOK"
#: Poll timeout: short, so due retries are resumed and a stop request is seen promptly.
POLL_TIMEOUT_S = 0.2
PRODUCER_COMPRESSION = "lz4"


class SmtpSink:
    """Consumes commands and sends them; see the module docstring for the lifecycle."""

    def __init__(
        self,
        config: MailtapConfig,
        settings: SmtpSinkSettings,
        *,
        fetch_blob: BlobFetcher | None = None,
        clock: Callable[[], datetime] = now_utc,
        metrics: SinkMetrics | None = None,
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
        self.metrics = metrics or SinkMetrics()
        self.instance_id = settings.instance_id or socket.gethostname()
        self.sent_total = 0
        self.records_total = 0
        self._hook = os.environ.get(TEST_HOOK_ENV, "")
        self._recorder: DeliveryRecorder | None = None
        self._events_closed = 0
        self._consumer: Consumer | None = None

    @property
    def recorder(self) -> DeliveryRecorder:
        if self._recorder is None:
            raise RuntimeError("the sink is not started")
        return self._recorder

    @property
    def events_total(self) -> int:
        return self._recorder.events_total if self._recorder else self._events_closed

    # --- start / stop -------------------------------------------------------------------------

    def start(self) -> None:
        ensure_topics(self.kafka, retry_tiers=self.settings.retry_tiers)
        ensure_state_topic(self.kafka, self.settings.state_topic)
        # A registry that refuses DeliveryEvent stops the sink here, with the sentence, not at its
        # first delivery event (connectors.core.schemaregistry). Retry topics carry the
        # commands' original bytes: nothing of ours to register there.
        self.delivery_serde.prepare(self.topics.delivery)
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
        self._recorder = DeliveryRecorder(
            producer, self.settings, self.topics, self.delivery_serde, self.clock, self.metrics
        )
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
            len(self.recorder.states),
        )

    def _on_assign(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        # Another instance may have finished commands of these partitions: read the state again.
        self.recorder.states = read_state(self.kafka, self.settings.state_topic)
        log.info("assigned %s", sorted((p.topic, p.partition) for p in partitions))

    def _on_revoke(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        self.gate.forget([(p.topic, p.partition) for p in partitions])
        log.info("revoked %s", sorted((p.topic, p.partition) for p in partitions))

    async def close(self) -> None:
        await self.pool.close()
        if self._consumer is not None:
            self._consumer.close()
            self._consumer = None
        if self._recorder is not None:
            self._recorder.producer.flush(10)
            self._events_closed += self._recorder.events_total
            self._recorder = None

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
        # What is already fetched, without waiting for a full batch (consume() would block until
        # batch_size records or the timeout); only an empty queue waits.
        records = self._consumer.consume(self.settings.batch_size, timeout=0)
        if not records:
            records = self._consumer.consume(self.settings.batch_size, timeout=POLL_TIMEOUT_S)
        if records:
            await self._process(records)
            self.records_total += len(records)
            self.metrics.sessions_opened.set(self.pool.opened)
            self.metrics.paused_partitions.set(len(self.gate.paused))
        else:
            await asyncio.sleep(0)
        self.metrics.round_completed()
        return len(records)

    def _resume_due(self) -> None:
        assert self._consumer is not None
        due = self.gate.release_due(to_ms(self.clock()))
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
            if info is not None and info.due_ms > to_ms(now):
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
        # Within one batch, a relay that cannot be reached is not tried again for every message
        # (a batch must end well inside max.poll.interval.ms); the next batch tries afresh.
        self.pool.reset_breaker()
        if to_send:
            self.recorder.transaction(lambda: self.recorder.write_intents(to_send))
            self._test_hook("kill_after_intent")
            await asyncio.gather(*(self._send(w) for w in to_send))
            self._test_hook("kill_after_send")
        self.recorder.transaction(
            lambda: self.recorder.write_outcomes(work, dead, now), offsets, self._consumer
        )

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
        state = self.recorder.states.get(cid)
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
        """Cheap checks before the intent; False (with outcomes set) when nothing is to be sent.

        Rendering itself happens in :meth:`_send`, after the intent: it costs about a millisecond
        of CPU per message, which then overlaps with the relay's work on the other sessions.
        """
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
                for r in item.recipients or all_recipients(item.command)
            ]
            return False
        try:
            sender = normalize_address(str(item.command["from"]["address"]), "from.address")
        except RenderError as exc:
            self._render_failed(item, exc)
            return False
        item.message_id = message_id_for(item.command_id, sender.rpartition("@")[2])
        return True

    def _render_failed(self, item: Work, exc: RenderError) -> None:
        log.warning("render failed command_id=%s reason=%s", item.command_id, exc.reason)
        item.outcomes = [RecipientOutcome(None, DeliveryStatus.FAILED, diagnostic=exc.reason)]

    async def _send(self, item: Work) -> None:
        try:
            rendered = render(
                item.command,
                fetch_blob=self.fetch_blob,
                verp_domain=self.settings.verp_domain,
                return_path=self.settings.from_address,
                recipients=item.recipients,
            )
        except RenderError as exc:
            self._render_failed(item, exc)
            return
        if len(rendered.data) > self.settings.max_message_bytes:
            reason = (
                f"message of {len(rendered.data)} bytes exceeds "
                f"smtp.max_message_bytes={self.settings.max_message_bytes}"
            )
            item.outcomes = [
                RecipientOutcome(r, DeliveryStatus.FAILED, diagnostic=reason)
                for r in rendered.recipients
            ]
            return
        if not await self.limiter.acquire(rendered.recipients, self.settings.max_rate_wait):
            reason = (
                f"rate limit: no sending slot for these recipient domains within "
                f"{self.settings.max_rate_wait:g}s (smtp.rate / smtp.domain_rates)"
            )
            item.outcomes = [
                RecipientOutcome(r, DeliveryStatus.DEFERRED, diagnostic=reason)
                for r in rendered.recipients
            ]
            return
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

    def _test_hook(self, point: str) -> None:
        if self._hook == point:
            log.warning("test hook %s: killing the process", point)
            logging.shutdown()
            os.kill(os.getpid(), signal.SIGKILL)
