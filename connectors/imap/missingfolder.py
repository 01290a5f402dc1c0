"""A watched folder that is gone (deleted, renamed, or never created): said once, looked for at
the backoff cap's pace on the same connection, and read again as soon as it exists.

The account's other folders have their own workers and go on meanwhile.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from connectors.imap.config import ImapAccountSettings
from connectors.imap.connection import ImapConnection
from connectors.imap.errors import FolderMissing

__all__ = ["MissingFolder"]

log = logging.getLogger(__name__)


class MissingFolder:
    """The missing-folder state of one folder worker."""

    def __init__(
        self,
        *,
        account: ImapAccountSettings,
        folder: str,
        cap_seconds: float,
        stop: threading.Event,
        backing_off: Callable[[FolderMissing, str], None],
    ) -> None:
        self.account = account
        self.folder = folder
        self.cap_seconds = cap_seconds
        self.stop = stop
        #: Tells the worker it waits (its last error and BACKOFF state, with the reason).
        self._backing_off = backing_off
        #: The folder was found missing and said so; cleared once it exists again.
        self.reported = False

    def wait_for(self, conn: ImapConnection, missing: FolderMissing) -> bool:
        """Look for the folder every ``cap_seconds`` until it exists (True: drop this
        connection, a new session selects it) or the source stops (False)."""
        cap = self.cap_seconds
        self._backing_off(missing, f"{missing}; looking again every {cap:.0f}s")
        if not self.reported:
            self.reported = True
            log.error(
                "imap %s/%s: the folder does not exist on the server (deleted or renamed?). "
                "Nothing is read from it until it exists again (checked every %.0f s); the "
                "account's other folders go on. Create it again, or remove it from "
                "imap.accounts[].folders.",
                self.account.name,
                self.folder,
                cap,
            )
        while not self.stop.wait(cap):
            if conn.folder_exists(self.folder):
                return True
        return False

    def selected(self) -> None:
        """The folder was selected: say it is back, once, when it had been missing."""
        if self.reported:
            self.reported = False
            log.info(
                "imap %s/%s: the folder exists again; reading it", self.account.name, self.folder
            )
