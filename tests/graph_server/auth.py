"""The Microsoft identity platform side of the Graph test server: app registrations, the v2.0
token endpoint, and the access tokens Graph checks on every call.

Grants (what MSAL for Python sends to ``/{tenant}/oauth2/v2.0/token``):

- ``client_credentials`` with ``client_secret``, or with a certificate: ``client_assertion_type=
  urn:ietf:params:oauth:client-assertion-type:jwt-bearer`` and a ``client_assertion`` JWT signed
  with the certificate's key (RS256 with ``x5t``, or PS256 with ``x5t#S256``, as MSAL >= 1.29
  does), ``aud`` = the token endpoint, ``iss`` = ``sub`` = the client id
  (https://learn.microsoft.com/en-us/entra/identity-platform/v2-oauth2-client-creds-grant-flow,
  https://learn.microsoft.com/en-us/entra/identity-platform/certificate-credentials). The scope
  must end in ``/.default`` (AADSTS1002012).
- ``refresh_token`` for delegated access (a user's mailbox only;
  https://learn.microsoft.com/en-us/entra/identity-platform/v2-oauth2-auth-code-flow#refresh-the-access-token).
  A test makes the refresh token with ``issue_refresh_token`` (the interactive consent a real
  user gives once). A new refresh token comes with every answer; the old one stays valid.

Errors carry the documented body (``error``, ``error_description`` starting with the AADSTS
code, ``error_codes``, ``timestamp``, ``trace_id``, ``correlation_id``;
https://learn.microsoft.com/en-us/entra/identity-platform/reference-error-codes).

Access tokens are opaque here: Microsoft tells clients not to parse Graph's access tokens
(https://learn.microsoft.com/en-us/entra/identity-platform/access-tokens), so nothing a
client may rely on is lost.
"""

from __future__ import annotations

import base64
import secrets
import time
import uuid
from dataclasses import dataclass, field
from datetime import UTC, datetime

from cryptography import x509
from cryptography.hazmat.primitives import hashes

CLIENT_ASSERTION_TYPE = "urn:ietf:params:oauth:client-assertion-type:jwt-bearer"
#: Graph's resource; a client-credentials scope is ``https://graph.microsoft.com/.default``.
GRAPH_RESOURCE = "https://graph.microsoft.com"
#: Entra ID's default access-token lifetime is 60-90 minutes; ``expires_in`` says 3599.
DEFAULT_TOKEN_LIFETIME = 3599.0


@dataclass
class AppRegistration:
    client_id: str
    secret: str | None = None
    #: SHA-1 and SHA-256 thumbprints (raw bytes) -> certificate.
    certificates: dict[bytes, x509.Certificate] = field(default_factory=dict)
    #: Mailboxes this app may read (an application access policy); ``None``: every mailbox.
    mailboxes: set[str] | None = None


@dataclass(frozen=True)
class Principal:
    """Who a bearer token speaks for: an app alone, or an app on behalf of one user."""

    client_id: str
    user: str | None  # lower-case address for delegated tokens


@dataclass
class _AccessToken:
    principal: Principal
    expires_at: float


@dataclass
class _RefreshToken:
    client_id: str
    user: str
    scope: str
    revoked: bool = False


class TokenError(Exception):
    """A token request that the identity platform refuses: (status, OAuth error, AADSTS code)."""

    def __init__(self, status: int, error: str, code: int, text: str) -> None:
        super().__init__(f"AADSTS{code}: {text}")
        self.status = status
        self.error = error
        self.code = code
        self.text = text

    def body(self) -> dict[str, object]:
        trace_id, correlation_id = str(uuid.uuid4()), str(uuid.uuid4())
        now = datetime.now(UTC).strftime("%Y-%m-%d %H:%M:%SZ")
        return {
            "error": self.error,
            "error_description": (
                f"AADSTS{self.code}: {self.text} Trace ID: {trace_id} "
                f"Correlation ID: {correlation_id} Timestamp: {now}"
            ),
            "error_codes": [self.code],
            "timestamp": now,
            "trace_id": trace_id,
            "correlation_id": correlation_id,
            "error_uri": f"https://login.microsoftonline.com/error?code={self.code}",
        }


class TokenIssuer:
    """Apps, refresh tokens and access tokens of one tenant. Not thread-safe on its own: the
    server calls it under the store's lock."""

    def __init__(self, tenant: str, token_lifetime: float = DEFAULT_TOKEN_LIFETIME) -> None:
        self.tenant = tenant
        self.token_lifetime = token_lifetime
        self.apps: dict[str, AppRegistration] = {}
        self._access: dict[str, _AccessToken] = {}
        self._refresh: dict[str, _RefreshToken] = {}
        #: Token requests answered, by grant type (tests count MSAL's cache hits with it).
        self.issued: list[str] = []

    # -- registration (test side) --------------------------------------------------------------

    def register_app(
        self,
        client_id: str,
        *,
        secret: str | None = None,
        certificate_pem: bytes | None = None,
        mailboxes: set[str] | None = None,
    ) -> AppRegistration:
        app = AppRegistration(client_id, secret, mailboxes={m.lower() for m in mailboxes or ()})
        if mailboxes is None:
            app.mailboxes = None
        if certificate_pem is not None:
            cert = x509.load_pem_x509_certificate(certificate_pem)
            app.certificates[cert.fingerprint(hashes.SHA1())] = cert
            app.certificates[cert.fingerprint(hashes.SHA256())] = cert
        self.apps[client_id] = app
        return app

    def issue_refresh_token(self, client_id: str, user: str, scope: str = "Mail.Read") -> str:
        if client_id not in self.apps:
            raise ValueError(f"no app {client_id} registered")
        token = "0.A" + secrets.token_urlsafe(96)
        self._refresh[token] = _RefreshToken(client_id, user.lower(), scope)
        return token

    def expire_access_tokens(self) -> int:
        """Every access token issued so far expires now; returns how many there were."""
        for token in self._access.values():
            token.expires_at = 0.0
        return len(self._access)

    def revoke_refresh_tokens(self, user: str | None = None) -> None:
        """The user's (or everyone's) refresh tokens are revoked (a password reset, an admin)."""
        for token in self._refresh.values():
            if user is None or token.user == user.lower():
                token.revoked = True

    # -- the token endpoint --------------------------------------------------------------------

    def token(self, tenant: str, form: dict[str, str], token_endpoint: str) -> dict[str, object]:
        """Answer one POST to the token endpoint; raises ``TokenError``."""
        if tenant not in (self.tenant, "organizations", "common"):
            raise TokenError(400, "invalid_request", 90002, f"Tenant '{tenant}' not found.")
        grant = form.get("grant_type", "")
        client_id = form.get("client_id", "")
        app = self.apps.get(client_id)
        if app is None:
            raise TokenError(
                400,
                "unauthorized_client",
                700016,
                f"Application with identifier '{client_id}' was not found in the directory.",
            )
        self._authenticate_client(app, form, token_endpoint)
        if grant == "client_credentials":
            scope = form.get("scope", "")
            if not scope.endswith("/.default"):
                raise TokenError(
                    400,
                    "invalid_scope",
                    1002012,
                    f"The provided value for scope {scope} is not valid. Client credential "
                    "flows must have a scope value with /.default suffixed to the resource "
                    "identifier (application ID URI).",
                )
            self.issued.append(grant)
            return self._access_token_response(Principal(client_id, None))
        if grant == "refresh_token":
            refresh = self._refresh.get(form.get("refresh_token", ""))
            if refresh is None or refresh.client_id != client_id:
                raise TokenError(
                    400, "invalid_grant", 9002313, "Invalid request. Request is malformed."
                )
            if refresh.revoked:
                raise TokenError(
                    400,
                    "invalid_grant",
                    50173,
                    "The provided grant has expired due to it being revoked, a fresh auth "
                    "token is needed.",
                )
            self.issued.append(grant)
            body = self._access_token_response(Principal(client_id, refresh.user))
            body["scope"] = refresh.scope
            body["refresh_token"] = self.issue_refresh_token(client_id, refresh.user, refresh.scope)
            return body
        raise TokenError(
            400,
            "unsupported_grant_type",
            70003,
            f"The app requested an unsupported grant type '{grant}'.",
        )

    def principal(self, bearer: str) -> tuple[Principal | None, str]:
        """The principal of ``Authorization: Bearer <token>``, or None and Graph's message."""
        if not bearer:
            return None, "Access token is empty."
        token = self._access.get(bearer)
        if token is None:
            return None, "IDX14100: JWT is not well formed, there are no dots (.)."
        if token.expires_at <= time.monotonic():
            return None, "Lifetime validation failed, the token is expired."
        return token.principal, ""

    # -- internals -----------------------------------------------------------------------------

    def _access_token_response(self, principal: Principal) -> dict[str, object]:
        token = "eyJ0eXAiOiJKV1Qi." + secrets.token_urlsafe(64)
        self._access[token] = _AccessToken(principal, time.monotonic() + self.token_lifetime)
        lifetime = int(self.token_lifetime)
        return {
            "token_type": "Bearer",
            "expires_in": lifetime,
            "ext_expires_in": lifetime,
            "access_token": token,
        }

    def _authenticate_client(self, app: AppRegistration, form: dict[str, str], aud: str) -> None:
        if "client_secret" in form:
            if app.secret is None or not secrets.compare_digest(form["client_secret"], app.secret):
                raise TokenError(
                    401,
                    "invalid_client",
                    7000215,
                    "Invalid client secret provided. Ensure the secret being sent in the "
                    "request is the client secret value, not the client secret ID, for a "
                    f"secret added to app '{app.client_id}'.",
                )
            return
        if "client_assertion" in form:
            if form.get("client_assertion_type") != CLIENT_ASSERTION_TYPE:
                raise TokenError(
                    400,
                    "invalid_request",
                    50027,
                    "JWT token is invalid or malformed (client_assertion_type).",
                )
            self._verify_assertion(app, form["client_assertion"], aud)
            return
        if (
            form.get("grant_type") == "refresh_token"
            and app.secret is None
            and not app.certificates
        ):
            return  # a public client (no credential registered) refreshes on its own
        raise TokenError(
            401,
            "invalid_client",
            7000218,
            "The request body must contain the following parameter: 'client_assertion' or "
            "'client_secret'.",
        )

    def _verify_assertion(self, app: AppRegistration, assertion: str, aud: str) -> None:
        # PyJWT comes with msal (the 'graph' extra); imported here so that a test session
        # without it still collects (tests/conftest.py imports the fixture module).
        import jwt

        try:
            header = jwt.get_unverified_header(assertion)
        except jwt.PyJWTError as e:
            raise TokenError(400, "invalid_client", 50027, f"JWT token is invalid: {e}.") from e
        thumbprint = header.get("x5t#S256") or header.get("x5t") or ""
        try:
            raw = base64.urlsafe_b64decode(thumbprint + "=" * (-len(thumbprint) % 4))
        except ValueError:
            raw = b""
        cert = app.certificates.get(raw)
        if cert is None:
            raise TokenError(
                401,
                "invalid_client",
                700027,
                f"The certificate with identifier used to sign the client assertion is not "
                f"registered on application. [Reason - The key was not found., Thumbprint of "
                f"key used by client: '{thumbprint}']",
            )
        try:
            jwt.decode(
                assertion,
                cert.public_key(),  # type: ignore[arg-type]
                algorithms=["RS256", "PS256"],
                audience=aud,
                issuer=app.client_id,
                options={"require": ["exp", "aud", "iss", "sub"]},
            )
        except jwt.ExpiredSignatureError as e:
            raise TokenError(
                400,
                "invalid_client",
                700024,
                "Client assertion is not within its valid time range.",
            ) from e
        except jwt.PyJWTError as e:
            raise TokenError(
                401, "invalid_client", 700027, f"Client assertion failed signature validation: {e}."
            ) from e
