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

Test hook: ``MAILTAP_SMTP_SINK_TEST_HOOK=kill_after_intent|kill_after_send`` makes the process
SIGKILL itself at that point: after the first intents are committed, or once every send in
flight has its reply and before those outcomes are recorded. Never set it in production.
"""

from __future__ import annotations

import asyncio
import logging
import math
import os
import signal
import socket
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from functools import partial

from confluent_kafka import Consumer, KafkaException, Message, Producer, TopicPartition

from connectors.core import tracing
from connectors.core.avro.serde import AvroSerde
from connectors.core.config import MailtapConfig
from connectors.core.kafka.acls import sink_acls
from connectors.core.kafka.clients import consumer_config, init_transactions, producer_config
from connectors.core.kafka.permissions import (
    check_created,
    check_permissions,
    denied_transactional_id,
)
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
from connectors.smtp.render import BlobFetcher, ascii_domain_of, normalize_address, render
from connectors.smtp.retry import DueGate, RetryInfo, expired
from connectors.smtp.state import (
    StateStore,
    check_copartitioned,
    ensure_state_topic,
    partition_count,
    partition_counts,
    read_state,
)
from connectors.smtp.suppression import SuppressionTable, screen
from connectors.smtp.topics import ensure_sink_topics
from connectors.smtp.transport import SmtpConnectionPool

log = logging.getLogger(__name__)
#: The start line: shown at the default (WARNING) level too, see mailtap/logs.py.
lifecycle = logging.getLogger(f"mailtap.lifecycle.{__name__}")

TEST_HOOK_ENV = "MAILTAP_SMTP_SINK_TEST_HOOK"
#: Poll timeout: short, so due retries are resumed and a stop request is seen promptly.
POLL_TIMEOUT_S = 0.2
PRODUCER_COMPRESSION = "lz4"
#: Transactional producers of one sink, each committing its own rounds, taken in turn. A
#: producer has one transaction at a time and, right after a commit, its next one is often
#: refused by the coordinator still writing the markers of the last (CONCURRENT_TRANSACTIONS,
#: retried by librdkafka after ~20 ms, measured in ~1 of 5 back-to-back commits). In turn,
#: each producer's commits are two rounds apart; a round cut short by GROUP_WAIT_S does not
#: hold the next one either.
COMMIT_LANES = 2
#: Cap of an outcome's wait for the replies of its group (see SmtpSink._deliver): a slow send
#: (a rate limit, a slow relay) must not hold the other outcomes, and their slots, for long.
GROUP_WAIT_S = 0.05
#: How often (by the sink's clock) the state is scanned for DONE states past the retention: the
#: retention is days, so a scan every few minutes keeps the topic within it at little cost.
PRUNE_INTERVAL_MS = 10 * 60 * 1000
#: Tombstones per transaction, so a first prune of a large backlog does not make one huge one.
PRUNE_CHUNK = 5000
#: max.poll.interval.ms unless kafka.client_properties sets it: one SMTP round may take minutes
#: when the relay is slow (data_timeout).
MAX_POLL_INTERVAL_MS = 600_000


@dataclass
class _Round:
    """One transaction of :meth:`SmtpSink._deliver` on one lane."""

    lane: DeliveryRecorder
    finished: Sequence[Work]
    dead: Sequence[tuple[Message, str, str]]
    starting: Sequence[Work]
    """Commands whose INTENT this round records; they are sent once it has committed."""
    offsets: dict[tuple[str, int], int] | None
    surplus: int = 0
    """Slots freed by this round's outcomes and not taken by its intents: free once committed."""
    committed: asyncio.Event = field(default_factory=asyncio.Event)
    """Set once the round has committed: the final "." of its ``starting`` may go out."""


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
        self.suppressions = (
            SuppressionTable(config.kafka, config.kafka.topics.suppressions)
            if settings.suppression.enabled
            else None
        )
        self.limiter = SendRateLimiter(settings.rate, settings.domain_rates)
        self.gate = DueGate()
        self.metrics = metrics or SinkMetrics()
        self.instance_id = settings.instance_id or socket.gethostname()
        self.sent_total = 0
        self.records_total = 0
        self.rounds_total = 0
        """Transactions written (each records a group of outcomes and intents)."""
        self._hook = os.environ.get(TEST_HOOK_ENV, "")
        self._recorders: list[DeliveryRecorder] = []
        """One per commit lane (COMMIT_LANES transactional producers), sharing one StateStore."""
        self._events_closed = 0
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
    def recorder(self) -> DeliveryRecorder:
        """The first lane's recorder: the state store (shared) and the transactions outside a
        batch (pruning) go through it."""
        if not self._recorders:
            raise RuntimeError("the sink is not started")
        return self._recorders[0]

    @property
    def events_total(self) -> int:
        return self._events_closed + sum(r.events_total for r in self._recorders)

    # --- start / stop -------------------------------------------------------------------------

    def start(self) -> None:
        # Every permission first, before a command is read or a mail sent: a refusal is one
        # sentence naming the ACL (connectors.core.kafka.permissions), never a sink that runs
        # "healthy" without the suppression list, nor one that sends and then cannot record it.
        # The check waits for the cluster as every start does ("cannot reach Kafka"); the topics
        # it reads or writes that do not exist yet it creates (a sink started before the
        # streams worker or the admin's `topics ensure`), then checks them too.
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
        states = StateStore()
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
                refused = denied_transactional_id(
                    self.kafka,
                    exc,
                    self.transactional_id(lane),
                    prefix=f"{self.settings.group_id}.",
                )
                raise refused or exc from None
            self._recorders.append(
                DeliveryRecorder(
                    producer,
                    self.settings,
                    self.topics,
                    self.delivery_serde,
                    self.clock,
                    self.metrics,
                    tracing=self.kafka.tracing.enabled,
                    states=states,
                )
            )
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
            "smtp sink started instance=%s relay=%s:%d commands=%s tiers=%s pool=%d",
            self.instance_id,
            self.settings.host,
            self.settings.port,
            self.topics.commands,
            ",".join(self.settings.retry_tiers),
            self.settings.pool_size,
            extra={"instance_id": self.instance_id},
        )

    def transactional_id(self, lane: int) -> str:
        """``<group_id>.<instance_id>`` for the first lane (the id of earlier versions, so an
        upgraded instance still fences its predecessor), ``#<lane>`` appended for the others
        (``#`` is in no host name, so no other instance's id can be one of these)."""
        base = f"{self.settings.group_id}.{self.instance_id}"
        return base if lane == 0 else f"{base}#{lane}"

    def _on_assign(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        # Another instance may have finished commands of these partitions: read their state
        # again (only theirs: the rest of the state topic belongs to the other instances).
        before = {p for _, p in self._owned}
        self._owned |= {(p.topic, p.partition) for p in partitions}
        new = {p for _, p in self._owned} - before
        loaded = read_state(self.kafka, self.settings.state_topic, new)
        for cid, state in loaded.states.items():
            self.recorder.states.put(cid, loaded.partitions[cid], state)
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
        self.recorder.states.drop_partitions(before - {p for _, p in self._owned})
        log.info("revoked %s", sorted((p.topic, p.partition) for p in partitions))

    async def close(self) -> None:
        await self.pool.close()
        if self.suppressions is not None:
            self.suppressions.close()
        if self._consumer is not None:
            self._consumer.close()
            self._consumer = None
        for recorder in self._recorders:
            recorder.producer.flush(10)
            self._events_closed += recorder.events_total
        self._recorders = []

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
            self.metrics.sessions_opened.set(self.pool.opened)
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
        expired = self.recorder.states.expired(now_ms, retention_ms)
        for start in range(0, len(expired), PRUNE_CHUNK):
            chunk = expired[start : start + PRUNE_CHUNK]
            await asyncio.to_thread(
                self.recorder.transaction, partial(self.recorder.write_tombstones, chunk)
            )
            self.pruned_total += len(chunk)
        if expired:
            log.info(
                "state pruned: %d DONE states older than %s, %d left",
                len(expired),
                self.settings.state_retention,
                len(self.recorder.states),
            )

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

        to_send: list[Work] = []
        known: list[Work] = []  # outcome known without sending: recovered, given up, unrenderable
        for item in work:
            (to_send if not item.recovered and self._prepare(item, now) else known).append(item)
        # Within one batch, a relay that cannot be reached is not tried again for every message
        # (a batch must end well inside max.poll.interval.ms); the next batch tries afresh.
        self.pool.reset_breaker()
        await self._deliver(to_send, known, dead, offsets)

    async def _deliver(
        self,
        to_send: Sequence[Work],
        known: Sequence[Work],
        dead: Sequence[tuple[Message, str, str]],
        offsets: dict[tuple[str, int], int],
    ) -> None:
        """Send through ``pool_size`` slots, recording each outcome as soon as it is known.

        A command holds a slot from the round that records its INTENT to the round that records
        its outcome, so at most ``pool_size`` commands are ever INTENT at once: a kill -9 leaves
        at most that many UNKNOWN (and resent), however large the batch. A round is one
        transaction on one of the COMMIT_LANES producers: the outcomes that came in (a pool's
        worth, or what came within GROUP_WAIT_S) and the intents of the commands taking the
        slots these outcomes free (or slots already free), so about a quarter of a transaction
        per mail with the default pool. The sends of a round's intents start with the round,
        render and go as far as DATA and the content while the round commits in a worker
        thread, and write their final "." once it has committed: the relay reads them while
        the broker commits, and can accept none of them before their INTENT is recorded. A
        slot freed by a round's outcome is only taken by that round's intents, or by later
        rounds once it has committed, so whichever rounds a kill interrupts, the INTENTs
        without an outcome never exceed ``pool_size``. The consumer offsets go with the last
        round, once every other round has committed.
        """
        queue = deque(to_send)
        unsent, replied = list(known), list[Work]()  # outcomes not yet in a round
        dead_letters = list(dead)
        sending: dict[asyncio.Task[None], Work] = {}
        rounds: dict[asyncio.Task[None], _Round] = {}
        idle = list(self._recorders)
        free = self.settings.pool_size
        group = self.settings.pool_size
        group_deadline = math.inf
        started = time.monotonic()
        try:
            while True:
                stopping = self._stop is not None and self._stop.is_set()
                if queue and (stopping or time.monotonic() - started > self.batch_budget_s):
                    # A stop request (SIGTERM) ends the batch as soon as the sends in flight
                    # have their outcomes: the rest is the next owner's, unsent here.
                    self._put_back(queue, offsets, "stop requested" if stopping else "")
                    queue.clear()
                if not queue and not sending and not rounds:
                    round_ = _Round(idle[0], [*unsent, *replied], dead_letters, [], offsets)
                    await self._record(round_)
                    return
                # Nothing is recorded while every lane is busy: what comes in meanwhile joins
                # the next round. A round also waits (at most GROUP_WAIT_S) for a pool's worth
                # of replies when the sends in flight can still make one: one transaction per
                # pool of mails. Once nothing is left to start, the outcomes wait for the last
                # round.
                grouped = (
                    len(replied) >= group
                    or len(replied) + len(sending) < group
                    or time.monotonic() >= group_deadline
                )
                while idle and queue and grouped and (unsent or replied or dead_letters or free):
                    # The slots of ``replied`` go to this round's intents first.
                    count = min(free + len(replied), len(queue))
                    round_ = _Round(
                        # The lane idle longest: its last markers are most likely written.
                        idle.pop(0),
                        [*unsent, *replied],
                        dead_letters,
                        [queue.popleft() for _ in range(count)],
                        None,
                        surplus=max(0, len(replied) - count),
                    )
                    free -= max(0, count - len(replied))
                    unsent, replied, dead_letters = [], [], []
                    rounds[asyncio.create_task(self._record(round_))] = round_
                    group_deadline = math.inf
                    # The sends start now and stop before their final "." until the round has
                    # committed: the relay reads envelopes and contents while the broker commits.
                    budget = max(0.0, self.settings.max_rate_wait - (time.monotonic() - started))
                    for item in round_.starting:
                        task = asyncio.create_task(self._send(item, budget, round_.committed))
                        sending[task] = item
                done, _ = await asyncio.wait(
                    [*sending, *rounds],
                    timeout=max(0.0, group_deadline - time.monotonic()) if replied else None,
                    return_when=asyncio.FIRST_COMPLETED,
                )
                for task in done:
                    if task in sending:
                        if not replied:
                            group_deadline = time.monotonic() + GROUP_WAIT_S
                        replied.append(sending.pop(task))
                        task.result()  # an unexpected error stops the sink, as a failed record does
                        continue
                    round_ = rounds.pop(task)
                    task.result()
                    idle.append(round_.lane)
                    free += round_.surplus
                    if round_.starting:
                        self._test_hook("kill_after_intent")
                    round_.committed.set()
                if replied and not sending:
                    self._test_hook("kill_after_send")
        finally:
            for task in sending:
                task.cancel()
            await asyncio.gather(*sending, *rounds, return_exceptions=True)

    def _put_back(
        self, unstarted: Sequence[Work], offsets: dict[tuple[str, int], int], why: str
    ) -> None:
        """Leave ``unstarted`` (no INTENT yet) to the next batch: the batch's offsets stop before
        the first of them on each partition, and the consumer goes back there. Records after it
        that were handled without a send (skipped, recovered, dead-lettered) come again: the
        state skips the first two; an undecodable one is dead-lettered a second time."""
        assert self._consumer is not None
        first: dict[tuple[str, int], int] = {}
        for item in unstarted:
            topic, partition, offset = (
                item.record.topic(),
                item.record.partition(),
                item.record.offset(),
            )
            assert topic is not None and partition is not None and offset is not None
            first[(topic, partition)] = min(first.get((topic, partition), offset), offset)
        for (topic, partition), offset in first.items():
            offsets[(topic, partition)] = min(offsets[(topic, partition)], offset)
            self._consumer.seek(TopicPartition(topic, partition, offset))
        log.log(
            logging.INFO if why else logging.WARNING,
            "%s: %d commands left to the next batch",
            why or f"batch ran past {self.batch_budget_s:.0f}s (half of max.poll.interval.ms)",
            len(unstarted),
        )

    async def _record(self, round_: _Round) -> None:
        """One transaction: the round's outcomes and dead letters, its intents, its offsets."""
        now = self.clock()
        recorder = round_.lane

        def write() -> None:
            recorder.write_outcomes(round_.finished, round_.dead, now)
            recorder.write_intents(round_.starting)

        # The records are queued here, in the loop (the state store is the loop's); the commit
        # waits for the broker in a thread (librdkafka releases the GIL), the sends go on.
        recorder.stage(write)
        await asyncio.to_thread(recorder.commit, round_.offsets, self._consumer)
        self.rounds_total += 1

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
        if state is None and self._older_than_retention(command):
            item = Work(record, command, attempt=attempt, recipients=None)
            item.refused = (
                f"not sent: created at {command['created_at']:%Y-%m-%dT%H:%M:%SZ}, longer ago than "
                f"smtp.state_retention={self.settings.state_retention}: its state may have been "
                f"pruned, so it may have been sent already (a replay of old commands?)"
            )
        elif state is None:
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

    def _older_than_retention(self, command: dict[str, object]) -> bool:
        created = command.get("created_at")
        retention = timedelta(seconds=self.settings.state_retention_seconds)
        return isinstance(created, datetime) and created < self.clock() - retention

    def _prepare(self, item: Work, now: datetime) -> bool:
        """Cheap checks before the intent; False (with outcomes set) when nothing is to be sent.

        Rendering itself happens in :meth:`_send`, after the intent: it costs about a millisecond
        of CPU per message, which then overlaps with the relay's work on the other sessions.
        """
        if item.refused:
            log.warning("refused command_id=%s: %s", item.command_id, item.refused)
            item.outcomes = [
                RecipientOutcome(r, DeliveryStatus.FAILED, diagnostic=item.refused)
                for r in all_recipients(item.command)
            ]
            return False
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
            sender = normalize_address(
                str(item.command["from"]["address"]), "from.address", utf8=True
            )
            domain = ascii_domain_of(sender, "from.address")  # A-labels, as render() uses
        except RenderError as exc:
            self._render_failed(item, exc)
            return False
        item.message_id = message_id_for(item.command_id, domain)
        return True

    def _render_failed(self, item: Work, exc: RenderError) -> None:
        log.warning("render failed command_id=%s reason=%s", item.command_id, exc.reason)
        item.outcomes = [RecipientOutcome(None, DeliveryStatus.FAILED, diagnostic=exc.reason)]

    async def _send(self, item: Work, max_rate_wait: float, committed: asyncio.Event) -> None:
        """Render and send ``item``, its final "." only once its INTENT has ``committed``.

        Ends only after that commit too, whatever the outcome (nothing to send, refused before
        DATA): an outcome must never be recorded before its intent.
        """
        if not self.kafka.tracing.enabled:
            await self._attempt(item, max_rate_wait, committed)
        else:
            # The send is a span under the command's; its outcome events carry it on.
            with tracing.span_headers("smtp.send", item.record.headers()) as headers:
                item.trace = headers
                await self._attempt(item, max_rate_wait, committed)
        await committed.wait()

    async def _attempt(self, item: Work, max_rate_wait: float, committed: asyncio.Event) -> None:
        try:
            rendered = render(
                item.command,
                fetch_blob=self.fetch_blob,
                verp_domain=self.settings.verp_domain,
                return_path=self.settings.from_address,
                recipients=item.recipients,
                unsubscribe=self.settings.suppression.list_unsubscribe,
            )
        except RenderError as exc:
            self._render_failed(item, exc)
            return
        # Suppressed recipients are not sent to: their outcome is SUPPRESSED, the others go on.
        rendered, item.outcomes = screen(rendered, self.suppressions)
        if not rendered.recipients:
            return
        if len(rendered.data) > self.settings.max_message_bytes:
            reason = (
                f"message of {len(rendered.data)} bytes exceeds "
                f"smtp.max_message_bytes={self.settings.max_message_bytes}"
            )
            item.outcomes += [
                RecipientOutcome(r, DeliveryStatus.FAILED, diagnostic=reason)
                for r in rendered.recipients
            ]
            return
        if not await self.limiter.acquire(rendered.recipients, max_rate_wait):
            reason = (
                f"rate limit: no sending slot for these recipient domains within "
                f"smtp.max_rate_wait={self.settings.max_rate_wait:g}s of the batch's start "
                f"(smtp.rate / smtp.domain_rates)"
            )
            item.outcomes += [
                RecipientOutcome(r, DeliveryStatus.DEFERRED, diagnostic=reason)
                for r in rendered.recipients
            ]
            return
        try:
            report = await self.pool.send(rendered, committed)
            item.outcomes += classify_report(rendered.recipients, report)
            self.sent_total += 1
        except SmtpTransportError as exc:
            if isinstance(exc, SmtpAuthError | SmtpTlsError):
                log.error("relay refused us (check smtp settings): %s", exc)
            item.outcomes += classify_error(rendered.recipients, exc)
        log.debug(
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
