"""``mailtap status``'s mailboxes section: owner, state and last-sync age of each configured
mailbox, from a /healthz answer when one lists it, else from the cursor's timestamp."""

from __future__ import annotations

from mailtap.commands.status import NO_GROUP, ownership, render

NOW_MS = 1_800_000_000_000
ROW = {"mailbox": "imap/a/INBOX", "origin": "configuration", "group": "g", "owner": "m@h:1"}


def test_healthz_answer_gives_state_and_sync_age() -> None:
    answers = [
        {"ages": {"imap/b/INBOX": 1.0}, "states": {"imap/b/INBOX": "IDLE"}},
        {"ages": {"imap/a/INBOX": 3.5}, "states": {"imap/a/INBOX": "BACKOFF"}},
    ]
    found = ownership(ROW, answers, "2027-01-15T08:00:00+00:00", NOW_MS)
    assert found == {
        "origin": "configuration",
        "group": "g",
        "owner": "m@h:1",
        "state": "BACKOFF",
        "fallbacks": [],
        "last_sync_age_seconds": 3.5,
        "age_of": "healthz",
    }


def test_a_server_without_idle_shows_polling_and_why() -> None:
    note = "no IDLE: polling every 30 s instead of mode: idle"
    answers = [
        {
            "ages": {"imap/a/INBOX": 2.0},
            "states": {"imap/a/INBOX": "POLLING"},
            "fallbacks": {"imap/a/INBOX": [note]},
        }
    ]
    found = ownership(ROW, answers, None, NOW_MS)
    assert (found["state"], found["fallbacks"]) == ("POLLING", [note])
    report = {
        "at": "2027-01-15T08:00:00+00:00",
        "window_seconds": 3600,
        "mailboxes": {
            "imap/a/INBOX": {
                "cursor": None,
                "cursor_written_at": None,
                "last_event_at": None,
                "events_in_window": 0,
                "dlq_records": 0,
                **found,
            }
        },
        "commands_dlq_records": 0,
        "lag": {},
        "deliveries_in_window": {},
        "bounce_rate": None,
        "health": {},
    }
    shown = render(report).splitlines()
    assert (
        shown[shown.index("imap/a/INBOX  m@h:1  POLLING  2s (healthz)") + 1] == f"  server: {note}"
    )


def test_without_an_answer_the_age_is_the_cursors_and_the_state_unknown() -> None:
    written = "2027-01-15T07:59:00+00:00"  # 60 s before NOW_MS (08:00:00 UTC)
    found = ownership(ROW, [], written, NOW_MS)
    assert (found["state"], found["last_sync_age_seconds"], found["age_of"]) == (
        None,
        60.0,
        "cursor",
    )
    assert ownership(ROW, [], None, NOW_MS)["last_sync_age_seconds"] is None


def test_no_group_unowned_and_removed() -> None:
    assert ownership({**ROW, "group": None, "owner": None}, [], None, NOW_MS)["owner"] == NO_GROUP
    assert ownership({**ROW, "owner": None}, [], None, NOW_MS)["owner"] is None
    removed = {**ROW, "origin": "removed", "group": None, "owner": None}
    assert ownership(removed, [], None, NOW_MS)["owner"] is None


def test_render_lists_every_configured_mailbox_once() -> None:
    base = {"cursor": None, "cursor_written_at": None, "last_event_at": None}
    base |= {"events_in_window": 0, "dlq_records": 0}
    report = {
        "at": "2027-01-15T08:00:00+00:00",
        "window_seconds": 3600.0,
        "mailboxes": {
            "imap/a/INBOX": base
            | ownership(
                ROW,
                [{"ages": {"imap/a/INBOX": 2.2}, "states": {"imap/a/INBOX": "IDLE"}}],
                None,
                NOW_MS,
            ),
            "imap/b/INBOX": base
            | ownership({**ROW, "mailbox": "imap/b/INBOX", "owner": None}, [], None, NOW_MS),
            "imap/c/INBOX": base
            | ownership({**ROW, "mailbox": "imap/c/INBOX", "group": None}, [], None, NOW_MS),
            "imap/gone/INBOX": base,  # only on a topic: not in the mailboxes section
        },
        "commands_dlq_records": 0,
        "lag": {},
        "deliveries_in_window": {},
        "bounce_rate": None,
        "health": {},
    }
    text = render(report)
    section = text.split("MAILBOX  OWNER  STATE  LAST_SYNC_AGE\n")[1].split("\n\n")[0].splitlines()
    assert section == [
        "imap/a/INBOX  m@h:1  IDLE  2s (healthz)",
        "imap/b/INBOX  —  -  -",
        f"imap/c/INBOX  {NO_GROUP}  -  -",
    ]
