"""``mailtap dlq`` refuses bad input with a sentence, before it reaches for Kafka."""

from __future__ import annotations

from pathlib import Path

from click.testing import CliRunner

from mailtap.cli import main


def test_a_time_that_is_not_iso_is_a_usage_error(tmp_path: Path) -> None:
    config = tmp_path / "mailtap.yaml"
    config.write_text("kafka:\n  bootstrap_servers: 127.0.0.1:1\n")  # nothing listens there
    result = CliRunner().invoke(main, ["dlq", "list", "-c", str(config), "--since", "yesterday"])
    assert result.exit_code == 2
    assert "'yesterday' is not an ISO time" in result.output


def test_drop_without_a_filter_is_refused(tmp_path: Path) -> None:
    config = tmp_path / "mailtap.yaml"
    config.write_text("kafka:\n  bootstrap_servers: 127.0.0.1:1\n")
    result = CliRunner().invoke(main, ["dlq", "drop", "-c", str(config)])
    assert result.exit_code == 1
    assert "drop needs a filter" in result.output
