"""A TLS gate in front of the real schema registry, as a company puts one (an ingress, nginx):
HTTPS with its own server certificate, a client certificate required (mTLS), HTTP basic auth
checked, every request that passes forwarded to the registry as it came.

In bearer mode (``bearer=BearerCheck(...)``) it is an OAuth2 resource server instead, as a
registry secured with OIDC (Confluent's ``oauthbearer.jwks.endpoint.url``, Apicurio with
Keycloak): ``Authorization: Bearer <JWT>`` required, the JWT checked against the identity
provider's JWKS (RS256 signature, issuer, audience, expiry: ``401 invalid_token``) and its
``scope`` claim (the registry's scope missing: ``403 insufficient_scope``, RFC 6750 3.1).

The registry of the dev stack (Apicurio) would need an OIDC server for its own basic auth; the
gate gives mailtap's registry client the same conversation a secured registry has: a TLS
handshake that needs the CA and the client certificate, ``401`` for a wrong password, the
registry's own answers otherwise.

Example::

    gate = RegistryGate(upstream, ca, server_pair, "mailtap", "secret").start()
    url = gate.url  # https://127.0.0.1:PORT/apis/ccompat/v7
    ...
    gate.stop()

    check = BearerCheck(jwks_url, issuer, audience="schema-registry", scope="registry")
    gate = RegistryGate(upstream, ca, server_pair, bearer=check).start()
"""

from __future__ import annotations

import base64
import json
import ssl
import threading
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from joserfc import jwt
from joserfc.errors import JoseError
from joserfc.jwk import KeySet

from mailtap.dev.certs import KeyPair

#: The upstream registry answers within this many seconds when it is up (a registration).
UPSTREAM_TIMEOUT_S = 30.0


@dataclass(frozen=True)
class BearerCheck:
    """What the gate accepts as a bearer token: a JWT signed by a key of ``jwks_url`` (read at
    start over HTTPS with ``ca``), from ``issuer``, for ``audience``, not expired, with
    ``scope`` among its scopes."""

    jwks_url: str
    ca: Path
    issuer: str
    audience: str
    scope: str


@dataclass
class SeenToken:
    """A bearer token the gate accepted, and the routing headers that came with it."""

    jti: str
    expires: int
    headers: dict[str, str] = field(default_factory=dict)


class RegistryGate:
    """HTTPS + client certificate + basic auth (or a bearer token) in front of ``upstream``
    (a registry URL)."""

    def __init__(
        self,
        upstream: str,
        ca: Path,
        server: KeyPair,
        username: str | None = None,
        password: str | None = None,
        *,
        bearer: BearerCheck | None = None,
    ) -> None:
        if (bearer is None) == (username is None or password is None):
            raise ValueError("a gate checks basic auth (username, password) or a bearer token")
        parts = urlsplit(upstream)
        self._upstream_root = f"{parts.scheme}://{parts.netloc}"
        self._path = parts.path
        self._expected = (
            "Basic " + base64.b64encode(f"{username}:{password}".encode()).decode()
            if bearer is None
            else None
        )
        self._bearer = bearer
        self._keys = _key_set(bearer) if bearer is not None else None
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH, cafile=str(ca))
        # The bearer token is the login there; a client certificate stays the basic mode's.
        context.verify_mode = ssl.CERT_REQUIRED if bearer is None else ssl.CERT_NONE
        context.load_cert_chain(str(server.certificate), str(server.key))
        self._context = context
        #: HTTP status -> number of answers the gate itself gave (401, 403) or forwarded.
        self.answers: dict[int, int] = {}
        #: Bearer mode: every token accepted, in order (one entry per request).
        self.tokens: list[SeenToken] = []
        #: Bearer mode: every token refused with 401 invalid_token, as it came, in order.
        self.refused_tokens: list[str] = []
        self._lock = threading.Lock()
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self._server.socket = context.wrap_socket(self._server.socket, server_side=True)
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"https://127.0.0.1:{self._server.server_address[1]}{self._path}"

    def start(self) -> RegistryGate:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(10)

    def _count(self, status: int) -> None:
        with self._lock:
            self.answers[status] = self.answers.get(status, 0) + 1

    def _refusal(self, headers: Any) -> tuple[int, str, str] | None:
        """None when the request's login passes, else (status, WWW-Authenticate, message)."""
        given = headers.get("Authorization") or ""
        if self._bearer is None:
            if given == self._expected:
                return None
            return 401, 'Basic realm="registry"', "Unauthorized"
        if not given.startswith("Bearer "):
            return 401, 'Bearer realm="registry"', "a bearer token is required"
        value = given.removeprefix("Bearer ").strip()
        try:
            assert self._keys is not None
            token = jwt.decode(value, self._keys, ["RS256"])
            jwt.JWTClaimsRegistry(
                iss={"essential": True, "value": self._bearer.issuer},
                aud={"essential": True, "value": self._bearer.audience},
                exp={"essential": True},
            ).validate(token.claims)
        except (JoseError, ValueError) as exc:
            with self._lock:
                self.refused_tokens.append(value)
            challenge = 'Bearer realm="registry", error="invalid_token"'
            return 401, challenge, f"invalid bearer token: {exc}"
        if self._bearer.scope not in str(token.claims.get("scope", "")).split():
            challenge = f'Bearer error="insufficient_scope", scope="{self._bearer.scope}"'
            return 403, challenge, f"the token lacks the scope {self._bearer.scope}"
        seen = SeenToken(
            str(token.claims.get("jti")),
            int(token.claims["exp"]),
            {k.lower(): v for k, v in headers.items() if k.lower() in _ROUTING_HEADERS},
        )
        with self._lock:
            self.tokens.append(seen)
        return None

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        gate = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: object) -> None:
                pass  # the test reads gate.answers; stderr lines would only be noise

            def _forward(self) -> None:
                refusal = gate._refusal(self.headers)
                if refusal is not None:
                    status, challenge, message = refusal
                    gate._count(status)
                    body = json.dumps({"error_code": status, "message": message}).encode()
                    self.send_response(status)
                    self.send_header("WWW-Authenticate", challenge)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(body)))
                    self.end_headers()
                    self.wfile.write(body)
                    return
                length = int(self.headers.get("Content-Length") or 0)
                data = self.rfile.read(length) if length else None
                request = urllib.request.Request(
                    gate._upstream_root + self.path, data=data, method=self.command
                )
                for name in ("Content-Type", "Accept"):
                    if self.headers.get(name):
                        request.add_header(name, self.headers[name])
                try:
                    with urllib.request.urlopen(request, timeout=UPSTREAM_TIMEOUT_S) as answer:
                        status, body, kind = answer.status, answer.read(), answer.headers
                except urllib.error.HTTPError as exc:
                    status, body, kind = exc.code, exc.read(), exc.headers
                gate._count(status)
                self.send_response(status)
                self.send_header("Content-Type", kind.get("Content-Type", "application/json"))
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            do_GET = do_POST = do_PUT = do_DELETE = _forward

        return Handler


#: Confluent Cloud's routing headers, which the gate records (and ignores, as other registries).
_ROUTING_HEADERS = ("target-sr-cluster", "confluent-identity-pool-id")


def _key_set(check: BearerCheck) -> KeySet:
    """The identity provider's public keys, read once (a registry caches its JWKS too)."""
    context = ssl.create_default_context(cafile=str(check.ca))
    with urllib.request.urlopen(check.jwks_url, timeout=UPSTREAM_TIMEOUT_S, context=context) as r:
        return KeySet.import_key_set(json.load(r))
