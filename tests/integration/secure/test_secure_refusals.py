"""A wrong password, an expired client certificate, a CA that does not match, a token endpoint
that refuses the client: each is reported as what it is, not as "cannot reach Kafka".

Every wait below is given 5 s (`REPORT_WITHIN_S`): librdkafka reports these within a second of
its first attempt, and a wait that did not recognise the refusal would end after the 5 s with
`KafkaUnavailable` ("cannot reach Kafka ... check kafka.bootstrap_servers"), failing the test.
The same path as every component and CLI command: `connectors.core.kafka.cluster_metadata`.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from connectors.core.config import KafkaSettings
from connectors.core.kafka.clients import admin_client, cluster_metadata
from connectors.core.kafka.errors import KafkaSecurityRefused
from mailtap.dev.certs import CertificateAuthority
from mailtap.dev.secure import SecureKafka
from tests.integration.secure.conftest import KafkaSettingsFor

REPORT_WITHIN_S = 5.0


def _refusal(kafka: KafkaSettings) -> str:
    with pytest.raises(KafkaSecurityRefused) as refused:
        cluster_metadata(admin_client(kafka), kafka, REPORT_WITHIN_S)
    sentence = str(refused.value)
    assert "cannot reach Kafka" not in sentence
    return sentence


def test_wrong_scram_password(kafka_settings: KafkaSettingsFor) -> None:
    kafka = kafka_settings("smtp-sink", "scram-sha-512", sasl_password="not-the-password")
    sentence = _refusal(kafka)
    assert f"{kafka.bootstrap_servers} refused the login of mailtap-smtp-sink" in sentence
    assert "invalid credentials" in sentence
    assert "check kafka.sasl_username and kafka.sasl_password" in sentence
    assert "not-the-password" not in sentence


def test_expired_client_certificate(
    secure_kafka: SecureKafka, kafka_settings: KafkaSettingsFor, tmp_path: Path
) -> None:
    ca = CertificateAuthority(Path(secure_kafka.ca_location).parent)
    expired = ca.issue(tmp_path / "expired", "mailtap-smtp-sink", valid_days=-1)
    kafka = kafka_settings(
        "smtp-sink",
        "mtls",
        ssl_certificate_location=str(expired.certificate),
        ssl_key_location=str(expired.key),
    )
    sentence = _refusal(kafka)
    assert f"refused the client certificate {expired.certificate}: it expired on" in sentence


def test_ca_that_did_not_sign_the_broker_certificate(
    kafka_settings: KafkaSettingsFor, tmp_path: Path
) -> None:
    other = CertificateAuthority.create(tmp_path / "other-ca", name="some other CA")
    kafka = kafka_settings("smtp-sink", "scram-sha-512", ssl_ca_location=str(other.certificate))
    sentence = _refusal(kafka)
    assert "is not trusted" in sentence and "certificate verify failed" in sentence
    assert f"kafka.ssl_ca_location ({other.certificate}) must hold the CA" in sentence


def test_client_certificate_of_another_ca(kafka_settings: KafkaSettingsFor, tmp_path: Path) -> None:
    other = CertificateAuthority.create(tmp_path / "other-ca", name="some other CA")
    foreign = other.issue(tmp_path / "foreign", "mailtap-smtp-sink")
    kafka = kafka_settings(
        "smtp-sink",
        "mtls",
        ssl_certificate_location=str(foreign.certificate),
        ssl_key_location=str(foreign.key),
    )
    assert "must be signed by a CA the broker trusts" in _refusal(kafka)


def test_token_endpoint_refuses_a_wrong_client_secret(
    secure_kafka: SecureKafka, kafka_settings: KafkaSettingsFor
) -> None:
    section = secure_kafka.kafka_section("streams", "oauthbearer")
    oauth = {**section["sasl_oauthbearer"], "client_secret": "not-the-secret"}
    kafka = kafka_settings("streams", "oauthbearer", sasl_oauthbearer=oauth)
    sentence = _refusal(kafka)
    assert f"the token endpoint {secure_kafka.token_url} gave client mailtap-streams" in sentence
    assert "invalid_client" in sentence and "not-the-secret" not in sentence


def test_a_command_says_why_and_exits(secure_kafka: SecureKafka, tmp_path: Path) -> None:
    """The same sentence from the CLI (here `mailtap consume`), no traceback, exit 1."""
    section = {**secure_kafka.kafka_section("other-team", "scram-sha-256"), "sasl_password": "no"}
    config = tmp_path / "mailtap.yaml"
    config.write_text(yaml.safe_dump({"kafka": section}))
    result = subprocess.run(
        [sys.executable, "-m", "mailtap.cli", "consume", "mail.events", "-c", str(config)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 1, result.stderr
    assert (
        f"Error: kafka: {section['bootstrap_servers']} refused the login of other-team-reader "
        "with SCRAM-SHA-256" in result.stderr
    )
    assert "Traceback" not in result.stderr and "cannot reach Kafka" not in result.stderr
