"""Fetched Exchange items -> Kafka records: the MailEvent (through the shared parser) and DLQ reports.

The same rules as the IMAP source (DESIGN.md, bad input never stops a mailbox): a mail the parser
flags with ``parse_error`` is published as an event *and* reported on the DLQ topic with error
headers, in the same transaction; a mail the parser cannot handle at all (a bug) is reported on the
DLQ only. Either way the cursor moves on. The key is the shared parser's, so the same MIME gives the
same key whether it was read over IMAP or EWS.

DLQ record (wire sample)::

    key     ops/mid:abc@example.com             (or "<account>/<folder>/<item id>")
    value   the raw MIME when under the record cap, else empty (the raw is in the claim-check store)
    headers mailtap.error.kind=parse_error  mailtap.error.message=...  mailtap.source.kind=EWS
            mailtap.source.account=ops  mailtap.source.folder=inbox  mailtap.source.item_id=AAMk...
"""

from __future__ import annotations

import datetime as dt
import hashlib
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from connectors.core.contract import SourceRecord
from connectors.core.serde import AvroSerde
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
    ) -> None:
        self.account = account
        self.folder = folder
        self._parse = parser
        self._serde = serde
        self._events_topic = events_topic
        self._dlq_topic = dlq_topic
        self._max_record_bytes = max_record_bytes

    def build(self, item: FetchedItem) -> BuiltItem:
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
                flags=["\\Seen"] if item.is_read else [],
                internal_date=item.received,
                observed_at=dt.datetime.now(dt.UTC),
            )
            event: dict[str, Any] = dict(parsed.event)
            key = str(parsed.key)
            value = self._encode(event)
        except Exception as exc:  # a parser bug must not stop the mailbox
            log.exception(
                "ews %s/%s item %s: mail could not be turned into an event",
                self.account,
                self.folder,
                item.item_id,
            )
            fallback = f"{self.account}/{self.folder}/{item.item_id}"
            dlq = self._dlq(fallback, item, "unparseable", repr(exc), None)
            return BuiltItem(item.item_id, None, (dlq,), dlq=True)
        records = [SourceRecord(self._events_topic, key.encode(), value)]
        error = event.get("parse_error")
        if error:
            raw_ref = event.get("raw_ref") or {}
            records.append(self._dlq(key, item, "parse_error", str(error), raw_ref.get("uri")))
        return BuiltItem(item.item_id, key, tuple(records), dlq=bool(error))

    def _encode(self, event: dict[str, Any]) -> bytes:
        value = self._serde.encode(event, self._events_topic)
        if len(value) <= self._max_record_bytes:
            return value
        # The parser caps bodies; if the record is still too large, drop the inline bodies and
        # point at the claim-checked raw MIME (body_truncated tells consumers).
        slim = {**event, "text_body": None, "html_body": None, "body_truncated": True}
        slim["attachments"] = slim.get("attachments", [])[:100]
        value = self._serde.encode(slim, self._events_topic)
        if len(value) > self._max_record_bytes:
            raise ValueError(f"event of {len(value)} bytes exceeds the record cap")
        return value

    def _dlq(
        self, key: str, item: FetchedItem, kind: str, message: str, raw_uri: str | None
    ) -> SourceRecord:
        headers = [
            ("mailtap.error.kind", kind.encode()),
            ("mailtap.error.message", message[:2000].encode("utf-8", "replace")),
            ("mailtap.source.kind", b"EWS"),
            ("mailtap.source.account", self.account.encode()),
            ("mailtap.source.folder", self.folder.encode()),
            ("mailtap.source.item_id", item.item_id.encode()),
            ("mailtap.raw.sha256", hashlib.sha256(item.mime).hexdigest().encode()),
            ("mailtap.raw.size", str(len(item.mime)).encode()),
        ]
        if raw_uri:
            headers.append(("mailtap.raw.uri", raw_uri.encode()))
        value = item.mime if len(item.mime) <= self._max_record_bytes else b""
        return SourceRecord(self._dlq_topic, key.encode(), value, tuple(headers))
