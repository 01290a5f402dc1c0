"""``mailtap run ews-source -c CONFIG``: the Exchange source as a process (SIGTERM/SIGINT stop it)."""

from __future__ import annotations

import signal
from collections.abc import Callable

from connectors.core.config import load_config
from connectors.ews.source import run_forever


def _install(stop: Callable[[], None]) -> None:
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda _signum, _frame: stop())


def run_ews_source(config_path: str) -> None:
    """Load the config (``ews``, ``kafka``, ``claim_check``, ``health``) and run until stopped."""
    run_forever(load_config(config_path), _install)
