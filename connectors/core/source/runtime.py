"""A source's runtime, written once for every source (IMAP, EWS, Microsoft Graph): one folder
worker thread per owned work unit, the health endpoint, the start-up, the ownership wiring, the
reload and the stop.

A source subclasses :class:`FolderSourceRuntime` and implements :meth:`_worker` (build the
:class:`~connectors.core.source.worker.FolderWorker` of one folder, handed the keywords of
:meth:`_folder_runtime`); the runtime starts and stops the workers as
:mod:`connectors.core.source.ownership` assigns units (a consumer group over a work topic, plus
the runtime catalog ``mailtap.mailboxes``) and on a reload (SIGHUP,
:mod:`connectors.core.source.reload`)::

    source = EwsSource.from_config(load_config(path))
    source.start()          # /healthz, the source's topics, the workers' threads
    ...                     # until SIGTERM
    source.stop()

or ``source.run()`` (start, serve until ``stop_event`` is set or, without a group, every worker
ended fenced, then stop), which :func:`run_forever` wraps for the ``mailtap run`` commands.

Start-up, in order: ``/healthz`` serves (an instance waiting for Kafka answers its probes);
:meth:`_prepare` (the source's topics and permissions, its schema, its stores: a refusal is one
sentence and ``start`` raises, stopped again); the ownership starts the owned workers (without a
group before ``start`` returns); :meth:`_ready` (IMAP waits for the schema's registration here,
which ran while its mailboxes started). Each worker's own start-up (``init_transactions``
before the cursor read, KIP-618) is the worker loop's (:mod:`connectors.core.source.worker`).

What a source may add, as hooks (every one defaults to nothing): :meth:`_running` (the settings
a unit's workers run with: IMAP hands each worker the account's owned folders, so a change of
them restarts the whole account), :meth:`_starting` (before the workers of newly owned accounts
are built: IMAP loads their key indexes, all in one read), :meth:`_ended` (runs stopped: release
what they shared) and :meth:`_closed` (after ``stop``: pools and stores).

What ``stop()`` guarantees: every worker is told to stop and interrupted (:meth:`interrupt` of
the worker ends its wait for change), then joined for ``stop_join_s`` at most, all of them
together; a worker still busy then (a commit in flight) is left behind as a daemon thread: its
batch is committed or not at all, and the next owner's ``init_transactions`` fences it. The same
holds for the units a rebalance, the mailboxes topic or a reload takes away.
"""

from __future__ import annotations

import functools
import logging
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Generic, Literal, Protocol, TypeVar

from connectors.core.avro.serde import AvroSerde
from connectors.core.claimcheck.open import open_configured
from connectors.core.claimcheck.store import ClaimCheckStore
from connectors.core.config import KafkaSettings, MailtapConfig, ParseLimitSettings
from connectors.core.kafka.acls import source_acls
from connectors.core.kafka.encoding import check_topic_encodings
from connectors.core.kafka.offsets import OffsetStore, SharedReads
from connectors.core.kafka.permissions import check_created, check_permissions
from connectors.core.kafka.topics import TopicSpec, ensure_topic_specs, ensure_topics
from connectors.core.kafka.transactions import TransactionalSourceWriter
from connectors.core.mail import ParseLimits, parse_mail
from connectors.core.metrics import HealthServer, SourceMetrics
from connectors.core.source.location import SourceLocation
from connectors.core.source.ownership.group import GroupSettings, Placement, WorkUnit
from connectors.core.source.ownership.wiring import MailboxesRead, Sharing, start_sharing
from connectors.core.source.records import MailRecordBuilderArgs
from connectors.core.source.worker import FolderWorkerRuntime

__all__ = ["STOP_JOIN_S", "FolderRun", "FolderSourceRuntime", "ensure_own_topics", "run_forever"]

log = logging.getLogger(__name__)

#: How long stop() waits for the workers it stops: an interrupted wait returns at once; a
#: request or a Kafka commit in flight finishes first (their own timeouts bound it).
STOP_JOIN_S = 10.0


class _Settings(Protocol):
    @property
    def accounts(self) -> Sequence[Any]: ...

    @property
    def group(self) -> GroupSettings | None: ...

    @property
    def max_record_bytes(self) -> int: ...

    @property
    def limits(self) -> ParseLimitSettings: ...


class _Worker(Protocol):
    account: Any
    fenced: bool

    def run(self) -> None: ...

    def interrupt(self) -> None: ...


W = TypeVar("W", bound=_Worker)
St = TypeVar("St", bound=_Settings)


@dataclass
class FolderRun(Generic[W]):
    """One owned unit: its worker, the worker's thread and its stop signal."""

    unit: WorkUnit
    worker: W
    thread: threading.Thread
    stop: threading.Event


def ensure_own_topics(
    kafka: KafkaSettings,
    source: Literal["imap", "ews", "graph"],
    group: GroupSettings | None,
    specs: Mapping[str, Callable[[], TopicSpec]] | None = None,
    *,
    checked: Callable[[Collection[str]], None] | None = None,
) -> None:
    """Every permission of the source's topics and groups first, before a mail is read or a
    cursor moves: a refusal is one sentence naming the ACL (connectors.core.kafka.permissions).
    The check waits for the cluster as every start does ("cannot reach Kafka").

    Then its own topics only, created when missing, and one encoding per topic checked (a
    topic framed otherwise than this configuration writes is refused): the others are the
    admin's (``mailtap topics ensure``), the ACLs :mod:`connectors.core.kafka.acls` computes.
    ``specs``: the source's own topics beyond the shared three, by name, each created from its
    spec when missing (an existing one is kept). The group's work topic is
    :mod:`connectors.core.source.ownership.group`'s, created at its first use.

    ``checked``: called once every permission is granted, with the topics still missing,
    before any is created or checked further: a source may start reading the topics that
    exist meanwhile (IMAP loads its key indexes), a wait on the broker that start-up would
    otherwise pay after this one.
    """
    needed = source_acls(kafka, source=source, group=group)
    missing = check_permissions(kafka, needed)
    if checked is not None:
        checked(missing)
    t = kafka.topics
    own = [t.events, t.offsets, t.mailboxes]
    ensure_topics(kafka, only=own)
    for name, spec in (specs or {}).items():
        if name in missing:
            ensure_topic_specs(kafka, [spec()])
            own.append(name)
    check_created(kafka, needed, [n for n in missing if n in own])


class FolderSourceRuntime(ABC, Generic[St, W]):
    """Runs the folder workers of the units this instance owns."""

    #: The source kind of the work units and metric labels (``imap``, ``ews``, ``graph``).
    source_kind: str
    #: How units are placed on the group's members (by_account keeps a mailbox's folders
    #: together: IMAP's share a key index, Graph's a per-mailbox request budget).
    placement: Placement
    #: The prefix of the source's transactional ids (``mailtap-ews``), before kafka.namespace.
    transactional_prefix: str
    #: How long stopping waits for the workers it stops, all of them together.
    stop_join_s: float = STOP_JOIN_S

    def __init__(
        self,
        cfg: MailtapConfig,
        settings: St,
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
        self._accounts: dict[str, Any] = {a.name: a for a in settings.accounts}
        self._runs: dict[WorkUnit, FolderRun[W]] = {}
        self._sharing: Sharing | None = None
        self._fenced_at_end: bool | None = None
        #: The parser's caps (``<source>.limits``) and the claim-check store every folder shares.
        self.limits = ParseLimits(**settings.limits.overrides())
        self._claim_check: ClaimCheckStore | None = self._open_claim_check()
        # Settled: a cursor committed behind another source's open transaction counts (a unit
        # that moved here was committed by another process moments ago). Shared: the folders
        # that start together (start-up, a failover) read the topic once.
        self.offset_reads = SharedReads(lambda: OffsetStore(cfg.kafka).read_all(settled=True))
        #: Set once start() returned: the folders run and a reload may change them.
        self.started = threading.Event()
        #: Held while _apply stops and starts folders (wait() must not see them half-changed).
        self._applying = threading.Lock()

    # --- what a source implements ------------------------------------------------------------

    @abstractmethod
    def _worker(self, account: Any, folder: str, stop: threading.Event) -> W:
        """The worker of one owned folder (not started); ``account`` as :meth:`_running` says."""

    def _open_claim_check(self) -> ClaimCheckStore | None:
        """The claim-check store the folders share, opened with the source (IMAP opens it in
        its start-up instead, while its key indexes load)."""
        return open_configured(self.cfg.claim_check)

    def _prepare(self) -> MailboxesRead | None:
        """Before any worker: what the folders share (topics, schema, stores). May return the
        mailboxes topic read already (read while this waited on other things). Default: refuse
        to write ``mail.events`` framed otherwise than it is (one encoding per topic)."""
        check_topic_encodings(self.cfg.kafka, [self.cfg.kafka.topics.events])
        return None

    def _ready(self) -> None:
        """After the owned workers started, before ``start`` returns; raising stops the source."""

    def _running(self, account: Any, folders: tuple[str, ...]) -> Any:
        """The account settings the workers of ``account``'s owned ``folders`` run with; a unit
        whose worker runs with other ones (a reload changed them) restarts."""
        return account

    def _starting(self, accounts: Sequence[Any]) -> None:
        """Before the workers of these accounts (as :meth:`_running` gave them) are built; some
        of their folders may run already (a retry after a failed start)."""

    def _ended(self, runs: Sequence[FolderRun[W]]) -> None:
        """Called after these runs stopped (joined or left behind): release what they shared."""

    def _closed(self) -> None:
        """The last step of ``stop``: close what the whole source shared."""

    # --- what the runtime hands a source -----------------------------------------------------

    def _folder_runtime(
        self, account: str, folder: str, stop: threading.Event
    ) -> FolderWorkerRuntime:
        """The keywords every worker of this source gets: its transactional id (inside
        kafka.namespace), a writer factory naming the ACL prefix a refusal needs, the shared
        cursor read."""
        kafka = self.cfg.kafka
        prefix = kafka.qualify(self.transactional_prefix)
        return FolderWorkerRuntime(
            metrics=self.metrics,
            stop=stop,
            writer_factory=functools.partial(
                TransactionalSourceWriter, kafka, acl_prefix=f"{prefix}-"
            ),
            read_offsets=self.offset_reads,
            transactional_id=SourceLocation(self.source_kind, account, folder).transactional_id(
                prefix
            ),
        )

    def _builder_args(self, account: str, folder: str) -> MailRecordBuilderArgs:
        """The keywords of one folder's record builder: the shared parser under the source's
        caps, writing large parts to the claim-check store; the MailEvent serde; the events and
        DLQ topics; the record cap."""
        kafka = self.cfg.kafka
        store = self._claim_check
        return MailRecordBuilderArgs(
            account=account,
            folder=folder,
            parser=functools.partial(parse_mail, limits=self.limits, claim_check=store),
            serde=AvroSerde.shared("MailEvent", kafka),
            events_topic=kafka.topics.events,
            dlq_topic=kafka.topics.dlq,
            max_record_bytes=self.settings.max_record_bytes,
            claim_check=store,
        )

    @property
    def workers(self) -> list[W]:
        """The workers of the folders this instance owns now."""
        return [run.worker for run in list(self._runs.values())]

    @property
    def health_port(self) -> int | None:
        """The port of /healthz and /metrics once started (``health.port: 0`` picks one)."""
        return self._health.port if self._health is not None else None

    @property
    def all_fenced(self) -> bool:
        """Every owned folder was fenced (as it was when run() ended, once it has)."""
        if self._fenced_at_end is not None:
            return self._fenced_at_end
        workers = self.workers
        return bool(workers) and all(w.fenced for w in workers)

    def _configured(self) -> Mapping[str, Sequence[str]]:
        return {a.name: a.folders for a in self.settings.accounts}

    # --- lifecycle ---------------------------------------------------------------------------

    def start(self) -> None:
        if self._serve_health:
            h = self.cfg.health
            self._health = HealthServer(self.metrics, h.host, h.port, h.max_sync_age_seconds)
            self._health.start()
        try:
            mailboxes = self._prepare()
            self._sharing = start_sharing(
                self.cfg.kafka,
                self.settings.group,
                self.source_kind,
                self._configured(),
                self.placement,
                self._apply,
                self.metrics,
                mailboxes=mailboxes,
            )
            if self.settings.group is None:
                log.info("%s source: %d mailbox folders started", self.source_kind, len(self._runs))
            self._ready()
        except BaseException:
            self.stop()
            raise
        self.started.set()

    def reconfigure(self, settings: St) -> None:
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
        """Run exactly the ``owned`` folders: stop and join the others first (the ownership's
        Assignment calls this, one call at a time). A folder whose account's settings changed
        (a config reload) restarts with them."""
        with self._applying:
            self._apply_locked(owned)

    def _apply_locked(self, owned: frozenset[WorkUnit]) -> None:
        # Every owned unit's account is configured: MailboxCatalog.wanted keeps only those, and
        # a reload swaps it and self._accounts together, under the Assignment's lock.
        folders: dict[str, list[str]] = {}
        for unit in sorted(owned):
            folders.setdefault(unit.account, []).append(unit.folder)
        running = {
            name: self._running(self._accounts[name], tuple(names))
            for name, names in folders.items()
        }
        leaving = [
            run
            for unit, run in self._runs.items()
            if unit not in owned or run.worker.account != running[unit.account]
        ]
        self._end(leaving)
        if self.stop_event.is_set():
            return  # stopping: what ran stays listed in ``workers`` (their counts, fenced flags)
        for run in leaving:
            del self._runs[run.unit]
        self._ended(leaving)
        starting = sorted(owned - set(self._runs))
        if not starting:
            return
        self._starting([running[name] for name in dict.fromkeys(u.account for u in starting)])
        for unit in starting:
            stop = threading.Event()
            worker = self._worker(running[unit.account], unit.folder, stop)
            thread = threading.Thread(
                target=worker.run,
                name=f"{self.source_kind}-{unit.account}-{unit.folder}",
                daemon=True,
            )
            self.metrics.watch(self.source_kind, unit.account, unit.folder)
            self._runs[unit] = FolderRun(unit, worker, thread, stop)
            thread.start()

    def _end(self, runs: Sequence[FolderRun[W]]) -> None:
        self._join(runs)
        for run in runs:
            if run.thread.is_alive():
                # Its next commit is fenced by the next owner's init_transactions.
                log.warning(
                    "%s %s: the worker did not stop within %.0fs",
                    self.source_kind,
                    run.unit,
                    self.stop_join_s,
                )
            self.metrics.unwatch(self.source_kind, run.unit.account, run.unit.folder)

    def _join(self, runs: Sequence[FolderRun[W]], timeout: float | None = None) -> None:
        """Stop and interrupt ``runs``, then wait for them: ``timeout`` for all together."""
        for run in runs:
            run.stop.set()
            run.worker.interrupt()
        deadline = time.monotonic() + (self.stop_join_s if timeout is None else timeout)
        for run in runs:
            run.thread.join(max(0.0, deadline - time.monotonic()))

    def stop(self, timeout: float | None = None) -> None:
        """Stop every worker and wait for them (``stop_join_s`` unless ``timeout``), leave the
        group, then close what the source shares. Safe to call again, and after a failed start."""
        self.stop_event.set()
        runs = list(self._runs.values())
        self._join(runs, timeout)
        if self._sharing is not None:
            self._sharing.close()  # stops and joins every owned folder, leaves the group
            self._sharing = None
        self._ended(runs)
        if self._health is not None:
            self._health.stop()
            self._health = None
        self._closed()

    def wait(self) -> None:
        """Block until stop() is called (from a signal handler), or, without a group, until
        every worker ended (fenced). Owning nothing is not having ended: every folder removed
        with ``mailtap mailboxes`` may come back; in a group owning nothing for a while is
        normal."""
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

    def run(self) -> None:
        """start(), wait(), then stop(); ``all_fenced`` tells afterwards why it ended."""
        self.start()
        try:
            self.wait()
        finally:
            self._fenced_at_end = self.all_fenced  # stop() keeps the workers, a later one may not
            self.stop()


def run_forever(
    source: FolderSourceRuntime[Any, Any],
    install_signals: Callable[[Callable[[], None]], None],
) -> None:
    """Let ``install_signals(stop)`` wire SIGTERM/SIGINT, then ``source.run()``."""
    install_signals(source.stop_event.set)
    source.run()
