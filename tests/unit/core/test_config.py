from pathlib import Path
from typing import Any, Literal

import pytest
from pydantic import BaseModel, ConfigDict, SecretStr

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
    assert apply_env_overrides({}, {"MAILTAP__HEALTH__PORT": "0"}) == {"health": {"port": "0"}}
    cfg = config_from_dict(
        {"kafka": {"bootstrap_servers": "a:1"}}, env={"MAILTAP__HEALTH__PORT": "0"}
    )
    assert cfg.health.port == 0


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


def test_env_override_for_a_list_the_file_lacks_belongs_to_another_file() -> None:
    # compose gives every service one env file; the Exchange source's variables reach the
    # services of mailtap.yaml, which has no ews section, and must not invent one there.
    raw = {"imap": {"accounts": [{"name": "a"}]}}
    env = {
        "MAILTAP__EWS__ACCOUNTS__0__PASSWORD": "x",
        "MAILTAP__IMAP__ACCOUNTS__0__PASSWORD": "y",
        "MAILTAP__IMAP__FOLDERS__0": "INBOX",  # no list 'folders' in imap
    }
    assert apply_env_overrides(raw, env) == {"imap": {"accounts": [{"name": "a", "password": "y"}]}}


#: Secrets as people write them: every one of these broke or changed when read as YAML.
LITERALS = [
    "pass #1",  # YAML: a comment, "pass"
    "0777",  # YAML 1.1: octal 511
    "!x",  # YAML: a tag, an error at start
    "a: b",  # YAML: a mapping
    "key:value",
    '"quoted"',  # YAML: the quotes vanish
    "'single'",
    "  spaced out  ",  # YAML: stripped
    "ünïcödé €",
    "yes",  # YAML 1.1: True
    "1e3",  # YAML: a number
    "[not, a, list]",
    "*alias",
    "%percent",
    "- dash",
]


class Account(BaseModel):
    name: str
    password: SecretStr | None = None
    username: str | None = None
    port: int = 993
    verify: bool = True
    timeout: float | None = None
    folders: list[str] = ["INBOX"]


class Section(BaseModel):
    accounts: tuple[Account, ...]
    mode: Literal["on", "off"] = "on"
    options: dict[str, Any] = {}
    properties: dict[str, str] = {}


def _section(env: dict[str, str]) -> Section:
    raw = {"kafka": {"bootstrap_servers": "a:1"}, "x": {"accounts": [{"name": "a"}]}}
    return config_from_dict(raw, env=env).section("x", Section)


@pytest.mark.parametrize("text", LITERALS)
def test_string_settings_from_the_environment_are_taken_literally(text: str) -> None:
    section = _section(
        {
            "MAILTAP__X__ACCOUNTS__0__PASSWORD": text,
            "MAILTAP__X__ACCOUNTS__0__USERNAME": text,
            "MAILTAP__X__PROPERTIES__SSL.KEY.PASSWORD": text,
        }
    )
    account = section.accounts[0]
    assert account.password is not None and account.password.get_secret_value() == text
    assert account.username == text
    assert section.properties == {"ssl.key.password": text}


def test_core_string_settings_are_literal_too() -> None:
    env = {"MAILTAP__KAFKA__SASL_PASSWORD": "0777 #1", "MAILTAP__KAFKA__SASL_USERNAME": "a b"}
    cfg = config_from_dict({"kafka": {"bootstrap_servers": "a:1"}}, env=env)
    assert cfg.kafka.sasl_password is not None
    assert cfg.kafka.sasl_password.get_secret_value() == "0777 #1"
    assert cfg.kafka.sasl_username == "a b"


def test_null_unsets_an_optional_key_and_is_text_for_a_required_one() -> None:
    raw = {
        "kafka": {"bootstrap_servers": "a:1", "schema_registry_url": "http://r:8080"},
        "x": {"accounts": [{"name": "a", "password": "p"}]},
    }
    env = {
        "MAILTAP__KAFKA__SCHEMA_REGISTRY_URL": "null",
        "MAILTAP__X__ACCOUNTS__0__PASSWORD": "~",
        "MAILTAP__X__ACCOUNTS__0__NAME": "null",
    }
    cfg = config_from_dict(raw, env=env)
    assert cfg.kafka.schema_registry_url is None
    account = cfg.section("x", Section).accounts[0]
    assert account.password is None
    assert account.name == "null"  # a required string: the text


def test_numbers_bools_lists_and_nulls_still_parse() -> None:
    section = _section(
        {
            "MAILTAP__X__ACCOUNTS__0__PORT": "0993",  # decimal, not octal
            "MAILTAP__X__ACCOUNTS__0__VERIFY": "false",
            "MAILTAP__X__ACCOUNTS__0__TIMEOUT": "null",
            "MAILTAP__X__ACCOUNTS__0__FOLDERS": "[INBOX, Sent Items]",
            "MAILTAP__X__MODE": "off",  # YAML 1.1 would make it False
            "MAILTAP__X__OPTIONS__LIMIT": "5",  # Any: read as YAML, as before
        }
    )
    account = section.accounts[0]
    assert (account.port, account.verify, account.timeout) == (993, False, None)
    assert account.folders == ["INBOX", "Sent Items"]
    assert section.mode == "off"
    assert section.options == {"limit": 5}


def test_a_number_that_is_not_one_is_refused_with_its_key() -> None:
    with pytest.raises(ConfigError, match=r"x\.accounts\[0\]\.port") as caught:
        _section({"MAILTAP__X__ACCOUNTS__0__PORT": "99x"})
    assert "MAILTAP__X__ACCOUNTS__0__PORT" in str(caught.value)


def test_sections_read_raw_see_yaml_values_as_before() -> None:
    # mailtap status / dlq read smtp.retry_tiers raw, before the sink's model types them.
    env = {"MAILTAP__SMTP__RETRY_TIERS": "[1m, 5m]", "MAILTAP__SMTP__PASSWORD": "a #b"}
    cfg = config_from_dict({"kafka": {"bootstrap_servers": "a:1"}}, env=env)
    assert (cfg.model_extra or {})["smtp"]["retry_tiers"] == ["1m", "5m"]
