"""mailtap.dev.services and `mailtap dev`: config document, state round trip, CLI without services."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import yaml
from click.testing import CliRunner

from mailtap.commands.dev import dev
from mailtap.dev.services import (
    Account,
    DevServices,
    ImapInfo,
    KafkaInfo,
    RegistryInfo,
    SmtpInfo,
    config_document,
    write_config,
)


def _info(state: Path) -> DevServices:
    return DevServices(
        state_dir=state,
        config_path=state / "mailtap.yaml",
        claims_dir=state / "claims",
        kafka=KafkaInfo("127.0.0.1:19092", False, 11, state / "kafka" / "server.log"),
        imap=ImapInfo(
            host="127.0.0.1",
            port=14300,
            accounts=(Account("alice@example.com", "secret"), Account("demo@example.com", "s")),
            pid=12,
            log_path=state / "dovecot" / "dovecot.log",
            config_path=state / "dovecot" / "dovecot.conf",
            passwd_file=state / "dovecot" / "passwd",
            mail_dir=state / "dovecot" / "mail",
        ),
        smtp=SmtpInfo("127.0.0.1", 2525, state / "smtp" / "received", 13, state / "smtp.log"),
    )


def test_config_has_the_agreed_shape(tmp_path: Path) -> None:
    info = _info(tmp_path)
    write_config(info)
    assert (
        yaml.safe_load(info.config_path.read_text())
        == config_document(info)
        == {
            "kafka": {"bootstrap_servers": "127.0.0.1:19092"},
            "claim_check": {"url": f"file://{tmp_path}/claims"},
            "imap": {
                "accounts": [
                    {
                        "name": "demo",
                        "host": "127.0.0.1",
                        "port": 14300,
                        "security": "plain",
                        "username": "demo@example.com",
                        "password": "s",
                        "folders": ["INBOX"],
                        "start": "all",
                    }
                ]
            },
            "smtp": {
                "host": "127.0.0.1",
                "port": 2525,
                "security": "plain",
                "from_address": "mailtap@example.com",
            },
            "health": {"port": 0},
        }
    )
    assert info.claims_dir.is_dir()


def test_info_survives_the_state_file_round_trip(tmp_path: Path) -> None:
    info = _info(tmp_path)
    assert DevServices.from_json(info.to_json()) == info
    assert info.pids == [11, 12, 13]


def _with_registry(info: DevServices) -> DevServices:
    url = "http://127.0.0.1:18081/apis/ccompat/v7"
    return dataclasses.replace(info, registry=RegistryInfo(url, 14, info.state_dir / "r.log"))


def test_the_config_of_services_with_a_registry_names_it(tmp_path: Path) -> None:
    info = _with_registry(_info(tmp_path))
    assert config_document(info)["kafka"] == {
        "bootstrap_servers": "127.0.0.1:19092",
        "schema_registry_url": "http://127.0.0.1:18081/apis/ccompat/v7",
    }
    assert DevServices.from_json(info.to_json()) == info
    assert info.pids == [11, 12, 13, 14]  # `down` stops the registry too


def test_cli_status_and_down_without_services(tmp_path: Path) -> None:
    runner = CliRunner()
    status = runner.invoke(dev, ["status", "--json", "--state-dir", str(tmp_path)])
    assert status.exit_code == 1
    assert '"up": false' in status.output
    down = runner.invoke(dev, ["down", "--state-dir", str(tmp_path)])
    assert down.exit_code == 0
    assert "nothing was running" in down.output
