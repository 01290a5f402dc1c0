"""The key index changelog's records as the worker writes them (no services): one per event,
keyed by (event key, folder), in the same transaction, on the account's partition; the
encoding of those keys; the reading side is in tests/integration/imap/test_imap_index_changelog.py."""

from __future__ import annotations

import json
from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from connectors.imap.cursor import Cursor
from connectors.imap.index import AccountIndex, _LatestLocations
from connectors.imap.indexlog import (
    ChangelogPartition,
    location_key,
    marker_key,
    parse_location_key,
    partition_of,
)
from connectors.imap.records import RecordBuilder
from tests.unit.imap.fake_imap import FakeServer, JsonSerde, RecordingWriter, fake_parse
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
        assert {location_key(k.decode(), "INBOX").encode() for k in events} == located.keys()
        for key, event in events.items():
            record = located[location_key(key.decode(), "INBOX").encode()]
            assert record.partition == 7 and record.value is not None
            source = event["source"]
            assert json.loads(record.value) == {
                "folder": source["folder"],
                "uidvalidity": source["uidvalidity"],
                "uid": source["uid"],
                "fingerprint": event.get("content_fingerprint"),
            }
    assert sum(1 for r in writer.records if r.topic == "ix") == 4


def test_a_move_writes_the_event_and_both_index_records_of_each_moved_mail() -> None:
    worker, writer, _ = make_worker(filled(2), after_commit="move:Done", builder=_builder())
    worker.run()
    moved, _ = writer.transactions[2]
    assert Counter(r.topic for r in moved) == {"ev": 2, "ix": 4}
    index_records = [(r.key.decode(), r.value) for r in moved if r.topic == "ix"]
    # Each moved mail: its record in Done, and the tombstone of its record in INBOX.
    assert sorted(
        (parse_location_key(key), value is None) for key, value in index_records
    ) == sorted(
        [
            (("a/mid:m0", "Done"), False),
            (("a/mid:m1", "Done"), False),
            (("a/mid:m0", "INBOX"), True),
            (("a/mid:m1", "INBOX"), True),
        ]
    )


def test_a_tombstone_goes_with_the_index_tombstone_of_its_last_folder() -> None:
    records = _builder().tombstones("a/mid:x@example.com")
    assert [(r.topic, r.key, r.value, r.partition) for r in records] == [
        ("ev", b"a/mid:x@example.com", None, None),
        ("ix", b"a/in:INBOX/mid:x@example.com", None, 7),
    ]


@pytest.mark.parametrize(
    ("key", "folder", "encoded"),
    [
        ("alice/mid:abc@example.com", "INBOX", "alice/in:INBOX/mid:abc@example.com"),
        ("alice/mid:a/b@x#6fb3857f", "Archive/2026", "alice/in:Archive%2F2026/mid:a/b@x#6fb3857f"),
        ("alice/fp:" + "9f" * 32, "Sent Items", "alice/in:Sent%20Items/fp:" + "9f" * 32),
        ("alice/mid:x@y", "100% done", "alice/in:100%25%20done/mid:x@y"),
        ("alice/mid:x@y", "Entwürfe", "alice/in:Entw%C3%BCrfe/mid:x@y"),
        ("alice/mid:x@y", "in:INBOX/mid:x", "alice/in:in%3AINBOX%2Fmid%3Ax/mid:x@y"),
    ],
)
def test_a_location_key_names_the_event_key_and_the_folder_unambiguously(
    key: str, folder: str, encoded: str
) -> None:
    assert location_key(key, folder) == encoded
    assert parse_location_key(encoded) == (key, folder)


@pytest.mark.parametrize(
    "text",
    [
        "alice/mid:abc@example.com",  # a version 1 record: the event key alone
        "alice/fp:" + "9f" * 32,
        "alice/index:v1",  # the version 1 marker
        marker_key("alice"),
        "alice/in:INBOX",  # no key after the folder
        "alice/in:/mid:x@y",  # no folder
        "alice/in:%FF/mid:x@y",  # not UTF-8
        "no-account-separator",
    ],
)
def test_any_other_changelog_key_is_not_taken_for_a_location(text: str) -> None:
    assert parse_location_key(text) is None


@settings(max_examples=300)
@given(
    folder=st.text(),
    uidvalidity=st.none() | st.integers(-(2**70), 2**70),
    uid=st.none() | st.integers(0, 2**32),
    fingerprint=st.none() | st.text(),
)
def test_a_location_record_s_value_is_the_json_encoder_s(
    folder: str, uidvalidity: int | None, uid: int | None, fingerprint: str | None
) -> None:
    """The value is written out directly (indexlog._location_json): the bytes must be those
    of the encoder it stands for, whatever the folder's characters."""
    record = CHANGELOG.location("a/mid:x@y", folder, uidvalidity, uid, fingerprint)
    value = {"folder": folder, "uidvalidity": uidvalidity, "uid": uid, "fingerprint": fingerprint}
    assert record.value == json.dumps(value, sort_keys=True, separators=(",", ":")).encode()


def test_a_location_record_s_value_of_another_type_goes_to_the_encoder() -> None:
    record = CHANGELOG.location("a/mid:x@y", "INBOX", True, 7, None)  # a bool: json writes true
    assert record.value == b'{"fingerprint":null,"folder":"INBOX","uid":7,"uidvalidity":true}'


def test_the_marker_is_of_the_per_folder_format() -> None:
    assert marker_key("alice") == "alice/index:v2"
    with pytest.raises(ValueError, match="not an event key"):
        location_key("no-account", "INBOX")


def _second_run(server: FakeServer, index: AccountIndex, stored: Cursor) -> RecordingWriter:
    # A new session over the same shared index, as after a reconnect.
    worker, writer, _ = make_worker(server, stored=stored, index=index, builder=_builder())
    worker.run()
    return writer


def test_a_mail_that_leaves_the_folder_with_a_copy_elsewhere_tombstones_only_its_record_here() -> (
    None
):
    server, index = filled(2), AccountIndex("a")
    worker, writer, _ = make_worker(server, index=index, builder=_builder())
    worker.run()
    stored = Cursor.from_json(dict(writer.last_offset))
    index.register("a/mid:m0", "Archive", 5, 9)  # Archive's worker published a copy there
    del server.folders["INBOX"][1]
    after = _second_run(server, index, stored)
    assert [(r.topic, r.key, r.value) for r in after.records] == [
        ("ix", b"a/in:INBOX/mid:m0", None)
    ]
    assert index.located("a/mid:m0") and index.left_folder("a/mid:m0", "INBOX")
    # Archive's copy was placed last: its event names Archive, nothing to publish again.
    assert index.take_republish("Archive") == []


def test_a_mail_leaving_the_folder_its_last_event_names_is_published_again_where_it_stays() -> None:
    server, index = filled(2), AccountIndex("a")
    index.register("a/mid:m0", "Archive", 5, 9)  # the copy in Archive came first
    worker, writer, _ = make_worker(server, index=index, builder=_builder())
    worker.run()
    assert [e.value is not None for e in writer.records if e.key == b"a/mid:m0"] == [True]
    stored = Cursor.from_json(dict(writer.last_offset))
    del server.folders["INBOX"][1]
    after = _second_run(server, index, stored)
    assert [(r.topic, r.key, r.value) for r in after.records] == [
        ("ix", b"a/in:INBOX/mid:m0", None)
    ]
    # The last event named INBOX: Archive's worker is asked to publish its copy (UPDATED).
    assert index.take_republish("Archive") == [9]


def test_a_second_copy_in_the_same_folder_keeps_the_folder_s_record() -> None:
    server, index = filled(2), AccountIndex("a")
    worker, writer, _ = make_worker(server, index=index, builder=_builder())
    worker.run()
    stored = Cursor.from_json(dict(writer.last_offset))
    index.register("a/mid:m0", "INBOX", server.uidvalidity, 7)  # the same mail at UID 7
    del server.folders["INBOX"][1]
    assert _second_run(server, index, stored).records == []


def test_a_restored_changelog_places_a_key_in_every_folder_it_has_a_record_of() -> None:
    latest = _LatestLocations()
    latest.record_entries(
        [
            ("a/fp:1", "a", "INBOX", 7, 1, "f1", True),
            ("a/fp:1", "a", "Work", 3, 4, "f1", True),  # a copy
            ("a/fp:2", "a", "INBOX", 7, 2, "f2", True),
            ("a/fp:2", "a", "Work", 3, 5, "f2", True),
            ("a/fp:2", "a", "INBOX", None, None, None, False),  # moved from INBOX to Work
            ("b/fp:3", "b", "INBOX", 1, 1, "f3", True),
            ("a/fp:1", "a", "INBOX", 8, 6, None, True),  # INBOX rescanned: its new place
        ]
    )
    assert sorted(latest.batches(10)) == [
        (
            "a",
            [
                ("a/fp:1", "f1", "INBOX", 8, 6),
                ("a/fp:1", "f1", "Work", 3, 4),
                ("a/fp:2", "f2", "Work", 3, 5),
            ],
        ),
        ("b", [("b/fp:3", "f3", "INBOX", 1, 1)]),
    ]
    index = AccountIndex("a")
    for account, batch in latest.batches(10):
        if account == "a":
            index.place_many(batch, resolve=False, restored=True)
    assert index.uids_in("Work", 3) == {4: "a/fp:1", 5: "a/fp:2"}
    assert index.remove("Work", 4) == ("a/fp:1", True)  # still in INBOX
    # Restored: which folder its last event names is not known, so a departure asks.
    assert index.republish_remaining("a/fp:1", "Work") == {"INBOX": {6}}
    assert index.republish_remaining("a/fp:1", "Work") == {}  # asked once
    assert index.remove("INBOX", 6) == ("a/fp:1", False)
    index.close()
    latest.close()


def test_a_rebuild_tombstones_the_records_it_does_not_write_again() -> None:
    latest = _LatestLocations()
    latest.record_outdated(
        [
            ("a/mid:old@y", "a", True),  # a version 1 record, live
            ("a/mid:gone@y", "a", False),  # a version 1 tombstone: nothing to do
            ("a/index:v1", "a", True),
        ]
    )
    latest.record_entries([("a/mid:stale@y", "a", "Junk", 1, 1, None, True)])
    assert latest.with_outdated(["a", "b"]) == {"a"}
    latest.drop(["a"])
    latest.record([("a/mid:old@y", "a", "INBOX", 7, 1, "f")])  # the rebuild's events
    assert list(latest.rows("a")) == [("a/mid:old@y", "a", "INBOX", 7, 1, "f")]
    assert sorted(latest.replaced("a")) == [
        "a/in:Junk/mid:stale@y",
        "a/index:v1",
        "a/mid:old@y",
    ]
    latest.close()


def test_whether_a_removed_mail_left_its_folder_is_looked_up_only_when_a_copy_may_be_there() -> (
    None
):
    index = AccountIndex("a")
    index.register("a/fp:moved", "INBOX", 7, 1)
    index.register("a/fp:moved", "Work", 3, 1)  # its move's target, placed last
    index.remove("INBOX", 1)
    assert index.left_folder("a/fp:moved", "INBOX")
    index.register("a/fp:twice", "Work", 3, 2)
    index.register("a/fp:twice", "INBOX", 7, 2)
    index.register("a/fp:twice", "INBOX", 7, 3)  # a second copy here, placed last
    index.remove("INBOX", 2)
    assert not index.left_folder("a/fp:twice", "INBOX")
    index.remove("INBOX", 3)
    assert index.left_folder("a/fp:twice", "INBOX")
    assert index.left_folder("a/fp:unknown", "INBOX")
    index.close()
