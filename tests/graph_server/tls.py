"""HTTPS for the Graph test server: MSAL for Python accepts only an ``https`` authority
(``msal.authority.canonicalize`` raises ValueError for anything else), so the server speaks TLS
with a certificate for ``127.0.0.1`` and ``localhost`` from a private CA made by ``trustme``
(on ``cryptography``; light to import, unlike ``mailtap.dev``, which matters for a server
spawned as its own process). Clients trust ``ca_file`` (MSAL: ``http_client=`` a session
with ``verify=ca_file``; aiohttp / ssl: ``ssl.create_default_context(cafile=...)``).
"""

from __future__ import annotations

import ssl
from dataclasses import dataclass
from pathlib import Path

import trustme


@dataclass(frozen=True)
class CertificatePair:
    """A certificate (with its chain) and its private key, as PEM files."""

    certificate: Path
    key: Path


@dataclass(frozen=True)
class ServerTls:
    ca: trustme.CA
    ca_file: Path
    context: ssl.SSLContext

    def issue(self, folder: Path) -> CertificatePair:
        """A server certificate for 127.0.0.1 / localhost signed by this CA, under ``folder``."""
        folder.mkdir(parents=True, exist_ok=True)
        issued = self.ca.issue_cert("127.0.0.1", "localhost")
        pair = CertificatePair(folder / "cert.pem", folder / "key.pem")
        issued.cert_chain_pems[0].write_to_path(str(pair.certificate))
        for extra in issued.cert_chain_pems[1:]:
            extra.write_to_path(str(pair.certificate), append=True)
        issued.private_key_pem.write_to_path(str(pair.key))
        return pair


def server_tls(folder: Path) -> ServerTls:
    """A fresh CA (its certificate in ``folder/ca.pem``) and the server's SSL context."""
    folder.mkdir(parents=True, exist_ok=True)
    ca = trustme.CA(organization_name="mailtap graph test server")
    ca_file = folder / "ca.pem"
    ca.cert_pem.write_to_path(str(ca_file))
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca.issue_cert("127.0.0.1", "localhost").configure_cert(context)
    return ServerTls(ca, ca_file, context)
