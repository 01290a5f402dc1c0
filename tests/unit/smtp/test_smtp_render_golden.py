"""Rendering is byte-for-byte stable: a varied corpus of commands against stored bytes.

The expected files in tests/fixtures/render/ were written by the render of main at a8d7bd4
(before the render was made cheaper), so any change of the bytes a command produces shows up
here. A resend must be byte-identical to the first attempt (render.py's docstring), and a relay
or a recipient's filter must not see a different message because the code changed.

To write the files again (only for a deliberate, explained change of the output)::

    .venv/bin/python tests/unit/smtp/test_smtp_render_golden.py --write
"""

from __future__ import annotations

import hashlib
import json
import sys
from datetime import UTC, datetime, timedelta, timezone
from email import policy
from pathlib import Path
from typing import Any
from unittest import mock

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from connectors.smtp import render as render_module
from connectors.smtp.render import RenderedMessage, render

pytestmark = pytest.mark.unit

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "render"

BLOBS = {
    "blob://a/report.pdf": b"%PDF-1.4\n" + bytes(range(256)) * 8,
    "blob://a/notes.txt": "Notizen zur Größe\nzweite Zeile\n".encode(),
    "blob://a/data.csv": b"id,name\n1,alpha\n2,beta\n" * 40,
}


def fetch(uri: str) -> bytes:
    return BLOBS[uri]


def attachment(uri: str, filename: str, content_type: str) -> dict[str, Any]:
    data = BLOBS[uri]
    return {
        "uri": uri,
        "filename": filename,
        "content_type": content_type,
        "sha256": hashlib.sha256(data).hexdigest(),
        "size": len(data),
    }


def command(command_id: str, **overrides: Any) -> dict[str, Any]:
    """The shape of tests/integration/smtp/smtp_harness.py ``command()``, with a fixed date."""
    value: dict[str, Any] = {
        "schema_version": 1,
        "command_id": command_id,
        "kind": "REPLY",
        "workflow": "ack",
        "step": "reply",
        "event_key": "evt-1",
        "from": {"name": "Support", "address": "support@example.com"},
        "to": [{"name": None, "address": "customer@example.org"}],
        "cc": [],
        "bcc": [],
        "reply_to": [],
        "subject": "Re: your request",
        "text_body": "We got it.",
        "html_body": None,
        "attachments": [],
        "in_reply_to": "orig-1@example.org",
        "references": [],
        "auto_submitted": "auto-replied",
        "created_at": datetime(2026, 11, 29, 16, 0, 7, 123456, tzinfo=UTC),
    }
    value.update(overrides)
    return value


LONG_WORDS = " ".join(f"word{i}" for i in range(40))
HTML = "<html><body><p>We got it.</p><p>Ticket <b>#42</b> &amp; more</p></body></html>"

#: name -> (command, keyword arguments of render)
CORPUS: dict[str, tuple[dict[str, Any], dict[str, Any]]] = {
    "plain": (command("c-plain"), {}),
    "text_html": (command("c-text-html", html_body=HTML), {}),
    "html_only": (command("c-html-only", text_body=None, html_body=HTML), {}),
    "bench_shape": (
        command(
            "bench-run-000042",
            **{"from": {"name": "mailtap bench", "address": "bench@example.com"}},
            to=[{"name": "Receiver", "address": "rcpt42@example.org"}],
            subject="Re: bench message 42",
            text_body="Thank you for your message.\n" * 20,
            in_reply_to="orig-42@example.org",
        ),
        {},
    ),
    "sink_settings": (
        command("c-sink"),
        {
            "verp_domain": "bounces.example.com",
            "return_path": "relay@example.com",
            "unsubscribe": ["mailto:unsub@example.com?subject=unsubscribe"],
        },
    ),
    "unsubscribe_https": (
        command("c-unsub-https"),
        {
            "unsubscribe": [
                "mailto:unsub@example.com",
                "https://example.com/unsubscribe?token=abcdefghijklmnopqrstuvwxyz0123456789",
            ]
        },
    ),
    "return_path": (command("c-return-path"), {"return_path": "Relay@Example.COM"}),
    "non_ascii_names_subject": (
        command(
            "c-umlaut",
            **{"from": {"name": "Kundendienst Österreich", "address": "support@example.com"}},
            to=[{"name": "Jürgen Müller", "address": "juergen@example.org"}],
            subject="Re: Bestellung Größe 42",
            text_body="Danke.\n.\nEnde",
            references=["first@example.org"],
            in_reply_to="<orig@example.org>",
        ),
        {},
    ),
    "non_ascii_body": (
        command(
            "c-body-utf8", text_body="Grüße aus Köln — 東京\n" * 3, html_body=f"<p>{'é' * 50}</p>"
        ),
        {},
    ),
    "long_ascii_subject": (command("c-long-subject", subject=f"Re: {LONG_WORDS}"), {}),
    "long_unbroken_subject": (command("c-unbroken", subject="Re: " + "x" * 120), {}),
    "long_non_ascii_subject": (
        command("c-long-utf8-subject", subject="Re: " + " ".join(["Größenänderung"] * 12)),
        {},
    ),
    "cjk_subject_and_name": (
        command(
            "c-cjk",
            to=[{"name": "山田 太郎", "address": "taro@example.jp"}],
            subject="Re: お問い合わせありがとうございます。担当者より折り返しご連絡いたします。",
        ),
        {},
    ),
    "specials_in_names": (
        command(
            "c-specials",
            **{"from": {"name": "Support (EU), Team", "address": "support@example.com"}},
            to=[
                {"name": "Doe, John", "address": "john@example.org"},
                {"name": 'Jane "JJ" Roe', "address": "jane@example.org"},
                {"name": "O'Brien", "address": "o.brien+tag@example.org"},
                {"name": "a@b <c>", "address": "weird@example.org"},
            ],
            subject="Re: [ticket #7] status: done; thanks (really)",
        ),
        {},
    ),
    "encoded_word_lookalikes": (
        command(
            "c-ew",
            to=[{"name": "=?utf-8?q?J=C3=BCrgen?=", "address": "j@example.org"}],
            subject="Re: =?utf-8?q?Gr=C3=B6=C3=9Fe?= and more",
        ),
        {},
    ),
    "whitespace_and_tabs": (
        command(
            "c-ws",
            subject="  Re:\tspaced   out  ",
            to=[{"name": " x ", "address": "x@example.org"}],
        ),
        {},
    ),
    "empty_subject_and_body": (command("c-empty", subject="", text_body=None), {}),
    "many_recipients": (
        command(
            "c-many",
            to=[{"name": f"Recipient {i}", "address": f"r{i}@example.org"} for i in range(8)],
            cc=[
                {"name": "Cé Cé", "address": "cc@example.net"},
                {"name": None, "address": "R3@EXAMPLE.ORG"},
            ],
            bcc=[{"name": "Hidden", "address": "bcc@example.net"}],
            reply_to=[{"name": "Replies", "address": "replies@example.com"}],
        ),
        {"recipients": ["r1@example.org", "bcc@example.net", "cc@example.net"]},
    ),
    "idna_domains": (
        command(
            "c-idna",
            **{"from": {"name": "Bücherei", "address": "info@Bücher.example"}},
            to=[{"name": None, "address": "kunde@müller.example"}],
        ),
        {},
    ),
    "references_fold": (
        command(
            "c-refs",
            references=[f"<ref-{i}.{'a' * 20}@mail.example.org>" for i in range(6)],
            in_reply_to="ref-last@mail.example.org",
        ),
        {},
    ),
    "references_contain_reply": (
        command("c-refs-in", references=["a@x.example", "orig-1@example.org"]),
        {},
    ),
    "no_threading": (
        command("c-fresh", in_reply_to=None, references=None, auto_submitted=None),
        {},
    ),
    "attachments": (
        command(
            "c-attach",
            attachments=[
                attachment("blob://a/report.pdf", "report.pdf", "application/pdf"),
                attachment("blob://a/notes.txt", "Notizen Größe.txt", "text/plain"),
            ],
        ),
        {},
    ),
    "text_html_attachment": (
        command(
            "c-mixed",
            html_body=HTML,
            attachments=[attachment("blob://a/data.csv", "data.csv", "Text/CSV")],
        ),
        {},
    ),
    "long_body_lines": (
        command("c-long-lines", text_body=("x" * 1200 + "\n") * 2 + "From here\n.\n..\n"),
        {},
    ),
    "crlf_body": (command("c-crlf", text_body="line one\r\nline two\r\n\r\nend"), {}),
    "date_offset": (
        command(
            "c-date",
            created_at=datetime(2027, 2, 3, 4, 5, 6, tzinfo=timezone(timedelta(hours=-7))),
        ),
        {},
    ),
    "smtputf8": (
        command(
            "c-utf8",
            to=[{"name": "用户", "address": "用户@例子.广告"}],
            subject="Re: 你好 Größe",
        ),
        {},
    ),
    "smtputf8_long_and_html": (
        command(
            "c-utf8-long",
            **{"from": {"name": "Support", "address": "support@Bücher.example"}},
            to=[
                {"name": "Jürgen", "address": "jürgen@müller.example"},
                {"name": None, "address": "plain@example.org"},
            ],
            subject="Re: " + " ".join(["Größenänderung"] * 12),
            text_body="Grüße\n",
            html_body="<p>Grüße</p>",
        ),
        {"unsubscribe": ["https://example.com/u"]},
    ),
    "smtputf8_attachment": (
        command(
            "c-utf8-attach",
            to=[{"name": None, "address": "用户@例子.广告"}],
            attachments=[attachment("blob://a/notes.txt", "Notizen Größe.txt", "text/plain")],
        ),
        {"return_path": "relay@example.com"},
    ),
}


def envelope(out: RenderedMessage) -> dict[str, Any]:
    return {
        "command_id": out.command_id,
        "message_id": out.message_id,
        "envelope_from": out.envelope_from,
        "recipients": list(out.recipients),
        "smtputf8": out.smtputf8,
    }


def rendered(name: str) -> RenderedMessage:
    cmd, kwargs = CORPUS[name]
    return render(cmd, fetch_blob=fetch, **kwargs)


@pytest.mark.parametrize("name", sorted(CORPUS))
def test_render_is_byte_identical_to_the_stored_message(name: str) -> None:
    out = rendered(name)
    assert out.data == (FIXTURES / f"{name}.eml").read_bytes()
    expected = json.loads((FIXTURES / "envelopes.json").read_text("utf-8"))[name]
    assert envelope(out) == expected


def test_the_corpus_covers_every_stored_message() -> None:
    stored = {p.stem for p in FIXTURES.glob("*.eml")}
    assert stored == set(CORPUS)


#: The stdlib policies the render used before its own policy (with the same line length).
REFERENCE_POLICY = policy.SMTP.clone(max_line_length=78)
REFERENCE_UTF8_POLICY = REFERENCE_POLICY.clone(utf8=True)

# Header text as a command may carry it: mostly ASCII (the policy's short-cut), spaces, tabs,
# specials, encoded-word look-alikes, some non-ASCII; no control or line-break characters
# (those are refused before any header is built, see test_smtp_render.py).
_ASCII_TEXT = st.lists(
    st.sampled_from(
        [chr(c) for c in range(0x20, 0x7F)]
        + [" "] * 8
        + ["\t", "word", "=?", "?=", "=?utf-8?q?J=C3=BC?=", "é", "用"]
    ),
    max_size=60,
).map("".join)
_ANY_TEXT = st.text(
    alphabet=st.characters(blacklist_categories=("Cc", "Cs", "Zl", "Zp")), max_size=90
)
_TEXT = st.one_of(_ASCII_TEXT, _ASCII_TEXT, _ANY_TEXT)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    subject=_TEXT,
    names=st.lists(st.one_of(st.none(), _TEXT), min_size=1, max_size=3),
    refs=st.lists(st.from_regex(r"[a-z0-9.]{1,30}@[a-z]{1,12}\.example", fullmatch=True)),
    html=st.booleans(),
    utf8=st.booleans(),
)
def test_render_matches_the_stdlib_policy(
    subject: str, names: list[str | None], refs: list[str], html: bool, utf8: bool
) -> None:
    """The render's policy writes what the stdlib's ``policy.SMTP`` writes, header for header."""
    local = "用户" if utf8 else "user"
    cmd = command(
        "c-prop",
        subject=subject,
        to=[{"name": n, "address": f"{local}{i}@example.org"} for i, n in enumerate(names)],
        references=refs,
        html_body=HTML if html else None,
    )
    kwargs: dict[str, Any] = {"unsubscribe": ["mailto:u@example.com", "https://example.com/u"]}
    ours = render(cmd, **kwargs)
    with (
        mock.patch.object(render_module, "SMTP_POLICY", REFERENCE_POLICY),
        mock.patch.object(render_module, "SMTPUTF8_POLICY", REFERENCE_UTF8_POLICY),
    ):
        reference = render(cmd, **kwargs)
    assert ours.smtputf8 is utf8
    assert ours.data == reference.data


def _write() -> None:
    FIXTURES.mkdir(parents=True, exist_ok=True)
    envelopes = {}
    for name in sorted(CORPUS):
        out = rendered(name)
        (FIXTURES / f"{name}.eml").write_bytes(out.data)
        envelopes[name] = envelope(out)
    text = json.dumps(envelopes, indent=2, ensure_ascii=False, sort_keys=True) + "\n"
    (FIXTURES / "envelopes.json").write_text(text, "utf-8")


if __name__ == "__main__":
    if sys.argv[1:] != ["--write"]:
        sys.exit(f"usage: {sys.argv[0]} --write")
    _write()
