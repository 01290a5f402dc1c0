"""One mail folder of one Graph mailbox: delta rounds, published exactly once into Kafka.

Lifecycle (one thread per (account, folder); the loop is the source contract's,
:class:`~connectors.core.source.worker.FolderWorker`)::

    _session()
      CONNECTING     resolve the folder's id (404: MAILBOX_GONE; 401/403: ACCESS_DENIED)
      cursor         read_committed, right after init_transactions (a new writer)
      loop until stop:
        BACKFILLING  the first round (no delta link yet): page by page, ``nextLink`` in the cursor
                     (``start: latest`` publishes nothing already there before the start)
        SYNCING      a round from the delta link: the changes since the last round
        RESYNCING    the delta token died (410, syncStateNotFound): a fresh round compared
                     with the cursor's items: only new or changed messages are published, the
                     ones gone get the tombstone check; no new key, no duplicate event
        WAITING      until a notification wakes the folder up or ``sweep_interval_seconds``

Each delta page is one Kafka transaction: its events, DLQ records, tombstones and the new
cursor (the next link, or the delta link at the end of a round). A crash anywhere repeats the
page from the committed cursor: its changes are compared with the cursor's items again, so a
message whose event was committed is not published twice, and one whose event was not is.

What a delta entry becomes:

=================================================  ==============================================
a message this folder never published               ``ADDED``; ``UPDATED`` when another watched
                                                    folder holds its key (a move, a copy)
a published message whose read/flag/categories      ``UPDATED``
differ from what was published
the same state again (delta repeats changes)        nothing
``@removed``, or missing from a resync round        tombstone, when no watched folder holds the key
=================================================  ==============================================
"""

from __future__ import annotations

import contextlib
import datetime as dt
import enum
import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, NamedTuple

from connectors.core.kafka.errors import FencedError
from connectors.core.kafka.transactions import SourceRecord
from connectors.core.mail.event import ChangeKindSymbol
from connectors.core.metrics import SourceMetrics
from connectors.core.source.backoff import Backoff
from connectors.core.source.location import SourceLocation
from connectors.core.source.state import StateMachine
from connectors.core.source.worker import FolderWorker, Writer
from connectors.graph.config import GraphAccountSettings, GraphSourceSettings
from connectors.graph.cursor import GraphCursor, Tracked, id_digest
from connectors.graph.delta import DeltaPage, MessageState
from connectors.graph.errors import (
    AccessDenied,
    ConnectionLost,
    GraphProtocolError,
    MailboxNotFound,
    SyncStateGone,
)
from connectors.graph.mailbox import GraphMailbox
from connectors.graph.records import BuiltMessage, GraphRecordBuilder

log = logging.getLogger(__name__)

SOURCE_KIND = "graph"
#: After a failed subscribe or renewal, the next try waits this long (each try makes Graph
#: validate the endpoint again); the sweep keeps the folder current meanwhile.
SUBSCRIBE_RETRY_S = 60.0


class WorkerState(enum.Enum):
    DISCONNECTED = "DISCONNECTED"
    CONNECTING = "CONNECTING"
    BACKFILLING = "BACKFILLING"
    SYNCING = "SYNCING"
    RESYNCING = "RESYNCING"
    WAITING = "WAITING"
    ACCESS_DENIED = "ACCESS_DENIED"
    MAILBOX_GONE = "MAILBOX_GONE"
    BACKOFF = "BACKOFF"
    STOPPED = "STOPPED"


S = WorkerState

#: The sweep and the round repeat forever: logged at DEBUG.
ROUTINE = frozenset({(S.WAITING, S.SYNCING), (S.SYNCING, S.WAITING)})


class Departure(NamedTuple):
    """A message that left the folder: its ``items`` digest, the key published ("" = none)."""

    digest: str
    key: str
    message_id: str | None = None


class GraphFolderWorker(FolderWorker[WorkerState]):
    """Publishes one folder of one Graph mailbox. ``run()`` is the thread body."""

    connection_lost = ConnectionLost

    def __init__(
        self,
        *,
        account: GraphAccountSettings,
        folder: str,
        settings: GraphSourceSettings,
        builder: GraphRecordBuilder,
        mailbox: GraphMailbox,
        metrics: SourceMetrics,
        stop: threading.Event,
        writer_factory: Callable[[str], Writer],
        read_offsets: Callable[[], Mapping[bytes, Mapping[str, Any]]],
        transactional_id: str,
        before_commit: Callable[[], None] | None = None,
    ) -> None:
        where = SourceLocation(SOURCE_KIND, account.name, folder)
        super().__init__(
            where=where,
            machine=StateMachine(
                where,
                S.DISCONNECTED,
                routine=ROUTINE,
                caught_up_from=S.BACKFILLING,
                on_change=self._state_changed,
                logger=log,
            ),
            states=WorkerState,
            backoff=Backoff(settings.backoff_initial_seconds, settings.backoff_cap_seconds),
            metrics=metrics,
            stop=stop,
            writer_factory=writer_factory,
            read_offsets=read_offsets,
            transactional_id=transactional_id,
        )
        self.account = account
        self.folder = folder
        self.settings = settings
        self.builder = builder
        self.mailbox = mailbox
        self._before_commit = before_commit or (lambda: None)
        #: Set by a change notification (or interrupt()): start a delta round now.
        self.wake = threading.Event()
        self.cursor: GraphCursor | None = None
        self.folder_id: str | None = None
        self.events_published = 0
        self.tombstones_published = 0
        self.resyncs = 0
        #: The change-notification subscription of this folder (webhook mode), its expiry, and
        #: what a lifecycle notification asked for ("reauthorize", "removed").
        self.subscription_id: str | None = None
        self._subscription_expires = dt.datetime.min.replace(tzinfo=dt.UTC)
        self._lifecycle: str | None = None
        self._subscribe_after = 0.0
        # $value downloads of one page run side by side, within the mailbox's request budget.
        self._fetchers = ThreadPoolExecutor(
            settings.max_concurrent_requests, thread_name_prefix=f"graph-{account.name}-{folder}"
        )

    @property
    def state(self) -> WorkerState:
        return self.machine.state

    def _to(self, new: WorkerState, reason: str = "") -> None:
        self.machine.to(new, reason)

    # --- the source contract's hooks ----------------------------------------------------------

    def _on_new_writer(self) -> None:
        self.cursor = None  # read again after init_transactions settled our transactions

    def _connecting(self) -> bool:
        return self.machine.state is S.CONNECTING

    def _drop_connection(self) -> None:
        """The HTTP client is the mailbox's (shared); nothing of this folder to drop."""

    def _waiting_state(self, exc: Exception) -> WorkerState:
        if isinstance(exc, MailboxNotFound):
            return S.MAILBOX_GONE
        if isinstance(exc, AccessDenied):
            return S.ACCESS_DENIED
        return S.BACKOFF

    def _close(self) -> None:
        self._fetchers.shutdown(wait=False, cancel_futures=True)
        self.mailbox.forget(self.folder)
        subscription, self.subscription_id = self.subscription_id, None
        if subscription is not None and not self.fenced:
            # Best effort: a subscription left behind only expires (its notifications for an
            # id nobody knows are ignored).
            with contextlib.suppress(Exception):
                self.mailbox.client.unsubscribe(subscription)

    def notified(self, lifecycle: str | None = None) -> None:
        """From the webhook's thread: a change notification (or a lifecycle one) for this
        folder's subscription: a delta round now, and what the lifecycle event asks for."""
        if lifecycle == "subscriptionRemoved":
            self._lifecycle = "removed"
        elif lifecycle == "reauthorizationRequired":
            self._lifecycle = "reauthorize"
        # "missed" and every change: the delta round below finds what happened.
        self.wake.set()

    def interrupt(self) -> None:
        """From another thread, after ``stop`` is set: end the wait at once."""
        self.wake.set()

    # --- one session --------------------------------------------------------------------------

    def _session(self) -> None:
        self._to(S.CONNECTING)
        self.folder_id = self.mailbox.resolve(self.folder)
        self.metrics.connects.labels(*self._labels).inc()
        if self.cursor is None:
            self.cursor = self._load_cursor()
        self.mailbox.holds(self.folder, self.cursor.keys())
        while not self.stop.is_set():
            self.wake.clear()
            self._keep_subscription()
            mails = self._round()
            self.metrics.synced(*self._labels, mails=mails)
            self.backoff.reset()
            self._to(S.WAITING)
            self.wake.wait(self.settings.sweep_interval_seconds)

    def _keep_subscription(self) -> None:
        """With notifications: a subscription on this folder, renewed at half its life, renewed at
        once after ``reauthorizationRequired``, created again after ``subscriptionRemoved``.
        A failure is logged and tried again later: notifications are wake-ups, the sweep runs
        without them."""
        notes = self.settings.notifications
        if notes.mode == "none" or time.monotonic() < self._subscribe_after:
            return
        assert notes.client_state is not None
        client = self.mailbox.client
        now = dt.datetime.now(dt.UTC)
        life = dt.timedelta(minutes=notes.subscription_minutes)
        expires = (now + life).isoformat().replace("+00:00", "Z")
        lifecycle, self._lifecycle = self._lifecycle, None
        try:
            if lifecycle == "removed":
                self.subscription_id = None
            if self.subscription_id is None:
                notify, lifecycle_url = notes.notification_urls()
                self.subscription_id, _ = client.subscribe(
                    self.folder,
                    notify,
                    lifecycle_url,
                    expires,
                    notes.client_state.get_secret_value(),
                )
                self._subscription_expires = now + life
                log.info("graph %s/%s: subscribed to changes", self.account.name, self.folder)
            elif lifecycle == "reauthorize" or self._subscription_expires - now < life / 2:
                client.renew(self.subscription_id, expires)
                self._subscription_expires = now + life
        except MailboxNotFound:
            self.subscription_id = None  # expired or removed: subscribe at the next round
            self._lifecycle = None
            self.wake.set()
        except (ConnectionLost, GraphProtocolError) as exc:
            log.warning(
                "graph %s/%s: subscription failed (%s); polling every %.0fs meanwhile",
                self.account.name,
                self.folder,
                exc,
                self.settings.sweep_interval_seconds,
            )
            self._lifecycle = lifecycle
            self._subscribe_after = time.monotonic() + SUBSCRIBE_RETRY_S

    def _load_cursor(self) -> GraphCursor:
        stored = self._read_offsets().get(self._partition_key)
        if stored:
            return GraphCursor.from_offset(stored)
        if self.account.start == "latest":
            # receivedDateTime has whole seconds: mail of the start's second is published
            # (rather once too often than a gap).
            now = dt.datetime.now(dt.UTC).replace(microsecond=0)
            return GraphCursor(latest_from=now.isoformat())
        return GraphCursor()

    def _round(self) -> int:
        """One delta round; a dead delta token turns it into a resync."""
        assert self.cursor is not None
        try:
            if self.cursor.live:
                self._to(S.SYNCING)
                return self._pages(self.cursor.delta_link or "")
            if self.cursor.resyncing:  # a resync interrupted by a crash: again from scratch
                self._to(S.RESYNCING)
                return self._pages(self._first_url())
            self._to(S.BACKFILLING)
            return self._pages(self.cursor.next_link or self._first_url())
        except SyncStateGone as exc:
            self.resyncs += 1
            log.warning(
                "graph %s/%s: the delta token is gone (%s); resynchronising the folder",
                self.account.name,
                self.folder,
                exc,
            )
            self.cursor = self.cursor.restarted()
            self._to(S.RESYNCING)
            return self._pages(self._first_url())

    def _first_url(self) -> str:
        since = self.account.start_since
        instant = None if since is None else f"{since.isoformat()}T00:00:00Z"
        return self.mailbox.client.delta_start(self.folder, instant)

    # --- pages ----------------------------------------------------------------------------------

    def _pages(self, url: str) -> int:
        """Follow a round to its delta link, one transaction per page. A resync round (see
        :attr:`GraphCursor.resyncing`) is a fresh listing compared with the cursor's items:
        what it lacks left the folder while the token was dead."""
        assert self.cursor is not None
        resync = self.cursor.resyncing
        listed: set[str] = set()
        published = 0
        while True:
            if self.stop.is_set():
                return published  # the committed cursor resumes the round
            page = self.mailbox.client.delta_page(url)
            listed.update(id_digest(e.message_id) for e in page.entries if not e.removed)
            published += self._apply(page, resync=resync)
            if page.next_link is None:
                break
            url = page.next_link
        if resync:
            published += self._gone_after_resync(listed)
        return published

    def _apply(self, page: DeltaPage, *, resync: bool) -> int:
        """One page as one transaction: events for what changed, tombstones for what left."""
        assert self.cursor is not None
        latest_from = self.cursor.latest_from if not self.cursor.live and not resync else None
        wanted: list[tuple[MessageState, ChangeKindSymbol | None]] = []
        seen: list[tuple[str, Tracked]] = []
        removed: list[Departure] = []
        for entry in page.entries:
            tracked = self.cursor.tracked(entry.message_id)
            if entry.removed:
                if tracked is not None:
                    removed.append(
                        Departure(id_digest(entry.message_id), tracked.key, entry.message_id)
                    )
            elif tracked is not None:
                if tracked.state == entry.state_digest:
                    continue  # the same change again: one event
                if tracked.published:
                    wanted.append((entry, "UPDATED"))
                else:
                    seen.append((entry.message_id, Tracked(entry.state_digest, "")))
            elif latest_from is not None and _received_before(entry, latest_from):
                seen.append((entry.message_id, Tracked(entry.state_digest, "")))
            else:
                wanted.append((entry, None))  # ADDED, or UPDATED when held elsewhere
        with self.builder.staged_blobs() as blobs:
            built = self._build(wanted, blobs)
            seen += [(b.message_id, Tracked(state.state_digest, b.key or "")) for b, state in built]
            tombstones = self._departures(removed)
            delta_link, next_link = self._links_after(page, resync=resync)
            cursor = self.cursor.advanced(
                delta_link=delta_link,
                next_link=next_link,
                seen=seen,
                gone=[d.message_id for d in removed if d.message_id],
            )
            if blobs is not None:
                blobs.commit()
            self._commit_page([b for b, _ in built], cursor, tombstones)
        return len(built)

    def _links_after(self, page: DeltaPage, *, resync: bool) -> tuple[str | None, str | None]:
        """The cursor's (delta link, next link) once ``page`` is committed. In the middle of a
        round from a delta link, that link stays: after a crash the round is read again from
        its start (what was committed compares equal with the items: nothing twice). A first
        round keeps its next link; a resync none (interrupted, it starts again)."""
        assert self.cursor is not None
        if page.delta_link is not None:
            return page.delta_link, None
        if self.cursor.live:
            return self.cursor.delta_link, None
        return None, None if resync else page.next_link

    def _build(
        self,
        wanted: Sequence[tuple[MessageState, ChangeKindSymbol | None]],
        blobs: Any,
    ) -> list[tuple[BuiltMessage, MessageState]]:
        client = self.mailbox.client
        mimes = list(self._fetchers.map(lambda w: client.mime(w[0].message_id), wanted))
        built: list[tuple[BuiltMessage, MessageState]] = []
        for (entry, change), mime in zip(wanted, mimes, strict=True):
            if mime is None:
                continue  # deleted since the page was read: its @removed comes next round
            kind: ChangeKindSymbol | Callable[[str], ChangeKindSymbol] = change or self._new_kind
            built.append((self.builder.build(entry, mime, blobs, kind), entry))
        return built

    def _new_kind(self, key: str) -> ChangeKindSymbol:
        return "UPDATED" if self.mailbox.held_elsewhere(self.folder, key) else "ADDED"

    # --- what left the folder -------------------------------------------------------------------

    def _gone_after_resync(self, listed: set[str]) -> int:
        """After a resync round: the cursor's messages the listing lacks left the folder while
        the token was dead; one more transaction with their tombstones (when due)."""
        assert self.cursor is not None
        missing = [(d, t) for d, t in self.cursor.items.items() if d not in listed]
        if not missing:
            return 0
        tombstones = self._departures([Departure(d, t.key) for d, t in missing])
        self._commit_page([], self.cursor.without(d for d, _ in missing), tombstones)
        return len(tombstones)

    def _departures(self, removed: Sequence[Departure]) -> list[SourceRecord]:
        """Tombstones for the published keys of ``removed`` that no watched folder holds any
        more. Without a message id (gone while the delta token was dead: a resync knows only
        the digest) only the cursors can say where it is."""
        assert self.cursor is not None
        tombstones: list[SourceRecord] = []
        remaining = self.cursor.without(d.digest for d in removed)
        decided: set[str] = set()
        for _, key, message_id in removed:
            if not key or key in decided:
                continue
            decided.add(key)
            if remaining.holds_key(key) or self.mailbox.held_elsewhere(self.folder, key):
                continue  # another copy here, or in another watched folder's cursor
            if message_id is not None and self._moved_to_watched(message_id):
                self.mailbox.moved(key)
                continue
            log.info(
                "graph %s/%s: %s is in no watched folder any more: tombstone",
                self.account.name,
                self.folder,
                key,
            )
            tombstones.append(self.builder.tombstone(key))
        return tombstones

    def _moved_to_watched(self, message_id: str) -> bool:
        """Whether the message is now in another watched folder (moved there; that folder's
        worker may not have seen it yet). An immutable id survives a move, so Graph answers
        with its new ``parentFolderId``; 404 means deleted."""
        parent = self.mailbox.client.parent_folder(message_id)
        return (
            parent is not None and parent != self.folder_id and parent in self.mailbox.watched_ids()
        )

    # --- writing --------------------------------------------------------------------------------

    def _commit_page(
        self,
        built: Sequence[BuiltMessage],
        cursor: GraphCursor,
        tombstones: Sequence[SourceRecord],
    ) -> None:
        records = [r for b in built for r in b.records] + list(tombstones)
        self._before_commit()
        try:
            self._write(records, cursor.to_offset())
        except FencedError:
            raise
        except Exception:
            # Whether it committed is unknown: a new writer's init_transactions settles it, and
            # run() reads the cursor back after that.
            self._discard_writer()
            raise
        self.cursor = cursor
        self.mailbox.holds(self.folder, cursor.keys())
        events = sum(1 for b in built if b.key is not None) + len(tombstones)
        self.events_published += events
        self.tombstones_published += len(tombstones)
        if events:
            self.metrics.events_produced.labels(*self._labels).inc(events)
        dlq = sum(1 for b in built if b.dlq or b.key is None)
        if dlq:
            self.metrics.dlq_records.labels(*self._labels).inc(dlq)


def _received_before(entry: MessageState, instant: str) -> bool:
    """``start: latest``: a message received before the first start is not published."""
    return entry.received is None or entry.received < dt.datetime.fromisoformat(instant)
