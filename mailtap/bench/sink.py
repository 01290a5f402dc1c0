"""``mailtap bench sink``: the SMTP sink's end-to-end rate against raw aiosmtplib.

Both halves run in the same process against the same local SMTP server (the dev services' one,
started here when none are running), with the same rendered message:

- baseline: one aiosmtplib connection, reused, ``sendmail`` in a loop (no Kafka, no state);
- sink: ``mail.commands`` -> :class:`~connectors.smtp.sink.SmtpSink` (intent and outcome
  transactions, state topic, rate limiter, pool) -> SENT events read back from ``mail.delivery``;
  the clock runs from the first command produced to the last SENT event consumed.

A warm-up command goes through the sink first, so the group join is not measured. Raw and sink
rounds alternate (``ROUNDS`` of each) and the medians are reported, so a change in the shared
machine's load affects both halves alike.
"""

from __future__ import annotations

import asyncio
import logging
import os
import statistics
import threading
import time
import uuid
from typing import Any

import aiosmtplib
import click
from confluent_kafka import Consumer, Producer

from connectors.core.avro.serde import AvroSerde
from connectors.core.config import MailtapConfig, config_from_dict
from connectors.core.kafka.clients import consumer_config, producer_config
from connectors.smtp.config import SmtpSinkSettings
from connectors.smtp.lanes import PRODUCER_COMPRESSION
from connectors.smtp.render import render
from connectors.smtp.sink import SmtpSink
from connectors.smtp.topics import ensure_sink_topics
from mailtap import dev
from mailtap.bench import ingest
from mailtap.dev.services import SMTP_FROM_ADDRESS

log = logging.getLogger(__name__)

MESSAGES = 2000
#: Raw and sink rounds alternate; the medians are reported (the machines are shared and noisy).
ROUNDS = 3
TARGET_RATIO = 0.80


def _command(i: int, run: str) -> dict[str, Any]:
    from datetime import UTC, datetime

    return {
        "schema_version": 1,
        "command_id": f"bench-{run}-{i:06d}",
        "kind": "REPLY",
        "workflow": "bench",
        "step": "reply",
        "event_key": f"evt-{i}",
        "from": {"name": "mailtap bench", "address": "bench@example.com"},
        "to": [{"name": "Receiver", "address": f"rcpt{i % 50}@example.org"}],
        "cc": [],
        "bcc": [],
        "reply_to": [],
        "subject": f"Re: bench message {i}",
        "text_body": "Thank you for your message.\n" * 20,
        "html_body": None,
        "attachments": [],
        "in_reply_to": f"orig-{i}@example.org",
        "references": [],
        "auto_submitted": "auto-replied",
        "created_at": datetime.now(UTC),
    }


async def _raw_rate(host: str, port: int, messages: int, run: str) -> float:
    rendered = [render(_command(i, f"raw-{run}")) for i in range(messages)]
    client = aiosmtplib.SMTP(hostname=host, port=port, start_tls=False, timeout=30)
    await client.connect()
    started = time.perf_counter()
    for msg in rendered:
        await client.sendmail(msg.envelope_from, list(msg.recipients), msg.data)
    elapsed = time.perf_counter() - started
    await client.quit()
    return messages / elapsed


class _SentCounter(threading.Thread):
    """Counts SENT events on the delivery topic in its own thread (so the sink's loop is free)."""

    def __init__(self, cfg: MailtapConfig, wanted: set[str]) -> None:
        super().__init__(daemon=True)
        self._consumer = Consumer(
            consumer_config(cfg.kafka, f"bench-reader-{uuid.uuid4().hex[:8]}")
        )
        self._consumer.subscribe([cfg.kafka.topics.delivery])
        self._serde = AvroSerde.for_schema("DeliveryEvent", cfg.kafka)
        self.wanted = set(wanted)
        self.done = threading.Event()
        self.finished_at = 0.0
        self.failed: list[dict[str, Any]] = []

    def run(self) -> None:
        try:
            while self.wanted:
                for msg in self._consumer.consume(1000, timeout=0.1):
                    if msg.error() or msg.value() is None:
                        continue
                    event = self._serde.decode(msg.value() or b"")
                    if event["status"] == "SENT":
                        self.wanted.discard(event["command_id"])
                    else:
                        self.failed.append(event)
            self.finished_at = time.perf_counter()
        finally:
            self._consumer.close()
            self.done.set()


class _SinkRun:
    """A started sink on its own topics, fed and timed one round at a time."""

    def __init__(self, info: dev.DevServices, run: str) -> None:
        raw = {
            "kafka": {
                "bootstrap_servers": info.bootstrap_servers,
                "topics": {
                    "commands": f"bench.commands.{run}",
                    "retry_prefix": f"bench.commands.{run}.retry",
                    "dlq": f"bench.commands.{run}.dlq",
                    "delivery": f"bench.delivery.{run}",
                    "suppressions": f"bench.suppressions.{run}",
                },
            },
            "smtp": {
                "host": info.smtp.host,
                "port": info.smtp.port,
                "security": "plain",
                "from_address": SMTP_FROM_ADDRESS,
                "group_id": f"bench-sink-{run}",
                "state_topic": f"bench.sink.state.{run}",
                "instance_id": f"bench-{run}",
            },
        }
        self.run = run
        self.cfg = config_from_dict(raw)
        settings = self.cfg.section("smtp", SmtpSinkSettings)
        # Only the topics of this run: the stack's own (mail.events of a demo, in whichever
        # encoding) are none of a benchmark's business.
        ensure_sink_topics(
            self.cfg.kafka, settings.retry_tiers, suppressions=settings.suppression.enabled
        )
        self.serde = AvroSerde.for_schema("ReplyCommand", self.cfg.kafka)
        self.producer = Producer(
            producer_config(self.cfg.kafka, compression_type=PRODUCER_COMPRESSION)
        )
        self.topic = self.cfg.kafka.topics.commands
        self.sink = SmtpSink(self.cfg, settings)
        self.rounds = 0

    async def measure(self, messages: int) -> float:
        """Produce ``messages`` commands; msg/s from the first produce to the last SENT read."""
        self.rounds += 1
        commands = [_command(i, f"{self.run}-{self.rounds}") for i in range(messages)]
        encoded = [(c["command_id"].encode(), self.serde.encode(c, self.topic)) for c in commands]
        counter = _SentCounter(self.cfg, {c["command_id"] for c in commands})
        counter.start()
        started = time.perf_counter()
        for key, value in encoded:
            while True:
                try:
                    self.producer.produce(self.topic, key=key, value=value)
                    break
                except BufferError:
                    self.producer.poll(0.05)
        self.producer.flush(30)
        while not counter.done.is_set():
            await self.sink.poll_once()
        if counter.failed:
            raise click.ClickException(f"unexpected outcomes: {counter.failed[:3]}")
        return messages / (counter.finished_at - started)


async def _measure(
    info: dev.DevServices, messages: int, rounds: int
) -> tuple[list[float], list[float], SmtpSink]:
    """Alternate raw and sink rounds, so a change in the machine's load hits both alike."""
    run = uuid.uuid4().hex[:8]
    bench = _SinkRun(info, run)
    bench.sink.start()
    try:
        await bench.measure(1)  # warm-up: group join, first session, topic metadata
        raw_rates, sink_rates = [], []
        for n in range(rounds):
            raw_rates.append(await _raw_rate(info.smtp.host, info.smtp.port, messages, f"{run}{n}"))
            sink_rates.append(await bench.measure(messages))
        return raw_rates, sink_rates, bench.sink
    finally:
        await bench.sink.close()


def bench_sink(json_out: bool, messages: int = MESSAGES, rounds: int = ROUNDS) -> dict[str, Any]:
    """Run both halves and return the figures (the CLI prints them as JSON with ``--json``)."""
    started_here = False
    # MAILTAP_BENCH_STATE_DIR: someone else's services (the tests'), used, never started or stopped.
    info = ingest._services() if os.environ.get(ingest.ENV_STATE_DIR) else dev.status()
    if info is None:
        click.echo("no local services running: starting them (mailtap dev up)", err=json_out)
        info = dev.up()
        started_here = True
    try:
        raw_rates, sink_rates, sink = asyncio.run(_measure(info, messages, rounds))
    finally:
        if started_here:
            dev.down()
    ratios = [s / r for s, r in zip(sink_rates, raw_rates, strict=True)]
    ratio = statistics.median(ratios)
    raw_rate, sink_rate = statistics.median(raw_rates), statistics.median(sink_rates)
    figures = {
        "bench": "sink",
        "messages_per_round": messages,
        "rounds": rounds,
        "raw_aiosmtplib_msgs_per_s": round(raw_rate, 1),
        "sink_end_to_end_msgs_per_s": round(sink_rate, 1),
        "ratio": round(ratio, 3),
        "ratios_per_round": [round(r, 3) for r in ratios],
        "target_ratio": TARGET_RATIO,
        "pool_size": sink.settings.pool_size,
        "batch_size": sink.settings.batch_size,
        "smtp_sessions_opened": sink.transport.opened,
        "sink_transactions": sink.rounds_total,
        "sink_transactions_per_message": round(sink.rounds_total / (rounds * messages + 1), 3),
    }
    lines = [
        f"raw aiosmtplib, one reused connection: {raw_rate:8.1f} msg/s (median of {rounds})",
        f"sink end to end (commands -> SENT):    {sink_rate:8.1f} msg/s "
        f"(pool {sink.settings.pool_size}, batch {sink.settings.batch_size}, "
        f"{sink.rounds_total} transactions for {rounds * messages + 1} messages)",
        f"ratio: {ratio:.0%} median, per round {', '.join(f'{r:.0%}' for r in ratios)} "
        f"(target >= {TARGET_RATIO:.0%})",
    ]
    for line in lines:
        click.echo(line, err=json_out)
    return figures
