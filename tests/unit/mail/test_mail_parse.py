# ruff: noqa: RUF001  (full-width punctuation and dashes are the test data)
"""parse_mail on the fixture corpus (tests/fixtures/mail): decoded fields, guards, keys."""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path

import pytest

from connectors.core.claimcheck.local import LocalClaimCheckStore
from connectors.core.mail import KeyKind, ParsedMail, content_fingerprint

pytestmark = pytest.mark.unit

Parse = Callable[..., ParsedMail]
Corpus = Callable[[str], bytes]
CORPUS = Path(__file__).resolve().parents[2] / "fixtures" / "mail"
OBSERVED_AT = datetime(2025, 1, 10, 12, 0, 0, tzinfo=UTC)  # as in conftest.py


@pytest.mark.parametrize("path", sorted(CORPUS.glob("*.eml")), ids=lambda p: p.name)
def test_every_corpus_mail_gives_a_valid_event(parse: Parse, path: Path) -> None:
    raw = path.read_bytes()
    mail = parse(raw)
    assert mail.event["size"] == len(raw)
    assert mail.event["account"] == "ops"
    assert mail.event["source"] == {
        "kind": "IMAP",
        "folder": "INBOX",
        "uidvalidity": 7,
        "uid": 42,
        "modseq": None,
        "item_id": None,
        "change_key": None,
    }
    assert mail.event["flags"] == ["\\Seen"]
    assert mail.event["observed_at"] == OBSERVED_AT
    assert mail.key.startswith("ops/")


def test_gbk_mail(parse: Parse, corpus: Corpus) -> None:
    event = parse(corpus("gbk_subject.eml")).event
    assert event["subject"] == "关于报价单的通知"
    assert event["from"] == {"name": "张伟", "address": "zhang.wei@example.cn"}
    # The line break before a boundary belongs to the boundary (RFC 2046 5.1.1).
    assert event["text_body"] == "您好，附件是本月的报价单，请查收。"
    [attachment] = event["attachments"]
    assert attachment["filename"] == "报价单.pdf"
    assert attachment["content_type"] == "application/pdf"
    content = b"%PDF-1.4\n% fake pdf for tests\n"
    assert (attachment["size"], attachment["sha256"]) == (
        len(content),
        hashlib.sha256(content).hexdigest(),
    )
    assert event["date"] == datetime(2025, 1, 1, 1, 30, tzinfo=UTC)
    assert event["message_id"] == "20250101.gbk@mail.example.cn"


@pytest.mark.parametrize(
    ("name", "subject", "sender_name", "text"),
    [
        ("big5_subject.eml", "會議通知：下週二開會", "陳大文", "請準時出席會議。\r\n"),
        ("iso2022jp_subject.eml", "会議のお知らせ", "山田太郎", "よろしくお願いします。\r\n"),
        ("gb2312_mislabelled.eml", "朱镕基访谈", None, "朱镕基访谈全文\r\n"),
        ("utf8_split_words.eml", "Grüße aus Zürich – 你好", "René Dupont", "plain body\n"),
        ("eightbit_utf8_headers.eml", "Bestellung für Größe 42", "Jürgen Müller", None),
        ("eightbit_gbk_headers.eml", "关于下周的会议安排", None, "内容\r\n"),
    ],
)
def test_subjects_names_and_bodies_in_any_charset(
    parse: Parse, corpus: Corpus, name: str, subject: str, sender_name: str | None, text: str | None
) -> None:
    event = parse(corpus(name)).event
    assert event["subject"] == subject
    assert event["from"]["name"] == sender_name
    if text is not None:
        assert event["text_body"] == text
    assert event["parse_error"] is None


def test_8bit_body_without_charset(parse: Parse, corpus: Corpus) -> None:
    assert (
        parse(corpus("eightbit_utf8_headers.eml")).event["text_body"] == "Körper ohne charset\r\n"
    )


def test_recipients_with_encoded_names_and_empty_groups(parse: Parse, corpus: Corpus) -> None:
    event = parse(corpus("utf8_split_words.eml")).event
    assert event["to"] == [
        {"name": None, "address": "ops@example.com"},
        {"name": "李四", "address": "li.si@example.org"},
    ]
    assert event["cc"] == []


def test_wrong_and_unknown_charsets(parse: Parse, corpus: Corpus) -> None:
    event = parse(corpus("wrong_charsets.eml")).event
    # Adjacent encoded words are joined without the space between them (RFC 2047 6.2).
    assert event["subject"] == "Réunioncafé"
    assert event["text_body"] == "Réunion à Zürich"
    assert event["html_body"] == "<p>Café crème</p>"


def test_broken_base64(parse: Parse, corpus: Corpus) -> None:
    mail = parse(corpus("broken_base64.eml"))
    assert mail.event["text_body"] == "Héllo wörld, padding is missing!"
    by_name = {a["filename"]: a for a in mail.event["attachments"]}
    assert by_name["data.bin"]["size"] == len(b"Hello world")  # junk characters skipped
    assert by_name["trunc.bin"]["size"] > 0  # undecodable: kept as sent
    assert mail.parse_error == "undecodable base64 in a part"


def test_missing_message_id_keys_by_fingerprint(parse: Parse, corpus: Corpus) -> None:
    raw = corpus("missing_message_id.eml")
    mail = parse(raw)
    assert mail.key_kind is KeyKind.FINGERPRINT
    assert mail.key == f"ops/fp:{content_fingerprint(raw)}"
    assert mail.event["key_kind"] == "FINGERPRINT"
    assert mail.event["message_id"] is None
    folder_copy = parse(raw.replace(b"\r\n", b"\n"), source={"kind": "IMAP", "folder": "Archive"})
    assert folder_copy.key == mail.key


def test_duplicate_message_id_uses_the_first(parse: Parse, corpus: Corpus) -> None:
    mail = parse(corpus("duplicate_message_id.eml"))
    assert mail.key == "ops/mid:first@example.com"
    assert mail.event["message_id"] == "first@example.com"
    assert mail.key_kind is KeyKind.MESSAGE_ID


def test_rfc2231_and_rfc2047_file_names(parse: Parse, corpus: Corpus) -> None:
    attachments = parse(corpus("rfc2231_filenames.eml")).event["attachments"]
    assert [(a["filename"], a["content_type"]) for a in attachments] == [
        ("年度报告— 2024.pdf", "application/pdf"),
        ("résumé.csv", "text/csv"),
        ("logo été.png", "image/png"),
    ]
    assert attachments[0]["size"] == len(b"%PDF-1.4\n")


def test_dsn_report_fields_are_no_attachment_the_bounced_mail_is(
    parse: Parse, corpus: Corpus
) -> None:
    event = parse(corpus("dsn_report.eml")).event
    guards = event["guard_headers"]
    assert guards["content_type"].startswith("multipart/report; report-type=delivery-status")
    assert guards["return_path"] == "<>"
    assert guards["auto_submitted"] == "auto-replied"
    assert event["text_body"] == "Your message could not be delivered."
    types = [a["content_type"] for a in event["attachments"]]
    # The report fields are text of the mail's structure (in raw_ref), not a file.
    assert types == ["message/rfc822"]
    # The bounced original is not this mail's body.
    assert "original body" not in (event["text_body"] or "")


def test_guard_headers_threading_and_dates(parse: Parse, corpus: Corpus) -> None:
    event = parse(corpus("guard_headers.eml")).event
    assert event["guard_headers"] == {
        "auto_submitted": "auto-generated",
        "precedence": "bulk",
        "list_id": "Example list <list.lists.example.org>",
        "list_unsubscribe": "<mailto:unsub@lists.example.org>, <https://lists.example.org/unsub>",
        "return_path": "<bounce+123@lists.example.org>",
        "x_auto_response_suppress": "All",
        "content_type": "text/html; charset=utf-8",
        "authentication_results": [
            "mail.example.com; dkim=pass header.d=example.org; spf=pass "
            "smtp.mailfrom=lists.example.org",
            "other.example.net; dmarc=fail",
        ],
    }
    assert event["in_reply_to"] == "parent@example.org"
    assert event["references"] == ["root@example.org", "parent@example.org"]
    assert event["reply_to"] == [{"name": None, "address": "list@lists.example.org"}]
    assert event["html_body"] == "<p>digest</p>\r\n"
    assert event["text_body"] is None
    assert event["date"] == datetime(2025, 1, 6, 10, 0, tzinfo=UTC)


def test_source_and_change_are_passed_through(parse: Parse, corpus: Corpus) -> None:
    mail = parse(
        corpus("missing_message_id.eml"),
        account="shared",
        source={"kind": "EWS", "folder": "Inbox", "item_id": "AAMk=", "change_key": "CQAA"},
        flags=[],
        internal_date=datetime(2025, 1, 5, 8, 0, 1),  # naive: taken as UTC
        change="RESCANNED",
    )
    assert mail.key.startswith("shared/fp:")
    assert mail.event["source"]["item_id"] == "AAMk="
    assert mail.event["source"]["uid"] is None
    assert mail.event["change"] == "RESCANNED"
    assert mail.event["internal_date"] == datetime(2025, 1, 5, 8, 0, 1, tzinfo=UTC)


@pytest.mark.parametrize(
    ("header", "expected"),
    [
        (
            "Wed, 01 Jan 2025 09:30:00 +0800",
            datetime(2025, 1, 1, 9, 30, tzinfo=timezone(timedelta(hours=8))),
        ),
        ("1 Jan 2025 09:30:00 -0000", datetime(2025, 1, 1, 9, 30, tzinfo=UTC)),
        ("not a date", None),
        ("Wed, 32 Jan 2025 09:30:00 +0000", None),
        ("Wed, 01 Jan 99999 09:30:00 +0000", None),
    ],
)
def test_dates(parse: Parse, header: str, expected: datetime | None) -> None:
    event = parse(f"Date: {header}\r\nSubject: d\r\n\r\nx\r\n".encode()).event
    assert event["date"] == expected


def test_claim_check_receives_raw_mime_and_attachments(
    parse: Parse, corpus: Corpus, tmp_path: Path
) -> None:
    store = LocalClaimCheckStore(tmp_path)
    raw = corpus("gbk_subject.eml")
    mail = parse(raw, claim_check=store)
    raw_ref = mail.event["raw_ref"]
    assert raw_ref["sha256"] == hashlib.sha256(raw).hexdigest()
    assert raw_ref["size"] == len(raw)
    assert store.get(raw_ref["uri"]) == raw
    [attachment] = mail.event["attachments"]
    assert store.get(attachment["uri"]) == b"%PDF-1.4\n% fake pdf for tests\n"
    assert [ref.uri for ref in mail.blobs] == [raw_ref["uri"], attachment["uri"]]
    # Parsing again stores nothing new and yields the same event.
    again = parse(raw, claim_check=store)
    assert again.event == mail.event
    assert sum(1 for p in tmp_path.rglob("*") if p.is_file()) == 2


def test_without_a_store_there_are_no_uris(parse: Parse, corpus: Corpus) -> None:
    mail = parse(corpus("gbk_subject.eml"))
    assert mail.event["raw_ref"] is None
    assert mail.event["attachments"][0]["uri"] is None
    assert mail.blobs == ()


@pytest.mark.parametrize(
    "raw",
    [
        b"",
        b"\r\n\r\n",
        b"no header at all, just text",
        b"\x00\xff\xfe" * 1000,
        b"Subject: only a head",
        b"Content-Type: multipart/mixed\r\n\r\n--\r\n--",
        b'Content-Type: multipart/mixed; boundary="x"\r\n\r\nno parts',
        b"Content-Type: message/rfc822\r\n\r\n",
        b"From: (((((\r\nTo: <<<@@>>>\r\nSubject: =?utf-8?b?@@@?=\r\nDate: ,,,\r\n\r\n",
        b'Content-Type: text/plain; charset="\xff\xfe"\r\n\r\n\xe4\xb8',
    ],
)
def test_garbage_never_raises(parse: Parse, raw: bytes) -> None:
    mail = parse(raw)
    assert mail.event["size"] == len(raw)
    assert mail.key.startswith("ops/fp:")
