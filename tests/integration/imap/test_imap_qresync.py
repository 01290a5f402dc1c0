"""QRESYNC (RFC 7162) on reconnect, against Dovecot: a restart learns what vanished while the
source was down from the SELECT, without listing the folder, and publishes exactly what the
listing path publishes (``imap.qresync: off`` hides the capability from the source)."""

from __future__ import annotations

import logging
from collections import Counter
from typing import Any

import pytest

from connectors.imap.config import ImapAccountSettings
from connectors.imap.connection import ImapConnection
from connectors.imap.qresync import QresyncRequest
from tests.integration.imap.imap_harness import ImapHarness, running, wait_for
from tests.support.crashpoints import EXIT_CODE, crash_env

#: No catch-up poll during a test: the only expunge check is the one at (re)start.
QUIET = {"catchup_poll_seconds": 600, "uidvalidity_check_seconds": 600}


@pytest.fixture
def imap(imap: ImapHarness) -> ImapHarness:
    """The harness under an account name of this test's own: tests running at the same time
    under one name share transactional ids and fence each other (imap_harness.py)."""
    imap.account_name = f"qr-{imap.unique}"
    return imap


def _checks(source: Any, method: str, folder: str = "INBOX") -> float:
    account = source.workers[0].account.name
    labels = {"source": "imap", "account": account, "folder": folder, "method": method}
    return source.metrics.registry.get_sample_value("mailtap_expunge_checks_total", labels) or 0


def _latest(imap: ImapHarness) -> dict[str, dict[str, Any] | None]:
    latest: dict[str, dict[str, Any] | None] = {}
    for record in imap.events():
        assert record.key is not None
        latest[record.key] = record.value
    return latest


@pytest.mark.parametrize("mode", ["auto", "off"])
def test_a_restart_learns_expunges_moves_and_flags_of_the_outage_with_or_without_qresync(
    imap: ImapHarness, mode: str
) -> None:
    client = imap.client(folder="")
    client.create_folder("Archive")
    client.logout()
    ids = imap.append_numbered(6)
    folders = {"account": {"folders": ["INBOX", "Archive"]}}
    with running(imap, qresync=mode, **folders, **QUIET) as source:
        wait_for(lambda: imap.cursor_at(6), "the first run")
        if mode == "auto":
            # The first start lists the folder; its check is the QRESYNC watermark.
            wait_for(lambda: (imap.cursor() or {}).get("vanished_modseq", 0) > 0, "a watermark")
        assert _checks(source, "qresync") == 0
    # While the source is down: a move to a watched folder, two deletions, a flag change.
    client = imap.client()
    client.move([1], "Archive")
    client.delete_messages([2, 3])
    client.expunge()
    client.add_flags([5], [b"\\Flagged"])
    client.logout()
    with running(imap, qresync=mode, **folders, **QUIET) as source:
        wait_for(
            lambda: (
                sum(r.value is None for r in imap.events()) == 2
                and imap.cursor_at(1, folder="Archive")
                and "UPDATED" in [r.value["change"] for r in imap.events() if r.value]
            ),
            "two tombstones, the moved mail and the flag change",
        )
        wait_for(lambda: len(imap.events()) == 10, "every event of the restart")
        qresync, listing = _checks(source, "qresync"), _checks(source, "listing")
    if mode == "auto":
        assert (qresync, listing) == (1, 0)  # the folder was not listed
    else:
        assert (qresync, listing) == (0, 1)
    # The same events either way: 6 ADDED, the move and the flag as UPDATED, 2 tombstones.
    events = Counter((r.key, r.value["change"] if r.value else None) for r in imap.events())
    keys = [f"{imap.account_name}/mid:{m}" for m in ids]
    assert events == Counter(
        [(k, "ADDED") for k in keys]
        + [(keys[0], "UPDATED"), (keys[1], None), (keys[2], None), (keys[4], "UPDATED")]
    )
    latest = _latest(imap)
    moved, flagged = latest[keys[0]], latest[keys[4]]
    assert moved is not None and moved["source"]["folder"] == "Archive"
    assert flagged is not None and "\\Flagged" in flagged["flags"]


def test_a_uidvalidity_change_during_the_outage_rescans_instead_of_trusting_qresync(
    imap: ImapHarness,
) -> None:
    imap.append_numbered(4)
    with running(imap, **QUIET):
        wait_for(lambda: (imap.cursor() or {}).get("vanished_modseq", 0) > 0, "a watermark")
        before = imap.cursor()
    assert before is not None
    imap.doveadm(
        "mailbox", "update", "-u", imap.account.username,
        "--uid-validity", str(before["uidvalidity"] + 1000), "INBOX",
    )  # fmt: skip
    client = imap.client()
    client.delete_messages([4])
    client.expunge()
    client.logout()
    with running(imap, **QUIET) as source:
        wait_for(
            lambda: (c := imap.cursor()) is not None and c["epoch"] == 1 and c["last_uid"] >= 3,
            "the rescan in the new epoch",
        )
        qresync = _checks(source, "qresync")
    after = imap.cursor()
    assert after is not None and after["uidvalidity"] == before["uidvalidity"] + 1000
    assert qresync == 0  # the stored UIDVALIDITY no longer holds: no VANISHED is trusted
    assert [r.value["change"] for r in imap.events() if r.value].count("RESCANNED") == 3


class _Garbled(QresyncRequest):
    """A parameter the server refuses with BAD (a server claiming QRESYNC but not parsing it)."""

    def parameter(self) -> str:
        return "(QRESYNC (not-a-number))"


def test_a_qresync_parameter_the_server_refuses_falls_back_to_a_plain_select(
    imap: ImapHarness, caplog: pytest.LogCaptureFixture
) -> None:
    imap.append_numbered(2)
    account = ImapAccountSettings.model_validate(imap.config_dict()["imap"]["accounts"][0])
    conn = ImapConnection(account, connect_timeout=5, read_timeout=10)
    conn.connect()
    try:
        conn.login()
        assert conn.enable_condstore(qresync=True) and conn.qresync
        plain = conn.select("INBOX")
        with caplog.at_level(logging.WARNING):
            status = conn.select("INBOX", qresync=_Garbled(plain.uidvalidity, 1, 2))
        assert status.vanished is None  # no answer to trust: the caller lists the folder
        assert (status.uidvalidity, status.exists) == (plain.uidvalidity, 2)
        assert "selecting without QRESYNC" in caplog.text
        assert conn.uids_from(1) == [1, 2]  # the folder is selected and usable
    finally:
        conn.logout()


def test_a_kill_before_the_tombstone_commits_leaves_the_watermark_behind_it(
    imap: ImapHarness,
) -> None:
    """The expunge watermark is not the flag watermark, and it moves in the tombstone's own
    transaction: a source killed with that transaction open, after it committed the flag
    change made later than the expunge, restarts from the old watermark and QRESYNC names
    the mail again."""
    ids = imap.append_numbered(4)
    with running(imap, **QUIET):
        wait_for(lambda: (imap.cursor() or {}).get("vanished_modseq", 0) > 0, "a watermark")
    before = imap.cursor()
    assert before is not None
    client = imap.client()
    client.delete_messages([2])
    client.expunge()
    client.add_flags([4], [b"\\Flagged"])  # after the expunge: a higher MODSEQ
    client.logout()
    # The restart's transactions: the UPDATED event, the end of the change sync, then the
    # tombstone, killed after it is produced and before it commits.
    config = imap.write_config(**QUIET)
    crashed = imap.spawn(config, env=crash_env("in_transaction:3"), log_name="crash")
    assert crashed.wait(180) == EXIT_CODE, imap.log("crash")
    crashed_at = imap.cursor()
    assert crashed_at is not None and crashed_at["highestmodseq"] > before["vanished_modseq"]
    assert crashed_at["vanished_modseq"] == before["vanished_modseq"]
    assert not any(r.value is None for r in imap.events())
    with running(imap, **QUIET) as source:
        wait_for(lambda: any(r.value is None for r in imap.events()), "the tombstone")
        assert _checks(source, "qresync") == 1 and _checks(source, "listing") == 0
    tombstones = [r.key for r in imap.events() if r.value is None]
    assert tombstones == [f"{imap.account_name}/mid:{ids[1]}"]
    assert [r.value["change"] for r in imap.events() if r.value].count("UPDATED") == 1
    after = imap.cursor()
    assert after is not None and after["vanished_modseq"] > before["vanished_modseq"]
