"""A strict fast path for the untagged FETCH data imaplib hands back; imapclient stays the parser
of record.

Why it exists: measured on the local Dovecot (5 KB mails, batches of 200), ``IMAPClient.fetch()``
of BODY.PEEK[] FLAGS INTERNALDATE MODSEQ costs ~80 µs of CPU per mail, of which imapclient's
pure-Python ``parse_fetch_response`` (a byte-at-a-time lexer) is ~40-48 µs and the imaplib layer
below ~45 µs. Issue #3 wants ingest at >= 80% of raw imapclient FETCH, so the ingest path parses
the common shape with a few regular expressions instead: ~6 µs per mail, ~52 µs per mail for
the whole FETCH.

What imaplib returns (``_untagged_response(typ, data, "FETCH")``), and the only shapes taken::

    [(b'7 (UID 41 FLAGS (\\Seen $Forwarded) INTERNALDATE "29-Nov-2026 19:00:51 +0000"'
      b' MODSEQ (12) BODY[] {5120}', b'<5120 bytes of mail>'),
     b')',
     b'8 (UID 42 RFC822.SIZE 5123)']

Items: ``UID n``, ``FLAGS (atoms)``, ``INTERNALDATE "..."`` (no escapes), ``MODSEQ (n)``,
``RFC822.SIZE n`` in any order, single spaces, UID present, and at most one ``BODY[] {n}``
literal as the last item, of exactly n bytes, followed by exactly ``b')'``. Anything else
(an unsolicited FETCH without UID, NIL, quoted escapes, other items, a literal in the middle)
sends the *whole* response to imapclient's ``parse_fetch_response``, so the result is always
what imapclient returns with ``uid_is_key=True``; tests/unit/imap/test_fetchparse.py checks that
differentially. Part of the wire layer: only connection.py uses it, hence the imapclient import.
"""

from __future__ import annotations

import datetime as dt
import logging
import re
from dataclasses import dataclass
from typing import Any

from imapclient.datetime_util import parse_to_datetime
from imapclient.response_parser import parse_fetch_response

log = logging.getLogger(__name__)

FetchResponse = dict[int, dict[bytes, Any]]

# A flag or keyword that imapclient's lexer reads as one plain bytes token: starts with a letter,
# "$" or "\" (so never an int and never "{" or a quote), and no IMAP specials. "NIL" is checked
# apart (imapclient turns it into None).
_FLAG = rb"\\?[A-Za-z$][A-Za-z0-9$_.\-]*"
_ITEM = re.compile(
    rb"UID (?P<uid>[0-9]+)"
    rb"|FLAGS \((?P<flags>(?:" + _FLAG + rb"(?: " + _FLAG + rb")*)?)\)"
    rb'|INTERNALDATE "(?P<date>[^"\\]*)"'
    # No leading zeros: imapclient leaves "012" as bytes, not an int.
    rb"|MODSEQ \((?P<modseq>0|[1-9][0-9]*)\)"
    rb"|RFC822\.SIZE (?P<size>0|[1-9][0-9]*)"
)
_LINE = re.compile(rb"([0-9]+) \((.*)\)")
_LITERAL_HEAD = re.compile(rb"([0-9]+) \((.*)BODY\[\] \{([0-9]+)\}")
_CLOSE = b")"

#: INTERNALDATE strings repeat (Dovecot stamps a whole delivery with the same second), and
#: parse_to_datetime is the other big cost. Bounded: cleared when full.
_DATE_CACHE_SIZE = 4096
_dates: dict[bytes, dt.datetime | None] = {}


@dataclass
class ParseCounts:
    """How many FETCH responses took each path (process-wide; for tests and for a debug look)."""

    fast: int = 0
    fallback: int = 0


counts = ParseCounts()


def parse_fetch(data: list[Any], normalise_times: bool) -> FetchResponse:
    """``parse_fetch_response(data, normalise_times, uid_is_key=True)``, fast when the shape allows."""
    parsed = parse_fetch_fast(data, normalise_times)
    if parsed is not None:
        counts.fast += 1
        return parsed
    counts.fallback += 1
    log.debug("FETCH response not in the fast shape; imapclient parses it")
    return dict(parse_fetch_response(data, normalise_times, True))


def parse_fetch_fast(data: list[Any], normalise_times: bool) -> FetchResponse | None:
    """The fast path alone: the parsed response, or None when any element is not understood."""
    parsed: FetchResponse = {}
    if data == [None]:  # no untagged FETCH at all
        return parsed
    i, n = 0, len(data)
    while i < n:
        element = data[i]
        if isinstance(element, bytes):
            line = _LINE.fullmatch(element)
            if line is None:
                return None
            seq, items, literal = line[1], line[2], None
            i += 1
        elif (
            isinstance(element, tuple)
            and len(element) == 2
            and isinstance(element[0], bytes)
            and isinstance(element[1], bytes)
        ):
            head = _LITERAL_HEAD.fullmatch(element[0])
            literal = element[1]
            if head is None or int(head[3]) != len(literal) or i + 1 >= n or data[i + 1] != _CLOSE:
                return None
            seq, items = head[1], head[2]
            if items:
                if not items.endswith(b" "):
                    return None
                items = items[:-1]
            i += 2
        else:
            return None
        message = _items(items, int(seq), normalise_times)
        if message is None:
            return None
        uid, fields = message
        if literal is not None:
            fields[b"BODY[]"] = literal
        # imapclient merges repeated responses for one message the same way.
        parsed.setdefault(uid, {}).update(fields)
    return parsed


def _items(items: bytes, seq: int, normalise_times: bool) -> tuple[int, dict[bytes, Any]] | None:
    """(uid, fields) of one response's item list, or None if any item is outside the fast shape."""
    fields: dict[bytes, Any] = {b"SEQ": seq}
    uid = None
    pos, end = 0, len(items)
    while pos < end:
        item = _ITEM.match(items, pos)
        if item is None:
            return None
        kind = item.lastgroup
        value = item[kind] if kind is not None else b""
        if kind == "uid":
            uid = int(value)
        elif kind == "flags":
            flags = tuple(value.split(b" ")) if value else ()
            if b"NIL" in flags:
                return None
            fields[b"FLAGS"] = flags
        elif kind == "date":
            fields[b"INTERNALDATE"] = _internaldate(value, normalise_times)
        elif kind == "modseq":
            fields[b"MODSEQ"] = (int(value),)
        else:
            fields[b"RFC822.SIZE"] = int(value)
        pos = item.end()
        if pos < end:
            if items[pos : pos + 1] != b" " or pos + 1 == end:
                return None
            pos += 1
    if uid is None:  # unsolicited FETCH: imapclient would key it by sequence number
        return None
    return uid, fields


def _internaldate(value: bytes, normalise_times: bool) -> dt.datetime | None:
    """What imapclient's ``_convert_INTERNALDATE`` returns for this string."""
    if normalise_times:
        # Normalised times depend on the current DST state (FixedOffset.for_system), so they
        # are never cached.
        return _parse_internaldate(value, True)
    try:
        return _dates[value]
    except KeyError:
        pass
    if len(_dates) >= _DATE_CACHE_SIZE:
        _dates.clear()
    parsed = _dates[value] = _parse_internaldate(value, False)
    return parsed


def _parse_internaldate(value: bytes, normalise_times: bool) -> dt.datetime | None:
    try:
        result: dt.datetime = parse_to_datetime(value, normalise=normalise_times)
    except ValueError:
        return None
    return result
