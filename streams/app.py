"""The faust-streaming app: ``mail.events`` -> by conversation -> guards -> routing -> workflows
-> ``mail.commands``.

Two steps:

- ``mail.events`` (``read_committed``) is re-keyed in faust's fetch loop, without an agent
  (:mod:`streams.inline`): each record by its conversation
  (:mod:`connectors.core.mail.conversation`: the thread root) onto the internal topic
  ``<app_id>-mail-events-by-conversation``, value and headers unchanged; its offset is
  committed only after that send was acknowledged (the commit barrier of :mod:`streams.acks`).
  Tombstones are not forwarded.
- the agent ``mail-conversations`` reads that topic; the lifecycle of one record (one at a time, in
  partition order):

  1. decode the Avro ``MailEvent``;
  2. :class:`~streams.pipeline.Pipeline` admits it (routing, dedupe, loop guards), authenticates
     the sender (in a thread when that needs DNS), runs the workflow;
  3. the ``ReplyCommand``s (key: command id) and ``WorkflowEvent``s (key: instance id) are sent;
  4. the table writes are applied (dedupe mark last) to the in-memory tables at once, so the
     next record sees them, but **their changelog records are sent only after every output
     sent before them was acknowledged** (:mod:`streams.acks`: sends are pipelined, not
     awaited one by one), and faust commits the offset later
     (``processing_guarantee="at_least_once"``), only after all of that (the commit barrier).

A crash anywhere before the changelog writes are durable replays the mail against the old tables and re-emits the same
command ids (``sha256(event key, workflow, step)``: from the input only), which the SMTP sink
absorbs; after 4 the dedupe table stops the replay. faust's ``exactly_once`` mode is not used
(open rebalance bugs, PITFALLS.md).

Tables (``memory://`` store, rebuilt from their changelog topics ``<app_id>-<name>-changelog``
at start, which :mod:`streams.changelogs` creates before faust starts, with the conversation
topic): ``runs`` (dedupe), ``rates`` (reply windows per sender and per recipient,
``streams/README.md``), ``state`` (workflow state). ``runs`` and ``state`` are written to the
partition of the conversation being handled (:mod:`streams.partitions`), so all state of one
conversation lives on one partition, and faust's assignor gives partition N of the conversation
topic and of every changelog to the same worker (equal partition counts, that of
``mail.events``). So **any number of workers with the same app id, up to the partition count
of mail.events, share the load with correct state**; a worker killed with -9 is replaced by the
others after ``session_timeout_seconds``: they restore its partitions' state and re-read from
the committed offsets. ``rates`` keep faust's key partitioner (a sender's window spans
conversations): with N workers each counts the replies it sent, so a sender may get up to N
times ``max_replies`` (``streams/README.md``).

The timer runs time-driven steps (approval reminders) and, hourly, the retention sweep
(``streams.state_retention_days``) **per partition this worker owns**, each partition's state
written back to it: after a rebalance the new owner fires a due reminder, once, with the same
command id. A single lock serialises the agents and the timer, so a tick never overwrites a
decision the agent is committing.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
import time
from collections.abc import Callable, Mapping, MutableMapping
from dataclasses import dataclass
from functools import partial
from typing import Any

import faust
from aiokafka.errors import IllegalStateError
from faust.transport.drivers import aiokafka as aiokafka_driver
from faust.types import TP, Message
from mode.services import WaitResults

from connectors.core import tracing
from connectors.core.avro.serde import AvroSerde
from connectors.core.config import KafkaSettings
from connectors.core.errors import ConfigError, DataError, RegistryUnavailable
from connectors.core.kafka.acls import streams_acls
from connectors.core.kafka.clients import (
    WAIT_SLICE_S,
    admin_client,
    cluster_metadata,
    raise_if_stopping,
)
from connectors.core.kafka.encoding import check_topic_encodings
from connectors.core.kafka.errors import PermissionDenied
from connectors.core.kafka.permissions import (
    check_created,
    check_permissions,
    check_prefixed_topics,
    under_prefix,
)
from connectors.core.kafka.topics import ensure_topics
from connectors.core.mail.conversation import CONVERSATION_HEADER, conversation_key
from streams.acks import OutputAcks
from streams.auth import DnsFunc, RawLoader
from streams.changelogs import ensure_changelog_topics, repartition_spec
from streams.config import StreamsSettings
from streams.decoded import DecodedRecords
from streams.drain import FINISHED, close_unstarted, first_step
from streams.inline import InlineConductor, admit
from streams.kafka_security import faust_credentials
from streams.partitioner import KeyPartitioner
from streams.partitions import PartitionedTable, PrefixIndex
from streams.pipeline import SKIPPED, Outcome, Pipeline, wall_clock
from streams.producer import LibrdkafkaProducer
from streams.seeks import SeekAwareConsumer, SeekAwareThread
from streams.sends import ProducerSends, table_bytes
from streams.stall import StallGuard
from streams.workflow import BUILTIN_MODULES, Record, bind_workflows, workflow_event

log = logging.getLogger(__name__)

AGENT_NAME = "mail-conversations"
TABLE_NAMES = ("runs", "rates", "state")
#: How often final workflow state older than ``streams.state_retention_days`` is deleted: the
#: retention is counted in days, so an hour late costs nothing, and a sweep walks every key.
SWEEP_INTERVAL_S = 3600.0
#: How often a settled worker looks for a stalled stream partition (streams.stall).
STALL_CHECK_S = 5.0
#: While the schema registry does not answer, a record is decoded again after this pause,
#: doubled up to the maximum.
REGISTRY_RETRY_FIRST_S = 0.5
REGISTRY_RETRY_MAX_S = 5.0


def conversations_topic_name(app_id: str) -> str:
    """The internal topic ``mail.events`` is re-keyed onto, by conversation
    (:mod:`connectors.core.mail.conversation`)."""
    return f"{app_id}-mail-events-by-conversation"


class _ReadCommittedConsumerThread(SeekAwareThread):
    def _create_worker_consumer(self, transport: Any) -> Any:
        consumer = super()._create_worker_consumer(transport)
        # The sources write mail.events in transactions; faust only reads committed data in
        # exactly_once mode (faust/transport/drivers/aiokafka.py, _create_worker_consumer).
        # aiokafka reads this attribute when it builds its fetcher in start().
        consumer._isolation_level = "read_committed"
        return consumer


class _ReadCommittedConsumer(SeekAwareConsumer):
    def _new_consumer_thread(self) -> Any:
        return _ReadCommittedConsumerThread(self, loop=self.loop, beacon=self.beacon)

    async def _add_gap(self, tp: Any, offset_from: int, offset_to: int) -> None:
        """Record the offsets skipped between two records read: ``offset_from`` to the one
        before ``offset_to``.

        faust passes the offset of the record just read as ``offset_to`` and records the gap up
        to and including it; that record's own ack then adds its offset a second time, and the
        duplicate splits the run of consecutive offsets ``_new_offset`` commits up to. Each commit
        then advanced only to the next gap: on ``mail.events``, which the sources write in small
        transactions (a commit marker after each), one transaction per commit interval, so the
        group's committed offset fell minutes behind while every record was processed, and a
        restart re-read all of that (robinhood/faust#625 is the same symptom; seen in a
        60-minute soak: lag 400 s with the workers idle).
        """
        await super()._add_gap(tp, offset_from, offset_to - 1)

    async def on_partitions_revoked(self, revoked: set[TP]) -> None:
        """Commit what the agents finished, then let faust revoke.

        faust 0.15.3 drops the acknowledged offsets of the revoked partitions first and commits
        afterwards (``Consumer.on_partitions_revoked``, then the app's ``wait_empty``), so a
        rebalance committed nothing of the partitions it moved: their new owner, and this
        worker for the partitions it kept (the re-seek after a rebalance), read again from the
        last periodic commit. A worker joining during a backlog made the group handle the first
        one's last seconds again (issue 29: 15-70 % more records over 3,000 events in ``bench
        streams`` with 2 workers; each mail read again was a "dedupe" SKIPPED event on
        mail.workflow then). The commit here is the periodic one, made earlier: the same barrier
        (the outputs acknowledged first), the same offsets.

        Before it, the agents get no new record: the first steps of faust's own revocation
        (``App.on_partitions_revoked``: stop the flow, suspend flow control, drop the records
        buffered for the agents, which are unacknowledged and so read again by the partition's
        next owner). Otherwise the agents went on through their buffers while the commit's
        barrier waited for acknowledgements, and all they handled then was handled again after
        the rebalance: with the worker's librdkafka producer, faster, 255 mails in one run of
        the backlog test of tests/integration/streams/test_streams_scale_out.py (it allows 100).
        """
        if not self.should_stop:
            if self.assignment():
                self.stop_flow()
                self.app.flow_control.suspend()
                self.app.flow_control.clear()
            try:
                await self.commit_now()
            except Exception as exc:  # faust's own commit below still runs
                log.warning("commit before the rebalance failed: %r", exc)
        await super().on_partitions_revoked(revoked)

    async def wait_first(self, *coros: Any, timeout: Any = None) -> WaitResults:
        """mode's ``wait_first``, which faust awaits for every record it hands to the agents,
        without its four tasks when the first awaitable finishes at once (:mod:`streams.drain`)."""
        if coros and not self._stopped.is_set() and not self._crashed.is_set():
            try:
                first, result = first_step(coros[0])
            except BaseException:
                close_unstarted(coros[1:])
                raise
            if first is FINISHED:
                close_unstarted(coros[1:])
                return WaitResults([coros[0]], [result], False)
            coros = (first, *coros[1:])
        return await super().wait_first(*coros, timeout=timeout)

    async def _commit_offsets(
        self, offsets: Mapping[TP, int], start_new_transaction: bool = True
    ) -> bool:
        """Commit only once every send of the records processed so far was acknowledged.

        faust flushes its producer before it commits, but a failed send's future is not
        checked there: without this barrier a lost command would be committed past. Raises
        :class:`~streams.errors.OutputLost` (nothing committed) after a failed send.
        """
        app: StreamsApp = self.app  # type: ignore[assignment]  # faust types it as AppT
        await app.output_acks.settled()
        await app.sends.settled()  # the changelog records the line above released
        return await super()._commit_offsets(offsets, start_new_transaction)


class _ReadCommittedTransport(aiokafka_driver.Transport):
    Consumer = _ReadCommittedConsumer
    Conductor = InlineConductor


class GatedTable(faust.Table[Any, Any]):
    """A faust Table whose changelog records wait for the outputs sent before them
    (:meth:`streams.acks.OutputAcks.defer`) and go straight to the producer
    (:mod:`streams.sends`); the in-memory value changes at once.

    Its keys and values are JSON (the tables' schema); a deletion is faust's tombstone (a null
    value, ``value_serializer="raw"``).

    :attr:`prefix_index`, when set (the state table), answers the partition views' prefix scans
    (:mod:`streams.partitions`); faust's own writes to the store (changelog recovery, a
    rebalance) make it build itself again at the next scan.
    """

    prefix_index: PrefixIndex | None = None

    def apply_changelog_batch(self, batch: Any) -> None:
        super().apply_changelog_batch(batch)
        self._store_written()

    async def on_rebalance(
        self, assigned: Any, revoked: Any, newly_assigned: Any, generation_id: int = 0
    ) -> None:
        await super().on_rebalance(assigned, revoked, newly_assigned, generation_id)
        self._store_written()

    async def on_recovery_completed(self, active_tps: Any, standby_tps: Any) -> None:
        await super().on_recovery_completed(active_tps, standby_tps)
        self._store_written()

    def _store_written(self) -> None:
        if self.prefix_index is not None:
            self.prefix_index.invalidate()

    def on_key_set(self, key: Any, value: Any) -> None:
        # faust's Table.on_key_set also expires windowed keys (these tables are not windowed)
        # and calls the sensors (nothing of ours reads them).
        self.send_changelog(None, key, value)

    def on_key_del(self, key: Any) -> None:
        self.send_changelog(None, key, None, value_serializer="raw")

    def send_changelog(
        self,
        partition: int | None,
        key: Any,
        value: Any,
        key_serializer: Any = None,
        value_serializer: Any = None,
    ) -> Any:
        """Queue the changelog record of ``key``, on ``partition`` or, when None, on the
        partition faust's partitioner gives the key (``use_partitioner``); returns None (faust's
        returns its message, which nothing here reads)."""
        app: StreamsApp = self.app  # type: ignore[assignment]  # faust types it as AppT
        topic = self.changelog_topic.get_topic_name()
        key_bytes = table_bytes(key)
        value_bytes = value if value_serializer == "raw" else table_bytes(value)
        if partition is None:
            partition = app.producer.key_partition(topic, key_bytes).partition
        app.output_acks.defer(partial(app.sends.queue, topic, partition, key_bytes, value_bytes))


class StreamsApp(faust.App):
    """A faust App whose consumer reads ``read_committed`` in at-least-once mode, with the
    pipelined acknowledgements of :mod:`streams.acks` (``output_acks``)."""

    def __init__(self, *args: Any, kafka: KafkaSettings, **kwargs: Any) -> None:
        super().__init__(*args, Table=GatedTable, **kwargs)
        self.output_acks = OutputAcks(on_failure=self._stop_on_lost_output)
        #: Outputs and changelog records: librdkafka's producer (streams.producer), not
        #: faust's aiokafka one, and straight to it (streams.sends).
        self.librdkafka = LibrdkafkaProducer(kafka, linger_s=PRODUCER_LINGER_S)
        self.sends = ProducerSends(lambda: self.librdkafka, self.output_acks)

    async def _producer_flush(self, logger: Any) -> None:
        # faust flushes its producer when partitions are revoked and at stop: ours too.
        await super()._producer_flush(logger)
        await self.librdkafka.flush()

    async def on_stop(self) -> None:
        # faust's stop: the consumer made its last commit (whose barrier waited for our
        # acknowledgements) and both producers were flushed; ours ends here.
        await super().on_stop()
        await self.librdkafka.close()

    async def _stop_on_lost_output(self, exc: BaseException) -> None:
        # A crash stops the worker with an error (mode's Worker re-raises the reason); its
        # partitions go to the others, which re-read from the last committed offset.
        await self.crash(exc)

    def _new_transport(self) -> Any:
        return _ReadCommittedTransport(self.conf.broker_consumer, self)


@dataclass
class FaustTables:
    runs: MutableMapping[str, Any]
    rates: MutableMapping[str, Any]
    state: MutableMapping[str, Any]

    def at(self, partition: int) -> FaustTables:
        """The tables as the pipeline sees them for a conversation on ``partition``.

        ``runs`` and ``state`` are per conversation (:mod:`streams.partitions`); ``rates`` are
        per sender and recipient, across conversations, and keep faust's key partitioner.
        """
        return FaustTables(
            PartitionedTable(self.runs, partition),
            self.rates,
            PartitionedTable(self.state, partition),
        )


#: How long the producer waits to fill a batch before it sends (faust's default: 0, a produce
#: request as soon as anything is queued). The sends are pipelined (streams.acks), so a few ms
#: more before an acknowledgement costs no throughput, and fewer, larger requests leave more of
#: the worker to the records (issue 29, bench streams, two A/Bs of 3 rounds each: 234 -> 275 and
#: 269 -> 300 events/s mean, 5 rounds of 6 faster, the same CPU per event). An output reaches
#: Kafka at most this much later.
PRODUCER_LINGER_S = 0.01
#: The most a fetch brings of one partition (faust's ``consumer_max_fetch_size``, aiokafka's
#: ``max_partition_fetch_bytes``; faust's default 1 MiB). faust hands one fetched batch to the
#: agents before it fetches the next, and ``mail.events`` is re-keyed in that loop
#: (:mod:`streams.inline`): with 1 MiB a partition's whole backlog came in one fetch (40,000
#: events of ``bench streams`` in a single batch), the conversation topic's records of the
#: re-keyed events came only in the next one, and a worker started on a backlog answered its
#: first mail once all of it was re-keyed (3.8-4.4 s after the first event; 0.45-0.61 s
#: with this). A larger record batch still comes whole (a fetch returns at least one batch).
CONSUMER_FETCH_BYTES = 64 * 1024

#: How long the worker waits for Kafka at start (the others wait 30 s): faust's own start
#: follows, with timeouts of its own.
KAFKA_WAIT_S = 15.0


def ensure_streams_topics(kafka: KafkaSettings, app_id: str, wait: float = KAFKA_WAIT_S) -> None:
    """The worker's permissions and the topics it reads and writes, before faust starts.

    Waits ``wait`` seconds for the cluster ("cannot reach Kafka"), checks the ACLs
    :func:`connectors.core.kafka.acls.streams_acls` computes (a refusal is one sentence naming
    the ACL), creates ``mail.events``, ``mail.commands`` and ``mail.workflow`` when missing (a
    worker started before the sources, the sink or the admin's ``topics ensure``: what it
    writes would otherwise have nowhere to go on a cluster without auto-created topics), then
    checks the permissions on those it created.
    """
    t = kafka.topics
    needed = streams_acls(kafka, app_id)
    missing = check_permissions(kafka, needed, cluster_wait=wait)
    own = [t.events, t.commands, t.workflow]
    ensure_topics(kafka, only=own)
    check_created(kafka, needed, [n for n in missing if n in own])


def events_partitions(kafka: KafkaSettings, timeout: float = 15.0, wait: float = 30.0) -> int:
    """Partition count of ``mail.events``; the changelog topics must match it.

    A worker started next to the sources (compose, a pod starting with the others) may ask
    before the first source has created the topic: it waits ``wait`` seconds for it, then
    stops with the sentence.
    """
    topic = kafka.topics.events
    admin = admin_client(kafka)
    deadline = time.monotonic() + wait
    while True:
        metadata = cluster_metadata(admin, kafka, timeout, topic)
        found = metadata.topics.get(topic)
        if found is not None and found.error is None and found.partitions:
            return len(found.partitions)
        if time.monotonic() >= deadline:
            raise ConfigError(
                f"topic {topic} does not exist on {kafka.bootstrap_servers} (waited {wait:.0f}s); "
                f"create the topics first (mailtap topics ensure -c CONFIG)"
            )
        raise_if_stopping()
        time.sleep(WAIT_SLICE_S)


def _broker_options(kafka: KafkaSettings) -> dict[str, Any]:
    urls = [f"kafka://{server.strip()}" for server in kafka.bootstrap_servers.split(",")]
    options: dict[str, Any] = {"broker": urls}
    credentials = faust_credentials(kafka)
    if credentials is not None:
        options["broker_credentials"] = credentials
    return options


class StreamsWorker:
    """The faust app with its topics, tables, agent and timer, around one :class:`Pipeline`."""

    def __init__(
        self,
        settings: StreamsSettings,
        kafka: KafkaSettings,
        *,
        partitions: int,
        load_raw: RawLoader | None = None,
        dnsfunc: DnsFunc | None = None,
        modules: tuple[str, ...] = BUILTIN_MODULES,
        clock: Callable[[], dt.datetime] = wall_clock,
    ) -> None:
        self.settings = settings
        self.kafka = kafka
        self.pipeline = Pipeline(
            settings,
            bind_workflows(settings, modules),
            load_raw=load_raw,
            dnsfunc=dnsfunc,
            clock=clock,
        )
        self.mail_serde = AvroSerde.for_schema("MailEvent", kafka)
        self.command_serde = AvroSerde.for_schema("ReplyCommand", kafka)
        self.workflow_serde = AvroSerde.for_schema("WorkflowEvent", kafka)
        #: What ``forward`` decoded, for ``on_record`` (streams.decoded: decoded once).
        self.decoded = DecodedRecords()
        self._lock = asyncio.Lock()
        #: Re-seeks a stream partition faust stopped delivering (streams.stall).
        self.stall_guard = StallGuard()
        self._stall_checked = 0.0
        self._settling_generation: int | None = None
        self._reseeked_generation: int | None = None
        self.app = StreamsApp(
            settings.app_id,
            kafka=kafka,
            **_broker_options(kafka),
            processing_guarantee="at_least_once",
            store="memory://",
            topic_partitions=partitions,
            topic_replication_factor=kafka.replication_factor,
            topic_disable_leader=True,
            web_enabled=False,
            datadir=settings.data_dir,
            consumer_auto_offset_reset="earliest",
            # A worker killed with -9 holds its partitions until the session times out; faust's
            # 60 s default would stall a restart for a minute (KIP-345 static membership was
            # tried and left out: it brought nothing the short timeout does not, and less tested).
            broker_session_timeout=settings.session_timeout_seconds,
            broker_heartbeat_interval=settings.session_timeout_seconds / 3,
            key_serializer="raw",
            value_serializer="raw",
            producer_linger=PRODUCER_LINGER_S,
            consumer_max_fetch_size=CONSUMER_FETCH_BYTES,
            # Kafka's default partitioner (the same partition for every key), hashed faster.
            producer_partitioner=KeyPartitioner(),
            # The memory store drops a standby's copy at every recovery anyway, and a copy
            # would be visible to the timer's walk over the local state (streams.partitions).
            table_standby_replicas=0,
        )
        self.events_topic = self._topic(kafka.topics.events)
        self.conversations_topic_name = conversations_topic_name(settings.app_id)
        self.conversations_topic = self._topic(self.conversations_topic_name)
        self.tables = FaustTables(
            *(
                self.app.Table(
                    name,
                    partitions=partitions,
                    use_partitioner=True,
                    schema=faust.Schema(key_serializer="json", value_serializer="json"),
                )
                for name in TABLE_NAMES
            )
        )
        state = self.tables.state
        assert isinstance(state, GatedTable)
        state.prefix_index = PrefixIndex(state.data)
        #: Called with each record's / tick's outcome and whether it came from a record (metrics).
        self.outcome_hooks: list[Callable[[Outcome, bool], None]] = []
        conductor: InlineConductor = self.app.topics  # type: ignore[assignment]
        conductor.handle_inline(self.events_topic, self._rekey)
        self.agent = self.app.agent(self.conversations_topic, name=AGENT_NAME)(self._consume)
        self.app.timer(settings.tick_interval_seconds)(self._tick)
        self._last_sweep: dt.datetime | None = None

    def _topic(self, name: str) -> Any:
        return self.app.topic(name, key_serializer="raw", value_serializer="raw")

    async def _rekey(self, message: Message) -> None:
        """Re-key one ``mail.events`` record, in faust's fetch loop (:mod:`streams.inline`)."""
        app = self.app
        await app.flow_control.acquire()
        if not admit(app, message):  # of an older generation: read again by its owner
            return
        if self.stall_guard.delivered(message.tp, message.offset, app.consumer_generation_id):
            await self.forward(message.key, message.value, message.headers)
        # else: forwarded in this generation already (streams.stall)
        app.consumer.ack(message)

    async def forward(
        self, key: bytes | None, value: bytes | None, headers: tracing.RecordHeaders = None
    ) -> bytes | None:
        """Re-key one ``mail.events`` record by its conversation onto the internal topic, the
        value and headers unchanged; returns the new key (None: nothing forwarded).

        The conversation is the record's ``mailtap.conversation`` header, which the sources
        send; a record without it is decoded (:mod:`connectors.core.mail.conversation`).

        The send is not awaited here: the commit barrier (:mod:`streams.acks`) lets faust commit
        the ``mail.events`` offset only after it was acknowledged; a kill in between forwards
        the record again, which the dedupe table absorbs downstream.
        """
        if value is None:
            return None  # a tombstone: the mail left the mailbox, nothing to answer
        conversation = _conversation_header(headers)
        if conversation is None:  # written before the sources sent it: decode the event
            try:
                record = await self.decode_event(value)
                conversation = conversation_key(record).encode()
                self.decoded.put(value, record)
            except DataError:
                conversation = key or b""  # reported by the conversation agent, under its key
        sent = await self.app.sends.send(
            self.conversations_topic_name, conversation, value, headers=headers
        )
        self.app.output_acks.hold([sent])
        return conversation

    async def decode_event(self, value: bytes) -> dict[str, Any]:
        """Decode a ``mail.events`` record, waiting while the schema registry does not answer.

        An outage is not bad data: reported as undecodable, the mail's workflow would never run,
        and out of the agent it would crash it. The partition waits here, in order, and the
        offset is not committed past the record (the sink does the same with its commands).
        """
        delay = REGISTRY_RETRY_FIRST_S
        while True:
            try:
                return self.mail_serde.decode(value, self.kafka.topics.events)
            except RegistryUnavailable as exc:
                log.warning("waiting %.1f s for the schema registry: %s", delay, exc)
                await asyncio.sleep(delay)
                delay = min(delay * 2, REGISTRY_RETRY_MAX_S)

    async def _consume(self, stream: Any) -> None:
        async for event in stream.events():
            message = event.message
            if not self.stall_guard.delivered(message.tp, message.offset, message.generation_id):
                continue  # handled in this generation already (streams.stall)
            outcome = await self.on_record(
                event.key, event.value, event.headers, partition=message.partition
            )
            for hook in self.outcome_hooks:
                hook(outcome, True)
            # The producer may hold changelog records back (a partition's batch full): the
            # next record waits rather than letting them pile up (streams.sends).
            await self.app.sends.wait_for_room()

    async def on_record(
        self,
        key: bytes | None,
        value: bytes | None,
        headers: tracing.RecordHeaders = None,
        *,
        partition: int = 0,
    ) -> Outcome:
        """Handle one record of the conversation topic end to end (also called by tests).

        ``partition`` is the record's: the conversation's state is read and written there.
        ``headers`` are the record's: with tracing on, the commands it causes carry its trace on.
        """
        if value is None:
            return Outcome()
        try:
            record = self.decoded.take(value) or await self.decode_event(value)
        except DataError as exc:
            # The record stays on the topic; saying so on mail.workflow beats a silent skip.
            log.warning("undecodable record on %s: %s", self.kafka.topics.events, exc)
            text = (key or b"").decode("utf-8", "replace")
            outcome = Outcome(events=[_undecodable(text, exc)])
            await self.publish(outcome)
            return outcome
        tables = self.tables.at(partition)
        async with self._lock:
            admitted = self.pipeline.admit(record, tables)
            if isinstance(admitted, Outcome):
                outcome = admitted
            else:
                verdict = (
                    await asyncio.to_thread(self.pipeline.authenticate, admitted)
                    if admitted.needs_io
                    else self.pipeline.authenticate(admitted)
                )
                outcome = self.pipeline.run(admitted, verdict, tables)
            await self.publish(outcome, headers if self.kafka.tracing.enabled else None)
            Pipeline.apply(outcome, tables)
        _log_outputs(outcome)
        return outcome

    async def _tick(self) -> None:
        if self.app.in_recovery or self.app.rebalancing:
            self.stall_guard.forget()
            return  # the tables are incomplete; the next tick comes soon enough
        await self._reseek_after_rebalance()
        await self._check_stalls()
        now = dt.datetime.now(dt.UTC)
        outcome = await self.on_tick(now)
        for hook in self.outcome_hooks:
            hook(outcome, False)
        if self._last_sweep is None or (now - self._last_sweep).total_seconds() >= SWEEP_INTERVAL_S:
            await self.on_sweep(now)
            self._last_sweep = now

    def owned_partitions(self) -> set[int]:
        """The partitions of the conversation topic this worker is the active owner of."""
        topic = conversations_topic_name(self.settings.app_id)
        try:
            actives = self.app.assignor.assigned_actives()
        except AttributeError:  # no assignment yet
            return set()
        return {tp.partition for tp in actives if tp.topic == topic}

    async def _reseek_after_rebalance(self) -> None:
        """Once per consumer generation, one tick after it settled, rewind ``mail.events`` and
        the conversation topic to the committed offsets, or to the beginning where nothing was
        committed yet.

        Why: during table recovery faust 0.15.3 fetches stream partitions and discards what
        it fetched, then relies on ``seek_to_committed`` to rewind; aiokafka's
        ``seek_to_committed`` skips partitions whose committed offset is missing or 0
        (``if offset and offset > 0``), so on a group that has not committed yet (a first
        start, or a restart after a crash within the first commit interval) those records
        were silently skipped: the restarted worker never answered them (1 start in 5 under
        CPU load in tests/integration/streams; same family as faust-streaming #216/#241).
        Re-reading is safe: processed mails meet the dedupe table or re-emit the same ids.
        (:mod:`streams.seeks` now seeks those partitions to their first offset at faust's own
        seek; this re-seek stays for the records faust drops on their way to the agents.)

        A partition whose records reached the agents in this generation from that offset (or
        an earlier one) on is not rewound: faust skips records only before a generation's
        first delivery, so nothing was skipped there, and the rewind would only hand the agents
        again what they handled since the rebalance (issue 29: on a first start with a backlog,
        ``bench streams`` forwarded every event twice and handled two in five twice).
        """
        generation = self.app.consumer_generation_id
        if generation in (self._reseeked_generation, 0):  # 0: nothing assigned yet
            return
        if self._settling_generation != generation:
            self._settling_generation = generation  # let the rebalance's own seek finish first
            return
        consumer: Any = self.app.consumer  # ConsumerT does not declare committed_offsets
        async with self._lock:
            committed = await consumer.committed_offsets()
            sources = (self.kafka.topics.events, conversations_topic_name(self.settings.app_id))
            streams = [tp for tp in committed if tp.topic in sources]
            uncommitted = [tp for tp in streams if not committed[tp]]
            earliest = await consumer.earliest_offsets(*uncommitted) if uncommitted else {}
            targets = {tp: committed[tp] or earliest[tp] for tp in streams}
            rewind = {
                tp: offset
                for tp, offset in targets.items()
                if not self.stall_guard.given_from(tp, generation, offset)
            }
            # The awaits above yield to the consumer: a rebalance that began meanwhile may have
            # revoked a partition, and aiokafka's seek of an unassigned partition raises
            # IllegalStateError, which crashed the worker (found by `mailtap soak`, seed 4: the
            # second worker joining). The next generation settles and re-seeks itself.
            if self.app.rebalancing or self.app.consumer_generation_id != generation:
                log.info("generation %s: rebalancing again, re-seek left to the next", generation)
                return
            try:
                # ``seek_wait`` seeks in the consumer's own thread, as faust's recovery does.
                # faust's ``Consumer.seek`` calls aiokafka from this thread while the consumer
                # thread fetches: its fetcher then raised KeyError in ``fetched_records`` and
                # the worker crashed (1 run in 12 of tests/integration/streams scale-out).
                if rewind:
                    await consumer.seek_wait(rewind)
            except IllegalStateError as exc:
                log.info("generation %s: revoked while re-seeking (%s)", generation, exc)
                return
            except TimeoutError:  # the positions did not resolve in time: the next tick again
                log.warning("generation %s: re-seek timed out, tried again", generation)
                return
        self._reseeked_generation = generation
        # Where a partition never committed starts: its commits may begin (streams.seeks).
        consumer.start_offsets.update({tp: earliest[tp] for tp in uncommitted})
        self.stall_guard.expect(targets, generation)
        log.info(
            "generation %s settled: re-read from %s (%d partitions read from there already)",
            generation,
            {f"{tp.topic}/{tp.partition}": offset for tp, offset in rewind.items()},
            len(targets) - len(rewind),
        )

    async def _check_stalls(self) -> None:
        """Every few seconds of a settled generation: seek a stalled stream partition again
        (:mod:`streams.stall`)."""
        generation = self.app.consumer_generation_id
        if generation != self._reseeked_generation:
            self.stall_guard.forget()
            return
        now = time.monotonic()
        if now - self._stall_checked < STALL_CHECK_S:
            return
        self._stall_checked = now
        async with self._lock:
            if self.app.rebalancing or self.app.consumer_generation_id != generation:
                return
            try:
                await self.stall_guard.check(
                    self.app.consumer, transactional=[self.kafka.topics.events]
                )
            except (IllegalStateError, TimeoutError) as exc:  # revoked meanwhile: next check
                log.info("stall check of generation %s left to the next: %r", generation, exc)

    async def on_tick(self, now: dt.datetime) -> Outcome:
        """Time-driven steps (reminders) for the conversations of every partition this worker
        owns, each partition's state written back to that partition; returns them all."""
        total = Outcome()
        owned = sorted(self.owned_partitions())
        async with self._lock:
            # All owned partitions under one hold of the lock; each partition's workflows read
            # the state through its prefix index (streams.partitions), not a walk of it all.
            outcomes = []
            for partition in owned:
                tables = self.tables.at(partition)
                outcome = self.pipeline.tick(now, tables)
                if outcome.commands or outcome.events:
                    await self.publish(outcome)
                Pipeline.apply(outcome, tables)
                outcomes.append(outcome)
        for outcome in outcomes:
            _log_outputs(outcome, logging.INFO)
            total.commands += outcome.commands
            total.events += outcome.events
        return total

    async def on_sweep(self, now: dt.datetime) -> int:
        """Delete final state older than ``streams.state_retention_days`` in the partitions
        this worker owns (tombstones on the changelog); returns how many keys went."""
        removed = 0
        for partition in sorted(self.owned_partitions()):
            tables = self.tables.at(partition)
            async with self._lock:
                outcome = self.pipeline.sweep(now, tables)
                Pipeline.apply(outcome, tables)
            removed += len(outcome.runs) + len(outcome.state)
        if removed:
            log.info("retention sweep: %d expired table entries deleted", removed)
        return removed

    async def publish(self, outcome: Outcome, trace_parent: tracing.RecordHeaders = None) -> None:
        """Send commands and events; table writes made after this wait for their
        acknowledgements, and so does the commit of the offset (:mod:`streams.acks`).

        With tracing on, each command carries a child span of ``trace_parent`` (the mail
        event's headers), or starts a trace of its own (a reminder from a tick).
        """
        pending = []
        send = self.app.sends.send
        commands, workflow = self.kafka.topics.commands, self.kafka.topics.workflow
        for command in outcome.commands:
            headers = (
                tracing.child_headers("workflow.command", trace_parent)
                if self.kafka.tracing.enabled
                else None
            )
            value = self.command_serde.encode(command, commands)
            pending.append(
                await send(commands, command["command_id"].encode(), value, headers=headers)
            )
        for event in outcome.events:
            value = self.workflow_serde.encode(event, workflow)
            pending.append(await send(workflow, event["instance_id"].encode(), value))
        self.app.output_acks.hold(pending)

    def run(
        self,
        loglevel: str = "INFO",
        *,
        override_logging: bool = True,
        worker_class: type[faust.Worker] = faust.Worker,
    ) -> None:
        """Run the worker until SIGTERM/SIGINT (blocking). ``override_logging=False`` keeps the
        caller's logging (the CLI's ``--log-format json`` and level) instead of faust's.

        The tables' changelog topics are created first (:mod:`streams.changelogs`): left to
        faust, a fresh ``app_id`` could crash-loop on a broker slow to list them.
        """
        # Fail at start, not at the first command: a topic of the other encoding, a registry
        # that refuses the schemas (connectors.core.kafka.encoding, connectors.core.avro.registry).
        topics = self.kafka.topics
        check_topic_encodings(self.kafka, [topics.commands, topics.workflow])
        self.command_serde.prepare(topics.commands)
        self.workflow_serde.prepare(topics.workflow)
        conversations = repartition_spec(
            conversations_topic_name(self.settings.app_id), self.app.conf.topic_partitions
        )
        # faust's topics are under the prefix <app_id>- (prefixed ACLs): a refusal names the
        # prefixed ACL, and those created just now are checked before faust uses them.
        needed = streams_acls(self.kafka, self.settings.app_id)
        try:
            specs = ensure_changelog_topics(self.app, self.kafka, also=[conversations])
        except PermissionDenied as exc:
            raise under_prefix(self.kafka, exc, needed) from None
        check_prefixed_topics(self.kafka, needed, [s.name for s in specs])
        worker = worker_class(
            self.app,
            loglevel=loglevel,
            redirect_stdouts=False,
            override_logging=override_logging,
        )
        try:
            worker.execute_from_commandline()
        except SystemExit as exc:
            if exc.code not in (0, None):
                raise


def _log_outputs(outcome: Outcome, level: int = logging.DEBUG) -> None:
    """One line per record or tick with outputs, naming each command and workflow event: at
    DEBUG for a record, like the sink's line per send; at INFO for a tick's (a reminder).

    Why not INFO for every record: the image logs at INFO, and a line per mail was ~11 % of a
    worker's CPU in ``mailtap bench streams`` (py-spy, issue 29), the write of the line a third
    of it, for what ``mail.workflow`` and ``mailtap trace`` already record per mail. A tick
    with outputs is rare and nothing else says it happened. The text is formatted only when
    the level is on.
    """
    if outcome.commands or outcome.events:
        log.log(level, "%s", _OutputsText(outcome))
    elif outcome.already_ran is not None:
        log.debug("a mail read again: %s ran for it already, nothing to do", outcome.already_ran)


class _OutputsText:
    __slots__ = ("outcome",)

    def __init__(self, outcome: Outcome) -> None:
        self.outcome = outcome

    def __str__(self) -> str:
        parts = [
            f"command {c['command_id'][:12]} {c['workflow']}/{c['step']} for {c['event_key']}"
            for c in self.outcome.commands
        ]
        parts += [
            f"workflow event {e['workflow']} {e['status']} {e['instance_id']} "
            f"{e['attributes'].get('reason', '')}".rstrip()
            for e in self.outcome.events
        ]
        return "; ".join(parts)


def _conversation_header(headers: tracing.RecordHeaders) -> bytes | None:
    """The record's ``mailtap.conversation`` header; None when it has none (or an empty one)."""
    for name, value in tracing.header_pairs(headers):
        if name == CONVERSATION_HEADER and value:
            return value if isinstance(value, bytes) else value.encode()
    return None


def _undecodable(key: str, exc: Exception) -> Record:
    return workflow_event(
        instance_id=key or "(no key)",
        workflow="decode",
        status=SKIPPED,
        event_key=key or None,
        attributes={"guard": "decode", "reason": str(exc)},
        at=dt.datetime.now(dt.UTC),
    )
