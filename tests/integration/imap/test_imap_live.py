"""Changes while the source is busy or idle reach Kafka without waiting for the catch-up poll.

Every test sets ``catchup_poll_seconds`` (and the IDLE renewal) far above what it waits: what it
checks happens long before the periodic poll could have fired. Nothing here measures timing
precisely; the figures are printed.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import pytest

from connectors.imap.connection import ImapConnection
from connectors.imap.idle import IdleOutcome
from tests.integration.imap.imap_harness import (
    ImapHarness,
    changes,
    keys_of,
    make_mail,
    running,
    wait_for,
)
from tests.support.tcp_proxy import TcpProxy

#: The periodic poll the tests must not depend on, and the IDLE renewal (which also syncs).
SLOW_POLL = {"catchup_poll_seconds": 600, "idle_renew_seconds": 600}
#: Far under SLOW_POLL: a wait that ends later means the periodic poll was needed.
PROMPT_S = 90.0
#: The light sync (NOOP + STATUS) between IDLE periods, where a test must not depend on it.
SLOW_LIGHT_SYNC = {"uidvalidity_check_seconds": 120}
#: Far under SLOW_LIGHT_SYNC: a mail published later waited for the light sync.
PROMPT_IDLE_S = 30.0


@pytest.fixture
def imap(imap: ImapHarness) -> ImapHarness:
    """The harness under an account name of this test alone: no other test running at the
    same time on the shared broker fences its transactional producers (the fencing would
    reconnect the worker, which syncs everything and hides what these tests look at)."""
    imap.account_name = f"live-{imap.unique}"
    return imap


def test_mail_appended_during_a_backfill_is_published_right_after_it(
    imap: ImapHarness,
) -> None:
    backlog = imap.append_numbered(500)
    with TcpProxy(imap.host, imap.port) as link:
        link.delay = 0.05  # a backfill of 50 round trips lasts long enough to be caught
        with running(
            imap,
            port=link.port,
            batch_size=10,
            read_timeout_seconds=120,  # the stall below is not a dead connection
            uidvalidity_check_seconds=600,  # not the IDLE interruption: the sync loop itself
            **SLOW_POLL,
        ) as source:
            worker = source.workers[0]
            # The worker's own committed cursor: reading the offsets topic takes too long here.
            wait_for(lambda: worker.cursor and worker.cursor.last_uid >= 20, "backfill under way")
            # The backfill waits for its next answer while mail arrives (appended directly to
            # Dovecot, not through the link); then it goes on and sees EXISTS in its answers.
            link.stall()
            late = imap.append_numbered(20, start=500, tag="late")
            cursor = worker.cursor
            assert cursor is not None and cursor.last_uid < 500, "appended during the backfill"
            link.resume()
            appended = time.monotonic()
            wait_for(lambda: imap.cursor_at(500), "the backfill's end", timeout=300)
            backfill_done = time.monotonic()
            wait_for(lambda: imap.cursor_at(520), "the late mails in Kafka", timeout=PROMPT_S)
            arrived = time.monotonic()
    print(
        f"late mails: committed {arrived - appended:.1f}s after the append, "
        f"{arrived - backfill_done:.1f}s after the backfill's end "
        f"(catch-up poll: {SLOW_POLL['catchup_poll_seconds']}s)"
    )
    events = imap.events()  # an independent read_committed consumer
    assert keys_of(events) == {f"{imap.account_name}/mid:{m}" for m in backlog + late}
    assert len(events) == 520 and set(changes(events)) == {"ADDED"}


def test_mail_appended_just_before_idle_is_published_without_waiting_for_the_light_sync(
    imap: ImapHarness, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Dovecot does not announce in IDLE a mail that came after the session's last sync and
    before its IDLE command (connectors/imap/idle.py); on a loaded machine a stream of mail
    lands in that window often. Here another client appends a mail at that moment: after the
    worker's sync, just before its IDLE. It must be published at once, not at the next light
    sync (120 s here). Before the NOOP that goes with IDLE, it waited the whole 120 s."""
    first = imap.append_numbered(1)
    window: list[str] = []
    appended: list[float] = []
    armed = threading.Event()
    real_idle_until = ImapConnection.idle_until

    def idle_until(
        conn: ImapConnection,
        deadline: float,
        should_stop: Callable[[], bool],
        slice_seconds: float,
    ) -> IdleOutcome:
        if armed.is_set():
            armed.clear()
            window.extend(imap.append_numbered(1, start=2, tag="window"))
            appended.append(time.monotonic())
        return real_idle_until(conn, deadline, should_stop, slice_seconds)

    monkeypatch.setattr(ImapConnection, "idle_until", idle_until)
    with running(imap, **SLOW_LIGHT_SYNC, **SLOW_POLL) as source:
        worker = source.workers[0]
        wait_for(lambda: worker.cursor and worker.cursor.last_uid >= 1, "first pass")
        wait_for(lambda: worker.machine.state.value == "IDLE", "the source in IDLE")
        armed.set()
        # Announced in IDLE: a sync, then the next IDLE, just before which the window mail comes.
        trigger = imap.append_numbered(1, start=1, tag="trigger")
        wait_for(lambda: appended, "a mail appended just before IDLE")
        wait_for(
            lambda: worker.cursor and worker.cursor.last_uid >= 3,
            "the mail appended just before IDLE published",
            timeout=PROMPT_IDLE_S,
        )
        waited = time.monotonic() - appended[0]
    light_sync = SLOW_LIGHT_SYNC["uidvalidity_check_seconds"]
    print(
        f"mail appended just before IDLE: committed {waited:.2f}s after (light sync every {light_sync}s)"
    )
    events = imap.events()
    assert keys_of(events) == {f"{imap.account_name}/mid:{m}" for m in first + trigger + window}
    assert changes(events) == ["ADDED"] * 3


def test_uidvalidity_change_under_idle_is_rescanned_within_the_check_interval(
    imap: ImapHarness,
) -> None:
    imap.append_numbered(5)
    with running(imap, **SLOW_POLL) as source:  # uidvalidity_check_seconds: the default
        worker = source.workers[0]
        check_s = source.settings.uidvalidity_check_seconds
        wait_for(lambda: imap.cursor_at(5), "first pass")
        wait_for(lambda: worker.machine.state.value == "IDLE", "the source in IDLE")
        before = imap.cursor()
        assert before is not None and before["epoch"] == 0
        imap.doveadm(
            "mailbox", "update", "-u", imap.account.username,
            "--uid-validity", str(before["uidvalidity"] + 1000), "INBOX",
        )  # fmt: skip
        changed = time.monotonic()
        wait_for(
            lambda: (c := imap.cursor()) is not None and c["epoch"] == 1 and c["last_uid"] >= 5,
            "the rescan in the new epoch",
            timeout=PROMPT_S,
        )
        noticed = time.monotonic() - changed
    print(f"UIDVALIDITY change rescanned {noticed:.1f}s after it (check every {check_s:.0f}s)")
    events = imap.events()
    assert changes(events).count("ADDED") == 5 and changes(events).count("RESCANNED") == 5
    assert len(keys_of(events)) == 5


def test_a_deleted_watched_folder_is_reported_once_and_the_others_go_on(
    imap: ImapHarness,
) -> None:
    client = imap.client(folder="")
    client.create_folder("Other")
    client.append("Other", make_mail(f"o1-{imap.unique}@example.com", "other 1"))
    client.logout()
    imap.append_numbered(2)
    config = imap.write_config(account={"folders": ["INBOX", "Other"]}, **SLOW_POLL)
    imap.spawn(config)
    wait_for(
        lambda: imap.cursor_at(2) and imap.cursor_at(1, folder="Other"), "both folders published"
    )
    client = imap.client(folder="")
    client.delete_folder("Other")
    client.logout()
    said = f"{imap.account_name}/Other: the folder does not exist on the server"
    wait_for(lambda: said in imap.log(), "the missing folder reported")
    # Several backoff caps (2 s in the harness) and IDLE checks pass: still said only once.
    time.sleep(12)
    imap.append_numbered(2, start=2)
    wait_for(lambda: imap.cursor_at(4), "INBOX goes on", timeout=PROMPT_S)
    log = imap.log()
    assert log.count(said) == 1, log
    assert "unexpected error" not in log and "Traceback" not in log, log
    # Created again (a new UIDVALIDITY): read again, without a restart.
    client = imap.client(folder="")
    client.create_folder("Other")
    client.append("Other", make_mail(f"o2-{imap.unique}@example.com", "other 2"))
    client.logout()
    wait_for(
        lambda: any(r.value is not None and r.value["subject"] == "other 2" for r in imap.events()),
        "the recreated folder read",
        timeout=PROMPT_S,
    )
    assert "the folder exists again" in imap.log()
