"""OAuth2 access tokens fetched by mailtap itself: the client-credentials grant (RFC 6749 4.4).

An application registered with the identity provider (Microsoft Entra ID for Microsoft 365, or
any OAuth2 server) gets access tokens for a mailbox with its client id and secret, without a
user: ``token_url`` is the provider's token endpoint, ``scope`` what the token is for (for IMAP
at Microsoft 365: ``https://outlook.office365.com/.default``). The grant itself is
requests-oauthlib's (``OAuth2Session`` with oauthlib's ``BackendApplicationClient``).

A token is cached until shortly before it expires (``REFRESH_BEFORE_S``, or half its lifetime
for short-lived ones), shared by every connection of the account, and dropped when a server
refused it (revoked before its time): the next login fetches a new one.

Failures: the endpoint refusing the client (``invalid_client``, ``unauthorized_client``,
``invalid_scope``, any 4xx) is a :class:`~connectors.core.errors.TokenRequestRefused`, an
``AuthenticationError`` (a retry at full speed would not help); an unreachable endpoint or a 5xx
answer is transient (:class:`TokenEndpointUnavailable`, an OSError: back off and retry). The
endpoint is reached over HTTPS with certificate verification only (DESIGN.md security rules);
``ca_file`` names a private CA. The secret and the tokens never appear in a message.
"""

from __future__ import annotations

import functools
import logging
import threading
import time

import requests
from oauthlib.oauth2 import BackendApplicationClient, OAuth2Error
from requests_oauthlib import OAuth2Session

from connectors.core.config import ClientCredentialsSettings
from connectors.core.errors import TokenEndpointUnavailable, TokenRequestRefused
from connectors.core.redact import quiet_token_libraries

log = logging.getLogger(__name__)
quiet_token_libraries()  # at DEBUG they would log the token endpoint's answer

__all__ = [
    "ClientCredentials",
    "TokenEndpointUnavailable",
    "client_credentials",
]

#: A cached token is replaced this long before it expires (or at half its life, if shorter).
REFRESH_BEFORE_S = 300.0
#: Without ``expires_in`` in the answer, a token is kept this long.
DEFAULT_LIFETIME_S = 3600.0


class ClientCredentials:
    """The current access token of one (endpoint, client, scope); thread-safe."""

    def __init__(self, settings: ClientCredentialsSettings) -> None:
        self.settings = settings
        self._lock = threading.Lock()
        self._token: str | None = None
        self._refresh_at = 0.0

    def token(self) -> str:
        """A token valid for a while yet: the cached one, or a new one from the endpoint."""
        with self._lock:
            if self._token is None or time.monotonic() >= self._refresh_at:
                self._token, lifetime = self._fetch()
                self._refresh_at = time.monotonic() + lifetime - min(REFRESH_BEFORE_S, lifetime / 2)
                log.info(
                    "oauth2: new access token for client %s from %s, valid for %.0f s",
                    self.settings.client_id,
                    self.settings.token_url,
                    lifetime,
                    extra={"client_id": self.settings.client_id},
                )
            return self._token

    def refused(self, token: str) -> None:
        """A server refused ``token``: forget it, so the next login fetches a new one."""
        with self._lock:
            if self._token == token:
                self._token = None

    def _fetch(self) -> tuple[str, float]:
        s = self.settings
        session = OAuth2Session(client=BackendApplicationClient(client_id=s.client_id))
        # requests-oauthlib parses any answer as a token response; a 5xx page is an outage.
        session.register_compliance_hook("access_token_response", _server_error_is_transient)
        try:
            answer = session.fetch_token(
                s.token_url,
                client_secret=s.secret(),
                scope=s.scope.split(),
                timeout=s.timeout_seconds,
                verify=s.ca_file or True,
            )
        except OAuth2Error as exc:
            status = exc.status_code or 400
            if status >= 500:
                raise TokenEndpointUnavailable(
                    f"token endpoint {s.token_url} failed ({status} {exc.error})"
                ) from None
            raise TokenRequestRefused(
                f"token endpoint {s.token_url} refused client {s.client_id}: {exc.error}"
                f"{' (' + exc.description + ')' if exc.description else ''}; check the "
                "client id, secret and scope",
                s.token_url,
                s.client_id,
                exc.error,
            ) from None
        except requests.RequestException as exc:
            raise TokenEndpointUnavailable(
                f"cannot reach token endpoint {s.token_url}: {type(exc).__name__}"
            ) from None
        except ValueError as exc:  # an answer that is not a token (HTML from a proxy, ...)
            raise TokenEndpointUnavailable(
                f"token endpoint {s.token_url} answered something that is not a token: {exc}"
            ) from None
        token = answer.get("access_token")
        if not isinstance(token, str) or not token:
            raise TokenEndpointUnavailable(f"token endpoint {s.token_url} sent no access_token")
        lifetime = answer.get("expires_in")
        return token, float(lifetime) if lifetime else DEFAULT_LIFETIME_S


def _server_error_is_transient(response: requests.Response) -> requests.Response:
    if response.status_code >= 500:
        raise TokenEndpointUnavailable(
            f"token endpoint {response.url} failed ({response.status_code})"
        )
    return response


@functools.cache
def client_credentials(settings: ClientCredentialsSettings) -> ClientCredentials:
    """One token cache per settings, shared by every connection that uses them."""
    return ClientCredentials(settings)
