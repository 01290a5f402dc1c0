"""Our own SPF, DKIM and ARC checks on the raw MIME, through one :class:`~streams.resolver.Resolver`.

- **SPF** (pyspf, the RFC 7208 reference implementation used by the Python milters): against
  the connecting IP of the *trusted* ``Received`` header — the topmost one added ``by`` the
  host the deployment names (``streams.auth.trusted_received_by``, our border MTA). Headers
  below it were written before mail reached us and may be forged; without that setting SPF is
  not evaluated at all (a header-only guess of the IP would let the sender choose it). The
  envelope sender is the ``Return-Path`` the delivering agent wrote.
- **DKIM** and **ARC** (dkimpy, already a dependency): every signature, keys from our resolver.
  An ARC chain counts only when it validates and its newest seal (``ARC-Seal`` with the highest
  ``i=``) was made by a domain in ``streams.auth.trusted_arc_sealers``; then that sealer's
  ``ARC-Authentication-Results`` stands for what it saw before it forwarded the mail.

Wire sample of the trusted hop (Postfix)::

    Received: from mail.sender.example (mail.sender.example [203.0.113.7])
        by mx.example.com (Postfix) with ESMTPS id 4Q2; Tue, 1 Dec 2026 10:00:00 +0000
"""

from __future__ import annotations

import contextvars
import ipaddress
import logging
import re
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from email.parser import BytesHeaderParser
from email.policy import compat32
from typing import Any

import dkim
import spf

from streams.resolver import LookupLog, Resolver, dkim_dnsfunc, spf_lookup

log = logging.getLogger(__name__)

# pyspf resolves through its module-level ``DNSLookup``; there is no per-query hook. We route it
# through the resolver of the check in progress (a context variable, so threads do not mix) and
# keep pyspf's own lookup for anyone else in the process.
_SPF_LOOKUP: contextvars.ContextVar[Callable[..., Any] | None] = contextvars.ContextVar(
    "mailtap_spf_lookup", default=None
)
_PYSPF_LOOKUP = spf.DNSLookup


def _dispatching_lookup(name: str, qtype: str, *args: Any, **kwargs: Any) -> Any:
    lookup = _SPF_LOOKUP.get()
    return (lookup or _PYSPF_LOOKUP)(name, qtype, *args, **kwargs)


spf.DNSLookup = _dispatching_lookup


@contextmanager
def _spf_through(resolver: Resolver) -> Iterator[None]:
    token = _SPF_LOOKUP.set(spf_lookup(resolver))
    try:
        yield
    finally:
        _SPF_LOOKUP.reset(token)


def header_values(raw: bytes, name: str) -> list[str]:
    """Every ``name`` header of the raw mail, top first, unfolded."""
    headers = BytesHeaderParser(policy=compat32).parsebytes(raw)
    return [re.sub(r"\r?\n[ \t]+", " ", str(v)) for v in headers.get_all(name) or ()]


@dataclass(frozen=True, slots=True)
class ConnectingHop:
    """What our border MTA recorded about the client that handed it the mail."""

    ip: str
    helo: str


_BY = re.compile(r"(?:^|\s)by\s+([^\s;()]+)", re.IGNORECASE)
_FROM = re.compile(r"^\s*from\s+([^\s;()]+)", re.IGNORECASE)
_LITERAL = re.compile(r"\[(?:IPv6:)?([0-9A-Fa-f:.]+)\]")


def trusted_hop(received: list[str], trusted_by: str) -> ConnectingHop | None:
    """The client of the topmost ``Received`` written ``by`` ``trusted_by``; None when there is
    none or its from-clause names no IP literal.

    >>> trusted_hop(["from a (b [192.0.2.1]) by mx.example.com; Tue",
    ...              "from x ([203.0.113.66]) by mx.example.com; forged"], "MX.example.com")
    ConnectingHop(ip='192.0.2.1', helo='a')
    """
    wanted = trusted_by.strip().lower().rstrip(".")
    for value in received:
        by = _BY.search(value)
        if by is None or by.group(1).lower().rstrip(".") != wanted:
            continue
        clause = value[: by.start()]
        helo = _FROM.match(clause)
        for literal in reversed(_LITERAL.findall(clause)):
            try:
                ip = ipaddress.ip_address(literal)
            except ValueError:
                continue
            return ConnectingHop(str(ip), helo.group(1) if helo else "")
        return None  # ours, but unreadable: never fall through to a header below it
    return None


@dataclass(frozen=True, slots=True)
class SpfResult:
    result: str  # pass fail softfail neutral none permerror temperror
    domain: str
    explanation: str


def check_spf(hop: ConnectingHop, mail_from: str, resolver: Resolver) -> SpfResult:
    """RFC 7208 ``check_host`` for the envelope sender (or ``postmaster@<helo>`` when null)."""
    sender = mail_from or f"postmaster@{hop.helo}"
    domain = sender.rpartition("@")[2].lower().rstrip(".")
    with _spf_through(resolver):
        result, explanation = spf.check2(
            i=hop.ip, s=sender, h=hop.helo or domain, timeout=resolver.timeout_seconds * 4
        )
    return SpfResult(str(result), domain, str(explanation))


@dataclass
class DkimOutcome:
    valid: set[str] = field(default_factory=set)
    failures: list[str] = field(default_factory=list)


#: Signatures verified per mail (the topmost first). Each costs a key lookup of up to the DNS
#: timeout, and the worker handles one mail at a time: a mail with a hundred signatures on
#: silent name servers would stall it for minutes. RFC 6376 §6.1 lets verifiers set a limit;
#: real mail carries one to three (the author's domain, its ESP, a forwarder).
MAX_DKIM_SIGNATURES = 5


def verify_dkim(raw: bytes, dnsfunc: Callable[..., Any]) -> DkimOutcome:
    """Verify the DKIM-Signatures, at most :data:`MAX_DKIM_SIGNATURES` (keys through dkimpy's
    ``dnsfunc``, e.g. :func:`~streams.resolver.dkim_dnsfunc`); ``valid`` holds the ``d=`` of
    those that verified."""
    out = DkimOutcome()
    try:
        verifier = dkim.DKIM(raw)
    except dkim.DKIMException as exc:  # not RFC 5322 shaped (dkimpy's MessageFormatError)
        out.failures.append(f"message unreadable for DKIM: {exc}")
        return out
    count = sum(1 for name, _ in verifier.headers if name.lower() == b"dkim-signature")
    if count > MAX_DKIM_SIGNATURES:
        out.failures.append(
            f"{count - MAX_DKIM_SIGNATURES} signatures beyond the first 5 not checked"
        )
        count = MAX_DKIM_SIGNATURES
    for idx in range(count):
        try:
            ok = verifier.verify(idx=idx, dnsfunc=dnsfunc)
        except dkim.DKIMException as exc:
            out.failures.append(f"signature {idx}: {exc}")
            continue
        domain = (verifier.domain or b"").decode("ascii", "replace").lower()
        if ok:
            out.valid.add(domain)
        else:
            out.failures.append(f"d={domain} invalid")
    return out


#: ARC sets validated per mail: one per forwarding hop; real chains have one to three.
MAX_ARC_SETS = 5


@dataclass(frozen=True, slots=True)
class ArcOutcome:
    """``trusted_results``: the newest ARC-Authentication-Results value (without ``i=``) when
    the chain validates and its newest sealer is trusted; else None and ``reason`` says why."""

    trusted_results: str | None
    sealer: str | None
    reason: str


def check_arc(
    raw: bytes, resolver: Resolver, seen: LookupLog, trusted_sealers: frozenset[str]
) -> ArcOutcome:
    """Validate the ARC chain (RFC 8617 §5.2) with dkimpy; trust it only from a named sealer."""
    if not trusted_sealers:
        return ArcOutcome(None, None, "arc not consulted (no trusted sealers)")
    seals = len(header_values(raw, "ARC-Seal"))
    if seals > MAX_ARC_SETS:  # each set costs two key lookups; dkimpy allows 50 (RFC 8617 §4.2.1)
        return ArcOutcome(None, None, f"arc=fail ({seals} ARC sets, more than {MAX_ARC_SETS})")
    try:
        cv, results, reason = dkim.arc_verify(raw, dnsfunc=dkim_dnsfunc(resolver, seen))
    except dkim.DKIMException as exc:  # raised while reading the message, before verifying
        return ArcOutcome(None, None, f"arc=fail ({exc})")
    if cv != dkim.CV_Pass or not results:
        text = "none" if cv == dkim.CV_None else f"fail ({reason})"
        return ArcOutcome(None, None, f"arc={text}")
    newest = max(results, key=lambda r: int(r["instance"]))
    sealer = newest["as-domain"].decode("ascii", "replace").lower()
    if sealer not in trusted_sealers:
        return ArcOutcome(None, sealer, f"arc=pass by {sealer}, not a trusted sealer")
    for value in header_values(raw, "ARC-Authentication-Results"):
        instance, sep, rest = value.partition(";")
        if sep and instance.strip().lower().replace(" ", "") == f"i={newest['instance']}":
            return ArcOutcome(rest.strip(), sealer, f"arc=pass by {sealer}")
    return ArcOutcome(None, sealer, f"arc=pass by {sealer} without its results")
