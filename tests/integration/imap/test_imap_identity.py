"""Message identity on real Dovecot and real Kafka: moves of mails without a Message-ID, mails
that share a Message-ID, identical copies. Read back with an independent read_committed
consumer (the harness's), the way a downstream consumer sees the compacted topic."""

from __future__ import annotations

import time

from tests.integration.imap.imap_harness import (
    ImapHarness,
    Record,
    make_mail,
    running,
    wait_for,
)

TWO_FOLDERS = {"folders": ["INBOX", "Archive"]}


def _latest(events: list[Record]) -> dict[str, Record]:
    latest: dict[str, Record] = {}
    for record in events:
        assert record.key is not None
        latest[record.key] = record
    return latest


def _key_of_subject(events: list[Record], subject: str) -> str:
    keys = {r.key for r in events if r.value is not None and r.value["subject"] == subject}
    assert len(keys) == 1, (subject, keys)
    return str(keys.pop())


def test_a_moved_mail_without_message_id_is_never_tombstoned_not_even_after_a_restart(
    imap: ImapHarness,
) -> None:
    client = imap.client(folder="")
    client.create_folder("Archive")
    client.logout()
    moved_subjects = [f"no id {i} {imap.unique}" for i in range(10)]
    deleted_subject = f"deleted {imap.unique}"
    imap.append(make_mail(None, s) for s in [*moved_subjects, deleted_subject])
    with running(imap, account=TWO_FOLDERS, catchup_poll_seconds=2):
        wait_for(lambda: imap.cursor_at(11), "INBOX published")
        events = imap.events()
        moved = {_key_of_subject(events, s) for s in moved_subjects}
        deleted = _key_of_subject(events, deleted_subject)
        assert all("/fp:" in k for k in [*moved, deleted])
        # Archive has a backlog to publish first, so INBOX sees its mails gone well before
        # the Archive worker reaches their new copies.
        imap.append(
            (make_mail(None, f"backlog {i} {imap.unique}") for i in range(150)), folder="Archive"
        )
        client = imap.client()
        client.move(list(range(1, 11)), "Archive")
        client.delete_messages([11])
        client.expunge()
        client.logout()
        wait_for(
            lambda: (
                imap.cursor_at(160, folder="Archive")
                and any(r.key == deleted and r.value is None for r in imap.events())
            ),
            "Archive published and the deleted mail tombstoned",
        )
        time.sleep(5)  # catch-up polls of both folders: still no tombstone for a moved mail
    events = imap.events()
    tombstoned = {r.key for r in events if r.value is None}
    assert tombstoned == {deleted}
    latest = _latest(events)
    for key in moved:
        value = latest[key].value
        assert value is not None and value["source"]["folder"] == "Archive"
        assert value["change"] == "UPDATED"
    # A new process rebuilds its index from the topic and reconciles both folders at start.
    with running(imap, account=TWO_FOLDERS, catchup_poll_seconds=2):
        imap.append([make_mail(None, f"after restart {imap.unique}")])
        wait_for(lambda: imap.cursor_at(12), "a sync after the restart")
        time.sleep(5)
    events = imap.events()
    assert {r.key for r in events if r.value is None} == {deleted}
    latest = _latest(events)
    assert all(latest[k].value is not None for k in moved)
