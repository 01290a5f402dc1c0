"""One mailbox (account, folder): connect, sync exactly once into Kafka, wait, repeat.

Lifecycle (one thread per worker; imapclient is not thread-safe, so the connection never leaves
this thread)::

    run()
      writer = TransactionalSourceWriter(txn id of (account, folder))   # fences a zombie
      cursor = offsets topic, read_committed, AFTER init_transactions   # zombie's txn aborted
      loop: session() until stopped; any error -> BACKOFF -> reconnect

    session()
      CONNECTING -> AUTHENTICATING -> SELECTING (UIDVALIDITY check, start position, repair of
      an unfinished side effect) -> SYNCING <-> IDLE | POLLING

    sync()
      1. flag changes of published mails (CONDSTORE: UID SEARCH MODSEQ) -> UPDATED events
      2. new mails (UID SEARCH last_uid+1:*), in batches -> ADDED (RESCANNED after an epoch change)
      3. expunges (on start, on catch-up polls, after an EXPUNGE) -> tombstones when gone everywhere;
         on a reconnect with QRESYNC (RFC 7162) the SELECT's VANISHED answer replaces the listing
      every batch = one Kafka transaction: its events + DLQ records + the new cursor.

Checkpoints (:mod:`connectors.core.checkpoints`, where the kill -9 tests crash): besides the
shared ``before_write`` and ``in_transaction``, ``after_commit`` (committed, the side effect not done yet: state MOVING) and
``after_side_effect`` (side effect done, its confirmation MOVED not committed yet).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Unpack

from connectors.core import checkpoints
from connectors.core.claimcheck.store import ClaimCheckBatch
from connectors.core.kafka.transactions import SourceRecord
from connectors.core.source.backoff import Backoff
from connectors.core.source.location import SourceLocation
from connectors.core.source.worker import FolderWorker, FolderWorkerRuntime
from connectors.imap.backfill import (
    Backfill,
    BatchParsing,
    Progress,
    advanced,
    fetch_groups,
)
from connectors.imap.batches import FolderBatches
from connectors.imap.capabilities import FallbackReport
from connectors.imap.config import ImapAccountSettings, ImapSourceSettings
from connectors.imap.connection import FetchedMail, ImapConnection
from connectors.imap.cursor import (
    Cursor,
    on_select,
)
from connectors.imap.errors import (
    ConnectionLost,
    FolderMissing,
    ImapProtocolError,
    UidValidityChanged,
)
from connectors.imap.expunges import ExpungeTracker
from connectors.imap.flagchanges import FlagChanges
from connectors.imap.index import AccountIndex
from connectors.imap.missingfolder import MissingFolder
from connectors.imap.records import ChangeKind, RecordBuilder
from connectors.imap.sideeffects import SideEffects
from connectors.imap.state import StateMachine, WorkerState
from connectors.imap.waiting import ChangeWait

log = logging.getLogger(__name__)

S = WorkerState
#: Mails of the batch a backfill publishes from the mailbox thread while the parse processes
#: start: small, so that its parse (and the first event) does not take long on a machine
#: busy with those processes' imports (200 mails took 0.7-0.8 s at the load of a soak).
FIRST_BATCH_INLINE = 20
SOURCE_KIND = "imap"


def _updated(_mail: FetchedMail) -> ChangeKind:
    return "UPDATED"


class MailboxWorker(FolderWorker[WorkerState]):
    """Publishes one folder of one account. ``run()`` (the source contract's loop,
    :class:`~connectors.core.source.worker.FolderWorker`) is the thread body; ``stop`` ends it."""

    connection_lost = ConnectionLost

    def __init__(
        self,
        *,
        account: ImapAccountSettings,
        folder: str,
        settings: ImapSourceSettings,
        builder: RecordBuilder,
        index: AccountIndex,
        connection_factory: Callable[[], ImapConnection],
        watched_folders: Sequence[str],
        parsing: BatchParsing | None = None,
        **runtime: Unpack[FolderWorkerRuntime],
    ) -> None:
        super().__init__(
            where=SourceLocation(SOURCE_KIND, account.name, folder),
            machine=StateMachine(account.name, folder, on_change=self._state_changed),
            states=WorkerState,
            backoff=Backoff(settings.backoff_initial_seconds, settings.backoff_cap_seconds),
            **runtime,
        )
        metrics, stop = self.metrics, self.stop
        self.account = account
        self.folder = folder
        self.settings = settings
        self.builder = builder
        self.index = index
        self._connection_factory = connection_factory
        self._parsing = parsing
        self.cursor: Cursor | None = None
        self._changed_by_us = False
        self._conn: ImapConnection | None = None
        self._reload_cursor = True
        #: False when the last sync may have left something unpublished (see ``_session``).
        self._settled = False
        self.fallbacks = FallbackReport(
            account=account, folder=folder, settings=settings, metrics=metrics, labels=self._labels
        )
        self.missing = MissingFolder(
            account=account,
            folder=folder,
            cap_seconds=settings.backoff_cap_seconds,
            stop=stop,
            backing_off=self._backing_off,
        )
        self.waits = ChangeWait(
            account=account,
            folder=folder,
            settings=settings,
            index=index,
            machine=self.machine,
            stop=stop,
        )
        self.batches = FolderBatches(
            folder=folder,
            index=index,
            builder=builder,
            metrics=metrics,
            labels=self._labels,
            cursor=lambda: self.cursor,
            commit=self._commit,
        )
        self.flag_changes = FlagChanges(
            batch_size=settings.batch_size,
            builder=builder,
            cursor=lambda: self.cursor,
            set_cursor=self._set_cursor,
            build_all=self.batches.build_all,
            commit_batch=self.batches.commit,
            commit=self._commit,
        )
        self.expunges = ExpungeTracker(
            account=account,
            folder=folder,
            watched_folders=watched_folders,
            index=index,
            builder=builder,
            metrics=metrics,
            labels=self._labels,
            cursor=lambda: self.cursor,
            commit=self._commit,
            reselect=self._reselect,
        )
        self.side_effects = SideEffects(
            account=account,
            folder=folder,
            index=index,
            builder=builder,
            cursor=lambda: self.cursor,
            commit=self._commit,
        )
        self._backfill = (
            Backfill(
                account=account.name,
                folder=folder,
                settings=settings,
                parsing=parsing,
                index=index,
                builder=builder,
                stop=stop,
                cursor=lambda: self.cursor,
                commit=self._commit,
                count=self.batches.count,
                committed=self.flag_changes.remember,
            )
            if parsing is not None
            else None
        )

    # --- the source contract's hooks (connectors.core.source.worker) ---------------------------

    def _on_new_writer(self) -> None:
        self._reload_cursor = True

    def _after_error(self, exc: Exception) -> None:
        if not isinstance(exc, ConnectionLost):
            # Kafka or unknown trouble: re-read the committed cursor before going on.
            self._reload_cursor = True

    def _connecting(self) -> bool:
        return self.machine.state in (S.CONNECTING, S.AUTHENTICATING)

    def _drop_connection(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    def _close(self) -> None:
        if self._conn is not None:
            self._conn.logout()
            self._conn = None
        if self._backfill is not None:
            self._backfill.close()

    # --- one connection -------------------------------------------------------------------------

    def _session(self) -> None:
        self.machine.to(S.CONNECTING)
        conn = self._connection_factory()
        self._conn = conn
        # Logged in already: a login started ahead of this worker, while the source's start-up
        # waited on Kafka (connectors.imap.earlylogin), with ImapConnection.open's same steps.
        early = conn.logged_in
        if not early:
            conn.connect()
        self.metrics.connects.labels(*self._labels).inc()
        self.machine.to(S.AUTHENTICATING)
        if not early:
            conn.login()
            conn.enable_condstore(qresync=self.settings.qresync == "auto")
        self.fallbacks.say(conn.capabilities)
        self.machine.to(S.SELECTING)
        try:
            self._select(conn)
        except FolderMissing as exc:
            if self.missing.wait_for(conn, exc):
                self._drop_connection()
            return  # it exists again: a new session selects it
        self.missing.selected()
        full = True
        self.waits.caught_up()
        round_mails = 0  # of the syncs since the last IDLE: what the metric calls the last sync
        while not self.stop.is_set():
            self.machine.to(S.SYNCING)
            self._changed_by_us = False
            round_mails += self._sync(conn, reconcile=full)
            self.metrics.synced(*self._labels, mails=round_mails)
            self.backoff.reset()
            if self._changed_by_us or not self._settled:
                # Our own STORE is not announced to our own IDLE (RFC 3501 7.4.2 answers it on
                # the STORE), and mail that arrived during the sync was announced by the
                # sync's own commands (an EXISTS among the FETCH answers), so IDLE will not
                # announce it again: sync again at once, until a sync finds nothing new.
                full = False
                continue
            round_mails = 0
            full = self.waits.wait(conn, flags_listed=self.flag_changes.listing)

    def _select(self, conn: ImapConnection) -> None:
        readonly = self.account.after_commit == "none"
        if self._reload_cursor or self.cursor is None:
            stored = self._read_offsets().get(self._partition_key)
            self.cursor = Cursor.from_json(dict(stored)) if stored else None
            self._reload_cursor = False
        status = conn.select(
            self.folder,
            readonly=readonly,
            qresync=self.cursor.qresync_request() if self.cursor else None,
        )
        # No MODSEQs (no CONDSTORE, or a NOMODSEQ folder): flag changes by the FLAGS listing.
        self.flag_changes.listing = status.highestmodseq is None
        self.expunges.vanished = None
        first_since = None
        if self.cursor is None and self.account.start_since is not None:
            found = conn.uids_since(self.account.start_since)
            first_since = found[0] if found else None
        decision = on_select(
            self.cursor,
            status.uidvalidity,
            status.uidnext,
            status.highestmodseq,
            self.account.start,
            first_since,
        )
        if decision.rescan:
            self.metrics.uidvalidity_changes.labels(*self._labels).inc()
            self.index.forget_folder(self.folder)
            # An expunge check of the old epoch speaks of MODSEQs the new one does not share.
            self.expunges.new_epoch()
            log.warning(
                "imap %s/%s: UIDVALIDITY changed %s -> %s: new epoch %d, full rescan",
                self.account.name,
                self.folder,
                self.cursor.uidvalidity if self.cursor else None,
                status.uidvalidity,
                decision.cursor.epoch,
            )
        if status.vanished is not None and status.highestmodseq and not decision.rescan:
            self.expunges.vanished = (status.vanished, status.highestmodseq)
        if decision.new or decision.rescan:
            # Pin the start position (and the new epoch) so a restart continues from here.
            self._commit([], decision.cursor)
        self.cursor = decision.cursor
        if self.cursor.pending is not None:
            log.info(
                "imap %s/%s: repairing an unfinished %s of %d mails",
                self.account.name,
                self.folder,
                self.cursor.pending.action,
                len(self.cursor.pending.uids),
            )
            self._changed_by_us |= self.side_effects.finish(conn, self.cursor.pending, {})

    # --- sync -----------------------------------------------------------------------------------

    def _sync(self, conn: ImapConnection, reconcile: bool) -> int:
        assert self.cursor is not None
        ticket = self.index.rounds.begin(self.folder)
        # Dovecot shows other sessions' changes to the selected folder only after a command
        # completes: NOOP first, or SEARCH may miss a mail appended a moment ago.
        told = conn.noop()
        # What the NOOP announces and no MODSEQ or VANISHED will tell (a server that reports
        # changes only when asked, as Courier between its IDLE polls): an expunge, or a FETCH
        # on a folder without MODSEQs, is looked for now rather than at the catch-up.
        reconcile = reconcile or told.expunged or (told.flags_changed and self.flag_changes.listing)
        try:
            status = conn.status(self.folder)
        except ImapProtocolError:
            # RFC 3501 6.3.10 lets a server refuse STATUS on the selected mailbox; SELECT again
            # gives the same figures.
            status = conn.select(self.folder, readonly=self.account.after_commit == "none")
        if status.uidvalidity != self.cursor.uidvalidity:
            raise UidValidityChanged(
                f"UIDVALIDITY of {self.folder} changed to {status.uidvalidity} while selected"
            )
        mails = 0
        hms = status.highestmodseq
        # Nothing new at STATUS and no further command that could carry an EXISTS: IDLE will
        # announce whatever comes next.
        self._settled = (
            not reconcile
            and status.uidnext - 1 <= self.cursor.last_uid
            and (hms is None or not conn.condstore or hms <= self.cursor.highestmodseq)
        )
        if hms is not None and conn.condstore:
            mails += self.flag_changes.sync_modseq(conn, hms)
        elif reconcile:
            mails += self.flag_changes.sync_listed(conn)  # no MODSEQs: no CONDSTORE, or NOMODSEQ
        new = (
            self._sync_new(conn, hms, status.uidnext)
            if status.uidnext - 1 > self.cursor.last_uid
            else 0
        )
        self.waits.found_new(new)
        mails += new
        if asked := self.index.take_republish(self.folder):
            mails += self._republish(conn, asked)
        if reconcile:
            # The HIGHESTMODSEQ of the check only matters to a later QRESYNC SELECT: without
            # QRESYNC no watermark is kept (nor committed).
            self.expunges.reconcile(conn, hms if conn.qresync else None)
        self.index.rounds.done(self.folder, ticket)
        self.expunges.settle(conn)
        return mails

    def _sync_new(self, conn: ImapConnection, hms: int | None, uidnext: int) -> int:
        assert self.cursor is not None
        uids = conn.uids_from(self.cursor.last_uid + 1)
        if not uids:
            self.expunges.pass_unread(conn, uidnext)
            return 0
        total = len(uids)
        if total > self.settings.batch_size:
            log.info(
                "imap %s/%s: %d mails to read (uid %d..%d)",
                self.account.name,
                self.folder,
                total,
                uids[0],
                uids[-1],
            )
        backfill = self._backfill
        if (
            backfill is not None
            and self.account.after_commit == "none"
            and total > self.settings.batch_size
        ):
            done = 0
            if not backfill.parsing.ready:
                # The parse processes are still starting (spawn and imports: ~1 s, several on
                # a busy machine): a first small batch is published from this thread, so the
                # first event of a start does not wait for them. One batch only: this thread
                # parses at a third of the FETCH rate, the pool takes the rest of the backlog.
                group = next(fetch_groups(conn, uids[:FIRST_BATCH_INLINE], self.settings))
                self._publish_new(conn, group, conn.fetch(group), hms)
                done = len(group)
            if not self.stop.is_set():
                backfill.run(conn, uids[done:], hms)
            return total
        progress = Progress(self.account.name, self.folder, total)
        for group in fetch_groups(conn, uids, self.settings):
            fetched = conn.fetch(group)
            self._publish_new(conn, group, fetched, hms)
            progress.add(len(group))
        return total

    def _republish(self, conn: ImapConnection, uids: list[int]) -> int:
        """Publish these mails again (UPDATED, as they are now): another folder's worker
        committed their ADDED after our event (``AccountIndex.republish_elsewhere``). A UID
        gone meanwhile is skipped: its expunge is reconciled as any other."""
        cursor = self.cursor
        assert cursor is not None
        try:
            fetched = conn.fetch([u for u in uids if u <= cursor.last_uid])
            if fetched:
                log.info(
                    "imap %s/%s: uid %s published again: another folder committed its ADDED "
                    "after our event",
                    self.account.name,
                    self.folder,
                    ",".join(str(m.uid) for m in fetched),
                )
                with self.builder.staged_blobs() as blobs:
                    built = self.batches.build_all(fetched, _updated, blobs)
                    self.batches.commit(built, cursor, blobs)
        except BaseException:
            self.index.ask_republish(self.folder, uids)  # the next sync tries again
            raise
        return len(fetched)

    def _publish_new(
        self,
        conn: ImapConnection,
        group: list[int],
        fetched: list[FetchedMail],
        hms: int | None,
    ) -> None:
        cursor = self.cursor
        assert cursor is not None
        with self.builder.staged_blobs() as blobs:
            self._publish_new_batch(conn, group, fetched, hms, cursor, blobs)
        self.flag_changes.remember(cursor.uidvalidity, fetched)

    def _publish_new_batch(
        self,
        conn: ImapConnection,
        group: list[int],
        fetched: list[FetchedMail],
        hms: int | None,
        cursor: Cursor,
        blobs: ClaimCheckBatch | None,
    ) -> None:
        built = self.batches.build_all(
            fetched, lambda m: "RESCANNED" if m.uid < cursor.rescan_until else "ADDED", blobs
        )
        progress = advanced(cursor, group, fetched, hms)
        pending = self.side_effects.plan(conn, fetched)
        if pending is not None:
            progress = replace(progress, pending=pending)
        self.batches.commit(built, progress, blobs)
        if pending is not None:
            checkpoints.reached("after_commit")
            self._changed_by_us |= self.side_effects.finish(
                conn, pending, {m.uid: m for m in fetched}
            )

    def _reselect(self, conn: ImapConnection) -> None:
        """SELECT this folder again after another was selected; the epoch must be the same."""
        assert self.cursor is not None
        status = conn.select(self.folder, readonly=self.account.after_commit == "none")
        if status.uidvalidity != self.cursor.uidvalidity:
            raise UidValidityChanged(f"UIDVALIDITY of {self.folder} changed")

    def _set_cursor(self, cursor: Cursor) -> None:
        self.cursor = cursor

    def _backing_off(self, error: Exception, reason: str) -> None:
        self.last_error = error
        self.machine.to(S.BACKOFF, reason)

    def _commit(
        self,
        records: Sequence[SourceRecord],
        cursor: Cursor,
        before_commit: Callable[[], None] | None = None,
    ) -> None:
        self._write(records, cursor.to_json(), before_commit)
        self.cursor = cursor
