"""Fetched mails -> Kafka records: the MailEvent (through the shared parser), DLQ reports, tombstones.

The rules and the record layout are the shared ones of :mod:`connectors.core.source.records` (bad input
never stops a mailbox: a flagged mail is published *and* reported on the DLQ, a parser bug is
reported on the DLQ only); this module adds where the mail lives (uidvalidity, uid) and the
IMAP specifics: session flags, a moved mail's folder, ADDED/UPDATED/RESCANNED.

DLQ record (wire sample)::

    key     alice/mid:abc@example.com            (or "<account>/<folder>/<uidvalidity>/<uid>")
    headers ... mailtap.source.kind=IMAP  mailtap.source.account=alice  mailtap.source.folder=INBOX
            mailtap.source.uidvalidity=17  mailtap.source.uid=42  mailtap.raw.sha256=...
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal, Unpack

from connectors.core.claimcheck.errors import ClaimCheckError
from connectors.core.claimcheck.store import ClaimCheckBatch
from connectors.core.errors import RegistryUnavailable
from connectors.core.kafka.transactions import SourceRecord
from connectors.core.mail import ParsedMail
from connectors.core.mail.event import MailEvent
from connectors.core.source.records import MailRecordBuilder, MailRecordBuilderArgs
from connectors.imap.connection import FetchedMail
from connectors.imap.indexlog import ChangelogPartition

log = logging.getLogger(__name__)

ChangeKind = Literal["ADDED", "UPDATED", "RESCANNED"]

#: ``place(parsed key, content fingerprint) -> (key, change)``: the key the account publishes
#: the mail under (the parsed one, or a distinct one when another mail of the account has its
#: Message-ID: connectors/core/mail/KEYS.md) and its ChangeKind.
Placement = Callable[[str, "str | None"], tuple[str, ChangeKind]]


def fixed(change: ChangeKind) -> Placement:
    """A placement that keeps the parsed key and says ``change``."""
    return lambda key, _fingerprint: (key, change)


#: Flags that describe the session, not the mail (RFC 3501 2.3.2: \Recent is per session).
SESSION_FLAGS = frozenset({"\\Recent"})


@dataclass(frozen=True)
class BuiltMail:
    """The records for one mail, and what the account index needs to know about it."""

    uid: int
    key: str | None
    message_id: str | None
    records: tuple[SourceRecord, ...]
    dlq: bool
    #: The content fingerprint (KEYS.md), which places the mail in the account index.
    fingerprint: str | None = None


@dataclass(frozen=True)
class ParsedBatch:
    """A batch built elsewhere (a parse process): its mails, and the claim-check files it
    wrote but did not fsync, which must be made durable before the batch commits."""

    mails: list[BuiltMail]
    unsynced: tuple[str, ...] = ()

    def __reduce__(self) -> tuple[Callable[..., ParsedBatch], tuple[object, ...]]:
        # A batch crosses the pipe from a parse process as rows of plain values. Pickled
        # object by object (each dataclass's reduce call and attribute dict), it cost the
        # parse process 4.2 µs and the source 5.4 µs per bench mail; as rows 2.3 and 3.2
        # (tests/unit/imap/test_parsed_batch.py checks the copy is equal).
        rows = [
            (
                mail.uid,
                mail.key,
                mail.message_id,
                [(r.topic, r.key, r.value, r.headers, r.partition) for r in mail.records],
                mail.dlq,
                mail.fingerprint,
            )
            for mail in self.mails
        ]
        return _parsed_batch, (rows, self.unsynced)


def _parsed_batch(rows: list[tuple[Any, ...]], unsynced: tuple[str, ...]) -> ParsedBatch:
    """The batch :meth:`ParsedBatch.__reduce__` flattened. Its objects are made the way
    pickle makes a dataclass (``__new__``, then the attribute dict), without running the
    frozen ``__init__``: constructing them cost more than the whole unpickling saves."""
    new = object.__new__
    mails: list[BuiltMail] = []
    for uid, key, message_id, record_rows, dlq, fingerprint in rows:
        records = []
        for topic, record_key, value, headers, partition in record_rows:
            record = new(SourceRecord)
            record.__dict__.update(
                topic=topic, key=record_key, value=value, headers=headers, partition=partition
            )
            records.append(record)
        mail = new(BuiltMail)
        mail.__dict__.update(
            uid=uid,
            key=key,
            message_id=message_id,
            records=tuple(records),
            dlq=dlq,
            fingerprint=fingerprint,
        )
        mails.append(mail)
    return ParsedBatch(mails, unsynced)


class RecordBuilder(MailRecordBuilder):
    """Builds the records of one mailbox (account, folder)."""

    source_kind = "IMAP"

    def __init__(
        self,
        *,
        index_changelog: ChangelogPartition | None = None,
        **args: Unpack[MailRecordBuilderArgs],
    ) -> None:
        super().__init__(**args)
        #: Each event goes with its key index record, in the same transaction (indexlog.py);
        #: None: no changelog (builders of unit tests).
        self._changelog = index_changelog

    def build(
        self,
        mail: FetchedMail,
        uidvalidity: int,
        change_for: Placement,
        folder: str | None = None,
        location: tuple[int, int] | None = None,
    ) -> BuiltMail:
        """Records for ``mail``; ``change_for(key, fingerprint)`` decides its key and
        ADDED/UPDATED/RESCANNED.

        ``folder`` overrides the folder in the event (a mail we moved: it lives there now), and
        ``location`` is its (uidvalidity, uid) there when the server said (COPYUID).
        """
        parsed = self.parse(mail, uidvalidity, folder, location=location)
        return self.finish(mail, uidvalidity, parsed, change_for)

    def build_all(
        self,
        mails: Sequence[FetchedMail],
        uidvalidity: int,
        change_for: Callable[[FetchedMail, str, str | None], tuple[str, ChangeKind]],
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
        location: tuple[int, int] | None = None,
    ) -> ParsedMail | Exception:
        """The parser's result, or the exception a parser bug raised (never for bad input)."""
        flags = [f for f in mail.flags if f not in SESSION_FLAGS]
        moved = folder is not None and folder != self.folder
        # After our own move the mail's UID in the target folder is known only from COPYUID.
        there = location if moved else (uidvalidity, mail.uid)
        source = self.source_block(
            folder=folder,
            uidvalidity=there[0] if there else None,
            uid=there[1] if there else None,
            modseq=None if moved else mail.modseq,
        )
        try:
            return self.parse_raw(
                mail.raw,
                source=source,
                flags=flags,
                internal_date=mail.internal_date,
                blobs=blobs,
            )
        except ClaimCheckError:
            raise  # the store is down, not the mail bad: fail the batch and retry it
        except Exception as exc:  # a parser bug must not stop the mailbox
            return exc

    def finish(
        self,
        mail: FetchedMail,
        uidvalidity: int,
        parsed: ParsedMail | Exception,
        change_for: Placement,
    ) -> BuiltMail:
        located = (
            ("mailtap.source.uidvalidity", str(uidvalidity).encode()),
            ("mailtap.source.uid", str(mail.uid).encode()),
        )
        try:
            if isinstance(parsed, Exception):
                raise parsed
            event: MailEvent = parsed.event.copy()
            fingerprint = event["content_fingerprint"]
            key, event["change"] = change_for(parsed.key, fingerprint)
            event["key"] = key
            value = self._records.encode(event)
        except RegistryUnavailable:
            raise  # the registry is down, not the mail bad: fail the batch and retry it
        except Exception as exc:
            log.error(
                "imap %s/%s uid %d: mail could not be turned into an event: %r",
                self.account,
                self.folder,
                mail.uid,
                exc,
            )
            fallback_key = f"{self.account}/{self.folder}/{uidvalidity}/{mail.uid}"
            dlq = self._records.dlq(fallback_key, mail.raw, "unparseable", repr(exc), None, located)
            return BuiltMail(mail.uid, None, None, (dlq,), dlq=True)
        records = self._records.event_records(key, event, value, mail.raw, located)
        if self._changelog is not None:
            source = event["source"]
            records.append(
                self._changelog.location(
                    key, source["folder"], source["uidvalidity"], source["uid"], fingerprint
                )
            )
        error = bool(event["parse_error"])
        return BuiltMail(
            mail.uid,
            key,
            event["message_id"],
            tuple(records),
            dlq=error,
            fingerprint=fingerprint,
        )

    def tombstones(self, key: str) -> list[SourceRecord]:
        """The event's tombstone, with the tombstone of its key index record in this folder
        (the mail left it last; each other folder's record was tombstoned when it left that
        one: `departure`)."""
        return [self.tombstone(key), *self.departure(key)]

    def departure(self, key: str) -> list[SourceRecord]:
        """The key index record saying ``key`` left this folder (no event: the mail is still
        in another folder, whose worker published it there)."""
        if self._changelog is None:
            return []
        return [self._changelog.tombstone(key, self.folder)]
