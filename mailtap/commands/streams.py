"""``mailtap run streams -c CONFIG``: the faust worker that turns mail events into reply commands."""

from __future__ import annotations

import logging
import signal
from pathlib import Path

from connectors.core.claimcheck import open_configured
from connectors.core.config import load_config
from connectors.core.errors import ConfigError
from connectors.core.kafka import request_stop
from streams.app import StreamsWorker, events_partitions
from streams.config import StreamsSettings

log = logging.getLogger(__name__)


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
    """Run until SIGTERM/SIGINT."""
    # Until faust installs its own handlers: a stop ends the wait for Kafka at start-up.
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda _signum, _frame: request_stop())
    # Under the CLI the root logger is set up (--log-format, -v): faust must not replace it with
    # its own text handler at INFO. Started otherwise (tests), faust's logging is kept.
    keep_ours = bool(logging.getLogger().handlers)
    build_worker(config_path).run(override_logging=not keep_ours)
