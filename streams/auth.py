"""Sender authentication guard: a workflow only runs on mail whose From domain is vouched for.

Policies (``streams.auth_policy``, per workflow ``streams.workflows.<name>.auth_policy``):

- ``none``: no check (for mailboxes only trusted systems can write to, or a demo).
- ``authserv``: trust the ``Authentication-Results`` header (RFC 8601) written by *our* border
  MTA, identified by its authserv-id. **The topmost header carrying that id is the only one
  that counts**: RFC 8601 §5 has the MTA delete headers claiming its id from incoming mail and
  add its own on top, so anything below may be forged by the sender. Which header is "ours" is
  decided on the text (:func:`authserv_id_of`: the first token after white space and comments),
  not by the parser, and if that header cannot be parsed the mail is **not** authenticated:
  skipping it would let a forged header below it count (an attacker can make our MTA's header
  unparseable through values it controls, e.g. ``smtp.helo=[203.0.113.7]``).
  It passes on ``dmarc=pass`` *for the From domain* (``header.from`` equal to it), or on
  ``dkim=pass`` / ``spf=pass`` aligned with the From domain (relaxed alignment, RFC 7489 §3.1).
- ``dkim``: verify the DKIM signatures ourselves with dkimpy on the raw MIME from the
  claim-check store, and require one that passes and is aligned with the From domain. This
  does DNS lookups: the app runs it in a thread.

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
from typing import Any

import authres
import dkim

from streams.config import AuthPolicy
from streams.guards import Pass, Skip, Verdict
from streams.mail import MailView, aligned, domain_of

__all__ = [
    "Authenticated",
    "aligned",
    "authserv_id_of",
    "check_authserv",
    "check_dkim",
    "domain_of",
    "needs_io",
    "sender_authentication",
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


def _trusted_header(mail: MailView, authserv_id: str) -> Any | Skip:
    """The topmost header of ``authserv_id``, parsed; a Skip when there is none or it is bad."""
    wanted = authserv_id.lower().rstrip(".")
    for raw in mail.guard_headers.authentication_results:
        if authserv_id_of(raw) != wanted:
            continue  # another host's header (or garbage): never ours, whatever it says
        try:
            header = authres.AuthenticationResultsHeader.parse_value(raw.strip())
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
    """Policy ``authserv``: the topmost Authentication-Results of ``authserv_id`` must vouch."""
    if mail.sender is None:
        return Skip(GUARD, "no From address to authenticate")
    header = _trusted_header(mail, authserv_id)
    if isinstance(header, Skip):
        return header
    from_domain = domain_of(mail.sender.address)
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
            envelope_from=envelope_from or _return_path(mail),
        )
    return Skip(
        GUARD, f"{authserv_id} did not authenticate {from_domain}: {' '.join(seen) or 'none'}"
    )


def _return_path(mail: MailView) -> str | None:
    value = (mail.guard_headers.return_path or "").strip().strip("<>").strip()
    return value or None


def check_dkim(mail: MailView, load_raw: RawLoader, dnsfunc: DnsFunc | None = None) -> Verdict:
    """Policy ``dkim``: one valid DKIM signature whose ``d=`` is aligned with the From domain."""
    if mail.sender is None:
        return Skip(GUARD, "no From address to authenticate")
    if mail.raw_uri is None:
        return Skip(GUARD, "raw MIME not in the claim-check store, cannot verify DKIM")
    raw = load_raw(mail.raw_uri)
    from_domain = domain_of(mail.sender.address)
    verifier = dkim.DKIM(raw)
    count = sum(1 for name, _ in verifier.headers if name.lower() == b"dkim-signature")
    failures: list[str] = []
    valid: set[str] = set()
    for idx in range(count):
        try:
            ok = (
                verifier.verify(idx=idx, dnsfunc=dnsfunc)
                if dnsfunc is not None
                else verifier.verify(idx=idx)
            )
        except dkim.DKIMException as exc:
            failures.append(f"signature {idx}: {exc}")
            continue
        domain = (verifier.domain or b"").decode("ascii", "replace").lower()
        if ok:
            valid.add(domain)
        if not (ok and aligned(domain, from_domain)):
            failures.append(f"d={domain} {'not aligned' if ok else 'invalid'}")
    if any(aligned(domain, from_domain) for domain in valid):
        return Authenticated(
            method="dkim",
            from_domain=from_domain,
            dkim_domains=frozenset(valid),
            envelope_from=_return_path(mail),
        )
    detail = "; ".join(failures) if failures else "no DKIM-Signature"
    return Skip(GUARD, f"DKIM did not authenticate {from_domain}: {detail}")


def needs_io(policy: AuthPolicy) -> bool:
    """True when checking the policy reads the claim-check store and DNS (run it in a thread)."""
    return policy == "dkim"


def sender_authentication(
    mail: MailView,
    policy: AuthPolicy,
    *,
    authserv_id: str | None,
    load_raw: RawLoader | None = None,
    dnsfunc: DnsFunc | None = None,
) -> Verdict:
    """The guard: dispatch on ``policy``."""
    if policy == "none":
        sender = mail.sender.address if mail.sender else ""
        return Authenticated(from_domain=domain_of(sender), envelope_from=_return_path(mail))
    if policy == "authserv":
        if not authserv_id:  # StreamsSettings refuses this at start; keep the guard fail-closed
            return Skip(GUARD, "authserv policy without authserv_id")
        return check_authserv(mail, authserv_id)
    if load_raw is None:
        return Skip(GUARD, "dkim policy without a claim-check store")
    return check_dkim(mail, load_raw, dnsfunc)
