"""A wrong password, an expired client certificate, a CA that does not match, a token endpoint
that refuses the client: each is reported as what it is, not as "cannot reach Kafka".

Every wait below is given 5 s (`REPORT_WITHIN_S`): librdkafka reports these within a second of
its first attempt, and a wait that did not recognise the refusal would end after the 5 s with
`KafkaUnavailable` ("cannot reach Kafka ... check kafka.bootstrap_servers"), failing the test.
The same path as every component and CLI command: `connectors.core.kafka.cluster_metadata`;
the last tests run each component (imap-source, ews-source, streams, smtp-sink) as a process with
each refusal: each exits 1 with the sentence (its start waits for Kafka before anything else,
the permission check included), not after its 30 s wait with "cannot reach Kafka".
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path
from typing import Any

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


# --- every component, as a process ---------------------------------------------------------

#: Hang guard of one component run. Whether the refusal was recognised is told by the sentence:
#: had the start waited out its 30 s (streams 15 s) for the cluster, it would say "cannot reach
#: Kafka" (the 5 s of the sentence are checked above, on the path every component shares).
COMPONENT_EXIT_S = 120.0


def _component_configs(tmp_path: Path, kafka: dict[str, Any]) -> dict[str, Path]:
    from tests.integration.secure.test_secure_permissions import (
        ews_subject,
        imap_subject,
        sink_subject,
        streams_subject,
    )

    subjects = [
        sink_subject("unused:9", None),
        imap_subject("unused:9", None),
        ews_subject("unused:9", None),
        streams_subject("unused:9"),
    ]
    paths = {}
    for subject in subjects:
        raw = subject.config("refused", tmp_path / subject.component)
        raw["kafka"] = {**raw["kafka"], **kafka}
        path = tmp_path / f"{subject.component}.yaml"
        path.write_text(yaml.safe_dump(raw))
        paths[subject.component] = path
    return paths


def _run_all(paths: dict[str, Path]) -> dict[str, tuple[subprocess.CompletedProcess[str], float]]:
    from concurrent.futures import ThreadPoolExecutor

    def run(component: str) -> tuple[subprocess.CompletedProcess[str], float]:
        started = time.monotonic()
        done = subprocess.run(
            [sys.executable, "-m", "mailtap.cli", "run", component, "-c", str(paths[component])],
            capture_output=True,
            text=True,
            timeout=COMPONENT_EXIT_S,
        )
        return done, time.monotonic() - started

    with ThreadPoolExecutor(len(paths)) as pool:
        futures = {c: pool.submit(run, c) for c in paths}
        return {c: f.result() for c, f in futures.items()}


def _each_says(
    results: dict[str, tuple[subprocess.CompletedProcess[str], float]], sentence: str
) -> None:
    print({c: f"{took:.1f}s" for c, (_, took) in results.items()})
    for component, (done, _) in results.items():
        text = done.stdout + done.stderr
        assert done.returncode == 1, (component, text)
        assert sentence in text, (component, text)
        assert "cannot reach Kafka" not in text and "Traceback" not in text, (component, text)


def test_every_component_says_its_password_is_wrong(
    secure_kafka: SecureKafka, tmp_path: Path
) -> None:
    section = {**secure_kafka.kafka_section("smtp-sink", "scram-sha-512"), "sasl_password": "no"}
    results = _run_all(_component_configs(tmp_path, section))
    _each_says(results, "refused the login of mailtap-smtp-sink with SCRAM-SHA-512")
    for done, _ in results.values():
        assert "sasl_password" in done.stderr and ": no" not in done.stderr


def test_every_component_says_its_certificate_expired(
    secure_kafka: SecureKafka, tmp_path: Path
) -> None:
    ca = CertificateAuthority(Path(secure_kafka.ca_location).parent)
    expired = ca.issue(tmp_path / "expired", "mailtap-smtp-sink", valid_days=-1)
    section = {
        **secure_kafka.kafka_section("smtp-sink", "mtls"),
        "ssl_certificate_location": str(expired.certificate),
        "ssl_key_location": str(expired.key),
    }
    results = _run_all(_component_configs(tmp_path, section))
    _each_says(results, f"refused the client certificate {expired.certificate}: it expired on")


def test_every_component_says_its_ca_does_not_match(
    secure_kafka: SecureKafka, tmp_path: Path
) -> None:
    other = CertificateAuthority.create(tmp_path / "other-ca", name="some other CA")
    section = {
        **secure_kafka.kafka_section("smtp-sink", "scram-sha-256"),
        "ssl_ca_location": str(other.certificate),
    }
    results = _run_all(_component_configs(tmp_path, section))
    _each_says(results, f"kafka.ssl_ca_location ({other.certificate}) must hold the CA")
