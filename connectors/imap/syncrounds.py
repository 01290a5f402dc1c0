"""Which folders of an account have synced since a given moment: the clock of the tombstone rule.

IMAP has no "moved" signal: a mail moved from INBOX to Archive is an EXPUNGE in INBOX and an
EXISTS in Archive, seen by two workers in any order. The INBOX worker may see its mail gone
before the Archive worker has read the new copy, so "the key is in no other folder" is only
known once every other watched folder of the account has been synced *past the expunge*: a
sync of that folder that began after the expunge was seen has published whatever the folder
held at that time (a server puts the copy in the target before it expunges the source, RFC
6851 section 3.3), and registered it in the account index. The rule holds whatever the key
kind: a mail without a Message-ID cannot be searched for on the server, but it can wait.

Moments are tickets of one counter per account::

    INBOX  sees uid 7 gone       ticket 12   -> decision waits for Archive and Sent
    Archive sync begins          ticket 13   (began after 12)
    Archive sync done            past 12 for Archive; Sent still before 12
    Sent    sync begins/done     ticket 14   -> every other folder past 12: decide

A worker waiting for others asks them to sync (``request``) so that an idle folder does not
delay a tombstone until its next catch-up poll, and is asked itself to sync again once one of
them is done (``wanted``), to decide. Thread-safe: the folder workers of an account share it.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable


class SyncRounds:
    """Sync tickets of an account's folders (in memory: a restart sees every expunge again,
    because the index rebuilt from the events topic still has the mail where it was)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._clock = 0
        #: folder -> ticket at which its last completed sync began.
        self._synced_from: dict[str, int] = {}
        #: Folders asked to sync at their next chance (checked between IDLE slices).
        self._wanted: set[str] = set()
        #: Folders with an expunge decision waiting for the others.
        self._waiting: set[str] = set()

    def now(self) -> int:
        """A ticket for something just seen (an expunge)."""
        with self._lock:
            self._clock += 1
            return self._clock

    def begin(self, folder: str) -> int:
        """``folder``'s sync begins (before it asks the server anything): its ticket."""
        with self._lock:
            self._wanted.discard(folder)
            self._clock += 1
            return self._clock

    def done(self, folder: str, ticket: int) -> None:
        """The sync of ``folder`` that began at ``ticket`` completed (everything it found is
        published and in the index). Folders waiting on it are asked to sync, to decide."""
        with self._lock:
            self._synced_from[folder] = max(self._synced_from.get(folder, 0), ticket)
            self._wanted |= self._waiting - {folder}

    def past(self, ticket: int, folders: Iterable[str]) -> bool:
        """True when every one of ``folders`` completed a sync that began after ``ticket``."""
        with self._lock:
            return all(self._synced_from.get(f, 0) > ticket for f in folders)

    def behind(self, ticket: int, folders: Iterable[str]) -> list[str]:
        """The ``folders`` not synced past ``ticket`` yet (for the log)."""
        with self._lock:
            return [f for f in folders if self._synced_from.get(f, 0) <= ticket]

    def wait_for_others(self, folder: str, others: Iterable[str]) -> None:
        """``folder`` has a decision pending: ask ``others`` to sync now."""
        with self._lock:
            self._waiting.add(folder)
            self._wanted.update(others)

    def ask(self, folders: Iterable[str]) -> None:
        """Ask ``folders`` to sync at their next chance (they have something to publish)."""
        with self._lock:
            self._wanted.update(folders)

    def settled(self, folder: str) -> None:
        """``folder`` has no decision pending any more."""
        with self._lock:
            self._waiting.discard(folder)

    def wanted(self, folder: str) -> bool:
        """True when ``folder`` was asked to sync (cleared by its next ``begin``)."""
        with self._lock:
            return folder in self._wanted
