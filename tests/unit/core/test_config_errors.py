"""Configuration errors name what to fix: the variable that set a bad value, the likely spelling
of an unknown key or of a misspelled section (issue 13)."""

from pathlib import Path

import pytest
from pydantic import BaseModel, ConfigDict

from connectors.core.config import config_from_dict, load_config
from connectors.core.errors import ConfigError
from connectors.smtp.config import SmtpSinkSettings


def _file(tmp_path: Path, text: str) -> Path:
    file = tmp_path / "mailtap.yaml"
    file.write_text(text)
    return file


SMTP = "kafka:\n  bootstrap_servers: a:1\nsmtp:\n  host: relay\n  port: 25\n  from_address: a@b.c\n"


def test_a_misspelled_env_override_names_the_variable_not_the_file(tmp_path: Path) -> None:
    cfg = load_config(_file(tmp_path, SMTP), env={"MAILTAP__SMTP__PORTT": "1"})
    with pytest.raises(ConfigError) as info:
        cfg.section("smtp", SmtpSinkSettings)
    text = str(info.value)
    assert "smtp.portt" in text
    assert "set by the environment variable MAILTAP__SMTP__PORTT" in text
    assert "did you mean MAILTAP__SMTP__PORT?" in text
    # The file is only the background: the error does not start by blaming it.
    assert text.startswith("invalid configuration from the environment")


def test_a_bad_env_value_in_a_core_section_names_the_variable(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as info:
        load_config(_file(tmp_path, SMTP), env={"MAILTAP__KAFKA__PARTITIONS": "many"})
    assert "kafka.partitions" in str(info.value)
    assert "MAILTAP__KAFKA__PARTITIONS" in str(info.value)


def test_an_unknown_key_in_the_file_gets_a_did_you_mean_and_blames_the_file(
    tmp_path: Path,
) -> None:
    cfg = load_config(_file(tmp_path, SMTP.replace("port: 25", "prot: 25")), env={})
    with pytest.raises(ConfigError) as info:
        cfg.section("smtp", SmtpSinkSettings)
    text = str(info.value)
    assert text.startswith(f"{tmp_path / 'mailtap.yaml'}: invalid configuration")
    assert (
        "smtp.prot: Extra inputs are not permitted (an unknown key); did you mean 'port'?" in text
    )
    assert "environment" not in text


def test_did_you_mean_inside_nested_and_listed_models() -> None:
    with pytest.raises(ConfigError, match=r"kafka\.topics\.event: .*did you mean 'events'\?"):
        config_from_dict({"kafka": {"bootstrap_servers": "a:1", "topics": {"event": "x"}}})

    class Account(BaseModel):
        model_config = ConfigDict(extra="forbid")
        username: str

    class Accounts(BaseModel):
        model_config = ConfigDict(extra="forbid")
        accounts: list[Account]

    cfg = config_from_dict(
        {"kafka": {"bootstrap_servers": "a:1"}, "x": {"accounts": [{"usernme": "u"}]}}
    )
    with pytest.raises(ConfigError, match=r"x\.accounts\[0\]\.usernme: .*did you mean 'username'"):
        cfg.section("x", Accounts)


def test_a_misspelled_section_is_suggested() -> None:
    cfg = config_from_dict({"kafka": {"bootstrap_servers": "a:1"}, "smpt": {"host": "h"}})
    with pytest.raises(ConfigError) as info:
        cfg.section("smtp", SmtpSinkSettings)
    assert "section 'smtp' is missing" in str(info.value)
    assert "Rename 'smpt:' to 'smtp:'" in str(info.value)


def test_a_misspelled_kafka_section_is_suggested() -> None:
    with pytest.raises(ConfigError, match="Rename 'kafak:' to 'kafka:'"):
        config_from_dict({"kafak": {"bootstrap_servers": "a:1"}})
