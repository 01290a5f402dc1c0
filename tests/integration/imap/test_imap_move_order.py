"""A mail appended and moved at once, its move committed before its own ADDED (soak seed 4,
issue 25), on real Dovecot and real Kafka.

The INBOX worker places the new mail in the account index and is held at ``before_write``
(:mod:`connectors.core.checkpoints`) while the mail moves to Work: the Work worker finds the key
known (the index is shared) and commits its UPDATED first; the INBOX ADDED commits after it.
Without a repair the key's last event, and its only record on the index changelog, name INBOX:
the next owner of the mailbox restores an index without the Work location, sees INBOX's UID
expunged and tombstones the key although the mail is in Work.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator

import pytest

from connectors.core import checkpoints
from tests.integration.imap.imap_harness import ImapHarness, Record, make_mail, running, wait_for

TWO_FOLDERS = {"folders": ["INBOX", "Work"]}


class HoldInbox:
    """A checkpoint observer that holds the INBOX worker's first batch before its commit."""

    def __init__(self) -> None:
        self.held = threading.Event()
        self.release = threading.Event()

    def __call__(self, point: str) -> None:
        if point != "before_write" or not threading.current_thread().name.endswith("-INBOX"):
            return
        if not self.held.is_set():
            self.held.set()
            self.release.wait(120)


@pytest.fixture
def hold_inbox(monkeypatch: pytest.MonkeyPatch) -> Iterator[HoldInbox]:
    hold = HoldInbox()
    monkeypatch.setattr(checkpoints, "_loaded", True)
    monkeypatch.setattr(checkpoints, "_observer", hold)
    yield hold
    hold.release.set()


def _within(seconds: float, condition: Callable[[], bool]) -> bool:
    """Whether ``condition`` holds within ``seconds`` (polled)."""
    deadline = time.monotonic() + seconds
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.5)
    return True


def _last(records: list[Record], key: str) -> Record | None:
    mine = [r for r in records if r.key == key]
    return mine[-1] if mine else None


def _folder(record: Record | None) -> str | None:
    return record.value["source"]["folder"] if record and record.value else None


def test_a_move_committed_before_its_own_added_leaves_the_mail_where_it_is_after_a_handover(
    imap: ImapHarness, hold_inbox: HoldInbox
) -> None:
    client = imap.client(folder="")
    client.create_folder("Work")
    client.logout()
    message_id = f"moved-at-once-{imap.unique}@example.com"
    key = f"acct/mid:{message_id}"
    with running(imap, account=TWO_FOLDERS, catchup_poll_seconds=2):
        wait_for(lambda: imap.cursor("Work") is not None, "the Work worker started")
        imap.append([make_mail(message_id, "appended and moved at once")])
        wait_for(hold_inbox.held.is_set, "the INBOX batch built and held before its commit")
        client = imap.client()
        client.move([1], "Work")
        client.logout()
        wait_for(
            lambda: _folder(_last(imap.events(), key)) == "Work",
            "the Work worker's UPDATED committed while INBOX's ADDED is not",
        )
        hold_inbox.release.set()
        wait_for(lambda: imap.cursor_at(1), "INBOX's ADDED committed")
        # The INBOX commit asks Work to publish the mail again: the last event is Work's.
        republished = _within(
            30,
            lambda: (
                [
                    (r.value["change"], _folder(r))
                    for r in imap.events()
                    if r.key == key and r.value
                ][-1:]
                == [("UPDATED", "Work")]
            ),
        )
    last = _last(imap.read(imap.kafka.topics.imap_index), key)
    assert last is not None and last.raw_value is not None
    restored_from = json.loads(last.raw_value)["folder"]
    # A handover: a new owner restores the index from the changelog and reconciles both
    # folders; INBOX's UID 1 is gone, the mail is in Work.
    with running(imap, account=TWO_FOLDERS, catchup_poll_seconds=2):
        imap.append([make_mail(f"later-{imap.unique}@example.com", "after the handover")])
        wait_for(lambda: imap.cursor_at(2), "a sync of INBOX after the handover")
        time.sleep(6)  # catch-up polls of both folders: an expunge decision would be taken
    events = imap.events()
    assert [r for r in events if r.key == key and r.value is None] == [], (
        f"tombstoned after the handover; the changelog's record named {restored_from}"
    )
    assert _folder(_last(events, key)) == "Work"
    assert republished, "the last event named INBOX before the handover"
    assert restored_from == "Work"


def test_a_copy_the_restored_index_does_not_know_is_found_on_the_server_not_tombstoned(
    imap: ImapHarness,
) -> None:
    # The changelog keeps one record per key: a mail copied to Work (both copies kept) comes
    # back after a restart in Work only. Deleting the Work copy must not tombstone the key:
    # the server is asked before a tombstone, finds the mail in INBOX and publishes it there.
    client = imap.client(folder="")
    client.create_folder("Work")
    client.logout()
    message_id = f"copied-{imap.unique}@example.com"
    key = f"acct/mid:{message_id}"
    imap.append([make_mail(message_id, "copied to Work")])
    with running(imap, account=TWO_FOLDERS, catchup_poll_seconds=2):
        wait_for(lambda: imap.cursor_at(1), "INBOX published")
        client = imap.client()
        client.copy([1], "Work")
        client.logout()
        wait_for(lambda: _folder(_last(imap.events(), key)) == "Work", "the copy published")
    with running(imap, account=TWO_FOLDERS, catchup_poll_seconds=2):
        client = imap.client("Work")
        client.delete_messages([1])
        client.expunge()
        client.logout()
        wait_for(
            lambda: _folder(_last(imap.events(), key)) == "INBOX",
            "the mail published again where it still is",
            timeout=60,
        )
        time.sleep(4)  # catch-up polls of both folders: no tombstone follows
    events = imap.events()
    assert [r for r in events if r.key == key and r.value is None] == []
    last = _last(events, key)
    assert last is not None and last.value is not None
    assert (last.value["change"], last.value["source"]["uid"]) == ("UPDATED", 1)
    record = _last(imap.read(imap.kafka.topics.imap_index), key)
    assert record is not None and record.raw_value is not None
    assert json.loads(record.raw_value)["folder"] == "INBOX"
