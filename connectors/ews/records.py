"""Fetched Exchange items -> Kafka records: the MailEvent (through the shared parser) and DLQ reports.

The rules and the record layout are the shared ones of :mod:`connectors.core.source.records` (bad input
never stops a mailbox); this module adds where the item lives (its item id). The key is the shared
parser's, so the same MIME gives the same key whether it was read over IMAP or EWS.

DLQ record (wire sample)::

    key     ops/mid:abc@example.com             (or "<account>/<folder>/<item id>")
    value   the raw MIME when under the record cap, else empty (the raw is in the claim-check store)
    headers mailtap.error.kind=parse_error  mailtap.error.message=...  mailtap.source.kind=EWS
            mailtap.source.account=ops  mailtap.source.folder=inbox  mailtap.source.item_id=AAMk...
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from connectors.core.claimcheck.store import ClaimCheckBatch
from connectors.core.kafka.transactions import SourceRecord
from connectors.core.source.records import MailRecordBuilder
from connectors.ews.connection import FetchedItem

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class BuiltItem:
    item_id: str
    key: str | None
    records: tuple[SourceRecord, ...]
    dlq: bool


def flags_of(item: FetchedItem) -> list[str]:
    """The event's ``flags`` as the IMAP source says them: ``\\Seen`` for a read item,
    ``\\Flagged`` for a follow-up flag (what Exchange's own IMAP server shows), then the item's
    categories, as they are named in Exchange (Outlook's coloured categories)."""
    system = [f for f, on in (("\\Seen", item.is_read), ("\\Flagged", item.flagged)) if on]
    return system + list(item.categories)


class EwsRecordBuilder(MailRecordBuilder):
    """Builds the records of one mailbox folder (account, folder)."""

    source_kind = "EWS"

    def build(
        self,
        item: FetchedItem,
        blobs: ClaimCheckBatch | None = None,
        change: str = "ADDED",
    ) -> BuiltItem:
        """The records of ``item`` as a ``change`` (ADDED / UPDATED). Raises ClaimCheckError
        when the store fails: that is not a bad mail, and the batch must be retried rather than
        published without its content."""
        key, records, dlq = self.item_records(
            item.mime,
            item_id=item.item_id,
            change_key=item.change_key,
            flags=flags_of(item),
            internal_date=item.received,
            blobs=blobs,
            change=change,
        )
        return BuiltItem(item.item_id, key, records, dlq=dlq)

    def key_of(self, item: FetchedItem) -> str | None:
        """The key ``item`` is published under, without storing anything (the tombstone check
        compares it with the key of a mail that left the folder)."""
        source = self.source_block(item_id=item.item_id, change_key=item.change_key)
        try:
            parsed = self.parse_raw(
                item.mime, source=source, flags=[], internal_date=item.received, claim_check=None
            )
            return parsed.key
        except Exception:
            log.exception("ews %s/%s item %s: no key", self.account, self.folder, item.item_id)
            return None
