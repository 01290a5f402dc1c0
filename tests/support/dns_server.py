"""A DNS server on loopback for the sender-authentication tests (dnslib): the zone is a dict the
test edits, names in ``silent`` get no answer at all (a timeout for the client), and every
question is counted (to see the cache work).

    with LoopbackDns() as dns:
        dns.txt("_dmarc.example.com", "v=DMARC1; p=reject")
        Resolver(dns.nameserver, timeout_seconds=0.5).txt("_dmarc.example.com")
"""

from __future__ import annotations

import collections
import threading
from types import TracebackType
from typing import Any

from dnslib import QTYPE, RCODE, RR, TXT, A, DNSError, DNSRecord
from dnslib.server import BaseResolver, DNSLogger, DNSServer


def _txt_chunks(text: str) -> list[bytes]:
    # A TXT string holds at most 255 bytes; DKIM keys are longer (RFC 7208 §3.3 / RFC 6376).
    data = text.encode()
    return [data[i : i + 255] for i in range(0, len(data), 255)] or [b""]


class _ZoneResolver(BaseResolver):  # type: ignore[misc]
    def __init__(self, server: LoopbackDns) -> None:
        self.server = server

    def resolve(self, request: DNSRecord, handler: Any) -> DNSRecord:
        qname = str(request.q.qname).rstrip(".").lower()
        qtype = QTYPE[request.q.qtype]
        with self.server.lock:
            self.server.questions[(qname, qtype)] += 1
            if qname in self.server.silent:
                # dnslib's handler logs a DNSError and sends nothing: the client times out.
                raise DNSError(f"silent on {qname}")
            records = list(self.server.zone.get((qname, qtype), ()))
            exists = any(name == qname for name, _ in self.server.zone)
        reply = request.reply()
        for rdata in records:
            reply.add_answer(RR(qname, QTYPE.reverse[qtype], rdata=rdata, ttl=self.server.ttl))
        if not records and not exists:
            reply.header.rcode = RCODE.NXDOMAIN
        return reply


class LoopbackDns:
    """An authoritative-for-everything UDP+TCP server on 127.0.0.1 (a free port)."""

    def __init__(self, ttl: int = 300) -> None:
        self.ttl = ttl
        self.zone: dict[tuple[str, str], list[Any]] = {}
        self.silent: set[str] = set()
        self.questions: collections.Counter[tuple[str, str]] = collections.Counter()
        self.lock = threading.Lock()
        quiet = DNSLogger(log="-request,-reply,-truncated,-error,-recv,-send,-data", prefix=False)
        for attempt in range(20):  # UDP and TCP on one free port: another test may hold it on TCP
            self._udp = DNSServer(_ZoneResolver(self), port=0, address="127.0.0.1", logger=quiet)
            port = self._udp.server.server_address[1]
            try:
                self._tcp = DNSServer(
                    _ZoneResolver(self), port=port, address="127.0.0.1", tcp=True, logger=quiet
                )
                break
            except OSError:
                self._udp.server.server_close()
                if attempt == 19:
                    raise
        self.nameserver = f"127.0.0.1:{port}"

    def txt(self, name: str, *texts: str) -> None:
        with self.lock:
            self.zone[(name.lower(), "TXT")] = [TXT(_txt_chunks(t)) for t in texts]

    def a(self, name: str, *addresses: str) -> None:
        with self.lock:
            self.zone[(name.lower(), "A")] = [A(a) for a in addresses]

    def __enter__(self) -> LoopbackDns:
        self._udp.start_thread()
        self._tcp.start_thread()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        for server in (self._udp, self._tcp):
            server.stop()
            server.server.server_close()
