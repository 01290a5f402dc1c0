"""``mailtap bench sink``: the SMTP sink's end-to-end rate against raw aiosmtplib.

Both halves run against the same local SMTP server (the dev services' one, started here when
none are running), with the same rendered messages:

- baseline: one aiosmtplib connection, reused, ``sendmail`` in a loop (no Kafka, no state);
  rendered before its clock starts;
- sink: ``mail.commands`` -> :class:`~connectors.smtp.sink.SmtpSink` (intent and outcome
  transactions, state topic, rate limiter, pool) -> SENT events read back from ``mail.delivery``;
  the clock runs from the first command produced to the last SENT event consumed.

Fairness: the sink runs in this process, alone, as the baseline's client does; what feeds it
(the commands' encoding and producer) and what reads its SENT events run in a process of their
own (:mod:`mailtap.bench.sink_feeder`), so neither takes the sink's CPU or GIL. (Until
2026-12 they shared the sink's process: the producer's ``flush()`` blocked the sink's event loop
while the clock ran, and the reader decoded events on the sink's GIL.)

A warm-up command goes through the sink first, so the group join is not measured. Raw and sink
rounds alternate (``ROUNDS`` of each) and the medians are reported, so a change in the shared
machine's load affects both halves alike.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import statistics
import sys
import time
import uuid
from typing import Any

import aiosmtplib
import click

from connectors.core.config import config_from_dict
from connectors.smtp.config import SmtpSinkSettings
from connectors.smtp.render import render
from connectors.smtp.sink import SmtpSink
from connectors.smtp.topics import ensure_sink_topics
from mailtap import dev
from mailtap.bench import ingest, sink_feeder
from mailtap.bench.sink_feeder import command
from mailtap.dev.process import die_with_parent
from mailtap.dev.services import SMTP_FROM_ADDRESS

log = logging.getLogger(__name__)

MESSAGES = 2000
#: Raw and sink rounds alternate; the medians are reported (the machines are shared and noisy).
ROUNDS = 3
TARGET_RATIO = 0.80


async def _raw_rate(host: str, port: int, messages: int, run: str) -> float:
    rendered = [render(command(i, f"raw-{run}")) for i in range(messages)]
    client = aiosmtplib.SMTP(hostname=host, port=port, start_tls=False, timeout=30)
    await client.connect()
    started = time.perf_counter()
    for msg in rendered:
        await client.sendmail(msg.envelope_from, list(msg.recipients), msg.data)
    elapsed = time.perf_counter() - started
    await client.quit()
    return messages / elapsed


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
        self.topic = self.cfg.kafka.topics.commands
        self.sink = SmtpSink(self.cfg, settings)
        self.rounds = 0

    async def measure(self, messages: int) -> float:
        """Have the feeder produce ``messages`` commands; msg/s from its first produce to its
        last SENT read, while this process runs the sink alone."""
        self.rounds += 1
        request = {
            "bootstrap_servers": self.cfg.kafka.bootstrap_servers,
            "commands": self.topic,
            "delivery": self.cfg.kafka.topics.delivery,
            "run": f"{self.run}-{self.rounds}",
            "messages": messages,
        }
        feeder = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            sink_feeder.__name__,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            # Its read loop ends only when every SENT came: a killed bench must take it along.
            preexec_fn=die_with_parent(),
        )
        assert feeder.stdin is not None and feeder.stdout is not None
        feeder.stdin.write(json.dumps(request).encode() + b"\n")
        await feeder.stdin.drain()
        if (await feeder.stdout.readline()).strip() != b"ready":
            raise click.ClickException("the bench's feeder process did not start (see stderr)")
        feeder.stdin.write(b"go\n")
        await feeder.stdin.drain()
        result = asyncio.ensure_future(feeder.stdout.readline())
        while not result.done():
            await self.sink.poll_once()
        await feeder.wait()
        line = result.result()
        if feeder.returncode != 0 or not line:
            raise click.ClickException(f"the bench's feeder process failed ({feeder.returncode})")
        figures = json.loads(line)
        if figures["failed"]:
            raise click.ClickException(f"unexpected outcomes: {figures['failed']}")
        return messages / (float(figures["finished"]) - float(figures["started"]))


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
