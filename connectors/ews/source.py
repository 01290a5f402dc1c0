"""The Exchange source: one :class:`~connectors.ews.worker.EwsFolderWorker` thread per owned
(account, folder), on the runtime every source shares (:mod:`connectors.core.source.runtime`),
sharing metrics, the health endpoint and the parser.

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
from typing import Any

from connectors.core import checkpoints
from connectors.core.config import MailtapConfig
from connectors.core.source.ownership.group import by_folder
from connectors.core.source.ownership.wiring import MailboxesRead
from connectors.core.source.runtime import FolderSourceRuntime, ensure_own_topics
from connectors.ews.config import SECTION, EwsAccountSettings, EwsSourceSettings
from connectors.ews.connection import EwsConnection
from connectors.ews.records import EwsRecordBuilder
from connectors.ews.worker import SOURCE_KIND, EwsFolderWorker

log = logging.getLogger(__name__)

__all__ = ["TRANSACTIONAL_ID_PREFIX", "EwsSource"]

TRANSACTIONAL_ID_PREFIX = "mailtap-ews"


class EwsSource(FolderSourceRuntime[EwsSourceSettings, EwsFolderWorker]):
    source_kind = SOURCE_KIND
    # Each folder has its own subscription and cursor: folders are placed one by one.
    placement = staticmethod(by_folder)
    transactional_prefix = TRANSACTIONAL_ID_PREFIX

    @classmethod
    def from_config(cls, cfg: MailtapConfig, **kwargs: Any) -> EwsSource:
        return cls(cfg, cfg.section(SECTION, EwsSourceSettings), **kwargs)

    def _prepare(self) -> MailboxesRead | None:
        # Its own topics only, created when missing; ensuring them also refuses a mail.events
        # framed otherwise than this configuration writes (one encoding per topic).
        ensure_own_topics(self.cfg.kafka, "ews", self.settings.group)
        return None

    def _worker(
        self, account: EwsAccountSettings, folder: str, stop: threading.Event
    ) -> EwsFolderWorker:
        return EwsFolderWorker(
            account=account,
            folder=folder,
            settings=self.settings,
            builder=EwsRecordBuilder(**self._builder_args(account.name, folder)),
            connection_factory=lambda: EwsConnection(account, self.settings, folder),
            before_commit=functools.partial(checkpoints.reached, "before_write"),
            **self._folder_runtime(account.name, folder, stop),
        )
