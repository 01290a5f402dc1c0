"""Malformed and exotic mails appended through IMAP: each yields an event or a DLQ record, and the
mailbox keeps going. Decodable subjects and file names arrive decoded."""

from __future__ import annotations

import base64
import os

from tests.integration.imap.imap_harness import ImapHarness, running, wait_for

HEAD = b"From: a@example.com\r\nTo: b@example.com\r\nDate: Sun, 29 Nov 2026 12:00:00 +0000\r\n"


def _b64(text: str, charset: str) -> str:
    return f"=?{charset}?b?{base64.b64encode(text.encode(charset)).decode()}?="


def corpus(tag: str) -> list[tuple[str, bytes, dict[str, object]]]:
    """(name, raw, expectations) - expectations on the event when it is decodable."""
    deep = b"".join(
        b'Content-Type: multipart/mixed; boundary="b%d"\r\n\r\n--b%d\r\n' % (i, i)
        for i in range(300)
    )
    big_attachment = base64.encodebytes(os.urandom(20 * 1024 * 1024))
    many_params = "; ".join(f"p{i}=v{i}" for i in range(20_000))
    return [
        (
            "gbk subject",
            HEAD
            + f"Message-ID: <gbk-{tag}@x>\r\nSubject: {_b64('会议通知', 'gbk')}\r\n\r\nhi\r\n".encode(),
            {"subject": "会议通知"},
        ),
        (
            "big5 subject",
            HEAD
            + f"Message-ID: <big5-{tag}@x>\r\nSubject: {_b64('測試郵件', 'big5')}\r\n\r\nhi\r\n".encode(),
            {"subject": "測試郵件"},
        ),
        (
            "gb2312 subject",
            HEAD
            + f"Message-ID: <gb2312-{tag}@x>\r\nSubject: {_b64('你好', 'gb2312')}\r\n\r\nx\r\n".encode(),
            {"subject": "你好"},
        ),
        (
            "latin-1 encoded word",
            HEAD
            + f"Message-ID: <latin-{tag}@x>\r\nSubject: =?iso-8859-1?q?caf=E9?=\r\n\r\nx\r\n".encode(),
            {"subject": "café"},
        ),
        (
            "raw 8-bit utf-8 header",
            HEAD
            + f"Message-ID: <8bit-{tag}@x>\r\n".encode()
            + "Subject: Grüße\r\n\r\nx\r\n".encode(),
            {"subject": "Grüße"},
        ),
        (
            "mislabelled charset body",
            HEAD
            + f"Message-ID: <mislabel-{tag}@x>\r\nSubject: body\r\n".encode()
            + b"Content-Type: text/plain; charset=us-ascii\r\n\r\n"
            + "naïve café\r\n".encode(),
            {},
        ),
        (
            "broken base64",
            HEAD
            + f"Message-ID: <b64-{tag}@x>\r\nSubject: broken\r\n".encode()
            + b"Content-Type: text/plain\r\nContent-Transfer-Encoding: base64\r\n\r\n"
            + b"!!!not*base64===\r\nYWJj=ZGVm\r\n",
            {"subject": "broken"},
        ),
        ("missing message-id 1", HEAD + b"Subject: no id one\r\n\r\nbody one\r\n", {}),
        ("missing message-id 2", HEAD + b"Subject: no id two\r\n\r\nbody two\r\n", {}),
        (
            "duplicate message-id headers",
            HEAD
            + f"Message-ID: <dup1-{tag}@x>\r\nMessage-ID: <dup2-{tag}@x>\r\nSubject: dup\r\n\r\nx\r\n".encode(),
            {},
        ),
        (
            "rfc 2231 file name",
            HEAD
            + f"Message-ID: <rfc2231-{tag}@x>\r\nSubject: report\r\n".encode()
            + b'MIME-Version: 1.0\r\nContent-Type: multipart/mixed; boundary="zz"\r\n\r\n'
            + b"--zz\r\nContent-Type: text/plain\r\n\r\nsee attached\r\n"
            + b"--zz\r\nContent-Type: application/pdf\r\n"
            + b"Content-Disposition: attachment; filename*=UTF-8''%E6%8A%A5%E5%91%8A.pdf\r\n"
            + b"Content-Transfer-Encoding: base64\r\n\r\nJVBERi0xLjQK\r\n--zz--\r\n",
            {"attachment": "报告.pdf"},
        ),
        (
            "deep mime nesting",
            HEAD + f"Message-ID: <deep-{tag}@x>\r\nSubject: deep\r\n".encode() + deep + b"leaf\r\n",
            {"subject": "deep"},
        ),
        (
            "huge header",
            HEAD
            + f"Message-ID: <huge-{tag}@x>\r\nSubject: huge\r\n".encode()
            + b"".join(b"X-Junk-%d: %s\r\n" % (i, b"j" * 200) for i in range(10_000))
            + b"\r\nbody\r\n",
            {},
        ),
        (
            "many content-type parameters",
            HEAD
            + f"Message-ID: <params-{tag}@x>\r\nSubject: params\r\n".encode()
            + f"Content-Type: text/plain; {many_params}\r\n\r\nx\r\n".encode(),
            {"subject": "params"},
        ),
        (
            "20 MB attachment",
            HEAD
            + f"Message-ID: <big-{tag}@x>\r\nSubject: big\r\n".encode()
            + b'MIME-Version: 1.0\r\nContent-Type: multipart/mixed; boundary="yy"\r\n\r\n'
            + b"--yy\r\nContent-Type: text/plain\r\n\r\nbig one\r\n"
            + b'--yy\r\nContent-Type: application/octet-stream; name="blob.bin"\r\n'
            + b"Content-Transfer-Encoding: base64\r\n\r\n"
            + big_attachment
            + b"--yy--\r\n",
            {"subject": "big", "attachment": "blob.bin"},
        ),
        ("not a mail at all", b"\x00\x01\x02 binary junk \xff\xfe\r\n\r\n\x00", {}),
    ]


def test_every_malformed_or_exotic_mail_gives_an_event_or_a_dlq_record(imap: ImapHarness) -> None:
    mails = corpus(imap.unique)
    imap.append(raw for _, raw, _ in mails)
    with running(imap, batch_size=4):
        wait_for(lambda: imap.cursor_at(len(mails)), "the whole corpus", timeout=300)
    events = imap.events()
    dlq = imap.dlq()
    by_uid = {r.value["source"]["uid"]: r for r in events if r.value is not None}
    dlq_uids = {int(r.headers["mailtap.source.uid"]) for r in dlq}
    for uid, (name, _, expected) in enumerate(mails, start=1):
        assert uid in by_uid or uid in dlq_uids, f"{name}: neither event nor DLQ record"
        record = by_uid.get(uid)
        if record is None or record.value is None:
            continue
        value = record.value
        if "subject" in expected:
            assert value["subject"] == expected["subject"], name
        if "attachment" in expected:
            names = [a["filename"] for a in value["attachments"]]
            assert expected["attachment"] in names, (name, names)
        assert record.raw_value is not None and len(record.raw_value) < 1_000_000, name
        if value["parse_error"]:
            assert uid in dlq_uids, f"{name}: parse_error without a DLQ record"
    # Distinct mails never share a key (the two mails without Message-ID included).
    keys = [by_uid[u].key for u in sorted(by_uid)]
    assert len(set(keys)) == len(keys)
    for record in dlq:
        assert record.headers["mailtap.error.kind"] in (b"parse_error", b"unparseable")
        assert record.headers["mailtap.source.account"] == b"acct"
    # The parser flags these; their DLQ records carry the raw MIME or its claim-check URI.
    flagged = {n: u for u, (n, _, _) in enumerate(mails, start=1)}
    for name in ("broken base64", "deep mime nesting", "huge header"):
        assert flagged[name] in dlq_uids, name
        assert by_uid[flagged[name]].value["parse_error"], name
    big = next(r.value for r in events if r.value and r.value["subject"] == "big")
    blob = next(a for a in big["attachments"] if a["filename"] == "blob.bin")
    assert blob["size"] == 20 * 1024 * 1024 and blob["uri"]
