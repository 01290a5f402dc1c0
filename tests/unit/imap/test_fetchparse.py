"""fetchparse against imapclient's parse_fetch_response: same answer for every shape, and the fast
path taken exactly for the shapes it claims to understand."""

from __future__ import annotations

import datetime as dt
import pickle
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from imapclient.exceptions import IMAPClientError, ProtocolError
from imapclient.response_parser import parse_fetch_response

from connectors.imap import fetchparse
from connectors.imap.config import ImapAccountSettings
from connectors.imap.connection import ImapConnection
from connectors.imap.errors import ImapProtocolError
from connectors.imap.fetchparse import parse_fetch, parse_fetch_fast

BODY = b'Subject: hi\r\n\r\nbody with ) and {5} and "quotes"\r\n'
DATE = b'"29-Nov-2026 19:00:51 +0000"'


def lit(head: bytes, body: bytes = BODY) -> list[Any]:
    """A response ending in a BODY[] literal, as imaplib splits it."""
    return [(head + b" BODY[] {%d}" % len(body), body), b")"]


# Shapes the fast path must take.
FAST: dict[str, list[Any]] = {
    "dovecot order": lit(b"7801 (UID 7801 FLAGS (\\Recent) INTERNALDATE " + DATE + b" MODSEQ (5)"),
    "other order": lit(b"3 (MODSEQ (12) INTERNALDATE " + DATE + b" FLAGS (\\Seen) UID 41"),
    "keywords": lit(b"2 (UID 2 FLAGS (\\Seen \\Answered $Forwarded Junk $label1 Non-Junk)"),
    "empty flags": lit(b"4 (UID 9 FLAGS () MODSEQ (0)"),
    "negative offset": lit(b'5 (UID 10 INTERNALDATE "01-Mar-2026 08:15:00 -0730"'),
    "bad date": lit(b'5 (UID 10 INTERNALDATE "not a date"'),
    "empty body": lit(b"6 (UID 11", b""),
    "size only": [b"12 (UID 12 RFC822.SIZE 5123)", b"13 (UID 14 RFC822.SIZE 0)"],
    "no body": [b"1 (UID 1 FLAGS (\\Seen) MODSEQ (7))"],
    "two messages": lit(b"1 (UID 1 FLAGS ()") + lit(b"2 (UID 2 FLAGS (\\Flagged)", b"x"),
    "repeated uid merges": [b"1 (UID 5 FLAGS ())", b"1 (UID 5 RFC822.SIZE 3)"],
    "nothing": [None],
}
# Shapes it must leave to imapclient.
FALLBACK: dict[str, list[Any]] = {
    "unsolicited without uid": [*lit(b"1 (UID 1 FLAGS ()"), b"2 (FLAGS (\\Seen))"],
    "nil flag": [b"1 (UID 1 FLAGS (NIL))"],
    "numeric keyword": [b"1 (UID 1 FLAGS (1234))"],
    "nil date": [b"1 (UID 1 INTERNALDATE NIL)"],
    "quoted escape": [b'1 (UID 1 INTERNALDATE "29-Nov-2026 \\"19:00:51 +0000")'],
    "literal in the middle": [(b"1 (UID 1 BODY[] {3}", b"abc"), b" FLAGS (\\Seen))"],
    "unexpected item": [b"1 (UID 1 X-GM-MSGID 123)"],
    "envelope": [b'1 (UID 1 ENVELOPE (NIL "s" NIL NIL NIL NIL NIL NIL NIL NIL))'],
    "leading zero size": [b"1 (UID 1 RFC822.SIZE 0123)"],
    "leading zero modseq": [b"1 (UID 1 MODSEQ (012))"],
    "lower case item": [b"1 (uid 1 FLAGS ())"],
    "double space": [b"1 (UID 1  FLAGS ())"],
    "body section": [(b"1 (UID 1 BODY[HEADER] {3}", b"abc"), b")"],
}
# Shapes imapclient rejects; the fast path must not accept them either.
BROKEN: dict[str, list[Any]] = {
    "literal shorter than announced": [(b"1 (UID 1 BODY[] {9}", b"abc"), b")"],
    "no closing paren": [(b"1 (UID 1 BODY[] {3}", b"abc")],
}


def library(data: list[Any], normalise: bool) -> dict[int, dict[bytes, Any]]:
    return dict(parse_fetch_response(data, normalise, True))


@pytest.mark.parametrize("normalise", [False, True])
@pytest.mark.parametrize("name", sorted(FAST))
def test_fast_shapes_parse_like_imapclient(name: str, normalise: bool) -> None:
    data = FAST[name]
    fast = parse_fetch_fast(data, normalise)
    assert fast is not None, name
    assert fast == library(data, normalise)


@pytest.mark.parametrize("name", sorted(FALLBACK))
def test_other_shapes_fall_back_to_imapclient(name: str) -> None:
    data = FALLBACK[name]
    assert parse_fetch_fast(data, False) is None
    before = fetchparse.counts.fallback
    assert parse_fetch(data, False) == library(data, False)
    assert fetchparse.counts.fallback == before + 1


@pytest.mark.parametrize("name", sorted(BROKEN))
def test_broken_shapes_raise_like_imapclient(name: str) -> None:
    data = BROKEN[name]
    assert parse_fetch_fast(data, False) is None
    with pytest.raises(ProtocolError):
        library(data, False)
    with pytest.raises(ProtocolError):
        parse_fetch(data, False)


def test_values_have_imapclients_types() -> None:
    data = FAST["dovecot order"]
    item = parse_fetch(data, False)[7801]
    assert item == {
        b"SEQ": 7801,
        b"FLAGS": (b"\\Recent",),
        b"INTERNALDATE": item[b"INTERNALDATE"],
        b"MODSEQ": (5,),
        b"BODY[]": BODY,
    }
    stamp = item[b"INTERNALDATE"]
    assert stamp == dt.datetime(2026, 11, 29, 19, 0, 51, tzinfo=dt.UTC)
    offset = parse_fetch(FAST["negative offset"], False)[10][b"INTERNALDATE"]
    assert offset.utcoffset() == -dt.timedelta(hours=7, minutes=30)


# --- generated responses -------------------------------------------------------------------

GOOD_FLAGS = [
    b"\\Seen",
    b"\\Recent",
    b"\\Answered",
    b"$Forwarded",
    b"Junk",
    b"$MDNSent",
    b"a.b-c_d",
]
BAD_FLAGS = [b"NIL", b"1234", b"0123", b"\\*", b'"quoted"', b"[x]"]
GOOD_DATES = [DATE, b'"01-Jan-2020 00:00:00 -0500"', b'" 1-Feb-2021 23:59:59 +1400"', b'"bogus"']
BAD_DATES = [b"NIL", b'"29-Nov-2026 \\"x"', b"{3}"]


@st.composite
def response(draw: st.DrawFn) -> tuple[list[Any], bool]:
    """One FETCH response as imaplib returns it, and whether the fast path should take it."""
    clean = True
    items: list[bytes] = []
    if draw(st.booleans()) or draw(st.booleans()):
        items.append(b"UID %d" % draw(st.integers(1, 10)))
    else:
        clean = False  # unsolicited: no UID
    if draw(st.booleans()):
        flags = draw(st.lists(st.sampled_from(GOOD_FLAGS + BAD_FLAGS), max_size=4))
        clean &= all(f in GOOD_FLAGS for f in flags)
        items.append(b"FLAGS (" + b" ".join(flags) + b")")
    if draw(st.booleans()):
        date = draw(st.sampled_from(GOOD_DATES + BAD_DATES))
        clean &= date in GOOD_DATES
        items.append(b"INTERNALDATE " + date)
    if draw(st.booleans()):
        modseq = draw(st.sampled_from([b"1", b"0", b"987654321012", b"007"]))
        clean &= modseq != b"007"
        items.append(b"MODSEQ (" + modseq + b")")
    if draw(st.booleans()):
        items.append(b"RFC822.SIZE %d" % draw(st.integers(0, 10**6)))
    if draw(st.integers(0, 9)) == 0:
        items.append(b"X-UNKNOWN 1")
        clean = False
    items = draw(st.permutations(items))
    seq = b"%d" % draw(st.integers(1, 10))
    if not draw(st.booleans()):
        return [seq + b" (" + b" ".join(items) + b")"], clean
    body = draw(st.binary(max_size=64))
    at = draw(st.integers(0, len(items)))
    before, after = items[:at], items[at:]
    clean &= not after  # a literal must be the last item
    head = seq + b" (" + b"".join(i + b" " for i in before) + b"BODY[] {%d}" % len(body)
    tail = b"".join(b" " + i for i in after) + b")"
    return [(head, body), tail], clean


@settings(max_examples=400, deadline=None)
@given(st.lists(response(), min_size=1, max_size=4), st.booleans())
def test_generated_responses_parse_like_imapclient(
    responses: list[tuple[list[Any], bool]], normalise: bool
) -> None:
    data = [element for elements, _ in responses for element in elements]
    clean = all(ok for _, ok in responses)
    fast = parse_fetch_fast(data, normalise)
    assert (fast is not None) == clean
    try:
        expected = library(data, normalise)
    except ProtocolError:
        assert fast is None
        with pytest.raises(ProtocolError):
            parse_fetch(data, normalise)
        return
    assert parse_fetch(data, normalise) == expected


# --- the connection's FETCH ----------------------------------------------------------------


class FakeImaplib:
    """imaplib's side of IMAPClient.fetch: records the command, answers with canned data."""

    def __init__(self, untagged: list[Any], typ: str = "OK") -> None:
        self.untagged, self.typ = untagged, typ
        self.commands: list[tuple[Any, ...]] = []

    def _command(self, *args: Any) -> str:
        self.commands.append(args)
        return "A1"

    def _command_complete(self, name: str, tag: str) -> tuple[str, list[bytes]]:
        return self.typ, [b"done"]

    def _untagged_response(self, typ: str, data: Any, name: str) -> tuple[str, list[Any]]:
        return typ, self.untagged


class FakeClient:
    normalise_times = False

    def __init__(self, imap: FakeImaplib) -> None:
        self._imap = imap

    def _checkok(self, command: str, typ: str, data: list[bytes]) -> None:
        if typ != "OK":
            raise IMAPClientError(f"{command} failed: {data[0]!r}")


def connection(imap: FakeImaplib) -> ImapConnection:
    account = ImapAccountSettings.model_validate(
        {"name": "a", "host": "localhost", "username": "u", "password": "p", "folders": ["INBOX"]}
    )
    conn = ImapConnection(account, connect_timeout=1, read_timeout=1)
    conn._client = FakeClient(imap)
    conn.condstore = True
    return conn


def test_fetch_sends_imapclients_command_and_drops_other_uids() -> None:
    untagged = lit(b"1 (UID 41 FLAGS (\\Seen) INTERNALDATE " + DATE + b" MODSEQ (12)") + lit(
        b"2 (UID 99 FLAGS () MODSEQ (13)", b"unsolicited"
    )
    imap = FakeImaplib(untagged)
    mails = connection(imap).fetch([41, 42])
    assert imap.commands == [("UID", "FETCH", "41,42", "(BODY.PEEK[] FLAGS INTERNALDATE MODSEQ)")]
    assert [(m.uid, m.raw, m.flags, m.modseq) for m in mails] == [(41, BODY, ("\\Seen",), 12)]
    assert mails[0].internal_date == dt.datetime(2026, 11, 29, 19, 0, 51, tzinfo=dt.UTC)


def test_fetched_mails_pickle_for_the_parse_processes() -> None:
    untagged = lit(b'1 (UID 7 INTERNALDATE "01-Mar-2026 08:15:00 -0730" FLAGS ()')
    (mail,) = connection(FakeImaplib(untagged)).fetch([7])
    copy = pickle.loads(pickle.dumps(mail))
    assert copy == mail
    assert copy.internal_date is not None
    assert copy.internal_date.utcoffset() == -dt.timedelta(hours=7, minutes=30)


def test_sizes_read_rfc822_size() -> None:
    imap = FakeImaplib([b"1 (UID 5 RFC822.SIZE 5123)", b"2 (UID 6 RFC822.SIZE 7)"])
    assert connection(imap).sizes([5, 6]) == {5: 5123, 6: 7}
    assert imap.commands == [("UID", "FETCH", "5,6", "(RFC822.SIZE)")]


def test_a_refused_fetch_is_a_protocol_error() -> None:
    with pytest.raises(ImapProtocolError, match="fetch failed"):
        connection(FakeImaplib([], typ="NO")).fetch([1])
