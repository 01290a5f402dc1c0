"""A source's runtime: one folder worker thread per owned work unit, the health endpoint, the
ownership wiring and the reload, written once for the sources that place units the same way.

A source subclasses :class:`FolderSourceRuntime` and implements :meth:`_worker` (build the
:class:`~connectors.core.source.worker.FolderWorker` of one folder); the runtime starts and
stops the workers as :mod:`connectors.core.source.ownership` assigns units (a consumer group
over a work topic, plus the runtime catalog ``mailtap.mailboxes``) and on a reload (SIGHUP,
:mod:`connectors.core.source.reload`)::

    source = GraphSource.from_config(load_config(path))
    source.start()          # the workers' threads, /healthz
    ...                     # until SIGTERM
    source.stop()

What ``stop()`` guarantees: every worker is told to stop and interrupted (:meth:`interrupt` of
the worker ends its wait for change), then joined for ``STOP_JOIN_S``; a worker still busy then
(a commit in flight) is left behind as a daemon thread: its batch is committed or not at all,
and the next owner's ``init_transactions`` fences it.
"""

from __future__ import annotations

import logging
import threading
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Generic, Protocol, TypeVar

from connectors.core.config import MailtapConfig
from connectors.core.kafka.encoding import check_topic_encodings
from connectors.core.kafka.offsets import OffsetStore, SharedReads
from connectors.core.metrics import HealthServer, SourceMetrics
from connectors.core.source.ownership.group import GroupSettings, Placement, WorkUnit
from connectors.core.source.ownership.wiring import Sharing, start_sharing

__all__ = ["STOP_JOIN_S", "FolderSourceRuntime"]

log = logging.getLogger(__name__)

#: How long stop() waits for a worker: an interrupted wait returns at once; a request or a
#: Kafka commit in flight finishes first (their own timeouts bound it).
STOP_JOIN_S = 10.0


class _Settings(Protocol):
    @property
    def accounts(self) -> Sequence[Any]: ...

    @property
    def group(self) -> GroupSettings | None: ...


class _Worker(Protocol):
    account: Any

    def run(self) -> None: ...

    def interrupt(self) -> None: ...


W = TypeVar("W", bound=_Worker)
St = TypeVar("St", bound=_Settings)


@dataclass
class FolderRun(Generic[W]):
    unit: WorkUnit
    worker: W
    thread: threading.Thread
    stop: threading.Event


class FolderSourceRuntime(ABC, Generic[St, W]):
    """Runs the folder workers of the units this instance owns."""

    #: The source kind of the work units and metric labels (``graph``).
    source_kind: str
    #: How units are placed on the group's members (by_account keeps a mailbox's folders
    #: together, e.g. to share a per-mailbox request budget).
    placement: Placement

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
        # Settled: a cursor committed behind another source's open transaction counts. Shared:
        # the folders that start together (start-up, a failover) read the topic once.
        self.offset_reads = SharedReads(lambda: OffsetStore(cfg.kafka).read_all(settled=True))
        #: Set once start() returned: the folders run and a reload may change them.
        self.started = threading.Event()
        #: Held while _apply stops and starts folders (wait() must not see them half-changed).
        self._applying = threading.Lock()

    @abstractmethod
    def _worker(self, account: Any, folder: str, stop: threading.Event) -> W:
        """The worker of one owned folder (not started)."""

    def _ended(self, runs: Sequence[FolderRun[W]]) -> None:
        """Called after these runs stopped (joined or left behind): release what they shared."""

    @property
    def workers(self) -> list[W]:
        """The workers of the folders this instance owns now."""
        return [run.worker for run in list(self._runs.values())]

    @property
    def health_port(self) -> int | None:
        """The port of /healthz and /metrics once started (``health.port: 0`` picks one)."""
        return self._health.port if self._health is not None else None

    def _configured(self) -> Mapping[str, Sequence[str]]:
        return {a.name: a.folders for a in self.settings.accounts}

    def start(self) -> None:
        # One encoding per topic: refuse to write mail.events framed otherwise than it is.
        check_topic_encodings(self.cfg.kafka, [self.cfg.kafka.topics.events])
        if self._serve_health:
            h = self.cfg.health
            self._health = HealthServer(self.metrics, h.host, h.port, h.max_sync_age_seconds)
            self._health.start()
        self._sharing = start_sharing(
            self.cfg.kafka,
            self.settings.group,
            self.source_kind,
            self._configured(),
            self.placement,
            self._apply,
            self.metrics,
        )
        self.started.set()

    def reconfigure(self, settings: St) -> None:
        """Run ``settings.accounts`` from now on (a config reload): folders of added accounts
        start, those of removed accounts stop, those of changed accounts restart."""
        sharing = self._sharing
        if sharing is None or self.stop_event.is_set():
            return

        def swap() -> None:
            self.settings = settings
            self._accounts = {a.name: a for a in settings.accounts}

        sharing.reconfigure({a.name: a.folders for a in settings.accounts}, swap)

    def _apply(self, owned: frozenset[WorkUnit]) -> None:
        """Run exactly the ``owned`` folders: stop and join the others first. A folder whose
        account's settings changed (a config reload) restarts with them."""
        with self._applying:
            leaving = [
                run
                for unit, run in self._runs.items()
                if unit not in owned or run.worker.account != self._accounts[unit.account]
            ]
            self._end(leaving)
            if self.stop_event.is_set():
                return  # stopping: what ran stays listed in ``workers``
            for run in leaving:
                del self._runs[run.unit]
            self._ended(leaving)
            for unit in sorted(owned - set(self._runs)):
                stop = threading.Event()
                worker = self._worker(self._accounts[unit.account], unit.folder, stop)
                thread = threading.Thread(
                    target=worker.run,
                    name=f"{self.source_kind}-{unit.account}-{unit.folder}",
                    daemon=True,
                )
                self.metrics.watch(self.source_kind, unit.account, unit.folder)
                self._runs[unit] = FolderRun(unit, worker, thread, stop)
                thread.start()

    def _end(self, runs: Sequence[FolderRun[W]], timeout: float = STOP_JOIN_S) -> None:
        for run in runs:
            run.stop.set()
            run.worker.interrupt()
        for run in runs:
            run.thread.join(timeout)
            if run.thread.is_alive():
                log.warning(
                    "%s %s: the worker did not stop within %.0fs",
                    self.source_kind,
                    run.unit,
                    timeout,
                )
            self.metrics.unwatch(self.source_kind, run.unit.account, run.unit.folder)

    def stop(self, timeout: float = STOP_JOIN_S) -> None:
        """Stop every worker and wait for them, then leave the group."""
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
        self._ended(runs)
        if self._health is not None:
            self._health.stop()

    def wait(self) -> None:
        """Block until stop() is called (from a signal handler), or, without a group, until
        every worker ended (fenced)."""
        while not self.stop_event.wait(1.0):
            if self.settings.group is not None:
                continue
            if not self._applying.acquire(blocking=False):
                continue
            try:
                runs = list(self._runs.values())
                if runs and not any(run.thread.is_alive() for run in runs):
                    return
            finally:
                self._applying.release()


def run_forever(
    source: FolderSourceRuntime[Any, Any],
    install_signals: Callable[[Callable[[], None]], None],
) -> None:
    """Start ``source``, let ``install_signals(stop)`` wire SIGTERM/SIGINT, block until stopped."""
    install_signals(source.stop_event.set)
    source.start()
    log.info("%s source running: %d mailbox folders", source.source_kind, len(source.workers))
    source.wait()
    source.stop()
