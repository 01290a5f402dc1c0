"""Commands without a configuration file say how to give one, instead of a TypeError (issue 13)."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from mailtap.cli import main


@pytest.mark.parametrize(
    "args",
    [
        ["run", "imap-source"],
        ["run", "smtp-sink"],
        ["consume", "mail.events"],
        ["topics", "ensure"],
        ["config", "check"],
    ],
)
def test_no_config_path_names_both_ways_to_give_one(
    args: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("MAILTAP_CONFIG", raising=False)
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 2, result.output
    assert "no configuration file: pass -c PATH or set MAILTAP_CONFIG=PATH" in result.output
    assert not isinstance(result.exception, TypeError)
    assert "Traceback" not in result.output
