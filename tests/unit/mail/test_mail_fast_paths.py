"""The parser's shortcuts for common input give exactly what the general code gives.

Each shortcut is compared with the code it bypasses (kept as the reference) on generated
input around its edges: dates in and near the RFC 5322 form, line ends with and without
bare CRs.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from connectors.core.mail import charsets, content, encodedwords, headers, limits, params, parse
from connectors.core.mail.identity import content_fingerprint

pytestmark = pytest.mark.unit


def _stdlib_date(value: str) -> datetime | None:
    try:
        return parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError, OverflowError):
        return None


_days = st.sampled_from(["Mon", "Tue", "Sun", "mon", "Xyz"])
_months = st.sampled_from(["Jan", "Feb", "Nov", "Dec", "nov", "Foo"])
_digits = st.text("0123456789", min_size=1, max_size=5)


def _number(low: int, high: int, width: int) -> st.SearchStrategy[str]:
    """Mostly well-formed numbers around the valid range, sometimes any digit string."""
    return st.one_of(st.integers(low, high).map(lambda n: f"{n:0{width}d}"), _digits)


_date_parts = st.tuples(
    _days,
    _number(0, 32, 1),
    _months,
    _number(990, 10000, 4),
    _number(0, 25, 2),
    _number(0, 61, 2),
    _number(0, 61, 2),
    st.sampled_from("+-"),
    _number(0, 2500, 4),
)


def _render(parts: tuple[str, ...]) -> str:
    day, dd, month, year, hh, mm, ss, sign, zone = parts
    return f"{day}, {dd} {month} {year} {hh}:{mm}:{ss} {sign}{zone}"


@settings(max_examples=2000, deadline=None)
@given(_date_parts)
def test_rfc5322_date_shortcut_matches_the_stdlib(parts: tuple[str, ...]) -> None:
    value = _render(parts)
    fast = parse._rfc5322_date(value)
    if fast is not None:
        reference = _stdlib_date(value)
        assert reference is not None
        assert (fast, fast.tzinfo, fast.utcoffset()) == (
            reference,
            reference.tzinfo,
            reference.utcoffset(),
        )
    assert repr(parse._date(value)) == repr(_reference_date(value))


def _reference_date(value: str) -> datetime | None:
    """parse._date as it was before the shortcut."""
    parsed = _stdlib_date(value)
    if parsed is None:
        return None
    parsed = parsed.replace(tzinfo=UTC) if parsed.tzinfo is None else parsed
    try:
        parsed.astimezone(UTC)
    except (OverflowError, ValueError):
        return None
    return parsed


@pytest.mark.parametrize(
    ("value", "fast"),
    [
        ("Sun, 29 Nov 2026 12:00:00 +0000", True),
        ("Mon, 2 Dec 2024 10:00:00 -0500", True),
        ("Mon, 2 Dec 2024 10:00:00 -0000", True),
        ("Mon, 2 Dec 2024 10:00:00 +0100 (CET)", False),
        ("2 Dec 2024 10:00:00 +0100", False),
        ("Mon, 2 Dec 24 10:00:00 +0100", False),
        ("Mon, 2 Dec 0024 10:00:00 +0100", False),
        ("Mon, 31 Feb 2024 10:00:00 +0100", False),
        ("Mon, 2 Dec 2024 10:00:00 GMT", False),
        ("Mon, 2 Dec 2024 10:00:00 +9999", False),
        ("Mon, 2 Dec 2024 10:00:00 +\u0661\u0661\u0661\u0661", False),
    ],
)
def test_which_dates_take_the_shortcut(value: str, fast: bool) -> None:
    assert (parse._rfc5322_date(value) is not None) is fast
    assert repr(parse._date(value)) == repr(_reference_date(value))


def _reference_without_bare_cr(raw: bytes) -> bytes:
    if raw.count(b"\r") == raw.count(b"\r\n"):
        return raw
    return raw.replace(b"\r\n", b"\n").replace(b"\r", b"\n")


@settings(max_examples=500, deadline=None)
@given(st.lists(st.sampled_from([b"a", b"\r", b"\n", b"\r\n", b"\r\r\n", b" "]), max_size=30))
def test_bare_cr_detection_matches_counting(pieces: list[bytes]) -> None:
    raw = b"".join(pieces)
    bare_cr = parse._BARE_CR.search(raw) is not None  # what parse_mail hands on
    assert bare_cr is (raw.count(b"\r") != raw.count(b"\r\n"))
    assert parse._without_bare_cr(raw, bare_cr) == _reference_without_bare_cr(raw)
    # The fingerprint given the parser's answer is the one it finds by itself.
    assert content_fingerprint(raw, bare_cr=bare_cr) == content_fingerprint(raw)


_REF_HEAD_END = re.compile(rb"\r?\n\r?\n")
_REF_LINE_END = re.compile(rb"\r?\n")


def _reference_split_head(raw: bytes) -> tuple[bytes, bytes]:
    """headers.split_head as it was: one regex search."""
    if raw.startswith((b"\r\n", b"\n")):
        return b"", raw[2 if raw.startswith(b"\r\n") else 1 :]
    match = _REF_HEAD_END.search(raw)
    if match is None:
        return raw, b""
    return raw[: match.start()], raw[match.end() :]


def _reference_parse_fields(head: bytes) -> list[tuple[str, bytes]]:
    """headers.parse_fields as it was."""
    fields: list[tuple[str, list[bytes]]] = []
    for line in _REF_LINE_END.split(head):
        if line[:1] in (b" ", b"\t"):
            if fields:
                fields[-1][1].append(line)
            continue
        name, colon, value = line.partition(b":")
        name = name.rstrip(b" \t")
        if not colon or not name or b" " in name:
            continue
        fields.append((name.decode("latin-1"), [value.lstrip(b" \t")]))
    return [(name, b"".join(chunks).rstrip(b"\r")) for name, chunks in fields]


def _grouped(fields: list[tuple[str, bytes]]) -> dict[str, list[bytes]]:
    """How parse.py grouped fields by name before Head.by_name did it."""
    by_name: dict[str, list[bytes]] = {}
    for name, value in fields:
        by_name.setdefault(name.lower(), []).append(value)
    return by_name


_head_bytes = st.lists(
    st.sampled_from([b"A", b"b", b":", b" ", b"\t", b"\r", b"\n", b"\r\n", b"\n\n", b"\r\n\r\n"]),
    max_size=40,
).map(b"".join)


@settings(max_examples=1500, deadline=None)
@given(_head_bytes, st.sampled_from([1, 2, 3, 4, 5, 8, 16 * 1024]))
def test_split_head_matches_the_regex(raw: bytes, window: int) -> None:
    with pytest.MonkeyPatch.context() as patched:
        patched.setattr(headers, "_HEAD_WINDOW", window)
        assert headers.split_head(raw) == _reference_split_head(raw)


@settings(max_examples=1500, deadline=None)
@given(_head_bytes)
def test_lines_and_fields_match_the_regex_split(head: bytes) -> None:
    assert headers.split_lines(head) == _REF_LINE_END.split(head)
    assert headers.parse_fields(head) == _reference_parse_fields(head)
    whole = headers.read_head(head + b"\r\n\r\nbody")
    reference_head, reference_body = _reference_split_head(head + b"\r\n\r\nbody")
    assert (whole.head, whole.body) == (reference_head, reference_body)
    assert whole.by_name == _grouped(_reference_parse_fields(reference_head))


_header_value = st.lists(
    st.sampled_from(
        [b"a", b" ", b"\x1b$B", b"\x1b(B", b"=?", b"?=", b"\xe9", b"\xc3\xa9", b"\x00", b"\r"]
    ),
    max_size=12,
).map(b"".join)


@settings(max_examples=1000, deadline=None)
@given(_header_value)
def test_ascii_shortcuts_give_the_general_answer(value: bytes) -> None:
    # An empty declared charset takes the general path (normalize_charset("") is None).
    assert charsets.decode_text(value, None) == charsets.decode_text(value, "")
    text = value.decode("utf-8", "surrogateescape")
    try:
        text.encode("utf-8")
        cleaned = text
    except UnicodeEncodeError:
        cleaned = text.encode("utf-8", errors="replace").decode("utf-8")
    assert charsets.clean_text(text) == cleaned
    reference = charsets.clean_text(charsets.decode_text(value, ""))
    assert parse._text(value) == reference.strip()
    assert parse._texts([value, value]) == [reference, reference]


def _reference_decode_words(raw: bytes) -> str:
    """encodedwords.decode_words as it was, without the shortcut for no encoded word."""
    out: list[str] = []
    pending_charset: str | None = None
    pending: list[bytes] = []
    position = 0
    for match in encodedwords._WORD.finditer(raw):
        between = raw[position : match.start()]
        charset = match.group(1).decode("ascii", "replace")
        if between.strip(b" \t\r\n") or not pending:
            encodedwords._flush(out, pending_charset, pending)
            pending = []
            out.append(charsets.decode_text(between, None))
        elif charset.lower() != (pending_charset or "").lower():
            encodedwords._flush(out, pending_charset, pending)
            pending = []
        pending_charset = charset
        pending.append(encodedwords._decode_payload(match.group(2), match.group(3)))
        position = match.end()
    encodedwords._flush(out, pending_charset, pending)
    out.append(charsets.decode_text(raw[position:], None))
    return "".join(out)


@settings(max_examples=1000, deadline=None)
@given(st.one_of(_header_value, _header_value.map(lambda v: v + b"=?utf-8?q?caf=C3=A9?=")))
def test_decode_words_shortcut(value: bytes) -> None:
    assert encodedwords.decode_words(value) == _reference_decode_words(value)


_prescan_lines = st.lists(
    st.sampled_from(
        [
            b"Content-Type: text/plain",
            b"content-type:multipart/mixed; boundary=b",
            b" CONTENT-DISPOSITION : attachment",
            b"\x0bContent-Type: x/y",
            b"Content-Disposition: inline;",
            b" filename=a.txt",
            b"\tcharset=utf-8",
            b"Subject: a",
            b"X-Content-Type: content-type content-disposition",
            b"garbage content-type",
            b"Content-Type \t\x0c: a; b=c",
            b"garbage",
            b":",
            b"",
            b"\r",
            b"X: 1\r",
        ]
    ),
    max_size=10,
)


@settings(max_examples=1500, deadline=None)
@example([b"Content-Type: a", b":", b" filename=a.txt"], b"\r\n", b"\r\n\r\nbody", 12, 300)
@example([b"Content-Type: a", b"garbage", b"\tb=c", b"X: 1\r"], b"\n", b"\n\nbody", 12, 300)
@given(
    _prescan_lines,
    st.sampled_from([b"\r\n", b"\n"]),
    st.sampled_from([b"", b"\r\n", b"\n", b"\r\n\r\nbody", b"\n\nbody"]),
    st.integers(0, 12),
    st.integers(0, 300),
)
def test_quick_head_scan_matches_the_line_loop(
    lines: list[bytes], newline: bytes, tail: bytes, max_lines: int, max_bytes: int
) -> None:
    raw = b"preamble" + newline + newline.join(lines) + tail
    pos = len(b"preamble" + newline)
    quick_result, slow_result = limits.Prescan(), limits.Prescan()
    quick, quick_end = limits._scan_head(raw, pos, max_lines, max_bytes, quick_result)
    slow, slow_end = limits._scan_head_by_line(raw, pos, max_lines, max_bytes, slow_result)
    assert quick_end == slow_end
    assert (quick_result.patches, quick_result.problems) == (
        slow_result.patches,
        slow_result.problems,
    )
    for name in (b"content-type", b"content-disposition"):
        assert limits._first(quick, name) == limits._first(slow, name)


def _reference_param_value(parsed: list[tuple[str, str]], wanted: str) -> str | None:
    """params.param_value as it was, without its shortcuts."""
    joined = params.rfc2231_bytes(parsed, wanted, params._surrogate_bytes)
    if joined is not None:
        return charsets.decode_text(joined[1], joined[0])
    plain = next((raw for name, raw in parsed if name == wanted), None)
    if plain is None:
        return None
    if "=?" in plain:
        return encodedwords.decode_words(plain)
    return charsets.decode_text(params._surrogate_bytes(plain), None)


_param_names = st.sampled_from(
    ["name", "filename", "charset", "filename*", "filename*0", "filename*0*", "filename*1", "x*"]
)
_param_values = st.sampled_from(
    ["a.txt", "utf-8", "UTF-8''%E6%8A%A5.pdf", "=?utf-8?q?caf=C3=A9?=", "\x1b$B", "caf\udce9", ""]
)


@settings(max_examples=1000, deadline=None)
@given(
    st.lists(st.tuples(_param_names, _param_values), max_size=5),
    st.sampled_from(["name", "filename", "charset"]),
)
def test_param_value_shortcuts(parsed: list[tuple[str, str]], wanted: str) -> None:
    assert params.param_value(parsed, wanted) == _reference_param_value(parsed, wanted)


_field_lines = st.lists(
    st.one_of(
        st.sampled_from(
            [
                b"Subject: hello",
                b"X-Tab:\tvalue",
                b"Empty:",
                b"Spaces:   ",
                b"Name : spaced",
                b"Bad Name: x",
                b" folded",
                b"\tfolded",
                b"a:b:c",
                b"Inner: a\rb",
                b"Trailing: cr\r",
                b"8bit: caf\xe9",
                b"\xe9: name",
                b"no colon",
                b"",
            ]
        ),
        st.binary(max_size=8),
    ),
    min_size=1,
    max_size=8,
)


@settings(max_examples=2000, deadline=None)
@given(_field_lines, st.sampled_from([b"\r\n", b"\n"]))
def test_plain_field_blocks_read_like_the_line_loop(lines: list[bytes], newline: bytes) -> None:
    head = newline.join(lines)
    assert headers.parse_fields(head) == _reference_parse_fields(head)
    whole = headers.read_head(head + newline + newline + b"body")
    if whole.head == head:
        assert whole.by_name == _grouped(_reference_parse_fields(head))
        if whole.plain:
            # content._single_text_part skips its line checks for plain blocks.
            split = _REF_LINE_END.split(head)
            assert split[0] and content._FIELD_LINE.match(split[0])
            assert all(content._FIELD_LINE.match(line) for line in split)


def _reference_body(chunks: list[str], limit: int) -> tuple[str | None, bool]:
    """content._Body as it was: sizes and the cut always via UTF-8 bytes."""
    size, truncated, kept = 0, False, []
    for text in chunks:
        if size >= limit:
            truncated = True
            continue
        kept.append(text)
        size += len(text.encode("utf-8", "replace")) + 1
    if not kept:
        return None, truncated
    joined = charsets.clean_text("\n".join(kept))
    encoded = joined.encode("utf-8")
    if len(encoded) > limit:
        return encoded[:limit].decode("utf-8", "ignore"), True
    return joined, truncated


@settings(max_examples=1000, deadline=None)
@given(st.lists(st.text(alphabet="ab\né会\udce9", max_size=12), max_size=4), st.integers(0, 30))
def test_body_sizes_with_ascii_shortcut(chunks: list[str], limit: int) -> None:
    body = content._Body()
    for text in chunks:
        body.add(text, limit)
    assert (body.result(limit), body.truncated) == _reference_body(chunks, limit)
