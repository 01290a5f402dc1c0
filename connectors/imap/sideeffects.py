"""What the source does to the mailbox after a commit: ``\\Seen``, or a move to another folder.

DESIGN.md: side effects happen only after the transaction that publishes the mails commits, and
go through explicit states so that a crash between the two is repaired at start-up::

    plan()      the cursor committed with the batch carries the pending action (MOVING)
    finish()    the action, idempotent on the server; then the cursor without it (MOVED),
                committed with the UPDATED events of moved mails (their new folder)

A crash after the commit and before ``finish`` leaves the pending action in the committed
cursor; the worker's next SELECT finishes it. A crash after the action and before its
confirmation finds the moved mails gone: they are looked up in the target folder from the
UIDNEXT it had before the move (``PendingSideEffect.target_uidnext``).

Checkpoints (:mod:`connectors.core.checkpoints`): ``after_commit`` (committed, not done: MOVING)
and ``after_side_effect`` (done, its confirmation not committed yet).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace

from connectors.core import checkpoints
from connectors.core.kafka.transactions import SourceRecord
from connectors.imap.config import ImapAccountSettings
from connectors.imap.connection import SEEN, FetchedMail, ImapConnection
from connectors.imap.cursor import Commit, Cursor, PendingSideEffect
from connectors.imap.errors import UidValidityChanged
from connectors.imap.index import AccountIndex
from connectors.imap.records import ChangeKind, RecordBuilder

__all__ = ["SideEffects"]


class SideEffects:
    """The after-commit action of one folder (``after_commit``: seen, or move:<folder>)."""

    def __init__(
        self,
        *,
        account: ImapAccountSettings,
        folder: str,
        index: AccountIndex,
        builder: RecordBuilder,
        cursor: Callable[[], Cursor | None],
        commit: Commit,
    ) -> None:
        self.account = account
        self.folder = folder
        self.index = index
        self.builder = builder
        self._cursor = cursor
        self._commit = commit

    def plan(self, conn: ImapConnection, mails: Sequence[FetchedMail]) -> PendingSideEffect | None:
        """The action to record in the cursor of the batch that publishes ``mails``."""
        action = self.account.after_commit
        if action == "none" or not mails:
            return None
        target_uidnext = None
        if self.account.move_target:
            conn.create_folder(self.account.move_target)
            target_uidnext = conn.status(self.account.move_target).uidnext
        return PendingSideEffect(action, tuple(m.uid for m in mails), target_uidnext)

    def finish(
        self, conn: ImapConnection, pending: PendingSideEffect, fetched: Mapping[int, FetchedMail]
    ) -> bool:
        """Apply ``pending`` (idempotent on the server), then commit the cursor without it.
        Returns whether flags were stored on this connection (its own IDLE does not announce
        them: the worker syncs again).

        A move also publishes UPDATED events with the new folder, so the compacted topic says
        where the mail went (DESIGN.md: a move is an update, not a delete).
        """
        cursor = self._cursor()
        assert cursor is not None
        uids = list(pending.uids)
        records: dict[tuple[str, bytes], SourceRecord] = {}
        flagged = False
        if pending.action == "seen":
            conn.add_flags(uids, [SEEN])
            flagged = True
        elif pending.action.startswith("move:"):
            target = pending.action[5:].strip()
            missing = [u for u in uids if u not in fetched]
            present = (
                [*fetched.values(), *conn.fetch(missing)] if missing else list(fetched.values())
            )
            conn.create_folder(target)
            moved = conn.move(uids, target)
            for mail in present:
                where = moved.uids.get(mail.uid) if moved is not None else None
                location = (moved.uidvalidity, where) if moved and where else None
                self.index.remove(self.folder, mail.uid)
                key = self._moved_record(cursor, mail, target, records, location)
                if key is not None and self.index.left_folder(key, self.folder):
                    # The mail left this folder: its key index record here goes too.
                    records.update(((r.topic, r.key), r) for r in self.builder.departure(key))
            gone = set(uids) - {m.uid for m in present}
            if gone and pending.target_uidnext is not None:
                # The crash came after the move: the mails are in the target folder now.
                there = conn.select(target, readonly=True)
                for mail in conn.fetch(conn.uids_from(pending.target_uidnext)):
                    self._moved_record(cursor, mail, target, records, (there.uidvalidity, mail.uid))
                status = conn.select(self.folder)
                if status.uidvalidity != cursor.uidvalidity:
                    raise UidValidityChanged(f"UIDVALIDITY of {self.folder} changed")
        checkpoints.reached("after_side_effect")
        self._commit(list(records.values()), replace(cursor, pending=None))
        return flagged

    def _moved_record(
        self,
        cursor: Cursor,
        mail: FetchedMail,
        target: str,
        records: dict[tuple[str, bytes], SourceRecord],
        location: tuple[int, int] | None,
    ) -> str | None:
        """The UPDATED event of a mail we moved to ``target``, at ``location`` (uidvalidity,
        uid) there when known; returns its key (None: the mail could not be parsed)."""
        uidvalidity, uid = location if location is not None else (None, None)

        def place(key: str, fingerprint: str | None) -> tuple[str, ChangeKind]:
            return self.index.place(key, fingerprint, target, uidvalidity, uid)[0], "UPDATED"

        built = self.builder.build(
            mail, cursor.uidvalidity, place, folder=target, location=location
        )
        for record in built.records:
            if record.topic != self.builder.dlq_topic:
                # By topic and key: a mail built twice (a repair) is written once.
                records[(record.topic, record.key)] = record
        return built.key
