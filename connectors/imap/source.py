"""The IMAP source: every owned (account, folder) as one worker thread, plus /healthz.

Which mailboxes an instance owns: every configured one, changed by the mailboxes topic, or with
``imap.group`` its share of them among the group's live instances (connectors.core.source.ownership.group);
the folders of an account always run together (they share the account's key index).

    source = ImapSource.from_config(load_config("mailtap.yaml"))
    source.run()        # blocks until stop() (SIGTERM/SIGINT in the CLI) or every worker is fenced

Start-up order matters for exactly-once (Kafka Connect KIP-618): each worker first creates its
transactional producer (``init_transactions`` fences a previous instance and aborts its open
transaction), and only then reads its cursor from the offsets topic with read_committed.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import threading
import time
from collections.abc import Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from connectors.core.avro.serde import AvroSerde
from connectors.core.claimcheck.open import open_configured
from connectors.core.claimcheck.store import ClaimCheckStore, close_store
from connectors.core.config import KafkaSettings, MailtapConfig
from connectors.core.kafka.acls import source_acls
from connectors.core.kafka.offsets import OffsetStore, SharedReads
from connectors.core.kafka.permissions import check_created, check_permissions
from connectors.core.kafka.topics import ensure_topic_specs, ensure_topics
from connectors.core.kafka.transactions import TransactionalSourceWriter
from connectors.core.mail import ParseLimits
from connectors.core.metrics import HealthServer, SourceMetrics
from connectors.core.source.location import SourceLocation
from connectors.core.source.ownership.group import STOP_JOIN_S, WorkUnit, by_account
from connectors.core.source.ownership.wiring import Sharing, read_mailboxes, start_sharing
from connectors.core.source.worker import Writer
from connectors.imap.config import SECTION, ImapAccountSettings, ImapSourceSettings
from connectors.imap.connection import ImapConnection
from connectors.imap.cursor import SOURCE as SOURCE_KIND
from connectors.imap.index import AccountIndex, load_indexes
from connectors.imap.indexlog import topic_spec as index_topic_spec
from connectors.imap.parsepool import BuilderSpec, MailboxParsing, ParsePool, make_builder
from connectors.imap.worker import MailboxWorker

log = logging.getLogger(__name__)

TRANSACTIONAL_PREFIX = "mailtap-imap"
#: The registration of a source that has not prepared yet: nothing to wait for.
_DONE: Future[None] = Future()
_DONE.set_result(None)


class ImapSource:
    def __init__(
        self,
        config: MailtapConfig,
        settings: ImapSourceSettings,
        metrics: SourceMetrics | None = None,
    ) -> None:
        self.config = config
        self.settings = settings
        self.kafka: KafkaSettings = config.kafka
        self.metrics = metrics or SourceMetrics()
        self.stop_event = threading.Event()
        self._health: HealthServer | None = None
        self._claim_check: ClaimCheckStore | None = None
        self._pool: ParsePool | None = None
        self._serde: AvroSerde | None = None
        self._registration: Future[None] = _DONE
        self._preloaded: dict[str, AccountIndex] = {}  # loaded by prepare(), not yet running
        self._limits = ParseLimits()
        #: account name -> its running workers (the accounts this instance owns now).
        self._runs: dict[str, _AccountRun] = {}
        self._sharing: Sharing | None = None
        self._fenced_at_end: bool | None = None
        # Settled: a mailbox that moved here was committed by another process moments ago,
        # maybe behind another mailbox's open transaction, which a read_committed read stops at.
        # Shared: the mailboxes that start together (start-up, a failover) read the topic once.
        self._offset_reads = SharedReads(lambda: OffsetStore(self.kafka).read_all(settled=True))
        #: Set once start() returned: the mailboxes run and a reload may change them.
        self.started = threading.Event()
        #: Held while _apply stops and starts accounts (run() must not see them half-changed).
        self._applying = threading.Lock()

    @classmethod
    def from_config(cls, config: MailtapConfig) -> ImapSource:
        return cls(config, config.section(SECTION, ImapSourceSettings))

    # --- wiring ------------------------------------------------------------------------------

    def _writer(self, txn_id: str) -> Writer:
        return TransactionalSourceWriter(
            self.kafka, txn_id, acl_prefix=f"{self.kafka.qualify(TRANSACTIONAL_PREFIX)}-"
        )

    def _read_offsets(self) -> Mapping[bytes, Mapping[str, Any]]:
        return self._offset_reads()

    def _connection(self, account: ImapAccountSettings) -> ImapConnection:
        return ImapConnection(
            account,
            connect_timeout=self.settings.connect_timeout_seconds,
            read_timeout=self.settings.read_timeout_seconds,
        )

    def prepare(self, wait_for_registry: bool = True) -> None:
        """What every mailbox shares: topics, the schema, the claim-check store, parse processes.

        Without a group every configured account is this instance's: their key indexes load
        while the registry and the claim-check store are checked, both mostly waits on the
        network, so start-up pays the longer one only. Not while the topics are ensured: a
        topic created a moment ago has no partition leader yet, and reading it then fails.

        The schema's registration (connectors.core.avro.registry) runs in the background; with
        ``wait_for_registry`` this returns once it is done (raising the registry's refusal).
        `start` does not wait here: the mailboxes start (transactional producer, cursor,
        connect, SELECT, first FETCH) while it runs, since only the first encode needs the
        schema id, and that encode waits for it.
        """
        serde = AvroSerde.shared("MailEvent", self.kafka)
        self._serde = serde
        names = [a.name for a in self.settings.accounts] if self.settings.group is None else []
        # Every permission of its topics and groups first, before a mail is read or a cursor
        # moves: a refusal is one sentence naming the ACL (connectors.core.kafka.permissions).
        # The check waits for the cluster as every start does ("cannot reach Kafka").
        needed = source_acls(self.kafka, source="imap", group=self.settings.group)
        missing = check_permissions(self.kafka, needed)
        t = self.kafka.topics
        # Its own topics only, created when missing: the others are the admin's (mailtap
        # topics ensure), the ACLs connectors.core.kafka.acls computes. The group's work topic
        # is connectors.core.source.ownership.group's, created at its first use.
        own = [t.events, t.offsets, t.mailboxes]
        ensure_topics(self.kafka, only=own)
        if t.imap_index in missing:  # connectors.imap.indexlog's spec (an existing one is kept)
            ensure_topic_specs(self.kafka, [index_topic_spec(self.kafka)])
            own.append(t.imap_index)
        check_created(self.kafka, needed, [n for n in missing if n in own])
        registering = ThreadPoolExecutor(1, thread_name_prefix="imap-registry")
        self._registration = registering.submit(serde.prepare, self.kafka.topics.events)
        registering.shutdown(wait=False)  # the submitted registration still runs to its end
        with ThreadPoolExecutor(1, thread_name_prefix="imap-index") as loader:
            loading = loader.submit(load_indexes, self.kafka, serde, names) if names else None
            self._claim_check = open_configured(
                self.config.claim_check, self.settings.claim_check_threads
            )
            if loading is not None:
                self._preloaded = loading.result()
        if wait_for_registry:
            self._registration.result()
        self._limits = ParseLimits(**self.settings.limits.overrides())
        if self.settings.parse_workers > 0:
            self._pool = ParsePool(self.settings.parse_workers)

    def _account_run(self, account: ImapAccountSettings, index: AccountIndex) -> _AccountRun:
        """The workers of one account's owned folders, around the account's key index."""
        run = _AccountRun(account, index)
        for folder in account.folders:
            spec = BuilderSpec(
                account=account.name,
                folder=folder,
                kafka=self.kafka,
                dlq_topic=self.kafka.topics.dlq,
                max_record_bytes=self.settings.max_record_bytes,
                limits=self._limits,
                claim_check=self.config.claim_check,
                claim_check_threads=self.settings.claim_check_threads,
                index_changelog=index.changelog,
            )
            builder = make_builder(spec, self._claim_check)
            run.workers.append(
                MailboxWorker(
                    account=account,
                    folder=folder,
                    settings=self.settings,
                    builder=builder,
                    index=index,
                    metrics=self.metrics,
                    stop=run.stop,
                    writer_factory=self._writer,
                    read_offsets=self._read_offsets,
                    connection_factory=functools.partial(self._connection, account),
                    transactional_id=SourceLocation(
                        SOURCE_KIND, account.name, folder
                    ).transactional_id(self.config.kafka.qualify(TRANSACTIONAL_PREFIX)),
                    watched_folders=account.folders,
                    parsing=MailboxParsing(self._pool, spec) if self._pool else None,
                )
            )
        return run

    def _apply(self, owned: frozenset[WorkUnit]) -> None:
        """Run exactly the ``owned`` mailboxes (Assignment calls this, one call at a time).

        The unit of start and stop is the account: its folders share the key index and the
        tombstone clock, and a folder's worker must know every other watched folder of the
        account. An account whose set of folders or whose settings change (a config reload)
        restarts with a fresh index.
        """
        with self._applying:
            self._apply_locked(owned)

    def _apply_locked(self, owned: frozenset[WorkUnit]) -> None:
        # Every owned unit's account is configured: MailboxCatalog.wanted keeps only those, and
        # a reload swaps it and self.settings together, under the Assignment's lock.
        configured = {a.name: a for a in self.settings.accounts}
        folders: dict[str, list[str]] = {}
        for unit in sorted(owned):
            folders.setdefault(unit.account, []).append(unit.folder)
        wanted = {name: tuple(f) for name, f in folders.items()}
        leaving = [
            run
            for name, run in self._runs.items()
            if name not in wanted
            or run.account != configured[name].model_copy(update={"folders": wanted[name]})
        ]
        for run in leaving:
            run.stop.set()
        for run in leaving:
            self._end(run)
            if not self.stop_event.is_set():  # stopping: what ran stays listed in ``workers``
                del self._runs[run.account.name]
        starting = [
            configured[name].model_copy(update={"folders": f})
            for name, f in wanted.items()
            if name not in self._runs
        ]
        if not starting or self.stop_event.is_set():
            return
        assert self._serde is not None, "prepare() first"
        # Loaded for the newly owned accounts only: start-up does not grow with the others.
        indexes = {n: self._preloaded.pop(n) for n in wanted if n in self._preloaded}
        missing = [a.name for a in starting if a.name not in indexes]
        if missing:
            indexes.update(load_indexes(self.kafka, self._serde, missing))
        for account in starting:
            run = self._account_run(account, indexes[account.name])
            self._runs[account.name] = run
            for worker in run.workers:
                self.metrics.watch(SOURCE_KIND, account.name, worker.folder)
                thread = threading.Thread(
                    target=worker.run,
                    name=f"imap-{worker.account.name}-{worker.folder}",
                    daemon=True,
                )
                run.threads.append(thread)
                thread.start()

    def _end(self, run: _AccountRun) -> None:
        """Join an account's workers (their stop is set), then forget it here."""
        deadline = time.monotonic() + STOP_JOIN_S
        for thread in run.threads:
            thread.join(max(0.0, deadline - time.monotonic()))
        if any(t.is_alive() for t in run.threads):
            # Its next commit is fenced by the new owner's init_transactions (contract.py).
            log.warning(
                "imap %s: a worker did not stop within %.0fs", run.account.name, STOP_JOIN_S
            )
        else:
            run.index.close()  # its temporary database; only once no worker can use it
        for worker in run.workers:
            self.metrics.unwatch(SOURCE_KIND, run.account.name, worker.folder)

    # --- lifecycle ---------------------------------------------------------------------------

    def start(self) -> None:
        health = self.config.health
        self._health = HealthServer(
            self.metrics, health.host, health.port, health.max_sync_age_seconds
        ).start()
        configured = {a.name: a.folders for a in self.settings.accounts}
        # The mailboxes topic is read while prepare() checks the topics and loads the indexes:
        # all waits on the broker, which start-up would otherwise pay one after the other.
        with ThreadPoolExecutor(1, thread_name_prefix="imap-mailboxes") as reader:
            reading = reader.submit(read_mailboxes, self.kafka, SOURCE_KIND, configured)
            try:
                self.prepare(wait_for_registry=False)
            except BaseException:
                with contextlib.suppress(Exception):
                    reading.result().watcher.close()
                raise
            mailboxes = reading.result()
        if self._pool is not None:
            # In the background: a mailbox with nothing to catch up must not wait for it.
            threading.Thread(target=self._warm_up, name="parse-pool-warm-up", daemon=True).start()
        self._sharing = start_sharing(
            self.kafka,
            self.settings.group,
            SOURCE_KIND,
            configured,
            by_account,
            self._apply,
            self.metrics,
            mailboxes=mailboxes,
        )
        if self.settings.group is None:
            log.info("imap source: %d mailboxes started", len(self.workers))
        try:
            # A registry that refuses the schema stops the source at start, with the sentence,
            # before its first transaction: a worker's first encode waits for the same answer.
            self._registration.result()
        except BaseException:
            self.close()
            raise
        self.started.set()

    def reconfigure(self, settings: ImapSourceSettings) -> None:
        """Run ``settings.accounts`` from now on (a config reload, connectors.core.source.reload):
        accounts added start (this instance's share of them with a group), removed ones stop,
        changed ones restart with their new settings; folders added or removed through the
        mailboxes topic still apply on top. The other settings must be the running ones."""
        sharing = self._sharing
        if sharing is None or self.stop_event.is_set():
            return

        def swap() -> None:
            self.settings = settings

        sharing.reconfigure({a.name: a.folders for a in settings.accounts}, swap)

    def _warm_up(self) -> None:
        pool = self._pool
        if pool is None:
            return
        try:
            pool.warm_up()
        except Exception:  # the first backfill starts the processes (and reports) instead
            log.warning("parse processes did not start ahead of time", exc_info=True)

    @property
    def workers(self) -> list[MailboxWorker]:
        """The workers of the mailboxes this instance owns now."""
        return [w for run in list(self._runs.values()) for w in run.workers]

    @property
    def owned(self) -> frozenset[WorkUnit]:
        return self._sharing.assignment.owned if self._sharing else frozenset()

    @property
    def health_port(self) -> int | None:
        return self._health.port if self._health else None

    def wait(self, timeout: float | None = None) -> bool:
        """Block until every worker ended (stopped or fenced); False on timeout."""
        for run in list(self._runs.values()):
            for thread in run.threads:
                thread.join(timeout)
                if thread.is_alive():
                    return False
        return True

    def _all_ended(self) -> bool:
        """Every worker ended by itself (fenced), not stopped for a moment by a change being
        applied (a reload that replaces the only account). Owning nothing is not having ended:
        every folder removed with `mailtap mailboxes` may come back."""
        if not self._applying.acquire(blocking=False):
            return False
        try:
            return bool(self._runs) and self.wait(timeout=0)
        finally:
            self._applying.release()

    def stop(self) -> None:
        self.stop_event.set()
        for run in list(self._runs.values()):
            run.stop.set()

    def close(self, timeout: float = 30.0) -> None:
        self.stop()
        if self._sharing is not None:
            self._sharing.close()  # stops and joins every owned mailbox, leaves the group
            self._sharing = None
        self.wait(timeout)
        if self._health is not None:
            self._health.stop()
            self._health = None
        if self._pool is not None:
            self._pool.close()
            self._pool = None
        for index in self._preloaded.values():
            index.close()
        self._preloaded.clear()
        close_store(self._claim_check)

    @property
    def all_fenced(self) -> bool:
        """Every owned mailbox was fenced (as it was when run() ended, once it has)."""
        if self._fenced_at_end is not None:
            return self._fenced_at_end
        workers = self.workers
        return bool(workers) and all(w.fenced for w in workers)

    def run(self) -> None:
        self.start()
        try:
            while not self.stop_event.wait(1.0):
                # Without a group, the source ends once every mailbox ended (fenced); in a group
                # it serves until stopped: owning nothing for a while is normal there.
                if self.settings.group is None and self._all_ended():
                    break
        finally:
            self._fenced_at_end = self.all_fenced  # close() forgets the mailboxes
            self.close()


class _AccountRun:
    """One owned account: its key index, workers, their threads and their stop signal."""

    def __init__(self, account: ImapAccountSettings, index: AccountIndex) -> None:
        self.account = account
        self.index = index
        self.stop = threading.Event()
        self.workers: list[MailboxWorker] = []
        self.threads: list[threading.Thread] = []
