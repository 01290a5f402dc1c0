"""Message identity: the Kafka key of ``mail.events``.

Key convention (see also ``KEYS.md`` next to this file)::

    <account>/mid:<normalized Message-ID>     key_kind MESSAGE_ID
    <account>/fp:<64 hex digits of sha256>    key_kind FINGERPRINT

``<account>`` is the configured account name (no ``/``). The normalized Message-ID is the
``id-left@id-right`` of RFC 5322 section 3.6.4 without angle brackets, comments and folding
white space, with the right-hand (domain) part lower-cased and the left part untouched
(it is case-sensitive). A header that is missing, empty, without ``@``, with white space,
control characters or angle brackets inside, or longer than 998 characters is unusable, and
the key falls back to the content fingerprint. When a mail carries two Message-ID fields, the
first one counts (what Dovecot and most clients show); the second is ignored.

The content fingerprint is the sha256 of the raw message after:

1. line endings normalized to CRLF (Maildir stores LF, IMAP serves CRLF);
2. header fields that differ between copies of the same mail removed, matched by name
   case-insensitively, folded continuation lines included: ``Received``, ``Return-Path``,
   ``Delivered-To``, ``X-Original-To``, ``Status``, ``X-Status``, ``X-Keywords``, ``X-UID``,
   ``X-IMAP``, ``X-IMAPbase``, ``Content-Length``, ``Lines`` (trace and mbox/MDA
   bookkeeping);
3. trailing empty lines at the end of the body removed.

The same mail in another folder, re-APPENDed, or with other line endings keeps its key; two
mails that differ in any other header or in the body get different keys. The fingerprint is
over the MIME as served: an Exchange server that re-encodes a mail yields another
fingerprint than the IMAP copy of it (Message-ID keys do not have that problem).

Two different mails that share a Message-ID (a broken mailer reusing ids) must not share a
key. The first one the account publishes keeps ``<account>/mid:<id>``; a mail whose content
fingerprint differs from the one stored for that key gets ``<account>/mid:<id>#<fp8>``, the
first 8 hex digits of its own fingerprint (16, then all 64, in the unlikely case that the
shorter one is taken by yet another mail). :func:`key_candidates` lists them in that order;
the source's key index (which remembers each key's fingerprint, from the ``content_fingerprint``
field of the events) picks the one stored with the mail's fingerprint, else the first free one.
A rescan or a restart therefore maps every mail back onto the key it was published under.

>>> normalize_message_id(" <Abc.123@Mail.Example.COM> (sent by foo)")
'Abc.123@mail.example.com'
>>> message_key("ops", "<Abc.123@Mail.Example.COM>", b"")
('ops/mid:Abc.123@mail.example.com', <KeyKind.MESSAGE_ID: 'MESSAGE_ID'>)
>>> message_key("ops", None, b"Subject: x\\r\\n\\r\\nhi\\r\\n")[0][:16]
'ops/fp:97ab0c6ff'
"""

from __future__ import annotations

import enum
import hashlib
import re

from connectors.core.mail.headers import split_head

__all__ = [
    "FINGERPRINT_EXCLUDED_FIELDS",
    "MAX_MESSAGE_ID_LENGTH",
    "SUFFIX_LENGTHS",
    "KeyKind",
    "content_fingerprint",
    "key_candidates",
    "message_id_of_key",
    "message_key",
    "message_key_of_normalized",
    "normalize_message_id",
]

MAX_MESSAGE_ID_LENGTH = 998  # RFC 5322 section 2.1.1: a line is at most 998 characters.

#: Hex digits of the fingerprint in the key of a mail whose Message-ID another mail of the
#: account has already, tried in this order: 8 keep keys short; a clash of 8 digits between
#: two mails with the same Message-ID (1 in 4 billion) moves on to 16, then to all 64.
SUFFIX_LENGTHS = (8, 16, 64)
_SUFFIX = re.compile(r"#(?:[0-9a-f]{8}|[0-9a-f]{16}|[0-9a-f]{64})\Z")

FINGERPRINT_EXCLUDED_FIELDS = frozenset(
    {
        "received",
        "return-path",
        "delivered-to",
        "x-original-to",
        "status",
        "x-status",
        "x-keywords",
        "x-uid",
        "x-imap",
        "x-imapbase",
        "content-length",
        "lines",
    }
)
#: The same names as bytes: a header line's name is compared without decoding it.
_EXCLUDED_NAMES = frozenset(name.encode("latin-1") for name in FINGERPRINT_EXCLUDED_FIELDS)
#: A CR that does not start a CRLF.
_BARE_CR = re.compile(rb"\r(?!\n)")
#: An LF that does not end a CRLF.
_BARE_LF = re.compile(rb"\n(?<!\r\n)")


class KeyKind(enum.StrEnum):
    """Mirrors the Avro enum ``io.mailtap.v1.KeyKind``."""

    MESSAGE_ID = "MESSAGE_ID"
    FINGERPRINT = "FINGERPRINT"


_UNUSABLE_CHARS = re.compile(r"[\x00-\x20\x7f<>]")


def _strip_comments(value: str) -> str | None:
    """Remove RFC 5322 comments (nested, with quoted-pairs) outside angle brackets and
    quoted strings. None when parentheses do not balance."""
    if "(" not in value:
        return value  # nothing opens a comment: every character is kept
    out: list[str] = []
    depth = 0
    in_angle = in_quotes = escaped = False
    for char in value:
        if escaped:
            escaped = False
            if depth == 0:
                out.append(char)
            continue
        if char == "\\" and (depth or in_quotes):
            escaped = True
            if depth == 0:
                out.append(char)
            continue
        if depth:
            if char == "(":
                depth += 1
            elif char == ")":
                depth -= 1
            continue
        if char == '"' and not in_angle:
            in_quotes = not in_quotes
        elif char == "<" and not in_quotes:
            in_angle = True
        elif char == ">" and not in_quotes:
            in_angle = False
        elif char == "(" and not in_angle and not in_quotes:
            depth = 1
            continue
        out.append(char)
    if depth:
        return None
    return "".join(out)


def normalize_message_id(raw: str | None) -> str | None:
    """``id-left@id-right`` with the domain lower-cased, or None when unusable.

    Idempotent: a normalized value normalizes to itself.

    >>> normalize_message_id("<a@b> <c@d>") is None, normalize_message_id("<no-at-sign>")
    (True, None)
    """
    if raw is None or len(raw) > 4 * MAX_MESSAGE_ID_LENGTH:
        return None
    stripped = _strip_comments(raw)
    if stripped is None:
        return None
    stripped = stripped.strip(" \t\r\n")
    if stripped.startswith("<") and stripped.endswith(">"):
        stripped = stripped[1:-1].strip(" \t")
    if not stripped or len(stripped) > MAX_MESSAGE_ID_LENGTH:
        return None
    if _UNUSABLE_CHARS.search(stripped):
        return None
    left, at, right = stripped.rpartition("@")
    if not at or not left or not right:
        return None
    return f"{left}@{right.lower()}"


def content_fingerprint(raw: bytes, *, bare_cr: bool | None = None) -> str:
    """sha256 hex of the raw message normalized as described in the module docstring.

    ``bare_cr``: whether ``raw`` holds a CR not followed by LF, when the caller has looked
    already (the parser does, for its own reasons); None: looked for here."""
    # IMAP serves CRLF already: with no bare CR and no bare LF, every line ends in CRLF. Each
    # is looked for by a regex that starts with its one literal byte, so that the search skips
    # to the next CR (LF) at C speed: 2.1 µs for the bare LF on the 4.7 KB bench mail, against
    # 3.8 for counting its LFs and CRs (as many of each, with no bare CR, was the test before;
    # a single regex for both, ``\r(?!\n)|\n(?<!\r\n)``, has no literal start and took 30).
    # Otherwise three C-speed passes instead of a regex: CRLF and lone CR to LF, then LF to CRLF.
    if bare_cr is None:
        bare_cr = _BARE_CR.search(raw) is not None
    if not bare_cr and _BARE_LF.search(raw) is None:
        normalized = raw
    else:
        normalized = raw.replace(b"\r\n", b"\n").replace(b"\r", b"\n").replace(b"\n", b"\r\n")
    head, body = split_head(normalized)
    kept = []
    keep = True
    for line in head.split(b"\r\n"):
        if line[:1] not in (b" ", b"\t"):
            keep = line.split(b":", 1)[0].strip().lower() not in _EXCLUDED_NAMES
        if keep:
            kept.append(line)
    # Each kept line with its CRLF, then the empty line: hashed in one update.
    kept.append(b"")
    digest = hashlib.sha256(b"\r\n".join(kept) + b"\r\n")
    end = len(body)
    while body.endswith(b"\r\n", 0, end):
        end -= 2
    digest.update(memoryview(body)[:end])
    return digest.hexdigest()


def message_key(account: str, message_id: str | None, raw: bytes) -> tuple[str, KeyKind]:
    """The record key for a mail: by Message-ID when usable, else by content fingerprint.

    ``message_id`` is the value of the (first) Message-ID field, raw or already normalized.
    """
    return message_key_of_normalized(account, normalize_message_id(message_id), raw)


def message_key_of_normalized(
    account: str, normalized: str | None, raw: bytes, fingerprint: str | None = None
) -> tuple[str, KeyKind]:
    """:func:`message_key` for a Message-ID already passed through
    :func:`normalize_message_id` (None when unusable), for callers that need both;
    ``fingerprint`` is ``content_fingerprint(raw)`` when the caller has it already."""
    if not account or "/" in account:
        raise ValueError(f"account name must be non-empty and contain no '/': {account!r}")
    if normalized is not None:
        return f"{account}/mid:{normalized}", KeyKind.MESSAGE_ID
    return f"{account}/fp:{fingerprint or content_fingerprint(raw)}", KeyKind.FINGERPRINT


def key_candidates(key: str, fingerprint: str) -> tuple[str, ...]:
    """The keys a mail parsed as ``key`` may be published under, in order of preference:
    ``key`` itself, then for a Message-ID key the same with ``#`` and a prefix of the mail's
    content fingerprint (module docstring). A fingerprint key is unique by construction.

    >>> key_candidates("ops/mid:a@b", "6fb3857f" + "0" * 56)[:2]
    ('ops/mid:a@b', 'ops/mid:a@b#6fb3857f')
    >>> key_candidates("ops/fp:6fb3857f", "6fb3857f")
    ('ops/fp:6fb3857f',)
    """
    if "/mid:" not in key:
        return (key,)
    return (key, *(f"{key}#{fingerprint[:n]}" for n in SUFFIX_LENGTHS))


def message_id_of_key(key: str) -> str | None:
    """The normalized Message-ID inside a MESSAGE_ID key, without a fingerprint suffix.

    >>> message_id_of_key("ops/mid:a@b#6fb3857f"), message_id_of_key("ops/fp:6fb3")
    ('a@b', None)
    """
    _, sep, message_id = key.partition("/mid:")
    if not sep:
        return None
    return _SUFFIX.sub("", message_id)
