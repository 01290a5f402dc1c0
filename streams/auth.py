"""Sender authentication guard: a workflow only runs on mail whose From domain is vouched for.

Policies (``streams.require``, per workflow ``streams.workflows.<name>.require``; the old key
``auth_policy`` with ``authserv``/``dkim`` is read as ``trusted-ar``/``dkim-aligned``):

- ``none``: no check (for mailboxes only trusted systems can write to, or a demo).
- ``trusted-ar``: trust the ``Authentication-Results`` header (RFC 8601) written by *our* border
  MTA, identified by its authserv-id. **The topmost header carrying that id is the only one
  that counts**: RFC 8601 §5 has the MTA delete headers claiming its id from incoming mail and
  add its own on top, so anything below may be forged by the sender. Which header is "ours" is
  decided on the text (:func:`authserv_id_of`: the first token after white space and comments),
  not by the parser, and if that header cannot be parsed the mail is **not** authenticated:
  skipping it would let a forged header below it count (an attacker can make our MTA's header
  unparseable through values it controls, e.g. ``smtp.helo=[203.0.113.7]``).
  It passes on ``dmarc=pass`` *for the From domain* (``header.from`` equal to it), or on
  ``dkim=pass`` / ``spf=pass`` aligned with the From domain (relaxed alignment, RFC 7489 §3.1,
  organisational domains from the Public Suffix List: :func:`streams.dmarc.aligned`).
- ``dkim-aligned``: verify the DKIM signatures ourselves with dkimpy on the raw MIME from the
  claim-check store, and require one that passes and is aligned (relaxed) with the From domain.
- ``dmarc-pass``: our own DMARC evaluation (:mod:`streams.dmarc`): DKIM as above, SPF against
  the IP our border MTA recorded (:mod:`streams.sender_checks`; only with
  ``streams.auth.trusted_received_by``), alignment as the From domain's DMARC record says. A
  domain without a record has no DMARC pass. When DMARC fails, a validated ARC chain sealed by
  one of ``streams.auth.trusted_arc_sealers`` lets that sealer's results vouch (forwarded mail).

The last two read the claim-check store and DNS (:mod:`streams.resolver`: cache, timeouts);
the app runs them in a thread. A DNS failure is never a pass: the skip reason names it.

A pass yields :class:`Authenticated`, which the workflow sees as ``ctx.authentication``: the
DKIM domains that signed (the approval workflow can require one) and the envelope sender.
DMARC, DKIM and SPF authenticate a *domain*, never a person: anyone who may send as
``someone@example.com`` passes for every address of example.com.

Wire sample of a header this module reads::

    Authentication-Results: mx.example.com; dkim=pass header.d=example.com;
        spf=pass smtp.mailfrom=ann@example.com; dmarc=pass header.from=example.com
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import authres

from streams.config import AuthPolicy, AuthSettings, StreamsSettings
from streams.dmarc import aligned, evaluate
from streams.guards import Pass, Skip, Verdict
from streams.mail import MailView, domain_of
from streams.resolver import LookupLog, Resolver, dkim_dnsfunc
from streams.sender_checks import (
    SpfResult,
    check_arc,
    check_spf,
    header_values,
    trusted_hop,
    verify_dkim,
)

__all__ = [
    "Authenticated",
    "OwnChecks",
    "aligned",
    "authserv_id_of",
    "check_authserv",
    "check_dkim",
    "check_dmarc",
    "domain_of",
    "needs_io",
    "sender_authentication",
    "startup_notes",
]

log = logging.getLogger(__name__)

GUARD = "sender_authentication"

#: Reads the raw MIME of a mail by claim-check URI (``ClaimCheckStore.get``).
RawLoader = Callable[[str], bytes]
#: dkimpy's DNS TXT lookup signature; injectable so tests need no DNS.
DnsFunc = Callable[..., Any]


@dataclass(frozen=True, slots=True)
class Authenticated(Pass):
    """The mail passed the sender-authentication policy; what was established.

    ``method``: what vouched for the From domain (``dmarc``, ``dkim``, ``spf``; ``none`` under
    policy ``none``, where nothing was checked). ``dkim_domains``: the ``d=`` of every DKIM
    signature that verified, aligned or not. ``envelope_from``: the SMTP MAIL FROM our MTA
    reported (``smtp.mailfrom``), else the mail's Return-Path.
    """

    method: str = "none"
    from_domain: str = ""
    dkim_domains: frozenset[str] = frozenset()
    envelope_from: str | None = None


def _skip_cfws(value: str, i: int) -> int:
    """Index of the first character at or after ``i`` that is neither white space nor inside a
    comment (RFC 5322 §3.2.2: comments nest, ``\\`` quotes one character)."""
    depth = 0
    while i < len(value):
        ch = value[i]
        if ch == "\\" and depth:
            i += 2
            continue
        if ch == "(":
            depth += 1
        elif ch == ")" and depth:
            depth -= 1
        elif not depth and not ch.isspace():
            return i
        i += 1
    return i


def authserv_id_of(value: str) -> str | None:
    """The authserv-id of a raw ``Authentication-Results`` value, read as text, lower-cased.

    RFC 8601 §2.2: ``[CFWS] authserv-id [CFWS authres-version] ( no-result / 1*resinfo )``,
    the id being a ``value`` (a token or a quoted-string). Read without the full parser so that
    a header the parser refuses is still recognised as our MTA's.

    >>> authserv_id_of(" (our MTA) MX.Example.COM 1; spf=pass smtp.helo=[203.0.113.7]")
    'mx.example.com'
    >>> authserv_id_of('"mx.example.com"; none'), authserv_id_of(";;; ===")
    ('mx.example.com', None)
    """
    i = _skip_cfws(value, 0)
    if i < len(value) and value[i] == '"':
        end, chars = i + 1, []
        while end < len(value) and value[end] != '"':
            if value[end] == "\\":
                end += 1
            chars.append(value[end : end + 1])
            end += 1
        found = "".join(chars)
    else:
        end = i
        while end < len(value) and not value[end].isspace() and value[end] not in ";(":
            end += 1
        found = value[i:end]
    return found.lower().rstrip(".") or None


#: Parsed headers kept: the same border MTA writes the same text for every mail of a sender
#: whose signature and envelope repeat, and parsing took ~11 % of a worker's CPU (issue 29).
#: The parsed objects are only read (:func:`_vouch`), so sharing them is safe.
PARSED_RESULTS_CACHE = 1024


@lru_cache(maxsize=PARSED_RESULTS_CACHE)
def parse_results(text: str) -> Any:
    """An Authentication-Results value parsed by ``authres`` (RFC 8601); raises what it raises
    (an error is not cached: attacker-controlled text is parsed again, and refused again)."""
    return authres.AuthenticationResultsHeader.parse_value(text)


def _trusted_header(mail: MailView, authserv_id: str) -> Any | Skip:
    """The topmost header of ``authserv_id``, parsed; a Skip when there is none or it is bad."""
    wanted = authserv_id.lower().rstrip(".")
    for raw in mail.guard_headers.authentication_results:
        if authserv_id_of(raw) != wanted:
            continue  # another host's header (or garbage): never ours, whatever it says
        try:
            header = parse_results(raw.strip())
        # Attacker-controlled text: whatever the parser raises, the mail is not authenticated.
        except Exception as exc:
            log.info(
                "unparsable Authentication-Results of %s in %s: %r", authserv_id, mail.key, str(exc)
            )
            return Skip(GUARD, f"the topmost Authentication-Results of {authserv_id} is unparsable")
        if str(header.authserv_id).lower().rstrip(".") != wanted:
            return Skip(GUARD, f"the topmost Authentication-Results of {authserv_id} is unparsable")
        return header
    return Skip(GUARD, f"no Authentication-Results from {authserv_id}")


def check_authserv(mail: MailView, authserv_id: str) -> Verdict:
    """Policy ``trusted-ar``: the topmost Authentication-Results of ``authserv_id`` must vouch."""
    if mail.sender is None:
        return Skip(GUARD, "no From address to authenticate")
    header = _trusted_header(mail, authserv_id)
    if isinstance(header, Skip):
        return header
    from_domain = domain_of(mail.sender.address)
    verdict = _vouch(header, from_domain, _return_path(mail))
    if isinstance(verdict, Authenticated):
        return verdict
    return Skip(GUARD, f"{authserv_id} did not authenticate {from_domain}: {verdict}")


def _vouch(header: Any, from_domain: str, return_path: str | None) -> Authenticated | str:
    """What a trusted results header (ours, or a trusted ARC sealer's) says about the From
    domain: an Authenticated, or the results seen (``spf=fail dmarc=fail``) when it does not."""
    seen: list[str] = []
    methods: list[str] = []
    dkim_domains: set[str] = set()
    envelope_from: str | None = None
    for result in header.results:
        method, outcome = str(result.method).lower(), str(result.result).lower()
        seen.append(f"{method}={outcome}")
        props = {f"{p.type}.{p.name}".lower(): str(p.value) for p in result.properties}
        if method == "spf" and props.get("smtp.mailfrom"):
            envelope_from = props["smtp.mailfrom"].strip().strip("<>")
        if outcome != "pass":
            continue
        if method == "dmarc" and domain_of(props.get("header.from", "")) == from_domain:
            methods.append("dmarc")
        elif method == "dkim":
            signer = domain_of(props.get("header.d", ""))
            if signer:
                dkim_domains.add(signer)
            if aligned(signer, from_domain):
                methods.append("dkim")
        elif method == "spf" and aligned(domain_of(props.get("smtp.mailfrom", "")), from_domain):
            methods.append("spf")
    if methods:
        return Authenticated(
            method=min(methods, key=("dmarc", "dkim", "spf").index),
            from_domain=from_domain,
            dkim_domains=frozenset(dkim_domains),
            envelope_from=envelope_from or return_path,
        )
    return " ".join(seen) or "none"


def _return_path(mail: MailView) -> str | None:
    value = (mail.guard_headers.return_path or "").strip().strip("<>").strip()
    return value or None


@dataclass(frozen=True)
class OwnChecks:
    """What our own checks need: the resolver and the deployment's trust anchors."""

    resolver: Resolver
    trusted_received_by: str | None = None
    trusted_arc_sealers: frozenset[str] = frozenset()

    @classmethod
    def from_settings(cls, settings: AuthSettings) -> OwnChecks:
        return cls(
            resolver=Resolver(
                settings.nameserver, settings.dns_timeout_seconds, settings.dns_cache_size
            ),
            trusted_received_by=settings.trusted_received_by,
            trusted_arc_sealers=frozenset(s.strip().lower() for s in settings.trusted_arc_sealers),
        )


def _temperrors(seen: LookupLog) -> str:
    return f"; DNS temperror: {'; '.join(seen.temperrors)}" if seen.temperrors else ""


def check_dkim(
    mail: MailView,
    load_raw: RawLoader,
    dnsfunc: DnsFunc | None = None,
    *,
    checks: OwnChecks | None = None,
) -> Verdict:
    """Policy ``dkim-aligned``: one valid DKIM signature whose ``d=`` is aligned with the From
    domain. Keys come from ``dnsfunc`` when given (tests), else from the checks' resolver."""
    if mail.sender is None:
        return Skip(GUARD, "no From address to authenticate")
    if mail.raw_uri is None:
        return Skip(GUARD, "raw MIME not in the claim-check store, cannot verify DKIM")
    raw = load_raw(mail.raw_uri)
    from_domain = domain_of(mail.sender.address)
    seen = LookupLog()
    if dnsfunc is None:
        dnsfunc = dkim_dnsfunc(checks.resolver if checks else _system_resolver(), seen)
    outcome = verify_dkim(raw, dnsfunc)
    if any(aligned(domain, from_domain) for domain in outcome.valid):
        return Authenticated(
            method="dkim",
            from_domain=from_domain,
            dkim_domains=frozenset(outcome.valid),
            envelope_from=_return_path(mail),
        )
    failures = outcome.failures + [f"d={d} not aligned" for d in sorted(outcome.valid)]
    detail = "; ".join(failures) if failures else "no DKIM-Signature"
    return Skip(GUARD, f"DKIM did not authenticate {from_domain}: {detail}{_temperrors(seen)}")


def check_dmarc(mail: MailView, load_raw: RawLoader, checks: OwnChecks) -> Verdict:
    """Policy ``dmarc-pass``: our own DMARC evaluation, then a trusted ARC sealer's results."""
    if mail.sender is None:
        return Skip(GUARD, "no From address to authenticate")
    if mail.raw_uri is None:
        return Skip(GUARD, "raw MIME not in the claim-check store, cannot evaluate DMARC")
    raw = load_raw(mail.raw_uri)
    from_domain = domain_of(mail.sender.address)
    # The envelope sender the delivering agent wrote; the event carries it, the raw mail too.
    return_path = _return_path(mail) or next(
        (v.strip().strip("<>").strip() or None for v in header_values(raw, "Return-Path")), None
    )
    seen = LookupLog()
    try:
        return _dmarc_verdict(raw, mail, from_domain, return_path, checks, seen)
    # The raw mail is anyone's bytes: whatever a library raises on it, the mail is not
    # authenticated and the worker goes on (a crash here would replay the mail forever).
    except Exception as exc:
        log.warning("sender checks failed on %s: %r", mail.key, exc)
        return Skip(GUARD, f"DMARC could not be evaluated for {from_domain}: {exc!r}")


def _dmarc_verdict(
    raw: bytes,
    mail: MailView,
    from_domain: str,
    return_path: str | None,
    checks: OwnChecks,
    seen: LookupLog,
) -> Verdict:
    dkim_outcome = verify_dkim(raw, dkim_dnsfunc(checks.resolver, seen))
    spf = _spf(raw, return_path, checks)
    dmarc = evaluate(
        from_domain,
        spf_result=spf.result if spf else None,
        spf_domain=spf.domain if spf else None,
        dkim_domains=dkim_outcome.valid,
        resolver=checks.resolver,
    )
    if dmarc.result == "pass":
        return Authenticated(
            method="dmarc",
            from_domain=from_domain,
            dkim_domains=frozenset(dkim_outcome.valid),
            envelope_from=return_path,
        )
    spf_text = (
        f"spf={spf.result} for {spf.domain}"
        if spf
        else "spf not evaluated (streams.auth.trusted_received_by unset or its Received missing)"
    )
    reason = f"dmarc={dmarc.result}: {dmarc.reason}; {spf_text}"
    if dkim_outcome.failures:
        reason += f"; dkim: {'; '.join(dkim_outcome.failures[:3])}"
    if checks.trusted_arc_sealers and dmarc.result != "temperror":
        arc = check_arc(raw, checks.resolver, seen, checks.trusted_arc_sealers)
        if arc.trusted_results is not None:
            vouched = _vouch_arc(arc.trusted_results, from_domain, return_path)
            if isinstance(vouched, Authenticated):
                return vouched
            reason += f"; {arc.reason}: {vouched}"
        else:
            reason += f"; {arc.reason}"
    return Skip(GUARD, f"DMARC did not authenticate {from_domain}: {reason}{_temperrors(seen)}")


def _spf(raw: bytes, return_path: str | None, checks: OwnChecks) -> SpfResult | None:
    """SPF for the connecting IP of our border MTA's Received header; None when not evaluable."""
    if not checks.trusted_received_by:
        return None
    hop = trusted_hop(header_values(raw, "Received"), checks.trusted_received_by)
    if hop is None:
        return None
    return check_spf(hop, return_path or "", checks.resolver)


def _vouch_arc(results: str, from_domain: str, return_path: str | None) -> Authenticated | str:
    try:
        header = parse_results(results)
    # Text from the sealer (trusted) but about mail anyone wrote: any parser error is a no.
    except Exception as exc:
        return f"unparsable ARC-Authentication-Results ({exc})"
    verdict = _vouch(header, from_domain, return_path)
    if isinstance(verdict, Authenticated):
        return Authenticated(
            method="arc",
            from_domain=from_domain,
            dkim_domains=verdict.dkim_domains,
            envelope_from=return_path,
        )
    return verdict


@lru_cache(maxsize=1)
def _system_resolver() -> Resolver:
    """One resolver on the system's configuration for callers that pass none (built lazily)."""
    return Resolver()


def startup_notes(settings: StreamsSettings) -> list[str]:
    """Sentences the worker logs at start about what its policies can and cannot check."""
    names = sorted({r.workflow for r in settings.rules} | set(settings.workflows))
    notes = [f"workflow {name}: require {settings.policy_for(name)}" for name in names]
    dmarc = [name for name in names if settings.policy_for(name) == "dmarc-pass"]
    if dmarc and not settings.auth.trusted_received_by:
        notes.append(
            f"SPF is not evaluated for {', '.join(dmarc)} (dmarc-pass): set "
            f"streams.auth.trusted_received_by to your border MTA's host name; until then "
            f"DMARC passes only on an aligned DKIM signature or a trusted ARC sealer"
        )
    return notes


def needs_io(policy: AuthPolicy) -> bool:
    """True when checking the policy reads the claim-check store and DNS (run it in a thread)."""
    return policy in ("dkim-aligned", "dmarc-pass")


def sender_authentication(
    mail: MailView,
    policy: AuthPolicy,
    *,
    authserv_id: str | None,
    load_raw: RawLoader | None = None,
    dnsfunc: DnsFunc | None = None,
    checks: OwnChecks | None = None,
) -> Verdict:
    """The guard: dispatch on ``policy``."""
    if policy == "none":
        sender = mail.sender.address if mail.sender else ""
        return Authenticated(from_domain=domain_of(sender), envelope_from=_return_path(mail))
    if policy == "trusted-ar":
        if not authserv_id:  # StreamsSettings refuses this at start; keep the guard fail-closed
            return Skip(GUARD, "trusted-ar policy without authserv_id")
        return check_authserv(mail, authserv_id)
    if load_raw is None:
        return Skip(GUARD, f"{policy} policy without a claim-check store")
    if policy == "dkim-aligned":
        return check_dkim(mail, load_raw, dnsfunc, checks=checks)
    if policy == "dmarc-pass":
        return check_dmarc(mail, load_raw, checks or OwnChecks(_system_resolver()))
    return Skip(GUARD, f"unknown policy {policy!r}")  # unreachable: the settings refuse it
