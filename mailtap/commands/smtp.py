"""``mailtap run smtp-sink -c CONFIG``: the SMTP sink as a process (SIGTERM/SIGINT stop it cleanly)."""

from __future__ import annotations

import asyncio
import logging
import signal
from functools import cache

import click

from connectors.core.claimcheck import ClaimCheckStore, open_claim_check
from connectors.core.config import MailtapConfig, load_config
from connectors.smtp.config import SmtpSinkSettings
from connectors.smtp.sink import SmtpSink
from mailtap.commands.common import config_option

log = logging.getLogger(__name__)


def build_sink(cfg: MailtapConfig) -> SmtpSink:
    settings = cfg.section("smtp", SmtpSinkSettings)
    url = cfg.claim_check.url

    @cache
    def store() -> ClaimCheckStore:
        # Opened on first use: a sink whose commands carry no attachment needs no store.
        return open_claim_check(url)

    return SmtpSink(cfg, settings, fetch_blob=lambda uri: store().get(uri))


async def _serve(sink: SmtpSink) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await sink.run(stop)


def run_smtp_sink(config_path: str) -> None:
    """Load the config (``smtp`` and ``kafka`` sections) and run the sink until stopped."""
    cfg = load_config(config_path)
    sink = build_sink(cfg)
    asyncio.run(_serve(sink))
    log.info("smtp sink stopped: sent=%d events=%d", sink.sent_total, sink.events_total)


@click.command("smtp-sink")
@config_option
def smtp_sink(config_path: str) -> None:
    """Send ReplyCommands from mail.commands through the SMTP relay; publish DeliveryEvents."""
    run_smtp_sink(config_path)
