"""Message identity: Message-ID normalization and the record key (KEYS.md)."""

from __future__ import annotations

import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from connectors.core.mail import KeyKind, content_fingerprint, message_key, normalize_message_id

pytestmark = pytest.mark.unit


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ("<abc@example.com>", "abc@example.com"),
        ("  <ABC.def@Mail.Example.COM>  ", "ABC.def@mail.example.com"),
        ("<abc@example.com> (added by relay)", "abc@example.com"),
        ("(comment (nested)) <abc@example.com>", "abc@example.com"),
        ("abc@Example.com", "abc@example.com"),
        ("< abc@example.com >", "abc@example.com"),
        ('<"quoted"@example.com>', '"quoted"@example.com'),
        ("<a@b@Example.COM>", "a@b@example.com"),
    ],
)
def test_usable_message_ids_are_normalized(raw: str, expected: str) -> None:
    assert normalize_message_id(raw) == expected
    assert normalize_message_id(expected) == expected  # idempotent


@pytest.mark.parametrize(
    "raw",
    [
        None,
        "",
        "   ",
        "<>",
        "<no-at-sign>",
        "<@example.com>",
        "<abc@>",
        "<ab c@example.com>",
        "<abc@exa\x01mple.com>",
        "<a<b@example.com>",
        "<a@b> <c@d>",
        "<abc@example.com> (unbalanced",
        "<" + "a" * 990 + "@example.com>",
    ],
)
def test_unusable_message_ids_are_rejected(raw: str | None) -> None:
    assert normalize_message_id(raw) is None


def test_key_uses_the_message_id_when_usable() -> None:
    key, kind = message_key("ops", "<X1@Example.COM>", b"ignored")
    assert (key, kind) == ("ops/mid:X1@example.com", KeyKind.MESSAGE_ID)


def test_key_falls_back_to_the_fingerprint() -> None:
    raw = b"Subject: hi\r\n\r\nbody\r\n"
    key, kind = message_key("ops", "<broken", raw)
    assert kind is KeyKind.FINGERPRINT
    assert key == f"ops/fp:{content_fingerprint(raw)}"
    assert re.fullmatch(r"ops/fp:[0-9a-f]{64}", key)


def test_account_with_a_slash_is_refused() -> None:
    with pytest.raises(ValueError, match="account"):
        message_key("a/b", "<x@y>", b"")


MAIL = (
    b"Return-Path: <sender@example.org>\r\n"
    b"Received: from mx1.example.org by mail.example.com;\r\n"
    b"\tMon, 6 Jan 2025 10:00:00 +0000\r\n"
    b"From: sender@example.org\r\n"
    b"To: ops@example.com\r\n"
    b"Subject: no message id here\r\n"
    b"\r\n"
    b"line one\r\n"
    b"line two\r\n"
)


def test_copies_of_one_mail_share_the_fingerprint() -> None:
    reference = content_fingerprint(MAIL)
    lf = MAIL.replace(b"\r\n", b"\n")
    redelivered = (
        b"Delivered-To: ops@example.com\r\n"
        b"X-Original-To: ops@example.com\r\n"
        b"Received: from mx2.example.org by mail.example.com;\r\n"
        b" Tue, 7 Jan 2025 10:00:00 +0000\r\n"
        + MAIL.replace(b"mx1.example.org", b"relay.example.net")
        + b"\r\n"
    )
    mbox_copy = MAIL.replace(
        b"Subject:",
        b"Status: RO\r\nX-UID: 12\r\nX-Keywords: $Forwarded\r\nContent-Length: 18\r\nSubject:",
    )
    assert content_fingerprint(lf) == reference
    assert content_fingerprint(redelivered) == reference
    assert content_fingerprint(mbox_copy) == reference


def test_other_headers_and_bodies_change_the_fingerprint() -> None:
    reference = content_fingerprint(MAIL)
    assert content_fingerprint(MAIL.replace(b"line two", b"line 2")) != reference
    assert content_fingerprint(MAIL.replace(b"no message id", b"No message id")) != reference
    assert content_fingerprint(MAIL.replace(b"To: ops", b"Cc: ops")) != reference


_header_value = st.text(
    alphabet=st.characters(min_codepoint=0x21, max_codepoint=0x7E), min_size=1, max_size=30
)
_body = st.lists(
    st.text(alphabet=st.characters(min_codepoint=0x20, max_codepoint=0x7E), max_size=40),
    min_size=1,
    max_size=8,
)
_received = st.lists(_header_value, max_size=3)


def _mail(subject: str, body_lines: list[str], received: list[str], newline: bytes) -> bytes:
    head = [f"Received: from {hop} by mx.example.com" for hop in received]
    head += ["From: a@example.org", f"Subject: {subject}"]
    text = "\n".join(head) + "\n\n" + "\n".join(body_lines) + "\n"
    return text.encode().replace(b"\n", newline)


@settings(max_examples=200, deadline=None)
@given(subject=_header_value, body=_body, hops_a=_received, hops_b=_received)
def test_same_mail_same_key_whatever_the_transport(
    subject: str, body: list[str], hops_a: list[str], hops_b: list[str]
) -> None:
    crlf = _mail(subject, body, hops_a, b"\r\n")
    lf = _mail(subject, body, hops_b, b"\n")
    assert message_key("ops", None, crlf) == message_key("ops", None, lf)


@settings(max_examples=200, deadline=None)
@given(subject=_header_value, body_a=_body, body_b=_body)
def test_different_bodies_give_different_keys(
    subject: str, body_a: list[str], body_b: list[str]
) -> None:
    # Trailing empty lines are not content (KEYS.md), so compare bodies without them.
    if "\n".join(body_a).rstrip("\n") == "\n".join(body_b).rstrip("\n"):
        return
    key_a, _ = message_key("ops", None, _mail(subject, body_a, [], b"\r\n"))
    key_b, _ = message_key("ops", None, _mail(subject, body_b, [], b"\r\n"))
    assert key_a != key_b


@settings(max_examples=100, deadline=None)
@given(left=_header_value.filter(lambda s: "@" not in s and "<" not in s and ">" not in s))
def test_message_id_key_ignores_domain_case_but_not_left_part(left: str) -> None:
    key_lower, _ = message_key("ops", f"<{left}@example.com>", b"")
    key_upper, _ = message_key("ops", f"<{left}@EXAMPLE.com>", b"")
    assert key_lower == key_upper
    if left.lower() != left:
        assert message_key("ops", f"<{left.lower()}@example.com>", b"")[0] != key_lower


def _reference_fingerprint(raw: bytes) -> str:
    """The normalization of the module docstring written out plainly, line by line: every line
    end to CRLF, the excluded fields (and their continuation lines) dropped, trailing empty
    lines of the body dropped. content_fingerprint must give the same digest on any input."""
    import hashlib

    from connectors.core.mail.headers import split_head
    from connectors.core.mail.identity import FINGERPRINT_EXCLUDED_FIELDS

    normalized = re.sub(rb"\r\n|\r|\n", b"\r\n", raw)
    head, body = split_head(normalized)
    digest = hashlib.sha256()
    keep = True
    for line in head.split(b"\r\n"):
        if not line.startswith((b" ", b"\t")):
            name = line.split(b":", 1)[0].strip().lower().decode("latin-1")
            keep = name not in FINGERPRINT_EXCLUDED_FIELDS
        if keep:
            digest.update(line + b"\r\n")
    digest.update(b"\r\n")
    while body.endswith(b"\r\n"):
        body = body[:-2]
    digest.update(body)
    return digest.hexdigest()


_pieces = st.sampled_from(
    [b"a", b"\r", b"\n", b"\r\n", b" ", b"\t", b":", b"\x0b", b"Received", b"received ",
     b"X-UID", b"Status:", b"Subject: x", b"\r\n\r\n", b"\n\n", b"\r\r\n"]
)  # fmt: skip


@settings(max_examples=400)
@given(st.lists(_pieces, max_size=40))
def test_the_fingerprint_matches_the_plain_normalization(pieces: list[bytes]) -> None:
    raw = b"".join(pieces)
    assert content_fingerprint(raw) == _reference_fingerprint(raw)
