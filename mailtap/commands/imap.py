"""``mailtap run imap-source -c CONFIG``: the IMAP source until SIGTERM/SIGINT; SIGHUP reloads
the accounts from CONFIG (connectors.core.reload)."""

from __future__ import annotations

import logging
import signal
import sys
from types import FrameType

from connectors.core.config import load_config
from connectors.core.kafka import request_stop
from connectors.core.reload import ConfigReloader
from connectors.imap.config import SECTION, ImapSourceSettings
from connectors.imap.source import ImapSource

log = logging.getLogger(__name__)

#: Exit status when every mailbox was fenced by another instance (not a crash: do not restart
#: in a loop against the instance that now owns the mailboxes).
EXIT_FENCED = 3


def run_imap_source(config_path: str) -> None:
    # A long-running service: state transitions, backfill progress and reloads belong on the
    # console even when the CLI's default level is WARNING (-v/-vv or MAILTAP_LOG_LEVEL go further).
    for name in ("connectors.imap", "connectors.core.contract", "connectors.core.reload"):
        if logging.getLogger(name).getEffectiveLevel() > logging.INFO:
            logging.getLogger(name).setLevel(logging.INFO)
    config = load_config(config_path)
    source = ImapSource.from_config(config)
    reloader = ConfigReloader(
        config_path,
        SECTION,
        ImapSourceSettings,
        config,
        source.settings,
        source.reconfigure,
        source.metrics,
    )

    def _stop(signum: int, _frame: FrameType | None) -> None:
        log.info("imap source: signal %d, stopping", signum)
        request_stop()  # also ends a wait for Kafka (start-up, init_transactions, cursor read)
        source.stop()

    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, _stop)
    # SIGHUP would end the process by default; a reload asked for during start-up waits for it.
    signal.signal(signal.SIGHUP, lambda _signum, _frame: reloader.request())
    reloader.follow(ready=source.started, stopping=source.stop_event)
    source.run()
    if source.all_fenced:
        log.error("imap source: every mailbox is owned by another instance; exiting")
        sys.exit(EXIT_FENCED)
