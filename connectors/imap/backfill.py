"""New mail in bulk: FETCH round trips, the pipelined backfill, and its progress lines.

A first start on a large mailbox (or a rescan after a UIDVALIDITY change) reads thousands of
mails. The worker thread fetches them in round trips of ``batch_size`` mails under
``max_batch_bytes`` (:func:`fetch_groups`); with parse processes, a :class:`Backfill` hands each
batch to the pool and to a committer thread that commits them one by one in UID order as their
parsing ends, each still one transaction with its cursor, through the worker's commit
(:class:`~connectors.imap.cursor.Commit`).
"""

from __future__ import annotations

import functools
import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, replace
from typing import Protocol

from connectors.core import checkpoints
from connectors.core.claimcheck.local import make_durable
from connectors.core.kafka.errors import TransactionAborted
from connectors.imap.config import ImapSourceSettings
from connectors.imap.connection import FetchedMail, ImapConnection
from connectors.imap.cursor import Commit, Cursor, chunks, split_by_bytes
from connectors.imap.index import AccountIndex
from connectors.imap.records import BuiltMail, ChangeKind, ParsedBatch, Placement, RecordBuilder

__all__ = ["Backfill", "BatchParsing", "Progress", "advanced", "fetch_groups"]

log = logging.getLogger(__name__)

#: A backfill logs its progress every this many mails (the console of a long first start).
PROGRESS_EVERY = 2000
#: A backfill transaction takes up to this many batches whose parsing is done.
MERGE_BATCHES = 4
#: New UIDs whose sizes are looked up together (one SEARCH LARGER round trip).
SIZE_WINDOW = 5000


class BatchParsing(Protocol):
    """Builds a batch of this mailbox elsewhere (:class:`connectors.imap.parsepool.MailboxParsing`):
    default change kinds only; its blobs are durable when the future is done, except the files
    in ``ParsedBatch.unsynced``, which the commit makes durable (:func:`make_durable`)."""

    @property
    def workers(self) -> int: ...

    @property
    def ready(self) -> bool:
        """False while the processes are still starting (spawning and importing)."""
        ...

    def submit(
        self, mails: Sequence[FetchedMail], uidvalidity: int, rescan_until: int
    ) -> Future[ParsedBatch]: ...


def fetch_groups(
    conn: ImapConnection, uids: Sequence[int], settings: ImapSourceSettings
) -> Iterator[list[int]]:
    """UIDs in FETCH round trips: ``batch_size`` mails, at most ``max_batch_bytes``.

    A full batch of mails no larger than ``max_batch_bytes / batch_size`` fits the budget,
    so only the mails above that size need their exact size: one ``SEARCH LARGER`` per
    window of UIDs finds them (asking every mail's RFC822.SIZE cost the worker thread as
    much as fetching the mails), and those few are sized with FETCH RFC822.SIZE.
    """
    batch, budget = settings.batch_size, settings.max_batch_bytes
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


def advanced(
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


class Progress:
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


@dataclass(eq=False)
class _InFlight:
    """A fetched batch on its way: parsing in the pool, then committing."""

    fetched: list[FetchedMail]
    built: Future[ParsedBatch]
    cursor: Cursor
    #: The backfill's console progress, told of the batch's UIDs once they are committed.
    progress: Progress
    uids: int


class Backfill:
    """The pipelined backfill of one folder: fetch here, parse in the pool, commit in order."""

    def __init__(
        self,
        *,
        account: str,
        folder: str,
        settings: ImapSourceSettings,
        parsing: BatchParsing,
        index: AccountIndex,
        builder: RecordBuilder,
        stop: threading.Event,
        cursor: Callable[[], Cursor | None],
        commit: Commit,
        count: Callable[[list[BuiltMail]], None],
        committed: Callable[[int, Sequence[FetchedMail]], None] | None = None,
    ) -> None:
        self.account = account
        self.folder = folder
        self.settings = settings
        self.parsing = parsing
        self.index = index
        self.builder = builder
        self.stop = stop
        self._cursor = cursor
        self._commit = commit
        self._count = count
        #: Told (uidvalidity, mails) of each batch once it is committed.
        self._committed = committed
        #: Commits a backfill's transactions while the next batches are fetched and parsed.
        self._committer: ThreadPoolExecutor | None = None
        #: Set by a failed backfill commit: the committer commits nothing queued behind it.
        self._commit_failed = False
        #: ``(key, folder, uid)`` of the new mail placed by the commit under way, until it commits.
        self._new: list[tuple[str, str, int]] = []
        #: Backfill batches handed to the committer and not committed yet, in UID order.
        self._queued: deque[_InFlight] = deque()
        self._queue_lock = threading.Lock()

    def close(self) -> None:
        if self._committer is not None:
            self._committer.shutdown(wait=True)
            self._committer = None

    def run(self, conn: ImapConnection, uids: Sequence[int], hms: int | None) -> None:
        """New mails in a pipeline: this thread fetches batch after batch and hands each to
        the parse pool and, at once, to the committer thread, which commits them one by one in
        UID order as their parsing ends (each still one transaction with its cursor). This
        thread waits only when too much is on its way. When a commit fails, the committer
        commits nothing after it, the batches behind it are dropped, and the session retries
        from the committed cursor.

        Memory: at most ``2 * parse_workers + 2`` batches on their way (fewer when they hold
        more than ``2 * max_batch_bytes``), each under ``max_batch_bytes``.
        """
        start = self._cursor()
        assert start is not None
        most = 2 * self.parsing.workers + 2
        if self._committer is None:
            self._committer = ThreadPoolExecutor(1, thread_name_prefix=f"commit-{self.folder}")
        self._commit_failed = False
        most_bytes = 2 * self.settings.max_batch_bytes
        planned = start
        pending: deque[tuple[Future[None], int]] = deque()
        parsing: list[Future[ParsedBatch]] = []
        progress = Progress(self.account, self.folder, len(uids))
        try:
            for group in fetch_groups(conn, uids, self.settings):
                fetched = conn.fetch(group)
                job = self.parsing.submit(fetched, planned.uidvalidity, planned.rescan_until)
                parsing.append(job)
                planned = advanced(planned, group, fetched, hms)
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
            checkpoints.reached("before_write")
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
            # New mail another folder published meanwhile: published there again (batches.py).
            self.index.republish_elsewhere(self._new)
            self._count(built)
            for part, _ in parts:
                part.progress.add(part.uids)
                if self._committed is not None:
                    self._committed(part.cursor.uidvalidity, part.fetched)
        except BaseException:
            self._commit_failed = True
            # Not committed: the batches' new mail is new again for the retry (ADDED).
            self.index.unplace(self._new)
            raise
        finally:
            self._new = []

    def _known_elsewhere(
        self, fetched: list[FetchedMail], built: list[BuiltMail]
    ) -> list[BuiltMail]:
        """Register a pool-built batch in the account index; a key the account published
        before (in another folder: a move or a copy) is rebuilt here as UPDATED, and a mail
        the index gives another key (its Message-ID is another mail's) is rebuilt with it."""
        cursor = self._cursor()
        assert cursor is not None
        uidvalidity, rescan_until = cursor.uidvalidity, cursor.rescan_until
        parsed = [b for b in built if b.key is not None]
        placed = self.index.place_many(
            [(b.key, b.fingerprint, self.folder, uidvalidity, b.uid) for b in parsed if b.key]
        )
        self._new.extend(
            (key, self.folder, b.uid)
            for b, (key, seen) in zip(parsed, placed, strict=True)
            if not seen
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


def _placed(
    key: str, change: ChangeKind, _parsed: str, _fingerprint: str | None
) -> tuple[str, ChangeKind]:
    """A placement decided already (by the account index)."""
    return key, change
