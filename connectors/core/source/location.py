"""Where a source's records come from: one work unit of one source kind (Kafka Connect's
*source partition*), and the names every part of the source derives from it.

    >>> where = SourceLocation("imap", "support", "INBOX")
    >>> where.partition
    {'source': 'imap', 'account': 'support', 'folder': 'INBOX'}
    >>> where.partition_key
    b'{"account":"support","folder":"INBOX","source":"imap"}'
    >>> where.labels
    ('imap', 'support', 'INBOX')
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

from connectors.core.kafka.offsets import canonical_json
from connectors.core.kafka.transactions import transactional_id

__all__ = ["SourceLocation"]


@dataclass(frozen=True)
class SourceLocation:
    """One folder of one account of one source kind (``imap``, ``ews``, ``graph``)."""

    kind: str
    account: str
    folder: str

    @property
    def partition(self) -> dict[str, str]:
        """The key of this folder's cursor on the offsets topic (as canonical JSON)."""
        return {"source": self.kind, "account": self.account, "folder": self.folder}

    @functools.cached_property
    def partition_key(self) -> bytes:
        return canonical_json(self.partition)

    @property
    def labels(self) -> tuple[str, str, str]:
        """The metric labels ``(source, account, folder)``."""
        return (self.kind, self.account, self.folder)

    def transactional_id(self, prefix: str) -> str:
        """The transactional id of the one writer of this folder: a second instance with the
        same id fences the first (zombie fencing)."""
        return transactional_id(prefix, self.partition)

    def __str__(self) -> str:
        return f"{self.kind} {self.account}/{self.folder}"
