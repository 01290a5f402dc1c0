"""DMARC (RFC 7489), evaluated by us: policy discovery, identifier alignment, the result.

Why our own and not a library: ``checkdmarc`` audits a domain's published records (no message
evaluation), ``authheaders`` evaluates a whole message but does its own DNS without a cache or a
resolver we can point at a server, and its bundled suffix list is from 2019. What DMARC asks of
a receiver is small: find the record (§6.6.3), compare domains (§3.1), combine the SPF and DKIM
results we already have (§4.2). The organisational domain comes from the Public Suffix List
through ``publicsuffixlist`` (maintained, ships a snapshot of the list: no network at run time).

Wire sample of a record this module reads (TXT at ``_dmarc.example.com``)::

    v=DMARC1; p=reject; adkim=s; aspf=r; rua=mailto:dmarc@example.com
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from functools import lru_cache
from typing import Literal

from publicsuffixlist import PublicSuffixList

from streams.errors import DnsTempError
from streams.resolver import Resolver

Alignment = Literal["r", "s"]
DmarcOutcome = Literal["pass", "fail", "none", "temperror", "permerror"]


@lru_cache(maxsize=1)
def _psl() -> PublicSuffixList:
    return PublicSuffixList()  # parses the bundled snapshot once (~50 ms)


def org_domain(domain: str) -> str | None:
    """The organisational domain (RFC 7489 §3.2): one label below the public suffix; None for a
    public suffix itself (``co.uk``) or an empty name.

    >>> org_domain("mail.example.co.uk"), org_domain("co.uk"), org_domain("Example.COM.")
    ('example.co.uk', None, 'example.com')
    """
    domain = domain.strip().lower().rstrip(".")
    return _org_of(domain) if domain else None


#: Organisational domains kept: each mail asks for its From domain's and its signers' (two to
#: four lookups of ~20 µs in the suffix list), and a deployment's mail comes from a set of
#: domains that repeats (issue 29: 8 % of the workflows' CPU in ``bench streams``).
ORG_DOMAIN_CACHE = 4096


@lru_cache(maxsize=ORG_DOMAIN_CACHE)
def _org_of(domain: str) -> str | None:
    found = _psl().privatesuffix(domain)
    return str(found) if found else None


def aligned(domain: str, from_domain: str, mode: Alignment = "r") -> bool:
    """Identifier alignment (RFC 7489 §3.1): strict = the same name; relaxed = the same
    organisational domain (never a public suffix: ``d=co.uk`` aligns with nobody).

    >>> aligned("mail.example.com", "example.com"), aligned("mail.example.com", "example.com", "s")
    (True, False)
    >>> aligned("co.uk", "victim.co.uk"), aligned("evil-example.com", "example.com")
    (False, False)
    """
    domain, from_domain = (
        domain.strip().lower().rstrip("."),
        from_domain.strip().lower().rstrip("."),
    )
    if not domain or not from_domain:
        return False
    if mode == "s":
        return domain == from_domain and org_domain(domain) is not None
    org = org_domain(domain)
    return org is not None and org == org_domain(from_domain)


@dataclass(frozen=True, slots=True)
class DmarcRecord:
    """The tags of a DMARC record we act on; ``domain`` is where it was found."""

    domain: str
    policy: str
    subdomain_policy: str
    adkim: Alignment = "r"
    aspf: Alignment = "r"


def parse_record(domain: str, text: str) -> DmarcRecord | None:
    """A DMARC record, or None when ``text`` is not one (RFC 7489 §6.3: ``v=DMARC1`` first).

    >>> parse_record("example.com", "v=DMARC1; p=reject; adkim=s")
    DmarcRecord(domain='example.com', policy='reject', subdomain_policy='reject', adkim='s', aspf='r')
    >>> parse_record("example.com", "v=spf1 -all") is None
    True
    """
    tags: dict[str, str] = {}
    for part in text.split(";"):
        name, sep, value = part.partition("=")
        if sep:
            tags.setdefault(name.strip().lower(), value.strip())
    first = text.split(";", 1)[0].replace(" ", "").lower()
    if first != "v=dmarc1":
        return None
    policy = tags.get("p", "").lower()
    if policy not in ("none", "quarantine", "reject"):
        # §6.6.3 step 6: an invalid or missing p= with a valid rua= means p=none; without a
        # valid rua= there is no usable record. Either way nothing gets stricter: read as none.
        policy = "none"
    subdomain = tags.get("sp", "").lower()
    adkim, aspf = tags.get("adkim", "r").lower(), tags.get("aspf", "r").lower()
    return DmarcRecord(
        domain=domain,
        policy=policy,
        subdomain_policy=subdomain if subdomain in ("none", "quarantine", "reject") else policy,
        adkim="s" if adkim == "s" else "r",
        aspf="s" if aspf == "s" else "r",
    )


def discover(from_domain: str, resolver: Resolver) -> DmarcRecord | None:
    """RFC 7489 §6.6.3: the record at ``_dmarc.<From domain>``, else at ``_dmarc.<org domain>``;
    a name with several records has none (step 5). DnsTempError propagates."""
    candidates = [from_domain]
    org = org_domain(from_domain)
    if org and org != from_domain:
        candidates.append(org)
    for domain in candidates:
        records = [
            r
            for r in (
                parse_record(domain, t.decode("utf-8", "replace"))
                for t in resolver.txt(f"_dmarc.{domain}")
            )
            if r is not None
        ]
        if len(records) == 1:
            return records[0]
        if len(records) > 1:
            return None
    return None


@dataclass(frozen=True, slots=True)
class DmarcResult:
    result: DmarcOutcome
    reason: str
    #: "spf" or "dkim": the aligned identifier that passed.
    aligned_by: str | None = None
    record: DmarcRecord | None = None


def evaluate(
    from_domain: str,
    *,
    spf_result: str | None,
    spf_domain: str | None,
    dkim_domains: Iterable[str],
    resolver: Resolver,
) -> DmarcResult:
    """RFC 7489 §4.2: pass when an SPF pass or a valid DKIM signature is aligned with the From
    domain in the record's mode; ``none`` when the domain publishes no record (no DMARC pass);
    ``temperror`` when the record could not be fetched (never a pass)."""
    if org_domain(from_domain) is None:
        return DmarcResult("permerror", f"From domain {from_domain!r} is a public suffix or empty")
    try:
        record = discover(from_domain, resolver)
    except DnsTempError as exc:
        return DmarcResult("temperror", f"DMARC record lookup failed: {exc}")
    if record is None:
        return DmarcResult("none", f"{from_domain} publishes no DMARC record")
    for domain in sorted(set(dkim_domains)):
        if aligned(domain, from_domain, record.adkim):
            return DmarcResult("pass", f"DKIM d={domain} aligned", "dkim", record)
    if spf_result == "pass" and spf_domain and aligned(spf_domain, from_domain, record.aspf):
        return DmarcResult("pass", f"SPF {spf_domain} aligned", "spf", record)
    spf_text = f"spf={spf_result or 'not evaluated'}" + (f" ({spf_domain})" if spf_domain else "")
    signers = ",".join(sorted(set(dkim_domains))) or "none"
    return DmarcResult(
        "fail",
        f"no aligned identifier (adkim={record.adkim} aspf={record.aspf}; {spf_text}; "
        f"valid DKIM d={signers})",
        None,
        record,
    )
