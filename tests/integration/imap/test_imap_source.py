"""The IMAP source on real Dovecot and real Kafka: what ends up in Kafka (read_committed)."""

from __future__ import annotations

import datetime as dt
import json
import logging
import time
import urllib.error
import urllib.request

import pytest
from imapclient import IMAPClient

from connectors.core.config import config_from_dict
from connectors.core.mail.conversation import conversation_key
from connectors.imap.source import ImapSource
from tests.integration.imap.imap_harness import (
    ImapHarness,
    changes,
    keys_of,
    make_mail,
    running,
    wait_for,
)


def test_n_appended_mails_give_n_events_n_keys_and_the_cursor_at_the_last_uid(
    imap: ImapHarness,
) -> None:
    ids = imap.append_numbered(35)
    with running(imap, batch_size=10) as source:
        wait_for(lambda: imap.cursor_at(35), "cursor at uid 35")
        # New mail while the source idles: published too.
        ids += imap.append_numbered(3, start=35)
        wait_for(lambda: imap.cursor_at(38), "cursor at uid 38")
        metrics = source.metrics
    events = imap.events()
    assert len(events) == 38
    assert keys_of(events) == {f"acct/mid:{mid}" for mid in ids}
    assert set(changes(events)) == {"ADDED"}
    by_uid = {e.value["source"]["uid"]: e.value for e in events if e.value}
    assert sorted(by_uid) == list(range(1, 39))
    assert by_uid[1]["subject"] == "m 0" and by_uid[1]["source"]["folder"] == "INBOX"
    # Each event names its conversation, which the streams worker re-keys it by undecoded.
    assert all(
        e.headers["mailtap.conversation"] == conversation_key(e.value).encode() for e in events
    )
    cursor = imap.cursor()
    assert cursor is not None and cursor["last_uid"] == 38 and cursor["pending"] is None
    assert (
        metrics.registry.get_sample_value(
            "mailtap_events_produced_total",
            {"source": "imap", "account": "acct", "folder": "INBOX"},
        )
        == 38
    )


def test_start_latest_skips_existing_mail(imap: ImapHarness) -> None:
    imap.append_numbered(5)
    with running(imap, account={"start": "latest"}):
        wait_for(lambda: imap.cursor_at(5), "cursor pinned at the latest uid")
        new = imap.append_numbered(2, start=5)
        wait_for(lambda: imap.cursor_at(7), "cursor at uid 7")
    assert keys_of(imap.events()) == {f"acct/mid:{mid}" for mid in new}


def test_start_since_a_date_skips_older_mail(imap: ImapHarness) -> None:
    client = imap.client(folder="")
    old = dt.datetime(2020, 1, 1, tzinfo=dt.UTC)
    for i in range(3):
        client.append("INBOX", make_mail(f"old{i}-{imap.unique}@x", "old"), msg_time=old)
    client.logout()
    recent = imap.append_numbered(2, tag="new")
    with running(imap, account={"start": "since:2025-06-01"}):
        wait_for(lambda: imap.cursor_at(5), "the mails since the date")
    assert keys_of(imap.events()) == {f"acct/mid:{m}" for m in recent}


def test_flag_change_is_a_complete_updated_event(imap: ImapHarness) -> None:
    (mid,) = imap.append_numbered(1)
    with running(imap, catchup_poll_seconds=2):
        wait_for(lambda: imap.cursor_at(1), "first event")
        client = imap.client()
        client.add_flags([1], [b"\\Flagged"])
        client.logout()
        wait_for(lambda: len(imap.events()) == 2, "the UPDATED event")
    first, update = imap.events()
    assert first.key == update.key == f"acct/mid:{mid}"
    assert update.value is not None and update.value["change"] == "UPDATED"
    assert "\\Flagged" in update.value["flags"]
    # Complete: the newest record of the key (what compaction keeps) still has the mail's content.
    assert update.value["subject"] == "m 0" and update.value["text_body"]


def test_marking_a_whole_folder_read_is_one_update_each_with_a_small_cursor(
    imap: ImapHarness,
) -> None:
    imap.append_numbered(60)
    with running(imap, catchup_poll_seconds=2):
        wait_for(lambda: imap.cursor_at(60), "the first events")
        client = imap.client()
        client.add_flags(client.search(["ALL"]), [b"\\Seen"])  # one STORE for the folder
        client.logout()
        wait_for(lambda: changes(imap.events()).count("UPDATED") == 60, "60 UPDATED events")
        wait_for(lambda: (imap.cursor() or {}).get("changes_done", 0) is None, "the sync's end")
    updated = [
        r.value["source"]["uid"]
        for r in imap.events()
        if r.value and r.value["change"] == "UPDATED"
    ]
    assert sorted(updated) == list(range(1, 61))
    cursor = imap.cursor()
    assert cursor is not None and len(json.dumps(cursor)) < 400  # not one entry per change


def test_uidvalidity_change_rescans_without_new_keys(imap: ImapHarness) -> None:
    imap.append_numbered(12)
    with running(imap, catchup_poll_seconds=2) as source:
        wait_for(lambda: imap.cursor_at(12), "first pass")
        before = imap.cursor()
        assert before is not None
        imap.doveadm(
            "mailbox", "update", "-u", imap.account.username,
            "--uid-validity", str(before["uidvalidity"] + 1000), "INBOX",
        )  # fmt: skip
        wait_for(
            lambda: (c := imap.cursor()) is not None and c["epoch"] == 1 and c["last_uid"] >= 12,
            "rescan in the new epoch",
        )
        rescans = source.metrics.registry.get_sample_value(
            "mailtap_uidvalidity_changes_total",
            {"source": "imap", "account": "acct", "folder": "INBOX"},
        )
    events = imap.events()
    assert len(keys_of(events)) == 12
    assert changes(events).count("ADDED") == 12
    assert changes(events).count("RESCANNED") == 12
    assert rescans == 1


def test_expunge_is_a_tombstone_but_a_move_between_watched_folders_is_an_update(
    imap: ImapHarness,
) -> None:
    client = imap.client(folder="")
    client.create_folder("Archive")
    client.logout()
    ids = imap.append_numbered(3)
    with running(imap, account={"folders": ["INBOX", "Archive"]}, catchup_poll_seconds=2):
        wait_for(lambda: imap.cursor_at(3), "first pass")
        client = imap.client()
        client.move([1], "Archive")
        client.delete_messages([2])
        client.expunge()
        client.logout()
        wait_for(
            lambda: (
                any(r.value is None for r in imap.events()) and imap.cursor_at(1, folder="Archive")
            ),
            "tombstone and the moved mail",
        )
        time.sleep(3)  # a further catch-up poll must not add a tombstone for the moved mail
    latest = {}
    for record in imap.events():
        latest[record.key] = record.value
    moved, deleted, kept = (f"acct/mid:{m}" for m in ids)
    assert latest[deleted] is None
    assert latest[moved] is not None and latest[moved]["source"]["folder"] == "Archive"
    assert latest[moved]["change"] == "UPDATED"
    assert latest[kept] is not None and latest[kept]["source"]["folder"] == "INBOX"


def test_after_commit_move_moves_only_published_mail_and_says_where_it_went(
    imap: ImapHarness,
) -> None:
    ids = imap.append_numbered(4)
    with running(imap, account={"after_commit": "move:Processed"}, catchup_poll_seconds=2):
        wait_for(lambda: imap.cursor_at(4), "published")
        client = imap.client()
        wait_for(lambda: not client.search(["ALL"]), "INBOX emptied by the move")
        client.select_folder("Processed")
        assert len(client.search(["ALL"])) == 4
        client.logout()
        time.sleep(3)  # a catch-up poll must not tombstone mails we moved ourselves
    events = imap.events()
    latest = {r.key: r.value for r in events}
    assert set(latest) == {f"acct/mid:{m}" for m in ids}
    assert all(v is not None and v["source"]["folder"] == "Processed" for v in latest.values())
    assert changes(events).count("ADDED") == 4
    cursor = imap.cursor()
    assert cursor is not None and cursor["pending"] is None


def test_after_commit_seen_marks_published_mail_seen(imap: ImapHarness) -> None:
    imap.append_numbered(3)
    with running(imap, account={"after_commit": "seen"}):
        wait_for(lambda: imap.cursor_at(3), "published")
        client = imap.client()
        wait_for(lambda: len(client.search(["SEEN"])) == 3, "three mails \\Seen")
        client.logout()
        # The flag change is published too: the newest record per key says \Seen.
        wait_for(
            lambda: all(
                "\\Seen" in v["flags"]
                for v in {r.key: r.value for r in imap.events()}.values()
                if v
            ),
            "UPDATED events with \\Seen",
        )
    assert changes(imap.events()).count("ADDED") == 3


def test_bad_password_backs_off_to_the_cap_and_counts_auth_failures(
    imap: ImapHarness, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)  # imapclient logs every command at DEBUG, LOGIN too
    wrong = f"wrong-{imap.unique}-pw"
    with running(
        imap, account={"password": wrong}, backoff_initial_seconds=0.1, backoff_cap_seconds=1
    ) as source:
        labels = {"source": "imap", "account": "acct", "folder": "INBOX"}
        wait_for(
            lambda: (
                (
                    source.metrics.registry.get_sample_value("mailtap_auth_failures_total", labels)
                    or 0
                )
                >= 2
            ),
            "two auth failures",
        )
        worker = source.workers[0]
        # Permanent errors wait the cap each time: no spinning on a wrong password.
        assert worker.backoff.attempt >= 2
    assert imap.events() == []
    assert "LOGIN" in caplog.text and "AUTHENTICATING -> BACKOFF" in caplog.text
    assert wrong not in caplog.text  # no secret in any log line, at any level


def test_mail_appended_during_idle_arrives_without_waiting_for_a_poll(imap: ImapHarness) -> None:
    with running(imap, catchup_poll_seconds=600, idle_renew_seconds=600) as source:
        wait_for(lambda: imap.cursor() is not None, "start")
        wait_for(lambda: source.workers[0].machine.state.value == "IDLE", "IDLE")
        imap.append([make_mail(f"idle-{imap.unique}@example.com", "idle")])
        wait_for(lambda: imap.cursor_at(1), "the mail, via IDLE")
    assert keys_of(imap.events()) == {f"acct/mid:idle-{imap.unique}@example.com"}


def test_mail_expunged_before_it_was_read_is_passed_and_the_worker_idles(
    imap: ImapHarness,
) -> None:
    # UIDNEXT stays above the last mail: the worker synced again at once, for ever, instead of
    # IDLE (a busy loop of NOOP, STATUS and SEARCH on the server), until new mail came.
    ids = imap.append_numbered(3)
    client = imap.client()
    client.delete_messages([2, 3])
    client.expunge()
    client.logout()
    with running(imap, catchup_poll_seconds=600, idle_renew_seconds=600) as source:
        wait_for(lambda: imap.cursor_at(3), "the cursor past the expunged uids 2 and 3")
        wait_for(lambda: source.workers[0].machine.state.value == "IDLE", "IDLE")
        new = imap.append_numbered(1, start=3)
        wait_for(lambda: imap.cursor_at(4), "the next mail, via IDLE")
    assert keys_of(imap.events()) == {f"acct/mid:{ids[0]}", f"acct/mid:{new[0]}"}


def test_starttls_that_the_server_does_not_offer_is_never_skipped(imap: ImapHarness) -> None:
    imap.append_numbered(1)
    with running(imap, account={"security": "starttls"}) as source:
        worker = source.workers[0]
        wait_for(lambda: "BACKOFF" in [s.value for s in worker.machine.history], "refusal")
        # Refused before AUTHENTICATING: the password never crossed the wire in plaintext.
        assert "AUTHENTICATING" not in [s.value for s in worker.machine.history]
        assert worker.backoff.attempt >= 1
    assert imap.events() == []


def test_poll_mode_publishes_without_idle(imap: ImapHarness) -> None:
    with running(imap, account={"mode": "poll"}, poll_interval_seconds=0.5) as source:
        wait_for(lambda: imap.cursor() is not None, "start")
        ids = imap.append_numbered(3)
        wait_for(lambda: imap.cursor_at(3), "the polled mails")
        history = [s.value for s in source.workers[0].machine.history]
    assert "POLLING" in history and "IDLE" not in history
    assert keys_of(imap.events()) == {f"acct/mid:{m}" for m in ids}


def test_healthz_reports_sync_age_and_fails_for_a_mailbox_that_cannot_sync(
    imap: ImapHarness,
) -> None:
    raw = imap.config_dict()
    good = dict(raw["imap"]["accounts"][0])
    bad = {**good, "name": "down", "port": 1}  # nothing listens on port 1
    raw["imap"]["accounts"] = [good, bad]
    raw["health"] = {"port": 0, "max_sync_age_seconds": 1}
    source = ImapSource.from_config(config_from_dict(raw, env={}))
    source.start()
    try:
        wait_for(lambda: imap.cursor() is not None, "the good mailbox synced")

        def healthz() -> tuple[int, dict[str, object]]:
            url = f"http://127.0.0.1:{source.health_port}/healthz"
            try:
                with urllib.request.urlopen(url, timeout=5) as answer:
                    return answer.status, json.loads(answer.read())
            except urllib.error.HTTPError as error:
                return error.code, json.loads(error.read())

        _, detail = wait_for(lambda: (r := healthz())[0] == 503 and r, "stale mailbox")
        assert "imap/down/INBOX" in detail["stale"]  # type: ignore[operator]
        assert "imap/acct/INBOX" in detail["ages"]  # type: ignore[operator]
        with urllib.request.urlopen(f"http://127.0.0.1:{source.health_port}/metrics") as answer:
            text = answer.read().decode()
        assert 'mailtap_connect_failures_total{account="down"' in text
    finally:
        source.stop()


def test_many_accounts_and_folders_in_one_process_each_mail_once(imap: ImapHarness) -> None:
    client = imap.client(folder="")
    client.create_folder("Work")
    client.logout()
    other = imap.services.add_user(f"other-{imap.unique}@example.com", "pw-other")
    inbox = imap.append_numbered(7, tag="inbox")
    work = [f"work{i}-{imap.unique}@x" for i in range(4)]
    imap.append((make_mail(m, "work") for m in work), folder="Work")
    theirs = [f"theirs{i}-{imap.unique}@x" for i in range(5)]
    peer = IMAPClient(imap.host, port=imap.port, ssl=False)
    peer.login(other.username, other.password)
    peer.multiappend("INBOX", [make_mail(m, "theirs") for m in theirs])
    peer.logout()
    raw = imap.config_dict(account={"folders": ["INBOX", "Work"]})
    second = {**raw["imap"]["accounts"][0], "name": "peer", "folders": ["INBOX"]}
    second.update(username=other.username, password=other.password)
    raw["imap"]["accounts"].append(second)
    source = ImapSource.from_config(config_from_dict(raw, env={}))
    source.start()
    try:
        wait_for(
            lambda: (
                imap.cursor_at(7)
                and imap.cursor_at(4, folder="Work")
                and ((c := imap.offsets().get("peer/INBOX")) is not None and c["last_uid"] >= 5)
            ),
            "three mailboxes published",
        )
    finally:
        source.stop()
    events = imap.events()
    assert len(events) == 16
    assert keys_of(events) == (
        {f"acct/mid:{m}" for m in [*inbox, *work]} | {f"peer/mid:{m}" for m in theirs}
    )


def test_after_a_restart_the_index_is_rebuilt_from_kafka_and_an_expunge_is_a_tombstone(
    imap: ImapHarness,
) -> None:
    ids = imap.append_numbered(4)
    with running(imap):
        wait_for(lambda: imap.cursor_at(4), "first run")
    client = imap.client()
    client.delete_messages([2, 3])
    client.expunge()
    client.logout()
    # A new process knows nothing in memory: it reads mail.events back to find the keys.
    with running(imap):
        wait_for(lambda: sum(r.value is None for r in imap.events()) == 2, "two tombstones")
    latest = {r.key: r.value for r in imap.events()}
    assert latest[f"acct/mid:{ids[1]}"] is None and latest[f"acct/mid:{ids[2]}"] is None
    assert latest[f"acct/mid:{ids[0]}"] is not None and latest[f"acct/mid:{ids[3]}"] is not None
    assert len(imap.events()) == 6
