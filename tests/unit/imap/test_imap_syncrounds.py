"""The clock of the tombstone rule: an expunge is decided only once every other watched folder
has completed a sync that began after the expunge was seen."""

from __future__ import annotations

from connectors.imap.syncrounds import SyncRounds


def test_only_a_sync_that_began_after_the_expunge_counts() -> None:
    rounds = SyncRounds()
    early = rounds.begin("Archive")  # began before INBOX saw its mail gone
    seen_at = rounds.now()
    rounds.done("Archive", early)
    assert not rounds.past(seen_at, ["Archive"])
    rounds.done("Archive", rounds.begin("Archive"))
    assert rounds.past(seen_at, ["Archive"])


def test_every_other_folder_must_be_past() -> None:
    rounds = SyncRounds()
    seen_at = rounds.now()
    rounds.done("Archive", rounds.begin("Archive"))
    assert not rounds.past(seen_at, ["Archive", "Sent"])
    assert rounds.behind(seen_at, ["Archive", "Sent"]) == ["Sent"]
    rounds.done("Sent", rounds.begin("Sent"))
    assert rounds.past(seen_at, ["Archive", "Sent"])
    assert rounds.past(seen_at, [])  # no other watched folder: decided at once


def test_a_waiting_folder_asks_the_others_and_is_woken_when_one_is_done() -> None:
    rounds = SyncRounds()
    rounds.wait_for_others("INBOX", ["Archive"])
    assert rounds.wanted("Archive") and not rounds.wanted("INBOX")
    ticket = rounds.begin("Archive")
    assert not rounds.wanted("Archive")  # its sync began: the request is served
    rounds.done("Archive", ticket)
    assert rounds.wanted("INBOX")  # to decide now
    rounds.begin("INBOX")
    rounds.settled("INBOX")
    rounds.done("Archive", rounds.begin("Archive"))
    assert not rounds.wanted("INBOX")  # nothing pending any more: not woken again


def test_a_folder_asked_to_sync_is_wanted_until_its_next_sync_begins() -> None:
    rounds = SyncRounds()
    rounds.ask(["Work"])
    assert rounds.wanted("Work") and not rounds.wanted("INBOX")
    rounds.begin("Work")
    assert not rounds.wanted("Work")
