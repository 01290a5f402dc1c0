"""The registry client's login (``kafka.schema_registry``): basic auth, the CA, a client
certificate with an encrypted key, against the session's real registry behind a TLS gate that
requires all three (tests/support/registry_gate.py). A wrong password, a missing client
certificate and an untrusted server certificate each end in one sentence that names the
setting to change and holds no secret.
"""

from __future__ import annotations

import datetime as dt
import json
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from connectors.core.avro.serde import CONFLUENT_MAGIC, AnyAvroDecoder, AvroSerde
from connectors.core.config import KafkaSettings
from connectors.core.errors import ConfigError
from mailtap.dev import DevServices
from mailtap.dev.certs import CertificateAuthority, KeyPair
from tests.support.registry_gate import RegistryGate

USER = "mailtap-registry"
PASSWORD = "s3cret-registry-pw"
KEY_PASSWORD = "client-key-pw"


@dataclass(frozen=True)
class Gate:
    gate: RegistryGate
    upstream: str
    ca: Path
    client: KeyPair

    def kafka(self, **login: Any) -> KafkaSettings:
        """Settings that reach the gate with ``login`` (kafka.schema_registry)."""
        return KafkaSettings.model_validate(
            {
                "bootstrap_servers": "unused:9092",
                "schema_registry_url": self.gate.url,
                "schema_registry": login,
            }
        )

    def full_login(self) -> dict[str, Any]:
        return {
            "basic_auth_username": USER,
            "basic_auth_password": PASSWORD,
            "ssl_ca_location": str(self.ca),
            "ssl_certificate_location": str(self.client.certificate),
            "ssl_key_location": str(self.client.key),
            "ssl_key_password": KEY_PASSWORD,
        }


@pytest.fixture(scope="module")
def gate(services: DevServices, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gate]:
    assert services.registry is not None, "the dev stack runs without its registry"
    folder = tmp_path_factory.mktemp("registry-gate")
    ca = CertificateAuthority.create(folder / "ca")
    server = ca.issue(folder / "server", "localhost", hosts=["127.0.0.1", "localhost"])
    client = ca.issue(folder / "client", "mailtap", key_password=KEY_PASSWORD)
    running = RegistryGate(services.registry.url, ca.certificate, server, USER, PASSWORD).start()
    try:
        yield Gate(running, services.registry.url, ca.certificate, client)
    finally:
        running.stop()


def test_schemas_register_and_decode_through_a_registry_with_a_login(
    gate: Gate, unique: str
) -> None:
    kafka = gate.kafka(**gate.full_login())
    topic = f"mail.workflow.login-{unique}"
    serde = AvroSerde.for_schema("WorkflowEvent", kafka)
    value = {
        "instance_id": "T-1",
        "workflow": "ticket_intake",
        "status": "OPENED",
        "occurred_at": dt.datetime(2026, 1, 1, tzinfo=dt.UTC),
    }

    data = serde.encode(value, topic)

    assert data[:1] == CONFLUENT_MAGIC
    assert serde.decode(data, topic)["instance_id"] == "T-1"
    # A tool's decoder resolves the writer's schema id through the same login.
    assert (
        AnyAvroDecoder(kafka.schema_registry_url, kafka.schema_registry).decode(data, topic)[1][
            "status"
        ]
        == "OPENED"
    )
    # It reached the real registry: the subject is there, read past the gate.
    with urllib.request.urlopen(f"{gate.upstream}/subjects", timeout=30) as answer:
        assert f"{topic}-value" in json.load(answer)
    assert gate.gate.answers.get(401, 0) == 0


def test_a_wrong_password_is_named_as_such(gate: Gate, unique: str) -> None:
    login = {**gate.full_login(), "basic_auth_password": "not-the-password"}
    serde = AvroSerde.for_schema("WorkflowEvent", gate.kafka(**login))
    refused_before = gate.gate.answers.get(401, 0)

    with pytest.raises(ConfigError) as refused:
        serde.prepare(f"mail.workflow.wrongpw-{unique}")

    message = str(refused.value)
    assert "refused mailtap's login" in message and "HTTP 401" in message
    assert "kafka.schema_registry.basic_auth_username and basic_auth_password" in message
    assert "not-the-password" not in message and KEY_PASSWORD not in message
    assert gate.gate.answers.get(401, 0) > refused_before


def test_no_client_certificate_is_named_as_such(gate: Gate, unique: str) -> None:
    login = {
        k: v
        for k, v in gate.full_login().items()
        if k not in ("ssl_certificate_location", "ssl_key_location", "ssl_key_password")
    }
    serde = AvroSerde.for_schema("WorkflowEvent", gate.kafka(**login))

    with pytest.raises(ConfigError) as refused:
        serde.prepare(f"mail.workflow.nocert-{unique}")

    message = str(refused.value)
    assert "TLS handshake with the schema registry" in message, message
    assert "ssl_certificate_location" in message
    assert PASSWORD not in message


def test_an_untrusted_registry_certificate_is_named_as_such(gate: Gate, unique: str) -> None:
    login = {k: v for k, v in gate.full_login().items() if k != "ssl_ca_location"}
    serde = AvroSerde.for_schema("WorkflowEvent", gate.kafka(**login))

    with pytest.raises(ConfigError) as refused:
        serde.prepare(f"mail.workflow.untrusted-{unique}")

    message = str(refused.value)
    assert "presented a certificate mailtap does not trust" in message, message
    assert "kafka.schema_registry.ssl_ca_location" in message


def test_a_wrong_key_password_fails_when_the_client_is_built(gate: Gate) -> None:
    login = {**gate.full_login(), "ssl_key_password": "wrong-key-pw"}

    with pytest.raises(ConfigError) as refused:
        AvroSerde.for_schema("WorkflowEvent", gate.kafka(**login))

    message = str(refused.value)
    assert "cannot use the login settings" in message and "wrong-key-pw" not in message
