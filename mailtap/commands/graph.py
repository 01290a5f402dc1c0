"""``mailtap run graph-source -c CONFIG``: the Microsoft Graph source as a process (SIGTERM/SIGINT stop it;
SIGHUP reloads the accounts from CONFIG, connectors.core.source.reload)."""

from __future__ import annotations

import logging

from connectors.core.config import load_config
from connectors.core.source.reload import reload_on_sighup
from connectors.core.source.runtime import run_forever
from connectors.graph.config import SECTION, GraphSourceSettings
from connectors.graph.source import GraphSource
from mailtap.commands.common import install_stop_signals

log = logging.getLogger(__name__)


def run_graph_source(config_path: str) -> None:
    """Load the config (``graph``, ``kafka``, ``claim_check``, ``health``) and run until stopped."""
    config = load_config(config_path)
    source = GraphSource.from_config(config)
    reload_on_sighup(config_path, SECTION, GraphSourceSettings, config, source)
    run_forever(source, install_stop_signals)
    log.info("graph source stopped")
