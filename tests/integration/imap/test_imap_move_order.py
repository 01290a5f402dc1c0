"""A mail appended and moved at once, its move committed before its own ADDED (soak seed 4,
issue 25), on real Dovecot and real Kafka.

The INBOX worker places the new mail in the account index and is held at ``before_write``
(:mod:`connectors.core.checkpoints`) while the mail moves to Work: the Work worker finds the key
known (the index is shared) and commits its UPDATED first; the INBOX ADDED commits after it.
Without a repair the key's last event names INBOX: a consumer, or an index rebuilt from the
events, takes the mail for gone from Work.

A mail kept in two watched folders: the index changelog keeps one record per key and folder
(connectors/imap/KEYS.md), so a new owner restores it in both, and deleting one copy leaves the
key live, published again where it stays; an index rebuilt from ``mail.events`` (one folder per
key) finds the other copy on the server instead (Message-ID keys only).
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator

import pytest

from connectors.core import checkpoints
from connectors.imap.index import ENV_REBUILD
from connectors.imap.indexlog import parse_location_key
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


def _placed(imap: ImapHarness, key: str) -> dict[str, int | None]:
    """``{folder: uid}`` of ``key``'s last record per folder on the index changelog (None: a
    tombstone, the mail left that folder)."""
    placed: dict[str, int | None] = {}
    for record in imap.read(imap.kafka.topics.imap_index):
        where = parse_location_key(record.key or "")
        if where is not None and where[0] == key:
            value = json.loads(record.raw_value) if record.raw_value is not None else None
            placed[where[1]] = value["uid"] if value is not None else None
    return placed


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
    restored_from = _placed(imap, key)
    # A handover: a new owner restores the index from the changelog and reconciles both
    # folders; INBOX's UID 1 is gone, the mail is in Work.
    with running(imap, account=TWO_FOLDERS, catchup_poll_seconds=2):
        imap.append([make_mail(f"later-{imap.unique}@example.com", "after the handover")])
        wait_for(lambda: imap.cursor_at(2), "a sync of INBOX after the handover")
        wait_for(lambda: _placed(imap, key).get("INBOX", 0) is None, "INBOX's record tombstoned")
        time.sleep(6)  # catch-up polls of both folders: an expunge decision would be taken
    events = imap.events()
    assert [r for r in events if r.key == key and r.value is None] == [], (
        f"tombstoned after the handover; the changelog's records: {restored_from}"
    )
    assert _folder(_last(events, key)) == "Work"
    assert republished, "the last event named INBOX before the handover"
    assert restored_from.get("Work") == 1
    assert _placed(imap, key) == {"INBOX": None, "Work": 1}


@pytest.mark.parametrize("rebuilt", [False, True], ids=["restored", "rebuilt-from-events"])
def test_a_copy_deleted_after_a_handover_leaves_the_key_published_where_the_mail_stays(
    imap: ImapHarness, monkeypatch: pytest.MonkeyPatch, rebuilt: bool
) -> None:
    # A mail copied to Work (both copies kept), then a new owner; deleting the Work copy must
    # not tombstone the key, and its last event must name INBOX. Restored from the changelog
    # the index knows both copies; rebuilt from mail.events it knows Work only (the newest
    # event), and the server is asked before a tombstone and finds the mail in INBOX.
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
    if rebuilt:
        monkeypatch.setenv(ENV_REBUILD, "1")
    with running(imap, account=TWO_FOLDERS, catchup_poll_seconds=2) as source:
        assert {w.index.load.rebuilt for w in source.workers} == {rebuilt}
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
    assert _placed(imap, key) == {"INBOX": 1, "Work": None}


def test_a_fingerprint_key_in_two_folders_stays_live_when_one_copy_goes_after_a_handover(
    imap: ImapHarness,
) -> None:
    # No Message-ID: a fingerprint key, which no server search can find. Copied to Work, so
    # the key is in both folders; a new owner restores the index from the changelog; the copy
    # in Work (the folder of the key's last event) is deleted. The key stays live and an
    # UPDATED names INBOX, where the mail still is.
    client = imap.client(folder="")
    client.create_folder("Work")
    client.logout()
    imap.append([make_mail(None, "no message-id", body=f"kept in two folders {imap.unique}")])
    with running(imap, account=TWO_FOLDERS, catchup_poll_seconds=2):
        wait_for(lambda: imap.cursor_at(1), "INBOX published")
        (key,) = {r.key for r in imap.events()}
        assert key is not None and key.startswith("acct/fp:")
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
            "an UPDATED naming INBOX, where the mail stays",
            timeout=60,
        )
        time.sleep(4)  # catch-up polls of both folders: no tombstone follows
    events = imap.events()
    assert [r for r in events if r.key == key and r.value is None] == []
    last = _last(events, key)
    assert last is not None and last.value is not None
    assert (last.value["change"], last.value["source"]["uid"]) == ("UPDATED", 1)
    assert _placed(imap, key) == {"INBOX": 1, "Work": None}
