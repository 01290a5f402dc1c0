"""The IMAP source with the S3 claim-check store: real Dovecot, real Kafka, S3Proxy.

The raw MIME and attachments land in the bucket as objects; the events reference them by s3://
URI, and what is read back through those URIs is exactly what the server holds.
"""

from __future__ import annotations

import base64
import hashlib
import os

from connectors.core.claimcheck.open import open_claim_check
from connectors.core.config import S3Settings, config_from_dict
from connectors.imap.source import ImapSource
from tests.integration.imap.imap_harness import ImapHarness, make_mail, wait_for


def test_raw_mails_and_attachments_go_to_the_bucket_and_read_back_exactly(
    imap: ImapHarness, s3_bucket: tuple[str, S3Settings]
) -> None:
    bucket, settings = s3_bucket
    attachment = os.urandom(300 * 1024)  # above the HEAD-first size
    with_attachment = (
        f"Message-ID: <att-{imap.unique}@example.com>\r\nSubject: report\r\n".encode()
        + b'MIME-Version: 1.0\r\nContent-Type: multipart/mixed; boundary="b"\r\n\r\n'
        + b"--b\r\nContent-Type: text/plain\r\n\r\nsee the file\r\n"
        + b'--b\r\nContent-Type: application/pdf; name="report.pdf"\r\n'
        + b"Content-Transfer-Encoding: base64\r\n\r\n"
        + base64.encodebytes(attachment).replace(b"\n", b"\r\n")
        + b"--b--\r\n"
    )
    mails = [make_mail(f"s3-{i}-{imap.unique}@example.com", f"s3 {i}") for i in range(24)]
    mails.append(with_attachment)
    imap.append(mails)
    config = imap.config_dict(batch_size=10)  # parse processes: each opens the bucket itself
    assert settings.secret_access_key is not None
    secret = settings.secret_access_key.get_secret_value()
    config["claim_check"] = {
        "url": f"s3://{bucket}/claims",
        "s3": settings.model_dump(mode="json") | {"secret_access_key": secret},
    }
    source = ImapSource.from_config(config_from_dict(config, env={}))
    source.start()
    try:
        wait_for(lambda: imap.cursor_at(25), "cursor at uid 25")
    finally:
        source.stop()

    events = [e.value for e in imap.events() if e.value is not None]
    assert len(events) == 25
    store = open_claim_check(f"s3://{bucket}/claims", s3=settings)
    by_subject = {e["subject"]: e for e in events}
    for i, raw in enumerate(mails[:24]):
        ref = by_subject[f"s3 {i}"]["raw_ref"]
        assert ref["uri"] == f"s3://{bucket}/claims/raw/{hashlib.sha256(raw).hexdigest()}"
        assert store.get(ref["uri"]) == raw
    report = by_subject["report"]
    assert store.get(report["raw_ref"]["uri"]) == with_attachment
    (pdf,) = report["attachments"]
    assert pdf["filename"] == "report.pdf" and pdf["size"] == len(attachment)
    assert pdf["sha256"] == hashlib.sha256(attachment).hexdigest()
    assert pdf["uri"].startswith(f"s3://{bucket}/claims/")
    assert store.get(pdf["uri"]) == attachment
