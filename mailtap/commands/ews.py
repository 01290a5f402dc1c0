"""``mailtap run ews-source -c CONFIG``: the Exchange source as a process (SIGTERM/SIGINT stop it)."""

from __future__ import annotations

import logging
import signal
from collections.abc import Callable

from connectors.core.config import load_config
from connectors.core.kafka import request_stop
from connectors.ews.source import run_forever

log = logging.getLogger(__name__)


def _install(stop: Callable[[], None]) -> None:
    def _stop(_signum: int, _frame: object) -> None:
        request_stop()  # also ends a wait for Kafka (init_transactions, cursor read)
        stop()

    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, _stop)


def run_ews_source(config_path: str) -> None:
    """Load the config (``ews``, ``kafka``, ``claim_check``, ``health``) and run until stopped."""
    run_forever(load_config(config_path), _install)
    log.info("ews source stopped")
