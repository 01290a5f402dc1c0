"""Sender authentication guard: a workflow only runs on mail whose From domain is vouched for.

Policies (``streams.auth_policy``, per workflow ``streams.workflows.<name>.auth_policy``):

- ``none``: no check (for mailboxes only trusted systems can write to, or a demo).
- ``authserv``: trust the ``Authentication-Results`` header (RFC 8601) written by *our* border
  MTA, identified by its authserv-id. Only the topmost header carrying that id counts: RFC 8601
  §5 has the MTA delete headers claiming its id from incoming mail, so lower ones may be forged.
  It passes on ``dmarc=pass``, or on ``dkim=pass`` / ``spf=pass`` aligned with the From domain
  (relaxed alignment, RFC 7489 §3.1).
- ``dkim``: verify the DKIM signatures ourselves with dkimpy on the raw MIME from the
  claim-check store, and require one that passes and is aligned with the From domain. This
  does DNS lookups: the app runs it in a thread.

Wire sample of a header this module reads::

    Authentication-Results: mx.example.com; dkim=pass header.d=example.com;
        spf=pass smtp.mailfrom=ann@example.com; dmarc=pass header.from=example.com
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import authres
import dkim

from streams.config import AuthPolicy
from streams.guards import PASS, Skip, Verdict
from streams.mail import MailView

log = logging.getLogger(__name__)

#: Reads the raw MIME of a mail by claim-check URI (``ClaimCheckStore.get``).
RawLoader = Callable[[str], bytes]
#: dkimpy's DNS TXT lookup signature; injectable so tests need no DNS.
DnsFunc = Callable[..., Any]


def domain_of(address: str) -> str:
    return address.rpartition("@")[2].strip().strip(">").lower()


def aligned(domain: str, from_domain: str) -> bool:
    """Relaxed alignment (RFC 7489 §3.1.1): same organisational domain, approximated by suffix."""
    domain, from_domain = domain.lower().rstrip("."), from_domain.lower().rstrip(".")
    # A bare TLD (d=com) would align with everything; real signers use at least two labels.
    return "." in domain and (
        from_domain == domain
        or from_domain.endswith("." + domain)
        or domain.endswith("." + from_domain)
    )


def _trusted_header(mail: MailView, authserv_id: str) -> Any | None:
    for raw in mail.guard_headers.authentication_results:
        try:
            header = authres.AuthenticationResultsHeader.parse_value(raw.strip())
        except authres.AuthResError:
            log.debug("unparsable Authentication-Results in %s", mail.key)
            continue
        if str(header.authserv_id).lower() == authserv_id.lower():
            return header
    return None


def check_authserv(mail: MailView, authserv_id: str) -> Verdict:
    """Policy ``authserv``: the topmost Authentication-Results of ``authserv_id`` must vouch."""
    guard = "sender_authentication"
    if mail.sender is None:
        return Skip(guard, "no From address to authenticate")
    header = _trusted_header(mail, authserv_id)
    if header is None:
        return Skip(guard, f"no Authentication-Results from {authserv_id}")
    from_domain = domain_of(mail.sender.address)
    seen: list[str] = []
    for result in header.results:
        method, outcome = str(result.method).lower(), str(result.result).lower()
        seen.append(f"{method}={outcome}")
        if outcome != "pass":
            continue
        props = {f"{p.type}.{p.name}".lower(): str(p.value) for p in result.properties}
        if method == "dmarc":
            return PASS
        if method == "dkim" and aligned(props.get("header.d", ""), from_domain):
            return PASS
        if method == "spf" and aligned(domain_of(props.get("smtp.mailfrom", "")), from_domain):
            return PASS
    return Skip(
        guard, f"{authserv_id} did not authenticate {from_domain}: {' '.join(seen) or 'none'}"
    )


def check_dkim(mail: MailView, load_raw: RawLoader, dnsfunc: DnsFunc | None = None) -> Verdict:
    """Policy ``dkim``: one valid DKIM signature whose ``d=`` is aligned with the From domain."""
    guard = "sender_authentication"
    if mail.sender is None:
        return Skip(guard, "no From address to authenticate")
    if mail.raw_uri is None:
        return Skip(guard, "raw MIME not in the claim-check store, cannot verify DKIM")
    raw = load_raw(mail.raw_uri)
    from_domain = domain_of(mail.sender.address)
    verifier = dkim.DKIM(raw)
    count = sum(1 for name, _ in verifier.headers if name.lower() == b"dkim-signature")
    failures: list[str] = []
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
        domain = (verifier.domain or b"").decode("ascii", "replace")
        if ok and aligned(domain, from_domain):
            return PASS
        failures.append(f"d={domain} {'not aligned' if ok else 'invalid'}")
    detail = "; ".join(failures) if failures else "no DKIM-Signature"
    return Skip(guard, f"DKIM did not authenticate {from_domain}: {detail}")


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
        return PASS
    if policy == "authserv":
        if not authserv_id:  # StreamsSettings refuses this at start; keep the guard fail-closed
            return Skip("sender_authentication", "authserv policy without authserv_id")
        return check_authserv(mail, authserv_id)
    if load_raw is None:
        return Skip("sender_authentication", "dkim policy without a claim-check store")
    return check_dkim(mail, load_raw, dnsfunc)
