"""Fetched mails -> Kafka records: the MailEvent (through the shared parser), DLQ reports, tombstones.

Bad input never stops a mailbox (DESIGN.md): a mail the parser flags with ``parse_error`` is
published as an event *and* reported on the DLQ topic with error headers, in the same transaction;
a mail the parser cannot handle at all (a bug) is reported on the DLQ only. Either way the cursor
moves on.

DLQ record (wire sample)::

    key     alice/mid:abc@example.com            (or "<account>/<folder>/<uidvalidity>/<uid>")
    value   the raw MIME when under the record cap, else empty (the raw is in the claim-check store)
    headers mailtap.error.kind=parse_error  mailtap.error.message=...  mailtap.source.account=alice
            mailtap.source.folder=INBOX  mailtap.source.uidvalidity=17  mailtap.source.uid=42
            mailtap.raw.uri=file:///...  (when stored)
"""

from __future__ import annotations

import datetime as dt
import functools
import hashlib
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from connectors.core.claimcheck import (
    ClaimCheckBatch,
    ClaimCheckError,
    ClaimCheckStore,
    begin_batch,
)
from connectors.core.contract import SourceRecord
from connectors.core.serde import AvroSerde
from connectors.imap.connection import FetchedMail

log = logging.getLogger(__name__)

ChangeKind = Literal["ADDED", "UPDATED", "RESCANNED"]

#: Flags that describe the session, not the mail (RFC 3501 2.3.2: \Recent is per session).
SESSION_FLAGS = frozenset({"\\Recent"})

#: ``parse(raw, account=, source=, flags=, internal_date=, observed_at=)`` -> ParsedMail-like
#: object with ``.key``, ``.event`` and ``.parse_error`` (connectors.core.mail.parse_mail, with
#: limits and the claim-check store bound by the caller).
Parser = Callable[..., Any]


@dataclass(frozen=True)
class BuiltMail:
    """The records for one mail, and what the account index needs to know about it."""

    uid: int
    key: str | None
    message_id: str | None
    records: tuple[SourceRecord, ...]
    dlq: bool


class RecordBuilder:
    """Builds the records of one mailbox (account, folder)."""

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
        self._serde = serde
        self._events_topic = events_topic
        self._dlq_topic = dlq_topic
        self._max_record_bytes = max_record_bytes
        #: The store the parser writes to; a batch writes through a ClaimCheckBatch instead.
        self._claim_check = claim_check

    @property
    def dlq_topic(self) -> str:
        return self._dlq_topic

    def build(
        self,
        mail: FetchedMail,
        uidvalidity: int,
        change_for: Callable[[str], ChangeKind],
        folder: str | None = None,
    ) -> BuiltMail:
        """Records for ``mail``; ``change_for(key)`` decides ADDED/UPDATED/RESCANNED.

        ``folder`` overrides the folder in the event (a mail we moved: it lives there now).
        """
        return self.finish(mail, uidvalidity, self.parse(mail, uidvalidity, folder), change_for)

    def begin_blobs(self) -> ClaimCheckBatch | None:
        """A claim-check batch for :meth:`build_all`; the caller commits it before the Kafka
        transaction that references it (``before_commit``) and discards it otherwise."""
        return begin_batch(self._claim_check) if self._claim_check is not None else None

    def build_all(
        self,
        mails: Sequence[FetchedMail],
        uidvalidity: int,
        change_for: Callable[[FetchedMail, str], ChangeKind],
        blobs: ClaimCheckBatch | None = None,
    ) -> list[BuiltMail]:
        """``build`` for a batch, in UID order. With ``blobs``, the parser writes the batch's
        blobs through it: written now, durable once ``blobs.commit()`` returned."""
        parsed = [self.parse(m, uidvalidity, blobs=blobs) for m in mails]
        return [
            self.finish(m, uidvalidity, p, functools.partial(change_for, m))
            for m, p in zip(mails, parsed, strict=True)
        ]

    def parse(
        self,
        mail: FetchedMail,
        uidvalidity: int,
        folder: str | None = None,
        blobs: ClaimCheckBatch | None = None,
    ) -> Any:
        """The parser's result, or the exception a parser bug raised (never for bad input)."""
        flags = [f for f in mail.flags if f not in SESSION_FLAGS]
        moved = folder is not None and folder != self.folder
        source = {
            "kind": "IMAP",
            "folder": folder or self.folder,
            # After our own move the UID in the target folder is unknown (no COPYUID parsing).
            "uidvalidity": None if moved else uidvalidity,
            "uid": None if moved else mail.uid,
            "modseq": None if moved else mail.modseq,
            "item_id": None,
            "change_key": None,
        }
        # The parser has the store bound; a batch replaces it for this call.
        stores = {"claim_check": blobs} if blobs is not None else {}
        try:
            return self._parse(
                mail.raw,
                account=self.account,
                source=source,
                flags=flags,
                internal_date=mail.internal_date,
                observed_at=dt.datetime.now(dt.UTC),
                **stores,
            )
        except ClaimCheckError:
            raise  # the store is down, not the mail bad: fail the batch and retry it
        except Exception as exc:  # a parser bug must not stop the mailbox
            return exc

    def finish(
        self,
        mail: FetchedMail,
        uidvalidity: int,
        parsed: Any,
        change_for: Callable[[str], ChangeKind],
    ) -> BuiltMail:
        try:
            if isinstance(parsed, Exception):
                raise parsed
            event: dict[str, Any] = dict(parsed.event)
            key = str(parsed.key)
            event["change"] = change_for(key)
            value = self._encode(event)
        except Exception as exc:
            log.error(
                "imap %s/%s uid %d: mail could not be turned into an event: %r",
                self.account,
                self.folder,
                mail.uid,
                exc,
            )
            fallback_key = f"{self.account}/{self.folder}/{uidvalidity}/{mail.uid}"
            dlq = self._dlq(fallback_key, mail, uidvalidity, "unparseable", repr(exc), None)
            return BuiltMail(mail.uid, None, None, (dlq,), dlq=True)
        records = [SourceRecord(self._events_topic, key.encode(), value)]
        error = event.get("parse_error")
        if error:
            raw_ref = event.get("raw_ref") or {}
            records.append(
                self._dlq(key, mail, uidvalidity, "parse_error", str(error), raw_ref.get("uri"))
            )
        return BuiltMail(mail.uid, key, event.get("message_id"), tuple(records), dlq=bool(error))

    def _encode(self, event: dict[str, Any]) -> bytes:
        value = self._serde.encode(event, self._events_topic)
        if len(value) <= self._max_record_bytes:
            return value
        # The bodies are capped by the parser; if a record is still too large, drop the inline
        # bodies and point at the claim-checked raw MIME (body_truncated tells consumers).
        slim = {**event, "text_body": None, "html_body": None, "body_truncated": True}
        slim["attachments"] = slim.get("attachments", [])[:100]
        value = self._serde.encode(slim, self._events_topic)
        if len(value) > self._max_record_bytes:
            raise ValueError(f"event of {len(value)} bytes exceeds the record cap")
        return value

    def tombstone(self, key: str) -> SourceRecord:
        return SourceRecord(self._events_topic, key.encode(), None)

    def _dlq(
        self,
        key: str,
        mail: FetchedMail,
        uidvalidity: int,
        kind: str,
        message: str,
        raw_uri: str | None,
    ) -> SourceRecord:
        headers = [
            ("mailtap.error.kind", kind.encode()),
            ("mailtap.error.message", message[:2000].encode("utf-8", "replace")),
            ("mailtap.source.kind", b"IMAP"),
            ("mailtap.source.account", self.account.encode()),
            ("mailtap.source.folder", self.folder.encode()),
            ("mailtap.source.uidvalidity", str(uidvalidity).encode()),
            ("mailtap.source.uid", str(mail.uid).encode()),
            ("mailtap.raw.sha256", hashlib.sha256(mail.raw).hexdigest().encode()),
            ("mailtap.raw.size", str(len(mail.raw)).encode()),
        ]
        if raw_uri:
            headers.append(("mailtap.raw.uri", raw_uri.encode()))
        value = mail.raw if len(mail.raw) <= self._max_record_bytes else b""
        return SourceRecord(self._dlq_topic, key.encode(), value, tuple(headers))
