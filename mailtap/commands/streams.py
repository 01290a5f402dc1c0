"""``mailtap run streams -c CONFIG``: the faust worker that turns mail events into reply commands."""

from __future__ import annotations

import logging
import os
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any, cast

import faust

from connectors.core.claimcheck.open import open_configured
from connectors.core.config import MailtapConfig, load_config
from connectors.core.errors import ConfigError
from connectors.core.kafka.clients import request_stop
from connectors.core.metrics import HealthServer, SourceMetrics
from mailtap.commands.streams_health import HEARTBEAT_SECONDS, StreamsHealth
from streams.app import StreamsWorker, ensure_streams_topics, events_partitions
from streams.auth import startup_notes
from streams.config import StreamsSettings

log = logging.getLogger(__name__)

#: How long faust's graceful stop may take after SIGTERM/SIGINT. With Kafka unreachable it waits
#: on the offset commit and the producer flush without end (measured: still running 60 s after
#: SIGTERM during a broker outage). Leaving then loses nothing: the worker is at-least-once with
#: idempotent outputs (deterministic command ids), so the next start re-reads from the committed
#: offsets and re-emits the same commands.
STOP_GRACE_S = 2.0


class BoundedStopWorker(faust.Worker):
    """faust's worker whose stop after a signal ends within :data:`STOP_GRACE_S`."""

    def _schedule_shutdown(self, signal: Any) -> None:  # mode.Worker's one signal entry point
        if not self._signal_stop_time:
            request_stop()  # threads cancelled from here on end quietly (mailtap.logs)
            threading.Thread(target=_exit_after_grace, name="stop-deadline", daemon=True).start()
        super()._schedule_shutdown(signal)


def _exit_after_grace() -> None:
    time.sleep(STOP_GRACE_S)
    log.warning(
        "streams: not stopped %.0fs after the signal (Kafka unreachable?); exiting now, the "
        "next start re-reads from the committed offsets",
        STOP_GRACE_S,
    )
    for handler in logging.getLogger().handlers:
        handler.flush()
    sys.stderr.flush()
    os._exit(0)


def build_worker(config_path: str) -> StreamsWorker:
    """Load and validate the configuration, look up the partition count, build the app."""
    cfg = load_config(config_path)
    settings = cfg.section("streams", StreamsSettings)
    try:
        # faust creates only the last directory of the path (a FileNotFoundError traceback when
        # the default .state/streams is used outside a checkout).
        Path(settings.data_dir).mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ConfigError(
            f"streams.data_dir: cannot create {settings.data_dir!r} ({exc.strerror}); set "
            f"streams.data_dir to a writable directory"
        ) from None
    store = open_configured(cfg.claim_check)
    ensure_streams_topics(cfg.kafka, settings.app_id)
    partitions = events_partitions(cfg.kafka)
    log.info(
        "streams %s: %d partitions of %s, %d rules",
        settings.app_id,
        partitions,
        cfg.kafka.topics.events,
        len(settings.rules),
    )
    for note in startup_notes(settings):
        log.info("sender authentication: %s", note)
    return StreamsWorker(settings, cfg.kafka, partitions=partitions, load_raw=store.get)


def run_streams(config_path: str) -> None:
    """Run until SIGTERM/SIGINT; with a ``health`` section, /healthz and /metrics too."""
    # Until faust installs its own handlers: a stop ends the wait for Kafka at start-up.
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda _signum, _frame: request_stop())
    # Under the CLI the root logger is set up (--log-format, -v): faust must not replace it with
    # its own text handler at INFO. Started otherwise (tests), faust's logging is kept.
    keep_ours = bool(logging.getLogger().handlers)
    options: dict[str, Any] = {
        "override_logging": not keep_ours,
        "worker_class": BoundedStopWorker,
    }
    cfg = load_config(config_path)
    worker = build_worker(config_path)
    if not serves_health(cfg):
        worker.run(**options)
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
        worker.run(**options)
    finally:
        server.stop()


def serves_health(cfg: MailtapConfig) -> bool:
    """Only a file with a ``health:`` section (or MAILTAP__HEALTH__*) opens the port: the worker
    served none before, and files without one may run several workers on one host."""
    return "health" in cfg.model_fields_set
