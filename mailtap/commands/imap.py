"""``mailtap run imap-source -c CONFIG``: the IMAP source until SIGTERM/SIGINT; SIGHUP reloads
the accounts from CONFIG (connectors.core.source.reload)."""

from __future__ import annotations

import logging
import sys

from connectors.core.config import load_config
from connectors.core.source.reload import reload_on_sighup
from connectors.core.source.runtime import run_forever
from connectors.imap.config import SECTION, ImapSourceSettings
from connectors.imap.source import ImapSource
from mailtap.commands.common import install_stop_signals

log = logging.getLogger(__name__)

#: Exit status when every mailbox was fenced by another instance (not a crash: do not restart
#: in a loop against the instance that now owns the mailboxes).
EXIT_FENCED = 3


def run_imap_source(config_path: str) -> None:
    # A long-running service: state transitions and backfill progress belong on the console
    # even when the CLI's default level is WARNING (-v/-vv or MAILTAP_LOG_LEVEL go further).
    for name in (
        "connectors.imap",
        "connectors.core.source.runtime",
        "connectors.core.kafka.transactions",
    ):
        if logging.getLogger(name).getEffectiveLevel() > logging.INFO:
            logging.getLogger(name).setLevel(logging.INFO)
    config = load_config(config_path)
    source = ImapSource.from_config(config)
    reload_on_sighup(config_path, SECTION, ImapSourceSettings, config, source)
    run_forever(source, install_stop_signals)
    if source.all_fenced:
        log.error("imap source: every mailbox is owned by another instance; exiting")
        sys.exit(EXIT_FENCED)
