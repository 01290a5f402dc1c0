"""HTTPS for the Graph test server: MSAL for Python accepts only an ``https`` authority
(``msal.authority.canonicalize`` raises ValueError for anything else), so the server speaks TLS
with a certificate for ``127.0.0.1`` and ``localhost`` from a private CA made with
``cryptography`` (``mailtap.dev.certs``, the same CA code as the secured dev stack). Clients
trust ``ca_file`` (MSAL: ``verify=ca_file``; requests: ``verify=``; aiohttp / ssl:
``ssl.create_default_context(cafile=...)``).
"""

from __future__ import annotations

import ssl
from dataclasses import dataclass
from pathlib import Path

from mailtap.dev.certs import CertificateAuthority


@dataclass(frozen=True)
class ServerTls:
    ca: CertificateAuthority
    context: ssl.SSLContext

    @property
    def ca_file(self) -> Path:
        return self.ca.certificate


def server_tls(folder: Path) -> ServerTls:
    """A fresh CA and a server certificate under ``folder``; the server's SSL context."""
    ca = CertificateAuthority.create(folder / "ca")
    pair = ca.issue(folder / "graph", "localhost", hosts=["localhost", "127.0.0.1"])
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(pair.certificate, pair.key)
    return ServerTls(ca, context)
