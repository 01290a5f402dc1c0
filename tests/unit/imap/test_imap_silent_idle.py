"""A server whose IDLE never announces new mail (Dovecot without inotify: "Inotify instance limit
... exceeded, disabling") is said in the log, once per connection: new mail then waits for the
light sync, which is a trigger slowed down without a word otherwise (issue 25)."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

import pytest

from connectors.imap.idle import IdleOutcome
from connectors.imap.waiting import SILENT_IDLE_PERIODS
from tests.unit.imap.fake_imap import FakeConnection
from tests.unit.imap.test_imap_worker import filled, make_worker

SAID = "announced no new mail in IDLE"
PERIODS = 6


def idle_with_new_mail(announce: bool) -> Callable[..., IdleOutcome]:
    """Each IDLE period a mail arrives; the period runs to its deadline and announces it or not."""
    periods = {"n": 0}

    def idle_until(
        conn: FakeConnection, deadline: float, should_stop: Any, slice_seconds: float
    ) -> IdleOutcome:
        periods["n"] += 1
        if periods["n"] > PERIODS:
            conn.stop.set()
            return IdleOutcome()
        conn.server.append(f"arrived in idle {periods['n']}\r\n\r\nbody".encode())
        if announce:
            return IdleOutcome(new_mail=True)
        time.sleep(max(0.0, deadline - time.monotonic()))
        return IdleOutcome()

    return idle_until


def run_idle_periods(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, announce: bool
) -> tuple[list[str], int]:
    monkeypatch.setattr(FakeConnection, "idle_until", idle_with_new_mail(announce))
    worker, writer, _ = make_worker(filled(1))
    # IDLE periods of 20 ms: the light sync after each finds the mail IDLE kept quiet about.
    worker.waits.settings = worker.settings.model_copy(update={"uidvalidity_check_seconds": 0.02})
    with caplog.at_level(logging.WARNING, logger="connectors.imap.waiting"):
        worker.run()
    said = [r.getMessage() for r in caplog.records if SAID in r.getMessage()]
    return said, int(writer.last_offset["last_uid"])


def test_idle_that_never_announces_new_mail_is_said_once(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    said, last_uid = run_idle_periods(monkeypatch, caplog, announce=False)
    assert last_uid == 1 + PERIODS  # every mail published, by the light syncs
    assert len(said) == 1 and f"{SILENT_IDLE_PERIODS} periods in a row" in said[0]
    assert "a/INBOX" in said[0] and "Inotify instance limit" in said[0]


def test_idle_that_announces_new_mail_says_nothing(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    said, last_uid = run_idle_periods(monkeypatch, caplog, announce=True)
    assert last_uid == 1 + PERIODS
    assert said == []
