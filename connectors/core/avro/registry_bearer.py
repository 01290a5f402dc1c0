"""The registry client's bearer token (``kafka.schema_registry.bearer_auth``): mailtap's own
client-credentials token source (:mod:`connectors.core.oauth2`) handed to confluent-kafka's
``SchemaRegistryClient`` as its ``CUSTOM`` bearer field provider.

Why not the client's own ``OAUTHBEARER`` source: it cannot be told a CA for the token endpoint
(its httpx client verifies against the system store only), it wraps every refusal in a generic
``OAuthTokenError`` after its retries, and it would be a second token cache beside the one the
IMAP source and streams already use. Through ``CUSTOM`` the token is fetched, cached and
refreshed before it expires exactly as for the Kafka and IMAP logins, and a refusal is a
sentence naming mailtap's settings.

confluent-kafka 2.16 requires ``bearer.auth.logical.cluster`` from every provider and sends it
as ``target-sr-cluster`` (a Confluent Cloud notion); for any other registry it is sent empty,
the workaround its maintainers give (confluent-kafka-python#2142), which registries that do not
know the header ignore. ``Confluent-Identity-Pool-Id`` is sent only when configured.

Wire sample (what the registry receives)::

    POST /subjects/mail.events-value/versions HTTP/1.1
    Authorization: Bearer eyJhbGciOiJSUzI1NiIs...
    target-sr-cluster:
"""

from __future__ import annotations

from functools import partial
from typing import Any

from connectors.core.config import ClientCredentialsSettings, SchemaRegistryClientSettings
from connectors.core.errors import ConfigError, TokenEndpointUnavailable, TokenRequestRefused

#: The setting every sentence below names.
SETTING = "kafka.schema_registry.bearer_auth"

#: The token last handed to the registry client per login (what a 401 refused).
_sent: dict[ClientCredentialsSettings, str] = {}


def bearer_config(login: SchemaRegistryClientSettings) -> dict[str, Any]:
    """The ``SchemaRegistryClient`` settings that make it send ``login``'s bearer token (empty
    when ``login`` has no ``bearer_auth``)."""
    if login.bearer_auth is None:
        return {}
    return {
        "bearer.auth.credentials.source": "CUSTOM",
        "bearer.auth.custom.provider.function": partial(_bearer_fields, login),
        "bearer.auth.custom.provider.config": {},
    }


def _bearer_fields(login: SchemaRegistryClientSettings, _config: dict[str, Any]) -> dict[str, str]:
    """Called by the registry client before every request: the current token (cached, or new
    once the cached one is near its expiry) and the Confluent Cloud routing fields."""
    from connectors.core.oauth2 import client_credentials

    settings = login.bearer_auth
    assert settings is not None  # bearer_config installs this provider only with bearer_auth
    try:
        token = client_credentials(settings).token()
    except TokenRequestRefused as exc:
        raise token_refused(settings, exc) from None
    _sent[settings] = token
    fields = {
        "bearer.auth.token": token,
        "bearer.auth.logical.cluster": login.bearer_auth_logical_cluster or "",
    }
    if login.bearer_auth_identity_pool_id is not None:
        fields["bearer.auth.identity.pool.id"] = login.bearer_auth_identity_pool_id
    return fields


def forget_refused_token(login: SchemaRegistryClientSettings) -> None:
    """The registry answered 401 to the token last sent for ``login``: drop it from the cache
    (revoked, or signed with a key the registry no longer trusts), so that the next request,
    after the caller's backoff, asks the token endpoint for a new one instead of sending the
    refused token until its refresh time."""
    from connectors.core.oauth2 import client_credentials

    if login.bearer_auth is not None and login.bearer_auth in _sent:
        client_credentials(login.bearer_auth).refused(_sent[login.bearer_auth])


def token_refused(settings: ClientCredentialsSettings, exc: TokenRequestRefused) -> ConfigError:
    """The token endpoint refused mailtap's client: a sentence without the secret."""
    return ConfigError(
        f"the token endpoint {settings.token_url} refused client {settings.client_id} a token "
        f"for the schema registry ({exc.error}); check {SETTING}.client_id, client_secret and "
        f"scope"
    )


def token_unavailable(settings: ClientCredentialsSettings, exc: Exception) -> ConfigError:
    """The token endpoint did not answer (or failed) at start: a sentence naming the settings."""
    reason = str(exc) if isinstance(exc, TokenEndpointUnavailable) else type(exc).__name__
    return ConfigError(
        f"no token for the schema registry: {reason}; check {SETTING}.token_url (and "
        f"{SETTING}.ca_file for a private CA) and that the endpoint runs"
    )
