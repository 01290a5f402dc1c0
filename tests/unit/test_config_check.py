"""``mailtap config check``: a file is valid only when every section each of its components
needs is present and valid (before, a file without ``streams:`` passed, and the streams
container then exited at start with "section 'streams' is missing")."""

from __future__ import annotations

from pathlib import Path

from click.testing import CliRunner

from mailtap.cli import main

KAFKA = "kafka: {bootstrap_servers: '127.0.0.1:9092'}\n"
SMTP = "smtp: {host: relay.example.com, from_address: m@example.com}\n"
STREAMS = "streams: {from_address: {address: help@example.com}}\n"


def check(tmp_path: Path, text: str, *args: str) -> tuple[int, str]:
    path = tmp_path / "mailtap.yaml"
    path.write_text(text)
    result = CliRunner().invoke(main, ["config", "check", "-c", str(path), *args])
    return result.exit_code, result.output


def test_a_component_without_its_section_fails(tmp_path: Path) -> None:
    code, output = check(tmp_path, KAFKA + SMTP, "--component", "streams")
    assert code != 0
    assert "section 'streams' (for streams) is missing" in output


def test_declared_components_need_their_sections(tmp_path: Path) -> None:
    code, output = check(tmp_path, "components: [streams, smtp-sink]\n" + KAFKA + SMTP)
    assert code != 0 and "'streams' (for streams)" in output
    code, output = check(tmp_path, "components: [streams, smtp-sink]\n" + KAFKA + SMTP + STREAMS)
    assert code == 0, output
    assert "valid for streams, smtp-sink" in output


def test_components_are_inferred_from_sections(tmp_path: Path) -> None:
    code, output = check(tmp_path, KAFKA + SMTP + STREAMS)
    assert code == 0, output
    assert "valid for streams, smtp-sink" in output


def test_a_file_no_component_runs_from_fails(tmp_path: Path) -> None:
    code, output = check(tmp_path, KAFKA)
    assert code != 0 and "no component runs from this file" in output


def test_unknown_declared_component_fails(tmp_path: Path) -> None:
    code, output = check(tmp_path, "components: [smtp-snk]\n" + KAFKA + SMTP)
    assert code != 0 and "unknown smtp-snk" in output


def test_component_option_checks_only_what_it_reads(tmp_path: Path) -> None:
    # The sink's container has no IMAP password: the imap section is not its business.
    imap = "imap: {accounts: [{name: a, host: h, username: u, folders: [INBOX]}]}\n"
    code, output = check(tmp_path, KAFKA + SMTP + imap, "--component", "smtp-sink")
    assert code == 0, output
    code, output = check(tmp_path, KAFKA + SMTP + imap)
    assert code != 0 and "imap.accounts[0]" in output


def test_streams_rules_naming_an_unknown_workflow_fail(tmp_path: Path) -> None:
    rules = "  rules: [{workflow: no_such_flow}]\n"
    code, output = check(
        tmp_path, KAFKA + "streams:\n  from_address: {address: help@example.com}\n" + rules
    )
    assert code != 0, output
    assert "no_such_flow" in output
