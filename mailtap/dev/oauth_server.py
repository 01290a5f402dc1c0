"""The development OAuth2 server of the secured local Kafka: client-credentials tokens (RS256 JWTs)
and the JWKS the broker validates them with.

Run as its own process by ``mailtap dev up --secure``::

    python -m mailtap.dev.oauth_server --folder .state/dev/secure/oauth \\
        --host 127.0.0.1 --token-port 8443 --jwks-port 8080 --issuer ... --audience kafka

- ``POST https://host:token-port/token`` (RFC 6749 4.4): ``grant_type=client_credentials``, the
  client authenticated with HTTP Basic (what librdkafka's ``sasl.oauthbearer.method=oidc`` and
  requests-oauthlib send) or ``client_id``/``client_secret`` in the body. The answer is
  ``{"access_token": <JWT>, "token_type": "Bearer", "expires_in": N}``; the JWT's ``sub`` is the
  client id, which the broker takes as the principal (``User:<client id>``). A wrong secret is
  ``401 invalid_client``, another grant ``400 unsupported_grant_type``.
- ``GET https://host:token-port/jwks`` and ``GET http://host:jwks-port/jwks``: the public key.
  The broker reads the plain-HTTP copy: the JDK would need a JKS/PKCS12 truststore to reach the
  HTTPS one, and a JWKS holds nothing secret (loopback only).

``<folder>/clients.json`` maps client ids to secrets (a file, not arguments: ``ps`` shows
arguments); ``<folder>/signing-key.pem`` is the RSA key, ``<folder>/tls/{cert,key}.pem`` the
HTTPS certificate. Secrets and tokens are never logged.
"""

from __future__ import annotations

import argparse
import base64
import binascii
import hmac
import json
import logging
import signal
import ssl
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs

from joserfc import jwt
from joserfc.jwk import RSAKey

log = logging.getLogger("mailtap.dev.oauth_server")

#: Key id in the JWT header and the JWKS: the broker picks the verification key by it.
KEY_ID = "mailtap-dev-1"
#: An hour, as most identity providers; `--token-lifetime` shortens it to exercise refreshes.
DEFAULT_TOKEN_LIFETIME_S = 3600
CLIENTS_FILE = "clients.json"
SIGNING_KEY_FILE = "signing-key.pem"


def signing_key(folder: Path) -> RSAKey:
    """The server's RSA signing key, made on first use and kept (tokens survive a restart)."""
    path = folder / SIGNING_KEY_FILE
    if path.exists():
        return RSAKey.import_key(path.read_bytes(), parameters={"kid": KEY_ID})
    key = RSAKey.generate_key(2048, parameters={"kid": KEY_ID})
    folder.mkdir(parents=True, exist_ok=True)
    path.write_bytes(key.as_pem(private=True))
    path.chmod(0o600)
    return key


class TokenIssuer:
    """Checks client credentials and signs access tokens."""

    def __init__(
        self, key: RSAKey, clients: dict[str, str], issuer: str, audience: str, lifetime: int
    ) -> None:
        self.key = key
        self.clients = clients
        self.issuer = issuer
        self.audience = audience
        self.lifetime = lifetime

    def jwks(self) -> dict[str, Any]:
        public = self.key.as_dict(private=False)
        return {"keys": [{**public, "kid": KEY_ID, "use": "sig", "alg": "RS256"}]}

    def authenticate(self, client_id: str, secret: str) -> bool:
        expected = self.clients.get(client_id)
        return expected is not None and hmac.compare_digest(expected, secret)

    def issue(self, client_id: str, scope: str) -> dict[str, Any]:
        now = int(time.time())
        claims = {
            "iss": self.issuer,
            "sub": client_id,
            "aud": self.audience,
            "iat": now,
            "nbf": now,
            "exp": now + self.lifetime,
            "jti": uuid.uuid4().hex,
            "scope": scope,
        }
        token = jwt.encode({"alg": "RS256", "typ": "JWT", "kid": KEY_ID}, claims, self.key)
        return {
            "access_token": token,
            "token_type": "Bearer",
            "expires_in": self.lifetime,
            "scope": scope,
        }


def _basic_credentials(header: str | None) -> tuple[str, str] | None:
    if not header or not header.lower().startswith("basic "):
        return None
    try:
        decoded = base64.b64decode(header[6:].strip(), validate=True).decode()
    except (binascii.Error, UnicodeDecodeError):
        return None
    client_id, sep, secret = decoded.partition(":")
    return (client_id, secret) if sep else None


def handler_for(issuer: TokenIssuer, token_endpoint: bool) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        server_version = "mailtap-dev-oauth"

        def _answer(self, status: int, body: dict[str, Any]) -> None:
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Cache-Control", "no-store")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self) -> None:
            if self.path.split("?")[0] == "/jwks":
                self._answer(200, issuer.jwks())
            else:
                self._answer(404, {"error": "not_found"})

        def do_POST(self) -> None:
            if not token_endpoint or self.path.split("?")[0] != "/token":
                self._answer(404, {"error": "not_found"})
                return
            length = int(self.headers.get("Content-Length") or 0)
            form = {k: v[0] for k, v in parse_qs(self.rfile.read(length).decode()).items()}
            if form.get("grant_type") != "client_credentials":
                self._answer(400, {"error": "unsupported_grant_type"})
                return
            credentials = _basic_credentials(self.headers.get("Authorization")) or (
                form.get("client_id", ""),
                form.get("client_secret", ""),
            )
            if not issuer.authenticate(*credentials):
                log.info("token refused: client %r (invalid_client)", credentials[0])
                self._answer(401, {"error": "invalid_client"})
                return
            log.info("token issued: client %r", credentials[0])
            self._answer(200, issuer.issue(credentials[0], form.get("scope", "")))

        def log_message(self, format: str, *args: Any) -> None:
            pass  # one line per token above; the access log would repeat it

    return Handler


def serve(args: argparse.Namespace) -> None:
    folder: Path = args.folder
    clients = json.loads((folder / CLIENTS_FILE).read_text())
    issuer = TokenIssuer(
        signing_key(folder), clients, args.issuer, args.audience, args.token_lifetime
    )
    tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    tls.load_cert_chain(folder / "tls" / "cert.pem", folder / "tls" / "key.pem")
    token_server = ThreadingHTTPServer((args.host, args.token_port), handler_for(issuer, True))
    token_server.socket = tls.wrap_socket(token_server.socket, server_side=True)
    jwks_server = ThreadingHTTPServer((args.host, args.jwks_port), handler_for(issuer, False))
    servers = (token_server, jwks_server)

    def stop(signum: int, frame: object) -> None:
        for server in servers:
            threading.Thread(target=server.shutdown, daemon=True).start()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    threads = [threading.Thread(target=s.serve_forever, name=type(s).__name__) for s in servers]
    for thread in threads:
        thread.start()
    log.info(
        "oauth server: tokens https://%s:%d/token, jwks http://%s:%d/jwks, %d clients",
        args.host,
        args.token_port,
        args.host,
        args.jwks_port,
        len(clients),
    )
    for thread in threads:
        thread.join()
    for server in servers:
        server.server_close()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m mailtap.dev.oauth_server", description=__doc__)
    parser.add_argument("--folder", type=Path, required=True)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--token-port", type=int, required=True)
    parser.add_argument("--jwks-port", type=int, required=True)
    parser.add_argument("--issuer", required=True)
    parser.add_argument("--audience", required=True)
    parser.add_argument("--token-lifetime", type=int, default=DEFAULT_TOKEN_LIFETIME_S)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    serve(args)


if __name__ == "__main__":
    main()
