"""Our own SPF, DKIM, DMARC and ARC checks (``require: dmarc-pass`` / ``dkim-aligned``), with
keys made here, mail signed with dkimpy, and every record served by a dnslib server on loopback."""

from __future__ import annotations

import base64
import time
from collections.abc import Iterator

import dkim
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa

from streams.auth import (
    Authenticated,
    OwnChecks,
    check_authserv,
    sender_authentication,
    startup_notes,
)
from streams.config import StreamsSettings
from streams.errors import DnsTempError
from streams.guards import Skip
from streams.mail import MailView
from streams.pipeline import SKIPPED
from streams.resolver import Resolver
from streams.testing import WorkflowHarness, mail_record
from tests.support.dns_server import LoopbackDns

MX = "mx.example.com"
GOOD_IP = "192.0.2.10"  # in example.com's SPF record
BAD_IP = "203.0.113.7"


@pytest.fixture(scope="module")
def keys() -> dict[str, tuple[bytes, str]]:
    """Private key (PEM) and DKIM key record per signing domain."""
    out = {}
    for domain in ("example.com", "mail.example.com", "lists.example.org", "evil.example.net"):
        key = rsa.generate_private_key(public_exponent=65537, key_size=1024)
        pem = key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.TraditionalOpenSSL,
            serialization.NoEncryption(),
        )
        der = key.public_key().public_bytes(
            serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
        )
        out[domain] = (pem, f"v=DKIM1; k=rsa; p={base64.b64encode(der).decode()}")
    return out


@pytest.fixture(scope="module")
def dns_server() -> Iterator[LoopbackDns]:
    with LoopbackDns() as server:  # stopping takes ~1 s (socketserver's poll): once per module
        yield server


@pytest.fixture
def dns(dns_server: LoopbackDns, keys: dict[str, tuple[bytes, str]]) -> LoopbackDns:
    """The module's server with a fresh zone: keys, example.com's SPF and DMARC records."""
    with dns_server.lock:
        dns_server.zone.clear()
        dns_server.silent.clear()
        dns_server.questions.clear()
    for domain, (_, record) in keys.items():
        dns_server.txt(f"sel._domainkey.{domain}", record)
    dns_server.txt("example.com", f"v=spf1 ip4:{GOOD_IP}/32 -all")
    dns_server.txt("_dmarc.example.com", "v=DMARC1; p=reject")
    return dns_server


def checks(dns: LoopbackDns, **kwargs: object) -> OwnChecks:
    settings = {"trusted_received_by": MX, "nameserver": dns.nameserver} | kwargs
    settings.setdefault("dns_timeout_seconds", 0.5)
    return OwnChecks.from_settings(
        StreamsSettings.model_validate(
            {"from_address": {"address": "help@x.example"}, "require": "none", "auth": settings}
        ).auth
    )


def message(
    *,
    sender: str = "ann@example.com",
    ip: str = BAD_IP,
    return_path: str = "ann@example.com",
    extra_received: str = "",
    body: str = "Please approve.\r\n",
) -> bytes:
    received = f"Received: from mail.sender.example (mail.sender.example [{ip}])\r\n\tby {MX} (Postfix) with ESMTPS id 4Q2; Tue, 1 Dec 2026 10:00:00 +0000\r\n"
    return (
        f"Return-Path: <{return_path}>\r\n{received}{extra_received}"
        f"From: Ann <{sender}>\r\nTo: approvals@company.example\r\nSubject: expense\r\n"
        f"Message-ID: <m1@example.com>\r\nDate: Tue, 1 Dec 2026 10:00:00 +0000\r\n\r\n{body}"
    ).encode()


def sign(raw: bytes, keys: dict[str, tuple[bytes, str]], domain: str = "example.com") -> bytes:
    # Sign the part below our MTA's trace headers, as the sender's system did.
    head, _, rest = raw.partition(b"From: ")
    rest = b"From: " + rest
    signature = dkim.sign(rest, b"sel", domain.encode(), keys[domain][0])
    return head + signature + rest


def view(raw: bytes, sender: str = "ann@example.com") -> tuple[MailView, dict[str, bytes]]:
    store = {"mem://raw": raw}
    return_path = raw.split(b"\r\n", 1)[0].decode().partition(":")[2].strip()
    mail = MailView.from_record(
        mail_record(sender=sender, raw_uri="mem://raw", guard_headers={"return_path": return_path})
    )
    return mail, store


def judge(raw: bytes, own: OwnChecks, policy: str = "dmarc-pass") -> Authenticated | Skip:
    mail, store = view(raw)
    verdict = sender_authentication(
        mail, policy, authserv_id=None, load_raw=store.__getitem__, checks=own
    )  # type: ignore[arg-type]
    assert isinstance(verdict, Authenticated | Skip)
    return verdict


# -- DMARC through DKIM -----------------------------------------------------------------------


def test_an_aligned_dkim_signature_passes_dmarc(dns: LoopbackDns, keys: dict) -> None:
    verdict = judge(sign(message(), keys), checks(dns))
    assert isinstance(verdict, Authenticated) and verdict.method == "dmarc"
    assert verdict.dkim_domains == frozenset({"example.com"})


def test_a_signature_of_another_domain_does_not_pass_dmarc(dns: LoopbackDns, keys: dict) -> None:
    verdict = judge(sign(message(), keys, "evil.example.net"), checks(dns))
    assert isinstance(verdict, Skip) and "dmarc=fail" in verdict.reason
    assert "evil.example.net" in verdict.reason


def test_strict_dkim_alignment_of_the_record_refuses_a_subdomain_signer(
    dns: LoopbackDns, keys: dict
) -> None:
    raw = sign(message(), keys, "mail.example.com")
    assert isinstance(judge(raw, checks(dns)), Authenticated)  # relaxed (the default)
    dns.txt("_dmarc.example.com", "v=DMARC1; p=reject; adkim=s")
    verdict = judge(raw, checks(dns))
    assert isinstance(verdict, Skip) and "adkim=s" in verdict.reason


def test_a_domain_without_a_dmarc_record_has_no_dmarc_pass(dns: LoopbackDns, keys: dict) -> None:
    dns.zone.pop(("_dmarc.example.com", "TXT"))
    raw = sign(message(), keys)
    verdict = judge(raw, checks(dns))
    assert isinstance(verdict, Skip) and "dmarc=none" in verdict.reason
    # the weaker policy still takes it
    assert isinstance(judge(raw, checks(dns), "dkim-aligned"), Authenticated)


def test_the_record_of_the_organisational_domain_applies_to_a_subdomain(
    dns: LoopbackDns, keys: dict
) -> None:
    raw = sign(message(sender="ann@mail.example.com"), keys, "example.com")
    mail, store = view(raw, sender="ann@mail.example.com")
    verdict = sender_authentication(
        mail, "dmarc-pass", authserv_id=None, load_raw=store.__getitem__, checks=checks(dns)
    )
    assert isinstance(verdict, Authenticated) and verdict.from_domain == "mail.example.com"
    assert ("_dmarc.mail.example.com", "TXT") in dns.questions


# -- SPF against our border MTA's Received header -----------------------------------------------


def test_spoofed_from_from_an_ip_spf_refuses_is_not_authenticated(dns: LoopbackDns) -> None:
    verdict = judge(message(ip=BAD_IP), checks(dns))
    assert isinstance(verdict, Skip)
    assert "spf=fail for example.com" in verdict.reason and "dmarc=fail" in verdict.reason


def test_an_unsigned_mail_from_an_ip_spf_allows_passes_dmarc_by_spf(dns: LoopbackDns) -> None:
    verdict = judge(message(ip=GOOD_IP), checks(dns))
    assert isinstance(verdict, Authenticated) and verdict.method == "dmarc"


def test_a_forged_received_header_below_ours_is_not_used(dns: LoopbackDns) -> None:
    forged = (
        f"Received: from good ([{GOOD_IP}]) by {MX} (Postfix); Mon, 30 Nov 2026 10:00:00 +0000\r\n"
    )
    verdict = judge(message(ip=BAD_IP, extra_received=forged), checks(dns))
    assert isinstance(verdict, Skip) and "spf=fail" in verdict.reason


def test_without_the_trusted_received_host_spf_is_not_evaluated(dns: LoopbackDns) -> None:
    verdict = judge(message(ip=GOOD_IP), checks(dns, trusted_received_by=None))
    assert isinstance(verdict, Skip) and "spf not evaluated" in verdict.reason


def test_only_the_first_five_signatures_cost_a_lookup(dns: LoopbackDns, keys: dict) -> None:
    raw = message()
    for n in range(40):  # an attacker's pile of signatures on names nobody answers
        dns.silent.add(f"s{n}._domainkey.evil.example.net")
        head, _, rest = raw.partition(b"From: ")
        bogus = dkim.sign(
            b"From: " + rest, f"s{n}".encode(), b"evil.example.net", keys["evil.example.net"][0]
        )
        raw = head + bogus + b"From: " + rest
    verdict = judge(raw, checks(dns, dns_timeout_seconds=0.2))
    assert (
        isinstance(verdict, Skip) and "signatures beyond the first 5 not checked" in verdict.reason
    )
    asked = [name for name, _ in dns.questions if name.endswith("._domainkey.evil.example.net")]
    assert len(asked) == 5


# -- DNS: timeouts fail closed, the cache honours TTL and size -------------------------------------


def test_a_dmarc_record_lookup_timeout_is_a_temperror_not_a_pass(
    dns: LoopbackDns, keys: dict
) -> None:
    dns.silent.add("_dmarc.example.com")
    verdict = judge(sign(message(ip=GOOD_IP), keys), checks(dns, dns_timeout_seconds=0.3))
    assert isinstance(verdict, Skip) and "dmarc=temperror" in verdict.reason
    assert "timeout" in verdict.reason


def test_a_dkim_key_lookup_timeout_is_named_in_the_refusal(dns: LoopbackDns, keys: dict) -> None:
    dns.silent.add("sel._domainkey.example.com")
    verdict = judge(sign(message(), keys), checks(dns, dns_timeout_seconds=0.3), "dkim-aligned")
    assert isinstance(verdict, Skip) and "DNS temperror" in verdict.reason


def test_an_spf_lookup_timeout_is_no_pass(dns: LoopbackDns) -> None:
    dns.silent.add("example.com")
    verdict = judge(message(ip=GOOD_IP), checks(dns, dns_timeout_seconds=0.3))
    assert isinstance(verdict, Skip) and "spf=temperror" in verdict.reason


def test_the_cache_answers_until_the_ttl_runs_out_and_keeps_a_bounded_number() -> None:
    with LoopbackDns(ttl=1) as server:
        for name in ("a.example.com", "b.example.com"):
            server.txt(name, "v=spf1 -all")
        resolver = Resolver(server.nameserver, timeout_seconds=2, cache_size=10)
        assert resolver.txt("a.example.com") == resolver.txt("a.example.com") == [b"v=spf1 -all"]
        assert server.questions[("a.example.com", "TXT")] == 1
        time.sleep(1.2)  # past the 1 s TTL
        resolver.txt("a.example.com")
        assert server.questions[("a.example.com", "TXT")] == 2
        small = Resolver(server.nameserver, timeout_seconds=2, cache_size=1)
        for name in ("a.example.com", "b.example.com", "a.example.com"):
            small.txt(name)
        assert server.questions[("a.example.com", "TXT")] == 4  # evicted by b


# -- ARC: forwarded mail vouched for by a trusted sealer -----------------------------------------


def forwarded(keys: dict, *, sealer: str = "lists.example.org", tamper: bool = False) -> bytes:
    """ann@example.com's signed mail, passed through a list that rewrites the body (breaking the
    DKIM signature) and seals what it saw with ARC; then delivered from the list's IP."""
    original = sign(message(), keys).split(b"From: ", 1)
    signed = b"From: " + original[1]
    results = (
        f"Authentication-Results: {sealer}; dkim=pass header.d=example.com; "
        f"dmarc=pass header.from=example.com\r\n"
    ).encode()
    modified = results + signed.replace(
        b"Please approve.", b"Please approve.\r\n-- \r\nlist footer"
    )
    arc = dkim.arc_sign(modified, b"sel", sealer.encode(), keys[sealer][0], sealer.encode())
    sealed = b"".join(arc) + modified
    if tamper:
        sealed = sealed.replace(b"list footer", b"other footer")
    head = message(ip=BAD_IP).split(b"From: ", 1)[0]
    return head + sealed


def test_a_trusted_arc_sealer_vouches_for_forwarded_mail(dns: LoopbackDns, keys: dict) -> None:
    raw = forwarded(keys)
    assert isinstance(judge(raw, checks(dns)), Skip)  # DKIM broken by the list, SPF fails
    verdict = judge(raw, checks(dns, trusted_arc_sealers=["lists.example.org"]))
    assert isinstance(verdict, Authenticated) and verdict.method == "arc"


def test_an_arc_chain_of_an_untrusted_sealer_or_tampered_after_sealing_does_not(
    dns: LoopbackDns, keys: dict
) -> None:
    own = checks(dns, trusted_arc_sealers=["lists.example.org"])
    verdict = judge(forwarded(keys, sealer="evil.example.net"), own)
    assert isinstance(verdict, Skip) and "not a trusted sealer" in verdict.reason
    verdict = judge(forwarded(keys, tamper=True), own)
    assert isinstance(verdict, Skip) and "arc=fail" in verdict.reason


def test_a_chain_of_too_many_arc_sets_is_refused_without_lookups(dns: LoopbackDns) -> None:
    sets = "".join(
        f"ARC-Seal: i={i}; a=rsa-sha256; cv=pass; d=lists.example.org; s=sel; b=AAAA\r\n"
        for i in range(8, 0, -1)
    )
    raw = message().replace(b"From: ", sets.encode() + b"From: ", 1)
    verdict = judge(raw, checks(dns, trusted_arc_sealers=["lists.example.org"]))
    assert isinstance(verdict, Skip) and "8 ARC sets, more than 5" in verdict.reason
    assert ("sel._domainkey.lists.example.org", "TXT") not in dns.questions


# -- alignment uses the Public Suffix List --------------------------------------------------------


def test_a_public_suffix_signer_aligns_with_nobody() -> None:
    # d=co.uk "ends with" every .co.uk domain; the suffix heuristic aligned it with victim.co.uk.
    mail = MailView.from_record(
        mail_record(
            sender="boss@victim.co.uk",
            guard_headers={"authentication_results": [f"{MX}; dkim=pass header.d=co.uk"]},
        )
    )
    assert isinstance(check_authserv(mail, MX), Skip)


# -- the policy per workflow, through the pipeline ------------------------------------------------


def test_a_workflow_requiring_dmarc_pass_refuses_a_spoofed_sender_with_the_reason(
    dns: LoopbackDns, keys: dict
) -> None:
    store = {"mem://spoofed": message(ip=BAD_IP), "mem://signed": sign(message(), keys)}
    harness = WorkflowHarness(
        StreamsSettings.model_validate(
            {
                "from_address": {"address": "help@company.example"},
                "auth": {"trusted_received_by": MX, "nameserver": dns.nameserver},
                "rules": [{"workflow": "ticket_intake"}],
                "workflows": {"ticket_intake": {"require": "dmarc-pass"}},
            }
        ),
        load_raw=store.__getitem__,
    )
    refused = harness.deliver(
        mail_record(key="spoofed", subject="spoofed", raw_uri="mem://spoofed")
    )
    assert not refused.commands
    (event,) = [e for e in refused.events if e["status"] == SKIPPED]
    assert "spf=fail" in event["attributes"]["reason"]
    accepted = harness.deliver(mail_record(key="signed", subject="signed", raw_uri="mem://signed"))
    assert accepted.commands


def test_the_worker_says_at_start_when_spf_cannot_be_evaluated() -> None:
    base = {
        "from_address": {"address": "help@company.example"},
        "rules": [{"workflow": "approval"}],
        "workflows": {"approval": {"options": {"approver": "boss@company.example"}}},
    }
    notes = startup_notes(StreamsSettings.model_validate(base))
    assert "workflow approval: require dmarc-pass" in notes  # the default for approvals
    assert any("SPF is not evaluated for approval" in n for n in notes)
    named = StreamsSettings.model_validate({**base, "auth": {"trusted_received_by": MX}})
    assert not any("SPF" in n for n in startup_notes(named))


def test_without_a_system_resolver_every_lookup_is_a_temperror(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import dns.resolver

    def no_conf(self: object, *_: object) -> None:
        raise dns.resolver.NoResolverConfiguration("no /etc/resolv.conf")

    monkeypatch.setattr(dns.resolver.Resolver, "read_resolv_conf", no_conf)
    with pytest.raises(DnsTempError):
        Resolver().txt("_dmarc.example.com")


@pytest.mark.parametrize("policy", ["dmarc-pass", "dkim-aligned"])
def test_a_raw_mail_dkimpy_cannot_read_is_refused_not_a_crash(
    dns: LoopbackDns, policy: str
) -> None:
    # dkimpy raises MessageFormatError on a header block it cannot split; the guard said so
    # by raising out of the worker's thread instead of refusing the mail.
    raw = b"Return-Path: <ann@example.com>\r\ngarbage without colon\r\n\r\nbody\r\n"
    verdict = judge(raw, checks(dns), policy)
    assert isinstance(verdict, Skip) and "unreadable for DKIM" in verdict.reason
