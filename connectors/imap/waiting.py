"""Waiting for a folder's next change: IDLE (RFC 2177) where the account asks for it and the
server has it, a poll otherwise, and a catch-up every ``catchup_poll_seconds`` either way.

The catch-up is the low-frequency sync that also looks for expunges (and, without MODSEQs, for
flag changes): it catches what a dropped IDLE missed (DESIGN.md, reliability rules).
"""

from __future__ import annotations

import logging
import threading
import time

from connectors.core.source.state import StateMachine
from connectors.imap.config import ImapAccountSettings, ImapSourceSettings
from connectors.imap.connection import ImapConnection
from connectors.imap.index import AccountIndex
from connectors.imap.state import WorkerState

__all__ = ["IDLE_SLICE_S", "ChangeWait"]

log = logging.getLogger(__name__)

S = WorkerState
#: IDLE periods in a row that ended with nothing announced while the sync after each found new
#: mail: the server's IDLE notifications do not arrive. More than one, because a mail appended
#: in the last ~0.5 s of a period (Dovecot's notification delay) is found by the sync first.
SILENT_IDLE_PERIODS = 3
#: Length of one idle_check() slice: bounds how long a stop request waits, and how fast an
#: imapclient #565 early return (EOF swallowed) is noticed.
IDLE_SLICE_S = 1.0


class ChangeWait:
    """The waits of one folder worker, between its syncs, on its thread."""

    def __init__(
        self,
        *,
        account: ImapAccountSettings,
        folder: str,
        settings: ImapSourceSettings,
        index: AccountIndex,
        machine: StateMachine[WorkerState],
        stop: threading.Event,
    ) -> None:
        self.account = account
        self.folder = folder
        self.settings = settings
        self.index = index
        self.machine = machine
        self.stop = stop
        self._last_catchup = 0.0
        #: The last wait was an IDLE period that ran to its end with nothing announced.
        self._quiet_idle = False
        #: Such periods after which the sync found new mail; said when it reaches
        #: SILENT_IDLE_PERIODS, once per session.
        self._silent_periods = 0

    def caught_up(self) -> None:
        """A full sync just ran (a new session's first): the next catch-up is a period away."""
        self._last_catchup = time.monotonic()
        self._quiet_idle = False
        self._silent_periods = 0

    def found_new(self, mails: int) -> None:
        """After a sync, the new mails it found. New mail found after quiet IDLE periods, again
        and again, means IDLE is not announcing anything (on Dovecot: "Inotify instance limit
        ... exceeded, disabling" in its log): new mail then waits for the light sync or the
        catch-up. Said once per session, so that it does not go unnoticed."""
        quiet, self._quiet_idle = self._quiet_idle, False
        if not quiet or mails == 0:
            return
        self._silent_periods += 1
        if self._silent_periods != SILENT_IDLE_PERIODS:
            return
        log.warning(
            "imap %s/%s: the server announced no new mail in IDLE %d periods in a row, "
            "while the sync after each found new mail: its IDLE notifications do not arrive "
            "(Dovecot: look for 'Inotify instance limit' in its log, raise "
            "fs.inotify.max_user_instances). New mail waits up to uidvalidity_check_seconds "
            "(%g s) meanwhile; said once per connection",
            self.account.name,
            self.folder,
            self._silent_periods,
            self.settings.uidvalidity_check_seconds,
        )

    def wait(self, conn: ImapConnection, flags_listed: bool) -> bool:
        """Wait for a change; returns True when the next sync must also look for expunges.

        ``flags_listed``: the folder has no MODSEQs, so a FETCH announced in IDLE is found by the
        flag listing of such a sync."""
        now = time.monotonic()
        catchup_due = self._last_catchup + self.settings.catchup_poll_seconds
        if self.account.mode == "idle" and conn.supports_idle:
            self.machine.to(S.IDLE)
            # Dovecot tells an IDLE session neither a UIDVALIDITY change nor a deleted folder;
            # it answers the next command with BYE. The light sync after this IDLE period
            # (NOOP + STATUS) is that command.
            period = min(self.settings.idle_renew_seconds, self.settings.uidvalidity_check_seconds)
            deadline = min(now + period, catchup_due)
            outcome = conn.idle_until(deadline, self._interrupted, IDLE_SLICE_S)
            expunged = outcome.expunged or outcome.other or (outcome.flags_changed and flags_listed)
            # Ran to its end with nothing announced (not cut short by a stop or another folder).
            self._quiet_idle = not outcome.activity and time.monotonic() >= deadline
            if outcome.new_mail:
                self._silent_periods = 0  # IDLE does announce new mail
        else:
            self._quiet_idle = False
            self.machine.to(S.POLLING)
            self.stop.wait(max(0.0, min(self.settings.poll_interval_seconds, catchup_due - now)))
            expunged = False
        if time.monotonic() >= catchup_due:
            self._last_catchup = time.monotonic()
            return True
        return expunged

    def _interrupted(self) -> bool:
        """Leave IDLE: stopping, or another folder of the account waits for this one to sync."""
        return self.stop.is_set() or self.index.rounds.wanted(self.folder)
