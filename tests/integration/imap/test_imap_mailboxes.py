"""Folders added and removed at runtime with `mailtap mailboxes` (the mailboxes topic): a running
source process (in a group of one) starts and stops them without a restart, /healthz follows,
and `mailtap mailboxes list` names the owning instance."""

from __future__ import annotations

import time
from pathlib import Path

import yaml
from click.testing import CliRunner

from mailtap.cli import main
from tests.integration.imap.imap_harness import ImapHarness, make_mail, wait_for
from tests.support.scaleout import start_instance, stop_instances


def _cli(*args: str) -> str:
    result = CliRunner().invoke(main, list(args))
    assert result.exit_code == 0, result.output
    return result.output


def test_folders_added_and_removed_at_runtime_start_and_stop_in_the_running_source(
    imap: ImapHarness, unique: str, tmp_path: Path
) -> None:
    imap.account_name = f"mb-{unique}"
    name = imap.account_name
    client = imap.client(folder="")
    client.create_folder("Archive")
    client.logout()
    imap.append([make_mail(f"in0-{unique}@x", "in 0")])
    imap.append([make_mail(f"ar0-{unique}@x", "archived 0")], folder="Archive")
    config = imap.config_dict(parse_workers=0)
    config["imap"]["group"] = {
        "id": f"mb-group-{unique}",
        "work_topic": f"mailtap.imap-work.{unique}",
        "work_partitions": 2,
        "session_timeout_seconds": 6,
    }
    path = tmp_path / "cli.yaml"
    path.write_text(yaml.safe_dump(config))
    source = start_instance("imap-source", config, tmp_path, "source")
    key = f"{name}/mid:{{}}-{unique}@x".format
    try:
        wait_for(lambda: key("in0") in {r.key for r in imap.events()}, "the INBOX mail")
        assert source.owned() == {f"imap/{name}/INBOX"}

        assert "added" in _cli("mailboxes", "add", "imap", name, "Archive", "-c", str(path))
        wait_for(lambda: key("ar0") in {r.key for r in imap.events()}, "the Archive mail")
        assert source.owned() == {f"imap/{name}/INBOX", f"imap/{name}/Archive"}
        listing = _cli("mailboxes", "list", "-c", str(path))
        [archive] = [line for line in listing.splitlines() if "/Archive" in line]
        assert "added" in archive and f":{source.proc.pid}" in archive, listing

        _cli("mailboxes", "remove", "imap", name, "INBOX", "-c", str(path))
        wait_for(lambda: source.owned() == {f"imap/{name}/Archive"}, "INBOX stopped")
        imap.append([make_mail(f"in1-{unique}@x", "in 1")])
        imap.append([make_mail(f"ar1-{unique}@x", "archived 1")], folder="Archive")
        wait_for(lambda: key("ar1") in {r.key for r in imap.events()}, "the new Archive mail")
        time.sleep(2)  # INBOX was stopped before in1 arrived: it stays unpublished
        assert key("in1") not in {r.key for r in imap.events()}

        _cli("mailboxes", "reset", "imap", name, "INBOX", "-c", str(path))  # configured again
        wait_for(lambda: key("in1") in {r.key for r in imap.events()}, "INBOX resumed")
        assert source.alive
    finally:
        stop_instances([source])
    keys = [r.key for r in imap.events()]
    assert sorted(keys) == sorted({*keys}), "a mail was published twice"


def test_an_account_missing_from_the_configuration_is_refused_with_a_sentence(
    imap: ImapHarness, tmp_path: Path
) -> None:
    path = imap.write_config("cli.yaml")
    result = CliRunner().invoke(
        main, ["mailboxes", "add", "imap", "nobody", "INBOX", "-c", str(path)]
    )
    assert result.exit_code != 0
    assert "account 'nobody' is not in the imap section" in result.output
    result = CliRunner().invoke(
        main, ["mailboxes", "add", "ews", "nobody", "inbox", "-c", str(path)]
    )
    assert "no 'ews' section" in result.output
