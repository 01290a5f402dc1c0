"""The key index changelog's records as the worker writes them (no services): one per event,
same key, in the same transaction, on the account's partition; the reading side is in
tests/integration/imap/test_imap_index_changelog.py."""

from __future__ import annotations

import json
from collections import Counter

from connectors.imap.indexlog import ChangelogPartition, partition_of
from connectors.imap.records import RecordBuilder
from tests.unit.imap.fake_imap import JsonSerde, fake_parse
from tests.unit.imap.test_imap_worker import filled, make_worker

CHANGELOG = ChangelogPartition("ix", 7)


def _builder() -> RecordBuilder:
    return RecordBuilder(
        account="a",
        folder="INBOX",
        parser=fake_parse,
        serde=JsonSerde(),  # type: ignore[arg-type]
        events_topic="ev",
        dlq_topic="dlq",
        max_record_bytes=1_000_000,
        index_changelog=CHANGELOG,
    )


def test_the_partition_of_an_account_is_stable_across_processes_and_versions() -> None:
    # Pinned: a different value here would put an account's records where no start looks.
    assert [partition_of(a, 32) for a in ["alice", "bob", "support", "expenses"]] == [
        15,
        26,
        29,
        15,
    ]
    spread = Counter(partition_of(f"account-{i}", 32) for i in range(3200))
    assert len(spread) == 32 and max(spread.values()) < 2 * 100


def test_each_event_goes_with_its_index_record_in_the_same_transaction() -> None:
    worker, writer, _ = make_worker(filled(4), builder=_builder())
    worker.run()
    for records, _offsets in writer.transactions:
        events = {r.key: json.loads(r.value) for r in records if r.topic == "ev" and r.value}
        located = {r.key: r for r in records if r.topic == "ix"}
        assert events.keys() == located.keys()
        for key, event in events.items():
            record = located[key]
            assert record.partition == 7 and record.value is not None
            source = event["source"]
            assert json.loads(record.value) == {
                "folder": source["folder"],
                "uidvalidity": source["uidvalidity"],
                "uid": source["uid"],
                "fingerprint": event.get("content_fingerprint"),
            }
    assert sum(1 for r in writer.records if r.topic == "ix") == 4


def test_a_move_writes_the_event_and_the_index_record_of_each_moved_mail() -> None:
    worker, writer, _ = make_worker(filled(2), after_commit="move:Done", builder=_builder())
    worker.run()
    moved, _ = writer.transactions[2]
    assert Counter(r.topic for r in moved) == {"ev": 2, "ix": 2}
    assert [json.loads(r.value)["folder"] for r in moved if r.topic == "ix" and r.value] == [
        "Done",
        "Done",
    ]


def test_a_tombstone_goes_with_the_index_tombstone() -> None:
    records = _builder().tombstones("a/mid:x@example.com")
    assert [(r.topic, r.key, r.value, r.partition) for r in records] == [
        ("ev", b"a/mid:x@example.com", None, None),
        ("ix", b"a/mid:x@example.com", None, 7),
    ]
