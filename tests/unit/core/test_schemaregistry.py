"""connectors.core.avro.registry: which registry failures are retried, which stop at once."""

from __future__ import annotations

from typing import Any

import pytest
from confluent_kafka.schema_registry.error import SchemaRegistryError

from connectors.core.avro import registry as schemaregistry
from connectors.core.errors import ConfigError

URL = "http://registry.invalid/apis/ccompat/v7"


class FlakyRegistry:
    """Answers like Apicurio 2.4 under concurrent registrations: ``failures`` first, then ids."""

    def __init__(self, failures: list[Exception]) -> None:
        self.failures = failures
        self.calls: list[str] = []

    def _next(self, call: str) -> None:
        self.calls.append(call)
        if self.failures:
            raise self.failures.pop(0)

    def set_compatibility(self, subject_name: str, level: str) -> dict[str, str]:
        self._next(f"config {subject_name}")
        return {"compatibility": level}

    def register_schema(self, subject: str, schema: Any) -> int:
        self._next(f"register {subject}")
        return 7


@pytest.fixture
def flaky(monkeypatch: pytest.MonkeyPatch) -> Any:
    monkeypatch.setattr(schemaregistry, "REGISTRY_RETRY_PAUSE_S", 0.0)
    schemaregistry._prepared.clear()

    def install(failures: list[Exception]) -> FlakyRegistry:
        fake = FlakyRegistry(failures)
        monkeypatch.setattr(schemaregistry, "registry_client", lambda url, login=None: fake)
        return fake

    yield install
    schemaregistry._prepared.clear()


def test_a_registry_racing_with_itself_is_retried(flaky: Any) -> None:
    """Before: the first HTTP 500 stopped the component (the demo's streams worker did)."""
    fake = flaky(
        [
            SchemaRegistryError(500, 50001, "Timeout trying to lock table"),
            SchemaRegistryError(409, 409, "An artifact with ID 't-key' already exists."),
            TypeError("int() argument must be ... not 'NoneType'"),
        ]
    )
    assert schemaregistry.prepare_subjects(URL, "t", '"string"') == 7
    assert fake.calls == ["config t-key"] * 4 + [
        "register t-key",
        "config t-value",
        "register t-value",
    ]


def test_an_incompatible_schema_stops_at_once(flaky: Any) -> None:
    fake = flaky([SchemaRegistryError(409, 409, "Schema being registered is incompatible")])
    with pytest.raises(ConfigError, match="not FULL_TRANSITIVE-compatible"):
        schemaregistry.prepare_subjects(URL, "t", '"string"')
    assert fake.calls == ["config t-key"]


def test_a_registry_that_keeps_failing_stops_with_the_sentence(flaky: Any) -> None:
    flaky([SchemaRegistryError(503, 50003, "unavailable")] * schemaregistry.REGISTRY_ATTEMPTS)
    with pytest.raises(ConfigError, match=r"check kafka\.schema_registry_url"):
        schemaregistry.prepare_subjects(URL, "t", '"string"')


def test_a_refused_login_names_the_settings_and_hides_the_url_password(flaky: Any) -> None:
    url = "https://team:url-secret@registry.example.com/apis/ccompat/v7"
    flaky([SchemaRegistryError(401, 40101, "Unauthorized")])

    with pytest.raises(ConfigError) as refused:
        schemaregistry.prepare_subjects(url, "t", '"string"')

    message = str(refused.value)
    assert "refused mailtap's login" in message and "HTTP 401" in message
    assert "kafka.schema_registry.basic_auth_username" in message
    assert "url-secret" not in message
    assert "https://registry.example.com/apis/ccompat/v7" in message


def test_shown_drops_only_the_user_info() -> None:
    assert (
        schemaregistry.shown("https://u:p@r.example.com:8081/x") == "https://r.example.com:8081/x"
    )
    assert schemaregistry.shown("http://r:8080/apis") == "http://r:8080/apis"
