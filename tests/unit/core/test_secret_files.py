"""MAILTAP_SECRETS_DIR: settings from files named like their variables (compose secrets)."""

from __future__ import annotations

from pathlib import Path

import pytest

from connectors.core.config import load_config
from connectors.core.errors import ConfigError
from connectors.core.secret_files import secret_file_values

CONFIG = "kafka:\n  bootstrap_servers: k:9093\n  security_protocol: SASL_SSL\n"


@pytest.fixture
def config(tmp_path: Path) -> Path:
    path = tmp_path / "mailtap.yaml"
    path.write_text(CONFIG)
    return path


@pytest.fixture
def secrets(tmp_path: Path) -> Path:
    folder = tmp_path / "run-secrets"
    folder.mkdir()
    return folder


def test_setting_files_set_the_keys_they_are_named_after(config: Path, secrets: Path) -> None:
    (secrets / "MAILTAP__KAFKA__SASL_PASSWORD").write_text("pa ss #1 !x: 0777\n")
    (secrets / "MAILTAP__KAFKA__SASL_MECHANISM").write_text("SCRAM-SHA-512")
    (secrets / "console-tokens.yaml").write_text("not a setting")  # other secrets: left alone
    env = {"MAILTAP_SECRETS_DIR": str(secrets), "MAILTAP__KAFKA__SASL_USERNAME": "mailtap-streams"}
    kafka = load_config(config, env=env).kafka
    assert kafka.sasl_username == "mailtap-streams"
    assert kafka.sasl_mechanism == "SCRAM-SHA-512"
    # Taken literally as a variable's text would be; only the final line ending dropped.
    assert kafka.sasl_password is not None
    assert kafka.sasl_password.get_secret_value() == "pa ss #1 !x: 0777"


def test_only_one_final_line_ending_is_dropped(secrets: Path) -> None:
    (secrets / "MAILTAP__A").write_bytes(b"  two  \r\n\r\n")
    assert secret_file_values({"MAILTAP_SECRETS_DIR": str(secrets)}) == {
        "MAILTAP__A": "  two  \r\n"
    }


def test_a_key_set_by_a_file_and_a_variable_is_an_error(config: Path, secrets: Path) -> None:
    (secrets / "MAILTAP__KAFKA__SASL_PASSWORD").write_text("own-login")
    env = {"MAILTAP_SECRETS_DIR": str(secrets), "MAILTAP__KAFKA__SASL_PASSWORD": "shared-login"}
    with pytest.raises(ConfigError) as error:
        load_config(config, env=env)
    sentence = str(error.value)
    assert "MAILTAP__KAFKA__SASL_PASSWORD set both in the environment and by a file" in sentence
    assert "own-login" not in sentence and "shared-login" not in sentence


def test_a_missing_directory_fails_with_what_to_change(config: Path, tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"MAILTAP_SECRETS_DIR=.*is not a directory"):
        load_config(config, env={"MAILTAP_SECRETS_DIR": str(tmp_path / "nowhere")})


def test_an_unreadable_or_binary_file_is_named(secrets: Path) -> None:
    (secrets / "MAILTAP__KAFKA__SASL_PASSWORD").write_bytes(b"\xff\xfe")
    env = {"MAILTAP_SECRETS_DIR": str(secrets)}
    with pytest.raises(ConfigError, match="MAILTAP__KAFKA__SASL_PASSWORD is not UTF-8"):
        secret_file_values(env)


def test_an_empty_password_file_fails_like_a_missing_password(config: Path, secrets: Path) -> None:
    (secrets / "MAILTAP__KAFKA__SASL_PASSWORD").write_text("\n")
    env = {
        "MAILTAP_SECRETS_DIR": str(secrets),
        "MAILTAP__KAFKA__SASL_MECHANISM": "SCRAM-SHA-512",
        "MAILTAP__KAFKA__SASL_USERNAME": "mailtap-streams",
    }
    with pytest.raises(ConfigError, match="needs sasl_username and sasl_password"):
        load_config(config, env=env)
