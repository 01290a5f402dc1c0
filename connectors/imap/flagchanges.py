"""Flag changes of published mails: UPDATED events with the whole mail, with or without MODSEQs.

With CONDSTORE (RFC 7162) the folder's HIGHESTMODSEQ says that something changed and
``UID SEARCH MODSEQ`` which mails: :meth:`FlagChanges.sync_modseq` publishes them in windows, and
the cursor remembers how far it got (``changes_done``) and which mails went out at a MODSEQ above
the one it syncs to (``fresh``), so a restart neither repeats nor misses one. Without MODSEQs (no
CONDSTORE, or a NOMODSEQ folder) :meth:`FlagChanges.sync_listed` compares a FLAGS listing with
the flags last seen (:mod:`connectors.imap.flaglisting`). Everything goes through the worker's
batch commit, one transaction per batch.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace

from connectors.core.claimcheck.store import ClaimCheckBatch
from connectors.imap.backfill import SIZE_WINDOW
from connectors.imap.connection import FetchedMail, ImapConnection
from connectors.imap.cursor import Commit, Cursor, chunks, skip_unchanged
from connectors.imap.flaglisting import FlagSnapshot, uid_windows
from connectors.imap.records import BuiltMail, ChangeKind, RecordBuilder

__all__ = ["FlagChanges"]

#: ``build_all(mails, change, blobs)``: the worker's records of a batch, placed in the index.
BuildAll = Callable[
    [list[FetchedMail], Callable[[FetchedMail], ChangeKind], ClaimCheckBatch | None],
    list[BuiltMail],
]
#: ``commit_batch(built, cursor, blobs)``: the worker's commit of a built batch.
CommitBatch = Callable[[list[BuiltMail], Cursor, ClaimCheckBatch | None], None]


def _updated(_mail: FetchedMail) -> ChangeKind:
    return "UPDATED"


class FlagChanges:
    """The flag changes of one folder."""

    def __init__(
        self,
        *,
        batch_size: int,
        builder: RecordBuilder,
        cursor: Callable[[], Cursor | None],
        set_cursor: Callable[[Cursor], None],
        build_all: BuildAll,
        commit_batch: CommitBatch,
        commit: Commit,
    ) -> None:
        self._batch_size = batch_size
        self.builder = builder
        self._cursor = cursor
        self._set_cursor = set_cursor
        self._build_all = build_all
        self._commit_batch = commit_batch
        self._commit = commit
        #: Without MODSEQs: the flags last seen per UID, compared at each catch-up.
        self._seen = FlagSnapshot()
        #: The selected folder has no MODSEQs: flag changes come from listings.
        self.listing = False

    def _current(self) -> Cursor:
        cursor = self._cursor()
        assert cursor is not None
        return cursor

    def sync_modseq(self, conn: ImapConnection, hms: int) -> int:
        """Flag changes of published mails up to ``hms`` (RFC 7162)."""
        cursor = self._current()
        if hms <= cursor.highestmodseq:
            return 0
        if cursor.last_uid == 0:
            # Nothing published yet, so no change to publish; the next batch commits this.
            self._set_cursor(replace(cursor, highestmodseq=hms, fresh=()))
            return 0
        # Mails we published (above the start position, up to the last UID), in windows: a
        # whole folder marked read is streamed, not held.
        changed = conn.uids_changed_since(cursor.highestmodseq)
        candidates = changed.between(cursor.floor_uid + 1, cursor.last_uid)
        # An earlier change sync toward ``target`` got through ``done_uid`` before it stopped.
        target, done_uid = cursor.changes_done or (0, 0)
        # Published at a MODSEQ above ``hms`` (changed again since STATUS): not a change next time.
        above: list[tuple[int, int]] = []
        count = 0
        for window in chunks(candidates, SIZE_WINDOW):
            states = [
                s
                for s in conn.flags(window)
                if not skip_unchanged(cursor.fresh, s.uid, s.modseq)
                and not (s.uid <= done_uid and (s.modseq or 0) <= target)
            ]
            for group in chunks([s.uid for s in states], self._batch_size):
                fetched = conn.fetch(group)
                with self.builder.staged_blobs() as blobs:
                    built = self._build_all(fetched, _updated, blobs)
                    above += [(m.uid, m.modseq) for m in fetched if m.modseq and m.modseq > hms]
                    progress = replace(
                        cursor, fresh=cursor.fresh + tuple(above), changes_done=(hms, group[-1])
                    )
                    self._commit_batch(built, progress, blobs)
                count += len(fetched)
        # Every change up to ``hms`` is published now; keep only what went out above it.
        done = replace(
            cursor,
            highestmodseq=hms,
            fresh=tuple(p for p in cursor.fresh + tuple(above) if p[1] > hms),
            changes_done=None,
        )
        self._set_cursor(done)
        if count or cursor.fresh or cursor.changes_done:
            self._commit([], done)
        return count

    def sync_listed(self, conn: ImapConnection) -> int:
        """Flag changes without MODSEQs (:mod:`connectors.imap.flaglisting`): UPDATED events for
        the published mails whose FLAGS differ from those last seen, cursor unchanged."""
        cursor = self._current()
        count = 0
        present: set[int] = set()
        for low, high in uid_windows(cursor.floor_uid + 1, cursor.last_uid):
            listed = conn.flags_between(low, high)
            present.update(uid for uid, _ in listed)
            changed = self._seen.changed(cursor.uidvalidity, listed)
            for group in chunks(changed, self._batch_size):
                fetched = conn.fetch(group)
                with self.builder.staged_blobs() as blobs:
                    built = self._build_all(fetched, _updated, blobs)
                    self._commit_batch(built, cursor, blobs)
                self.remember(cursor.uidvalidity, fetched)
                count += len(fetched)
        self._seen.retain(present)
        return count

    def remember(self, uidvalidity: int, fetched: Sequence[FetchedMail]) -> None:
        """Published mails' flags: the baseline of the next FLAGS listing (without MODSEQs)."""
        if self.listing:
            self._seen.remember(uidvalidity, ((m.uid, m.flags) for m in fetched))
