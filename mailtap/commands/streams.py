"""``mailtap run streams -c CONFIG``: the faust worker that turns mail events into reply commands."""

from __future__ import annotations

import logging
from typing import cast

from connectors.core.claimcheck import open_configured
from connectors.core.config import MailtapConfig, load_config
from connectors.core.metrics import HealthServer, SourceMetrics
from mailtap.commands.streams_health import HEARTBEAT_SECONDS, StreamsHealth
from streams.app import StreamsWorker, events_partitions
from streams.config import StreamsSettings

log = logging.getLogger(__name__)


def build_worker(config_path: str) -> StreamsWorker:
    """Load and validate the configuration, look up the partition count, build the app."""
    cfg = load_config(config_path)
    settings = cfg.section("streams", StreamsSettings)
    store = open_configured(cfg.claim_check)
    partitions = events_partitions(cfg.kafka)
    log.info(
        "streams %s: %d partitions of %s, %d rules",
        settings.app_id,
        partitions,
        cfg.kafka.topics.events,
        len(settings.rules),
    )
    return StreamsWorker(settings, cfg.kafka, partitions=partitions, load_raw=store.get)


def run_streams(config_path: str) -> None:
    """Run until SIGTERM/SIGINT; with a ``health`` section, /healthz and /metrics too."""
    cfg = load_config(config_path)
    worker = build_worker(config_path)
    if not serves_health(cfg):
        worker.run()
        return
    health = StreamsHealth(cfg.kafka.topics.events)

    async def report() -> None:
        health.observe(worker.app)
        health.observe_tables(vars(worker.tables))

    worker.outcome_hooks.append(
        lambda outcome, record: health.observe_outcome(outcome, record=record)
    )

    worker.app.timer(HEARTBEAT_SECONDS)(report)
    h = cfg.health
    # HealthServer only uses .registry and .health(max_age), which StreamsHealth provides.
    server = HealthServer(cast(SourceMetrics, health), h.host, h.port, h.max_sync_age_seconds)
    server.start()
    try:
        worker.run()
    finally:
        server.stop()


def serves_health(cfg: MailtapConfig) -> bool:
    """Only a file with a ``health:`` section (or MAILTAP__HEALTH__*) opens the port: the worker
    served none before, and files without one may run several workers on one host."""
    return "health" in cfg.model_fields_set
