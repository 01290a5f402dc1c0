"""Exchange change capture against the EWS test server and the real Kafka broker (read_committed):
read state and categories (ModifiedEvent), moves (MovedEvent), copies (CopiedEvent) and deletions
(DeletedEvent) become UPDATED events and tombstones under the IMAP rule (a key is tombstoned
only when it is in no watched folder of the account), and changes whose events were lost while
the source was away are reconciled (FindItem, ItemId + ChangeKey) when it comes back.

Watched here: ``inbox`` and ``junkemail``; ``drafts`` and ``deleteditems`` are not watched.
"""

from __future__ import annotations

import collections
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from connectors.core.avro.serde import AvroSerde
from connectors.core.config import KafkaSettings, MailtapConfig, config_from_dict
from connectors.ews.source import EwsSource
from tests.ews_server import EwsTestServer
from tests.integration.ews.ews_kafka import USER, read_topic, source_config
from tests.integration.ews.test_ews_source import ENV, REPO, imap_key, mime, source_command
from tests.support.crashpoints import EXIT_CODE, crash_env

WAIT_S = 60.0
WATCHED = ["inbox", "junkemail"]


def changes_config(kafka: KafkaSettings, ews: EwsTestServer, tmp_path: Path) -> MailtapConfig:
    raw = source_config(kafka, ews, tmp_path / "claims", account={"folders": WATCHED})
    return config_from_dict(raw)


@pytest.fixture
def source(kafka: KafkaSettings, ews: EwsTestServer, tmp_path: Path) -> Iterator[EwsSource]:
    src = EwsSource.from_config(changes_config(kafka, ews, tmp_path), serve_health=False)
    src.start()
    assert ews.wait_until(lambda: ews.open_streams() == len(WATCHED), WAIT_S)
    yield src
    src.stop()


def published(src: EwsSource) -> int:
    """Events and tombstones committed by every folder worker of ``src``."""
    return sum(w.events_published for w in src.workers)


def history(kafka: KafkaSettings) -> dict[str, list[dict[str, Any] | None]]:
    """Per key, its records in order (None = tombstone), read_committed."""
    serde = AvroSerde.for_schema("MailEvent", kafka)
    out: dict[str, list[dict[str, Any] | None]] = collections.defaultdict(list)
    for key, value in read_topic(kafka, kafka.topics.events):
        out[key.decode()].append(None if value is None else serde.decode(value))
    return dict(out)


def summary(records: list[dict[str, Any] | None]) -> list[tuple[str, str, list[str]] | None]:
    """(change, folder, flags) of each record, None for a tombstone."""
    return [
        None if r is None else (r["change"], r["source"]["folder"], list(r["flags"]))
        for r in records
    ]


def test_read_state_categories_and_follow_up_flag_become_updated_events(
    ews: EwsTestServer, source: EwsSource, kafka: KafkaSettings
) -> None:
    item = ews.deliver(USER, mime(1))
    assert ews.wait_until(lambda: published(source) == 1, WAIT_S)
    ews.update_item(USER, item.item_id, is_read=True)
    assert ews.wait_until(lambda: published(source) == 2, WAIT_S)
    ews.update_item(USER, item.item_id, categories=["Red category", "Invoices"])
    assert ews.wait_until(lambda: published(source) == 3, WAIT_S)
    ews.update_item(USER, item.item_id, flag_status=2)  # Outlook's follow-up flag
    assert ews.wait_until(lambda: published(source) == 4, WAIT_S)
    source.stop()

    events = history(kafka)
    assert list(events) == [imap_key(mime(1))]
    (records,) = events.values()
    assert summary(records) == [
        ("ADDED", "inbox", []),
        ("UPDATED", "inbox", ["\\Seen"]),
        ("UPDATED", "inbox", ["\\Seen", "Red category", "Invoices"]),
        ("UPDATED", "inbox", ["\\Seen", "\\Flagged", "Red category", "Invoices"]),
    ]
    change_keys = [r["source"]["change_key"] for r in records if r is not None]
    assert change_keys[-1] == ews.store.mailbox(USER).items[item.item_id].change_key
    assert len(set(change_keys)) == 4
    assert "SyncFolderItems" not in ews.operations()


def test_moves_copies_and_deletions_follow_the_every_watched_folder_rule(
    ews: EwsTestServer, source: EwsSource, kafka: KafkaSettings
) -> None:
    moved, deleted, copied = (ews.deliver(USER, mime(n)) for n in (1, 2, 3))
    assert ews.wait_until(lambda: published(source) == 3, WAIT_S)

    # Between two watched folders: an UPDATED event from the new folder, never a tombstone.
    moved = ews.move_item(USER, moved.item_id, "junkemail")
    assert ews.wait_until(lambda: published(source) == 4, WAIT_S)
    # Out of every watched folder (to Drafts): a tombstone.
    ews.move_item(USER, moved.item_id, "drafts")
    assert ews.wait_until(lambda: published(source) == 5, WAIT_S)
    # Deleted for good: a tombstone.
    ews.delete_item(USER, deleted.item_id)
    assert ews.wait_until(lambda: published(source) == 6, WAIT_S)
    # Copied to the other watched folder: the same mail again (UPDATED, same key); deleting the
    # original leaves the copy, so no tombstone; deleting the copy too gives one.
    copy = ews.copy_item(USER, copied.item_id, "junkemail")
    assert ews.wait_until(lambda: published(source) == 7, WAIT_S)
    original_id = copied.item_id  # the store's Item takes its new id on a move
    ews.move_item(USER, original_id, "deleteditems")  # Outlook's delete
    # The inbox worker decides (the key is still in a watched folder: the copy) and commits
    # before the copy goes too; otherwise both could find it nowhere (two tombstones).
    inbox = next(w for w in source.workers if w.folder == "inbox")
    assert ews.wait_until(
        lambda: inbox.cursor is not None and inbox.cursor.tracked(original_id) is None, WAIT_S
    )
    ews.delete_item(USER, copy.item_id)
    assert ews.wait_until(lambda: published(source) == 8, WAIT_S)
    # Copied in from a folder nobody watches: a new mail for the account, with the IMAP key.
    draft = ews.deliver(USER, mime(4), folder="drafts")
    ews.copy_item(USER, draft.item_id, "inbox")
    assert ews.wait_until(lambda: published(source) == 9, WAIT_S)
    # A mail without a Message-ID (a fingerprint key) is found in the other folder by its
    # receive time and its content: the same rule.
    bare = ews.deliver(USER, mime(5, message_id=False))
    assert ews.wait_until(lambda: published(source) == 10, WAIT_S)
    bare_copy = ews.copy_item(USER, bare.item_id, "junkemail")
    assert ews.wait_until(lambda: published(source) == 11, WAIT_S)
    bare_id = bare.item_id
    ews.delete_item(USER, bare_id)
    assert ews.wait_until(
        lambda: inbox.cursor is not None and inbox.cursor.tracked(bare_id) is None, WAIT_S
    )
    ews.delete_item(USER, bare_copy.item_id)
    assert ews.wait_until(lambda: published(source) == 12, WAIT_S)
    source.stop()

    events = {key: summary(records) for key, records in history(kafka).items()}
    assert events == {
        imap_key(mime(5, message_id=False)): [
            ("ADDED", "inbox", []),
            ("UPDATED", "junkemail", []),
            None,
        ],
        imap_key(mime(1)): [("ADDED", "inbox", []), ("UPDATED", "junkemail", []), None],
        imap_key(mime(2)): [("ADDED", "inbox", []), None],
        imap_key(mime(3)): [("ADDED", "inbox", []), ("UPDATED", "junkemail", []), None],
        imap_key(mime(4)): [("ADDED", "inbox", [])],
    }
    assert sum(w.tombstones_published for w in source.workers) == 4
    assert "SyncFolderItems" not in ews.operations()


def test_changes_whose_events_were_lost_are_reconciled_after_the_source_comes_back(
    ews: EwsTestServer, kafka: KafkaSettings, tmp_path: Path
) -> None:
    config = changes_config(kafka, ews, tmp_path)
    first = EwsSource.from_config(config, serve_health=False)
    first.start()
    try:
        assert ews.wait_until(lambda: ews.open_streams() == len(WATCHED), WAIT_S)
        read, deleted, out, across, _kept = (ews.deliver(USER, mime(n)) for n in range(1, 6))
        assert ews.wait_until(lambda: published(first) == 5, WAIT_S)
    finally:
        first.stop()

    # While the source is away: a mail is read, one deleted, one moved out of every watched
    # folder, one moved to the other watched folder; then the subscriptions expire, and every
    # event they had queued is gone with them (streaming cannot replay, exchangelib #1153).
    ews.update_item(USER, read.item_id, is_read=True)
    ews.delete_item(USER, deleted.item_id)
    ews.move_item(USER, out.item_id, "drafts")
    ews.move_item(USER, across.item_id, "junkemail")
    for sub_id in ews.subscription_ids(USER):
        ews.expire_subscription(sub_id)

    second = EwsSource.from_config(config, serve_health=False)
    second.start()
    try:
        assert ews.wait_until(
            lambda: ews.open_streams() == len(WATCHED) and published(second) >= 4, WAIT_S
        )
    finally:
        second.stop()

    events = {key: summary(records) for key, records in history(kafka).items()}
    assert events[imap_key(mime(1))] == [("ADDED", "inbox", []), ("UPDATED", "inbox", ["\\Seen"])]
    assert events[imap_key(mime(2))] == [("ADDED", "inbox", []), None]
    assert events[imap_key(mime(3))] == [("ADDED", "inbox", []), None]
    # Moved to the other watched folder: found there (Exchange is asked), so no tombstone; the
    # new folder publishes it (as ADDED: its worker cannot tell where it came from).
    assert events[imap_key(mime(4))] == [("ADDED", "inbox", []), ("ADDED", "junkemail", [])]
    assert events[imap_key(mime(5))] == [("ADDED", "inbox", [])]
    assert published(second) == 4
    assert ews.operations().count("Subscribe") == 2 * len(WATCHED)
    assert "SyncFolderItems" not in ews.operations()


def test_a_crash_while_publishing_changes_then_restart_publishes_each_change_once(
    ews: EwsTestServer, kafka: KafkaSettings, tmp_path: Path
) -> None:
    """Every mail is marked read while the source streams (batches of 2), and the process dies
    inside the transaction of the second batch of updates (``in_transaction:9``: 1 = the
    subscription, 2-7 = the 12 mails, 8 = the first updates): the ModifiedEvents its stream had
    consumed are gone with it (streaming cannot replay). The restart reconnects to the same
    subscription and reconciles ChangeKeys against the committed cursor: each mail ends ADDED
    then UPDATED exactly once, read_committed."""
    raws = [mime(n) for n in range(12)]
    items = [ews.deliver(USER, raw) for raw in raws]
    run = source_command(kafka, ews, tmp_path, batch_size=2)
    first = subprocess.Popen(
        run, env={**ENV, **crash_env("in_transaction:9")}, cwd=REPO, stderr=subprocess.DEVNULL
    )
    try:
        assert ews.wait_until(lambda: ews.open_streams() == 1, WAIT_S)
        assert len(read_topic(kafka, kafka.topics.events)) == 12
        for item in items:
            ews.update_item(USER, item.item_id, is_read=True)
        assert first.wait(timeout=WAIT_S) == EXIT_CODE
    finally:
        first.kill()
        first.wait(timeout=WAIT_S)
    committed = len(read_topic(kafka, kafka.topics.events, settled=False))
    assert 12 < committed < 24  # some updates committed, the rest lost with the process

    second = subprocess.Popen(run, env=ENV, cwd=REPO, stderr=subprocess.DEVNULL)
    try:
        assert ews.wait_until(lambda: len(read_topic(kafka, kafka.topics.events)) >= 24, WAIT_S)
        assert ews.wait_until(lambda: ews.open_streams() == 1, WAIT_S)
    finally:
        second.terminate()
        second.wait(timeout=WAIT_S)
    events = {key: summary(records) for key, records in history(kafka).items()}
    assert events == {
        imap_key(raw): [("ADDED", "inbox", []), ("UPDATED", "inbox", ["\\Seen"])] for raw in raws
    }
    assert ews.operations().count("Subscribe") == 1  # the same subscription, reconciled
