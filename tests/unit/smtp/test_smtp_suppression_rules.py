"""The suppression list's pure parts: keys, bounce rules, complaints, unsubscribes, screening."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from connectors.core.avro.serde import AvroSerde
from connectors.smtp.arf import parse_complaints, unsubscriber
from connectors.smtp.classify import DeliveryStatus
from connectors.smtp.config import SuppressionSettings
from connectors.smtp.errors import AddressError
from connectors.smtp.render import RenderedMessage, render
from connectors.smtp.suppression import after_bounce, normalize, record, screen

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures"
NOW = datetime(2026, 12, 2, 10, 0, tzinfo=UTC)


def test_normalize_lowercases_and_idna_encodes() -> None:
    assert normalize("Jane.Doe@Example.ORG") == "jane.doe@example.org"
    assert normalize("<a@Bücher.example>") == "a@xn--bcher-kva.example"
    assert normalize("用户@例子.广告") == normalize("用户@xn--fsqu00a.xn--4rr70v")


@pytest.mark.parametrize("bad", ["", "nobody", "@example.org", "a b@example.org", "a@-x..y"])
def test_normalize_refuses_non_addresses(bad: str) -> None:
    with pytest.raises(AddressError):
        normalize(bad)


def bounce(existing: Any, *, hard: bool, status: str, now: datetime = NOW, **kw: Any) -> Any:
    return after_bounce(
        existing,
        "Nobody@Example.org",
        hard=hard,
        status=status,
        detail="550 no such user",
        command_id="c1",
        now=now,
        settings=SuppressionSettings(**kw),
    )


def test_hard_5_1_x_bounce_suppresses() -> None:
    entry = bounce(None, hard=True, status="5.1.1")
    assert entry["address"] == "nobody@example.org"
    assert (entry["suppressed"], entry["reason"], entry["command_id"]) == (
        True,
        "HARD_BOUNCE",
        "c1",
    )
    assert entry["detail"].startswith("5.1.1")


def test_other_hard_bounces_count_as_soft_ones() -> None:
    entry = bounce(None, hard=True, status="5.7.1")
    assert (entry["suppressed"], entry["reason"], entry["soft_bounces"]) == (False, None, [NOW])


def test_configured_hard_classes() -> None:
    assert bounce(None, hard=True, status="5.7.1", hard_bounce_statuses=["5"])["suppressed"]


def test_soft_bounces_suppress_at_the_limit_within_the_window() -> None:
    settings = {"soft_bounce_limit": 3, "soft_bounce_window": "1d"}
    entry = None
    for hours in (0, 30, 31):  # the first one falls out of the 1d window
        entry = bounce(
            entry, hard=False, status="4.2.2", now=NOW + timedelta(hours=hours), **settings
        )
        assert not entry["suppressed"]
    entry = bounce(entry, hard=False, status="4.2.2", now=NOW + timedelta(hours=32), **settings)
    assert (entry["suppressed"], entry["reason"]) == (True, "SOFT_BOUNCES")
    assert len(entry["soft_bounces"]) == 3 and "3 soft bounces within 1d" in entry["detail"]
    # Suppressed stays suppressed with its first reason.
    assert bounce(entry, hard=True, status="5.1.1") is None


def test_soft_bounce_limit_zero_never_counts() -> None:
    assert bounce(None, hard=False, status="4.2.2", soft_bounce_limit=0) is None


def test_record_round_trips_through_the_schema() -> None:
    serde = AvroSerde.for_schema("Suppression")
    value = record("A@B.example", reason="MANUAL", now=NOW, detail="asked by phone", source="cli:x")
    assert serde.decode(serde.encode(value, "mail.suppressions")) == value
    with pytest.raises(ValueError, match="reason must be one of"):
        record("a@b.example", reason="SPAM", now=NOW)


@pytest.mark.parametrize(
    ("name", "recipient"),
    [
        ("rfc5965_abuse.eml", "jane.doe@example.net"),
        ("jmrp_headers_only.eml", "kim@hotmail.example"),
    ],
)
def test_arf_complaint_is_parsed_and_correlated(name: str, recipient: str) -> None:
    complaints = parse_complaints((FIXTURES / "arf" / name).read_bytes())
    assert complaints is not None
    assert [(c.recipient, c.feedback_type, c.command_id) for c in complaints] == [
        (recipient, "abuse", "a1b2c3d4e5f6")
    ]


def test_arf_about_foreign_mail_or_not_spam_suppresses_nobody() -> None:
    raw = (FIXTURES / "arf" / "rfc5965_abuse.eml").read_bytes()
    assert parse_complaints(raw.replace(b"mailtap.a1b2c3d4e5f6", b"other.1")) == []
    assert parse_complaints(raw.replace(b"Feedback-Type: abuse", b"Feedback-Type: not-spam")) == []


def test_dsn_and_plain_mail_are_not_feedback_reports() -> None:
    assert parse_complaints((FIXTURES / "dsn" / "rfc3464_hard_511.eml").read_bytes()) is None
    assert parse_complaints(b"From: a@example.org\r\nSubject: hi\r\n\r\nhi\r\n") is None


def test_unsubscribe_mail_names_its_sender() -> None:
    raw = (
        b"From: Jane <Jane@Example.org>\r\nTo: <unsubscribe@example.com>\r\n"
        b"Subject: unsubscribe\r\n\r\n\r\n"
    )
    assert unsubscriber(raw, "unsubscribe@example.com") == "jane@example.org"
    assert unsubscriber(raw, "other@example.com") is None
    # An out-of-office reply or a report sent there is no one's request (RFC 3834).
    assert (
        unsubscriber(b"Auto-Submitted: auto-replied\r\n" + raw, "unsubscribe@example.com") is None
    )
    assert unsubscriber(b"Return-Path: <>\r\n" + raw, "unsubscribe@example.com") is None


class Table:
    def __init__(self, suppressed: dict[str, dict[str, Any]]) -> None:
        self.entries = suppressed

    def get(self, address: str) -> dict[str, Any] | None:
        return self.entries.get(normalize(address))


def test_screen_takes_suppressed_recipients_out_with_their_reason() -> None:
    message = RenderedMessage("c1", "m1", "s@example.com", ("a@example.org", "B@example.org"), b"x")
    entry = record("b@example.org", reason="COMPLAINT", now=NOW, detail="feedback type abuse")
    kept, outcomes = screen(message, Table({"b@example.org": entry}))  # type: ignore[arg-type]
    assert kept.recipients == ("a@example.org",) and kept.data == b"x"
    assert [(o.recipient, o.status) for o in outcomes] == [
        ("B@example.org", DeliveryStatus.SUPPRESSED)
    ]
    assert outcomes[0].diagnostic == "suppressed: COMPLAINT - feedback type abuse"
    assert screen(message, None) == (message, [])


def test_a_recipient_suppressed_by_this_commands_own_bounce_is_bounced_already() -> None:
    """A resend after an UNKNOWN outcome whose DSN came back meanwhile: the bounce reader
    published BOUNCED with the suppression, so the recipient is done and nothing more is
    published for it; another command's bounce, or a complaint, still means SUPPRESSED."""
    message = RenderedMessage(
        "c1",
        "m1",
        "s@example.com",
        ("gone@example.org", "other@example.org", "c@example.org"),
        b"x",
    )
    own = record("gone@example.org", reason="HARD_BOUNCE", now=NOW, command_id="c1")
    earlier = record("other@example.org", reason="HARD_BOUNCE", now=NOW, command_id="c0")
    complaint = record("c@example.org", reason="COMPLAINT", now=NOW, command_id="c1")
    table = Table(
        {"gone@example.org": own, "other@example.org": earlier, "c@example.org": complaint}
    )
    kept, outcomes = screen(message, table)  # type: ignore[arg-type]
    assert kept.recipients == ()
    assert [(o.recipient, o.status, o.published) for o in outcomes] == [
        ("gone@example.org", DeliveryStatus.BOUNCED, True),
        ("other@example.org", DeliveryStatus.SUPPRESSED, False),
        ("c@example.org", DeliveryStatus.SUPPRESSED, False),
    ]


def test_a_soft_bounce_of_this_command_that_suppressed_nobody_is_bounced_already() -> None:
    """The same resend when the DSN was a soft bounce the entry only counted (``suppressed:
    false``): BOUNCED is published, so the resend's SENT would be a second final outcome.
    Another command's soft bounce still lets the mail go out."""
    message = RenderedMessage(
        "c1", "m1", "s@example.com", ("full@example.org", "b@example.org"), b"x"
    )

    def soft_bounce(address: str, command_id: str) -> dict[str, Any] | None:
        return after_bounce(
            None,
            address,
            hard=False,
            status="4.2.2",
            detail="mailbox full",
            command_id=command_id,
            now=NOW,
            settings=SuppressionSettings(soft_bounce_limit=3),
        )

    own = soft_bounce("full@example.org", "c1")
    other = soft_bounce("b@example.org", "c0")
    assert own is not None and other is not None and not own["suppressed"]
    table = Table({"full@example.org": own, "b@example.org": other})
    kept, outcomes = screen(message, table)  # type: ignore[arg-type]
    assert kept.recipients == ("b@example.org",)
    assert [(o.recipient, o.status, o.published) for o in outcomes] == [
        ("full@example.org", DeliveryStatus.BOUNCED, True)
    ]
    assert (
        outcomes[0].diagnostic
        == "bounced already (resend not sent): soft bounce: 4.2.2 mailbox full"
    )


def test_replies_carry_list_unsubscribe_when_configured() -> None:
    command: dict[str, Any] = {
        "command_id": "c1",
        "from": {"name": None, "address": "support@example.com"},
        "to": [{"name": None, "address": "a@example.org"}],
        "subject": "Re: x",
        "text_body": "hi",
        "created_at": NOW,
    }
    mailto_only = SuppressionSettings(unsubscribe_mailto="unsubscribe@example.com")
    data = render(command, unsubscribe=mailto_only.list_unsubscribe).data
    assert b"List-Unsubscribe: <mailto:unsubscribe@example.com?subject=unsubscribe>\r\n" in data
    assert b"List-Unsubscribe-Post" not in data  # RFC 8058 3.1: only with an https URI
    both = SuppressionSettings(
        unsubscribe_mailto="unsubscribe@example.com", unsubscribe_url="https://example.com/u/1"
    )
    data = render(command, unsubscribe=both.list_unsubscribe).data
    assert b"List-Unsubscribe-Post: List-Unsubscribe=One-Click\r\n" in data
    assert b"<https://example.com/u/1>" in data
    assert b"List-Unsubscribe" not in render(command).data


@pytest.mark.parametrize(
    ("key", "value", "says"),
    [
        ("hard_bounce_statuses", ["4.2"], "not a permanent RFC 3463 status"),
        ("soft_bounce_window", "weekly", "not a duration"),
        ("unsubscribe_mailto", "mailto:x@example.com?subject=u", "plain address"),
        ("unsubscribe_url", "http://example.com/u", "https://"),
    ],
)
def test_bad_settings_say_what_to_change(key: str, value: Any, says: str) -> None:
    with pytest.raises(ValueError, match=says):
        SuppressionSettings(**{key: value})
