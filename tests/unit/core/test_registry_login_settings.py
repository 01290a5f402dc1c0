"""``kafka.schema_registry``: the registry client's login, validated at start and mapped once
onto confluent-kafka's ``SchemaRegistryClient`` settings; its secrets never in a repr."""

from __future__ import annotations

from typing import Any

import pytest

from connectors.core.config import KafkaSettings, SchemaRegistryClientSettings, config_from_dict
from connectors.core.errors import ConfigError

URL = "https://registry.example.com/apis/ccompat/v7"


def kafka(url: str | None = URL, **login: Any) -> KafkaSettings:
    raw: dict[str, Any] = {"kafka": {"bootstrap_servers": "k:9092", "schema_registry": login}}
    if url is not None:
        raw["kafka"]["schema_registry_url"] = url
    return config_from_dict(raw, env={}).kafka


def test_the_login_maps_onto_the_client_settings() -> None:
    login = kafka(
        basic_auth_username="key",
        basic_auth_password="sec:ret",
        ssl_ca_location="/ca.pem",
        ssl_certificate_location="/client.pem",
        ssl_key_location="/client.key",
        ssl_key_password="kpw",
    ).schema_registry

    assert login.client_config() == {
        "basic.auth.user.info": "key:sec:ret",
        "ssl.ca.location": "/ca.pem",
        "ssl.certificate.location": "/client.pem",
        "ssl.key.location": "/client.key",
        "ssl.key.password": "kpw",
    }
    assert SchemaRegistryClientSettings().client_config() == {}


def test_secrets_stay_out_of_the_settings_repr() -> None:
    settings = kafka(basic_auth_username="key", basic_auth_password="pw-123", ssl_key_password=None)
    assert "pw-123" not in repr(settings) and "pw-123" not in str(settings)


@pytest.mark.parametrize(
    ("url", "login", "sentence"),
    [
        (
            URL,
            {"basic_auth_username": "key"},
            "set both basic_auth_username and basic_auth_password",
        ),
        (
            URL,
            {"basic_auth_password": "pw"},
            "set both basic_auth_username and basic_auth_password",
        ),
        (URL, {"basic_auth_username": "a:b", "basic_auth_password": "pw"}, "may not contain ':'"),
        (URL, {"ssl_key_location": "/k"}, "set both ssl_certificate_location and ssl_key_location"),
        (None, {"ssl_ca_location": "/ca.pem"}, "schema_registry_url is not"),
        ("http://r:8080", {"ssl_ca_location": "/ca.pem"}, "only with an https://"),
        (
            "https://u:p@r:8080",
            {"basic_auth_username": "key", "basic_auth_password": "pw"},
            "login is given twice",
        ),
    ],
)
def test_an_inconsistent_login_fails_at_start(
    url: str | None, login: dict[str, str], sentence: str
) -> None:
    with pytest.raises(ConfigError, match=sentence) as refused:
        kafka(url, **login)
    assert "pw" not in str(refused.value).replace("password", "")
