"""The fallbacks per missing extension (capabilities.py) and the FLAGS listing's snapshot
(flaglisting.py): what a server without CONDSTORE gets as flag changes."""

from __future__ import annotations

from connectors.imap.capabilities import fallbacks
from connectors.imap.flaglisting import FlagSnapshot, uid_windows

FULL = [b"IMAP4REV1", b"IDLE", b"CONDSTORE", b"QRESYNC", b"MOVE", b"UIDPLUS", b"ESEARCH"]
COURIER = [b"IMAP4REV1", b"UIDPLUS", b"CHILDREN", b"NAMESPACE", b"IDLE", b"ENABLE"]


def notes(caps: list[bytes], mode: str = "idle", moves: bool = False) -> tuple[str, ...]:
    return fallbacks(caps, mode=mode, poll_interval=30, catchup_interval=300, moves=moves)


def test_a_server_with_every_extension_needs_no_fallback() -> None:
    assert notes(FULL, moves=True) == ()


def test_no_idle_is_polling_only_when_idle_was_asked_for() -> None:
    minimal = [b"IMAP4REV1", b"UIDPLUS"]
    assert notes(minimal)[0] == "no IDLE: polling every 30 s instead of mode: idle"
    assert not any(n.startswith("no IDLE") for n in notes(minimal, mode="poll"))


def test_courier_lists_flags_and_uids_and_copies_instead_of_moving() -> None:
    assert notes(COURIER, moves=True) == (
        "no CONDSTORE: flag changes found by listing FLAGS every 300 s",
        "no QRESYNC: a reconnect lists every UID to find expunges",
        "no MOVE: after_commit moves are COPY + EXPUNGE",
    )
    assert not any("MOVE" in n for n in notes(COURIER, moves=False))


def test_qresync_alone_implies_condstore() -> None:
    assert not any("CONDSTORE" in n for n in notes([b"IMAP4REV1", b"IDLE", b"QRESYNC"]))


def test_uid_windows_cover_the_range_once() -> None:
    windows = list(uid_windows(3, 12_001, size=5000))
    assert windows == [(3, 5002), (5003, 10_002), (10_003, 12_001)]
    assert list(uid_windows(10, 9)) == []


def test_a_changed_flag_is_found_until_it_is_remembered() -> None:
    snap = FlagSnapshot()
    snap.remember(7, [(1, ["\\Seen"]), (2, [])])
    listed = [(1, ["\\Seen"]), (2, ["\\Flagged"])]
    assert snap.changed(7, listed) == [2]
    assert snap.changed(7, listed) == [2]  # not published yet (a failed commit): again
    snap.remember(7, [(2, ["\\Flagged"])])
    assert snap.changed(7, listed) == []


def test_recent_is_per_session_not_a_change() -> None:
    snap = FlagSnapshot()
    snap.remember(7, [(1, [])])
    assert snap.changed(7, [(1, ["\\Recent"])]) == []


def test_unknown_uids_are_the_baseline_and_a_new_uidvalidity_starts_over() -> None:
    snap = FlagSnapshot()
    assert snap.changed(7, [(1, ["\\Seen"])]) == []  # first listing after a start
    assert snap.changed(7, [(1, [])]) == [1]
    assert snap.changed(8, [(1, [])]) == []
    assert len(snap) == 1


def test_forgotten_uids_take_no_memory() -> None:
    snap = FlagSnapshot()
    snap.remember(7, [(u, ["\\Seen"]) for u in range(1, 101)])
    snap.forget(range(1, 51))
    assert len(snap) == 50
    snap.retain({60, 70, 1000})  # what a whole listing found: the rest was expunged
    assert len(snap) == 2
