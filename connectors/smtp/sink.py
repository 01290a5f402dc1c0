"""The SMTP sink: ReplyCommands in, mail out, a DeliveryEvent for every outcome.

Lifecycle (one asyncio task; the transactions of step 2c run in a worker thread meanwhile):

1. start: create the state topic if missing, check that it and the retry tiers have as many
   partitions as ``mail.commands`` (a command's state and retries live on its partition number),
   ``init_transactions()`` (aborts whatever a previous process with the same instance id left
   open), subscribe to ``mail.commands`` and every retry tier topic (one consumer, group
   ``smtp.group_id``, static membership, range assignment so that partition P of every topic goes
   to one instance); on every partition assignment the state partitions of the assigned partition
   numbers are read back, and only those.
2. per batch of records:
   a. retry records not yet due: pause their partition and seek back to them, to be resumed at
      due time -- other tiers and new commands keep flowing;
   b. drop what the state says is finished (DONE, SCHEDULED) or was already claimed in the batch;
      an INTENT left by a dead process becomes an UNKNOWN outcome and is rescheduled;
   c. send through ``pool_size`` slots (rate limits per relay and domain): a command takes a
      slot with its state INTENT (attempt, Message-ID, pending recipients) committed, and gives
      it back when its outcome is committed -- DeliveryEvents (one per recipient), the new
      state, retry or DLQ records. Each round is one Kafka transaction holding the outcomes that
      came in since the last round and the intents of the commands taking the freed slots;
      their sends go up to the content while it commits, the final "." only once it has;
      a RenderError is a FAILED outcome with its reason, and nothing is sent; a recipient on
      the suppression list (``kafka.topics.suppressions``, followed while running by
      :class:`~connectors.smtp.suppression.SuppressionTable`) is not sent to: SUPPRESSED;
   d. the last round also commits the consumer offsets of the batch (KIP-447 style, fenced by
      the consumer group generation).

Rebalances: the rebalance callbacks run inside ``consume()``, which the loop calls only between
batches, once every send of the batch has its outcome committed together with the batch's offsets
(step d). So when a partition is revoked nothing of it is in flight, and the new owner reads back
DONE/SCHEDULED states and the committed offsets: a clean rebalance (an instance added, or stopped
with SIGTERM) sends nothing twice. The group waits for a busy instance to finish its batch
(bounded by ``max.poll.interval.ms``) before it moves partitions; a batch starts no new send after
half of that interval (``batch_budget_s``) and leaves the rest to the next batch, so it never
outlives its membership and sends what a new owner sends too.

Retention: between batches, DONE states older than ``smtp.state_retention`` become tombstones (one
transaction); a command whose ``created_at`` is older than the retention and has no state is not
sent but answered FAILED ("older than the state retention"), since its state may be pruned.

A crash leaves at most ``pool_size`` commands in INTENT: on restart their records are consumed
again (the batch's offsets were not committed), each such attempt is reported UNKNOWN and resent
later with the same Message-ID; the commands already recorded are skipped, the others are sent.

The sink's collaborators, one concern each: :mod:`~connectors.smtp.admission` (step 2b: what
the state says a record needs), :mod:`~connectors.smtp.rounds` (step 2c-d: slots, rounds,
offsets), :mod:`~connectors.smtp.sender` (one command's send), :mod:`~connectors.smtp.lanes`
(the transactional producers the rounds commit on).
"""

from __future__ import annotations

import asyncio
import logging
import socket
from collections.abc import Callable, Sequence
from datetime import datetime
from functools import partial

from confluent_kafka import Consumer, Message, TopicPartition

from connectors.core.avro.serde import AvroSerde
from connectors.core.config import MailtapConfig
from connectors.core.errors import RegistryUnavailable
from connectors.core.kafka.acls import sink_acls
from connectors.core.kafka.clients import consumer_config
from connectors.core.kafka.permissions import check_created, check_permissions
from connectors.smtp.admission import CommandAdmission
from connectors.smtp.config import SmtpSinkSettings
from connectors.smtp.lanes import CommitLanes
from connectors.smtp.metrics import SinkMetrics
from connectors.smtp.recorder import Work, now_utc, to_ms
from connectors.smtp.render import BlobFetcher
from connectors.smtp.retry import DueGate, RetryInfo
from connectors.smtp.rounds import DeliveryRounds
from connectors.smtp.sender import CommandSender
from connectors.smtp.state import (
    StateStore,
    check_copartitioned,
    ensure_state_topic,
    partition_count,
    partition_counts,
    read_state,
)
from connectors.smtp.suppression import SuppressionTable
from connectors.smtp.topics import ensure_sink_topics
from connectors.smtp.transports import open_transport

log = logging.getLogger(__name__)
#: The start line: shown at the default (WARNING) level too, see mailtap/logs.py.
lifecycle = logging.getLogger(f"mailtap.lifecycle.{__name__}")

#: Poll timeout: short, so due retries are resumed and a stop request is seen promptly.
POLL_TIMEOUT_S = 0.2
#: How often (by the sink's clock) the state is scanned for DONE states past the retention: the
#: retention is days, so a scan every few minutes keeps the topic within it at little cost.
PRUNE_INTERVAL_MS = 10 * 60 * 1000
#: Tombstones per transaction, so a first prune of a large backlog does not make one huge one.
PRUNE_CHUNK = 5000
#: max.poll.interval.ms unless kafka.client_properties sets it: one SMTP round may take minutes
#: when the relay is slow (data_timeout).
MAX_POLL_INTERVAL_MS = 600_000
#: How long a partition whose next command could not be decoded for want of the schema registry
#: waits before it is read again.
REGISTRY_RETRY_MS = 5_000


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
        self.transport = open_transport(settings)
        """The way out (smtp.transport): a relay's session pool, or Microsoft Graph."""
        self.suppressions = (
            SuppressionTable(config.kafka, config.kafka.topics.suppressions)
            if settings.suppression.enabled
            else None
        )
        self.gate = DueGate()
        self.metrics = metrics or SinkMetrics()
        self.instance_id = settings.instance_id or socket.gethostname()
        self.records_total = 0
        self.states = StateStore()
        """The in-memory copy of the state topic (the owned partitions'), shared by the lanes."""
        self.admission = CommandAdmission(settings, self.commands_serde, self.states, clock)
        self.sender = CommandSender(
            settings,
            self.transport,
            suppressions=self.suppressions,
            fetch_blob=fetch_blob,
            tracing=self.kafka.tracing.enabled,
        )
        self.lanes = CommitLanes(
            self.kafka,
            settings,
            instance_id=self.instance_id,
            delivery_serde=self.delivery_serde,
            states=self.states,
            clock=clock,
            metrics=self.metrics,
        )
        self.rounds = DeliveryRounds(settings, clock=clock, send=self.sender.send)
        self._consumer: Consumer | None = None
        self._owned: set[tuple[str, int]] = set()
        self._max_poll_interval_ms = int(
            self.kafka.client_properties.get("max.poll.interval.ms", MAX_POLL_INTERVAL_MS)
        )
        self.batch_budget_s = self._max_poll_interval_ms / 1000 / 2
        """A batch starts no new send after this long; the rest goes back to the next batch.

        Half of max.poll.interval.ms, so the sends in flight can still finish inside it: past it
        librdkafka leaves the group, the partitions move, and a batch that went on sending
        would send what the new owner sends too."""
        self._last_prune_ms: int | None = None
        self._stop: asyncio.Event | None = None
        self.pruned_total = 0
        """State records turned into tombstones (past the retention)."""

    @property
    def events_total(self) -> int:
        return self.lanes.events_total

    @property
    def sent_total(self) -> int:
        return self.sender.sent_total

    @property
    def rounds_total(self) -> int:
        """Transactions written (each records a group of outcomes and intents)."""
        return self.rounds.rounds_total

    # --- start / stop -------------------------------------------------------------------------

    def start(self) -> None:
        # Every permission first, before a command is read or a mail sent: a refusal is one
        # sentence naming the ACL (connectors.core.kafka.permissions), never a sink that runs
        # "healthy" without the suppression list, nor one that sends and then cannot record it.
        # The check waits for the cluster as every start does ("cannot reach Kafka"); the topics
        # it reads or writes that do not exist yet it creates (a sink started before the
        # streams worker or the admin's `topics ensure`), then checks them too.
        # The transport's own check first (Graph: a token for the application), so a wrong
        # secret stops the start with its sentence before anything of Kafka is touched.
        self.transport.start()
        needed = sink_acls(self.kafka, self.settings)
        missing = check_permissions(self.kafka, needed)
        ensure_sink_topics(
            self.kafka, self.settings.retry_tiers, suppressions=self.suppressions is not None
        )
        commands = self.topics.commands
        ensure_state_topic(
            self.kafka, self.settings.state_topic, partition_count(self.kafka, commands)
        )
        check_created(self.kafka, needed, missing)
        check_copartitioned(
            partition_counts(self.kafka, [commands, *self.retry_topics, self.settings.state_topic]),
            commands,
        )
        # A registry that refuses DeliveryEvent stops the sink here, with the sentence, not at its
        # first delivery event (connectors.core.avro.registry). Retry topics carry the
        # commands' original bytes: nothing of ours to register there.
        self.delivery_serde.prepare(self.topics.delivery)
        if self.suppressions is not None:
            self.suppressions.start()  # read to its end: a restart honours every entry
        self.lanes.open()
        consumer = Consumer(
            consumer_config(
                self.kafka,
                self.settings.group_id,
                max_poll_interval_ms=self._max_poll_interval_ms,
                # Static membership: a restarted instance takes its partitions back at once
                # instead of waiting for the dead member's session to time out.
                group_instance_id=self.instance_id,
                # Range gives partition P of every subscribed topic (same counts, checked
                # above) to one member: the owner of a command owns its retries and its state.
                partition_assignment_strategy="range",
            )
        )
        consumer.subscribe(
            [self.topics.commands, *self.retry_topics],
            on_assign=self._on_assign,
            on_revoke=self._on_revoke,
        )
        self._consumer = consumer
        lifecycle.info(
            "smtp sink started instance=%s relay=%s commands=%s tiers=%s pool=%d",
            self.instance_id,
            self.transport.description,
            self.topics.commands,
            ",".join(self.settings.retry_tiers),
            self.settings.pool_size,
            extra={"instance_id": self.instance_id},
        )

    def _on_assign(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        # Another instance may have finished commands of these partitions: read their state
        # again (only theirs: the rest of the state topic belongs to the other instances).
        before = {p for _, p in self._owned}
        self._owned |= {(p.topic, p.partition) for p in partitions}
        new = {p for _, p in self._owned} - before
        loaded = read_state(self.kafka, self.settings.state_topic, new)
        for cid, state in loaded.states.items():
            self.states.put(cid, loaded.partitions[cid], state)
        log.info(
            "assigned %s; state of partitions %s read back: %d commands",
            sorted((p.topic, p.partition) for p in partitions),
            sorted(new),
            len(loaded),
        )

    def _on_revoke(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        # Nothing of these partitions is in flight: see "Rebalances" in the module docstring.
        self.gate.forget([(p.topic, p.partition) for p in partitions])
        before = {p for _, p in self._owned}
        self._owned -= {(p.topic, p.partition) for p in partitions}
        self.states.drop_partitions(before - {p for _, p in self._owned})
        log.info("revoked %s", sorted((p.topic, p.partition) for p in partitions))

    async def close(self) -> None:
        await self.transport.close()
        if self.suppressions is not None:
            self.suppressions.close()
        if self._consumer is not None:
            self._consumer.close()
            self._consumer = None
        self.lanes.close()

    async def run(self, stop: asyncio.Event) -> None:
        """Process until ``stop`` is set; always closes."""
        self._stop = stop
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
        await self._prune()
        if records:
            await self._process(records)
            self.records_total += len(records)
            self.metrics.sessions_opened.set(self.transport.opened)
            self.metrics.paused_partitions.set(len(self.gate.paused))
        else:
            await asyncio.sleep(0)
        self.metrics.observe_consumer(self._consumer)
        self.metrics.round_completed()
        return len(records)

    async def _prune(self) -> None:
        """Tombstones for the DONE states past ``smtp.state_retention`` (every PRUNE_INTERVAL_MS)."""
        now_ms = to_ms(self.clock())
        if self._last_prune_ms is not None and now_ms - self._last_prune_ms < PRUNE_INTERVAL_MS:
            return
        self._last_prune_ms = now_ms
        retention_ms = int(self.settings.state_retention_seconds * 1000)
        expired = self.states.expired(now_ms, retention_ms)
        for start in range(0, len(expired), PRUNE_CHUNK):
            chunk = expired[start : start + PRUNE_CHUNK]
            await asyncio.to_thread(
                self.lanes.first.transaction, partial(self.lanes.first.write_tombstones, chunk)
            )
            self.pruned_total += len(chunk)
        if expired:
            log.info(
                "state pruned: %d DONE states older than %s, %d left",
                len(expired),
                self.settings.state_retention,
                len(self.states),
            )

    def _resume_due(self) -> None:
        assert self._consumer is not None
        due = self.gate.release_due(to_ms(self.clock()))
        if due:
            self._consumer.resume([TopicPartition(t, p) for t, p in due])
            log.debug("resumed %s", due)

    # --- one batch ----------------------------------------------------------------------------

    def _park(
        self,
        topic: str,
        partition: int,
        offset: int,
        due_ms: int,
        held: set[tuple[str, int]],
        offsets: dict[tuple[str, int], int],
    ) -> None:
        """Pause the partition at ``offset`` until ``due_ms``: nothing past it is read or
        committed in this batch, and the gate resumes it then."""
        held.add((topic, partition))
        offsets[(topic, partition)] = offset
        assert self._consumer is not None
        self._consumer.pause([TopicPartition(topic, partition)])
        self._consumer.seek(TopicPartition(topic, partition, offset))
        self.gate.hold(topic, partition, due_ms)

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
                self._park(topic, partition, offset, info.due_ms, held, offsets)
                continue
            offsets[tp] = offset + 1
            try:
                item = self.admission.admit(record, info, claimed, dead)
            except RegistryUnavailable as exc:
                # Not a bad record: the registry is down. Park the partition at this record and
                # read it again later, as a retry not due yet is parked; dead-lettering it lost
                # the reply (found by `mailtap soak`, a registry-down fault).
                log.warning(
                    "%s/%d at %d waits for the schema registry (trying again in %.0f s): %s",
                    topic,
                    partition,
                    offset,
                    REGISTRY_RETRY_MS / 1000,
                    exc,
                )
                self._park(topic, partition, offset, to_ms(now) + REGISTRY_RETRY_MS, held, offsets)
                continue
            if item is not None:
                work.append(item)

        to_send: list[Work] = []
        known: list[Work] = []  # outcome known without sending: recovered, given up, unrenderable
        for item in work:
            ready = not item.recovered and self.admission.prepare(item, now)
            (to_send if ready else known).append(item)
        # Within one batch, a relay that cannot be reached is not tried again for every message
        # (a batch must end well inside max.poll.interval.ms); the next batch tries afresh.
        self.transport.reset_breaker()
        await self.rounds.deliver(
            self.lanes.recorders,
            to_send,
            known,
            dead,
            offsets,
            consumer=self._consumer,
            budget_s=self.batch_budget_s,
            stop=self._stop,
        )
