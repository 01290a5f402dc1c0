"""The dev stack's OAuth2 server (`mailtap.dev.oauth_server`) in this process: a client-credentials
token endpoint and its JWKS on one HTTPS port, with a certificate of the test's CA.

The same issuer code as ``mailtap dev up --secure``, without the secured broker around it, for
tests that need tokens but no Kafka login (the schema registry's bearer login). ``lifetime``
gives short-lived tokens to exercise refreshes.
The client secrets are in memory only; the handler logs a client id per token, never a secret.

Example::

    with OAuthEndpoint(ca, folder, {"client": "secret"}, audience="registry") as endpoint:
        endpoint.token_url  # https://127.0.0.1:PORT/token
        endpoint.jwks_url   # https://127.0.0.1:PORT/jwks
"""

from __future__ import annotations

import ssl
import threading
from http.server import ThreadingHTTPServer
from pathlib import Path
from types import TracebackType

from mailtap.dev.certs import CertificateAuthority
from mailtap.dev.oauth_server import (
    DEFAULT_TOKEN_LIFETIME_S,
    TokenIssuer,
    handler_for,
    signing_key,
)
from mailtap.dev.process import free_port


class OAuthEndpoint:
    """Token endpoint + JWKS over HTTPS on 127.0.0.1, issuing RS256 JWTs for ``clients``."""

    def __init__(
        self,
        ca: CertificateAuthority,
        folder: Path,
        clients: dict[str, str],
        audience: str,
        lifetime: int = DEFAULT_TOKEN_LIFETIME_S,
        issuer: str | None = None,
    ) -> None:
        pair = ca.issue(folder / "tls", "localhost", hosts=["127.0.0.1", "localhost"])
        tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        tls.load_cert_chain(pair.certificate, pair.key)
        # The issuer names the port, so the port is chosen before the server is made.
        port = free_port()
        # A second endpoint of the same provider (same folder: same signing key) names the
        # first one's issuer, so a relying party that trusts one trusts both.
        self.issuer = issuer or f"https://127.0.0.1:{port}"
        self.token_url = f"https://127.0.0.1:{port}/token"
        self.jwks_url = f"https://127.0.0.1:{port}/jwks"
        self.audience = audience
        issuer = TokenIssuer(signing_key(folder), clients, self.issuer, audience, lifetime)
        self._server = ThreadingHTTPServer(("127.0.0.1", port), handler_for(issuer, True))
        self._server.socket = tls.wrap_socket(self._server.socket, server_side=True)
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    def __enter__(self) -> OAuthEndpoint:
        self._thread.start()
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        value: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(10)
