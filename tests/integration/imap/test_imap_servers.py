"""The IMAP source's correctness on every server of the dev stack (`mailtap.dev.imapservers`):
Dovecot, Dovecot trimmed to IMAP4rev1 + UIDPLUS, Cyrus, Courier, GreenMail.

Where a server lacks an extension, the test asserts the documented fallback
(connectors/imap/README.md, "Servers"): polling instead of IDLE, the FLAGS listing instead of
CONDSTORE, the UID listing instead of QRESYNC, COPY + EXPUNGE instead of MOVE. Nothing is skipped.
"""

from __future__ import annotations

import json
import logging
import time
import urllib.error
import urllib.request
from collections import Counter
from typing import Any

import pytest

from mailtap.dev import ImapInfo
from tests.integration.imap.imap_harness import (
    ImapHarness,
    changes,
    keys_of,
    make_mail,
    running,
    wait_for,
)
from tests.support.crashpoints import EXIT_CODE, crash_env
from tests.support.tcp_proxy import TcpProxy

#: What each server offers after login, as the source's fallbacks depend on it.
CONDSTORE = {
    "dovecot": True,
    "cyrus": True,
    "courier": False,
    "dovecot-minimal": False,
    "greenmail": False,
}
IDLE = {
    "dovecot": True,
    "cyrus": True,
    "courier": True,
    "dovecot-minimal": False,
    "greenmail": True,
}
MOVE = {
    "dovecot": True,
    "cyrus": True,
    "courier": False,
    "dovecot-minimal": False,
    "greenmail": True,
}

BROKEN = (
    b"From: a@example.org\r\nTo: b@example.org\r\nMessage-ID: <b64-{unique}@x>\r\n"
    b"Subject: broken\r\nContent-Type: text/plain\r\nContent-Transfer-Encoding: base64\r\n\r\n"
    b"!!!not*base64===\r\nYWJj=ZGVm\r\n"
)


def folder(server: ImapInfo, name: str) -> str:
    """Courier keeps every folder under the ``INBOX.`` namespace prefix (its NAMESPACE)."""
    return f"INBOX.{name}" if server.kind == "courier" else name


def key(imap: ImapHarness, message_id: str) -> str:
    return f"{imap.account_name}/mid:{message_id}"


def latest(imap: ImapHarness) -> dict[str | None, dict[str, Any] | None]:
    return {r.key: r.value for r in imap.events()}


def healthz(port: int) -> dict[str, Any]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=5) as answer:
            body: dict[str, Any] = json.loads(answer.read())
    except urllib.error.HTTPError as exc:
        body = json.loads(exc.read())
    return body


def test_new_mail_flags_moves_and_expunges_reach_kafka(
    on_server: ImapHarness, imap_server: ImapInfo, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="connectors.imap.capabilities")
    imap, kind = on_server, imap_server.kind
    archive = folder(imap_server, "Archive")
    client = imap.client(folder="")
    client.create_folder(archive)
    client.logout()
    flagged, moved, deleted = imap.append_numbered(3)
    with running(
        imap,
        account={"folders": ["INBOX", archive]},
        catchup_poll_seconds=3,
        poll_interval_seconds=1,
    ) as source:
        wait_for(lambda: imap.cursor_at(3), "the first mails")
        (new,) = imap.append_numbered(1, start=3)
        wait_for(lambda: imap.cursor_at(4), "mail that arrived while the source waited")
        inbox = next(w for w in source.workers if w.folder == "INBOX")
        # Without IDLE the worker polls (mode: idle is the default), says so, and /healthz too.
        waiting = {"IDLE", "SYNCING"} if IDLE[kind] else {"POLLING", "SYNCING"}
        wait_for(lambda: inbox.machine.state.value in waiting, f"a worker in {waiting}")
        notes = healthz(source.health_port)["fallbacks"].get(f"imap/{imap.account_name}/INBOX", [])
        assert any(n.startswith("no IDLE") for n in notes) == (not IDLE[kind]), notes
        assert any(n.startswith("no CONDSTORE") for n in notes) == (not CONDSTORE[kind]), notes

        client = imap.client()
        client.add_flags([1], [b"\\Flagged"])
        if MOVE[kind]:
            client.move([2], archive)
        else:  # what a client does without MOVE (RFC 6851 section 3.3)
            client.copy([2], archive)
            client.delete_messages([2])
            client.uid_expunge([2])
        client.delete_messages([3])
        client.uid_expunge([3])
        client.logout()

        def done() -> bool:
            now = latest(imap)
            return (
                (now.get(key(imap, flagged)) or {}).get("change") == "UPDATED"
                and (now.get(key(imap, moved)) or {}).get("source", {}).get("folder") == archive
                and key(imap, deleted) in now
                and now[key(imap, deleted)] is None
            )

        wait_for(done, "the UPDATED flag, the UPDATED move and the tombstone")
    now = latest(imap)
    assert "\\Flagged" in now[key(imap, flagged)]["flags"]  # type: ignore[index]
    assert now[key(imap, moved)]["change"] == "UPDATED"  # type: ignore[index]
    assert now[key(imap, new)]["change"] == "ADDED"  # type: ignore[index]
    assert len(keys_of(imap.events())) == 4
    said = [r.getMessage() for r in caplog.records if "no IDLE" in r.getMessage()]
    # Once per mailbox worker (INBOX and Archive), not once per poll.
    assert len(said) == (0 if IDLE[kind] else 2), said


@pytest.mark.parametrize("point", ["in_transaction:2", "after_commit:2"])
def test_kill_9_loses_and_duplicates_nothing_and_the_move_is_repaired(
    on_server: ImapHarness, imap_server: ImapInfo, point: str
) -> None:
    """kill -9 inside a transaction, or between its commit and the move to Processed (MOVE, or
    COPY + EXPUNGE without it): after a restart every mail is in Kafka once, in Processed."""
    imap = on_server
    processed = folder(imap_server, "Processed")
    ids = imap.append_numbered(30)
    config = imap.write_config(batch_size=10, account={"after_commit": f"move:{processed}"})
    crashed = imap.spawn(config, env=crash_env(point), log_name="crash")
    assert crashed.wait(180) == EXIT_CODE, imap.log("crash")
    imap.spawn(config)
    wait_for(lambda: imap.cursor_at(30), "the restarted source to catch up")
    wait_for(lambda: (imap.cursor() or {}).get("pending", 1) is None, "the repaired move")
    client = imap.client()
    wait_for(lambda: not client.search(["ALL"]), "INBOX emptied by the moves")
    client.select_folder(processed)
    assert len(client.search(["ALL"])) == 30
    client.logout()
    events = imap.events()
    added = Counter(r.key for r in events if r.value and r.value["change"] == "ADDED")
    assert set(added) == {key(imap, m) for m in ids} and max(added.values()) == 1
    now = latest(imap)
    assert all(v is not None and v["source"]["folder"] == processed for v in now.values())


def test_uidvalidity_change_rescans_without_new_keys(
    on_server: ImapHarness, imap_server: ImapInfo
) -> None:
    """A folder replaced by another of the same name has a new UIDVALIDITY on every server (the
    only way to change it over IMAP; doveadm does it in place on Dovecot, test_imap_source.py)."""
    imap = on_server
    archive = folder(imap_server, "Archive")
    client = imap.client(folder="")
    client.create_folder(archive)
    client.logout()
    mails = [make_mail(f"u{i}-{imap.unique}@x", f"u {i}") for i in range(6)]
    imap.append(mails, folder=archive)
    with running(
        imap, account={"folders": [archive]}, catchup_poll_seconds=2, poll_interval_seconds=1
    ) as source:
        wait_for(lambda: imap.cursor_at(6, folder=archive), "first pass")
        before = imap.cursor(archive)
        assert before is not None
        time.sleep(1.1)  # Courier's UIDVALIDITY is the creation time in seconds
        # The same mails in a new folder that takes the old one's place: all six at once, so
        # every one is below the new epoch's rescan mark (appended one by one into a recreated
        # folder, the later ones would rightly count as arrivals).
        refilled = folder(imap_server, "Refilled")
        client = imap.client(folder="")
        client.create_folder(refilled)
        client.logout()
        imap.append(mails, folder=refilled)
        client = imap.client(folder="")
        client.delete_folder(archive)
        client.rename_folder(refilled, archive)
        client.logout()
        wait_for(
            lambda: (
                (c := imap.cursor(archive)) is not None and c["epoch"] == 1 and c["last_uid"] >= 6
            ),
            "the rescan in the new epoch",
        )
        assert source.workers[0].cursor is not None
    after = imap.cursor(archive)
    assert after is not None and after["uidvalidity"] != before["uidvalidity"]
    events = imap.events()
    assert keys_of(events) == {key(imap, f"u{i}-{imap.unique}@x") for i in range(6)}
    assert changes(events).count("ADDED") == 6 and changes(events).count("RESCANNED") == 6


def test_mail_during_a_backfill_and_a_cut_connection_each_once(on_server: ImapHarness) -> None:
    imap = on_server
    backlog = imap.append_numbered(200)
    with TcpProxy(imap.host, imap.port) as link:
        link.delay = 0.02
        with running(
            imap, port=link.port, batch_size=10, catchup_poll_seconds=3, poll_interval_seconds=1
        ) as source:
            worker = source.workers[0]
            wait_for(lambda: worker.cursor and worker.cursor.last_uid >= 20, "backfill under way")
            # The backfill waits for an answer while mail arrives (appended directly to the
            # server, not through the link); then its connection is cut.
            link.stall()
            late = imap.append_numbered(10, start=200, tag="late")
            assert worker.cursor is not None and worker.cursor.last_uid < 200
            assert link.cut() >= 1  # the source reconnects and goes on from its cursor
            link.resume()
            wait_for(lambda: imap.cursor_at(210), "the backfill and the late mails")
            connects = source.metrics.registry.get_sample_value(
                "mailtap_connects_total",
                {"source": "imap", "account": imap.account_name, "folder": "INBOX"},
            )
    events = imap.events()
    assert keys_of(events) == {key(imap, m) for m in backlog + late}
    assert len(events) == 210 and set(changes(events)) == {"ADDED"}
    assert connects is not None and connects >= 2


def test_a_broken_mail_goes_to_the_dlq_and_the_cursor_moves_on(on_server: ImapHarness) -> None:
    imap = on_server
    imap.append(
        [
            make_mail(f"ok-{imap.unique}@x", "fine"),
            BROKEN.replace(b"{unique}", imap.unique.encode()),
            make_mail(f"after-{imap.unique}@x", "after"),
        ]
    )
    with running(imap):
        wait_for(lambda: imap.cursor_at(3), "all three mails")
    dlq = imap.dlq()
    assert len(dlq) == 1 and b"!!!not*base64===" in (dlq[0].raw_value or b"")
    assert keys_of(imap.events()) == {
        key(imap, f"ok-{imap.unique}@x"),
        key(imap, f"b64-{imap.unique}@x"),
        key(imap, f"after-{imap.unique}@x"),
    }
