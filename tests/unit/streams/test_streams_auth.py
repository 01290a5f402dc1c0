"""Sender authentication: trusted Authentication-Results, and DKIM verified with dkimpy."""

from __future__ import annotations

import base64
from typing import Any

import dkim
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa

from streams.auth import (
    Authenticated,
    aligned,
    authserv_id_of,
    check_authserv,
    check_dkim,
    parse_results,
    sender_authentication,
)
from streams.guards import Skip
from streams.mail import MailView
from streams.testing import mail_record

MX = "mx.example.com"


def mail(
    *results: str,
    sender: str = "ann@example.com",
    raw_uri: str | None = None,
    return_path: str | None = None,
) -> MailView:
    return MailView.from_record(
        mail_record(
            sender=sender,
            raw_uri=raw_uri,
            guard_headers={"authentication_results": list(results), "return_path": return_path},
        )
    )


def passed(verdict: object, method: str) -> bool:
    return isinstance(verdict, Authenticated) and verdict.method == method


def test_dmarc_pass_from_our_authserv_id_passes() -> None:
    assert passed(check_authserv(mail(f"{MX}; dmarc=pass header.from=example.com"), MX), "dmarc")


def test_aligned_dkim_pass_passes_and_unaligned_does_not() -> None:
    assert passed(check_authserv(mail(f"{MX}; dkim=pass header.d=example.com"), MX), "dkim")
    verdict = check_authserv(mail(f"{MX}; dkim=pass header.d=evil.example.net"), MX)
    assert isinstance(verdict, Skip) and "dkim=pass" in verdict.reason


def test_aligned_spf_pass_passes() -> None:
    verdict = check_authserv(mail(f"{MX}; spf=pass smtp.mailfrom=bounce@mail.example.com"), MX)
    assert passed(verdict, "spf")


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


def test_headers_of_other_hosts_are_ignored_even_unparsable_ones() -> None:
    other = "mx.other.example; spf=pass smtp.helo=[203.0.113.7]"
    verdict = check_authserv(
        mail(";;; ===", other, f"{MX}; dmarc=pass header.from=example.com"), MX
    )
    assert passed(verdict, "dmarc")


# -- issue 17, item 1: the topmost header of our authserv-id is the only one that counts ------


@pytest.mark.parametrize(
    "ours",
    [
        f"{MX}; spf=fail smtp.mailfrom=x@attacker.example smtp.helo=[203.0.113.7]",
        f"{MX}; spf=fail smtp.mailfrom=<x@attacker.example>",
        f"{MX}; iprev=pass policy.iprev=2001:db8::1",
        f"(comment) {MX} (more); ===",
        f"{MX.upper()}; spf=pass smtp.helo=[203.0.113.7]",
    ],
)
def test_an_unparsable_topmost_header_of_ours_is_not_skipped_for_a_forged_one(ours: str) -> None:
    forged = f"{MX}; dkim=pass header.d=example.com; dmarc=pass header.from=example.com"
    verdict = check_authserv(mail(ours, forged), MX)
    assert verdict == Skip(
        "sender_authentication", f"the topmost Authentication-Results of {MX} is unparsable"
    )


def test_the_authserv_id_is_compared_without_case_and_after_comments() -> None:
    top = f" (by our MTA) {MX.upper()} 1 ; dmarc=pass header.from=example.com"
    assert passed(check_authserv(mail(top), MX), "dmarc")
    assert passed(check_authserv(mail(f"{MX}; dkim=pass header.d=example.com"), MX.upper()), "dkim")


def test_an_id_that_only_starts_like_ours_is_not_ours() -> None:
    lookalike = f"{MX}.attacker.example; dmarc=pass header.from=example.com"
    verdict = check_authserv(mail(lookalike), MX)
    assert verdict == Skip("sender_authentication", f"no Authentication-Results from {MX}")


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("mx.example.com; none", "mx.example.com"),
        ("mx.example.com 1; spf=pass", "mx.example.com"),
        ("\tMX.EXAMPLE.COM.;spf=pass", "mx.example.com"),
        ("(a (nested) comment \\) still) mx.example.com; none", "mx.example.com"),
        ('"mx.example.com" ; none', "mx.example.com"),
        ("mx.example.com(comment);none", "mx.example.com"),
        ("; dmarc=pass", None),
        ("(unclosed comment mx.example.com; none", None),
        ("", None),
    ],
)
def test_authserv_id_of_reads_the_first_token_after_cfws(value: str, expected: str | None) -> None:
    assert authserv_id_of(value) == expected


# -- issue 17, item 2: DMARC for the From domain; what the verdict tells the workflow ----------


def test_dmarc_pass_for_another_domain_does_not_authenticate() -> None:
    verdict = check_authserv(mail(f"{MX}; dmarc=pass header.from=attacker.example"), MX)
    assert verdict == Skip(
        "sender_authentication", f"{MX} did not authenticate example.com: dmarc=pass"
    )


def test_dmarc_pass_without_header_from_does_not_authenticate() -> None:
    assert isinstance(check_authserv(mail(f"{MX}; dmarc=pass"), MX), Skip)


def test_dmarc_header_from_is_compared_without_case() -> None:
    assert passed(check_authserv(mail(f"{MX}; dmarc=pass header.from=EXAMPLE.com"), MX), "dmarc")


def test_the_verdict_names_every_dkim_signer_and_the_envelope_sender() -> None:
    top = (
        f"{MX}; dkim=pass header.d=example.com; dkim=pass header.d=esp.example.net; "
        f"dkim=fail header.d=forged.example; spf=pass smtp.mailfrom=bounce@example.com; "
        f"dmarc=pass header.from=example.com"
    )
    verdict = check_authserv(mail(top, return_path="<other@example.org>"), MX)
    assert verdict == Authenticated(
        method="dmarc",
        from_domain="example.com",
        dkim_domains=frozenset({"example.com", "esp.example.net"}),
        envelope_from="bounce@example.com",
    )
    # Without an SPF result the envelope sender is the Return-Path.
    signed_only = check_authserv(
        mail(f"{MX}; dkim=pass header.d=example.com", return_path="<ann@example.com>"), MX
    )
    assert isinstance(signed_only, Authenticated)
    assert signed_only.envelope_from == "ann@example.com"


def test_alignment_is_relaxed_but_not_to_a_bare_tld() -> None:
    assert aligned("example.com", "mail.example.com")
    assert aligned("mail.example.com", "example.com")
    assert not aligned("com", "example.com")
    assert not aligned("example.net", "example.com")


def test_policy_none_passes_and_authserv_without_id_fails_closed() -> None:
    unsigned = mail()
    assert passed(sender_authentication(unsigned, "none", authserv_id=None), "none")
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
    assert passed(verdict, "dkim")
    assert isinstance(verdict, Authenticated) and verdict.dkim_domains == {"example.com"}


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


def test_a_header_seen_before_is_not_parsed_again_and_each_mail_gets_its_own_verdict() -> None:
    header = f"{MX}; dkim=pass header.d=cached.example; spf=fail smtp.mailfrom=x@cached.example"
    parse_results.cache_clear()
    first = check_authserv(mail(header, sender="ann@cached.example"), MX)
    second = check_authserv(mail(header, sender="bob@other.example"), MX)
    assert parse_results.cache_info().hits == 1 and parse_results.cache_info().misses == 1
    assert passed(first, "dkim")  # the cached header is only read: the verdict is per mail
    assert isinstance(second, Skip) and "dkim=pass" in second.reason


def test_an_unparsable_header_is_refused_every_time_not_cached() -> None:
    parse_results.cache_clear()
    for _ in range(2):
        verdict = check_authserv(mail(f"{MX}; dkim=pass (unclosed comment"), MX)
        assert isinstance(verdict, Skip) and "unparsable" in verdict.reason
    assert parse_results.cache_info().currsize == 0
