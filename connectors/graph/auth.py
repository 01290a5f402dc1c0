"""Access tokens for Graph, with MSAL (the only module of this connector that imports ``msal``).

Three grants, as the ``graph`` section's ``auth`` says:

- ``client_secret``: app-only, the client-credentials grant with the application's secret;
- ``client_certificate``: app-only, the same grant with a signed assertion (a PEM certificate
  and its private key; MSAL signs it);
- ``refresh_token``: delegated, a user's refresh token redeemed for access tokens; the newest
  refresh token MSAL receives replaces it in memory (Entra ID rotates them).

The helpers shared with the SMTP sink's Graph transport (the same app registration) are in
:mod:`connectors.core.entra`. MSAL caches the access token and renews it before it expires (its
``refresh_in``), so :meth:`TokenSource.token` may be called before every request. :meth:`TokenSource.refused` drops
the cached token after Graph answered 401 (a token revoked before its time): the next call gets a
new one. A refusal by the token endpoint (``invalid_client``, ``invalid_grant``,
``unauthorized_client``) is :class:`~connectors.graph.errors.AccessDenied`; an unreachable
endpoint is :class:`~connectors.graph.errors.ConnectionLost`. Secrets and tokens never appear
in a message or a log line (MSAL's own logger is quieted).
"""

from __future__ import annotations

import logging
import threading
from typing import Any

import msal
import requests

from connectors.core.entra import (
    APP_SCOPES,
    TOKEN_REFUSALS,
    certificate_credential,
    forget_access_tokens,
    msal_http_session,
)
from connectors.core.redact import quiet_token_libraries
from connectors.graph.config import GraphSourceSettings
from connectors.graph.errors import AccessDenied, ConnectionLost

log = logging.getLogger(__name__)
quiet_token_libraries()
logging.getLogger("msal").setLevel(logging.WARNING)  # at DEBUG it logs token responses

#: Delegated tokens: the permissions the source needs of the signed-in user's mailbox.
DELEGATED_SCOPES = ["https://graph.microsoft.com/Mail.Read"]


class TokenSource:
    """The current access token of the ``graph`` section's application; thread-safe."""

    def __init__(self, settings: GraphSourceSettings) -> None:
        self.settings = settings
        self._lock = threading.Lock()
        self._refresh_token = settings.refresh() if settings.auth == "refresh_token" else None
        self._delegated_token: str | None = None
        #: MSAL fetches the authority's OpenID metadata when the application is made; an
        #: authority not reachable yet (no network, DNS) leaves it to the first token, so the
        #: worker's backoff retries it (ConnectionLost) instead of the start failing.
        self._app: msal.ClientApplication | None = None
        try:
            self._app = self._application(settings)
        except requests.RequestException as exc:
            log.warning(
                "graph: authority %s/%s unreachable at start (%s); retrying with the first token",
                settings.authority_host,
                settings.tenant_id,
                type(exc).__name__,
            )

    @staticmethod
    def _application(settings: GraphSourceSettings) -> msal.ClientApplication:
        authority = f"{settings.authority_host}/{settings.tenant_id}"
        common: dict[str, Any] = {
            "authority": authority,
            "http_client": msal_http_session(settings.ca_file),
        }
        if not settings.authority_host.startswith("https://login.microsoftonline.com"):
            # A national cloud or the test server: no instance discovery at Microsoft's host.
            common["instance_discovery"] = False
        credential: Any
        if settings.auth == "client_certificate":
            assert settings.certificate_file is not None
            credential = certificate_credential(
                settings.certificate_file.read_bytes(),
                settings.certificate_password.get_secret_value()
                if settings.certificate_password
                else None,
            )
        else:
            credential = settings.secret()
        if settings.auth == "refresh_token" and credential is None:
            return msal.PublicClientApplication(settings.client_id, **common)
        return msal.ConfidentialClientApplication(
            settings.client_id, client_credential=credential, **common
        )

    def token(self) -> str:
        """A valid access token (from MSAL's cache while it lives)."""
        with self._lock:
            try:
                if self._app is None:
                    self._app = self._application(self.settings)
                result = self._acquire(self._app)
            except requests.RequestException as exc:
                raise ConnectionLost(f"token endpoint unreachable: {type(exc).__name__}") from None
            if "access_token" in result:
                if self._refresh_token is not None and result.get("refresh_token"):
                    self._refresh_token = str(result["refresh_token"])
                return str(result["access_token"])
            error = str(result.get("error", "unknown_error"))
            # error_description names the tenant and client, never the secret.
            message = f"token endpoint refused the application: {error}"
            description = result.get("error_description")
            if description:
                message += f" ({str(description).splitlines()[0][:200]})"
            if error in TOKEN_REFUSALS:
                raise AccessDenied(message)
            raise ConnectionLost(message)

    def _acquire(self, app: msal.ClientApplication) -> dict[str, Any]:
        if self._refresh_token is None:
            assert isinstance(app, msal.ConfidentialClientApplication)
            return dict(app.acquire_token_for_client(scopes=APP_SCOPES) or {})
        # Delegated: MSAL keeps the account's tokens in its cache once redeemed.
        accounts = app.get_accounts()
        if accounts:
            cached = app.acquire_token_silent(DELEGATED_SCOPES, account=accounts[0])
            if cached and "access_token" in cached:
                return dict(cached)
        return dict(app.acquire_token_by_refresh_token(self._refresh_token, DELEGATED_SCOPES) or {})

    def refused(self) -> None:
        """Graph refused the current token (401): forget the cached access tokens."""
        with self._lock:
            if self._app is None:
                return
            forget_access_tokens(self._app)
