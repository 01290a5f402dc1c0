"""Each guard on its own: one named test per rule it enforces (RFC 3834 and friends)."""

from __future__ import annotations

import random

import pytest

from streams.config import RateLimitSettings
from streams.guards import (
    LOOP_GUARDS,
    PASS,
    Skip,
    already_ran,
    auto_response_suppressed,
    auto_submitted,
    bulk_precedence,
    dedupe_key,
    delivery_report,
    first_skip,
    mailing_list,
    null_return_path,
    own_address,
    parse_complete,
    rate_clock,
    rate_key,
    rate_limit,
    record_reply,
    system_sender,
)
from streams.mail import MailView
from streams.testing import EPOCH, mail_record

OWN = frozenset({"help@example.com"})


def mail(**kwargs: object) -> MailView:
    return MailView.from_record(mail_record(**kwargs))  # type: ignore[arg-type]


def headers(**values: object) -> MailView:
    return mail(guard_headers=values)


def test_plain_mail_passes_every_loop_guard() -> None:
    assert first_skip(mail(), LOOP_GUARDS, own_addresses=OWN) == PASS


@pytest.mark.parametrize("value", ["auto-replied", "auto-generated", "Auto-Notified; x=1"])
def test_auto_submitted_other_than_no_is_skipped(value: str) -> None:
    verdict = auto_submitted(headers(auto_submitted=value))
    assert isinstance(verdict, Skip) and verdict.guard == "auto_submitted"
    assert value.strip() in verdict.reason


@pytest.mark.parametrize("value", ["no", " No ", "no (human)"])
def test_auto_submitted_no_passes(value: str) -> None:
    assert auto_submitted(headers(auto_submitted=value)) == PASS


@pytest.mark.parametrize("value", ["<>", "", "  <> ", "<MAILER-DAEMON@mx.example.com>"])
def test_null_or_mailer_daemon_return_path_is_skipped(value: str) -> None:
    assert isinstance(null_return_path(headers(return_path=value)), Skip)


def test_ordinary_return_path_passes() -> None:
    assert null_return_path(headers(return_path="<ann@example.com>")) == PASS
    assert null_return_path(headers()) == PASS


def test_list_id_and_list_unsubscribe_are_skipped() -> None:
    assert mailing_list(headers(list_id="<dev.lists.example.com>")) == Skip(
        "mailing_list", "List-Id: <dev.lists.example.com>"
    )
    assert isinstance(mailing_list(headers(list_unsubscribe="<mailto:u@x>")), Skip)
    assert mailing_list(headers()) == PASS


@pytest.mark.parametrize("value", ["bulk", "List", "junk", " JUNK "])
def test_bulk_precedence_is_skipped(value: str) -> None:
    assert isinstance(bulk_precedence(headers(precedence=value)), Skip)


def test_other_precedence_passes() -> None:
    assert bulk_precedence(headers(precedence="first-class")) == PASS


def test_multipart_report_is_a_delivery_report() -> None:
    dsn = headers(content_type='multipart/report; report-type=delivery-status; boundary="x"')
    assert delivery_report(dsn) == Skip("delivery_report", "Content-Type: multipart/report")
    assert delivery_report(headers(content_type="multipart/mixed; boundary=y")) == PASS


@pytest.mark.parametrize("value", ["All", "OOF, AutoReply", "DR,NDR,RN,NRN,OOF,AutoReply"])
def test_auto_response_suppress_all_or_autoreply_is_skipped(value: str) -> None:
    assert isinstance(auto_response_suppressed(headers(x_auto_response_suppress=value)), Skip)


def test_auto_response_suppress_other_tokens_pass() -> None:
    assert auto_response_suppressed(headers(x_auto_response_suppress="DR, NDR")) == PASS


@pytest.mark.parametrize(
    "sender",
    [
        "MAILER-DAEMON@example.com",
        "postmaster@example.com",
        "owner-dev@lists.x",
        "dev-request@lists.x",
    ],
)
def test_system_senders_are_skipped(sender: str) -> None:
    assert isinstance(system_sender(mail(sender=sender)), Skip)


def test_mail_without_any_address_to_answer_is_skipped() -> None:
    assert system_sender(mail(sender=None)) == Skip(
        "system_sender", "no From or Reply-To address to answer"
    )


def test_mail_from_our_own_address_is_skipped_case_insensitively() -> None:
    verdict = own_address(mail(sender="Help@Example.COM"), own_addresses=OWN)
    assert isinstance(verdict, Skip) and verdict.guard == "own_address"
    assert own_address(mail(), own_addresses=OWN) == PASS


def test_mail_with_parse_error_is_not_answered() -> None:
    verdict = parse_complete(mail(parse_error="MIME depth 40 > 20"))
    assert verdict == Skip("parse_complete", "parse error: MIME depth 40 > 20")


def test_first_skip_reports_the_first_guard_in_order() -> None:
    both = mail(guard_headers={"auto_submitted": "auto-replied", "precedence": "bulk"})
    verdict = first_skip(both, LOOP_GUARDS, own_addresses=OWN)
    assert isinstance(verdict, Skip) and verdict.guard == "auto_submitted"


def test_dedupe_skips_a_mail_that_already_ran_this_workflow_only() -> None:
    m = mail()
    runs = {dedupe_key(m.key, "ticket_intake"): ["c1"]}
    assert already_ran(m, "ticket_intake", runs) is True
    assert already_ran(m, "approval", runs) is False
    assert already_ran(m, "ticket_intake", {}) is False


LIMIT = RateLimitSettings(max_replies=2, window_seconds=600)


def window(*times: float) -> dict[str, object]:
    return {"clock": max(times, default=0.0), "times": list(times)}


NOW = EPOCH.timestamp()


def test_rate_limit_skips_once_the_window_holds_max_replies() -> None:
    assert rate_limit(window(NOW - 100), NOW, LIMIT, who="k") == PASS
    verdict = rate_limit(window(NOW - 100, NOW - 50), NOW, LIMIT, who="sender/ann@example.com")
    assert verdict == Skip("rate_limit", "2 replies for sender/ann@example.com in the last 600s")


def test_rate_limit_forgets_replies_outside_the_window() -> None:
    assert rate_limit(window(NOW - 100, NOW), NOW + 601, LIMIT, who="k") == PASS


def test_record_reply_keeps_only_what_the_limit_needs() -> None:
    entry = record_reply(window(NOW - 700, NOW - 20, NOW - 10), NOW, LIMIT)
    assert entry == {"clock": NOW, "times": [NOW - 10, NOW]}


def test_an_older_mail_read_late_is_judged_by_the_latest_time_seen() -> None:
    # Issue 17 item 3: the old limiter took the mail's own time as "now" and dropped the newer
    # replies, so an older mail reset the history.
    entry = window(NOW, NOW + 1)
    assert isinstance(rate_limit(entry, NOW - 5, LIMIT, who="k"), Skip)
    assert rate_clock(entry, NOW - 5) == NOW + 1


def test_a_reply_to_an_older_mail_is_recorded_at_the_clock_not_in_the_past() -> None:
    entry = record_reply(window(NOW), NOW - 3000, LIMIT)
    assert entry == {"clock": NOW, "times": [NOW, NOW]}
    assert isinstance(rate_limit(entry, NOW - 3000, LIMIT, who="k"), Skip)


@pytest.mark.parametrize("seed", range(20))
def test_the_limit_holds_whatever_the_order(seed: int) -> None:
    """30 mails within 10 ms in any order: exactly max_replies answers (the issue's probe)."""
    times = [NOW + i / 3000 for i in range(30)]
    random.Random(seed).shuffle(times)
    entry: object = None
    answered = 0
    for at in times:
        if rate_limit(entry, at, LIMIT, who="k") == PASS:
            entry = record_reply(entry, at, LIMIT)
            answered += 1
    assert answered == LIMIT.max_replies


def test_entries_of_an_older_format_count_as_empty() -> None:
    assert rate_limit([NOW, NOW, NOW], NOW, LIMIT, who="k") == PASS


def test_rate_keys_separate_senders_from_recipients_and_ignore_case() -> None:
    assert rate_key("sender", " Ann@Example.COM") == "sender/ann@example.com"
    assert rate_key("recipient", "ann@example.com") != rate_key("sender", "ann@example.com")
