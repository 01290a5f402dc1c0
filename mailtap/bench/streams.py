"""``mailtap bench streams``: events/s of streams workers through the built-in workflows,
against a bare aiokafka consume -> produce loop in the same run.

Each run writes ``events`` MailEvents onto a fresh, pre-filled events topic (``PARTITIONS``
partitions) before anything reads it: half ticket mails to the support address, a quarter
approval requests, a quarter auto-replies that the loop guard skips. Then:

- baseline: one aiokafka consumer (``read_committed``) -> one aiokafka producer, each record's
  value copied to an output topic, the sends of one fetched batch awaited before the next
  fetch (no decoding, no state, no re-keying);
- streams: 1, 2, 3 workers (``mailtap run streams`` child processes, started together) with
  the demo's workflows (:func:`mailtap.dev.scenario.streams_section`) and a fresh app id.

Both are measured the same way, by an independent ``read_committed`` consumer of the output
topics: the rate is the events written divided by the span of record timestamps from the first
event consumed to the last command or workflow record produced. For the workers, "first event
consumed" is the first record they forward onto their conversation topic (``streams.app``
re-keys each ``mail.events`` record there before anything else); for the baseline, its first
copy. Process start, group join and table recovery before that are not in the rate (reported
as ``start_to_first_event_s``); with several workers the rebalances while they join are. The
reader also checks that every event written was answered: for the workers, by a
``mail.workflow`` record with its key; for the baseline, by its copy.

Where a worker's time goes: ``workflows_cpu_ms_per_event`` is the CPU of the same events
through the workers' own pipeline (routing, guards, sender authentication, the workflows and
their table writes) in this process, with dicts for tables and no Kafka
(:class:`streams.testing.WorkflowHarness`); the rest of a worker's ``cpu_ms_per_event`` is
faust, aiokafka and the Avro framing around it.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import statistics
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import click
import yaml
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from confluent_kafka import Consumer, Producer, TopicPartition

from connectors.core.avro.serde import AvroSerde
from connectors.core.config import MailtapConfig, load_config
from connectors.core.kafka.clients import consumer_config, producer_config
from connectors.core.kafka.topics import DELETED, TopicSpec, ensure_topic_specs, ensure_topics
from connectors.core.mail.conversation import CONVERSATION_HEADER, conversation_key
from mailtap.bench.ingest import _say, _services, delete_topics_where
from mailtap.commands.streams_health import mails_read_again
from mailtap.components import Component
from mailtap.dev import DevServices, scenario
from mailtap.dev.process import cpu_seconds, free_ports
from streams.app import TABLE_NAMES, conversations_topic_name
from streams.changelogs import repartition_spec
from streams.config import StreamsSettings
from streams.testing import WorkflowHarness, mail_record

#: mail.events of the bench (and so every worker's internal topics): room for 3 workers x 2.
PARTITIONS = 6
TARGET_EVENTS_PER_S = 3000.0
TARGET_RATIO = 0.5
#: A run that has not answered every event by then has failed (logs are kept and named).
RUN_TIMEOUT_S = 600.0
#: Mails written as one worker restarts on the first run's tables (the restart figure).
RESTART_EVENTS = 4


def sample_events(run: str, count: int) -> list[dict[str, Any]]:
    """``count`` MailEvent records: 2 in 4 tickets, 1 approval request, 1 auto-reply (skipped).

    Each sender writes a few mails (the rate limit counts per sender, as with real customers);
    each mail carries the demo MTA's passing Authentication-Results, so the sender check runs.
    """
    observed = dt.datetime.now(dt.UTC).replace(microsecond=0)
    events = []
    for n in range(count):
        kind = n % 4
        if kind == 3:
            sender, to, subject = (
                f"away{n % 97}@customer.example",
                scenario.SUPPORT,
                "Out of office",
            )
            guards: dict[str, Any] = {"auto_submitted": "auto-replied"}
        elif kind == 2:
            sender, to = f"staff{n % 53}@example.com", scenario.APPROVALS
            subject = f"Approval needed: purchase order {n}"
            guards = {}
        else:
            sender, to = f"customer{n % 211}@customer.example", scenario.SUPPORT
            subject = f"Request {n}: the VPN drops every hour"
            guards = {}
        domain = sender.rpartition("@")[2]
        guards["authentication_results"] = [
            f"{scenario.AUTHSERV_ID}; dkim=pass header.d={domain}; "
            f"spf=pass smtp.mailfrom={sender}; dmarc=pass header.from={domain}"
        ]
        events.append(
            mail_record(
                message_id=f"bench-{run}-{n}@{domain}",
                sender=sender,
                to=(to,),
                subject=subject,
                text_body="Hello,\n\nthe VPN connection drops every hour since Monday.\n" * 4,
                account="bench",
                guard_headers=guards,
                observed_at=observed,
            )
        )
    return events


def _app_id(run: str) -> str:
    return f"bench-streams-{run}"


def _config(info: DevServices, run: str, folder: Path) -> Path:
    base: dict[str, Any] = yaml.safe_load(info.config_path.read_text())
    streams = scenario.streams_section(_app_id(run))
    # No sender of the bench is ever limited; the approver stays exempt per recipient, as in the
    # demo and as the docs ask of staff that workflows write to by configuration (without it
    # every approval request's forward counted in one recipient window that grew through the
    # whole run: an O(n) changelog value per write that no configured deployment has).
    streams["rate_limit"] = {
        "max_replies": 100_000,
        "window_seconds": 3600,
        "exempt_recipients": [scenario.APPROVER],
    }
    streams["data_dir"] = str(folder / "streams")
    doc = {
        "kafka": {
            **base["kafka"],
            "partitions": PARTITIONS,
            "topics": {
                "events": f"bench.streams.events.{run}",
                "commands": f"bench.streams.commands.{run}",
                "retry_prefix": f"bench.streams.commands.{run}.retry",
                "dlq": f"bench.streams.commands.{run}.dlq",
                "delivery": f"bench.streams.delivery.{run}",
                "offsets": f"bench.streams.offsets.{run}",
                "workflow": f"bench.streams.workflow.{run}",
            },
        },
        "claim_check": base["claim_check"],
        "streams": streams,
    }
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "mailtap.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def _prefill(cfg: MailtapConfig, events: list[dict[str, Any]]) -> None:
    serde = AvroSerde.for_schema("MailEvent", cfg.kafka)
    topic = cfg.kafka.topics.events
    serde.prepare(topic)
    producer = Producer(producer_config(cfg.kafka))
    for event in events:
        value = serde.encode(event, topic)
        # As the sources write them: with the conversation the worker re-keys them by.
        headers: list[tuple[str, str | bytes | None]] = [
            (CONVERSATION_HEADER, conversation_key(event).encode())
        ]
        while True:
            try:
                producer.produce(topic, key=event["key"].encode(), value=value, headers=headers)
                break
            except BufferError:
                producer.poll(0.05)
    if producer.flush(60):
        raise click.ClickException(f"could not write the bench's events to {topic}")


class OutputReader:
    """An independent ``read_committed`` consumer: which events were answered, and when the
    answers were produced (record timestamps)."""

    def __init__(
        self,
        cfg: MailtapConfig,
        topics: list[str],
        wanted: set[str],
        start_topic: str | None = None,
    ) -> None:
        self._consumer = Consumer(consumer_config(cfg.kafka, f"bench-reader-{uuid.uuid4().hex}"))
        self._consumer.subscribe(topics + ([start_topic] if start_topic else []))
        #: Its records only start the clock: the worker forwards each mail.events record it
        #: consumes there first (streams.app), so its first one is the first event consumed.
        self._start_topic = start_topic
        self._workflow = cfg.kafka.topics.workflow
        self._serde = AvroSerde.for_schema("WorkflowEvent", cfg.kafka)
        self.wanted = set(wanted)
        self.answered: set[str] = set()
        self.records = 0
        #: Records of ``start_topic`` read (events the workers re-keyed).
        self.forwarded = 0
        self.first_ms: int | None = None
        #: The first answer (command or workflow record) produced.
        self.first_answer_ms: int | None = None
        self.last_ms = 0
        #: The last answer to one of ``wanted`` produced.
        self.last_wanted_ms = 0

    def poll(self) -> None:
        for msg in self._consumer.consume(2000, timeout=0.2):
            if msg.error() or msg.value() is None:
                continue
            _, stamp = msg.timestamp()
            self.first_ms = stamp if self.first_ms is None else min(self.first_ms, stamp)
            if msg.topic() == self._start_topic:
                self.forwarded += 1
                continue
            self.records += 1
            self.last_ms = max(self.last_ms, stamp)
            if self.first_answer_ms is None or stamp < self.first_answer_ms:
                self.first_answer_ms = stamp
            if msg.topic() == self._workflow:
                key = self._serde.decode(msg.value() or b"", self._workflow).get("event_key")
            else:
                key = (msg.key() or b"").decode()
            if key in self.wanted:
                self.answered.add(key)
                self.last_wanted_ms = max(self.last_wanted_ms, stamp)

    @property
    def done(self) -> bool:
        return self.answered >= self.wanted

    def close(self) -> None:
        self._consumer.close()

    def rate(self, events: int) -> float:
        span_s = (self.last_ms - (self.first_ms or self.last_ms)) / 1000
        return events / span_s if span_s > 0 else float("inf")


async def _bare_loop(cfg: MailtapConfig, out_topic: str, events: int) -> None:
    """The baseline: consume -> produce with the client library faust uses, nothing else."""
    servers = cfg.kafka.bootstrap_servers
    consumer = AIOKafkaConsumer(
        cfg.kafka.topics.events,
        bootstrap_servers=servers,
        group_id=f"bench-bare-{uuid.uuid4().hex}",
        isolation_level="read_committed",
        auto_offset_reset="earliest",
        enable_auto_commit=False,
    )
    producer = AIOKafkaProducer(bootstrap_servers=servers, acks="all", enable_idempotence=True)
    await consumer.start()
    await producer.start()
    try:
        seen = 0
        while seen < events:
            batches = await consumer.getmany(timeout_ms=200, max_records=1000)
            sent = [
                await producer.send(out_topic, key=msg.key, value=msg.value)
                for records in batches.values()
                for msg in records
            ]
            await asyncio.gather(*sent)
            seen += len(sent)
            if sent:
                await consumer.commit()
    finally:
        await consumer.stop()
        await producer.stop()


def _measure_bare(cfg: MailtapConfig, keys: set[str], run: str) -> dict[str, Any]:
    out_topic = f"bench.streams.bare.{run}"
    ensure_topic_specs(cfg.kafka, [TopicSpec(out_topic, PARTITIONS, DELETED)])
    reader = OutputReader(cfg, [out_topic], keys)
    started, cpu_started = time.monotonic(), time.process_time()
    asyncio.run(_bare_loop(cfg, out_topic, len(keys)))
    cpu_s = time.process_time() - cpu_started  # with its client start-up: a little high
    while not reader.done and time.monotonic() - started < RUN_TIMEOUT_S:
        reader.poll()
    reader.close()
    return {
        "events_counted": len(reader.answered),
        "events_per_s": round(reader.rate(len(keys)), 1),
        "cpu_ms_per_event": round(1000 * cpu_s / len(keys), 3),
    }


def _workflows_cpu_ms(cfg: MailtapConfig, sample: list[dict[str, Any]]) -> float:
    """CPU per event of the workers' pipeline alone over ``sample``, in this process."""
    harness = WorkflowHarness(cfg.section("streams", StreamsSettings))
    started = time.process_time()
    for event in sample:
        harness.deliver(event)
    return 1000 * (time.process_time() - started) / max(len(sample), 1)


def _cpu(components: list[Component]) -> float:
    return sum(cpu_seconds(c.process.pid) for c in components if c.process is not None)


def _check_running(
    workers: list[Component], reader: OutputReader, started: float, logs: Path
) -> None:
    """Raise when a worker exited, or when the events were not all answered in time."""
    for worker in workers:
        if not worker.alive:
            raise click.ClickException(
                f"a streams worker exited; last log lines:\n{worker.log_tail()}"
            )
    if time.monotonic() - started > RUN_TIMEOUT_S:
        raise click.ClickException(
            f"{len(workers)} worker(s) answered {len(reader.answered)} of {len(reader.wanted)} "
            f"events in {RUN_TIMEOUT_S:.0f} s; logs in {logs}"
        )


def _measure_workers(
    config: Path, cfg: MailtapConfig, keys: set[str], workers: int, run: str
) -> dict[str, Any]:
    logs = config.parent / "logs"
    topics = [cfg.kafka.topics.commands, cfg.kafka.topics.workflow]
    start_topic = conversations_topic_name(_app_id(run))
    # The workers make it at start. Made here before the reader subscribes: librdkafka learns of
    # a topic made after a subscription only at its next metadata refresh (5 minutes by
    # default), so the reader never read it, the clock started at the first output, and the
    # CPU and time a worker spent re-keying before it (15 s of a 40,000-event backlog) were
    # left out of the figures.
    ensure_topic_specs(cfg.kafka, [repartition_spec(start_topic, PARTITIONS)])
    reader = OutputReader(cfg, topics, keys, start_topic)
    # Each worker serves /metrics: a mail handled again publishes nothing (the dedupe table
    # stops it), so only the worker's count shows work a rebalance made the group redo.
    ports = free_ports(workers)
    components = [
        Component(
            "streams",
            config,
            logs / f"streams-{workers}w-{n}.log",
            env={"MAILTAP__HEALTH__PORT": str(port)},
        ).start()
        for n, port in enumerate(ports)
    ]
    started, wall_start = time.monotonic(), time.time()
    cpu_at_first_event: float | None = None
    try:
        while not reader.done:
            reader.poll()
            if cpu_at_first_event is None and reader.first_ms is not None:
                # Seen within a poll of it: what the workers spent on start-up stays out.
                cpu_at_first_event = _cpu(components)
            _check_running(components, reader, started, logs)
        cpu_s = _cpu(components) - (cpu_at_first_event or 0.0)
        try:
            read_again = sum(mails_read_again(port) for port in ports)
        except OSError as exc:
            raise click.ClickException(
                f"could not read a streams worker's /metrics: {exc}"
            ) from exc
    finally:
        for comp in components:
            comp.stop()
        reader.close()
    return {
        "workers": workers,
        "events_counted": len(reader.answered),
        "records_produced": reader.records,
        # Events re-keyed onto the conversation topic that the reader saw (what starts the clock).
        "events_re_keyed_seen": reader.forwarded,
        # Mails a worker handled a second time (after a rebalance), by the workers' own count.
        "mails_read_again": read_again,
        # CPU per event does not depend on how loaded the shared machine is, unlike events/s.
        "cpu_ms_per_event": round(1000 * cpu_s / len(keys), 3),
        "events_per_s": round(reader.rate(len(keys)), 1),
        # Process start -> first event consumed: imports, group join, table recovery (not in the rate).
        "start_to_first_event_s": round((reader.first_ms or 0) / 1000 - wall_start, 2),
        # First event re-keyed -> first answer: how long a backlog kept the workers from
        # answering (a burst or a replay: new mail waits behind it).
        "first_answer_after_first_event_s": round(
            ((reader.first_answer_ms or 0) - (reader.first_ms or 0)) / 1000, 2
        ),
    }


def _changelog_records(cfg: MailtapConfig, run: str) -> int:
    """Records written to the run's table changelogs (their high watermarks): what a worker
    restarted on these tables reads back before it answers."""
    consumer = Consumer(consumer_config(cfg.kafka, f"bench-watermarks-{uuid.uuid4().hex}"))
    try:
        return sum(
            consumer.get_watermark_offsets(
                TopicPartition(f"{_app_id(run)}-{table}-changelog", partition), timeout=30
            )[1]
            for table in TABLE_NAMES
            for partition in range(PARTITIONS)
        )
    finally:
        consumer.close()


def _measure_restart(config: Path, cfg: MailtapConfig, run: str) -> dict[str, Any]:
    """One worker restarted on the tables a run left (its workers stopped): process start ->
    every answer to mail written as it starts. faust reads the tables' changelogs back first
    (the memory store keeps nothing across a restart), so this is how long a restart or a
    failover leaves new mail unanswered."""
    fresh = sample_events(f"{run}-restart", RESTART_EVENTS)
    records = _changelog_records(cfg, run)
    reader = OutputReader(
        cfg, [cfg.kafka.topics.commands, cfg.kafka.topics.workflow], {e["key"] for e in fresh}
    )
    spawned = time.time()
    worker = Component(
        "streams",
        config,
        config.parent / "logs" / "streams-restart.log",
        env={"MAILTAP__HEALTH__PORT": str(free_ports(1)[0])},
    ).start()
    try:
        _prefill(cfg, fresh)
        started = time.monotonic()
        while not reader.done:
            reader.poll()
            _check_running([worker], reader, started, config.parent / "logs")
    finally:
        worker.stop()
        reader.close()
    return {
        "changelog_records": records,
        "start_to_answers_s": round(reader.last_wanted_ms / 1000 - spawned, 2),
    }


def _delete_run_topics(cfg: MailtapConfig, run: str) -> None:
    """A run's topics once its figures are taken (its own ``bench.streams.*.<run>``, the retry
    tiers, the workers' ``bench-streams-<run>-*``): each run left about 50 partitions behind,
    and a dev broker holding 11,000 of them from earlier runs took over 2 minutes to start."""
    mark = f".{run}"
    delete_topics_where(
        cfg.kafka,
        lambda t: (
            (t.startswith("bench.streams.") and (t.endswith(mark) or f"{mark}." in t))
            or t.startswith(f"{_app_id(run)}-")
        ),
    )


def bench_streams(
    json_out: bool, events: int = 20_000, workers: tuple[int, ...] = (1, 2, 3)
) -> dict[str, Any]:
    """Run the baseline and each worker count on its own pre-filled topic; return the figures."""
    info = _services()
    runs: list[dict[str, Any]] = []
    bare: list[dict[str, Any]] = []
    restart: dict[str, Any] = {}
    folder = Path(tempfile.mkdtemp(prefix="mailtap-bench-streams-"))
    for count in workers:
        run = uuid.uuid4().hex[:8]
        config = _config(info, run, folder / run)
        cfg = load_config(config)
        ensure_topics(cfg.kafka, [])
        sample = sample_events(run, events)
        keys = {e["key"] for e in sample}
        _say(f"[{count} worker(s)] writing {events} events to {cfg.kafka.topics.events} ...")
        _prefill(cfg, sample)
        _say("  bare aiokafka consume -> produce loop ...")
        bare.append(_measure_bare(cfg, keys, run))
        _say(f"  {count} streams worker(s) ...")
        try:
            measured = _measure_workers(config, cfg, keys, count, run)
            if not restart:  # once, on the first run's tables
                _say("  one worker restarted on the tables of the run ...")
                restart = {"workers_before": count, **_measure_restart(config, cfg, run)}
        finally:
            _delete_run_topics(cfg, run)
        measured["ratio_to_bare"] = round(measured["events_per_s"] / bare[-1]["events_per_s"], 3)
        measured["workflows_cpu_ms_per_event"] = round(_workflows_cpu_ms(cfg, sample), 3)
        runs.append(measured)
        _say(
            f"  bare {bare[-1]['events_per_s']:.0f} events/s, {count} worker(s) "
            f"{measured['events_per_s']:.0f} events/s ({measured['ratio_to_bare']:.1%})"
        )
    one = next((r for r in runs if r["workers"] == 1), None)
    figures: dict[str, Any] = {
        "bench": "streams",
        "events_per_run": events,
        "partitions": PARTITIONS,
        "bare_aiokafka_events_per_s": [b["events_per_s"] for b in bare],
        "bare_events_counted": [b["events_counted"] for b in bare],
        "bare_cpu_ms_per_event": [b["cpu_ms_per_event"] for b in bare],
        "runs": runs,
        "restart": restart,
        "target_events_per_s_one_worker": TARGET_EVENTS_PER_S,
        "target_ratio": TARGET_RATIO,
        "logs": str(folder),
    }
    if one is not None:
        figures["scaling"] = {
            str(r["workers"]): round(r["events_per_s"] / one["events_per_s"], 2) for r in runs
        }
        figures["one_worker_meets_target"] = (
            one["events_per_s"] >= TARGET_EVENTS_PER_S and one["ratio_to_bare"] >= TARGET_RATIO
        )
    lines = [
        f"bare aiokafka consume -> produce: {statistics.median(figures['bare_aiokafka_events_per_s']):8.0f} "
        f"events/s (median of {len(bare)})",
        *(
            f"{r['workers']} streams worker(s):            {r['events_per_s']:8.0f} events/s, "
            f"{r['ratio_to_bare']:.1%} of the bare loop in the same run, "
            f"{r['cpu_ms_per_event']:.2f} ms CPU per event "
            f"(the workflows alone {r['workflows_cpu_ms_per_event']:.2f}), first answer "
            f"{r['first_answer_after_first_event_s']:.1f} s after the first event"
            for r in runs
        ),
        f"a worker restarted on the tables of {events} events "
        f"({restart['changelog_records']} changelog records): the new mail answered "
        f"{restart['start_to_answers_s']:.1f} s after its process start",
        f"targets: one worker >= {TARGET_EVENTS_PER_S:.0f} events/s and >= "
        f"{TARGET_RATIO:.0%} of the bare loop; near-linear to 3 workers on {PARTITIONS} partitions",
    ]
    for line in lines:
        click.echo(line, err=json_out)
    return figures
