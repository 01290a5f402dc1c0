"""The security settings of :class:`KafkaSettings` for aiokafka (through faust), in one place.

The same settings reach librdkafka through :mod:`connectors.core.kafka.security`;
``tests/unit/streams/test_streams_kafka_security.py`` checks that both mappings agree for every
combination the settings model accepts.

aiokafka takes TLS as an :class:`ssl.SSLContext`: the CA (``ssl_ca_location``, else the system
store), and for mTLS the client certificate chain and key (``load_cert_chain``, with the key's
password). Verification of the chain and of the host name is always on. OAUTHBEARER needs a token
provider object: :class:`ClientCredentialsTokenProvider` asks the OIDC token endpoint with the
client-credentials grant (:mod:`connectors.core.oauth2`, shared with the IMAP XOAUTH2 login) and
keeps the token until shortly before it expires; aiokafka asks for a token at every connection.
"""

from __future__ import annotations

import asyncio
import ssl
from typing import Any

import faust
from aiokafka.abc import AbstractTokenProvider
from faust.types.auth import CredentialsT

from connectors.core.config import ClientCredentialsSettings, KafkaSettings
from connectors.core.errors import ConfigError

__all__ = ["ClientCredentialsTokenProvider", "aiokafka_security", "faust_credentials"]


class ClientCredentialsTokenProvider(AbstractTokenProvider):  # type: ignore[misc]  # untyped base
    """OAUTHBEARER tokens for aiokafka from an OIDC token endpoint (client credentials)."""

    def __init__(self, settings: ClientCredentialsSettings) -> None:
        # Imported here: requests-oauthlib is only needed by deployments that use OAuth.
        from connectors.core.oauth2 import client_credentials

        self.settings = settings
        self._credentials = client_credentials(settings)

    async def token(self) -> str:
        # The token request is blocking HTTP (requests); off the event loop so that heartbeats
        # and fetches of other connections go on meanwhile.
        return await asyncio.to_thread(self._credentials.token)

    def __repr__(self) -> str:  # no secret, no token
        return f"<{type(self).__name__} client_id={self.settings.client_id!r}>"


def _ssl_context(kafka: KafkaSettings) -> ssl.SSLContext:
    context = ssl.create_default_context(cafile=kafka.ssl_ca_location)
    if kafka.ssl_certificate_location and kafka.ssl_key_location:
        password = kafka.ssl_key_password.get_secret_value() if kafka.ssl_key_password else None
        try:
            context.load_cert_chain(
                kafka.ssl_certificate_location, kafka.ssl_key_location, password=password
            )
        except (OSError, ssl.SSLError) as exc:
            raise ConfigError(
                f"kafka: cannot load the client certificate {kafka.ssl_certificate_location} "
                f"with key {kafka.ssl_key_location} ({exc}); check both paths and "
                "ssl_key_password"
            ) from None
    return context


def aiokafka_security(kafka: KafkaSettings) -> dict[str, Any]:
    """The security keyword arguments of aiokafka's clients (``security_protocol``,
    ``ssl_context``, ``sasl_mechanism``, ``sasl_plain_username``/``password`` or
    ``sasl_oauth_token_provider``)."""
    kwargs: dict[str, Any] = {"security_protocol": kafka.security_protocol}
    if kafka.security_protocol in ("SSL", "SASL_SSL"):
        kwargs["ssl_context"] = _ssl_context(kafka)
    if kafka.sasl_mechanism:
        kwargs["sasl_mechanism"] = kafka.sasl_mechanism
    if kafka.sasl_mechanism == "OAUTHBEARER" and kafka.sasl_oauthbearer is not None:
        kwargs["sasl_oauth_token_provider"] = ClientCredentialsTokenProvider(kafka.sasl_oauthbearer)
    elif kafka.sasl_mechanism:
        kwargs["sasl_plain_username"] = kafka.sasl_username
        kwargs["sasl_plain_password"] = (
            kafka.sasl_password.get_secret_value() if kafka.sasl_password else None
        )
    return kwargs


def faust_credentials(kafka: KafkaSettings) -> CredentialsT | None:
    """The ``broker_credentials`` of the faust app: faust turns them back into exactly the
    keyword arguments of :func:`aiokafka_security` (``credentials_to_aiokafka_auth``)."""
    kwargs = aiokafka_security(kafka)
    context = kwargs.get("ssl_context")
    mechanism = kwargs.get("sasl_mechanism")
    if mechanism == "OAUTHBEARER":
        return faust.OAuthCredentials(
            oauth_cb=kwargs["sasl_oauth_token_provider"], ssl_context=context
        )
    if mechanism is not None:
        return faust.SASLCredentials(
            username=kwargs["sasl_plain_username"],
            password=kwargs["sasl_plain_password"],
            ssl_context=context,
            mechanism=mechanism,
        )
    if context is not None:
        return faust.SSLCredentials(context)
    return None
