"""``kafka.schema_registry``: the registry client's login, validated at start and mapped once
onto confluent-kafka's ``SchemaRegistryClient`` settings; its secrets never in a repr. The
bearer login's conversation with a real token endpoint and registry is in
tests/integration/core/test_registry_bearer.py."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from connectors.core.avro.registry import registry_client
from connectors.core.avro.registry_bearer import bearer_config
from connectors.core.config import KafkaSettings, SchemaRegistryClientSettings, config_from_dict
from connectors.core.errors import ConfigError

URL = "https://registry.example.com/apis/ccompat/v7"
BEARER = {
    "token_url": "https://idp.example.com/oauth2/token",
    "client_id": "mailtap",
    "client_secret": "cs-4711",
    "scope": "registry",
}


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


def test_the_bearer_login_maps_onto_a_custom_token_provider() -> None:
    login = kafka(bearer_auth=BEARER).schema_registry

    conf = bearer_config(login)

    # confluent-kafka's own OAUTHBEARER source is not used (registry_bearer.py says why).
    assert conf["bearer.auth.credentials.source"] == "CUSTOM"
    assert conf["bearer.auth.custom.provider.config"] == {}
    assert callable(conf["bearer.auth.custom.provider.function"])
    assert "cs-4711" not in repr(conf) and login.client_config() == {}
    assert (
        bearer_config(kafka(basic_auth_username="k", basic_auth_password="p").schema_registry) == {}
    )
    # The client accepts the mapping as it is built (no request is sent yet).
    assert registry_client(URL, login) is registry_client(URL, login)


def test_the_client_secret_can_come_from_a_file(tmp_path: Path) -> None:
    secret_file = tmp_path / "secret"
    secret_file.write_text("cs-from-file\n")
    bearer = {k: v for k, v in BEARER.items() if k != "client_secret"}

    login = kafka(bearer_auth={**bearer, "client_secret_file": str(secret_file)}).schema_registry

    assert login.bearer_auth is not None and login.bearer_auth.secret() == "cs-from-file"
    with pytest.raises(ConfigError, match="set client_secret or client_secret_file"):
        kafka(bearer_auth={**BEARER, "client_secret_file": str(secret_file)})
    with pytest.raises(ConfigError, match="set client_secret or client_secret_file"):
        kafka(bearer_auth=bearer)
    with pytest.raises(ConfigError, match="does not exist; write the secret there"):
        kafka(bearer_auth={**bearer, "client_secret_file": str(tmp_path / "missing")})


def test_the_bearer_login_comes_from_the_environment_as_deploy_readme_says() -> None:
    env = {
        "MAILTAP__KAFKA__SCHEMA_REGISTRY__BEARER_AUTH__TOKEN_URL": BEARER["token_url"],
        "MAILTAP__KAFKA__SCHEMA_REGISTRY__BEARER_AUTH__CLIENT_ID": "mailtap",
        "MAILTAP__KAFKA__SCHEMA_REGISTRY__BEARER_AUTH__CLIENT_SECRET": "0777",
        "MAILTAP__KAFKA__SCHEMA_REGISTRY__BEARER_AUTH__SCOPE": "registry",
        "MAILTAP__KAFKA__SCHEMA_REGISTRY__BEARER_AUTH_LOGICAL_CLUSTER": "lsrc-1",
    }
    raw = {"kafka": {"bootstrap_servers": "k:9092", "schema_registry_url": URL}}

    login = config_from_dict(raw, env=env).kafka.schema_registry

    assert login.bearer_auth is not None and login.bearer_auth.secret() == "0777"
    assert login.bearer_auth_logical_cluster == "lsrc-1"


def test_secrets_stay_out_of_the_settings_repr() -> None:
    settings = kafka(basic_auth_username="key", basic_auth_password="pw-123", ssl_key_password=None)
    assert "pw-123" not in repr(settings) and "pw-123" not in str(settings)
    bearer = kafka(bearer_auth=BEARER)
    assert "cs-4711" not in repr(bearer) and "cs-4711" not in str(bearer)


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
        (
            URL,
            {"bearer_auth": BEARER, "basic_auth_username": "k", "basic_auth_password": "pw"},
            "set basic_auth_username/basic_auth_password or bearer_auth, not both",
        ),
        ("https://u:p@r:8080", {"bearer_auth": BEARER}, "login is given twice"),
        ("http://r:8080", {"bearer_auth": BEARER}, "never travel in plaintext: use an https://"),
        (
            URL,
            {"bearer_auth": {**BEARER, "token_url": "http://idp/token"}},
            "expected an https:// URL",
        ),
        (URL, {"bearer_auth_logical_cluster": "lsrc-1"}, "set bearer_auth too, or remove them"),
        (URL, {"bearer_auth_identity_pool_id": "pool-1"}, "set bearer_auth too, or remove them"),
    ],
)
def test_an_inconsistent_login_fails_at_start(
    url: str | None, login: dict[str, str], sentence: str
) -> None:
    with pytest.raises(ConfigError, match=sentence) as refused:
        kafka(url, **login)
    assert "pw" not in str(refused.value).replace("password", "")
    assert "cs-4711" not in str(refused.value)
