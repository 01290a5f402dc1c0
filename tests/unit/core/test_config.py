from pathlib import Path

import pytest
from pydantic import BaseModel, ConfigDict

from connectors.core.config import apply_env_overrides, config_from_dict, load_config
from connectors.core.errors import ConfigError


class PortSection(BaseModel):
    model_config = ConfigDict(extra="forbid")
    host: str
    port: int


def test_valid_file_loads_with_defaults(tmp_path: Path) -> None:
    file = tmp_path / "m.yaml"
    file.write_text("kafka:\n  bootstrap_servers: 127.0.0.1:9092\n")
    cfg = load_config(file, env={})
    assert cfg.kafka.bootstrap_servers == "127.0.0.1:9092"
    assert cfg.kafka.topics.events == "mail.events"
    assert cfg.kafka.topics.offsets == "mailtap.offsets"


def test_env_overrides_nested_keys_and_bootstrap(tmp_path: Path) -> None:
    file = tmp_path / "m.yaml"
    file.write_text("kafka:\n  bootstrap_servers: a:1\nsmtp:\n  host: x\n  port: 25\n")
    env = {
        "MAILTAP_KAFKA_BOOTSTRAP": "b:2",
        "MAILTAP__SMTP__PORT": "2525",
        "MAILTAP__KAFKA__TOPICS__EVENTS": "team.mail",
    }
    cfg = load_config(file, env=env)
    assert cfg.kafka.bootstrap_servers == "b:2"
    assert cfg.kafka.topics.events == "team.mail"
    assert cfg.section("smtp", PortSection).port == 2525


def test_the_generic_bootstrap_variable_is_an_alias_that_must_agree(tmp_path: Path) -> None:
    file = tmp_path / "m.yaml"
    file.write_text("kafka:\n  bootstrap_servers: a:1\n")
    generic = {"MAILTAP__KAFKA__BOOTSTRAP_SERVERS": "c:3"}
    assert load_config(file, env=generic).kafka.bootstrap_servers == "c:3"
    both = {**generic, "MAILTAP_KAFKA_BOOTSTRAP": "c:3"}
    assert load_config(file, env=both).kafka.bootstrap_servers == "c:3"
    with pytest.raises(ConfigError, match=r"MAILTAP_KAFKA_BOOTSTRAP=b:2 and .*=c:3.*unset one"):
        load_config(file, env={**generic, "MAILTAP_KAFKA_BOOTSTRAP": "b:2"})


def test_unknown_key_is_named(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"kafka\.bootstrap_server: Extra inputs"):
        config_from_dict({"kafka": {"bootstrap_servers": "a:1", "bootstrap_server": "a:1"}})


def test_bad_bootstrap_says_what_is_expected() -> None:
    with pytest.raises(ConfigError, match=r"kafka\.bootstrap_servers: .*expected host:port"):
        config_from_dict({"kafka": {"bootstrap_servers": "localhost"}})


def test_missing_kafka_section_says_how_to_fix() -> None:
    with pytest.raises(ConfigError, match="MAILTAP_KAFKA_BOOTSTRAP"):
        config_from_dict({})


def test_section_errors_carry_the_path_with_list_indexes() -> None:
    class Accounts(BaseModel):
        accounts: list[PortSection]

    cfg = config_from_dict(
        {"kafka": {"bootstrap_servers": "a:1"}, "imap": {"accounts": [{"host": "h", "port": "x"}]}}
    )
    with pytest.raises(ConfigError, match=r"imap\.accounts\[0\]\.port"):
        cfg.section("imap", Accounts)


def test_missing_section_is_reported() -> None:
    cfg = config_from_dict({"kafka": {"bootstrap_servers": "a:1"}})
    with pytest.raises(ConfigError, match="section 'smtp' is missing"):
        cfg.section("smtp", PortSection)


def test_secrets_are_not_echoed_in_errors() -> None:
    class Creds(BaseModel):
        password: int

    cfg = config_from_dict({"kafka": {"bootstrap_servers": "a:1"}, "x": {"password": "hunter2"}})
    with pytest.raises(ConfigError) as info:
        cfg.section("x", Creds)
    assert "hunter2" not in str(info.value)


def test_missing_file_and_bad_yaml(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="does not exist"):
        load_config(tmp_path / "nope.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("kafka: [unclosed\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(bad)


def test_env_override_creates_missing_sections() -> None:
    assert apply_env_overrides({}, {"MAILTAP__HEALTH__PORT": "0"}) == {"health": {"port": 0}}


def test_lists_of_mappings_are_not_echoed_in_errors() -> None:
    from pydantic import Field

    class Account(BaseModel):
        password: str
        port: int

    class Section(BaseModel):
        accounts: list[Account] = Field(min_length=2)

    cfg = config_from_dict(
        {
            "kafka": {"bootstrap_servers": "a:1"},
            "x": {"accounts": [{"password": "hunter2", "port": 1}]},
        }
    )
    with pytest.raises(ConfigError, match=r"x\.accounts") as info:
        cfg.section("x", Section)
    assert "hunter2" not in str(info.value)


def test_s3_keys_come_in_pairs_and_the_secret_is_never_echoed() -> None:
    with pytest.raises(ConfigError, match=r"claim_check\.s3: .*set both access_key_id") as caught:
        config_from_dict(
            {
                "kafka": {"bootstrap_servers": "a:1"},
                "claim_check": {"url": "s3://b/p", "s3": {"secret_access_key": "hunter2"}},
            }
        )
    assert "hunter2" not in str(caught.value)
    env = {"MAILTAP__CLAIM_CHECK__S3__ENDPOINT_URL": "http://127.0.0.1:9000"}
    cfg = config_from_dict({"kafka": {"bootstrap_servers": "a:1"}}, env=env)
    assert cfg.claim_check.s3.endpoint_url == "http://127.0.0.1:9000"
    assert cfg.claim_check.s3.access_key_id is None  # boto3's default chain


def test_env_override_indexes_a_list_entry() -> None:
    # A credential of one account comes from the environment (a Kubernetes Secret); the
    # account's other keys and the other accounts stay as the file has them.
    raw = {"imap": {"accounts": [{"name": "a", "host": "h"}, {"name": "b", "host": "g"}]}}
    merged = apply_env_overrides(raw, {"MAILTAP__IMAP__ACCOUNTS__1__PASSWORD": "s3cret"})
    assert merged["imap"]["accounts"] == [
        {"name": "a", "host": "h"},
        {"name": "b", "host": "g", "password": "s3cret"},
    ]
    assert "password" not in raw["imap"]["accounts"][1]
    with pytest.raises(ConfigError, match="past the end"):
        apply_env_overrides(raw, {"MAILTAP__IMAP__ACCOUNTS__2__PASSWORD": "x"})
