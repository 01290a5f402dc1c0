"""Cursor decisions: start positions, a new epoch on UIDVALIDITY change, batching, JSON shape."""

from __future__ import annotations

from connectors.core.source.location import SourceLocation
from connectors.imap.cursor import (
    Cursor,
    PendingSideEffect,
    chunks,
    on_select,
    skip_unchanged,
    split_by_bytes,
)


def test_no_cursor_start_all_reads_from_the_first_uid() -> None:
    decision = on_select(None, 7, 101, 50, "all")
    assert decision.new and not decision.rescan
    assert decision.cursor == Cursor(7, 0, 50)


def test_no_cursor_start_latest_pins_the_current_end() -> None:
    assert on_select(None, 7, 101, 50, "latest").cursor == Cursor(7, 100, 50, floor_uid=100)
    assert on_select(None, 7, 1, None, "latest").cursor == Cursor(7, 0, 0)
    # Mails before the start position were never published: no UPDATED events for them.


def test_no_cursor_start_since_begins_before_the_first_matching_uid() -> None:
    assert on_select(None, 7, 101, 50, "since:2026-01-01", first_uid_since=40).cursor.last_uid == 39
    # Nothing since the date: only new mail.
    assert on_select(None, 7, 101, 50, "since:2026-01-01", None).cursor.last_uid == 100


def test_same_uidvalidity_keeps_the_stored_cursor() -> None:
    stored = Cursor(7, 42, 17, epoch=2, fresh=((43, 19),))
    decision = on_select(stored, 7, 101, 60, "latest")
    assert decision.cursor is stored and not decision.rescan and not decision.new


def test_new_uidvalidity_starts_a_new_epoch_with_a_full_rescan() -> None:
    stored = Cursor(7, 42, 17, epoch=2, pending=PendingSideEffect("seen", (41, 42)))
    decision = on_select(stored, 8, 31, 5, "latest")
    assert decision.rescan and not decision.new
    # Start position is ignored: every mail of the new epoch is read again, below uidnext as
    # RESCANNED; an unfinished side effect of the old epoch names UIDs that no longer exist.
    assert decision.cursor == Cursor(8, 0, 5, epoch=3, rescan_until=31)


def test_cursor_json_round_trip_and_canonical_partition() -> None:
    cursor = Cursor(
        9, 42, 17, epoch=1, fresh=((43, 19),), pending=PendingSideEffect("move:Done", (1, 2), 7)
    )
    data = cursor.to_json()
    assert data["pending"] == {"action": "move:Done", "uids": [1, 2], "target_uidnext": 7}
    assert Cursor.from_json(data) == cursor
    assert Cursor.from_json({"uidvalidity": 1, "last_uid": 2}) == Cursor(1, 2)
    where = SourceLocation("imap", "a", "INBOX")
    assert where.partition == {"source": "imap", "account": "a", "folder": "INBOX"}


def test_advanced_never_moves_back_and_accumulates_fresh() -> None:
    cursor = Cursor(1, 10).advanced(5, ((5, 3),))
    assert cursor.last_uid == 10 and cursor.fresh == ((5, 3),)


def test_skip_unchanged_only_for_the_exact_published_modseq() -> None:
    fresh = ((5, 40), (6, 41))
    assert skip_unchanged(fresh, 5, 40)
    assert not skip_unchanged(fresh, 5, 42)
    assert not skip_unchanged(fresh, 7, 40)
    assert not skip_unchanged(fresh, 5, None)


def test_batches_are_bounded_by_count_and_by_bytes() -> None:
    assert chunks(list(range(7)), 3) == [[0, 1, 2], [3, 4, 5], [6]]
    sizes = {1: 10, 2: 10, 3: 100, 4: 1}
    assert split_by_bytes([1, 2, 3, 4], sizes, 25) == [[1, 2], [3], [4]]
    assert split_by_bytes([], sizes, 25) == []


def test_the_qresync_watermark_round_trips_and_a_new_epoch_drops_it() -> None:
    cursor = Cursor(9, 42, 17, vanished_modseq=15)
    assert cursor.to_json()["vanished_modseq"] == 15
    assert Cursor.from_json(cursor.to_json()) == cursor
    # A cursor written before QRESYNC has none: the next start lists the folder.
    assert Cursor.from_json({"uidvalidity": 9, "last_uid": 42}).vanished_modseq == 0
    # Old UIDs mean nothing under a new UIDVALIDITY: neither does their watermark.
    assert on_select(cursor, 10, 50, 30, "all").cursor.vanished_modseq == 0
    assert on_select(cursor, 9, 50, 30, "all").cursor.vanished_modseq == 15
