"""The IMAP source: every configured (account, folder) as one worker thread, plus /healthz.

    source = ImapSource.from_config(load_config("mailtap.yaml"))
    source.run()        # blocks until stop() (SIGTERM/SIGINT in the CLI) or every worker is fenced

Start-up order matters for exactly-once (Kafka Connect KIP-618): each worker first creates its
transactional producer (``init_transactions`` fences a previous instance and aborts its open
transaction), and only then reads its cursor from the offsets topic with read_committed.
"""

from __future__ import annotations

import functools
import logging
import threading
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from connectors.core.claimcheck import ClaimCheckStore, close_store, open_configured
from connectors.core.config import KafkaSettings, MailtapConfig
from connectors.core.contract import TransactionalSourceWriter, transactional_id
from connectors.core.faults import CrashingWriter, CrashPoints
from connectors.core.kafka import ensure_topics
from connectors.core.mail import ParseLimits
from connectors.core.metrics import HealthServer, SourceMetrics
from connectors.core.offsets import OffsetStore
from connectors.core.serde import AvroSerde
from connectors.imap.config import SECTION, ImapAccountSettings, ImapSourceSettings
from connectors.imap.connection import ImapConnection
from connectors.imap.cursor import source_partition
from connectors.imap.index import AccountIndex, load_indexes
from connectors.imap.parsepool import BuilderSpec, MailboxParsing, ParsePool, make_builder
from connectors.imap.worker import MailboxWorker, Writer

log = logging.getLogger(__name__)

TRANSACTIONAL_PREFIX = "mailtap-imap"


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
        self.workers: list[MailboxWorker] = []
        self._threads: list[threading.Thread] = []
        self._health: HealthServer | None = None
        self._crash = CrashPoints.from_env()
        self._claim_check: ClaimCheckStore | None = None
        self._pool: ParsePool | None = None
        self._indexes: list[AccountIndex] = []

    @classmethod
    def from_config(cls, config: MailtapConfig) -> ImapSource:
        return cls(config, config.section(SECTION, ImapSourceSettings))

    # --- wiring ------------------------------------------------------------------------------

    def _writer(self, txn_id: str) -> Writer:
        if self._crash.active:
            return CrashingWriter(self.kafka, txn_id, crash=self._crash)
        return TransactionalSourceWriter(self.kafka, txn_id)

    def _read_offsets(self) -> Mapping[bytes, Mapping[str, Any]]:
        return OffsetStore(self.kafka).read_all()

    def _connection(self, account: ImapAccountSettings) -> ImapConnection:
        return ImapConnection(
            account,
            connect_timeout=self.settings.connect_timeout_seconds,
            read_timeout=self.settings.read_timeout_seconds,
        )

    def build_workers(self) -> list[MailboxWorker]:
        serde = AvroSerde.for_schema("MailEvent", self.kafka)
        names = [a.name for a in self.settings.accounts]
        # The key indexes load while the topics and the registry are checked: both are mostly
        # waits on the network (in librdkafka's threads), so start-up pays the longer one only.
        with ThreadPoolExecutor(1, thread_name_prefix="imap-index") as loader:
            loading = loader.submit(load_indexes, self.kafka, serde, names)
            ensure_topics(self.kafka)
            # A registry that refuses the schema stops the source here, with the sentence, not
            # at its first transaction (connectors.core.schemaregistry).
            serde.prepare(self.kafka.topics.events)
            store = open_configured(self.config.claim_check, self.settings.claim_check_threads)
            self._claim_check = store
            indexes = loading.result()
        limits = ParseLimits(**self.settings.limits.overrides())
        self._indexes = list(indexes.values())
        dlq_topic = self.settings.dlq_topic or self.kafka.topics.dlq
        if self.settings.parse_workers > 0:
            self._pool = ParsePool(self.settings.parse_workers)
        workers = []
        for account in self.settings.accounts:
            for folder in account.folders:
                spec = BuilderSpec(
                    account=account.name,
                    folder=folder,
                    kafka=self.kafka,
                    dlq_topic=dlq_topic,
                    max_record_bytes=self.settings.max_record_bytes,
                    limits=limits,
                    claim_check=self.config.claim_check,
                    claim_check_threads=self.settings.claim_check_threads,
                    index_changelog=indexes[account.name].changelog,
                )
                builder = make_builder(spec, store)
                workers.append(
                    MailboxWorker(
                        account=account,
                        folder=folder,
                        settings=self.settings,
                        builder=builder,
                        index=indexes[account.name],
                        metrics=self.metrics,
                        stop=self.stop_event,
                        writer_factory=self._writer,
                        read_offsets=self._read_offsets,
                        connection_factory=functools.partial(self._connection, account),
                        transactional_id=transactional_id(
                            TRANSACTIONAL_PREFIX, source_partition(account.name, folder)
                        ),
                        watched_folders=account.folders,
                        crash=self._crash,
                        parsing=MailboxParsing(self._pool, spec) if self._pool else None,
                    )
                )
        return workers

    # --- lifecycle ---------------------------------------------------------------------------

    def start(self) -> None:
        health = self.config.health
        self._health = HealthServer(
            self.metrics, health.host, health.port, health.max_sync_age_seconds
        ).start()
        self.workers = self.build_workers()
        if self._pool is not None:
            # In the background: a mailbox with nothing to catch up must not wait for it.
            threading.Thread(target=self._warm_up, name="parse-pool-warm-up", daemon=True).start()
        for worker in self.workers:
            thread = threading.Thread(
                target=worker.run, name=f"imap-{worker.account.name}-{worker.folder}", daemon=True
            )
            self._threads.append(thread)
            thread.start()
        log.info("imap source: %d mailboxes started", len(self.workers))

    def _warm_up(self) -> None:
        pool = self._pool
        if pool is None:
            return
        try:
            pool.warm_up()
        except Exception:  # the first backfill starts the processes (and reports) instead
            log.warning("parse processes did not start ahead of time", exc_info=True)

    @property
    def health_port(self) -> int | None:
        return self._health.port if self._health else None

    def wait(self, timeout: float | None = None) -> bool:
        """Block until every worker ended (stopped or fenced); False on timeout."""
        for thread in self._threads:
            thread.join(timeout)
            if thread.is_alive():
                return False
        return True

    def stop(self) -> None:
        self.stop_event.set()

    def close(self, timeout: float = 30.0) -> None:
        self.stop()
        self.wait(timeout)
        if self._health is not None:
            self._health.stop()
            self._health = None
        if self._pool is not None:
            self._pool.close()
            self._pool = None
        if self.wait(0):
            for index in self._indexes:
                index.close()  # its temporary database; only once no worker can use it
        close_store(self._claim_check)

    @property
    def all_fenced(self) -> bool:
        return bool(self.workers) and all(w.fenced for w in self.workers)

    def run(self) -> None:
        self.start()
        try:
            while not self.stop_event.is_set():
                if self.wait(timeout=1.0):
                    break
        finally:
            self.close()
