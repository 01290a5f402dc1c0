"""The registry client's bearer login (``kafka.schema_registry.bearer_auth``): OAuth2 client
credentials from the dev stack's token endpoint (tests/support/oauth_endpoint.py), sent to the
session's real registry behind a gate that checks each JWT against the endpoint's JWKS
(signature, issuer, audience, expiry, scope; tests/support/registry_gate.py).

A wrong client secret, a token without the registry's scope (403) and a token signed by an
identity provider the registry does not trust (401) each end in one sentence that names the
setting and holds no secret; a token past its expiry is never sent, a fresh one is.
"""

from __future__ import annotations

import datetime as dt
import json
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from click.testing import CliRunner
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic

from connectors.core.avro.serde import CONFLUENT_MAGIC, AnyAvroDecoder, AvroSerde
from connectors.core.config import KafkaSettings
from connectors.core.errors import ConfigError
from connectors.core.kafka.clients import producer_config
from mailtap.cli import main
from mailtap.dev import DevServices
from mailtap.dev.certs import CertificateAuthority
from tests.support.oauth_endpoint import OAuthEndpoint
from tests.support.registry_gate import BearerCheck, RegistryGate

CLIENT = "mailtap-registry-client"
SECRET = "s3cret-client-secret"
AUDIENCE = "mailtap-registry"
SCOPE = "schema-registry"
#: Tokens of the refresh test live this long; the client replaces one at half its life.
SHORT_LIFETIME_S = 4


@dataclass(frozen=True)
class Setup:
    gate: RegistryGate
    upstream: str
    ca: Path
    folder: Path
    endpoint: OAuthEndpoint
    authority: CertificateAuthority

    def kafka(self, bootstrap: str = "unused:9092", **bearer: Any) -> KafkaSettings:
        """Settings that reach the gate with the bearer login, ``bearer`` overriding its
        fields (``bearer_auth_*`` keys go next to it)."""
        routing = {k: bearer.pop(k) for k in list(bearer) if k.startswith("bearer_auth_")}
        login = {
            "token_url": self.endpoint.token_url,
            "client_id": CLIENT,
            "client_secret": SECRET,
            "scope": SCOPE,
            "ca_file": str(self.ca),
            **bearer,
        }
        return KafkaSettings.model_validate(
            {
                "bootstrap_servers": bootstrap,
                "schema_registry_url": self.gate.url,
                "schema_registry": {
                    "bearer_auth": login,
                    "ssl_ca_location": str(self.ca),
                    **routing,
                },
            }
        )


@pytest.fixture(scope="module")
def setup(services: DevServices, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Setup]:
    assert services.registry is not None, "the dev stack runs without its registry"
    folder = tmp_path_factory.mktemp("registry-bearer")
    ca = CertificateAuthority.create(folder / "ca")
    server = ca.issue(folder / "gate", "localhost", hosts=["127.0.0.1", "localhost"])
    with OAuthEndpoint(ca, folder / "oauth", {CLIENT: SECRET}, AUDIENCE) as endpoint:
        check = BearerCheck(endpoint.jwks_url, ca.certificate, endpoint.issuer, AUDIENCE, SCOPE)
        gate = RegistryGate(services.registry.url, ca.certificate, server, bearer=check).start()
        try:
            yield Setup(gate, services.registry.url, ca.certificate, folder, endpoint, ca)
        finally:
            gate.stop()


def _workflow_event() -> dict[str, Any]:
    return {
        "instance_id": "T-1",
        "workflow": "ticket_intake",
        "status": "OPENED",
        "occurred_at": dt.datetime(2026, 1, 1, tzinfo=dt.UTC),
    }


def _refusals(gate: RegistryGate) -> int:
    return gate.answers.get(401, 0) + gate.answers.get(403, 0)


def test_schemas_register_and_decode_with_a_bearer_token(setup: Setup, unique: str) -> None:
    kafka = setup.kafka()
    topic = f"mail.workflow.bearer-{unique}"
    serde = AvroSerde.for_schema("WorkflowEvent", kafka)
    seen_before, refused_before = len(setup.gate.tokens), _refusals(setup.gate)

    data = serde.encode(_workflow_event(), topic)

    assert data[:1] == CONFLUENT_MAGIC
    assert serde.decode(data, topic)["instance_id"] == "T-1"
    decoder = AnyAvroDecoder(kafka.schema_registry_url, kafka.schema_registry)
    assert decoder.decode(data, topic)[1]["status"] == "OPENED"
    # It reached the real registry, each request with a token the gate checked.
    with urllib.request.urlopen(f"{setup.upstream}/subjects", timeout=30) as answer:
        assert f"{topic}-value" in json.load(answer)
    accepted = setup.gate.tokens[seen_before:]
    assert accepted, "no request carried a bearer token"
    assert _refusals(setup.gate) == refused_before
    # Not Confluent Cloud: no identity pool; target-sr-cluster goes out empty
    # (confluent-kafka requires it, registry_bearer.py), and the registry ignores it.
    assert {tuple(sorted(t.headers.items())) for t in accepted} == {(("target-sr-cluster", ""),)}


def test_confluent_cloud_routing_headers_are_sent_when_configured(
    setup: Setup, unique: str
) -> None:
    kafka = setup.kafka(
        bearer_auth_logical_cluster="lsrc-abc123", bearer_auth_identity_pool_id="pool-xyz"
    )
    seen_before = len(setup.gate.tokens)

    AvroSerde.for_schema("WorkflowEvent", kafka).prepare(f"mail.workflow.cloud-{unique}")

    headers = {tuple(sorted(t.headers.items())) for t in setup.gate.tokens[seen_before:]}
    assert headers == {
        (("confluent-identity-pool-id", "pool-xyz"), ("target-sr-cluster", "lsrc-abc123"))
    }


def test_a_wrong_client_secret_is_named_as_such(setup: Setup, unique: str) -> None:
    serde = AvroSerde.for_schema("WorkflowEvent", setup.kafka(client_secret="not-the-secret"))
    seen_before = len(setup.gate.tokens)

    with pytest.raises(ConfigError) as refused:
        serde.prepare(f"mail.workflow.wrongsecret-{unique}")

    message = str(refused.value)
    assert (
        f"the token endpoint {setup.endpoint.token_url} refused client {CLIENT} a token for "
        f"the schema registry (invalid_client); check kafka.schema_registry.bearer_auth."
        f"client_id, client_secret and scope" == message
    )
    assert len(setup.gate.tokens) == seen_before  # nothing reached the registry


def test_a_token_without_the_registry_scope_is_denied(setup: Setup, unique: str) -> None:
    serde = AvroSerde.for_schema("WorkflowEvent", setup.kafka(scope="kafka"))
    denied_before = setup.gate.answers.get(403, 0)

    with pytest.raises(ConfigError) as refused:
        serde.prepare(f"mail.workflow.noscope-{unique}")

    message = str(refused.value)
    assert "denied mailtap's login access" in message and "HTTP 403" in message, message
    assert f"with a bearer token of client {CLIENT}" in message
    assert "check kafka.schema_registry.bearer_auth" in message
    assert SECRET not in message
    assert setup.gate.answers.get(403, 0) > denied_before


def test_a_token_of_an_untrusted_identity_provider_is_refused(setup: Setup, unique: str) -> None:
    """Same client and secret at another token endpoint, whose signing key the registry does
    not know: the gate answers 401 invalid_token. The refused token is dropped: the next try
    (a component's after its backoff) sends a new one, not the refused one again."""
    with OAuthEndpoint(
        setup.authority, setup.folder / f"rogue-{unique}", {CLIENT: SECRET}, AUDIENCE
    ) as rogue:
        serde = AvroSerde.for_schema("WorkflowEvent", setup.kafka(token_url=rogue.token_url))
        refused_before = len(setup.gate.refused_tokens)
        with pytest.raises(ConfigError) as refused:
            serde.prepare(f"mail.workflow.rogue-{unique}")
        with pytest.raises(ConfigError):
            serde.prepare(f"mail.workflow.rogue-{unique}")

    message = str(refused.value)
    assert "refused mailtap's login" in message and "HTTP 401" in message, message
    assert f"trusts tokens of {rogue.token_url}" in message
    assert SECRET not in message
    first, second = setup.gate.refused_tokens[refused_before:]
    assert first != second


def test_a_token_past_its_expiry_is_replaced_by_a_fresh_one(setup: Setup, unique: str) -> None:
    """Tokens of a short-lived endpoint (same signing key and issuer, so the gate trusts them):
    the request after the first token expired carries a new token, and the gate, which
    refuses expired tokens, accepts every request."""
    with OAuthEndpoint(
        setup.authority,
        setup.folder / "oauth",  # the signing key the gate trusts
        {CLIENT: SECRET},
        AUDIENCE,
        lifetime=SHORT_LIFETIME_S,
        issuer=setup.endpoint.issuer,
    ) as short:
        serde = AvroSerde.for_schema("WorkflowEvent", setup.kafka(token_url=short.token_url))
        seen_before, refused_before = len(setup.gate.tokens), setup.gate.answers.get(401, 0)
        serde.prepare(f"mail.workflow.refresh1-{unique}")
        first = setup.gate.tokens[-1]
        time.sleep(max(0.0, first.expires + 1 - time.time()))  # the first token is dead now
        seen_between = len(setup.gate.tokens)
        serde.prepare(f"mail.workflow.refresh2-{unique}")

    later = setup.gate.tokens[seen_between:]
    assert later, "the second registration sent no request"
    assert all(t.jti != first.jti and t.expires > first.expires for t in later)
    assert len(setup.gate.tokens) > seen_before
    assert setup.gate.answers.get(401, 0) == refused_before


def test_consume_decodes_through_the_bearer_login(
    setup: Setup, services: DevServices, unique: str, tmp_path: Path
) -> None:
    """`mailtap consume` resolves the writer's schema through the same login (its secret read
    from client_secret_file); with a wrong secret it ends in the sentence, exit 1, no
    traceback."""
    topic = f"mail.workflow.consume-{unique}"
    kafka = setup.kafka(services.kafka.bootstrap_servers)
    admin = AdminClient({"bootstrap.servers": kafka.bootstrap_servers})
    for future in admin.create_topics([NewTopic(topic, 1, 1)]).values():
        future.result(30)
    producer = Producer(producer_config(kafka))
    producer.produce(
        topic,
        key=b"T-1",
        value=AvroSerde.for_schema("WorkflowEvent", kafka).encode(_workflow_event(), topic),
    )
    assert producer.flush(30) == 0

    def consume(client_secret: str, name: str) -> Any:
        """`mailtap consume` with the secret in a file (client_secret_file), as a mounted
        Kubernetes secret."""
        # A file per secret: this process caches tokens per settings (a new process would not).
        secret_file = tmp_path / name
        secret_file.write_text(client_secret + "\n")
        section = json.loads(kafka.model_dump_json(exclude_none=True))
        bearer = section["schema_registry"]["bearer_auth"]
        del bearer["client_secret"]
        bearer["client_secret_file"] = str(secret_file)
        config = tmp_path / "mailtap.yaml"
        config.write_text(yaml.safe_dump({"kafka": section}))
        return CliRunner().invoke(main, ["consume", topic, "-c", str(config), "--from-beginning"])

    done = consume(SECRET, "client-secret")
    assert done.exit_code == 0, done.output
    record = json.loads(done.output.splitlines()[0])
    assert record["value"]["status"] == "OPENED" and record["schema"] == "confluent"

    # A new process would not have the schema cached: forget the clients as a restart does.
    from connectors.core.avro.registry import forget_clients

    forget_clients()
    refused = consume("wrong-one", "wrong-client-secret")
    assert refused.exit_code == 1, refused.output
    assert "Error: the token endpoint" in refused.output
    assert "check kafka.schema_registry.bearer_auth.client_id, client_secret and scope" in (
        refused.output
    )
    assert "wrong-one" not in refused.output and "Traceback" not in refused.output
