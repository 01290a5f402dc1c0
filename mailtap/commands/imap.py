"""``mailtap run imap-source -c CONFIG``: the IMAP source until SIGTERM/SIGINT."""

from __future__ import annotations

import logging
import signal
import sys
from types import FrameType

from connectors.core.config import load_config
from connectors.imap.source import ImapSource

log = logging.getLogger(__name__)

#: Exit status when every mailbox was fenced by another instance (not a crash: do not restart
#: in a loop against the instance that now owns the mailboxes).
EXIT_FENCED = 3


def run_imap_source(config_path: str) -> None:
    config = load_config(config_path)
    source = ImapSource.from_config(config)

    def _stop(signum: int, _frame: FrameType | None) -> None:
        log.info("imap source: signal %d, stopping", signum)
        source.stop()

    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, _stop)
    source.run()
    if source.all_fenced:
        log.error("imap source: every mailbox is owned by another instance; exiting")
        sys.exit(EXIT_FENCED)
