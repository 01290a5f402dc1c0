"""docker-compose.yml gives every service that talks to Kafka its OWN login (issue 27 item 6):
its principal (the name ``mailtap acls`` and ``dev up --secure`` use), its password from its
own compose secret mounted where ``MAILTAP_SECRETS_DIR`` reads it, nothing secret in the file
or in the shared env file; and what each container then resolves."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from connectors.core.config import load_config
from connectors.core.errors import ConfigError
from tests.support import deploy

#: compose service -> the principal it logs in as (deploy/README.md's ACL table).
PRINCIPALS = {
    "topics": "mailtap-admin",
    "imap-source": "mailtap-imap-source",
    "ews-source": "mailtap-ews-source",
    "streams": "mailtap-streams",
    "smtp-sink": "mailtap-smtp-sink",
    "console": "mailtap-console",
}
PASSWORD_FILE = "/run/secrets/MAILTAP__KAFKA__SASL_PASSWORD"
CLUSTER = {
    **deploy.COMPOSE_REQUIRED,
    "MAILTAP_KAFKA_BOOTSTRAP": "b1.example.com:9093",
    "MAILTAP__KAFKA__SECURITY_PROTOCOL": "SASL_SSL",
    "MAILTAP__KAFKA__SASL_MECHANISM": "SCRAM-SHA-512",
}


def kafka_services() -> dict[str, dict]:
    """Every service built from the mailtap image (the broker and registry are not)."""
    return {
        name: service
        for name, service in deploy.compose_services().items()
        if service.get("image", "").startswith("localhost/mailtap")
    }


def test_every_mailtap_service_has_a_principal_of_its_own() -> None:
    services = kafka_services()
    assert set(services) == set(PRINCIPALS)
    users = {
        name: s["environment"]["MAILTAP__KAFKA__SASL_USERNAME"] for name, s in services.items()
    }
    assert users == PRINCIPALS


def test_every_password_comes_from_a_secret_file_of_its_own() -> None:
    declared = deploy.compose_secrets()
    sources: dict[str, str] = {}
    for name, service in kafka_services().items():
        assert service["environment"]["MAILTAP_SECRETS_DIR"] == "/run/secrets", name
        secret = deploy.service_secrets(service)[PASSWORD_FILE]
        sources[name] = declared[secret]["file"]
        # Nothing secret in the file itself: the password is only a file's content.
        assert "MAILTAP__KAFKA__SASL_PASSWORD" not in service["environment"], name
    assert len(set(sources.values())) == len(sources), sources
    assert sources["smtp-sink"] == "kafka-secrets/smtp-sink.password"
    # Another folder for every file at once (secrets kept elsewhere on the host).
    moved = deploy.compose_secrets({"MAILTAP_KAFKA_SECRETS": "/srv/mailtap/kafka"})
    assert moved["kafka-streams"]["file"] == "/srv/mailtap/kafka/streams.password"


def test_a_principal_name_can_be_changed_without_editing_the_file() -> None:
    services = deploy.compose_services({"MAILTAP_SMTP_SINK_KAFKA_USER": "prod-mailtap-sink"})
    assert services["smtp-sink"]["environment"]["MAILTAP__KAFKA__SASL_USERNAME"] == (
        "prod-mailtap-sink"
    )
    assert services["streams"]["environment"]["MAILTAP__KAFKA__SASL_USERNAME"] == "mailtap-streams"


@pytest.mark.parametrize("name", ["topics", "imap-source", "streams", "smtp-sink", "console"])
def test_each_container_resolves_its_own_login(name: str, tmp_path: Path) -> None:
    service = kafka_services()[name]
    env = deploy.container_env(service, CLUSTER)
    env["MAILTAP_SECRETS_DIR"] = str(deploy.container_secrets(service, tmp_path))
    kafka = load_config(deploy.compose_config_file(service), env=env).kafka
    assert kafka.sasl_username == PRINCIPALS[name]
    assert kafka.sasl_password is not None
    secret = deploy.service_secrets(service)[PASSWORD_FILE]
    assert kafka.sasl_password.get_secret_value() == f"password of {secret}"


def test_a_login_left_in_the_shared_env_file_is_refused(tmp_path: Path) -> None:
    # An env file from before: its one password would otherwise log every service in.
    service = kafka_services()["smtp-sink"]
    env = deploy.container_env(service, {**CLUSTER, "MAILTAP__KAFKA__SASL_PASSWORD": "shared"})
    env["MAILTAP_SECRETS_DIR"] = str(deploy.container_secrets(service, tmp_path))
    with pytest.raises(ConfigError, match="set both in the environment and by a file"):
        load_config(deploy.compose_config_file(service), env=env)


def test_the_env_file_example_holds_no_kafka_login() -> None:
    example = deploy.read_env_file(deploy.ROOT / "deploy" / "compose" / "mailtap.env.example")
    assert not {k for k in example if k.startswith("MAILTAP__KAFKA__SASL_")} - {
        "MAILTAP__KAFKA__SASL_MECHANISM"
    }


def readme_override(kind: str) -> dict[str, Any]:
    """deploy/README.md's ``docker-compose.override.yml`` for ``kind`` (mtls, oauthbearer)."""
    text = (deploy.ROOT / "deploy" / "README.md").read_text()
    block = text.split(f"<!-- compose-override:{kind} -->\n```yaml\n", 1)[1].split("```", 1)[0]
    override: dict[str, Any] = yaml.safe_load(block)
    return override


def merged_sink(override: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """The sink's service and the declared secrets with the override on top, as compose merges
    them: mappings key by key, the override's secrets added to the file's."""
    service = kafka_services()["smtp-sink"]
    extra = override["services"]["smtp-sink"]
    service["environment"] = {**service["environment"], **extra.get("environment", {})}
    service["secrets"] = [*service["secrets"], *extra.get("secrets", [])]
    return service, {**deploy.compose_secrets(), **override.get("secrets", {})}


@pytest.mark.parametrize(
    ("kind", "cluster"),
    [
        ("mtls", {"MAILTAP__KAFKA__SECURITY_PROTOCOL": "SSL"}),
        (
            "oauthbearer",
            {
                "MAILTAP__KAFKA__SECURITY_PROTOCOL": "SASL_SSL",
                "MAILTAP__KAFKA__SASL_MECHANISM": "OAUTHBEARER",
                "MAILTAP__KAFKA__SASL_OAUTHBEARER__TOKEN_URL": "https://idp.example.com/token",
                "MAILTAP__KAFKA__SASL_OAUTHBEARER__SCOPE": "kafka",
            },
        ),
    ],
)
def test_readme_overrides_give_the_sink_its_own_login_of_that_kind(
    kind: str, cluster: dict[str, str], tmp_path: Path
) -> None:
    service, declared = merged_sink(readme_override(kind))
    for name in deploy.service_secrets(service).values():
        assert declared[name]["file"].startswith("kafka-secrets/smtp-sink."), name
    env = deploy.container_env(
        service,
        {**deploy.COMPOSE_REQUIRED, "MAILTAP_KAFKA_BOOTSTRAP": "b1.example.com:9093", **cluster},
    )
    folder = deploy.container_secrets(service, tmp_path)
    env["MAILTAP_SECRETS_DIR"] = deploy.on_host(env["MAILTAP_SECRETS_DIR"], folder)
    kafka = load_config(deploy.compose_config_file(service), env=env).kafka
    if kind == "mtls":
        assert kafka.ssl_certificate_location == "/run/secrets/kafka-client.pem"
        assert kafka.ssl_key_location == "/run/secrets/kafka-client.key"
        assert kafka.ssl_key_password is not None
        assert kafka.ssl_key_password.get_secret_value() == (
            "password of kafka-smtp-sink-key-password"
        )
    else:
        assert kafka.sasl_oauthbearer is not None
        assert kafka.sasl_oauthbearer.client_id == "mailtap-smtp-sink"
        assert kafka.sasl_oauthbearer.client_secret.get_secret_value() == (
            "password of kafka-smtp-sink-client-secret"
        )
        assert not kafka.sasl_username and kafka.sasl_password is None
