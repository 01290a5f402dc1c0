"""connectors.core.kafka.security: each authentication / TLS failure librdkafka reports
(texts as librdkafka 2.16 wrote them against the secured dev broker) gets its own sentence,
naming the setting to change; other errors are not its business. A client key that does not
open is refused before any client is built."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import KafkaError

from connectors.core.config import KafkaSettings
from connectors.core.kafka.security import librdkafka_security, refusal
from mailtap.dev.certs import CertificateAuthority

BROKER = "127.0.0.1:9093"
SCRAM: dict[str, Any] = {
    "bootstrap_servers": BROKER,
    "security_protocol": "SASL_SSL",
    "sasl_mechanism": "SCRAM-SHA-512",
    "sasl_username": "mailtap-smtp-sink",
    "sasl_password": "the-secret",
    "ssl_ca_location": "/etc/mailtap/ca.pem",
}
OAUTH: dict[str, Any] = {
    "bootstrap_servers": BROKER,
    "security_protocol": "SASL_SSL",
    "sasl_mechanism": "OAUTHBEARER",
    "sasl_oauthbearer": {
        "token_url": "https://idp.example.com/token",
        "client_id": "mailtap-streams",
        "client_secret": "the-client-secret",
        "scope": "kafka",
    },
}
ALERT_46 = (
    f"ssl://{BROKER}/bootstrap: Receive failed: error:0A000416:SSL routines::ssl/tls alert "
    "certificate unknown: SSL alert number 46 (after 212ms in state APIVERSION_QUERY)"
)


def _sentence(values: dict[str, Any], code: int, text: str) -> str:
    sentence = refusal(KafkaSettings.model_validate(values), KafkaError(code, text))
    assert sentence is not None
    assert "cannot reach" not in sentence
    assert "the-secret" not in sentence and "the-client-secret" not in sentence
    return sentence


def test_wrong_password_names_the_user_and_the_credential_settings() -> None:
    sentence = _sentence(
        SCRAM,
        KafkaError._AUTHENTICATION,
        f"sasl_ssl://{BROKER}/bootstrap: SASL authentication error: Authentication failed "
        "during authentication due to invalid credentials with SASL mechanism SCRAM-SHA-512 "
        "(after 421ms in state AUTH_REQ)",
    )
    assert sentence.startswith(f"kafka: {BROKER} refused the login of mailtap-smtp-sink")
    assert "invalid credentials" in sentence and "(after" not in sentence
    assert sentence.endswith("check kafka.sasl_username and kafka.sasl_password")


def test_untrusted_broker_certificate_names_the_ca_setting() -> None:
    sentence = _sentence(
        SCRAM,
        KafkaError._SSL,
        f"sasl_ssl://{BROKER}/bootstrap: SSL handshake failed: error:0A000086:SSL routines::"
        "certificate verify failed: broker certificate could not be verified, verify that "
        "ssl.ca.location is correctly configured or root CA certificates are installed "
        "(install ca-certificates package) (after 7ms in state SSL_HANDSHAKE)",
    )
    assert "is not trusted (SSL handshake failed" in sentence
    assert "kafka.ssl_ca_location (/etc/mailtap/ca.pem) must hold the CA" in sentence


def test_expired_client_certificate_says_when_it_expired(tmp_path: Path) -> None:
    ca = CertificateAuthority.create(tmp_path / "ca")
    old = ca.issue(tmp_path / "old", "mailtap-smtp-sink", valid_days=-2)
    values = {
        "bootstrap_servers": BROKER,
        "security_protocol": "SSL",
        "ssl_certificate_location": str(old.certificate),
        "ssl_key_location": str(old.key),
    }
    sentence = _sentence(values, KafkaError._TRANSPORT, ALERT_46)
    assert f"refused the client certificate {old.certificate}: it expired on " in sentence
    assert "renew it" in sentence


def test_client_certificate_from_another_ca_is_refused_as_such(tmp_path: Path) -> None:
    pair = CertificateAuthority.create(tmp_path / "other").issue(tmp_path / "c", "x")
    values = {
        "bootstrap_servers": BROKER,
        "security_protocol": "SSL",
        "ssl_certificate_location": str(pair.certificate),
        "ssl_key_location": str(pair.key),
    }
    sentence = _sentence(values, KafkaError._TRANSPORT, ALERT_46)
    assert "must be signed by a CA the broker trusts" in sentence


def test_missing_client_certificate_on_an_mtls_listener() -> None:
    sentence = _sentence(
        {
            **SCRAM,
            "security_protocol": "SSL",
            "sasl_mechanism": None,
            "sasl_username": None,
            "sasl_password": None,
        },
        KafkaError._TRANSPORT,
        f"ssl://{BROKER}/bootstrap: Receive failed: error:0A000412:SSL routines::ssl/tls alert "
        "bad certificate: SSL alert number 42 (after 0ms in state APIVERSION_QUERY)",
    )
    assert "requires a client certificate (mTLS)" in sentence


def test_token_endpoint_refusing_the_client_names_the_oauth_settings() -> None:
    sentence = _sentence(
        OAUTH,
        KafkaError._AUTHENTICATION,
        'Failed to acquire SASL OAUTHBEARER token: {"error": "invalid_client"}',
    )
    assert (
        "the token endpoint https://idp.example.com/token gave client mailtap-streams" in sentence
    )
    assert "invalid_client" in sentence
    assert "kafka.sasl_oauthbearer.client_id, client_secret and scope" in sentence


def test_broker_refusing_a_token_names_the_issuer() -> None:
    sentence = _sentence(
        OAUTH,
        KafkaError._AUTHENTICATION,
        f'sasl_ssl://{BROKER}/bootstrap: SASL authentication error: {{"status":"invalid_token"}}',
    )
    assert "refused the OAUTHBEARER token of client mailtap-streams" in sentence


@pytest.mark.parametrize(
    ("code", "text"),
    [
        (
            KafkaError._TRANSPORT,
            f"{BROKER}/bootstrap: Connect to ipv4#{BROKER} failed: Connection refused",
        ),
        (KafkaError._ALL_BROKERS_DOWN, "1/1 brokers are down"),
        (KafkaError._TIMED_OUT, "Timed out"),
    ],
)
def test_other_errors_are_not_refusals(code: int, text: str) -> None:
    assert refusal(KafkaSettings.model_validate(SCRAM), KafkaError(code, text)) is None


def test_a_client_key_that_does_not_open_is_a_config_error_before_any_client(
    tmp_path: Path,
) -> None:
    from connectors.core.errors import ConfigError
    from connectors.core.kafka.security import librdkafka_security

    ca = CertificateAuthority.create(tmp_path / "ca")
    locked = ca.issue(tmp_path / "locked", "c1", key_password="right")
    plain = ca.issue(tmp_path / "plain", "c2")

    def settings(pair_cert: Path, pair_key: Path, password: str | None) -> KafkaSettings:
        values: dict[str, Any] = {
            "bootstrap_servers": BROKER,
            "security_protocol": "SSL",
            "ssl_certificate_location": str(pair_cert),
            "ssl_key_location": str(pair_key),
        }
        if password is not None:
            values["ssl_key_password"] = password
        return KafkaSettings.model_validate(values)

    conf = librdkafka_security(settings(locked.certificate, locked.key, "right"))
    assert conf["ssl.key.password"] == "right"
    with pytest.raises(ConfigError, match=r"kafka.ssl_key_password is wrong") as wrong:
        librdkafka_security(settings(locked.certificate, locked.key, "wrong"))
    assert "right" not in str(wrong.value)
    with pytest.raises(ConfigError, match=r"is encrypted: set kafka.ssl_key_password"):
        librdkafka_security(settings(locked.certificate, locked.key, None))
    with pytest.raises(ConfigError, match=r"is not encrypted: remove kafka.ssl_key_password"):
        librdkafka_security(settings(plain.certificate, plain.key, "x"))
    with pytest.raises(ConfigError, match=r"cannot read kafka.ssl_key_location"):
        librdkafka_security(settings(plain.certificate, tmp_path / "missing.pem", None))


def test_the_oauthbearer_client_secret_can_come_from_a_file(tmp_path: Path) -> None:
    secret_file = tmp_path / "client-secret"
    secret_file.write_text("secret-from-file\n")
    oauth = {k: v for k, v in OAUTH["sasl_oauthbearer"].items() if k != "client_secret"}
    kafka = KafkaSettings.model_validate(
        {**OAUTH, "sasl_oauthbearer": {**oauth, "client_secret_file": str(secret_file)}}
    )

    conf = librdkafka_security(kafka)

    assert conf["sasl.oauthbearer.client.secret"] == "secret-from-file"
    assert "secret-from-file" not in repr(kafka)
