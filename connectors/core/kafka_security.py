"""The security settings of :class:`KafkaSettings` as librdkafka properties, in one place.

Every librdkafka client of mailtap (sources, sink, CLI commands, the streams worker's admin
checks) gets these through :func:`connectors.core.kafka.client_config`; the streams worker's
aiokafka clients get the same settings from :mod:`streams.kafka_security`, and
``tests/unit/streams/test_kafka_security_agree.py`` checks that both say the same for every
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

from typing import Any

from connectors.core.config import KafkaSettings

__all__ = ["librdkafka_security", "uses_tls"]


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
            conf["ssl.certificate.location"] = kafka.ssl_certificate_location
            conf["ssl.key.location"] = kafka.ssl_key_location
            if kafka.ssl_key_password is not None:
                conf["ssl.key.password"] = kafka.ssl_key_password.get_secret_value()
    if kafka.sasl_mechanism:
        conf["sasl.mechanism"] = kafka.sasl_mechanism
    oauth = kafka.sasl_oauthbearer
    if kafka.sasl_mechanism == "OAUTHBEARER" and oauth is not None:
        conf.update(
            {
                "sasl.oauthbearer.method": "oidc",
                "sasl.oauthbearer.token.endpoint.url": oauth.token_url,
                "sasl.oauthbearer.client.id": oauth.client_id,
                "sasl.oauthbearer.client.secret": oauth.client_secret.get_secret_value(),
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
