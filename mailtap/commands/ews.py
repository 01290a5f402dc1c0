"""``mailtap run ews-source -c CONFIG``: the Exchange source as a process (SIGTERM/SIGINT stop it;
SIGHUP reloads the accounts from CONFIG, connectors.core.source.reload)."""

from __future__ import annotations

import logging

from connectors.core.config import load_config
from connectors.core.source.reload import reload_on_sighup
from connectors.core.source.runtime import run_forever
from connectors.ews.config import SECTION, EwsSourceSettings
from connectors.ews.source import EwsSource
from mailtap.commands.common import install_stop_signals

log = logging.getLogger(__name__)


def run_ews_source(config_path: str) -> None:
    """Load the config (``ews``, ``kafka``, ``claim_check``, ``health``) and run until stopped."""
    config = load_config(config_path)
    source = EwsSource.from_config(config)
    reload_on_sighup(config_path, SECTION, EwsSourceSettings, config, source)
    run_forever(source, install_stop_signals)
    log.info("ews source stopped")
