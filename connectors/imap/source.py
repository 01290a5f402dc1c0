"""The IMAP source: every owned (account, folder) as one worker thread, on the runtime every
source shares (:mod:`connectors.core.source.runtime`: /healthz, ownership, reload, stop).

Which mailboxes an instance owns: every configured one, changed by the mailboxes topic, or with
``imap.group`` its share of them among the group's live instances (connectors.core.source.ownership.group);
the folders of an account always run together (they share the account's key index), and a
change of an account's owned folders restarts all of them with a fresh index.

    source = ImapSource.from_config(load_config("mailtap.yaml"))
    source.run()        # blocks until stop_event (SIGTERM/SIGINT in the CLI) or every worker is fenced

What IMAP adds to the runtime: the key index changelog topic, the schema's registration in the
background (the mailboxes start meanwhile; start() returns with the registry's answer), the key
indexes of the owned accounts (loaded for those only), the parse processes and the claim-check
store with its threads, and (without a group) the configured folders' IMAP logins, started at
the beginning of the start-up so that they overlap its waits on Kafka
(:mod:`connectors.imap.earlylogin`).

Start-up order matters for exactly-once (Kafka Connect KIP-618): each worker first creates its
transactional producer (``init_transactions`` fences a previous instance and aborts its open
transaction), and only then reads its cursor from the offsets topic with read_committed.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import threading
from collections.abc import Callable, Collection, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, TypeVar

from connectors.core.avro.serde import AvroSerde
from connectors.core.claimcheck.open import open_configured
from connectors.core.claimcheck.store import ClaimCheckStore, close_store
from connectors.core.config import MailtapConfig
from connectors.core.metrics import SourceMetrics
from connectors.core.source.ownership.group import STOP_JOIN_S, by_account
from connectors.core.source.ownership.wiring import MailboxesRead, read_mailboxes
from connectors.core.source.runtime import FolderRun, FolderSourceRuntime, ensure_own_topics
from connectors.imap.config import SECTION, ImapAccountSettings, ImapSourceSettings
from connectors.imap.connection import ImapConnection
from connectors.imap.cursor import SOURCE as SOURCE_KIND
from connectors.imap.earlylogin import EarlyLogins
from connectors.imap.errors import ParsePoolClosed
from connectors.imap.index import AccountIndex, load_indexes
from connectors.imap.indexlog import topic_spec as index_topic_spec
from connectors.imap.parsepool import (
    BuilderSpec,
    MailboxParsing,
    ParsePool,
    make_builder,
)
from connectors.imap.worker import MailboxWorker

log = logging.getLogger(__name__)

__all__ = ["TRANSACTIONAL_PREFIX", "ImapSource"]

TRANSACTIONAL_PREFIX = "mailtap-imap"
Loaded = TypeVar("Loaded")
#: The registration of a source that has not prepared yet: nothing to wait for.
_DONE: Future[None] = Future()
_DONE.set_result(None)


class ImapSource(FolderSourceRuntime[ImapSourceSettings, MailboxWorker]):
    source_kind = SOURCE_KIND
    # An account's folders share its key index and tombstone clock: placed (and run) together.
    placement = staticmethod(by_account)
    transactional_prefix = TRANSACTIONAL_PREFIX
    stop_join_s = STOP_JOIN_S

    def __init__(
        self,
        cfg: MailtapConfig,
        settings: ImapSourceSettings,
        *,
        metrics: SourceMetrics | None = None,
        serve_health: bool = True,
    ) -> None:
        super().__init__(cfg, settings, metrics=metrics, serve_health=serve_health)
        self._pool: ParsePool | None = None
        self._serde: AvroSerde | None = None
        self._registration: Future[None] = _DONE
        self._preloaded: dict[str, AccountIndex] = {}  # loaded by prepare(), not yet running
        #: The configured folders' logins, started with the start-up (no group only).
        self._early: EarlyLogins | None = None
        #: account name -> the key index its running folders share.
        self._indexes: dict[str, AccountIndex] = {}

    @classmethod
    def from_config(cls, cfg: MailtapConfig, **kwargs: Any) -> ImapSource:
        return cls(cfg, cfg.section(SECTION, ImapSourceSettings), **kwargs)

    # --- what the folders share --------------------------------------------------------------

    def prepare(self, wait_for_registry: bool = True) -> None:
        """What every mailbox shares: topics, the schema, the claim-check store, parse processes.

        Without a group every configured account is this instance's: their key indexes load
        while the topics are ensured, the registry and the claim-check store checked, all
        mostly waits on the network, so start-up pays the longest one only. They load once
        every permission is granted, and only then while the topics are ensured when every
        topic they read exists (``mail.events``, the offsets, the key index changelog): a topic
        created a moment ago has no partition leader yet, and reading it then fails.

        The schema's registration (connectors.core.avro.registry) runs in the background; with
        ``wait_for_registry`` this returns once it is done (raising the registry's refusal).
        `start` does not wait here: the mailboxes start (transactional producer, cursor,
        connect, SELECT, first FETCH) while it runs, since only the first encode needs the
        schema id, and that encode waits for it.
        """
        kafka = self.cfg.kafka
        serde = AvroSerde.shared("MailEvent", kafka)
        self._serde = serde
        names = [a.name for a in self.settings.accounts] if self.settings.group is None else []
        t = kafka.topics
        # The key index changelog is IMAP's own topic too (connectors.imap.indexlog's spec).
        specs = {t.imap_index: functools.partial(index_topic_spec, kafka)}
        loading: list[Future[dict[str, AccountIndex]]] = []

        def load() -> None:
            if names and not loading:
                loading.append(_in_background(load_indexes, "imap-index", kafka, serde, names))

        def checked(missing: Collection[str]) -> None:
            if {t.events, t.offsets, t.imap_index}.isdisjoint(missing):
                load()

        try:
            ensure_own_topics(kafka, "imap", self.settings.group, specs, checked=checked)
        except BaseException:
            for future in loading:  # refused meanwhile: what loaded is dropped
                future.add_done_callback(_close_indexes)
            raise
        registering = ThreadPoolExecutor(1, thread_name_prefix="imap-registry")
        self._registration = registering.submit(serde.prepare, kafka.topics.events)
        registering.shutdown(wait=False)  # the submitted registration still runs to its end
        load()
        self._claim_check = open_configured(self.cfg.claim_check, self.settings.claim_check_threads)
        for future in loading:
            self._preloaded = future.result()
        if wait_for_registry:
            self._registration.result()
        if self._pool is None and self.settings.parse_workers > 0:
            self._pool = ParsePool(self.settings.parse_workers)

    def _open_claim_check(self) -> ClaimCheckStore | None:
        return None  # opened by prepare(), with its threads, while the key indexes load

    def _prepare(self) -> MailboxesRead:
        # The mailboxes topic is read while prepare() checks the topics and loads the indexes:
        # all waits on the broker, which start-up would otherwise pay one after the other.
        reading: Future[MailboxesRead] = Future()
        configured = self._configured()

        def read() -> None:
            try:
                reading.set_result(read_mailboxes(self.cfg.kafka, SOURCE_KIND, configured))
            except BaseException as exc:
                reading.set_exception(exc)

        # A daemon thread: when prepare() refuses, the refusal goes out at once. The reader
        # may be waiting out its own timeout on the same refusal (no Read on the mailboxes
        # topic: 30 s, past the 30 s a missing ACL may take to be named), and must not hold
        # the refusal, nor the process's exit, until then; it closes its watcher if it ends.
        threading.Thread(target=read, name="imap-mailboxes", daemon=True).start()
        if self.settings.group is None:
            # Every configured folder is this instance's (unless the mailboxes topic says
            # otherwise): their IMAP logins overlap the waits on Kafka below and the workers'
            # init_transactions (connectors.imap.earlylogin). With a group, the assignment
            # decides later which are ours.
            self._early = EarlyLogins(self._open_session)
            self._early.start(self.settings.accounts)
        if self.settings.parse_workers > 0:
            self._pool = ParsePool(self.settings.parse_workers)
        try:
            self.prepare(wait_for_registry=False)
        except BaseException:
            reading.add_done_callback(_close_watcher)
            raise
        return reading.result()

    def _ready(self) -> None:
        if self._pool is not None:
            # The parse processes start once the workers have: spawning them and their imports
            # (~1 s of CPU each) ran beside this start-up's own imports and Kafka round trips
            # and slowed it on 2 cores (process start -> first event, 5 rounds each, load 3-7:
            # median 2.04 s when they started with _prepare, 1.27 s from here; backfill rate
            # no worse). A worker's first batch does not wait for them (worker.py,
            # FIRST_BATCH_INLINE); the rest of a backlog finds them up or starting.
            threading.Thread(target=self._warm_up, name="parse-pool-warm-up", daemon=True).start()
        if self._early is not None:
            # The folders that did not start here (the mailboxes topic removed them) log out.
            self._early.keep_only({(u.account, u.folder) for u in self._runs})
        # A registry that refuses the schema stops the source at start, with the sentence,
        # before its first transaction: a worker's first encode waits for the same answer.
        self._registration.result()

    def _warm_up(self) -> None:
        pool = self._pool
        if pool is None:
            return
        try:
            pool.warm_up()
        except ParsePoolClosed:
            return  # the source stopped (a refused start) while they were starting
        except Exception:  # the first backfill starts the processes (and reports) instead
            log.warning("parse processes did not start ahead of time", exc_info=True)

    # --- the folders of an account -----------------------------------------------------------

    def _running(self, account: ImapAccountSettings, folders: tuple[str, ...]) -> Any:
        # A folder's worker knows every other watched folder of its account (expunges become
        # tombstones once gone from all of them): a change of the owned folders restarts them.
        return account.model_copy(update={"folders": folders})

    def _starting(self, accounts: Sequence[ImapAccountSettings]) -> None:
        # Loaded for the newly owned accounts only: start-up does not grow with the others.
        new = [a.name for a in accounts if a.name not in self._indexes]
        for name in new:
            if name in self._preloaded:
                self._indexes[name] = self._preloaded.pop(name)
        missing = [name for name in new if name not in self._indexes]
        if missing:
            assert self._serde is not None, "prepare() first"
            self._indexes.update(load_indexes(self.cfg.kafka, self._serde, missing))

    def _connection(self, account: ImapAccountSettings, folder: str) -> ImapConnection:
        """A worker's session: its early login when there is one, else a new connection."""
        early = self._early.take(account, folder) if self._early is not None else None
        return early if early is not None else self._new_connection(account)

    def _open_session(self, account: ImapAccountSettings) -> ImapConnection:
        conn = self._new_connection(account)
        conn.open(qresync=self.settings.qresync == "auto")
        return conn

    def _new_connection(self, account: ImapAccountSettings) -> ImapConnection:
        return ImapConnection(
            account,
            connect_timeout=self.settings.connect_timeout_seconds,
            read_timeout=self.settings.read_timeout_seconds,
        )

    def _worker(
        self, account: ImapAccountSettings, folder: str, stop: threading.Event
    ) -> MailboxWorker:
        kafka = self.cfg.kafka
        index = self._indexes[account.name]
        spec = BuilderSpec(
            account=account.name,
            folder=folder,
            kafka=kafka,
            dlq_topic=kafka.topics.dlq,
            max_record_bytes=self.settings.max_record_bytes,
            limits=self.limits,
            claim_check=self.cfg.claim_check,
            claim_check_threads=self.settings.claim_check_threads,
            index_changelog=index.changelog,
        )
        return MailboxWorker(
            account=account,
            folder=folder,
            settings=self.settings,
            builder=make_builder(spec, self._claim_check),
            index=index,
            connection_factory=functools.partial(self._connection, account, folder),
            watched_folders=account.folders,
            parsing=MailboxParsing(self._pool, spec) if self._pool else None,
            **self._folder_runtime(account.name, folder, stop),
        )

    def _ended(self, runs: Sequence[FolderRun[MailboxWorker]]) -> None:
        ending = {run.unit for run in runs}
        running = {unit.account for unit in self._runs if unit not in ending}
        for name in {run.unit.account for run in runs} - running:
            index = self._indexes.pop(name, None)
            # Its temporary database; only once no worker can use it (one left behind is
            # fenced at its next commit, the index dropped with it).
            if index is not None and not any(
                run.thread.is_alive() for run in runs if run.unit.account == name
            ):
                index.close()

    def _closed(self) -> None:
        if self._early is not None:
            self._early.close()
            self._early = None
        if self._pool is not None:
            # After a refused start the processes may still be importing: the refusal's
            # sentence must not wait for them (they exit with this process either way).
            self._pool.close(wait=self.started.is_set())
            self._pool = None
        for index in self._preloaded.values():
            index.close()
        self._preloaded.clear()
        store, self._claim_check = self._claim_check, None
        close_store(store)


def _in_background(call: Callable[..., Loaded], name: str, *args: Any) -> Future[Loaded]:
    """``call(*args)`` on a daemon thread: a refused start-up says its sentence and exits
    without waiting for it."""
    done: Future[Loaded] = Future()

    def run() -> None:
        try:
            done.set_result(call(*args))
        except BaseException as exc:
            done.set_exception(exc)

    threading.Thread(target=run, name=name, daemon=True).start()
    return done


def _close_indexes(done: Future[dict[str, AccountIndex]]) -> None:
    """The key indexes of a load that ended after the start was refused."""
    with contextlib.suppress(Exception):
        for index in done.result().values():
            index.close()


def _close_watcher(done: Future[MailboxesRead]) -> None:
    """The mailboxes watcher of a read that ended after the start was refused."""
    with contextlib.suppress(Exception):
        done.result().watcher.close()
