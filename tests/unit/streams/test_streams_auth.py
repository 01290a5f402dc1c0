"""Sender authentication: trusted Authentication-Results, and DKIM verified with dkimpy."""

from __future__ import annotations

import base64
from typing import Any

import dkim
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa

from streams.auth import aligned, check_authserv, check_dkim, sender_authentication
from streams.guards import PASS, Skip
from streams.mail import MailView
from streams.testing import mail_record

MX = "mx.example.com"


def mail(*results: str, sender: str = "ann@example.com", raw_uri: str | None = None) -> MailView:
    return MailView.from_record(
        mail_record(
            sender=sender,
            raw_uri=raw_uri,
            guard_headers={"authentication_results": list(results)},
        )
    )


def test_dmarc_pass_from_our_authserv_id_passes() -> None:
    assert check_authserv(mail(f"{MX}; dmarc=pass header.from=example.com"), MX) == PASS


def test_aligned_dkim_pass_passes_and_unaligned_does_not() -> None:
    assert check_authserv(mail(f"{MX}; dkim=pass header.d=example.com"), MX) == PASS
    verdict = check_authserv(mail(f"{MX}; dkim=pass header.d=evil.example.net"), MX)
    assert isinstance(verdict, Skip) and "dkim=pass" in verdict.reason


def test_aligned_spf_pass_passes() -> None:
    assert check_authserv(mail(f"{MX}; spf=pass smtp.mailfrom=bounce@mail.example.com"), MX) == PASS


def test_failures_are_skipped_with_the_results_seen() -> None:
    verdict = check_authserv(mail(f"{MX}; spf=fail smtp.mailfrom=x@example.com; dmarc=fail"), MX)
    assert verdict == Skip(
        "sender_authentication", f"{MX} did not authenticate example.com: spf=fail dmarc=fail"
    )


def test_results_from_another_authserv_id_are_not_trusted() -> None:
    verdict = check_authserv(mail("mx.attacker.example; dmarc=pass header.from=example.com"), MX)
    assert verdict == Skip("sender_authentication", f"no Authentication-Results from {MX}")


def test_only_the_topmost_header_of_our_authserv_id_counts() -> None:
    # A forged header further down claiming our id must not override our MTA's verdict.
    top = f"{MX}; dmarc=fail header.from=example.com"
    forged = f"{MX}; dmarc=pass header.from=example.com"
    assert isinstance(check_authserv(mail(top, forged), MX), Skip)


def test_unparsable_headers_are_ignored() -> None:
    assert check_authserv(mail(";;; ===", f"{MX}; dmarc=pass"), MX) == PASS


def test_alignment_is_relaxed_but_not_to_a_bare_tld() -> None:
    assert aligned("example.com", "mail.example.com")
    assert aligned("mail.example.com", "example.com")
    assert not aligned("com", "example.com")
    assert not aligned("example.net", "example.com")


def test_policy_none_passes_and_authserv_without_id_fails_closed() -> None:
    unsigned = mail()
    assert sender_authentication(unsigned, "none", authserv_id=None) == PASS
    assert isinstance(sender_authentication(unsigned, "authserv", authserv_id=None), Skip)
    assert isinstance(sender_authentication(unsigned, "dkim", authserv_id=None), Skip)


# -- DKIM with a key generated here and a fake DNS --------------------------------------------


@pytest.fixture(scope="module")
def dkim_key() -> tuple[bytes, str]:
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    private = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.TraditionalOpenSSL,
        serialization.NoEncryption(),
    )
    public = key.public_key().public_bytes(
        serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    return private, f"v=DKIM1; k=rsa; p={base64.b64encode(public).decode()}"


RAW = (
    b"From: Ann <ann@example.com>\r\nTo: support@example.com\r\nSubject: Printer\r\n"
    b"Message-ID: <m1@example.com>\r\nDate: Mon, 2 Mar 2026 09:00:00 +0000\r\n\r\n"
    b"It prints blank pages.\r\n"
)


def signed(private: bytes, domain: bytes = b"example.com") -> bytes:
    sig = dkim.sign(RAW, b"sel", domain, private, include_headers=[b"from", b"to", b"subject"])
    return bytes(sig) + RAW


def dns_for(record: str) -> Any:
    def lookup(name: bytes, timeout: int = 5) -> bytes | None:
        return record.encode() if name.startswith(b"sel._domainkey.") else None

    return lookup


def test_valid_aligned_dkim_signature_passes(dkim_key: tuple[bytes, str]) -> None:
    private, txt = dkim_key
    raw = signed(private)
    verdict = check_dkim(
        mail(raw_uri="file:///raw"), {"file:///raw": raw}.__getitem__, dns_for(txt)
    )
    assert verdict == PASS


def test_tampered_body_fails_dkim(dkim_key: tuple[bytes, str]) -> None:
    private, txt = dkim_key
    raw = signed(private).replace(b"blank", b"black")
    verdict = check_dkim(mail(raw_uri="u"), {"u": raw}.__getitem__, dns_for(txt))
    assert isinstance(verdict, Skip) and "body hash mismatch" in verdict.reason


def test_tampered_signed_header_fails_dkim(dkim_key: tuple[bytes, str]) -> None:
    private, txt = dkim_key
    raw = signed(private).replace(b"Subject: Printer", b"Subject: Invoice")
    verdict = check_dkim(mail(raw_uri="u"), {"u": raw}.__getitem__, dns_for(txt))
    assert isinstance(verdict, Skip) and "d=example.com invalid" in verdict.reason


def test_valid_signature_of_another_domain_is_not_aligned(dkim_key: tuple[bytes, str]) -> None:
    private, txt = dkim_key
    raw = signed(private, b"other.example.net")
    verdict = check_dkim(mail(raw_uri="u"), {"u": raw}.__getitem__, dns_for(txt))
    assert isinstance(verdict, Skip) and "not aligned" in verdict.reason


def test_unsigned_mail_and_missing_raw_mime_are_skipped() -> None:
    unsigned = check_dkim(mail(raw_uri="u"), {"u": RAW}.__getitem__, dns_for("v=DKIM1; p="))
    assert isinstance(unsigned, Skip) and "no DKIM-Signature" in unsigned.reason
    no_raw = check_dkim(mail(), {}.__getitem__)
    assert isinstance(no_raw, Skip) and "claim-check" in no_raw.reason
