"""The Microsoft Graph source: one :class:`~connectors.graph.worker.GraphFolderWorker` thread per
owned (account, folder), on the shared runtime (:mod:`connectors.core.source.runtime`).

The folders of a mailbox share one :class:`~connectors.graph.mailbox.GraphMailbox` (its HTTP
client, its 4-request budget and ``Retry-After`` pause, which keys each folder holds), so the
work units are placed by account: with ``graph.group`` a mailbox's folders run on one instance.

Usage (``mailtap run graph-source -c CONFIG`` does this)::

    source = GraphSource.from_config(load_config(path))
    source.start()
    ...
    source.stop()

Every batch passes the checkpoints of :mod:`connectors.core.checkpoints` (``before_write``,
``in_transaction``), where the kill -9 tests crash the process, as for the other sources.
"""

from __future__ import annotations

import functools
import logging
import threading
from collections.abc import Sequence
from typing import Any

from connectors.core import checkpoints
from connectors.core.config import MailtapConfig
from connectors.core.metrics import SourceMetrics
from connectors.core.source.ownership.group import by_account
from connectors.core.source.ownership.wiring import MailboxesRead
from connectors.core.source.runtime import FolderRun, FolderSourceRuntime, ensure_own_topics
from connectors.graph.auth import TokenSource
from connectors.graph.client import GraphClient
from connectors.graph.config import SECTION, GraphAccountSettings, GraphSourceSettings
from connectors.graph.eventhubs import EventHubReader
from connectors.graph.gate import MailboxGate
from connectors.graph.inbox import NotificationInbox
from connectors.graph.mailbox import GraphMailbox
from connectors.graph.records import GraphRecordBuilder
from connectors.graph.webhook import WebhookListener
from connectors.graph.worker import SOURCE_KIND, GraphFolderWorker

log = logging.getLogger(__name__)

__all__ = ["TRANSACTIONAL_ID_PREFIX", "GraphSource"]

TRANSACTIONAL_ID_PREFIX = "mailtap-graph"


class GraphSource(FolderSourceRuntime[GraphSourceSettings, GraphFolderWorker]):
    source_kind = SOURCE_KIND
    placement = staticmethod(by_account)
    transactional_prefix = TRANSACTIONAL_ID_PREFIX

    def __init__(
        self,
        cfg: MailtapConfig,
        settings: GraphSourceSettings,
        *,
        metrics: SourceMetrics | None = None,
        serve_health: bool = True,
    ) -> None:
        super().__init__(cfg, settings, metrics=metrics, serve_health=serve_health)
        self._tokens = TokenSource(settings)
        self._mailboxes: dict[str, tuple[GraphAccountSettings, GraphMailbox]] = {}
        self._mailboxes_lock = threading.Lock()
        notes = settings.notifications
        self.webhook: WebhookListener | None = None
        self.event_hub: EventHubReader | None = None
        if notes.mode != "none":
            assert notes.client_state is not None
            inbox = NotificationInbox(
                notes.client_state.get_secret_value(), self._notified, self._notified_lifecycle
            )
            if notes.mode == "webhook":
                self.webhook = WebhookListener(notes, inbox)
            else:
                self.event_hub = EventHubReader(notes, inbox)

    def _prepare(self) -> MailboxesRead | None:
        # As IMAP and EWS: every Kafka permission of the source first (a missing ACL is one
        # sentence and the start fails), then its own topics, created when missing, and the
        # encoding of mail.events checked.
        ensure_own_topics(self.cfg.kafka, "graph", self.settings.group)
        return None

    def start(self) -> None:
        # Before the first subscription: Graph validates the endpoint at once.
        if self.webhook is not None:
            self.webhook.start()
        if self.event_hub is not None:
            self.event_hub.start()
        super().start()

    def _closed(self) -> None:
        if self.webhook is not None:
            self.webhook.stop()
        if self.event_hub is not None:
            self.event_hub.stop()

    def _notified(self, subscription_id: str) -> None:
        self._notified_lifecycle(subscription_id, None)

    def _notified_lifecycle(self, subscription_id: str, event: str | None) -> None:
        for worker in self.workers:
            if worker.subscription_id == subscription_id:
                worker.notified(event)
                return
        log.debug("graph: a notification for a subscription not run here, ignored")

    @classmethod
    def from_config(cls, cfg: MailtapConfig, **kwargs: Any) -> GraphSource:
        return cls(cfg, cfg.section(SECTION, GraphSourceSettings), **kwargs)

    def mailbox(self, account: GraphAccountSettings) -> GraphMailbox:
        """The shared state of ``account``'s mailbox (made on first use, and again when the
        account's settings changed: a reload restarts its workers first)."""
        with self._mailboxes_lock:
            known = self._mailboxes.get(account.name)
            if known is not None and known[0] == account:
                return known[1]
            if known is not None:
                known[1].close()
            settings = self.settings
            gate = MailboxGate(settings.max_concurrent_requests)
            box = GraphMailbox(
                account.name,
                lambda: GraphClient(settings, account.user, self._tokens, gate, self.stop_event),
            )
            self._mailboxes[account.name] = (account, box)
            return box

    def _worker(
        self, account: GraphAccountSettings, folder: str, stop: threading.Event
    ) -> GraphFolderWorker:
        mailbox = self.mailbox(account)
        mailbox.watch(folder)
        return GraphFolderWorker(
            account=account,
            folder=folder,
            settings=self.settings,
            builder=GraphRecordBuilder(**self._builder_args(account.name, folder)),
            mailbox=mailbox,
            before_commit=functools.partial(checkpoints.reached, "before_write"),
            **self._folder_runtime(account.name, folder, stop),
        )

    def _ended(self, runs: Sequence[FolderRun[GraphFolderWorker]]) -> None:
        running = {run.worker.account.name for run in self._runs.values()}
        with self._mailboxes_lock:
            for name in {run.worker.account.name for run in runs} - running:
                known = self._mailboxes.pop(name, None)
                if known is not None:
                    known[1].close()
