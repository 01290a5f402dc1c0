"""Hostile and huge inputs, generated here (nothing multi-MB is committed). Each must end in
an event, quickly; the timeouts are generous ceilings for a shared 2-core machine, not
performance assertions."""

from __future__ import annotations

import base64
import hashlib
import io
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import fastavro
import pytest

from connectors.core.claimcheck.local import LocalClaimCheckStore
from connectors.core.mail import ParsedMail, ParseLimits
from connectors.core.mail import limits as limits_module
from connectors.core.mail.headers import read_head
from connectors.core.mail.limits import Prescan

pytestmark = pytest.mark.unit

Parse = Callable[..., ParsedMail]


def nested_multipart(depth: int) -> bytes:
    out = [b"Message-ID: <deep@example.org>", b"Subject: deep", b"MIME-Version: 1.0"]
    for level in range(depth):
        out += [b'Content-Type: multipart/mixed; boundary="b%d"' % level, b"", b"--b%d" % level]
    out += [b"Content-Type: text/plain", b"", b"innermost"]
    out += [b"--b%d--" % level for level in reversed(range(depth))]
    return b"\r\n".join(out) + b"\r\n"


@pytest.mark.timeout(20)
def test_mime_nested_1000_deep_is_flattened(parse: Parse) -> None:
    mail = parse(nested_multipart(1000))
    assert mail.event["subject"] == "deep"
    assert mail.key == "ops/mid:deep@example.org"
    assert mail.parse_error == "MIME nesting deeper than 50; flattened"
    # The subtree below the cap is the rest of this mail, not an attachment; its text is read.
    assert mail.event["attachments"] == []
    assert mail.event["text_body"] == "innermost"


@pytest.mark.timeout(20)
def test_a_prescan_miss_is_still_caught(parse: Parse, monkeypatch: pytest.MonkeyPatch) -> None:
    # Defence in depth: should the pre-scan ever misjudge the structure, the stdlib's
    # RecursionError becomes a parse_error, not a crash.
    monkeypatch.setattr("connectors.core.mail.parse.prescan", lambda raw, limits: Prescan())
    mail = parse(nested_multipart(1000))
    assert mail.event["subject"] == "deep"
    assert mail.parse_error is not None and "RecursionError" in mail.parse_error
    assert limits_module.prescan is not None


@pytest.mark.timeout(20)
def test_huge_header_block_is_cut(parse: Parse) -> None:
    filler = b"".join(b"X-Filler-%06d: %s\r\n" % (i, b"v" * 40) for i in range(60_000))
    raw = b"Subject: =?utf-8?q?gro=C3=9F?=\r\nMessage-ID: <h@x>\r\n" + filler + b"\r\nbody\r\n"
    mail = parse(raw)
    assert len(raw) > 3_000_000
    assert mail.event["subject"] == "groß"
    assert mail.event["text_body"] == "body\r\n"
    assert mail.parse_error is not None and "header block over" in mail.parse_error


@pytest.mark.timeout(20)
def test_single_giant_header_line(parse: Parse) -> None:
    raw = b"Subject: x\r\nX-Giant: " + b"a" * 5_000_000 + b"\r\nFrom: a@example.org\r\n\r\nbody"
    mail = parse(raw)
    assert mail.event["subject"] == "x"
    assert mail.event["text_body"] == "body"


@pytest.mark.timeout(20)
@pytest.mark.parametrize("max_header_bytes", [None, 10_000_000])
def test_content_type_with_20000_parameters(parse: Parse, max_header_bytes: int | None) -> None:
    params = "".join(f'; p{i}="v{i}"' for i in range(20_000))
    raw = (
        "Subject: params\r\n"
        f'Content-Type: multipart/mixed{params}; boundary="keep"\r\n\r\n'
        "--keep\r\nContent-Type: text/plain; charset=utf-8\r\n\r\nkept body\r\n--keep--\r\n"
    ).encode()
    limits = (
        ParseLimits()
        if max_header_bytes is None
        else ParseLimits(max_header_bytes=max_header_bytes)
    )
    mail = parse(raw, limits=limits)
    assert mail.event["subject"] == "params"
    assert mail.parse_error is not None
    if max_header_bytes is None:
        # The 300 KB header is over the block cap: cut, so the body is read as plain text.
        assert "header block over" in mail.parse_error
    else:
        assert mail.parse_error == "more than 100 header parameters; cut"
        assert mail.event["text_body"] == "kept body"


@pytest.mark.timeout(20)
def test_8000_encoded_words(parse: Parse) -> None:
    words = ["报价", "会议", "通知", "订单"]
    expected = "".join(words[i % 4] for i in range(8_000))
    encoded = "\r\n ".join(
        "=?gbk?B?" + base64.b64encode(words[i % 4].encode("gbk")).decode() + "?="
        for i in range(8_000)
    )
    raw = f"Subject: {encoded}\r\nFrom: =?utf-8?q?A?= <a@example.org>\r\n\r\nbody\r\n".encode()
    mail = parse(raw)
    assert mail.event["subject"] == expected
    assert mail.parse_error is None


@pytest.mark.timeout(20)
def test_20_mb_attachment(parse: Parse, tmp_path: Path, mail_schema: Any) -> None:
    content = os.urandom(20 * 1024 * 1024)
    encoded = base64.encodebytes(content).replace(b"\n", b"\r\n")
    raw = (
        b"Message-ID: <big@example.org>\r\nSubject: big\r\n"
        b'Content-Type: multipart/mixed; boundary="X"\r\n\r\n'
        b"--X\r\nContent-Type: text/plain\r\n\r\nsee attached\r\n"
        b"--X\r\nContent-Type: application/octet-stream\r\n"
        b'Content-Disposition: attachment; filename="data.bin"\r\n'
        b"Content-Transfer-Encoding: base64\r\n\r\n" + encoded + b"--X--\r\n"
    )
    store = LocalClaimCheckStore(tmp_path)
    mail = parse(raw, claim_check=store)
    [attachment] = mail.event["attachments"]
    assert attachment["filename"] == "data.bin"
    assert attachment["size"] == len(content)
    assert attachment["sha256"] == hashlib.sha256(content).hexdigest()
    assert store.get(attachment["uri"]) == content
    assert store.get(mail.event["raw_ref"]["uri"]) == raw
    buffer = io.BytesIO()
    fastavro.schemaless_writer(buffer, mail_schema, mail.event)
    assert buffer.tell() < 10_000  # the content is in the store, not in the record


@pytest.mark.timeout(20)
def test_huge_bodies_are_capped(parse: Parse) -> None:
    text = ("价格表 line\n" * 1_000_000).encode("gbk")
    raw = b"Subject: long\r\nContent-Type: text/plain; charset=gbk\r\n\r\n" + text
    mail = parse(raw, limits=ParseLimits(max_body_bytes=64 * 1024))
    body = mail.event["text_body"]
    assert mail.event["body_truncated"] is True
    assert len(body.encode("utf-8")) <= 64 * 1024
    assert body.startswith("价格表 line\n价格表 line\n")


@pytest.mark.timeout(20)
def test_too_many_parts_gives_a_headers_only_event(parse: Parse) -> None:
    parts = b"".join(b"--s\r\nContent-Type: text/plain\r\n\r\n%d\r\n" % i for i in range(30_000))
    raw = b'Subject: parts\r\nContent-Type: multipart/mixed; boundary="s"\r\n\r\n' + parts
    mail = parse(raw)
    assert mail.event["subject"] == "parts"
    assert mail.event["attachments"] == [] and mail.event["text_body"] is None
    assert mail.parse_error == "more than 2000 MIME parts; headers only"


@pytest.mark.timeout(20)
def test_oversized_message_gives_a_headers_only_event(parse: Parse) -> None:
    raw = b"Subject: huge\r\n\r\n" + b"x" * 2_000_000
    mail = parse(raw, limits=ParseLimits(max_message_bytes=1_000_000))
    assert (mail.event["subject"], mail.event["size"], mail.event["text_body"]) == (
        "huge",
        len(raw),
        None,
    )


@pytest.mark.timeout(20)
def test_event_stays_under_the_budget(parse: Parse, mail_schema: Any) -> None:
    recipients = ", ".join(f"User {i} <user{i}@example.org>" for i in range(3_000))
    body = "x" * 200_000
    limits = ParseLimits(max_event_bytes=300_000)
    raw = (
        f"Subject: budget\r\nTo: {recipients}\r\nCc: {recipients}\r\n"
        'Content-Type: multipart/alternative; boundary="a"\r\n\r\n'
        f"--a\r\nContent-Type: text/plain\r\n\r\n{body}\r\n"
        f"--a\r\nContent-Type: text/html\r\n\r\n{body}\r\n--a--\r\n"
    ).encode()
    mail = parse(raw, limits=limits)
    buffer = io.BytesIO()
    fastavro.schemaless_writer(buffer, mail_schema, mail.event)
    assert buffer.tell() <= limits.max_event_bytes
    assert len(mail.event["to"]) == 3_000  # bodies went first, and that was enough
    assert mail.parse_error is not None and "event over" in mail.parse_error
    assert mail.event["body_truncated"] is True


def _dash_bomb(depth: int, lines: int) -> bytes:
    out = [b"Subject: dashes"]
    for level in range(depth):
        out += [b'Content-Type: multipart/mixed; boundary="b%d"' % level, b"", b"--b%d" % level]
    return b"\r\n".join([*out, b"Content-Type: text/plain", b"", b"--no-boundary\r\n" * lines])


@pytest.mark.timeout(20)
def test_millions_of_dash_lines_under_deep_nesting(parse: Parse) -> None:
    # Every line is a boundary candidate for every open level: the pre-scan looks boundaries
    # up in a dict, and the work cap lowers the depth the stdlib parser has to carry.
    mail = parse(_dash_bomb(depth=50, lines=500_000))
    assert mail.event["subject"] == "dashes"
    assert mail.parse_error is not None
    assert mail.parse_error.startswith("500154 lines: MIME depth cap lowered to 30")


@pytest.mark.timeout(20)
@pytest.mark.parametrize(
    ("depth", "lines", "expected"),
    [
        (10, 20_000, "20034 lines: MIME depth cap lowered to 3; MIME nesting deeper than 3"),
        (5, 60_000, "60019 lines, too many to MIME-parse; headers only"),
        (2, 1_000, None),
    ],
)
def test_parse_work_cap(parse: Parse, depth: int, lines: int, expected: str | None) -> None:
    mail = parse(_dash_bomb(depth, lines), limits=ParseLimits(max_parse_work=100_000))
    assert mail.event["subject"] == "dashes"
    assert (mail.parse_error or "").startswith(expected or "")
    assert (mail.parse_error is None) == (expected is None)


@pytest.mark.timeout(20)
def test_thousands_of_part_heads_with_thousands_of_lines(parse: Parse) -> None:
    part = b"--s\r\nContent-Type: text/plain\r\n" + b"X:1\r\n" * 9_000 + b"\r\nbody\r\n"
    raw = b'Subject: heads\r\nContent-Type: multipart/mixed; boundary="s"\r\n\r\n' + part * 300
    mail = parse(raw)
    assert mail.parse_error == "header block over 200 lines or 16384 bytes; cut"
    assert mail.event["text_body"] == "\n".join(["body"] * 300)


@pytest.mark.timeout(20)
def test_thousands_of_recipients(parse: Parse) -> None:
    to = ",\r\n ".join(f'"User {i}" <u{i}@example.org>' for i in range(7_000))
    mail = parse(f"Subject: many\r\nTo: {to}\r\n\r\nx\r\n".encode())
    assert mail.parse_error is None
    assert len(mail.event["to"]) == 7_000
    assert mail.event["to"][-1] == {"name": "User 6999", "address": "u6999@example.org"}


@pytest.mark.timeout(20)
def test_bare_cr_line_ends_cannot_hide_nesting(parse: Parse) -> None:
    # The stdlib splits lines at a bare CR; a pre-scan that did not would see no structure.
    mail = parse(nested_multipart(1000).replace(b"\r\n", b"\r"))
    assert mail.event["subject"] == "deep"
    assert mail.key == "ops/mid:deep@example.org"
    assert mail.parse_error == "MIME nesting deeper than 50; flattened"


@pytest.mark.timeout(20)
def test_header_line_of_blanks_with_a_stray_cr() -> None:
    # A plain-field regex that split the blanks before a value two ways backtracked
    # quadratically here (20,000 blanks: 3.7 s; these 200,000: minutes). parse_mail turns
    # bare CRs into line ends first, so the head reader is called directly.
    raw = b"Subject: blanks\r\nX-Pad:" + b" " * 200_000 + b"\rtail\r\n\r\nbody\r\n"
    head = read_head(raw)
    assert not head.plain
    assert head.by_name["x-pad"] == [b"\rtail"]
    assert head.body == b"body\r\n"


@pytest.mark.timeout(20)
def test_header_line_full_of_content_dash() -> None:
    # The pre-scan looks back from a "content-" to its line start once per line, not once
    # per hit (per hit, this line would cost ~10^11 bytes of scanning).
    raw = b"X-Spam: " + b"content-" * 600_000 + b"\r\nContent-Type: text/plain\r\n\r\nbody"
    fields, body_start = limits_module._scan_head(raw, 0, 10_000, 1 << 30, Prescan())
    assert [(field.name, bytes(field.value)) for field in fields] == [
        (b"Content-Type", b"text/plain")
    ]
    assert raw[body_start:] == b"body"


@pytest.mark.timeout(20)
def test_many_lf_parts_before_a_big_epilogue(parse: Parse) -> None:
    # Each part head's end is searched within its byte cap, not to the end of the mail
    # (unbounded, this took ~20 s per 20 MB here).
    parts = b"".join(b"--b\nContent-Type: text/plain\nX: y\n\npart\n" for _ in range(1_500))
    raw = b"Subject: lf\nContent-Type: multipart/mixed; boundary=b\n\n" + parts + b"--b--\n"
    mail = parse(raw + b"x" * 40_000_000)
    assert mail.event["subject"] == "lf"
    assert mail.event["text_body"] == "\n".join(["part"] * 1_500)
