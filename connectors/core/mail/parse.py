"""Raw MIME -> ``MailEvent`` (schemas/MailEvent.avsc), shared by the IMAP and EWS sources.

Pure apart from the optional claim-check store: bytes in, :class:`ParsedMail` out. Bad input
never raises; what could not be parsed is named in ``parse_error`` and the event carries
whatever was readable (at least key, size and raw_ref). The steps:

1. the raw MIME goes to the claim-check store (``raw_ref``), untouched;
2. :func:`~connectors.core.mail.limits.prescan` caps header blocks, parameter lists, MIME
   depth and part count, producing a patched copy that is safe to parse;
3. top-level fields are read from that copy by our own byte-level header parser: identity
   (:mod:`~connectors.core.mail.identity`), addresses, subject (RFC 2047, any charset), date,
   the headers the stream guards need;
4. bodies and attachments come from :func:`~connectors.core.mail.content.extract_content`;
5. a pathological event is brought under ``max_event_bytes``
   (:func:`~connectors.core.mail.budget.fit_event_budget`).

Errors of the claim-check store itself (disk full, permissions) are *not* bad input: they
raise :class:`~connectors.core.claimcheck.errors.ClaimCheckError` so the caller retries instead of
publishing an event whose content was lost.

>>> from datetime import datetime, timezone
>>> raw = (b"Message-ID: <1@Example.COM>\\r\\nFrom: Ann <ann@example.com>\\r\\n"
...        b"Subject: =?gbk?b?u+HS6c2o1qo=?=\\r\\n\\r\\nhello\\r\\n")
>>> mail = parse_mail(raw, account="ops", source={"kind": "IMAP", "folder": "INBOX", "uid": 7},
...                   flags=["\\\\Seen"], internal_date=None,
...                   observed_at=datetime(2025, 1, 1, tzinfo=timezone.utc))
>>> mail.key, mail.event["subject"], mail.event["text_body"], mail.parse_error
('ops/mid:1@example.com', '会议通知', 'hello\\r\\n', None)
"""

from __future__ import annotations

import logging
import re
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta, timezone
from email.utils import parsedate_to_datetime
from typing import Any, Literal, overload

from connectors.core.claimcheck.errors import ClaimCheckError
from connectors.core.claimcheck.store import BlobRef, ClaimCheckStore
from connectors.core.mail.addresses import parse_addresses
from connectors.core.mail.budget import fit_event_budget
from connectors.core.mail.charsets import clean_text, decode_text
from connectors.core.mail.content import extract_content
from connectors.core.mail.encodedwords import decode_words
from connectors.core.mail.event import BlobRef as BlobRefRecord
from connectors.core.mail.event import (
    GuardHeaderName,
    KeyKindSymbol,
    MailEvent,
    SourceCoordinates,
)
from connectors.core.mail.headers import read_head
from connectors.core.mail.identity import (
    KeyKind,
    content_fingerprint,
    message_key_of_normalized,
    normalize_message_id,
)
from connectors.core.mail.limits import ParseLimits, apply_patches, prescan

__all__ = ["SCHEMA_VERSION", "ChangeKind", "ParsedMail", "parse_mail"]

logger = logging.getLogger(__name__)

SCHEMA_VERSION = 1
ChangeKind = Literal["ADDED", "UPDATED", "RESCANNED"]

_ANGLE_ID = re.compile(rb"<([^<>]*)>")
_BARE_CR = re.compile(rb"\r(?!\n)")
_MAX_PARSE_ERROR = 1_000
_DEFAULT_LIMITS = ParseLimits()
# Enum look-ups cost more than dict ones; done per mail.
_FINGERPRINT: KeyKindSymbol = "FINGERPRINT"
#: The Avro symbol of each key kind (``KeyKind.value``, typed as the schema's enum).
_KEY_KIND_SYMBOLS: dict[KeyKind, KeyKindSymbol] = {
    KeyKind.MESSAGE_ID: "MESSAGE_ID",
    KeyKind.FINGERPRINT: "FINGERPRINT",
}
_KEY_KINDS = {kind.value: kind for kind in KeyKind}  # frozen; building one per mail cost ~1 µs


@dataclass(frozen=True, slots=True)
class ParsedMail:
    """One parsed mail: the record key, the ``MailEvent`` value, what went to the store."""

    key: str
    key_kind: KeyKind
    #: The ``io.mailtap.v1.MailEvent`` value (a plain dict; timestamps as aware datetimes).
    event: MailEvent
    #: Blobs put into the claim-check store: the raw MIME first, then attachments.
    blobs: tuple[BlobRef, ...]
    parse_error: str | None


def parse_mail(
    raw: bytes,
    *,
    account: str,
    source: Mapping[str, Any],
    flags: list[str],
    internal_date: datetime | None,
    observed_at: datetime,
    limits: ParseLimits | None = None,
    claim_check: ClaimCheckStore | None = None,
    change: ChangeKind = "ADDED",
) -> ParsedMail:
    """Normalize one raw mail. Never raises for bad input (see the module docstring).

    ``source`` holds ``kind`` ("IMAP"/"EWS"), ``folder`` and optionally ``uidvalidity``,
    ``uid``, ``modseq``, ``item_id``, ``change_key``. Naive datetimes are taken as UTC.
    """
    limits = limits or _DEFAULT_LIMITS
    blobs: list[BlobRef] = []
    raw_ref: BlobRef | None = None
    if claim_check is not None:
        raw_ref = claim_check.put(raw, kind="raw")
        blobs.append(raw_ref)
    # One look for bare CRs (one regex pass: two bytes.count() cost 3x more) serves the
    # fingerprint and the copy that is parsed.
    bare_cr = _BARE_CR.search(raw) is not None
    event = _empty_event(
        account, source, flags, internal_date, observed_at, change, raw, raw_ref, bare_cr
    )
    problems: list[str] = []
    try:
        parseable = _without_bare_cr(raw, bare_cr)
        scan = prescan(parseable, limits)
        problems.extend(scan.problems)
        patched = apply_patches(parseable, scan.patches)
        head = read_head(patched)
        _fill_from_headers(event, head.by_name, account, raw)
    except ClaimCheckError:
        raise
    except Exception as exc:  # bad input must never stop a mailbox
        logger.warning("mail headers unparseable", extra={"account": account, "error": repr(exc)})
        event["key"] = f"{account}/fp:{event['content_fingerprint']}"
        event["key_kind"] = _FINGERPRINT
        event["parse_error"] = _limit_text(f"headers not parsed: {type(exc).__name__}: {exc}")
        return _finish(event, blobs)
    if not scan.skip_mime:
        try:
            content = extract_content(patched, limits, claim_check, head)
        except ClaimCheckError:
            raise
        except Exception as exc:  # RecursionError included, should the pre-scan miss a case
            logger.warning("mail body unparseable", extra={"account": account, "error": repr(exc)})
            problems.append(f"MIME body not parsed: {type(exc).__name__}: {exc}")
        else:
            problems.extend(content.problems)
            blobs.extend(content.blobs)
            event["text_body"] = content.text_body
            event["html_body"] = content.html_body
            event["body_truncated"] = content.body_truncated
            event["attachments"] = content.attachments
    if fit_event_budget(event, len(raw), limits.max_event_bytes):
        problems.append(f"event over {limits.max_event_bytes} bytes; bodies and lists cut")
    event["parse_error"] = _limit_text("; ".join(problems)) if problems else None
    return _finish(event, blobs)


def _without_bare_cr(raw: bytes, bare_cr: bool) -> bytes:
    """The stdlib parser ends lines at a bare CR too; the pre-scan and our header parser only
    at LF. When bare CRs occur, the copy that is parsed gets LF line ends throughout, so that
    all three see the same lines (the raw MIME, its fingerprint and raw_ref are untouched)."""
    if not bare_cr:
        return raw
    return raw.replace(b"\r\n", b"\n").replace(b"\r", b"\n")


def _finish(event: MailEvent, blobs: list[BlobRef]) -> ParsedMail:
    return ParsedMail(
        key=event["key"],
        key_kind=_KEY_KINDS.get(event["key_kind"]) or KeyKind(event["key_kind"]),
        event=event,
        blobs=tuple(blobs),
        parse_error=event["parse_error"],
    )


def _limit_text(text: str) -> str:
    return clean_text(text if len(text) <= _MAX_PARSE_ERROR else text[:_MAX_PARSE_ERROR] + "...")


@overload
def _utc(moment: datetime) -> datetime: ...
@overload
def _utc(moment: datetime | None) -> datetime | None: ...
def _utc(moment: datetime | None) -> datetime | None:
    if moment is None:
        return None
    return moment.replace(tzinfo=UTC) if moment.tzinfo is None else moment


def _empty_event(
    account: str,
    source: Mapping[str, Any],
    flags: list[str],
    internal_date: datetime | None,
    observed_at: datetime,
    change: ChangeKind,
    raw: bytes,
    raw_ref: BlobRef | None,
    bare_cr: bool,
) -> MailEvent:
    """The minimal event: what is known without reading the mail. Keyed by fingerprint until
    the headers say otherwise."""
    get = source.get
    coordinates: SourceCoordinates = {
        "kind": source["kind"],
        "folder": source["folder"],
        "uidvalidity": get("uidvalidity"),
        "uid": get("uid"),
        "modseq": get("modseq"),
        "item_id": get("item_id"),
        "change_key": get("change_key"),
    }
    return {
        "schema_version": SCHEMA_VERSION,
        "key": "",
        "key_kind": _FINGERPRINT,
        "change": change,
        "account": account,
        "source": coordinates,
        "message_id": None,
        "in_reply_to": None,
        "references": [],
        "from": None,
        "reply_to": [],
        "to": [],
        "cc": [],
        "subject": None,
        "date": None,
        "internal_date": _utc(internal_date),
        "size": len(raw),
        "text_body": None,
        "html_body": None,
        "body_truncated": False,
        "attachments": [],
        "raw_ref": _blob_record(raw_ref) if raw_ref is not None else None,
        "guard_headers": {
            "auto_submitted": None,
            "precedence": None,
            "list_id": None,
            "list_unsubscribe": None,
            "return_path": None,
            "x_auto_response_suppress": None,
            "content_type": None,
            "authentication_results": [],
        },
        "flags": [clean_text(flag) for flag in flags],
        "parse_error": None,
        "observed_at": _utc(observed_at),
        # Also for Message-ID keys: two mails sharing a Message-ID are told apart by it.
        "content_fingerprint": content_fingerprint(raw, bare_cr=bare_cr),
    }


def _blob_record(ref: BlobRef) -> BlobRefRecord:
    return {"uri": ref.uri, "sha256": ref.sha256, "size": ref.size}


def _text(value: bytes | None) -> str | None:
    """A header value as text, verbatim (no RFC 2047 decoding), 8-bit bytes via fallbacks."""
    if value is None:
        return None
    if value.isascii() and b"\x1b$" not in value:
        return value.decode("ascii").strip()  # what decode_text and clean_text give it
    return clean_text(decode_text(value, None)).strip()


#: GuardHeaders field -> the (lower-cased) header it holds.
_GUARD_FIELDS: dict[GuardHeaderName, str] = {
    "auto_submitted": "auto-submitted",
    "precedence": "precedence",
    "list_id": "list-id",
    "list_unsubscribe": "list-unsubscribe",
    "return_path": "return-path",
    "x_auto_response_suppress": "x-auto-response-suppress",
    "content_type": "content-type",
}


def _fill_from_headers(
    event: MailEvent, by_name: dict[str, list[bytes]], account: str, raw: bytes
) -> None:
    """Header-derived fields; ``by_name`` is :attr:`Head.by_name` (lower-cased names)."""
    get = by_name.get

    # Duplicate Message-ID fields: the first counts (identity.py explains why).
    values = get("message-id")
    message_id = normalize_message_id(_text(values[0]) if values else None)
    event["key"], kind = message_key_of_normalized(
        account, message_id, raw, event["content_fingerprint"]
    )
    event["key_kind"] = _KEY_KIND_SYMBOLS[kind]
    event["message_id"] = message_id
    values = get("in-reply-to")
    in_reply_to = _message_ids(values[0]) if values else []
    event["in_reply_to"] = in_reply_to[0] if in_reply_to else None
    values = get("references")
    event["references"] = _message_ids(values[0]) if values else []
    values = get("from")
    sender = parse_addresses(_texts(values[:1])) if values else []
    event["from"] = sender[0] if sender else None
    event["reply_to"] = parse_addresses(_texts(get("reply-to")))
    event["to"] = parse_addresses(_texts(get("to")))
    event["cc"] = parse_addresses(_texts(get("cc")))
    values = get("subject")
    if values:
        event["subject"] = clean_text(decode_words(values[0])).strip()
    values = get("date")
    event["date"] = _date(_text(values[0])) if values else None
    guards = event["guard_headers"]
    for name, field_name in _GUARD_FIELDS.items():
        values = get(field_name)
        guards[name] = _text(values[0]) if values else None
    guards["authentication_results"] = _texts(get("authentication-results"))


def _texts(values: list[bytes] | None) -> list[str]:
    """Header values as text, verbatim (see :func:`_text`), not stripped."""
    if not values:
        return []
    return [
        value.decode("ascii")  # what decode_text and clean_text give it
        if value.isascii() and b"\x1b$" not in value
        else clean_text(decode_text(value, None))
        for value in values
    ]


def _message_ids(value: bytes | None) -> list[str]:
    """Normalized ids of a References/In-Reply-To field; unusable ones are dropped."""
    if value is None:
        return []
    candidates = _ANGLE_ID.findall(value) or [value]
    ids: list[str] = []
    for candidate in candidates:
        normalized = normalize_message_id(decode_text(candidate, None))
        if normalized is not None:
            ids.append(clean_text(normalized))
    return ids


#: The RFC 5322 section 3.3 form nearly every mailer writes, ``Sun, 29 Nov 2026 12:00:00
#: +0000``: read by one regex instead of the stdlib's token juggling. Four-digit years from
#: 1000 only (the stdlib maps years below 100 into 1969-2068); anything else takes the stdlib.
_RFC5322_DATE = re.compile(
    r"(?:Mon|Tue|Wed|Thu|Fri|Sat|Sun), ([0-9]{1,2}) "
    r"(Jan|Feb|Mar|Apr|May|Jun|Jul|Aug|Sep|Oct|Nov|Dec) ([1-9][0-9]{3}) "
    r"([0-9]{2}):([0-9]{2}):([0-9]{2}) ([+-])([0-9]{2})([0-9]{2})"
)
_MONTHS = {
    name: number
    for number, name in enumerate(
        ("Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"), 1
    )
}


#: timezone objects by offset in seconds (immutable; at most 2 x 100 x 60 of them).
_ZONES: dict[int, timezone] = {}


def _rfc5322_date(value: str) -> datetime | None:
    """``parsedate_to_datetime(value)`` for the common form; None when not that form (or
    not a valid moment: the stdlib then decides)."""
    match = _RFC5322_DATE.fullmatch(value)
    if match is None:
        return None
    day, month, year, hour, minute, second, sign, tz_hours, tz_minutes = match.groups()
    offset = int(tz_hours) * 3600 + int(tz_minutes) * 60
    try:
        if sign == "-":
            if not offset:  # "-0000": UTC, source zone unknown; the stdlib returns it naive
                return datetime(
                    int(year), _MONTHS[month], int(day), int(hour), int(minute), int(second)
                )
            offset = -offset
        zone = _ZONES.get(offset)
        if zone is None:
            zone = _ZONES[offset] = timezone(timedelta(seconds=offset))
        return datetime(
            int(year), _MONTHS[month], int(day), int(hour), int(minute), int(second), tzinfo=zone
        )
    except (ValueError, OverflowError):
        return None


def _date(value: str | None) -> datetime | None:
    if not value:
        return None
    try:
        parsed = _rfc5322_date(value) or parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError, OverflowError):
        return None
    parsed = parsed.replace(tzinfo=UTC) if parsed.tzinfo is None else parsed
    if 1 < parsed.year < 9999:
        return parsed  # an offset under 24 h cannot leave the datetime range
    try:
        parsed.astimezone(UTC)  # out-of-range offsets near year 1/9999
    except (OverflowError, ValueError):
        return None
    return parsed
