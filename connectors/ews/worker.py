"""One Exchange mailbox folder: subscribe, stream, fetch, publish exactly once into Kafka.

Lifecycle (one thread per (account, folder); the exchangelib Account never leaves it)::

    run()
      writer = TransactionalSourceWriter(txn id of (ews, account, folder))   # fences a zombie
      cursor = offsets topic, read_committed, AFTER init_transactions   # zombie's txn aborted
      loop: session() until stopped; any error -> BACKOFF -> reconnect, with the cursor in
            memory (the last committed); a failed write -> a new writer, then the cursor read
            again (never otherwise: a read_committed read can lag this source's own commits)

    session()
      CONNECTING (GetFolder)
      -> SUBSCRIBING      when the cursor has no subscription (first start, or it expired)
      -> CATCHING_UP      FindItem DateTimeReceived >= watermark - margin, skipping the items the
                          cursor remembers; after every (re)connect and every new subscription,
                          because events consumed by a broken stream or a crashed process are
                          gone from the subscription (exchangelib #1153)
      -> (reconcile)      FindItem of the whole folder (ItemId, ChangeKey) against the cursor's
                          items: UPDATED for changed ChangeKeys, the tombstone check for items
                          gone, arrivals for items never seen (changes whose events were lost)
      -> STREAMING        GetStreamingEvents until ConnectionStatus=Closed, then again on the
                          same subscription id (no catch-up needed: nothing was lost); each
                          notification's item changes (new, modified, moved, copied, deleted)
                          are one transaction (``_apply``)
      SubscriptionGone -> SUBSCRIBING -> CATCHING_UP, at once (no backoff)

Every batch (one notification, or up to ``batch_size`` catch-up items) is one Kafka transaction:
its events + DLQ records + the new cursor. ``SyncFolderItems`` is never used (DESIGN.md).
"""

from __future__ import annotations

import contextlib
import datetime as dt
import enum
import logging
from collections.abc import Callable, Sequence
from typing import Unpack

from connectors.core.kafka.errors import FencedError
from connectors.core.kafka.transactions import SourceRecord
from connectors.core.mail.identity import message_id_of_key
from connectors.core.source.backoff import Backoff
from connectors.core.source.location import SourceLocation
from connectors.core.source.state import StateMachine
from connectors.core.source.worker import FolderWorker, FolderWorkerRuntime
from connectors.ews.config import EwsAccountSettings, EwsSourceSettings
from connectors.ews.connection import Change, ChangeKind, EwsConnection, ItemRef
from connectors.ews.cursor import EPOCH, EwsCursor, change_digest, item_digest
from connectors.ews.errors import ConnectionLost, SubscriptionGone
from connectors.ews.records import BuiltItem, EwsRecordBuilder

log = logging.getLogger(__name__)

SOURCE_KIND = "ews"
#: ``start: latest`` remembers at most this many items already in the folder within the margin.
LATEST_PRIMING_LIMIT = 10_000
#: FindItem page of a reconciliation (ids and change keys only: small entries).
RECONCILE_PAGE = 1_000


class WorkerState(enum.Enum):
    DISCONNECTED = "DISCONNECTED"
    CONNECTING = "CONNECTING"
    SUBSCRIBING = "SUBSCRIBING"
    CATCHING_UP = "CATCHING_UP"
    STREAMING = "STREAMING"
    BACKOFF = "BACKOFF"
    STOPPED = "STOPPED"


S = WorkerState


#: The streaming wait and the catch-up repeat with every notification: logged at DEBUG.
ROUTINE = frozenset({(S.STREAMING, S.CATCHING_UP), (S.CATCHING_UP, S.STREAMING)})


class EwsFolderWorker(FolderWorker[WorkerState]):
    """Publishes one folder of one Exchange mailbox. ``run()`` (the source contract's loop,
    :class:`~connectors.core.source.worker.FolderWorker`) is the thread body."""

    connection_lost = ConnectionLost

    def __init__(
        self,
        *,
        account: EwsAccountSettings,
        folder: str,
        settings: EwsSourceSettings,
        builder: EwsRecordBuilder,
        connection_factory: Callable[[], EwsConnection],
        before_commit: Callable[[], None] | None = None,
        **runtime: Unpack[FolderWorkerRuntime],
    ) -> None:
        where = SourceLocation(SOURCE_KIND, account.name, folder)
        super().__init__(
            where=where,
            machine=StateMachine(
                where, S.DISCONNECTED, routine=ROUTINE, on_change=self._state_changed, logger=log
            ),
            states=WorkerState,
            backoff=Backoff(settings.backoff_initial_seconds, settings.backoff_cap_seconds),
            **runtime,
        )
        self.account = account
        self.folder = folder
        self.settings = settings
        self.builder = builder
        self._connection_factory = connection_factory
        self._before_commit = before_commit or (lambda: None)
        self._margin = dt.timedelta(seconds=settings.catchup_margin_seconds)
        self.cursor: EwsCursor | None = None
        self.events_published = 0
        self.tombstones_published = 0
        self._conn: EwsConnection | None = None

    @property
    def state(self) -> WorkerState:
        return self.machine.state

    def _to(self, new: WorkerState, reason: str = "") -> None:
        self.machine.to(new, reason)

    # --- the source contract's hooks (connectors.core.source.worker) ---------------------------

    def _on_new_writer(self) -> None:
        # The cursor in memory is otherwise the last one committed (see _commit) and kept across
        # a backoff: reading it back from Kafka then could return an older one (_load_cursor).
        self.cursor = None

    def _connecting(self) -> bool:
        return self.machine.state is S.CONNECTING

    def _close(self) -> None:
        self._drop_connection()

    def interrupt(self) -> None:
        """From another thread, after ``stop`` is set: unblock a stream read."""
        conn = self._conn
        if conn is not None:
            conn.interrupt()

    def _drop_connection(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    # --- one connection -------------------------------------------------------------------------

    def _session(self) -> None:
        self._to(S.CONNECTING)
        conn = self._connection_factory()
        self._conn = conn
        conn.open()
        self.metrics.connects.labels(*self._labels).inc()
        if self.cursor is None:
            self.cursor = self._load_cursor(conn)
        catch_up = True
        while not self.stop.is_set():
            if self.cursor.subscription_id is None:
                self._to(S.SUBSCRIBING)
                self._commit([], self.cursor.with_subscription(conn.subscribe()))
                catch_up = True
            if catch_up:
                self._to(S.CATCHING_UP)
                mails = self._catch_up(conn) + self._reconcile(conn)
                self.metrics.synced(*self._labels, mails=mails)
                catch_up = False
            self._to(S.STREAMING)
            try:
                self._stream(conn)
            except SubscriptionGone as exc:
                log.warning(
                    "ews %s/%s: subscription gone (%s); subscribing again and catching up",
                    self.account.name,
                    self.folder,
                    exc,
                )
                self.cursor = self.cursor.with_subscription(None)
                continue
            self.backoff.reset()

    def _load_cursor(self, conn: EwsConnection) -> EwsCursor:
        """The committed cursor, read only right after init_transactions (a new writer).

        A read_committed read ends at the last stable offset, which can lie before this source's
        own newest commit: for a moment after every commit (the broker answers the commit before
        it writes the transaction markers), and for as long as another source keeps a
        transaction open on the shared offsets topic. init_transactions settles our own
        transactions; reading at any other time could find an older cursor (mail published
        twice) or none at all (``start: latest`` would then skip mail that arrived meanwhile).
        """
        stored = self._read_offsets().get(self._partition_key)
        if stored:
            return EwsCursor.from_offset(stored)
        if self.account.start == "all":
            return EwsCursor(None, EPOCH)
        since = self.account.start_since
        if since is not None:
            start = dt.datetime(since.year, since.month, since.day, tzinfo=dt.UTC)
            return self._primed(conn, EwsCursor(None, start), start)
        # latest: only mail that arrives from now on. What is already there inside the catch-up
        # margin is remembered as seen, so a later catch-up does not publish it.
        now = dt.datetime.now(dt.UTC)
        present = [
            (r.item_id, r.received or now)
            for r in conn.find_since(now - self._margin, LATEST_PRIMING_LIMIT)
        ]
        return self._primed(conn, EwsCursor(None, now).advanced(present, self._margin), now)

    def _primed(self, conn: EwsConnection, cursor: EwsCursor, start: dt.datetime) -> EwsCursor:
        """A first cursor that knows the mail already in the folder before ``start`` as seen
        and never published, so that a reconciliation does not take it for new mail."""
        before = [
            (r.item_id, r.change_key, "", r.received)
            for r in conn.list_folder(max(self.settings.batch_size, RECONCILE_PAGE))
            if r.received is not None and r.received < start
        ]
        return cursor.tracking(before)

    # --- reading ----------------------------------------------------------------------------------

    def _catch_up(self, conn: EwsConnection) -> int:
        """Publish what FindItem lists from ``watermark - margin`` that the cursor does not know.

        Keyset paging: each page starts at the newest DateTimeReceived of the previous one, and
        the ids already listed at that second are skipped. A page entirely inside one second
        (more than ``page`` items received in the same second) doubles the page instead.
        """
        assert self.cursor is not None
        since = self.cursor.catchup_since(self._margin)
        page = self.settings.batch_size
        listed_at_since: set[str] = set()
        published = 0
        while True:
            refs = conn.find_since(since, page)
            fresh = [
                r
                for r in refs
                if r.item_id not in listed_at_since
                and not self.cursor.knows(r.item_id)
                and self.cursor.tracked(r.item_id) is None
            ]
            if fresh:
                published += self._publish(conn, [(r, "ADDED") for r in fresh])
            if len(refs) < page:
                break
            newest = max(r.received or since for r in refs)
            if newest == since:
                page *= 2
                continue
            since = newest
            listed_at_since = {r.item_id for r in refs if r.received == newest}
        if published:
            log.info("ews %s/%s: caught up %d items", self.account.name, self.folder, published)
        return published

    def _stream(self, conn: EwsConnection) -> None:
        assert self.cursor is not None and self.cursor.subscription_id is not None
        with contextlib.closing(conn.stream(self.cursor.subscription_id)) as notifications:
            for changes in notifications:
                mails = self._apply(conn, changes) if changes else 0
                self.metrics.synced(*self._labels, mails=mails)
                if self.stop.is_set():
                    return
        # ConnectionStatus=Closed: the stream lived its ConnectionTimeout; nothing was lost.
        self.metrics.synced(*self._labels, mails=0)

    def _apply(self, conn: EwsConnection, changes: Sequence[Change]) -> int:
        """One notification's item changes, in event order, as one publication: arrivals
        (ADDED, or UPDATED when moved/copied from a watched folder), modifications (UPDATED when
        the ChangeKey differs from the one published) and departures (tombstone check)."""
        assert self.cursor is not None
        wanted: dict[str, tuple[ItemRef, str]] = {}
        gone: list[tuple[str, str | None]] = []
        for change in changes:
            ref = ItemRef(change.item_id, change.change_key)
            tracked = self.cursor.tracked(change.item_id)
            if change.kind is ChangeKind.ARRIVED:
                if tracked is not None or self.cursor.knows(change.item_id):
                    continue  # published already (a catch-up found it first)
                wanted[change.item_id] = (
                    ref,
                    "ADDED" if change.other_folder is None else "UPDATED",
                )
            elif change.kind is ChangeKind.MODIFIED:
                if change.item_id in wanted:  # new in this same notification
                    wanted[change.item_id] = (ref, wanted[change.item_id][1])
                elif tracked is None and self.cursor.complete:
                    continue  # never ours (it arrives, if at all, with its own event)
                elif tracked is None or (
                    tracked.published and tracked.change != change_digest(change.change_key)
                ):
                    wanted[change.item_id] = (ref, "UPDATED")
            else:
                wanted.pop(change.item_id, None)
                gone.append((item_digest(change.item_id), change.other_folder))
        return self._publish(conn, list(wanted.values()), gone)

    def _reconcile(self, conn: EwsConnection) -> int:
        """After events may have been lost (a reconnect, a new subscription): compare the folder
        (FindItem: ItemId, ChangeKey) with what was published. A changed ChangeKey is an
        UPDATED event, an item gone from the folder a tombstone check, and an item we never saw
        (moved or copied in meanwhile) an arrival when ``items`` is complete."""
        assert self.cursor is not None
        page = max(self.settings.batch_size, RECONCILE_PAGE)
        present: set[str] = set()
        wanted: list[tuple[ItemRef, str]] = []
        unpublished: list[tuple[str, str, str, dt.datetime]] = []
        for ref in conn.list_folder(page):
            digest = item_digest(ref.item_id)
            present.add(digest)
            tracked = self.cursor.items.get(digest)
            if tracked is None:
                if self.cursor.complete and not self.cursor.knows(ref.item_id):
                    wanted.append((ref, "ADDED"))
            elif tracked.change != change_digest(ref.change_key):
                if tracked.published:
                    wanted.append((ref, "UPDATED"))
                else:
                    received = ref.received or dt.datetime.fromtimestamp(tracked.received, dt.UTC)
                    unpublished.append((ref.item_id, ref.change_key, "", received))
        gone = [(d, None) for d in self.cursor.items if d not in present]
        published = self._publish(conn, wanted, gone, unpublished)
        if wanted or gone:
            log.info(
                "ews %s/%s: reconciled: %d items published again or new, %d gone",
                self.account.name,
                self.folder,
                len(wanted),
                len(gone),
            )
        return published

    def _publish(
        self,
        conn: EwsConnection,
        refs: Sequence[tuple[ItemRef, str]],
        gone: Sequence[tuple[str, str | None]] = (),
        unpublished: Sequence[tuple[str, str, str, dt.datetime]] = (),
    ) -> int:
        """GetItem in batches; each batch's records and the advanced cursor in one transaction.
        ``refs`` carry their change (ADDED / UPDATED); ``gone`` are item digests that left the
        folder, with the watched folder they went to (None: deleted or out of every watched
        folder); their tombstones go with the last batch, and so do the new ChangeKeys of
        ``unpublished`` items (seen, never published: nothing to publish for them)."""
        count = 0
        size = self.settings.batch_size
        chunks = [refs[start : start + size] for start in range(0, len(refs), size)] or [[]]
        for number, chunk in enumerate(chunks, start=1):
            changes = {ref.item_id: change for ref, change in chunk}
            fetched = (
                [f for f in conn.fetch([ref for ref, _ in chunk]) if f is not None] if chunk else []
            )
            last = number == len(chunks)
            if not fetched and not (last and (gone or unpublished)):
                continue
            assert self.cursor is not None
            with self.builder.staged_blobs() as blobs:
                built = [
                    self.builder.build(item, blobs, changes.get(item.item_id, "ADDED"))
                    for item in fetched
                ]
                progress = self.cursor.advanced(
                    [(f.item_id, f.received) for f in fetched], self._margin
                ).tracking(
                    (f.item_id, f.change_key, b.key or "", f.received)
                    for f, b in zip(fetched, built, strict=True)
                )
                tombstones: list[SourceRecord] = []
                if last and unpublished:
                    progress = progress.tracking(unpublished)
                if last and gone:
                    progress, tombstones = self._departures(conn, progress, gone)
                if blobs is not None:
                    blobs.commit()  # durable before the transaction that references them
                self._commit_batch(built, progress, tombstones)
            count += len(fetched)
        return count

    def _departures(
        self, conn: EwsConnection, cursor: EwsCursor, gone: Sequence[tuple[str, str | None]]
    ) -> tuple[EwsCursor, list[SourceRecord]]:
        """Forget the items that left the folder; a tombstone for each key that is in no watched
        folder of the account any more, as Exchange says now (the tombstone rule of IMAP: a
        mail moved to another watched folder is that folder's UPDATED event, never a tombstone).

        Exchange is asked, not an index: FindItem over every watched folder for the Message-ID
        or the receive time (a move or a copy keeps both), and the keys of what it finds
        compared. It answers for folders other instances watch too, at the moment of the
        decision, and needs no state beyond this folder's cursor."""
        departed = {d: (cursor.items.get(d), target) for d, target in gone}
        cursor = cursor.forgetting(departed)
        tombstones: list[SourceRecord] = []
        decided: set[str] = set()
        for digest, (tracked, target) in departed.items():
            if tracked is None:
                # Forgotten for room, or published before the cursor kept items: no key, and
                # never a wrong tombstone (connectors/ews/README.md, "Limits").
                log.info(
                    "ews %s/%s: an item the cursor does not know (handled already, or "
                    "forgotten for room) left the folder: no tombstone",
                    self.account.name,
                    self.folder,
                )
                continue
            if not tracked.published or tracked.key in decided:
                continue
            if target is not None:
                continue  # moved to another watched folder: its worker publishes UPDATED
            decided.add(tracked.key)
            if cursor.holds_key(tracked.key):
                continue  # another copy of it is still in this folder
            received = dt.datetime.fromtimestamp(tracked.received, dt.UTC)
            holders = conn.holders(message_id_of_key(tracked.key), received)
            held = [h for h in holders if item_digest(h.item_id) != digest]
            if any(self.builder.key_of(h) == tracked.key for h in held):
                log.debug(
                    "ews %s/%s: %s left this folder but is still in a watched folder",
                    self.account.name,
                    self.folder,
                    tracked.key,
                )
                continue
            if any(item_digest(h.item_id) == digest for h in holders):
                # Still here after all (a listing that missed it): keep tracking it.
                cursor = cursor.keeping(digest, tracked)
                continue
            log.info(
                "ews %s/%s: %s is in no watched folder any more: tombstone",
                self.account.name,
                self.folder,
                tracked.key,
            )
            tombstones.append(self.builder.tombstone(tracked.key))
        return cursor, tombstones

    # --- writing ----------------------------------------------------------------------------------

    def _commit_batch(
        self,
        built: list[BuiltItem],
        cursor: EwsCursor,
        tombstones: Sequence[SourceRecord] = (),
    ) -> None:
        records = [r for b in built for r in b.records] + list(tombstones)
        self._before_commit()
        self._commit(records, cursor)
        events = sum(1 for b in built if b.key is not None) + len(tombstones)
        self.tombstones_published += len(tombstones)
        dlq = sum(1 for b in built if b.dlq or b.key is None)
        self.events_published += events
        if events:
            self.metrics.events_produced.labels(*self._labels).inc(events)
        if dlq:
            self.metrics.dlq_records.labels(*self._labels).inc(dlq)

    def _commit(self, records: Sequence[SourceRecord], cursor: EwsCursor) -> None:
        try:
            self._write(records, cursor.to_offset())
        except FencedError:
            raise
        except Exception:
            # Whether the batch committed is not known for sure (a commit that timed out can
            # still land): a new writer's init_transactions settles it, and run() reads the
            # cursor back after that.
            self._discard_writer()
            raise
        if self.cursor is not None and self.cursor.complete and not cursor.complete:
            log.warning(
                "ews %s/%s: the cursor remembers the newest items only from now on (more than "
                "it keeps); deleting older mail publishes no tombstone (connectors/ews/README.md)",
                self.account.name,
                self.folder,
            )
        self.cursor = cursor
