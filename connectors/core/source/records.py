"""Parsed mails -> Kafka records, shared by the sources: the event, its DLQ report, tombstones.

Bad input never stops a mailbox (DESIGN.md): a mail the parser flags with ``parse_error`` is
published as an event *and* reported on the DLQ topic with error headers, in the same
transaction; a mail the parser cannot handle at all (a bug) is reported on the DLQ only. Either
way the cursor moves on. Each source adds the headers that locate the mail in its mailbox.

DLQ record (wire sample)::

    key     alice/mid:abc@example.com            (or a source-specific fallback key)
    value   the raw MIME when under the record cap, else empty (the raw is in the claim-check store)
    headers mailtap.error.kind=parse_error  mailtap.error.message=...  mailtap.source.kind=IMAP
            mailtap.source.account=alice  mailtap.source.folder=INBOX  <the source's own headers>
            mailtap.raw.sha256=...  mailtap.raw.size=...  mailtap.raw.uri=file:///...  (when stored)
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import Any

from connectors.core.avro.serde import AvroSerde
from connectors.core.kafka.transactions import SourceRecord

__all__ = ["MailEventRecords"]

#: Characters of an error message kept in the DLQ header.
MAX_ERROR_MESSAGE = 2000
#: Attachment entries kept when an event is slimmed to fit the record cap.
SLIM_ATTACHMENTS = 100


class MailEventRecords:
    """The records of one mailbox folder (account, folder) of one source kind."""

    def __init__(
        self,
        *,
        source_kind: str,
        account: str,
        folder: str,
        serde: AvroSerde,
        events_topic: str,
        dlq_topic: str,
        max_record_bytes: int,
    ) -> None:
        self.source_kind = source_kind
        self.account = account
        self.folder = folder
        self._serde = serde
        self.events_topic = events_topic
        self.dlq_topic = dlq_topic
        self._max_record_bytes = max_record_bytes

    def encode(self, event: dict[str, Any]) -> bytes:
        """The Avro value of ``event``, under the record cap; raises ValueError when it cannot be."""
        value = self._serde.encode(event, self.events_topic)
        if len(value) <= self._max_record_bytes:
            return value
        # The bodies are capped by the parser; if a record is still too large, drop the inline
        # bodies and point at the claim-checked raw MIME (body_truncated tells consumers).
        slim = {**event, "text_body": None, "html_body": None, "body_truncated": True}
        slim["attachments"] = slim.get("attachments", [])[:SLIM_ATTACHMENTS]
        value = self._serde.encode(slim, self.events_topic)
        if len(value) > self._max_record_bytes:
            raise ValueError(f"event of {len(value)} bytes exceeds the record cap")
        return value

    def event_records(
        self,
        key: str,
        event: dict[str, Any],
        value: bytes,
        raw: bytes,
        source_headers: Sequence[tuple[str, bytes]],
    ) -> list[SourceRecord]:
        """The event, plus its DLQ report when the parser flagged ``parse_error``."""
        records = [SourceRecord(self.events_topic, key.encode(), value)]
        error = event.get("parse_error")
        if error:
            raw_ref = event.get("raw_ref") or {}
            records.append(
                self.dlq(key, raw, "parse_error", str(error), raw_ref.get("uri"), source_headers)
            )
        return records

    def dlq(
        self,
        key: str,
        raw: bytes,
        kind: str,
        message: str,
        raw_uri: str | None,
        source_headers: Sequence[tuple[str, bytes]],
    ) -> SourceRecord:
        headers = [
            ("mailtap.error.kind", kind.encode()),
            ("mailtap.error.message", message[:MAX_ERROR_MESSAGE].encode("utf-8", "replace")),
            ("mailtap.source.kind", self.source_kind.encode()),
            ("mailtap.source.account", self.account.encode()),
            ("mailtap.source.folder", self.folder.encode()),
            *source_headers,
            ("mailtap.raw.sha256", hashlib.sha256(raw).hexdigest().encode()),
            ("mailtap.raw.size", str(len(raw)).encode()),
        ]
        if raw_uri:
            headers.append(("mailtap.raw.uri", raw_uri.encode()))
        value = raw if len(raw) <= self._max_record_bytes else b""
        return SourceRecord(self.dlq_topic, key.encode(), value, tuple(headers))

    def tombstone(self, key: str) -> SourceRecord:
        return SourceRecord(self.events_topic, key.encode(), None)
