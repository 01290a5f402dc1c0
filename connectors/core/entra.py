"""What the Microsoft Entra ID (identity platform) clients of mailtap share: the Graph source's
tokens (:mod:`connectors.graph.auth`) and the SMTP sink's Graph transport
(:mod:`connectors.smtp.graphtransport`) use the same app registration the same way.

Pure helpers around MSAL's inputs, no MSAL import here: each connector keeps its one module
that imports ``msal``.
"""

from __future__ import annotations

import urllib.request
from typing import Any

import requests
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization

__all__ = ["APP_SCOPES", "TOKEN_REFUSALS", "certificate_credential", "msal_http_session"]

#: App-only tokens name the resource's ``.default`` scope (the application's granted permissions).
APP_SCOPES = ["https://graph.microsoft.com/.default"]
#: The token endpoint's errors that no retry can fix.
TOKEN_REFUSALS = frozenset(
    {"invalid_client", "invalid_grant", "unauthorized_client", "invalid_scope", "access_denied"}
)


def msal_http_session(ca_file: str | None) -> requests.Session:
    """MSAL's HTTP session. With ``ca_file`` the session trusts that CA: requests lets
    ``REQUESTS_CA_BUNDLE`` / ``CURL_CA_BUNDLE`` win over ``Session.verify`` (psf/requests#3829),
    so the environment is not read for certificates; its proxies still apply."""
    session = requests.Session()
    if ca_file:
        session.trust_env = False
        session.verify = ca_file
        session.proxies.update(urllib.request.getproxies())
    return session


def forget_access_tokens(app: Any) -> None:
    """Drop the access tokens an MSAL application cached (Graph refused the current one with
    401): its next ``acquire_token_*`` asks the token endpoint again."""
    import msal  # the graph extra: only its users (the Graph source and transport) call this

    cache = app.token_cache
    # A list first: search() is a generator over the dict remove_at() changes.
    for entry in list(cache.search(msal.TokenCache.CredentialType.ACCESS_TOKEN)):
        cache.remove_at(entry)


def certificate_credential(pem: bytes, password: str | None) -> dict[str, str]:
    """MSAL's certificate credential: the private key and the certificate's SHA-1 thumbprint
    (Entra ID names a certificate by it in the assertion's ``x5t`` header)."""
    key = serialization.load_pem_private_key(pem, password=password.encode() if password else None)
    cert = x509.load_pem_x509_certificate(pem)
    return {
        "private_key": key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        ).decode(),
        "thumbprint": cert.fingerprint(hashes.SHA1()).hex(),
        "public_certificate": cert.public_bytes(serialization.Encoding.PEM).decode(),
    }
