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

Crash points for tests (:mod:`connectors.core.faults`): besides the shared ``before_write`` and
``in_transaction``, ``after_commit`` (committed, the side effect not done yet: state MOVING) and
``after_side_effect`` (side effect done, its confirmation MOVED not committed yet).
"""

from __future__ import annotations

import functools
import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, replace
from typing import Any, Protocol

from connectors.core.claimcheck.local import make_durable
from connectors.core.claimcheck.store import ClaimCheckBatch
from connectors.core.faults import CrashPoints
from connectors.core.kafka.offsets import canonical_json
from connectors.core.kafka.transactions import FencedError, SourceRecord, TransactionAborted
from connectors.core.metrics import SourceMetrics
from connectors.core.source.backoff import Backoff
from connectors.core.source.reconnect import backoff_delay
from connectors.imap.config import ImapAccountSettings, ImapSourceSettings
from connectors.imap.connection import SEEN, FetchedMail, ImapConnection
from connectors.imap.cursor import (
    Cursor,
    PendingSideEffect,
    chunks,
    on_select,
    skip_unchanged,
    source_partition,
    split_by_bytes,
)
from connectors.imap.errors import ConnectionLost, FolderMissing, ImapProtocolError
from connectors.imap.index import AccountIndex
from connectors.imap.qresync import ExpungeCheck, QresyncRequest, vanished_candidates
from connectors.imap.records import BuiltMail, ChangeKind, ParsedBatch, Placement, RecordBuilder
from connectors.imap.state import StateMachine, WorkerState
from connectors.imap.uidset import UidSet

log = logging.getLogger(__name__)

S = WorkerState
SOURCE_KIND = "imap"
#: Length of one idle_check() slice: bounds how long a stop request waits, and how fast an
#: imapclient #565 early return (EOF swallowed) is noticed.
IDLE_SLICE_S = 1.0
#: A backfill logs its progress every this many mails (the console of a long first start).
PROGRESS_EVERY = 2000
#: A backfill transaction takes up to this many batches whose parsing is done.
MERGE_BATCHES = 4
#: New UIDs whose sizes are looked up together (one SEARCH LARGER round trip).
SIZE_WINDOW = 5000


class Writer(Protocol):
    def write(
        self,
        records: Sequence[SourceRecord],
        offsets: Mapping[bytes, Mapping[str, Any]]
        | Sequence[tuple[Mapping[str, Any], Mapping[str, Any]]],
        before_commit: Callable[[], None] | None = None,
    ) -> None: ...

    def close(self) -> None: ...


class BatchParsing(Protocol):
    """Builds a batch of this mailbox elsewhere (:class:`connectors.imap.parsepool.MailboxParsing`):
    default change kinds only; its blobs are durable when the future is done, except the files
    in ``ParsedBatch.unsynced``, which the commit makes durable (:func:`make_durable`)."""

    @property
    def workers(self) -> int: ...

    def submit(
        self, mails: Sequence[FetchedMail], uidvalidity: int, rescan_until: int
    ) -> Future[ParsedBatch]: ...


@dataclass(eq=False)
class _InFlight:
    """A fetched batch on its way: parsing in the pool, then committing."""

    fetched: list[FetchedMail]
    built: Future[ParsedBatch]
    cursor: Cursor
    #: The backfill's console progress, told of the batch's UIDs once they are committed.
    progress: _Progress
    uids: int


class UidValidityChanged(ConnectionLost):
    """UIDVALIDITY changed under a selected folder: reconnect, the SELECT starts a new epoch."""


class MailboxWorker:
    """Publishes one folder of one account. ``run()`` is the thread body; ``stop`` ends it."""

    def __init__(
        self,
        *,
        account: ImapAccountSettings,
        folder: str,
        settings: ImapSourceSettings,
        builder: RecordBuilder,
        index: AccountIndex,
        metrics: SourceMetrics,
        stop: threading.Event,
        writer_factory: Callable[[str], Writer],
        read_offsets: Callable[[], Mapping[bytes, Mapping[str, Any]]],
        connection_factory: Callable[[], ImapConnection],
        transactional_id: str,
        watched_folders: Sequence[str],
        crash: CrashPoints | None = None,
        parsing: BatchParsing | None = None,
    ) -> None:
        self.account = account
        self.folder = folder
        self.settings = settings
        self.builder = builder
        self.index = index
        self.metrics = metrics
        self.stop = stop
        self._writer_factory = writer_factory
        self._read_offsets = read_offsets
        self._connection_factory = connection_factory
        self.transactional_id = transactional_id
        #: The account's other folders with a worker: an expunge here is a tombstone only
        #: once each of them has synced past it (syncrounds.py).
        self._watched_others = [f for f in watched_folders if f != folder]
        #: The move target when no worker watches it: searched by Message-ID instead.
        self._unwatched_target = (
            account.move_target if account.move_target not in watched_folders else None
        )
        #: Keys of mails gone from this folder and from the index's other places, with the
        #: ticket of the moment they were seen gone: tombstones once the others synced past it.
        self._expunged: dict[str, int] = {}
        self._crash = crash or CrashPoints(None)
        self._parsing = parsing
        #: Commits a backfill's transactions while the next batches are fetched and parsed.
        self._committer: ThreadPoolExecutor | None = None
        #: Set by a failed backfill commit: the committer commits nothing queued behind it.
        self._commit_failed = False
        #: Backfill batches handed to the committer and not committed yet, in UID order.
        self._queued: deque[_InFlight] = deque()
        self._queue_lock = threading.Lock()
        self.partition = source_partition(account.name, folder)
        self._partition_key = canonical_json(self.partition)
        self.machine = StateMachine(
            account.name,
            folder,
            # FENCED is a metric state only: the machine ends in STOPPED either way.
            on_change=lambda _old, new: self.metrics.set_state(
                *self._labels, "FENCED" if self.fenced else new.value
            ),
        )
        self.backoff = Backoff(settings.backoff_initial_seconds, settings.backoff_cap_seconds)
        self.cursor: Cursor | None = None
        self.fenced = False
        self.last_error: Exception | None = None
        self._changed_by_us = False
        self._writer: Writer | None = None
        self._conn: ImapConnection | None = None
        self._reload_cursor = True
        self._last_catchup = 0.0
        #: False when the last sync may have left something unpublished (see ``_session``).
        self._settled = False
        #: The folder was found missing and said so; cleared once it exists again.
        self._missing_reported = False
        #: What the session's QRESYNC SELECT said vanished (with the HIGHESTMODSEQ it spoke
        #: at): the first sync's expunge check, instead of listing the folder.
        self._vanished: tuple[UidSet, int] | None = None
        #: The expunge checks not settled yet: ``vanished_modseq`` moves once they are.
        self._unsettled_check: ExpungeCheck | None = None
        self._labels = (SOURCE_KIND, account.name, folder)

    # --- thread body ---------------------------------------------------------------------------

    def run(self) -> None:
        self.metrics.watch(*self._labels)
        try:
            while not self.stop.is_set():
                try:
                    if self._writer is None:
                        # init_transactions fences an older instance and aborts its open
                        # transaction, so the cursor read below sees only committed batches.
                        self._writer = self._writer_factory(self.transactional_id)
                        self._reload_cursor = True
                    self._session()
                except FencedError as exc:
                    self.fenced = True
                    log.error(
                        "imap %s/%s: fenced by another instance with the same transactional id "
                        "(%s); stopping this mailbox: %s",
                        self.account.name,
                        self.folder,
                        self.transactional_id,
                        exc,
                    )
                    return
                except Exception as exc:
                    self._back_off(exc)
        finally:
            self._close()
            self.machine.to(S.STOPPED)

    def _back_off(self, exc: Exception) -> None:
        self.last_error = exc
        self._drop_connection()
        if not isinstance(exc, ConnectionLost):
            # Kafka or unknown trouble: re-read the committed cursor before going on.
            self._reload_cursor = True
        delay = backoff_delay(
            exc,
            backoff=self.backoff,
            metrics=self.metrics,
            labels=self._labels,
            connecting=self.machine.state in (S.CONNECTING, S.AUTHENTICATING),
            connection_lost=ConnectionLost,
            logger=log,
        )
        self.machine.to(S.BACKOFF, f"{type(exc).__name__}: {exc}; retry in {delay:.1f}s")
        self.stop.wait(delay)

    def _drop_connection(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    def _close(self) -> None:
        if self._conn is not None:
            self._conn.logout()
            self._conn = None
        if self._committer is not None:
            self._committer.shutdown(wait=True)
            self._committer = None
        if self._writer is not None and not self.fenced:
            try:
                self._writer.close()
            except Exception:  # pragma: no cover - best effort at shutdown
                log.debug("writer close failed", exc_info=True)

    # --- one connection -------------------------------------------------------------------------

    def _session(self) -> None:
        self.machine.to(S.CONNECTING)
        conn = self._connection_factory()
        self._conn = conn
        conn.connect()
        self.metrics.connects.labels(*self._labels).inc()
        self.machine.to(S.AUTHENTICATING)
        conn.login()
        conn.enable_condstore(qresync=self.settings.qresync == "auto")
        self.machine.to(S.SELECTING)
        try:
            self._select(conn)
        except FolderMissing as exc:
            self._await_folder(conn, exc)
            return  # it exists again: a new session selects it
        if self._missing_reported:
            self._missing_reported = False
            log.info(
                "imap %s/%s: the folder exists again; reading it", self.account.name, self.folder
            )
        full = True
        self._last_catchup = time.monotonic()
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
            full = self._wait(conn)

    def _await_folder(self, conn: ImapConnection, missing: FolderMissing) -> None:
        """The folder is gone (or was never created): say so once, then look for it at the
        backoff cap's pace, on this connection, until it exists again or the source stops.
        The account's other folders have their own workers and go on."""
        cap = self.settings.backoff_cap_seconds
        self.last_error = missing
        self.machine.to(S.BACKOFF, f"{missing}; looking again every {cap:.0f}s")
        if not self._missing_reported:
            self._missing_reported = True
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
                self._drop_connection()
                return

    def _select(self, conn: ImapConnection) -> None:
        readonly = self.account.after_commit == "none"
        if self._reload_cursor or self.cursor is None:
            stored = self._read_offsets().get(self._partition_key)
            self.cursor = Cursor.from_json(dict(stored)) if stored else None
            self._reload_cursor = False
        status = conn.select(self.folder, readonly=readonly, qresync=self._qresync_request())
        self._vanished = None
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
            self._unsettled_check = None
            log.warning(
                "imap %s/%s: UIDVALIDITY changed %s -> %s: new epoch %d, full rescan",
                self.account.name,
                self.folder,
                self.cursor.uidvalidity if self.cursor else None,
                status.uidvalidity,
                decision.cursor.epoch,
            )
        if status.vanished is not None and status.highestmodseq and not decision.rescan:
            self._vanished = (status.vanished, status.highestmodseq)
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
            self._finish_side_effect(conn, self.cursor.pending, {})

    def _qresync_request(self) -> QresyncRequest | None:
        """The QRESYNC parameter of this session's SELECT, when the cursor knows up to which
        MODSEQ every expunge is handled (``vanished_modseq``)."""
        cursor = self.cursor
        if cursor is None or cursor.vanished_modseq <= 0:
            return None
        return QresyncRequest(cursor.uidvalidity, cursor.vanished_modseq, cursor.last_uid)

    def _wait(self, conn: ImapConnection) -> bool:
        """Wait for a change; returns True when the next sync must also look for expunges."""
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
            expunged = outcome.expunged or outcome.other
        else:
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

    # --- sync -----------------------------------------------------------------------------------

    def _sync(self, conn: ImapConnection, reconcile: bool) -> int:
        assert self.cursor is not None
        ticket = self.index.rounds.begin(self.folder)
        # Dovecot shows other sessions' changes to the selected folder only after a command
        # completes: NOOP first, or SEARCH may miss a mail appended a moment ago.
        conn.noop()
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
            mails += self._sync_changes(conn, hms)
        if status.uidnext - 1 > self.cursor.last_uid:
            mails += self._sync_new(conn, hms, status.uidnext)
        if reconcile:
            # The HIGHESTMODSEQ of the check only matters to a later QRESYNC SELECT: without
            # QRESYNC no watermark is kept (nor committed).
            self._reconcile(conn, hms if conn.qresync else None)
        self.index.rounds.done(self.folder, ticket)
        self._settle_expunged(conn)
        return mails

    def _sync_changes(self, conn: ImapConnection, hms: int) -> int:
        """Flag changes of published mails (RFC 7162): UPDATED events with the whole mail."""
        cursor = self.cursor
        assert cursor is not None
        if hms <= cursor.highestmodseq:
            return 0
        if cursor.last_uid == 0:
            # Nothing published yet, so no change to publish; the next batch commits this.
            self.cursor = replace(cursor, highestmodseq=hms, fresh=())
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
            for group in chunks([s.uid for s in states], self.settings.batch_size):
                fetched = conn.fetch(group)
                with self.builder.staged_blobs() as blobs:
                    built = self._build_all(fetched, lambda _m: "UPDATED", blobs)
                    above += [(m.uid, m.modseq) for m in fetched if m.modseq and m.modseq > hms]
                    progress = replace(
                        cursor, fresh=cursor.fresh + tuple(above), changes_done=(hms, group[-1])
                    )
                    self._commit_batch(built, progress, blobs)
                count += len(fetched)
        # Every change up to ``hms`` is published now; keep only what went out above it.
        self.cursor = replace(
            cursor,
            highestmodseq=hms,
            fresh=tuple(p for p in cursor.fresh + tuple(above) if p[1] > hms),
            changes_done=None,
        )
        if count or cursor.fresh or cursor.changes_done:
            self._commit([], self.cursor)
        return count

    def _sync_new(self, conn: ImapConnection, hms: int | None, uidnext: int) -> int:
        assert self.cursor is not None
        uids = conn.uids_from(self.cursor.last_uid + 1)
        if not uids:
            self._pass_expunged(conn, uidnext)
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
        if (
            self._parsing is not None
            and self.account.after_commit == "none"
            and total > self.settings.batch_size
        ):
            self._backfill(conn, uids, hms)
            return total
        progress = _Progress(self.account.name, self.folder, total)
        for group in self._groups(conn, uids):
            fetched = conn.fetch(group)
            self._publish_new(conn, group, fetched, hms)
            progress.add(len(group))
        return total

    def _pass_expunged(self, conn: ImapConnection, uidnext: int) -> None:
        """UIDs up to ``uidnext - 1`` were given out, and no mail above the cursor is left:
        they were expunged before this source read them (a mail deleted or moved away at once,
        or while the source was down). Move the cursor past them. Otherwise the folder never
        looks settled (UIDNEXT stays above the cursor), and the worker syncs again at once,
        for ever, and never IDLEs: a busy loop of NOOP, STATUS and SEARCH.

        Every UID below ``uidnext`` existed before the STATUS that reported it answered; a NOOP
        now (a completed command: the server shows this session what other sessions did) and a
        second SEARCH see any of them still there, so none is skipped unread. Never published,
        they have no key: nothing to tombstone.
        """
        assert self.cursor is not None
        conn.noop()
        if conn.uids_from(self.cursor.last_uid + 1):
            return  # mail arrived meanwhile: the next sync reads it
        log.info(
            "imap %s/%s: uid %d..%d expunged before they were read; the cursor moves past them",
            self.account.name,
            self.folder,
            self.cursor.last_uid + 1,
            uidnext - 1,
        )
        self._commit([], self.cursor.advanced(uidnext - 1))

    def _groups(self, conn: ImapConnection, uids: Sequence[int]) -> Iterator[list[int]]:
        """UIDs in FETCH round trips: ``batch_size`` mails, at most ``max_batch_bytes``.

        A full batch of mails no larger than ``max_batch_bytes / batch_size`` fits the budget,
        so only the mails above that size need their exact size: one ``SEARCH LARGER`` per
        window of UIDs finds them (asking every mail's RFC822.SIZE cost the worker thread as
        much as fetching the mails), and those few are sized with FETCH RFC822.SIZE.
        """
        batch, budget = self.settings.batch_size, self.settings.max_batch_bytes
        small = budget // batch
        for window in chunks(uids, SIZE_WINDOW):
            large = conn.uids_larger(window[0], window[-1], small)
            if not large:  # the usual case: every batch is full-sized and fits the budget
                yield from chunks(window, batch)
                continue
            exact = conn.sizes([u for u in window if u in large])
            for chunk in chunks(window, batch):
                sizes = {u: exact.get(u, small) if u in large else small for u in chunk}
                yield from split_by_bytes(chunk, sizes, budget)

    def _backfill(self, conn: ImapConnection, uids: Sequence[int], hms: int | None) -> None:
        """New mails in a pipeline: this thread fetches batch after batch and hands each to
        the parse pool and, at once, to the committer thread, which commits them one by one in
        UID order as their parsing ends (each still one transaction with its cursor). This
        thread waits only when too much is on its way. When a commit fails, the committer
        commits nothing after it, the batches behind it are dropped, and the session retries
        from the committed cursor.

        Memory: at most ``2 * parse_workers + 2`` batches on their way (fewer when they hold
        more than ``2 * max_batch_bytes``), each under ``max_batch_bytes``.
        """
        assert self.cursor is not None and self._parsing is not None
        most = 2 * self._parsing.workers + 2
        if self._committer is None:
            self._committer = ThreadPoolExecutor(1, thread_name_prefix=f"commit-{self.folder}")
        self._commit_failed = False
        most_bytes = 2 * self.settings.max_batch_bytes
        planned = self.cursor
        pending: deque[tuple[Future[None], int]] = deque()
        parsing: list[Future[ParsedBatch]] = []
        progress = _Progress(self.account.name, self.folder, len(uids))
        try:
            for group in self._groups(conn, uids):
                fetched = conn.fetch(group)
                job = self._parsing.submit(fetched, planned.uidvalidity, planned.rescan_until)
                parsing.append(job)
                planned = _advanced(planned, group, fetched, hms)
                batch = _InFlight(fetched, job, planned, progress, len(group))
                size = sum(len(m.raw) for m in fetched)
                with self._queue_lock:
                    self._queued.append(batch)
                pending.append((self._committer.submit(self._commit_parsed, batch), size))
                # Done commits leave; errors (abort, fenced) end the backfill here.
                while pending and (
                    pending[0][0].done()
                    or len(pending) > most
                    or (len(pending) > 2 and sum(b for _, b in pending) > most_bytes)
                ):
                    pending.popleft()[0].result()
                parsing = [j for j in parsing if not j.done()]
                if self.stop.is_set():
                    break
            while pending:
                pending.popleft()[0].result()
        finally:
            self._commit_failed = bool(pending)  # what is still queued must not commit
            for job in parsing:
                job.cancel()
            for commit, _ in pending:
                commit.exception()  # wait: the writer is this thread's again after
            with self._queue_lock:
                self._queued.clear()

    def _commit_parsed(self, batch: _InFlight) -> None:
        """On the committer thread, in order: wait for the batch's parsing, register it in
        the index, then produce and commit it with its cursor. Batches queued behind it whose
        parsing is done already go into the same transaction (up to ``MERGE_BATCHES``), with
        the last one's cursor: when the committer is behind, that saves a commit round trip
        and an fsync per batch. Their own turns then find them committed."""
        if self._commit_failed:
            raise TransactionAborted("an earlier batch of this backfill failed; not committed")
        with self._queue_lock:
            if batch not in self._queued:
                return  # committed with an earlier batch
        try:
            parts = [(batch, batch.built.result())]
            with self._queue_lock:
                self._queued.popleft()  # ``batch``: the committer takes them in order
                while self._queued and len(parts) < MERGE_BATCHES:
                    ready = self._queued[0].built
                    if not ready.done() or ready.cancelled() or ready.exception() is not None:
                        break
                    parts.append((self._queued.popleft(), ready.result()))
            self._crash.reached("before_write")
            built = [
                b
                for part, parsed in parts
                for b in self._known_elsewhere(part.fetched, parsed.mails)
            ]
            records = [r for b in built for r in b.records]
            unsynced = [path for _, parsed in parts for path in parsed.unsynced]
            # The packs the parse processes wrote become durable while the records go out.
            durable = functools.partial(make_durable, unsynced) if unsynced else None
            self._commit(records, parts[-1][0].cursor, before_commit=durable)
            self._count(built)
            for part, _ in parts:
                part.progress.add(part.uids)
        except BaseException:
            self._commit_failed = True
            raise

    def _known_elsewhere(
        self, fetched: list[FetchedMail], built: list[BuiltMail]
    ) -> list[BuiltMail]:
        """Register a pool-built batch in the account index; a key the account published
        before (in another folder: a move or a copy) is rebuilt here as UPDATED, and a mail
        the index gives another key (its Message-ID is another mail's) is rebuilt with it."""
        assert self.cursor is not None
        uidvalidity, rescan_until = self.cursor.uidvalidity, self.cursor.rescan_until
        parsed = [b for b in built if b.key is not None]
        placed = self.index.place_many(
            [(b.key, b.fingerprint, self.folder, uidvalidity, b.uid) for b in parsed if b.key]
        )
        # Below the rescan mark the pool said RESCANNED, which stays; an ADDED key the account
        # published before is a move or a copy.
        rebuild: dict[int, Placement] = {}
        for b, (key, seen) in zip(parsed, placed, strict=True):
            change: ChangeKind = "UPDATED" if seen else "ADDED"
            if b.uid < rescan_until:
                change = "RESCANNED"
            if key != b.key or change == "UPDATED":
                rebuild[b.uid] = functools.partial(_placed, key, change)
        return [
            self.builder.build(m, uidvalidity, rebuild[m.uid]) if m.uid in rebuild else b
            for m, b in zip(fetched, built, strict=True)
        ]

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

    def _publish_new_batch(
        self,
        conn: ImapConnection,
        group: list[int],
        fetched: list[FetchedMail],
        hms: int | None,
        cursor: Cursor,
        blobs: ClaimCheckBatch | None,
    ) -> None:
        built = self._build_all(
            fetched, lambda m: "RESCANNED" if m.uid < cursor.rescan_until else "ADDED", blobs
        )
        progress = _advanced(cursor, group, fetched, hms)
        pending = None
        action = self.account.after_commit
        if action != "none" and fetched:
            target_uidnext = None
            if self.account.move_target:
                conn.create_folder(self.account.move_target)
                target_uidnext = conn.status(self.account.move_target).uidnext
            pending = PendingSideEffect(action, tuple(m.uid for m in fetched), target_uidnext)
            progress = replace(progress, pending=pending)
        self._commit_batch(built, progress, blobs)
        if pending is not None:
            self._crash.reached("after_commit")
            self._finish_side_effect(conn, pending, {m.uid: m for m in fetched})

    def _build_all(
        self,
        mails: list[FetchedMail],
        change: Callable[[FetchedMail], ChangeKind],
        blobs: ClaimCheckBatch | None,
    ) -> list[BuiltMail]:
        assert self.cursor is not None
        uidvalidity = self.cursor.uidvalidity

        def change_for(
            mail: FetchedMail, key: str, fingerprint: str | None
        ) -> tuple[str, ChangeKind]:
            kind = change(mail)
            key, known = self.index.place(key, fingerprint, self.folder, uidvalidity, mail.uid)
            if kind == "ADDED" and known:
                return key, "UPDATED"  # published before, in another folder: a move or a copy
            return key, kind

        return self.builder.build_all(mails, uidvalidity, change_for, blobs)

    def _commit_batch(
        self, built: list[BuiltMail], cursor: Cursor, blobs: ClaimCheckBatch | None
    ) -> None:
        records = [r for b in built for r in b.records]
        self._crash.reached("before_write")
        # The batch's blobs become durable while its records go out, before the commit.
        durable = functools.partial(_make_durable, blobs) if blobs is not None else None
        self._commit(records, cursor, before_commit=durable)
        self._count(built)

    def _count(self, built: list[BuiltMail]) -> None:
        events = sum(1 for b in built if b.key is not None)
        dlq = sum(1 for b in built if b.dlq or b.key is None)
        if events:
            self.metrics.events_produced.labels(*self._labels).inc(events)
        if dlq:
            self.metrics.dlq_records.labels(*self._labels).inc(dlq)

    def _commit(
        self,
        records: Sequence[SourceRecord],
        cursor: Cursor,
        before_commit: Callable[[], None] | None = None,
    ) -> None:
        assert self._writer is not None
        if before_commit is None:
            self._writer.write(records, [(self.partition, cursor.to_json())])
        else:
            self._writer.write(
                records, [(self.partition, cursor.to_json())], before_commit=before_commit
            )
        self.cursor = cursor

    # --- after-commit side effects (MOVING -> MOVED) -------------------------------------------

    def _finish_side_effect(
        self, conn: ImapConnection, pending: PendingSideEffect, fetched: Mapping[int, FetchedMail]
    ) -> None:
        """Apply ``pending`` (idempotent on the server), then commit the cursor without it.

        A move also publishes UPDATED events with the new folder, so the compacted topic says
        where the mail went (DESIGN.md: a move is an update, not a delete).
        """
        assert self.cursor is not None
        uids = list(pending.uids)
        records: dict[tuple[str, bytes], SourceRecord] = {}
        if pending.action == "seen":
            conn.add_flags(uids, [SEEN])
            self._changed_by_us = True
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
                self._moved_record(mail, target, records, location)
            gone = set(uids) - {m.uid for m in present}
            if gone and pending.target_uidnext is not None:
                # The crash came after the move: the mails are in the target folder now.
                there = conn.select(target, readonly=True)
                for mail in conn.fetch(conn.uids_from(pending.target_uidnext)):
                    self._moved_record(mail, target, records, (there.uidvalidity, mail.uid))
                status = conn.select(self.folder)
                if status.uidvalidity != self.cursor.uidvalidity:
                    raise UidValidityChanged(f"UIDVALIDITY of {self.folder} changed")
        self._crash.reached("after_side_effect")
        self._commit(list(records.values()), replace(self.cursor, pending=None))

    def _moved_record(
        self,
        mail: FetchedMail,
        target: str,
        records: dict[tuple[str, bytes], SourceRecord],
        location: tuple[int, int] | None,
    ) -> None:
        """The UPDATED event of a mail we moved to ``target``, at ``location`` (uidvalidity,
        uid) there when known."""
        assert self.cursor is not None
        uidvalidity, uid = location if location is not None else (None, None)

        def place(key: str, fingerprint: str | None) -> tuple[str, ChangeKind]:
            return self.index.place(key, fingerprint, target, uidvalidity, uid)[0], "UPDATED"

        built = self.builder.build(
            mail, self.cursor.uidvalidity, place, folder=target, location=location
        )
        for record in built.records:
            if record.topic != self.builder.dlq_topic:
                # By topic too: the event and its index record share the key.
                records[(record.topic, record.key)] = record

    # --- expunges --------------------------------------------------------------------------------

    def _reconcile(self, conn: ImapConnection, hms: int | None) -> None:
        """Mails that left this folder and are in none of the index's other places wait for a
        decision (:meth:`_settle_expunged`): moved to a watched folder whose worker has not
        seen them yet, or deleted.

        What left is what the session's QRESYNC SELECT reported vanished, or else what a
        listing of every UID (``hms``: the HIGHESTMODSEQ before it) lacks."""
        assert self.cursor is not None
        vanished, self._vanished = self._vanished, None
        last_uid, uidvalidity = self.cursor.last_uid, self.cursor.uidvalidity
        if vanished is not None:
            gone_here, hms = vanished
            gone = vanished_candidates(
                gone_here, last_uid, lambda: self.index.uids(self.folder, uidvalidity)
            )
            method = "qresync"
        else:
            known = self.index.uids(self.folder, uidvalidity)
            if not known:
                # Nothing published here: nothing can leave, and nothing did up to ``hms``.
                if hms is not None:
                    self._checked(ExpungeCheck(hms, self.index.rounds.now(), found_gone=False))
                return
            present = conn.all_uids()  # ranges: membership by bisection, not a set of ints
            gone = [u for u in known if u not in present and u <= last_uid]
            del known, present
            method = "listing"
        self.metrics.expunge_checks.labels(*self._labels, method).inc()
        # Taken after the SEARCH (or SELECT) answer: a sync of another folder that begins
        # later sees any copy the server made before expunging here.
        seen_at = self.index.rounds.now()
        waiting = len(self._expunged)
        found_gone = False
        for uid in gone:
            removed = self.index.remove(self.folder, uid)  # None: a UID we never published
            found_gone = found_gone or removed is not None
            if removed is not None and not removed[1]:
                self._expunged.setdefault(removed[0], seen_at)
        if hms is not None:
            self._checked(ExpungeCheck(hms, seen_at, found_gone=found_gone))
        if len(self._expunged) > waiting and self._watched_others:
            log.info(
                "imap %s/%s: %d mails gone from this folder; they become tombstones only if "
                "absent from %s once those have synced",
                self.account.name,
                self.folder,
                len(self._expunged) - waiting,
                ", ".join(self._watched_others),
            )
        if self._expunged:
            self.index.rounds.wait_for_others(self.folder, self._watched_others)

    def _checked(self, check: ExpungeCheck) -> None:
        pending = self._unsettled_check
        self._unsettled_check = check if pending is None else pending.merged(check)

    def _vanished_settled(self) -> Cursor | None:
        """The cursor with ``vanished_modseq`` moved up to the last expunge check, when every
        mail that check (and those before it) found gone is decided and durable: tombstoned
        in the same transaction, or its key placed elsewhere by a sync of that folder that
        began after the check (so committed). None while that is not so: QRESYNC then asks
        again from the older MODSEQ, which only repeats what is known."""
        cursor = self.cursor
        check = self._unsettled_check
        assert cursor is not None
        if check is None or self._expunged:
            return None
        if check.found_gone and not self.index.rounds.past(check.ticket, self._watched_others):
            return None
        return replace(cursor, vanished_modseq=max(cursor.vanished_modseq, check.modseq))

    def _settle_expunged(self, conn: ImapConnection) -> None:
        """Tombstone the expunged keys that are in no watched folder of the account, as known
        after every other watched folder has synced past the expunge (DESIGN.md), whatever
        the key kind. A key another folder published meanwhile was moved or copied there:
        its worker published the UPDATED event, and nothing is written here."""
        assert self.cursor is not None
        rounds = self.index.rounds
        decided: list[str] = []
        if not self._expunged:
            self._commit_vanished_settled([])
            return
        for key, seen_at in list(self._expunged.items()):
            # ``past`` before ``located``: once the others are past, their copies are indexed.
            past = rounds.past(seen_at, self._watched_others)
            if self.index.located(key):
                del self._expunged[key]
            elif past:
                decided.append(key)
        seen = {key: self._expunged.pop(key) for key in decided}
        try:
            if decided and self._unwatched_target:
                decided = self._not_in_unwatched_target(conn, decided)
            forgotten = [key for key in decided if self.index.forget_unless_located(key)]
            tombstones = [r for key in forgotten for r in self.builder.tombstones(key)]
            if not self._expunged:
                rounds.settled(self.folder)
            if tombstones:
                log.info(
                    "imap %s/%s: %d mails expunged from every watched folder: tombstones",
                    self.account.name,
                    self.folder,
                    len(forgotten),
                )
            self._commit_vanished_settled(tombstones)
        except BaseException:
            # Not committed: decide them again next time (the index forgot them, and a
            # listing or VANISHED will not name their UIDs again in this process).
            self._expunged.update(seen)
            raise

    def _commit_vanished_settled(self, tombstones: list[SourceRecord]) -> None:
        """Commit ``tombstones``, with ``vanished_modseq`` moved when that is safe now."""
        assert self.cursor is not None
        settled = self._vanished_settled()
        cursor = settled or self.cursor
        if tombstones or cursor != self.cursor:
            self._commit(tombstones, cursor)
        if settled is not None:
            self._unsettled_check = None  # only once committed: a failed commit keeps it

    def _not_in_unwatched_target(self, conn: ImapConnection, keys: list[str]) -> list[str]:
        """``keys`` without those whose Message-ID is in the move target no worker watches
        (moved there by hand; it is not synced, so the server is asked)."""
        assert self.cursor is not None and self._unwatched_target is not None
        wanted = {key: m for key in keys if (m := self.index.message_id(key)) is not None}
        if not wanted:
            return keys
        found = conn.message_ids_in(self._unwatched_target, sorted(set(wanted.values())))
        status = conn.select(self.folder, readonly=self.account.after_commit == "none")
        if status.uidvalidity != self.cursor.uidvalidity:
            raise UidValidityChanged(f"UIDVALIDITY of {self.folder} changed")
        return [key for key in keys if wanted.get(key) not in found]


def _placed(
    key: str, change: ChangeKind, _parsed: str, _fingerprint: str | None
) -> tuple[str, ChangeKind]:
    """A placement decided already (by the account index)."""
    return key, change


def _make_durable(blobs: ClaimCheckBatch) -> None:
    blobs.commit()


def _advanced(
    cursor: Cursor, group: list[int], fetched: list[FetchedMail], hms: int | None
) -> Cursor:
    """The cursor once ``group`` is published: past its last UID, with the mails whose MODSEQ
    is above the folder's HIGHESTMODSEQ at sync time remembered (they must not count as a
    change on the next CONDSTORE pass)."""
    fresh = tuple(
        (m.uid, m.modseq)
        for m in fetched
        if hms is not None and m.modseq is not None and m.modseq > hms
    )
    progress = cursor.advanced(max(group), fresh)
    if hms is not None:
        progress = replace(progress, highestmodseq=max(cursor.highestmodseq, hms))
    return progress


class _Progress:
    """The console of a long first start: a line every PROGRESS_EVERY committed mails, with the
    rate so far and the time left at that rate."""

    def __init__(self, account: str, folder: str, total: int) -> None:
        self.label = f"imap {account}/{folder}"
        self.total = total
        self.done = 0
        self._next = PROGRESS_EVERY
        self._started = time.monotonic()

    def add(self, count: int) -> None:
        self.done += count
        if self.done >= self._next and self.total > PROGRESS_EVERY:
            self._next = (self.done // PROGRESS_EVERY + 1) * PROGRESS_EVERY
            rate = self.done / max(time.monotonic() - self._started, 1e-3)
            log.info(
                "%s: %d/%d mails published (%.0f/s, about %.0f s left)",
                self.label,
                self.done,
                self.total,
                rate,
                max(self.total - self.done, 0) / rate,
            )
