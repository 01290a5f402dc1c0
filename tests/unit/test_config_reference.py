"""docs/configuration.md is generated; it must match the settings models, and every key has a
description so the reference explains what each one does."""

from pathlib import Path

from click.testing import CliRunner

from mailtap.cli import main
from mailtap.commands.config import render_reference

DOC = Path(__file__).resolve().parents[2] / "docs" / "configuration.md"


def test_committed_reference_matches_the_models() -> None:
    assert DOC.read_text() == render_reference(), (
        "docs/configuration.md is stale: run `.venv/bin/mailtap config reference > docs/configuration.md`"
    )


def test_every_key_is_described() -> None:
    undocumented = [
        line.split("|")[1].strip()
        for line in render_reference().splitlines()
        if line.startswith("| `") and line.rstrip().endswith("|  |")
    ]
    assert undocumented == []


def test_config_check_validates_every_present_section(tmp_path: Path) -> None:
    good = tmp_path / "good.yaml"
    good.write_text(
        "kafka: {bootstrap_servers: '127.0.0.1:9092'}\n"
        "smtp: {host: relay.example.com, from_address: m@example.com}\n"
    )
    result = CliRunner().invoke(main, ["config", "check", "-c", str(good)])
    assert result.exit_code == 0, result.output
    assert "smtp" in result.output
    bad = tmp_path / "bad.yaml"
    bad.write_text(
        "kafka: {bootstrap_servers: '127.0.0.1:9092'}\nsmtp: {host: h, port: 99999, from_address: m@x}\n"
    )
    result = CliRunner().invoke(main, ["config", "check", "-c", str(bad)])
    assert result.exit_code != 0
    assert "smtp.port" in result.output
    typo = tmp_path / "typo.yaml"
    typo.write_text("kafka: {bootstrap_servers: '127.0.0.1:9092'}\nsmpt: {}\n")
    result = CliRunner().invoke(main, ["config", "check", "-c", str(typo)])
    assert result.exit_code != 0 and "smpt" in result.output
