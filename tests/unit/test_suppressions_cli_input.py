"""``mailtap suppressions`` and ``smtp.suppression`` refuse bad input with a sentence, before any
Kafka I/O."""

from __future__ import annotations

from pathlib import Path

from click.testing import CliRunner

from mailtap.cli import main


def _config(tmp_path: Path, extra: str = "") -> Path:
    config = tmp_path / "mailtap.yaml"
    config.write_text("kafka:\n  bootstrap_servers: 127.0.0.1:1\n" + extra)  # nothing listens
    return config


def test_add_refuses_what_is_not_an_address(tmp_path: Path) -> None:
    result = CliRunner().invoke(
        main, ["suppressions", "add", "-c", str(_config(tmp_path)), "no address"]
    )
    assert result.exit_code == 2
    assert "is not an address of the form local@domain" in result.output


def test_add_refuses_an_unknown_reason(tmp_path: Path) -> None:
    args = ["suppressions", "add", "-c", str(_config(tmp_path)), "a@example.org", "--reason", "X"]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 2
    assert "'X' is not one of" in result.output


def test_config_check_names_a_wrong_suppression_setting(tmp_path: Path) -> None:
    config = _config(
        tmp_path,
        "smtp:\n  host: relay.example.com\n  from_address: a@example.com\n"
        "  suppression:\n    unsubscribe_url: http://example.com/u\n",
    )
    result = CliRunner().invoke(main, ["config", "check", "-c", str(config)])
    assert result.exit_code != 0
    assert "unsubscribe_url" in result.output and "is not an https:// URL" in result.output
