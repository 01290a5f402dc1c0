"""Graph messages -> Kafka records: the MailEvent (through the shared parser) and DLQ reports.

The rules and the record layout are the shared ones of :mod:`connectors.core.source.records`
(bad input never stops a mailbox); this module adds where the message lives (its immutable id
and changeKey). The key is the shared parser's, from the MIME (``$value``), so the same mail
gets the same key whether it was read over IMAP, EWS or Graph (connectors/core/mail/KEYS.md).

DLQ record (wire sample)::

    key     ops/mid:abc@example.com             (or "<account>/<folder>/<message id>")
    value   the raw MIME when under the record cap, else empty (the raw is in the claim-check store)
    headers mailtap.error.kind=parse_error  mailtap.error.message=...  mailtap.source.kind=GRAPH
            mailtap.source.account=ops  mailtap.source.folder=inbox  mailtap.source.item_id=AAkALg...
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass

from connectors.core.claimcheck.store import ClaimCheckBatch
from connectors.core.kafka.transactions import SourceRecord
from connectors.core.mail.event import ChangeKindSymbol
from connectors.core.source.records import MailRecordBuilder
from connectors.graph.delta import MessageState

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class BuiltMessage:
    message_id: str
    key: str | None
    records: tuple[SourceRecord, ...]
    dlq: bool


class GraphRecordBuilder(MailRecordBuilder):
    """Builds the records of one mailbox folder (account, folder)."""

    source_kind = "GRAPH"

    def build(
        self,
        message: MessageState,
        mime: bytes,
        blobs: ClaimCheckBatch | None = None,
        change: ChangeKindSymbol | Callable[[str], ChangeKindSymbol] = "ADDED",
    ) -> BuiltMessage:
        """The records of ``message`` as a ``change`` (ADDED / UPDATED, or decided from the key
        by a callable: a mail new to this folder is UPDATED when another watched folder holds
        its key). Raises ClaimCheckError when the store fails: the batch is retried rather than
        published without its content."""
        key, records, dlq = self.item_records(
            mime,
            item_id=message.message_id,
            change_key=message.change_key,
            flags=message.flags,
            internal_date=message.received,
            blobs=blobs,
            change=change,
        )
        return BuiltMessage(message.message_id, key, records, dlq=dlq)
