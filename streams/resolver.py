"""DNS for our own sender checks (SPF, DKIM keys, DMARC records, ARC keys): one resolver per
worker, with a bounded cache that honours TTLs and a timeout on every query.

Built on dnspython (already under dkimpy): ``dns.resolver.LRUCache`` keeps at most
``cache_size`` answers and drops each when its TTL runs out, ``Resolver.lifetime`` bounds a
query including its retries. ``nameserver`` (``host:port``) points the resolver at one server,
e.g. a local validating resolver, or the loopback test server; without it the system's
resolv.conf is used.

A timeout, a SERVFAIL or an unreachable server is a :class:`DnsTempError`: the callers turn it
into a ``temperror`` that never authenticates anybody (fail closed), and say so in the reason.
NXDOMAIN and "no such record" are an empty answer: a definite "nothing published".
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import dkim
import dns.exception
import dns.name
import dns.rdatatype
import dns.resolver

from streams.config import parse_nameserver
from streams.errors import DnsTempError

log = logging.getLogger(__name__)


@dataclass
class Resolver:
    """TXT/A/AAAA/MX/PTR lookups with cache and timeout; see the module docstring."""

    nameserver: str | None = None
    timeout_seconds: float = 5.0
    cache_size: int = 10_000
    _resolver: dns.resolver.Resolver = field(init=False, repr=False)

    def __post_init__(self) -> None:
        try:
            self._resolver = dns.resolver.Resolver(configure=self.nameserver is None)
        except dns.resolver.NoResolverConfiguration as exc:
            # No resolv.conf (a bare container): the worker still runs the policies that need
            # no DNS; every lookup is then a temperror, so nothing passes by default.
            log.warning("no system DNS configuration (%s); set streams.auth.nameserver", exc)
            self._resolver = dns.resolver.Resolver(configure=False)
            self._resolver.nameservers = []
        if self.nameserver is not None:
            host, port = parse_nameserver(self.nameserver)
            self._resolver.nameservers = [host]
            self._resolver.port = port
        # lifetime bounds the whole query (retries included); timeout each attempt.
        self._resolver.lifetime = self.timeout_seconds
        self._resolver.timeout = self.timeout_seconds
        self._resolver.cache = dns.resolver.LRUCache(self.cache_size)

    def query(self, name: str, rdtype: str) -> list[Any]:
        """The records of ``name``; [] when it does not exist; DnsTempError when unknown now."""
        try:
            answer = self._resolver.resolve(name, rdtype, search=False)
        except (dns.resolver.NXDOMAIN, dns.resolver.NoAnswer):
            return []
        except dns.exception.Timeout as exc:
            raise DnsTempError(f"{rdtype} {name}: timeout after {self.timeout_seconds:g}s") from exc
        except (dns.resolver.NoNameservers, dns.resolver.NoResolverConfiguration) as exc:
            raise DnsTempError(f"{rdtype} {name}: no answer from the nameserver ({exc})") from exc
        except dns.exception.DNSException as exc:  # bad name, YX domain…: not a pass either
            raise DnsTempError(f"{rdtype} {name}: {exc}") from exc
        return list(answer)

    def txt(self, name: str) -> list[bytes]:
        """Each TXT record of ``name`` with its strings joined (RFC 7208 §3.3, RFC 6376 §3.6.2.2)."""
        return [b"".join(r.strings) for r in self.query(name, "TXT")]


@dataclass
class LookupLog:
    """The temporary failures met during one mail's checks, for the skip reason."""

    temperrors: list[str] = field(default_factory=list)


def dkim_dnsfunc(resolver: Resolver, seen: LookupLog) -> Callable[..., bytes | None]:
    """dkimpy's ``dnsfunc(name, timeout=…)``: the key record, or None; a temporary failure is
    noted in ``seen`` and raised as ``dkim.DnsTimeoutError`` (dkimpy then fails the signature)."""

    def lookup(name: bytes, timeout: float = 5) -> bytes | None:
        del timeout  # the resolver's own timeout applies
        text = name.decode("ascii", "replace").rstrip(".")
        try:
            records = resolver.txt(text)
        except DnsTempError as exc:
            seen.temperrors.append(str(exc))
            raise dkim.DnsTimeoutError(str(exc)) from exc
        return records[0] if records else None

    return lookup


def spf_lookup(resolver: Resolver) -> Callable[..., list[tuple[tuple[str, str], Any]]]:
    """pyspf's ``DNSLookup(name, qtype, strict, timeout)`` on our resolver (same result shape as
    its ``DNSLookup_dnspython``); a temporary failure becomes pyspf's ``TempError``."""
    import spf

    def lookup(name: str, qtype: str, *_: Any, **__: Any) -> list[tuple[tuple[str, str], Any]]:
        try:
            records = resolver.query(name, qtype)
        except DnsTempError as exc:
            raise spf.TempError(f"DNS {exc}") from exc
        out: list[tuple[tuple[str, str], Any]] = []
        for rdata in records:
            if qtype in ("A", "AAAA"):
                out.append(((name, qtype), rdata.address))
            elif qtype == "MX":
                out.append(((name, qtype), (rdata.preference, rdata.exchange)))
            elif qtype == "PTR":
                out.append(((name, qtype), rdata.target.to_text(True)))
            elif qtype in ("TXT", "SPF"):
                out.append(((name, qtype), rdata.strings))
        return out

    return lookup
