"""The account index behind the tombstone rule: gone from every watched folder, or moved."""

from __future__ import annotations

import sqlite3
from array import array
from typing import Any
from unittest.mock import patch

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import connectors.imap.index as index_module
from connectors.imap.index import AccountIndex, _LatestLocations


def test_a_key_in_two_folders_is_not_gone_when_one_copy_is_expunged() -> None:
    index = AccountIndex("a")
    assert index.register("a/mid:x@y", "INBOX", 7, 1) is False  # first sight: ADDED
    assert index.register("a/mid:x@y", "Archive", 9, 4) is True  # seen before: UPDATED
    assert index.remove("INBOX", 1) == ("a/mid:x@y", True)
    assert index.remove("Archive", 4) == ("a/mid:x@y", False)
    assert index.remove("Archive", 4) is None


def test_new_mail_whose_transaction_failed_is_new_again() -> None:
    # Kafka refused the batch's transaction: the retry places the same mail at the same UID
    # again and must publish it as ADDED, not as a move of a mail published before.
    index = AccountIndex("a")
    index.register("a/mid:old@y", "INBOX", 7, 1)
    assert index.register("a/mid:new@y", "INBOX", 7, 2) is False
    index.unplace([("a/mid:new@y", "INBOX", 2)])
    assert index.register("a/mid:new@y", "INBOX", 7, 2) is False
    assert index.uids_in("INBOX", 7) == {1: "a/mid:old@y", 2: "a/mid:new@y"}
    assert len(index) == 2
    # A mail the account also has elsewhere stays known: its retry is still a copy.
    assert index.register("a/mid:old@y", "Archive", 3, 5) is True
    index.unplace([("a/mid:x@y", "Archive", 5)])  # another key there: nothing undone
    assert index.uids_in("Archive", 3) == {5: "a/mid:old@y"}


def test_new_mail_placed_elsewhere_before_its_commit_is_republished_there() -> None:
    # Soak seed 4: INBOX placed a new mail; before INBOX committed, the mail moved to Work and
    # Work's worker found it known (UPDATED, maybe committed first). After INBOX's commit,
    # Work is asked to publish it again, and woken.
    index = AccountIndex("a")
    assert index.register("a/mid:moved@y", "INBOX", 7, 5) is False
    assert index.register("a/mid:moved@y", "Work", 9, 1) is True
    assert index.register("a/mid:alone@y", "INBOX", 7, 6) is False
    asked = index.republish_elsewhere(
        [("a/mid:moved@y", "INBOX", 5), ("a/mid:alone@y", "INBOX", 6)]
    )
    assert asked == {"Work": {1}}
    assert index.rounds.wanted("Work") and not index.rounds.wanted("INBOX")
    assert index.take_republish("INBOX") == []
    assert index.take_republish("Work") == [1]
    assert index.take_republish("Work") == []  # taken once
    index.ask_republish("Work", [1])  # its commit failed: asked again
    assert index.take_republish("Work") == [1]


def test_a_copy_in_the_same_folder_is_not_republished() -> None:
    index = AccountIndex("a")
    index.register("a/mid:twice@y", "INBOX", 7, 1)
    index.register("a/mid:twice@y", "INBOX", 7, 2)
    assert index.republish_elsewhere([("a/mid:twice@y", "INBOX", 1)]) == {}
    assert not index.rounds.wanted("INBOX")


def test_uids_are_scoped_by_folder_and_uidvalidity() -> None:
    index = AccountIndex("a")
    index.register("a/mid:1@y", "INBOX", 7, 1)
    index.register("a/mid:2@y", "INBOX", 7, 2)
    index.register("a/mid:3@y", "Sent", 7, 1)
    assert index.uids_in("INBOX", 7) == {1: "a/mid:1@y", 2: "a/mid:2@y"}
    assert index.uids_in("INBOX", 8) == {}
    index.forget_folder("INBOX")
    assert index.uids_in("INBOX", 7) == {} and index.uids_in("Sent", 7) == {1: "a/mid:3@y"}
    # Still known: re-published after the rescan they are RESCANNED/UPDATED, not new.
    assert index.register("a/mid:1@y", "INBOX", 8, 1) is True


def test_a_uid_reused_for_another_key_moves_the_location() -> None:
    index = AccountIndex("a")
    index.register("a/mid:old@y", "INBOX", 7, 1)
    index.register("a/mid:new@y", "INBOX", 7, 1)
    assert index.remove("INBOX", 1) == ("a/mid:new@y", False)


def test_a_mail_we_moved_counts_as_a_location_without_uid_and_forget_clears_known() -> None:
    index = AccountIndex("a")
    index.register("a/fp:abc", "INBOX", 7, 3)
    index.register("a/fp:abc", "Processed", None, None)
    assert index.remove("INBOX", 3) == ("a/fp:abc", True)
    index.forget("a/fp:abc")
    assert index.register("a/fp:abc", "INBOX", 7, 9) is False


def test_message_id_comes_from_message_id_keys_only() -> None:
    assert AccountIndex.message_id("a/mid:x@example.com") == "x@example.com"
    assert AccountIndex.message_id("a/fp:0123") is None


# --- the SQLite index against the plain dictionaries it replaced ---------------------------------


class DictIndex:
    """Reference model: the dictionary index the SQLite one replaced (same rules, no storage)."""

    def __init__(self) -> None:
        self.by_uid: dict[tuple[str, int], tuple[str, int | None]] = {}
        self.places: dict[str, int] = {}
        self.known: set[str] = set()

    def register(self, key: str, folder: str, uidvalidity: int | None, uid: int | None) -> bool:
        known = key in self.known
        self.known.add(key)
        if uid is not None:
            old = self.by_uid.get((folder, uid))
            self.by_uid[(folder, uid)] = (key, uidvalidity)
            if old is not None and old[0] == key:
                return known
            if old is not None:
                self.drop_place(old[0])
        self.places[key] = self.places.get(key, 0) + 1
        return known

    def drop_place(self, key: str) -> int:
        left = self.places.pop(key, 0) - 1
        if left > 0:
            self.places[key] = left
        return max(left, 0)

    def uids_in(self, folder: str, uidvalidity: int) -> dict[int, str]:
        return {u: k for (f, u), (k, v) in self.by_uid.items() if f == folder and v == uidvalidity}

    def remove(self, folder: str, uid: int) -> tuple[str, bool] | None:
        found = self.by_uid.pop((folder, uid), None)
        return None if found is None else (found[0], self.drop_place(found[0]) > 0)

    def forget(self, key: str) -> None:
        self.known.discard(key)
        self.places.pop(key, None)

    def forget_folder(self, folder: str) -> None:
        for where in [w for w in self.by_uid if w[0] == folder]:
            self.drop_place(self.by_uid.pop(where)[0])


FOLDERS = ("INBOX", "Archive", "Sent")
KEYS = st.sampled_from(["a/mid:0@y", "a/mid:1@y", "a/mid:2@y", "a/fp:0", "a/fp:1"])
UIDVALIDITIES = st.sampled_from([None, 7, 8])
LOCATIONS = st.tuples(
    KEYS, st.sampled_from(FOLDERS), UIDVALIDITIES, st.one_of(st.none(), st.integers(1, 4))
)
OPERATIONS = st.one_of(
    st.tuples(st.just("register"), LOCATIONS),
    st.tuples(st.just("register_many"), st.lists(LOCATIONS, max_size=12)),
    st.tuples(st.just("remove"), st.tuples(st.sampled_from(FOLDERS), st.integers(1, 4))),
    st.tuples(st.just("forget"), KEYS),
    st.tuples(st.just("forget_folder"), st.sampled_from(FOLDERS)),
)


@settings(max_examples=300, deadline=None)
@given(operations=st.lists(OPERATIONS, max_size=40))
def test_the_sqlite_index_behaves_like_the_dictionary_index(operations: list[Any]) -> None:
    index, model = AccountIndex("a"), DictIndex()
    # Tiny chunks, so one register_many call spans several chunks as large batches do.
    with patch.object(index_module, "CHUNK", 3):
        for name, argument in operations:
            if name == "register":
                assert index.register(*argument) == model.register(*argument)
            elif name == "register_many":
                expected = [model.register(*item) for item in argument]
                assert index.register_many(argument) == expected
            elif name == "remove":
                assert index.remove(*argument) == model.remove(*argument)
            else:
                getattr(index, name)(argument)
                getattr(model, name)(argument)
            assert len(index) == len(model.known)
            for folder in FOLDERS:
                for uidvalidity in (7, 8):
                    expected_uids = model.uids_in(folder, uidvalidity)
                    assert index.uids_in(folder, uidvalidity) == expected_uids
                    assert list(index.uids(folder, uidvalidity)) == sorted(expected_uids)
    # How many locations each key has left shows in what removing its locations answers...
    for folder in FOLDERS:
        for uid in range(1, 5):
            assert index.remove(folder, uid) == model.remove(folder, uid)
    # ... and whether it is still known, in what registering it again answers.
    for n, key in enumerate(sorted(model.known | {"a/mid:0@y", "a/fp:1"})):
        assert index.register(key, "Other", 1, n) == model.register(key, "Other", 1, n)
    index.close()


def test_register_many_over_several_chunks_answers_like_register_one_by_one() -> None:
    items = [(f"a/mid:{n % 700}@y", FOLDERS[n % 3], 7, n % 900 or None) for n in range(2_000)]
    one_by_one, batched = AccountIndex("a"), AccountIndex("a")
    answers = [one_by_one.register(*item) for item in items]
    assert batched.register_many(items) == answers
    assert answers.count(False) == 700 and len(batched) == 700
    for folder in FOLDERS:
        assert batched.uids_in(folder, 7) == one_by_one.uids_in(folder, 7)


def test_uids_lists_a_folder_s_uids_ascending_in_a_compact_array() -> None:
    index = AccountIndex("a")
    index.register_many(
        [
            ("a/mid:3@y", "INBOX", 7, 30),
            ("a/mid:1@y", "INBOX", 7, 10),
            ("a/mid:2@y", "INBOX", 7, 2**40),
            ("a/mid:4@y", "INBOX", 6, 5),
            ("a/mid:5@y", "Sent", 7, 11),
            ("a/mid:6@y", "INBOX", None, None),
        ]
    )
    uids = index.uids("INBOX", 7)
    assert isinstance(uids, array) and uids.typecode == "Q"
    assert list(uids) == [10, 30, 2**40]
    assert list(index.uids("INBOX", 6)) == [5]
    assert list(index.uids("Drafts", 7)) == []


def test_a_closed_index_refuses_to_be_used_and_closing_twice_is_harmless() -> None:
    index = AccountIndex("a")
    index.register("a/mid:x@y", "INBOX", 7, 1)
    index.close()
    index.close()
    with pytest.raises(sqlite3.ProgrammingError):
        index.register("a/mid:x@y", "INBOX", 7, 2)
    with pytest.raises(sqlite3.ProgrammingError):
        index.uids("INBOX", 7)


def test_a_failed_batch_leaves_the_index_as_it_was() -> None:
    index = AccountIndex("a")
    index.register("a/mid:x@y", "INBOX", 7, 1)
    # The UIDVALIDITY does not fit SQLite's INTEGER: the batch fails after it wrote the keys.
    with pytest.raises(OverflowError):
        index.register_many([("a/mid:y@y", "INBOX", 7, 2), ("a/mid:z@y", "INBOX", 2**64, 3)])
    assert index.uids_in("INBOX", 7) == {1: "a/mid:x@y"} and len(index) == 1
    assert index.register("a/mid:y@y", "INBOX", 7, 2) is False


# --- rebuilding from the events topic ------------------------------------------------------------


def test_the_newest_location_per_key_is_kept_and_tombstones_drop_the_key() -> None:
    latest = _LatestLocations()
    latest.record(
        [
            ("a/mid:1@y", "a", "INBOX", 7, 1, "f1"),
            ("a/mid:2@y", "a", "INBOX", 7, 2, "f2"),
            ("b/mid:3@y", "b", "INBOX", 3, 1, "f3"),
            ("a/mid:4@y", "a", "INBOX", 7, 4, None),
        ]
    )
    latest.record(
        [
            ("a/mid:1@y", "a", "Archive", 9, 5, None),  # moved (an event without fingerprint)
            ("a/mid:2@y", "a", None, None, None, None),  # tombstoned
            ("a/mid:5@y", "a", "INBOX", 7, 6, "f5"),
        ]
    )
    assert list(latest.batches(2)) == [
        ("a", [("a/mid:1@y", "f1", "Archive", 9, 5), ("a/mid:4@y", None, "INBOX", 7, 4)]),
        ("a", [("a/mid:5@y", "f5", "INBOX", 7, 6)]),
        ("b", [("b/mid:3@y", "f3", "INBOX", 3, 1)]),
    ]
    latest.close()


# --- two mails sharing a Message-ID --------------------------------------------------------------

FP_A, FP_B, FP_C = "aa" * 32, "bb" * 32, "aa" * 4 + "cc" * 28  # C shares A's first 8 digits


def test_a_different_mail_with_a_known_message_id_gets_a_key_of_its_own() -> None:
    index = AccountIndex("a")
    assert index.place("a/mid:x@y", FP_A, "INBOX", 7, 1) == ("a/mid:x@y", False)
    assert index.place("a/mid:x@y", FP_B, "INBOX", 7, 2) == ("a/mid:x@y#bbbbbbbb", False)
    # The same mails again (a copy, a move): their own keys, known.
    assert index.place("a/mid:x@y", FP_B, "Archive", 3, 1) == ("a/mid:x@y#bbbbbbbb", True)
    assert index.place("a/mid:x@y", FP_A, "Archive", 3, 2) == ("a/mid:x@y", True)


def test_a_clash_of_the_short_suffix_moves_on_to_a_longer_one() -> None:
    index = AccountIndex("a")
    index.place("a/mid:x@y", FP_B, "INBOX", 7, 1)
    assert index.place("a/mid:x@y", FP_A, "INBOX", 7, 2)[0] == "a/mid:x@y#aaaaaaaa"
    assert index.place("a/mid:x@y", FP_C, "INBOX", 7, 3)[0] == "a/mid:x@y#aaaaaaaacccccccc"


def test_every_mail_maps_back_to_its_key_after_a_rescan_a_restart_or_a_deletion() -> None:
    index = AccountIndex("a")
    index.place_many([("a/mid:x@y", FP_A, "INBOX", 7, 1), ("a/mid:x@y", FP_B, "INBOX", 7, 2)])
    # UIDVALIDITY change: the folder is forgotten and rescanned, in the other UID order.
    index.forget_folder("INBOX")
    assert index.place_many(
        [("a/mid:x@y", FP_B, "INBOX", 8, 1), ("a/mid:x@y", FP_A, "INBOX", 8, 2)]
    ) == [("a/mid:x@y#bbbbbbbb", True), ("a/mid:x@y", True)]
    # A restart: the index is rebuilt from the events (keys as published, with fingerprints).
    rebuilt = AccountIndex("a")
    rebuilt.place_many(
        [("a/mid:x@y#bbbbbbbb", FP_B, "INBOX", 8, 1), ("a/mid:x@y", FP_A, "INBOX", 8, 2)],
        resolve=False,
    )
    assert rebuilt.place("a/mid:x@y", FP_A, "Sent", 1, 1) == ("a/mid:x@y", True)
    # The first mail deleted (tombstoned): the second keeps its key, not the bare one.
    assert rebuilt.remove("INBOX", 2) == ("a/mid:x@y", True)  # the copy in Sent is left
    assert rebuilt.remove("Sent", 1) == ("a/mid:x@y", False)
    assert rebuilt.forget_unless_located("a/mid:x@y")
    assert rebuilt.place("a/mid:x@y", FP_B, "Sent", 1, 2) == ("a/mid:x@y#bbbbbbbb", True)


def test_a_key_published_before_fingerprints_were_recorded_is_taken_as_the_same_mail() -> None:
    index = AccountIndex("a")
    index.place_many([("a/mid:x@y", None, "INBOX", 7, 1)], resolve=False)
    assert index.place("a/mid:x@y", FP_A, "INBOX", 8, 1) == ("a/mid:x@y", True)
    # From then on its fingerprint is known, and another mail is told apart.
    assert index.place("a/mid:x@y", FP_B, "INBOX", 8, 2) == ("a/mid:x@y#bbbbbbbb", False)


def test_a_fingerprint_key_is_never_given_a_suffix() -> None:
    index = AccountIndex("a")
    assert index.place("a/fp:" + FP_A, FP_A, "INBOX", 7, 1) == ("a/fp:" + FP_A, False)
    assert index.place("a/fp:" + FP_A, FP_A, "INBOX", 7, 2) == ("a/fp:" + FP_A, True)
