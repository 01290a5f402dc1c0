"""The account index behind the tombstone rule: gone from every watched folder, or moved."""

from __future__ import annotations

from connectors.imap.index import AccountIndex


def test_a_key_in_two_folders_is_not_gone_when_one_copy_is_expunged() -> None:
    index = AccountIndex("a")
    assert index.register("a/mid:x@y", "INBOX", 7, 1) is False  # first sight: ADDED
    assert index.register("a/mid:x@y", "Archive", 9, 4) is True  # seen before: UPDATED
    assert index.remove("INBOX", 1) == ("a/mid:x@y", True)
    assert index.remove("Archive", 4) == ("a/mid:x@y", False)
    assert index.remove("Archive", 4) is None


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
