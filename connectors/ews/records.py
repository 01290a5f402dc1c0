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

import datetime as dt
import logging
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any

from connectors.core.avro.serde import AvroSerde
from connectors.core.claimcheck.store import (
    ClaimCheckBatch,
    ClaimCheckError,
    ClaimCheckStore,
    staged_batch,
)
from connectors.core.kafka.transactions import SourceRecord
from connectors.core.source.records import MailEventRecords
from connectors.ews.connection import FetchedItem

log = logging.getLogger(__name__)

#: ``parse(raw, account=, source=, flags=, internal_date=, observed_at=)`` -> an object with
#: ``.key``, ``.event`` and ``.parse_error`` (``connectors.core.mail.parse_mail`` with limits and
#: the claim-check store bound by the caller).
Parser = Callable[..., Any]


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


class EwsRecordBuilder:
    """Builds the records of one mailbox folder (account, folder)."""

    def __init__(
        self,
        *,
        account: str,
        folder: str,
        parser: Parser,
        serde: AvroSerde,
        events_topic: str,
        dlq_topic: str,
        max_record_bytes: int,
        claim_check: ClaimCheckStore | None = None,
    ) -> None:
        self.account = account
        self.folder = folder
        self._parse = parser
        #: The store the parser writes to; a batch writes through a ClaimCheckBatch instead.
        self._claim_check = claim_check
        self._records = MailEventRecords(
            source_kind="EWS",
            account=account,
            folder=folder,
            serde=serde,
            events_topic=events_topic,
            dlq_topic=dlq_topic,
            max_record_bytes=max_record_bytes,
        )

    def staged_blobs(self) -> AbstractContextManager[ClaimCheckBatch | None]:
        """``with builder.staged_blobs() as blobs:`` a claim-check batch for :meth:`build` (small
        blobs share one pack file); the block commits it before the Kafka transaction that
        references it, and what it did not commit is discarded on the way out."""
        return staged_batch(self._claim_check)

    def build(
        self,
        item: FetchedItem,
        blobs: ClaimCheckBatch | None = None,
        change: str = "ADDED",
    ) -> BuiltItem:
        """The records of ``item`` as a ``change`` (ADDED / UPDATED). Raises ClaimCheckError
        when the store fails: that is not a bad mail, and the batch must be retried rather than
        published without its content."""
        source = {
            "kind": "EWS",
            "folder": self.folder,
            "uidvalidity": None,
            "uid": None,
            "modseq": None,
            "item_id": item.item_id,
            "change_key": item.change_key,
        }
        located = (("mailtap.source.item_id", item.item_id.encode()),)
        # The parser has the store bound; a batch replaces it for this call.
        stores = {"claim_check": blobs} if blobs is not None else {}
        try:
            parsed = self._parse(
                item.mime,
                account=self.account,
                source=source,
                flags=flags_of(item),
                internal_date=item.received,
                observed_at=dt.datetime.now(dt.UTC),
                change=change,
                **stores,
            )
            event: dict[str, Any] = dict(parsed.event)
            key = str(parsed.key)
            value = self._records.encode(event)
        except ClaimCheckError:
            raise  # the store is down, not the mail bad: fail the batch and retry it
        except Exception as exc:  # a parser bug must not stop the mailbox
            log.exception(
                "ews %s/%s item %s: mail could not be turned into an event",
                self.account,
                self.folder,
                item.item_id,
            )
            fallback = f"{self.account}/{self.folder}/{item.item_id}"
            dlq = self._records.dlq(fallback, item.mime, "unparseable", repr(exc), None, located)
            return BuiltItem(item.item_id, None, (dlq,), dlq=True)
        records = self._records.event_records(key, event, value, item.mime, located)
        return BuiltItem(item.item_id, key, tuple(records), dlq=bool(event.get("parse_error")))

    def key_of(self, item: FetchedItem) -> str | None:
        """The key ``item`` is published under, without storing anything (the tombstone check
        compares it with the key of a mail that left the folder)."""
        source = {
            "kind": "EWS",
            "folder": self.folder,
            "uidvalidity": None,
            "uid": None,
            "modseq": None,
            "item_id": item.item_id,
            "change_key": item.change_key,
        }
        try:
            parsed = self._parse(
                item.mime,
                account=self.account,
                source=source,
                flags=[],
                internal_date=item.received,
                observed_at=dt.datetime.now(dt.UTC),
                claim_check=None,
            )
            return str(parsed.key)
        except Exception:
            log.exception("ews %s/%s item %s: no key", self.account, self.folder, item.item_id)
            return None

    def tombstone(self, key: str) -> SourceRecord:
        """The record that deletes ``key``: the mail is gone from every watched folder."""
        return self._records.tombstone(key)
