"""The security settings of :class:`KafkaSettings` as librdkafka properties, in one place.

Every librdkafka client of mailtap (sources, sink, CLI commands, the streams worker's admin
checks) gets these through :func:`connectors.core.kafka.clients.client_config`; the streams worker's
aiokafka clients get the same settings from :mod:`streams.kafka_security`, and
``tests/unit/streams/test_streams_kafka_security.py`` checks that both say the same for every
combination the settings model accepts.

=====================  ===========================================================
settings               librdkafka
=====================  ===========================================================
SASL_SSL + SCRAM/PLAIN ``sasl.mechanism``, ``sasl.username``, ``sasl.password``
SSL + client cert      ``ssl.certificate.location``, ``ssl.key.location``
                       (+ ``ssl.key.password``): mTLS
SASL_SSL + OAUTHBEARER ``sasl.oauthbearer.method=oidc``: librdkafka fetches and refreshes
                       the token itself (client credentials at ``token_url``;
                       ``https.ca.location`` = ``sasl_oauthbearer.ca_file``)
any TLS                ``ssl.ca.location``; verification of the chain and of the host name
                       always on (DESIGN.md, security rules)
=====================  ===========================================================
"""

from __future__ import annotations

import datetime
import functools
import re
from pathlib import Path
from typing import Any

from confluent_kafka import KafkaError

from connectors.core.config import KafkaSettings
from connectors.core.errors import ConfigError

__all__ = ["librdkafka_security", "refusal", "uses_tls"]


def uses_tls(kafka: KafkaSettings) -> bool:
    return kafka.security_protocol in ("SSL", "SASL_SSL")


def librdkafka_security(kafka: KafkaSettings) -> dict[str, Any]:
    """``security.protocol`` and what goes with it; secrets in clear (for the client only)."""
    conf: dict[str, Any] = {"security.protocol": kafka.security_protocol}
    if uses_tls(kafka):
        conf["enable.ssl.certificate.verification"] = True
        conf["ssl.endpoint.identification.algorithm"] = "https"
        if kafka.ssl_ca_location:
            conf["ssl.ca.location"] = kafka.ssl_ca_location
        if kafka.ssl_certificate_location and kafka.ssl_key_location:
            password = kafka.ssl_key_password.get_secret_value() if kafka.ssl_key_password else None
            _client_key_opens(kafka.ssl_key_location, password)
            conf["ssl.certificate.location"] = kafka.ssl_certificate_location
            conf["ssl.key.location"] = kafka.ssl_key_location
            if password is not None:
                conf["ssl.key.password"] = password
    if kafka.sasl_mechanism:
        conf["sasl.mechanism"] = kafka.sasl_mechanism
    oauth = kafka.sasl_oauthbearer
    if kafka.sasl_mechanism == "OAUTHBEARER" and oauth is not None:
        conf.update(
            {
                "sasl.oauthbearer.method": "oidc",
                "sasl.oauthbearer.token.endpoint.url": oauth.token_url,
                "sasl.oauthbearer.client.id": oauth.client_id,
                "sasl.oauthbearer.client.secret": oauth.secret(),
                "sasl.oauthbearer.scope": oauth.scope,
            }
        )
        if oauth.ca_file:
            conf["https.ca.location"] = oauth.ca_file
    else:
        if kafka.sasl_username:
            conf["sasl.username"] = kafka.sasl_username
        if kafka.sasl_password:
            conf["sasl.password"] = kafka.sasl_password.get_secret_value()
    return conf


@functools.lru_cache(maxsize=16)
def _client_key_opens(key_location: str, password: str | None) -> None:
    """Raise a `ConfigError` naming the setting unless the client key opens with ``password``.

    librdkafka would refuse it only when the client is built, as ``ssl.key.location failed:
    error:...:PEM lib``; checked once per (file, password) and process.
    """
    from cryptography.hazmat.primitives.serialization import load_pem_private_key

    try:
        data = Path(key_location).read_bytes()
    except OSError as exc:
        raise ConfigError(
            f"kafka: cannot read kafka.ssl_key_location {key_location} ({exc.strerror})"
        ) from None
    try:
        load_pem_private_key(data, password.encode() if password is not None else None)
    except TypeError:  # a password for a plain key, or none for an encrypted one
        if password is None:
            problem = "is encrypted: set kafka.ssl_key_password"
        else:
            problem = "is not encrypted: remove kafka.ssl_key_password"
        raise ConfigError(f"kafka: the private key {key_location} {problem}") from None
    except ValueError:
        raise ConfigError(
            f"kafka: cannot open the private key {key_location}: kafka.ssl_key_password is "
            "wrong, or the file is not a PEM private key"
        ) from None


#: TLS alerts a broker sends when it refuses the client's certificate (or its absence); librdkafka
#: reports them as transport errors ("Receive failed: ... alert certificate unknown").
_CLIENT_CERTIFICATE_REFUSED = re.compile(
    r"alert (certificate unknown|bad certificate|certificate expired|certificate revoked|"
    r"unknown ca|certificate required|unsupported certificate)",
    re.IGNORECASE,
)
#: "sasl_ssl://127.0.0.1:9093/bootstrap: " before, "(after 5ms in state AUTH_REQ)" after.
_BROKER_PREFIX = re.compile(r"^\S+://\S+?/\S+?: ")
_STATE_SUFFIX = re.compile(r"\s*\(after \d+ms in state \w+\)")


def _detail(text: str) -> str:
    return _STATE_SUFFIX.sub("", _BROKER_PREFIX.sub("", text)).strip()


def _expired_on(certificate: str) -> datetime.datetime | None:
    """When the client certificate expired, if it has; None when valid or unreadable."""
    from cryptography import x509

    try:
        cert = x509.load_pem_x509_certificate(Path(certificate).read_bytes())
    except (OSError, ValueError):
        return None
    expiry = cert.not_valid_after_utc
    return expiry if expiry < datetime.datetime.now(datetime.UTC) else None


def refusal(kafka: KafkaSettings, error: KafkaError) -> str | None:
    """The sentence for a client error that is an authentication or TLS failure (what was
    refused, by whom, which setting to change), or None for any other error.

    librdkafka reports these within a second of the first connection attempt, then keeps
    retrying; only a metadata timeout ("Broker transport failure") would follow.

    >>> k = KafkaSettings(bootstrap_servers="b:9093", security_protocol="SASL_SSL",
    ...     sasl_mechanism="SCRAM-SHA-512", sasl_username="mailtap-smtp-sink", sasl_password="x")
    >>> print(refusal(k, KafkaError(KafkaError._AUTHENTICATION, "sasl_ssl://b:9093/bootstrap: "
    ...     "SASL authentication error: Authentication failed during authentication due to "
    ...     "invalid credentials with SASL mechanism SCRAM-SHA-512 (after 321ms in state AUTH_REQ)")))
    kafka: b:9093 refused the login of mailtap-smtp-sink with SCRAM-SHA-512 (SASL authentication error: Authentication failed during authentication due to invalid credentials with SASL mechanism SCRAM-SHA-512); check kafka.sasl_username and kafka.sasl_password
    """
    code, text = error.code(), error.str()
    servers = kafka.bootstrap_servers
    detail = _detail(text)
    oauth = kafka.sasl_oauthbearer
    if code == KafkaError._AUTHENTICATION:
        if oauth is not None and ("OAUTHBEARER token" in text or "OIDC" in text):
            return (
                f"kafka: the token endpoint {oauth.token_url} gave client {oauth.client_id} no "
                f"token ({detail}); check kafka.sasl_oauthbearer.client_id, client_secret and "
                "scope"
            )
        if oauth is not None:
            return (
                f"kafka: {servers} refused the OAUTHBEARER token of client {oauth.client_id} "
                f"({detail}); the broker must accept tokens of {oauth.token_url} (its JWKS, "
                "issuer and audience settings)"
            )
        return (
            f"kafka: {servers} refused the login of {kafka.sasl_username} with "
            f"{kafka.sasl_mechanism} ({detail}); check kafka.sasl_username and "
            "kafka.sasl_password"
        )
    if code == KafkaError._SSL or "certificate verify failed" in text:
        trusted = kafka.ssl_ca_location or "the system's CA store"
        return (
            f"kafka: the TLS certificate of {servers} is not trusted ({detail}); "
            f"kafka.ssl_ca_location ({trusted}) must hold the CA that signed the broker's "
            "certificate, for a host name the certificate names"
        )
    if _CLIENT_CERTIFICATE_REFUSED.search(text):
        certificate = kafka.ssl_certificate_location
        if certificate is None:
            return (
                f"kafka: {servers} requires a client certificate (mTLS) and refused the "
                f"connection ({detail}); set kafka.ssl_certificate_location and "
                "kafka.ssl_key_location, or use the listener for your mechanism"
            )
        expired = _expired_on(certificate)
        if expired is not None:
            return (
                f"kafka: {servers} refused the client certificate {certificate}: it expired on "
                f"{expired:%Y-%m-%d %H:%M} UTC ({detail}); renew it "
                "(kafka.ssl_certificate_location, kafka.ssl_key_location)"
            )
        return (
            f"kafka: {servers} refused the client certificate {certificate} ({detail}); it "
            "must be signed by a CA the broker trusts (kafka.ssl_certificate_location)"
        )
    return None
