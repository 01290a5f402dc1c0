"""Parsed mails -> Kafka records, shared by the sources: the event, its DLQ report, tombstones.

Event record: key the message identity, value the ``MailEvent``, header ``mailtap.conversation``
(its thread root, :mod:`connectors.core.mail.conversation`).

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

import datetime as dt
import hashlib
import logging
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from typing import Any, ClassVar, NotRequired, TypedDict, Unpack

from connectors.core.avro.serde import AvroSerde
from connectors.core.claimcheck.errors import ClaimCheckError
from connectors.core.claimcheck.store import ClaimCheckBatch, ClaimCheckStore, staged_batch
from connectors.core.errors import RegistryUnavailable
from connectors.core.kafka.transactions import SourceRecord
from connectors.core.mail import ParsedMail
from connectors.core.mail.conversation import CONVERSATION_HEADER, conversation_key
from connectors.core.mail.event import (
    ChangeKindSymbol,
    MailEvent,
    SourceCoordinates,
    SourceKindSymbol,
)

__all__ = ["ItemRecords", "MailEventRecords", "MailRecordBuilder", "Parser"]

log = logging.getLogger(__name__)

#: ``parse(raw, account=, source=, flags=, internal_date=, observed_at=)`` -> ParsedMail
#: (``connectors.core.mail.parse_mail`` with limits and the claim-check store bound by the caller).
Parser = Callable[..., ParsedMail]

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

    def encode(self, event: MailEvent) -> bytes:
        """The Avro value of ``event``, under the record cap; raises ValueError when it cannot be."""
        value = self._serde.encode(event, self.events_topic)
        if len(value) <= self._max_record_bytes:
            return value
        # The bodies are capped by the parser; if a record is still too large, drop the inline
        # bodies and point at the claim-checked raw MIME (body_truncated tells consumers).
        slim: MailEvent = {
            **event,
            "text_body": None,
            "html_body": None,
            "body_truncated": True,
            "attachments": event["attachments"][:SLIM_ATTACHMENTS],
        }
        value = self._serde.encode(slim, self.events_topic)
        if len(value) > self._max_record_bytes:
            raise ValueError(f"event of {len(value)} bytes exceeds the record cap")
        return value

    def event_records(
        self,
        key: str,
        event: MailEvent,
        value: bytes,
        raw: bytes,
        source_headers: Sequence[tuple[str, bytes]],
    ) -> list[SourceRecord]:
        """The event, plus its DLQ report when the parser flagged ``parse_error``.

        The event carries its conversation (``mailtap.conversation``), which the streams worker
        re-keys it by without decoding it (:mod:`connectors.core.mail.conversation`).
        """
        conversation = ((CONVERSATION_HEADER, conversation_key(event).encode()),)
        records = [SourceRecord(self.events_topic, key.encode(), value, conversation)]
        error = event["parse_error"]
        if error:
            raw_ref = event["raw_ref"]
            raw_uri = raw_ref["uri"] if raw_ref is not None else None
            records.append(self.dlq(key, raw, "parse_error", error, raw_uri, source_headers))
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


#: What :meth:`MailRecordBuilder.item_records` returns: the mail's key (None when it could not
#: be turned into an event), its records, and whether a DLQ report is among them.
ItemRecords = tuple[str | None, tuple[SourceRecord, ...], bool]


class MailRecordBuilderArgs(TypedDict):
    """The constructor keywords of :class:`MailRecordBuilder`, for a subclass that adds its own."""

    account: str
    folder: str
    parser: Parser
    serde: AvroSerde
    events_topic: str
    dlq_topic: str
    max_record_bytes: int
    claim_check: NotRequired[ClaimCheckStore | None]


class MailRecordBuilder:
    """What every source's record builder shares: one folder's records (:class:`MailEventRecords`),
    the claim-check batch of a transaction, the event's ``source`` block, and the parse call.

    A source subclasses it with its ``source_kind`` (``IMAP``, ``EWS``, ``GRAPH``) and adds where
    a mail lives in its mailbox (a UID, an item id) and its change kinds.
    """

    source_kind: ClassVar[SourceKindSymbol]

    def __init__(self, **args: Unpack[MailRecordBuilderArgs]) -> None:
        self.account = args["account"]
        self.folder = args["folder"]
        self._parse = args["parser"]
        #: The store the parser writes to; a batch writes through a ClaimCheckBatch instead.
        self._claim_check = args.get("claim_check")
        self._records = MailEventRecords(
            source_kind=self.source_kind,
            account=self.account,
            folder=self.folder,
            serde=args["serde"],
            events_topic=args["events_topic"],
            dlq_topic=args["dlq_topic"],
            max_record_bytes=args["max_record_bytes"],
        )

    @property
    def dlq_topic(self) -> str:
        return self._records.dlq_topic

    def staged_blobs(self) -> AbstractContextManager[ClaimCheckBatch | None]:
        """``with builder.staged_blobs() as blobs:`` a claim-check batch for one transaction's
        mails (small blobs share one pack file); the block commits it before the Kafka
        transaction that references it, and what it did not commit is discarded on the way
        out."""
        return staged_batch(self._claim_check)

    def source_block(
        self,
        *,
        folder: str | None = None,
        uidvalidity: int | None = None,
        uid: int | None = None,
        modseq: int | None = None,
        item_id: str | None = None,
        change_key: str | None = None,
    ) -> SourceCoordinates:
        """The event's ``source``: where the mail lives (``SourceCoordinates`` in schemas/MailEvent.avsc)."""
        return {
            "kind": self.source_kind,
            "folder": folder or self.folder,
            "uidvalidity": uidvalidity,
            "uid": uid,
            "modseq": modseq,
            "item_id": item_id,
            "change_key": change_key,
        }

    def parse_raw(
        self,
        raw: bytes,
        *,
        source: SourceCoordinates,
        flags: Sequence[str],
        internal_date: dt.datetime | None,
        blobs: ClaimCheckBatch | None = None,
        **extra: Any,
    ) -> ParsedMail:
        """The parser's result for ``raw``; with ``blobs`` its blobs go into that batch instead
        of the store the parser has bound. Raises what the parser raises."""
        stores: dict[str, Any] = {"claim_check": blobs} if blobs is not None else {}
        return self._parse(
            raw,
            account=self.account,
            source=source,
            flags=list(flags),
            internal_date=internal_date,
            observed_at=dt.datetime.now(dt.UTC),
            **stores,
            **extra,
        )

    def tombstone(self, key: str) -> SourceRecord:
        """The record that deletes ``key``: the mail is gone from every watched folder."""
        return self._records.tombstone(key)

    def item_records(
        self,
        mime: bytes,
        *,
        item_id: str,
        change_key: str | None,
        flags: Sequence[str],
        internal_date: dt.datetime | None,
        blobs: ClaimCheckBatch | None = None,
        change: str | Callable[[str], ChangeKindSymbol] = "ADDED",
    ) -> ItemRecords:
        """The records of the mail a server names by ``item_id`` (an EWS item id, a Graph
        immutable id) as a ``change`` (ADDED / UPDATED, or decided from the key by a callable:
        a mail new to this folder is UPDATED when another watched folder holds its key). Its
        DLQ reports carry ``mailtap.source.item_id``; one the parser cannot handle at all is a
        DLQ report keyed ``<account>/<folder>/<item id>``. Raises ClaimCheckError when the
        store fails: that is not a bad mail, and the batch must be retried rather than
        published without its content."""
        source = self.source_block(item_id=item_id, change_key=change_key)
        located = (("mailtap.source.item_id", item_id.encode()),)
        try:
            parsed = self.parse_raw(
                mime,
                source=source,
                flags=flags,
                internal_date=internal_date,
                blobs=blobs,
                change=change if isinstance(change, str) else "ADDED",
            )
            event: MailEvent = parsed.event.copy()
            key = parsed.key
            if not isinstance(change, str):
                event["change"] = change(key)
            value = self._records.encode(event)
        except ClaimCheckError:
            raise  # the store is down, not the mail bad: fail the batch and retry it
        except RegistryUnavailable:
            raise  # the registry is down, not the mail bad: likewise
        except Exception as exc:  # a parser bug must not stop the mailbox
            log.exception(
                "%s %s/%s item %s: mail could not be turned into an event",
                self.source_kind.lower(),
                self.account,
                self.folder,
                item_id,
            )
            fallback = f"{self.account}/{self.folder}/{item_id}"
            dlq = self._records.dlq(fallback, mime, "unparseable", repr(exc), None, located)
            return None, (dlq,), True
        records = self._records.event_records(key, event, value, mime, located)
        return key, tuple(records), bool(event["parse_error"])
