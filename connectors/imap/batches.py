"""One folder's batches of mail: built into records with the account index's placement, and
committed with their claim-check blobs, through the worker's one write.

Handed to the worker's collaborators that publish mail (new mail, flag changes, the backfill):
each batch is one Kafka transaction of its events, DLQ records and key index records, and the
folder's new cursor (:class:`~connectors.imap.cursor.Commit`).
"""

from __future__ import annotations

import functools
from collections.abc import Callable

from connectors.core import checkpoints
from connectors.core.claimcheck.store import ClaimCheckBatch
from connectors.core.metrics import SourceMetrics
from connectors.imap.connection import FetchedMail
from connectors.imap.cursor import Commit, Cursor
from connectors.imap.index import AccountIndex
from connectors.imap.records import BuiltMail, ChangeKind, RecordBuilder

__all__ = ["FolderBatches"]


class FolderBatches:
    """Builds, commits and counts the batches of one folder worker (on its thread)."""

    def __init__(
        self,
        *,
        folder: str,
        index: AccountIndex,
        builder: RecordBuilder,
        metrics: SourceMetrics,
        labels: tuple[str, str, str],
        cursor: Callable[[], Cursor | None],
        commit: Commit,
    ) -> None:
        self.folder = folder
        self.index = index
        self.builder = builder
        self.metrics = metrics
        self.labels = labels
        self._cursor = cursor
        self._commit = commit
        #: ``(key, folder, uid)`` of the mail `build_all` placed as new, until its commit.
        self._new: list[tuple[str, str, int]] = []

    def build_all(
        self,
        mails: list[FetchedMail],
        change: Callable[[FetchedMail], ChangeKind],
        blobs: ClaimCheckBatch | None,
    ) -> list[BuiltMail]:
        cursor = self._cursor()
        assert cursor is not None
        uidvalidity = cursor.uidvalidity

        def change_for(
            mail: FetchedMail, key: str, fingerprint: str | None
        ) -> tuple[str, ChangeKind]:
            kind = change(mail)
            key, known = self.index.place(key, fingerprint, self.folder, uidvalidity, mail.uid)
            if kind == "ADDED" and known:
                return key, "UPDATED"  # published before, in another folder: a move or a copy
            if not known:
                self._new.append((key, self.folder, mail.uid))
            return key, kind

        self._new = []

        return self.builder.build_all(mails, uidvalidity, change_for, blobs)

    def commit(self, built: list[BuiltMail], cursor: Cursor, blobs: ClaimCheckBatch | None) -> None:
        records = [r for b in built for r in b.records]
        checkpoints.reached("before_write")
        # The batch's blobs become durable while its records go out, before the commit.
        durable = functools.partial(_make_durable, blobs) if blobs is not None else None
        try:
            self._commit(records, cursor, before_commit=durable)
        except BaseException:
            # Not committed: the batch's new mail is new again for the retry (ADDED).
            self.index.unplace(self._new)
            raise
        finally:
            new, self._new = self._new, []
        # New mail another folder published meanwhile (moved at once): published there again.
        self.index.republish_elsewhere(new)
        self.count(built)

    def count(self, built: list[BuiltMail]) -> None:
        events = sum(1 for b in built if b.key is not None)
        dlq = sum(1 for b in built if b.dlq or b.key is None)
        if events:
            self.metrics.events_produced.labels(*self.labels).inc(events)
        if dlq:
            self.metrics.dlq_records.labels(*self.labels).inc(dlq)


def _make_durable(blobs: ClaimCheckBatch) -> None:
    blobs.commit()
