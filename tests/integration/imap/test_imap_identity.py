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


def test_two_mails_sharing_a_message_id_get_two_keys_and_keep_them_through_a_rescan(
    imap: ImapHarness,
) -> None:
    shared = f"reused-{imap.unique}@example.com"
    first = make_mail(shared, "first mail", body="one")
    second = make_mail(shared, "second mail", body="two")
    imap.append([first, second])
    with running(imap, catchup_poll_seconds=2):
        wait_for(lambda: imap.cursor_at(2), "both published")
        events = imap.events()
        assert sorted(r.value["change"] for r in events if r.value) == ["ADDED", "ADDED"]
        by_subject = {r.value["subject"]: r for r in events if r.value}
        fingerprint = by_subject["second mail"].value["content_fingerprint"]  # type: ignore[index]
        assert by_subject["first mail"].key == f"acct/mid:{shared}"
        assert by_subject["second mail"].key == f"acct/mid:{shared}#{fingerprint[:8]}"
        before = imap.cursor()
        assert before is not None
    # A restart with a new UIDVALIDITY: every mail is read again and lands on its own key.
    imap.doveadm(
        "mailbox", "update", "-u", imap.account.username,
        "--uid-validity", str(before["uidvalidity"] + 1000), "INBOX",
    )  # fmt: skip
    with running(imap, catchup_poll_seconds=2):
        wait_for(
            lambda: (c := imap.cursor()) is not None and c["epoch"] == 1 and c["last_uid"] >= 2,
            "rescan in the new epoch",
        )
    events = imap.events()
    keys = {f"acct/mid:{shared}", f"acct/mid:{shared}#{fingerprint[:8]}"}
    assert {r.key for r in events} == keys
    # Per key, in the order of its partition (keys may sit in different partitions).
    for key in keys:
        assert [r.value["change"] for r in events if r.key == key and r.value] == [
            "ADDED",
            "RESCANNED",
        ]

    latest = {k: r.value["subject"] for k, r in _latest(events).items() if r.value}
    assert latest == {
        f"acct/mid:{shared}": "first mail",
        f"acct/mid:{shared}#{fingerprint[:8]}": "second mail",
    }


def test_an_identical_copy_is_the_same_mail_updated_and_no_tombstone_while_a_copy_is_left(
    imap: ImapHarness,
) -> None:
    """The documented behaviour (schemas/README.md): a second identical copy is the same key,
    published as UPDATED with the new copy's place; deleting one copy writes no tombstone."""
    message_id = f"copy-{imap.unique}@example.com"
    mail = make_mail(message_id, "twice")
    imap.append([mail, mail])
    with running(imap, catchup_poll_seconds=2):
        wait_for(lambda: imap.cursor_at(2), "both copies published")
        client = imap.client()
        client.delete_messages([1])
        client.expunge()
        client.logout()
        time.sleep(5)  # catch-up polls see the expunge
    events = imap.events()
    assert {r.key for r in events} == {f"acct/mid:{message_id}"}
    assert [r.value["change"] if r.value else None for r in events] == ["ADDED", "UPDATED"]
    assert events[-1].value is not None and events[-1].value["source"]["uid"] == 2
