"""What an attachment is (content.py): a part with a file name, with ``Content-Disposition:
attachment``, or a leaf that is not text. Report parts of real bounces are not attachments, and
the text of a subtree flattened at the depth cap is kept in ``text_body``."""

from __future__ import annotations

import base64
from collections.abc import Callable
from pathlib import Path

import pytest

from connectors.core.mail import ParsedMail, ParseLimits

pytestmark = pytest.mark.unit

Parse = Callable[..., ParsedMail]
DSN = Path(__file__).resolve().parents[2] / "fixtures" / "dsn"
REPORT_PARTS = {"message/delivery-status", "text/rfc822-headers"}


@pytest.mark.parametrize(
    ("fixture", "attachments", "body_starts"),
    [
        ("postfix.eml", [], "This is the mail system at host relay.example.com."),
        ("rfc3464_soft_422.eml", [], "This is a warning"),
        ("rfc3464_hard_511.eml", ["message/rfc822"], "Your message could not be delivered"),
        ("gmail.eml", ["message/rfc822"], "** Address not found **"),
    ],
)
def test_the_report_parts_of_a_bounce_are_not_attachments(
    parse: Parse, fixture: str, attachments: list[str], body_starts: str
) -> None:
    raw = (DSN / fixture).read_bytes()
    assert any(t.encode() in raw.lower() for t in REPORT_PARTS)  # the fixture has them
    mail = parse(raw)
    assert [a["content_type"] for a in mail.event["attachments"]] == attachments
    assert mail.event["text_body"].startswith(body_starts)
    assert mail.parse_error is None


def test_named_disposed_or_non_text_parts_are_attachments(parse: Parse) -> None:
    parts = [
        ("text/csv", "Content-Disposition: inline; filename=rows.csv", "a,b"),
        ("text/plain", "Content-Disposition: attachment", "notes"),
        ("image/png", "Content-ID: <logo>", base64.b64encode(b"\x89PNG").decode()),
        ("text/calendar; method=REQUEST", "", "BEGIN:VCALENDAR"),
        ("text/plain; charset=utf-8", "", "the body"),
    ]
    raw = b'Content-Type: multipart/mixed; boundary="s"\r\n\r\n'
    for ctype, extra, text in parts:
        head = f"Content-Type: {ctype}\r\n" + (f"{extra}\r\n" if extra else "")
        if ctype.startswith("image/"):
            head += "Content-Transfer-Encoding: base64\r\n"
        raw += f"--s\r\n{head}\r\n{text}\r\n".encode()
    raw += b"--s--\r\n"
    mail = parse(raw)
    found = [(a["filename"], a["content_type"]) for a in mail.event["attachments"]]
    assert found == [("rows.csv", "text/csv"), (None, "text/plain"), (None, "image/png")]
    # An inline text part without a name is the mail's own text, not a file: not listed.
    assert mail.event["text_body"] == "the body"


def _deep(depth: int, innermost: list[str]) -> bytes:
    out = ["Message-ID: <deep@example.org>", "Subject: deep", "MIME-Version: 1.0"]
    for level in range(depth):
        out += [f'Content-Type: multipart/mixed; boundary="b{level}"', "", f"--b{level}"]
    out += [f"Content-Type: text/plain; charset=utf-8\r\n\r\ntop of the tree\r\n--b{depth - 1}"]
    out += innermost
    out += [f"--b{level}--" for level in reversed(range(depth))]
    return "\r\n".join(out).encode() + b"\r\n"


def test_the_text_of_a_tree_flattened_at_the_depth_cap_stays_in_the_body(parse: Parse) -> None:
    hidden = base64.b64encode("déjà lu, base64".encode()).decode()
    innermost = [
        'Content-Type: multipart/alternative; boundary="alt"',
        "",
        "--alt",
        "Content-Type: text/plain; charset=utf-8",
        "Content-Transfer-Encoding: base64",
        "",
        hidden,
        "--alt",
        "Content-Type: text/html; charset=utf-8",
        "Content-Transfer-Encoding: quoted-printable",
        "",
        "<p>caf=C3=A9</p>",
        "--alt--",
        "--b29",
        "Content-Type: application/pdf; name=deep.pdf",
        "",
        "%PDF-1.4 not text",
    ]
    mail = parse(_deep(30, innermost), limits=ParseLimits(max_mime_depth=10))
    assert mail.parse_error == "MIME nesting deeper than 10; flattened"
    assert mail.event["attachments"] == []  # the flattened rest of the mail is no attachment
    assert mail.event["text_body"] == "top of the tree\ndéjà lu, base64"
    assert mail.event["html_body"] == "<p>café</p>"


def test_a_tree_nested_1000_deep_keeps_its_innermost_text(parse: Parse) -> None:
    mail = parse(_deep(1000, []))
    assert mail.parse_error == "MIME nesting deeper than 50; flattened"
    assert mail.event["attachments"] == []
    assert mail.event["text_body"] == "top of the tree"
