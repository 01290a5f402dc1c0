"""streams.max_reply_age: history is never answered, neither on a first start with
``start: all`` (old mail read now) nor on a replay of mail.events by a new app id (old mail
read again, long after it was first observed)."""

from __future__ import annotations

import datetime as dt

import pytest
from pydantic import ValidationError

from streams.config import StreamsSettings
from streams.guards import PASS, Skip, reply_age
from streams.mail import MailView
from streams.testing import EPOCH, WorkflowHarness, mail_record

DAY = dt.timedelta(days=1)
TWO_DAYS = 2 * 86400.0

SETTINGS = {
    "from_address": {"address": "help@example.com"},
    "require": "none",
    "rules": [{"workflow": "ticket_intake"}],
}


def arrived(at: dt.datetime, *, observed: dt.datetime) -> MailView:
    record = mail_record(observed_at=observed)
    record["internal_date"] = at
    return MailView.from_record(record)


def test_mail_that_arrived_within_the_age_passes() -> None:
    mail = arrived(EPOCH - DAY, observed=EPOCH)
    assert reply_age(mail, now=EPOCH, max_age_seconds=TWO_DAYS) == PASS


def test_old_mail_read_on_a_first_start_is_skipped_with_its_arrival() -> None:
    mail = arrived(EPOCH - 400 * DAY, observed=EPOCH)
    verdict = reply_age(mail, now=EPOCH, max_age_seconds=TWO_DAYS)
    assert isinstance(verdict, Skip)
    assert verdict.guard == "max_reply_age"
    assert "arrived 2025-01-26T09:00:00+00:00, 400 days ago" in verdict.reason
    assert "older than 2 days (streams.max_reply_age)" in verdict.reason


def test_a_replay_is_judged_by_the_clock_not_by_when_the_mail_was_first_read() -> None:
    mail = arrived(EPOCH, observed=EPOCH)  # fresh when the source read it
    assert reply_age(mail, now=EPOCH, max_age_seconds=TWO_DAYS) == PASS
    replayed = reply_age(mail, now=EPOCH + 3 * DAY, max_age_seconds=TWO_DAYS)
    assert isinstance(replayed, Skip) and "3 days ago" in replayed.reason


def test_a_worker_clock_behind_the_source_does_not_make_old_mail_young() -> None:
    mail = arrived(EPOCH - 5 * DAY, observed=EPOCH)
    verdict = reply_age(mail, now=EPOCH - 10 * DAY, max_age_seconds=TWO_DAYS)
    assert isinstance(verdict, Skip) and "5 days ago" in verdict.reason


def test_the_sender_date_header_is_not_the_arrival() -> None:
    record = mail_record(observed_at=EPOCH)
    record["date"] = EPOCH - 100 * DAY  # a forged or skewed Date: header
    assert reply_age(MailView.from_record(record), now=EPOCH, max_age_seconds=TWO_DAYS) == PASS


def test_without_internal_date_the_read_time_bounds_the_arrival() -> None:
    record = mail_record(observed_at=EPOCH - 3 * DAY)
    record["internal_date"] = None
    verdict = reply_age(MailView.from_record(record), now=EPOCH, max_age_seconds=TWO_DAYS)
    assert isinstance(verdict, Skip) and "3 days ago" in verdict.reason


def test_the_pipeline_skips_history_before_any_workflow_runs() -> None:
    harness = WorkflowHarness(SETTINGS)
    old = mail_record(message_id="old@example.com", observed_at=EPOCH)
    old["internal_date"] = EPOCH - 30 * DAY
    out = harness.deliver(old)
    assert out.commands == []
    [event] = out.events
    assert event["status"] == "SKIPPED"
    assert event["attributes"]["guard"] == "max_reply_age"
    assert harness.tables.runs == {}  # not marked as run: a longer max_reply_age may answer it
    fresh = harness.deliver(mail_record(message_id="new@example.com", observed_at=EPOCH))
    assert [c["step"] for c in fresh.commands] == ["acknowledge"]


def test_a_replay_by_a_new_app_id_answers_nobody() -> None:
    first = WorkflowHarness(SETTINGS, clock=lambda: EPOCH)
    mails = [mail_record(message_id=f"m{i}@example.com", observed_at=EPOCH) for i in range(3)]
    assert sum(len(first.deliver(m).commands) for m in mails) == 3
    replay = WorkflowHarness(SETTINGS, clock=lambda: EPOCH + 3 * DAY)  # empty tables
    outcomes = [replay.deliver(m) for m in mails]
    assert [o.commands for o in outcomes] == [[], [], []]
    assert {e["attributes"]["guard"] for o in outcomes for e in o.events} == {"max_reply_age"}


def test_max_reply_age_is_configurable_and_validated() -> None:
    settings = StreamsSettings.model_validate({**SETTINGS, "max_reply_age": "36h"})
    assert settings.max_reply_age_seconds == 36 * 3600
    assert StreamsSettings.model_validate(SETTINGS).max_reply_age_seconds == TWO_DAYS
    for bad in ("2 weeks", "0d", "-1d"):
        with pytest.raises(ValidationError, match="max_reply_age"):
            StreamsSettings.model_validate({**SETTINGS, "max_reply_age": bad})
