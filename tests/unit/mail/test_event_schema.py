"""The typed event (connectors/core/mail/event.py) and schemas/MailEvent.avsc say the same thing:
each record of the schema has a TypedDict of its name whose keys are the record's fields, all
required, each typed as its Avro type reads in Python."""

from __future__ import annotations

import types
from datetime import UTC, datetime
from typing import Literal, TypedDict, get_args, get_type_hints

import pytest

from connectors.core.avro.schemas import load_schema
from connectors.core.mail import event as mail_event
from connectors.core.mail import parse_mail
from tests.support.avro_types import drift

pytestmark = pytest.mark.unit


def test_mail_event_types_match_the_schema() -> None:
    assert drift(load_schema("MailEvent").raw, mail_event) == []


def test_guard_header_names_are_the_single_header_fields() -> None:
    hints = get_type_hints(mail_event.GuardHeaders)
    single = {name for name, hint in hints.items() if hint == str | None}
    assert (
        set(get_args(mail_event.GuardHeaderName))
        == single
        == set(hints) - {"authentication_results"}
    )


def test_every_record_of_the_schema_is_checked() -> None:
    # The assembled schema inlines the shared Address: the check reaches every nested record.
    checked = {"MailEvent", "SourceCoordinates", "Address", "Attachment", "BlobRef", "GuardHeaders"}
    fake = types.ModuleType("empty")
    problems = drift(load_schema("MailEvent").raw, fake)
    assert {problem.partition(":")[0].rpartition(".")[2] for problem in problems} == checked


def _drifted(**changes: object) -> types.ModuleType:
    """A copy of the event module with some TypedDicts replaced."""
    module = types.ModuleType("drifted")
    module.__dict__.update(vars(mail_event))
    module.__dict__.update(changes)
    return module


def test_a_missing_field_is_drift() -> None:
    class Address(TypedDict):
        address: str

    problems = drift(load_schema("MailEvent").raw, _drifted(Address=Address))
    assert "Address: keys differ from the schema's fields: missing ['name'], extra []" in problems


def test_a_field_of_another_type_is_drift() -> None:
    class BlobRef(TypedDict):
        uri: str
        sha256: str
        size: str  # long in the schema

    problems = drift(load_schema("MailEvent").raw, _drifted(BlobRef=BlobRef))
    assert "BlobRef.size: Avro long is <class 'int'>, not <class 'str'>" in problems


def test_a_nullable_field_typed_without_none_is_drift() -> None:
    class Attachment(TypedDict):
        filename: str
        content_type: str
        size: int
        sha256: str
        uri: str | None

    problems = drift(load_schema("MailEvent").raw, _drifted(Attachment=Attachment))
    assert "Attachment.filename" in [p.partition(":")[0] for p in problems]


def test_an_enum_missing_a_symbol_is_drift_and_str_is_accepted() -> None:
    class Narrow(TypedDict):
        kind: Literal["IMAP", "EWS"]
        folder: str
        uidvalidity: int | None
        uid: int | None
        modseq: int | None
        item_id: str | None
        change_key: str | None

    narrow = drift(load_schema("MailEvent").raw, _drifted(SourceCoordinates=Narrow))
    assert "SourceCoordinates.kind" in [p.partition(":")[0] for p in narrow]

    class Loose(TypedDict):
        kind: str
        folder: str
        uidvalidity: int | None
        uid: int | None
        modseq: int | None
        item_id: str | None
        change_key: str | None

    loose = drift(load_schema("MailEvent").raw, _drifted(SourceCoordinates=Loose))
    # Only MailEvent.source, which names the real SourceCoordinates, not this stand-in.
    assert [p.partition(":")[0] for p in loose] == ["MailEvent.source"]


def test_an_optional_key_is_drift() -> None:
    class BlobRef(TypedDict, total=False):
        uri: str
        sha256: str
        size: int

    problems = drift(load_schema("MailEvent").raw, _drifted(BlobRef=BlobRef))
    assert "BlobRef: not every field is required: ['sha256', 'size', 'uri']" in problems


def test_the_parser_fills_exactly_the_typed_keys() -> None:
    # At run time the event is a plain dict: its keys are the TypedDict's, nested ones too.
    raw = (
        b"Message-ID: <1@example.com>\r\nFrom: Ann <ann@example.com>\r\nTo: b@example.com\r\n"
        b"Content-Type: multipart/mixed; boundary=b\r\n\r\n--b\r\nContent-Type: text/plain\r\n\r\n"
        b"hi\r\n--b\r\nContent-Type: application/pdf\r\nContent-Disposition: attachment; "
        b"filename=a.pdf\r\n\r\n%PDF\r\n--b--\r\n"
    )
    event = parse_mail(
        raw,
        account="ops",
        source={"kind": "IMAP", "folder": "INBOX", "uidvalidity": 1, "uid": 7},
        flags=[],
        internal_date=None,
        observed_at=datetime(2026, 1, 1, tzinfo=UTC),
    ).event
    assert set(event) == set(mail_event.MailEvent.__required_keys__)
    assert set(event["source"]) == set(mail_event.SourceCoordinates.__required_keys__)
    assert event["from"] is not None
    assert set(event["from"]) == set(mail_event.Address.__required_keys__)
    assert set(event["attachments"][0]) == set(mail_event.Attachment.__required_keys__)
    assert set(event["guard_headers"]) == set(mail_event.GuardHeaders.__required_keys__)
