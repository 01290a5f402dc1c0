"""Shared helpers for the mail normalizer tests: parse a mail, and hold every event to the
Avro contract (validation plus a binary round trip through schemas/MailEvent.avsc)."""

from __future__ import annotations

import io
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import fastavro
import pytest
from fastavro.validation import validate

from connectors.core.mail import ParsedMail, parse_mail

REPO = Path(__file__).resolve().parents[3]
CORPUS = REPO / "tests" / "fixtures" / "mail"
OBSERVED_AT = datetime(2025, 1, 10, 12, 0, 0, tzinfo=UTC)


@pytest.fixture(scope="session")
def mail_schema() -> Any:
    # The assembled schema: MailEvent.avsc names io.mailtap.v1.Address, defined in its own file.
    return fastavro.schema.load_schema(str(REPO / "schemas" / "MailEvent.avsc"))


def assert_valid_event(event: dict[str, Any], schema: Any) -> dict[str, Any]:
    """Validate and round-trip; returns the decoded record."""
    validate(event, schema, raise_errors=True)
    buffer = io.BytesIO()
    fastavro.schemaless_writer(buffer, schema, event)
    buffer.seek(0)
    decoded: dict[str, Any] = fastavro.schemaless_reader(buffer, schema, schema)  # type: ignore[assignment]
    for name in ("key", "subject", "text_body", "html_body", "attachments", "to", "from"):
        assert decoded[name] == event[name], name
    return decoded


@pytest.fixture(scope="session")
def parse(mail_schema: Any) -> Callable[..., ParsedMail]:
    """``parse(raw, **overrides)``: parse_mail with test defaults; the event is validated."""

    def run(raw: bytes, **overrides: Any) -> ParsedMail:
        kwargs: dict[str, Any] = {
            "account": "ops",
            "source": {"kind": "IMAP", "folder": "INBOX", "uidvalidity": 7, "uid": 42},
            "flags": ["\\Seen"],
            "internal_date": datetime(2025, 1, 10, 11, 59, tzinfo=UTC),
            "observed_at": OBSERVED_AT,
        }
        kwargs.update(overrides)
        mail = parse_mail(raw, **kwargs)
        assert_valid_event(mail.event, mail_schema)
        assert mail.event["key"] == mail.key
        assert mail.event["parse_error"] == mail.parse_error
        return mail

    return run


@pytest.fixture
def corpus() -> Callable[[str], bytes]:
    return lambda name: (CORPUS / name).read_bytes()
