"""The Exchange source: one :class:`~connectors.ews.worker.EwsFolderWorker` thread per owned
(account, folder), sharing metrics, the health endpoint and the parser.

The owned folders are the ``ews`` section's, changed by the mailboxes topic, or with
``ews.group`` this instance's share of them (:mod:`connectors.core.source.ownership.group`; each folder is
placed on its own, they share nothing).

Usage (``mailtap run ews-source -c CONFIG`` does this)::

    source = EwsSource.from_config(load_config(path))
    source.start()          # threads + /healthz
    ...                     # until SIGTERM
    source.stop()

Every batch passes the checkpoints of :mod:`connectors.core.checkpoints` (``before_write``,
``in_transaction``), where the kill -9 tests crash the process.
"""

from __future__ import annotations

import functools
import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from connectors.core import checkpoints
from connectors.core.avro.serde import AvroSerde
from connectors.core.claimcheck.open import open_configured
from connectors.core.config import MailtapConfig
from connectors.core.kafka.acls import source_acls
from connectors.core.kafka.offsets import OffsetStore, SharedReads
from connectors.core.kafka.permissions import check_created, check_permissions
from connectors.core.kafka.topics import ensure_topics
from connectors.core.kafka.transactions import TransactionalSourceWriter
from connectors.core.mail import ParseLimits, parse_mail
from connectors.core.metrics import HealthServer, SourceMetrics
from connectors.core.source.location import SourceLocation
from connectors.core.source.ownership.group import WorkUnit, by_folder
from connectors.core.source.ownership.wiring import Sharing, start_sharing
from connectors.ews.config import SECTION, EwsAccountSettings, EwsSourceSettings
from connectors.ews.connection import EwsConnection
from connectors.ews.records import EwsRecordBuilder
from connectors.ews.worker import SOURCE_KIND, EwsFolderWorker

log = logging.getLogger(__name__)

TRANSACTIONAL_ID_PREFIX = "mailtap-ews"
#: How long stop() waits for a worker. An interrupted stream read returns at once; a GetItem or a
#: Kafka commit in flight finishes first (request_timeout_seconds bounds the former).
STOP_JOIN_S = 10.0


class EwsSource:
    def __init__(
        self,
        cfg: MailtapConfig,
        settings: EwsSourceSettings,
        *,
        metrics: SourceMetrics | None = None,
        serve_health: bool = True,
    ) -> None:
        self.cfg = cfg
        self.settings = settings
        self.metrics = metrics or SourceMetrics()
        self.stop_event = threading.Event()
        self._serve_health = serve_health
        self._health: HealthServer | None = None
        self._claim_check = open_configured(cfg.claim_check)
        self._limits = ParseLimits(**settings.limits.overrides())
        self._accounts = {a.name: a for a in settings.accounts}
        #: The mailbox folders this instance owns now, each with its worker and thread.
        self._runs: dict[WorkUnit, _FolderRun] = {}
        self._sharing: Sharing | None = None
        # Settled: a cursor committed behind another source's open transaction counts. Shared:
        # the folders that start together (start-up, a failover) read the topic once.
        self._offset_reads = SharedReads(lambda: OffsetStore(cfg.kafka).read_all(settled=True))
        #: Set once start() returned: the folders run and a reload may change them.
        self.started = threading.Event()
        #: Held while _apply stops and starts folders (wait() must not see them half-changed).
        self._applying = threading.Lock()

    @classmethod
    def from_config(cls, cfg: MailtapConfig, **kwargs: Any) -> EwsSource:
        return cls(cfg, cfg.section(SECTION, EwsSourceSettings), **kwargs)

    @property
    def workers(self) -> list[EwsFolderWorker]:
        """The workers of the folders this instance owns now."""
        return [run.worker for run in list(self._runs.values())]

    def _worker(
        self, account: EwsAccountSettings, folder: str, stop: threading.Event
    ) -> EwsFolderWorker:
        kafka = self.cfg.kafka
        parser = functools.partial(parse_mail, limits=self._limits, claim_check=self._claim_check)
        builder = EwsRecordBuilder(
            account=account.name,
            folder=folder,
            parser=parser,
            serde=AvroSerde.shared("MailEvent", kafka),
            events_topic=kafka.topics.events,
            dlq_topic=kafka.topics.dlq,
            max_record_bytes=self.settings.max_record_bytes,
            claim_check=self._claim_check,
        )
        return EwsFolderWorker(
            account=account,
            folder=folder,
            settings=self.settings,
            builder=builder,
            metrics=self.metrics,
            stop=stop,
            writer_factory=functools.partial(
                TransactionalSourceWriter,
                kafka,
                acl_prefix=f"{kafka.qualify(TRANSACTIONAL_ID_PREFIX)}-",
            ),
            read_offsets=self._offset_reads,
            connection_factory=lambda: EwsConnection(account, self.settings, folder),
            transactional_id=SourceLocation(SOURCE_KIND, account.name, folder).transactional_id(
                self.cfg.kafka.qualify(TRANSACTIONAL_ID_PREFIX)
            ),
            before_commit=functools.partial(checkpoints.reached, "before_write"),
        )

    @property
    def health_port(self) -> int | None:
        """The port of /healthz and /metrics once started (``health.port: 0`` picks one)."""
        return self._health.port if self._health is not None else None

    def start(self) -> None:
        # Its own topics only (connectors.core.kafka.acls); one encoding per topic: refuse to
        # write mail.events framed otherwise than it is.
        # The check waits for the cluster as every start does ("cannot reach Kafka"); the
        # topics that do not exist yet are created, then checked too.
        t = self.cfg.kafka.topics
        needed = source_acls(self.cfg.kafka, source="ews", group=self.settings.group)
        missing = check_permissions(self.cfg.kafka, needed)
        own = [t.events, t.offsets, t.mailboxes]
        ensure_topics(self.cfg.kafka, only=own)
        check_created(self.cfg.kafka, needed, [n for n in missing if n in own])
        if self._serve_health:
            h = self.cfg.health
            self._health = HealthServer(self.metrics, h.host, h.port, h.max_sync_age_seconds)
            self._health.start()
        self._sharing = start_sharing(
            self.cfg.kafka,
            self.settings.group,
            SOURCE_KIND,
            {a.name: a.folders for a in self.settings.accounts},
            by_folder,
            self._apply,
            self.metrics,
        )
        self.started.set()

    def reconfigure(self, settings: EwsSourceSettings) -> None:
        """Run ``settings.accounts`` from now on (a config reload, connectors.core.source.reload):
        folders of added accounts start (this instance's share with a group), those of removed
        accounts stop, those of changed accounts restart with the new settings; the mailboxes
        topic's changes still apply on top. The other settings must be the running ones."""
        sharing = self._sharing
        if sharing is None or self.stop_event.is_set():
            return

        def swap() -> None:
            self.settings = settings
            self._accounts = {a.name: a for a in settings.accounts}

        sharing.reconfigure({a.name: a.folders for a in settings.accounts}, swap)

    def _apply(self, owned: frozenset[WorkUnit]) -> None:
        """Run exactly the ``owned`` folders: stop and join the others first (Assignment). A
        folder whose account's settings changed (a config reload) restarts with them."""
        with self._applying:
            self._apply_locked(owned)

    def _apply_locked(self, owned: frozenset[WorkUnit]) -> None:
        # Every owned unit's account is configured: MailboxCatalog.wanted keeps only those, and
        # a reload swaps it and self._accounts together, under the Assignment's lock.
        leaving = [
            run
            for unit, run in self._runs.items()
            if unit not in owned or run.worker.account != self._accounts[unit.account]
        ]
        self._end(leaving)
        if self.stop_event.is_set():
            return  # stopping: what ran stays listed in ``workers`` (their counts, fenced flags)
        for run in leaving:
            del self._runs[run.unit]
        for unit in sorted(owned - set(self._runs)):
            stop = threading.Event()
            worker = self._worker(self._accounts[unit.account], unit.folder, stop)
            thread = threading.Thread(
                target=worker.run, name=f"ews-{unit.account}-{unit.folder}", daemon=True
            )
            self.metrics.watch(SOURCE_KIND, unit.account, unit.folder)
            self._runs[unit] = _FolderRun(unit, worker, thread, stop)
            thread.start()

    def _end(self, runs: list[_FolderRun], timeout: float = STOP_JOIN_S) -> None:
        for run in runs:
            run.stop.set()
            run.worker.interrupt()
        for run in runs:
            run.thread.join(timeout)
            if run.thread.is_alive():
                # Its next commit is fenced by the next owner's init_transactions (contract.py).
                log.warning("ews %s: the worker did not stop within %.0fs", run.unit, timeout)
            self.metrics.unwatch(SOURCE_KIND, run.unit.account, run.unit.folder)

    def stop(self, timeout: float = STOP_JOIN_S) -> None:
        """Stop every worker (interrupting stream reads) and wait for them, then leave the
        group. A worker still busy after ``timeout`` is left behind (daemon thread): its batch
        is committed or not at all."""
        self.stop_event.set()
        runs = list(self._runs.values())
        for run in runs:
            run.stop.set()
            run.worker.interrupt()
        for run in runs:
            run.thread.join(timeout)
        if self._sharing is not None:
            self._sharing.close()
            self._sharing = None
        if self._health is not None:
            self._health.stop()

    def wait(self) -> None:
        """Block until stop() is called (from a signal handler), or, without a group, until
        every worker ended (fenced)."""
        while not self.stop_event.wait(1.0):
            if self.settings.group is not None:
                continue
            if not self._applying.acquire(blocking=False):
                continue  # a change is being applied: its stopped workers did not end by themselves
            try:
                runs = list(self._runs.values())
                if runs and not any(run.thread.is_alive() for run in runs):
                    return
            finally:
                self._applying.release()


@dataclass
class _FolderRun:
    unit: WorkUnit
    worker: EwsFolderWorker
    thread: threading.Thread
    stop: threading.Event


def run_forever(source: EwsSource, install_signals: Callable[[Callable[[], None]], None]) -> None:
    """Start ``source``, let ``install_signals(stop)`` wire SIGTERM/SIGINT, block until stopped."""
    install_signals(source.stop_event.set)
    source.start()
    log.info("ews source running: %d mailbox folders", len(source.workers))
    source.wait()
    source.stop()
