"""DSN fixtures (standard and real-world formats) -> bounced recipients correlated to commands."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import pytest

from connectors.core.avro.serde import AvroSerde
from connectors.smtp.bounce import BounceType, parse_bounce
from connectors.smtp.bounce_reader import bounce_event
from connectors.smtp.identity import message_id_for

pytestmark = pytest.mark.unit
FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "dsn"
VERP = "bounces.example.com"

CASES = {
    "rfc3464_hard_511.eml": (
        "nobody@example.org",
        BounceType.HARD,
        "a1b2c3d4e5f6",
        "5.1.1",
        550,
        "User unknown",
    ),
    "rfc3464_soft_422.eml": (
        "full@example.net",
        BounceType.SOFT,
        "b0a7c0de1234",
        "4.2.2",
        452,
        "Mailbox full",
    ),
    "postfix.eml": (
        "ghost@example.org",
        BounceType.HARD,
        "c0c0a5e5",
        "5.1.1",
        550,
        "local recipient table",
    ),
    "exchange_legacy.eml": (
        "jdoe@corp.example.net",
        BounceType.HARD,
        "e7c4a09b",
        "5.1.1",
        550,
        "Unknown Recipient",
    ),
    "gmail.eml": (
        "no.such.user.9931@gmail.com",
        BounceType.HARD,
        "9a11e0ff",
        "5.1.1",
        550,
        "does not exist",
    ),
    "qmail.eml": (
        "olduser@example.info",
        BounceType.HARD,
        "d00dfeed77",
        "5.1.1",
        None,
        "no mailbox here",
    ),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_fixture_gives_one_correlated_bounce(name: str) -> None:
    recipient, kind, command_id, status, code, diagnostic = CASES[name]
    (bounce,) = parse_bounce((FIXTURES / name).read_bytes(), verp_domain=VERP)
    assert bounce.recipient == recipient
    assert bounce.bounce_type is kind
    assert bounce.command_id == command_id
    assert bounce.status == status
    assert bounce.smtp_code == code
    assert bounce.diagnostic is not None and diagnostic in bounce.diagnostic


def test_message_id_found_in_report_when_no_verp() -> None:
    (bounce,) = parse_bounce((FIXTURES / "rfc3464_hard_511.eml").read_bytes())
    assert bounce.message_id == message_id_for("a1b2c3d4e5f6", "example.com")


def test_verp_wins_when_configured_and_message_id_is_kept() -> None:
    (bounce,) = parse_bounce((FIXTURES / "qmail.eml").read_bytes(), verp_domain=VERP)
    assert (bounce.command_id, bounce.message_id) == (
        "d00dfeed77",
        "mailtap.d00dfeed77@example.com",
    )


def test_verp_of_another_domain_is_ignored() -> None:
    raw = (
        (FIXTURES / "rfc3464_soft_422.eml")
        .read_bytes()
        .replace(b"<mailtap.b0a7c0de1234@example.com>", b"<other@example.com>")
    )
    (bounce,) = parse_bounce(raw, verp_domain="elsewhere.example")
    assert bounce.command_id is None


def test_foreign_bounce_is_uncorrelated() -> None:
    raw = (FIXTURES / "postfix.eml").read_bytes().replace(b"mailtap.c0c0a5e5", b"someone-else.1")
    (bounce,) = parse_bounce(raw)
    assert (bounce.recipient, bounce.command_id) == ("ghost@example.org", None)


def test_ordinary_mail_is_not_a_bounce() -> None:
    raw = (
        b"From: alice@example.org\r\nTo: support@example.com\r\nSubject: Re: Order 42\r\n"
        b"In-Reply-To: <mailtap.a1b2c3d4e5f6@example.com>\r\n\r\nThanks, that helped.\r\n"
    )
    assert parse_bounce(raw) == []


@pytest.mark.parametrize("name", sorted(CASES))
def test_bounce_event_is_a_valid_delivery_event(name: str) -> None:
    (bounce,) = parse_bounce((FIXTURES / name).read_bytes(), verp_domain=VERP)
    event = bounce_event(bounce, datetime(2026, 11, 29, tzinfo=UTC))
    serde = AvroSerde.for_schema("DeliveryEvent")
    decoded = serde.decode(serde.encode(event, "mail.delivery"))
    recipient, kind, command_id, status, code, _ = CASES[name]
    assert decoded["status"] == "BOUNCED"
    assert (decoded["command_id"], decoded["recipient"], decoded["bounce_type"]) == (
        command_id,
        recipient,
        kind.value,
    )
    assert (decoded["enhanced_status"], decoded["smtp_code"]) == (status, code)
