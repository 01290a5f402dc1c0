"""``mailtap run smtp-sink -c CONFIG``: the SMTP sink as a process (SIGTERM/SIGINT stop it cleanly)."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import threading
from collections.abc import Callable
from functools import cache
from typing import cast

import click

from connectors.core.claimcheck.open import open_configured
from connectors.core.claimcheck.store import ClaimCheckStore
from connectors.core.config import MailtapConfig, load_config
from connectors.core.kafka.clients import request_stop
from connectors.core.metrics import HealthServer, SourceMetrics
from connectors.smtp.bounce_reader import BounceReader
from connectors.smtp.config import SmtpSinkSettings
from connectors.smtp.sink import SmtpSink
from mailtap.commands.common import config_option

log = logging.getLogger(__name__)


def _blob_fetcher(cfg: MailtapConfig) -> Callable[[str], bytes]:
    settings = cfg.claim_check

    @cache
    def store() -> ClaimCheckStore:
        # Opened on first use: a sink whose commands carry no attachment needs no store.
        return open_configured(settings)

    return lambda uri: store().get(uri)


def build_sink(cfg: MailtapConfig) -> SmtpSink:
    return SmtpSink(cfg, cfg.section("smtp", SmtpSinkSettings), fetch_blob=_blob_fetcher(cfg))


async def _serve(sink: SmtpSink, stopped: threading.Event) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()

    def _stop(_signum: int, _frame: object) -> None:
        # A plain handler, not loop.add_signal_handler: the sink's start-up (topics, state,
        # init_transactions) blocks the loop, and only a plain handler runs in between; the
        # stop flag ends those waits for Kafka.
        request_stop()
        loop.call_soon_threadsafe(stop.set)

    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, _stop)
    try:
        await sink.run(stop)
    finally:
        stopped.set()


def run_smtp_sink(config_path: str) -> None:
    """Load the config (``smtp`` and ``kafka`` sections) and run the sink until stopped.

    With ``smtp.bounce_accounts`` set, the bounce reader runs in a thread of the same process.
    """
    cfg = load_config(config_path)
    settings = cfg.section("smtp", SmtpSinkSettings)
    sink = build_sink(cfg)
    stopped = threading.Event()
    reader_failed = threading.Event()
    reader_thread: threading.Thread | None = None
    if settings.bounce_accounts:
        reader = BounceReader(cfg, settings, fetch_blob=_blob_fetcher(cfg), metrics=sink.metrics)

        def read_bounces() -> None:
            try:
                reader.run(stopped)
            except BaseException:
                # A dead reader must not leave a half-working process behind: stop it all, so
                # the supervisor restarts both (offsets of both are committed transactionally).
                log.exception("bounce reader failed; stopping the sink process")
                reader_failed.set()
                os.kill(os.getpid(), signal.SIGTERM)

        reader_thread = threading.Thread(target=read_bounces, name="bounce-reader")
        reader_thread.start()
    # HealthServer only uses .registry and .health(max_age), which SinkMetrics provides.
    health = HealthServer(
        cast(SourceMetrics, sink.metrics),
        cfg.health.host,
        cfg.health.port,
        cfg.health.max_sync_age_seconds,
    ).start()
    try:
        asyncio.run(_serve(sink, stopped))
    finally:
        health.stop()
        stopped.set()
        if reader_thread is not None:
            reader_thread.join()
    log.info("smtp sink stopped: sent=%d events=%d", sink.sent_total, sink.events_total)
    if reader_failed.is_set():
        raise click.ClickException("the bounce reader failed (see the log above)")


@click.command("smtp-sink")
@config_option
def smtp_sink(config_path: str) -> None:
    """Send ReplyCommands from mail.commands through the SMTP relay; publish DeliveryEvents."""
    run_smtp_sink(config_path)
