"""The soak verifier's rules, fed crafted records: each kind of violation is reported, named by
its rule and the key it is about, and a clean history reports nothing."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import fastavro
import pytest

from mailtap.soak.verifier import (
    Decoder,
    Ledger,
    ServerMail,
    Violation,
    command_id_of,
    final_outcomes,
    normalize_mid,
)

SCHEMAS = Path(__file__).resolve().parents[3] / "schemas"


def event(account: str, mid: str, folder: str = "INBOX", flags: tuple[str, ...] = ()) -> dict:
    return {
        "account": account,
        "message_id": mid,
        "source": {"folder": folder},
        "flags": list(flags),
    }


def command(cid: str, key: str, step: str = "ack", in_reply_to: str | None = "m1@x.example"):
    return {
        "command_id": cid,
        "event_key": key,
        "workflow": "ticket_intake",
        "step": step,
        "in_reply_to": in_reply_to,
    }


def rules(found: list[Violation]) -> list[tuple[str, str]]:
    return [(v.rule, v.subject) for v in found]


def clean_ledger() -> Ledger:
    ledger = Ledger()
    ledger.appended("a", "<m1@x.example>")
    ledger.event("a/mid:m1@x.example", event("a", "m1@x.example"))
    ledger.command(command("c1", "a/mid:m1@x.example"))
    ledger.delivery({"command_id": "c1", "status": "DEFERRED"})
    ledger.delivery({"command_id": "c1", "status": "SENT"})
    ledger.relayed_mail("<mailtap.c1@example.com>", "<m1@x.example>", ["<m1@x.example>"])
    return ledger


def test_a_clean_history_has_no_violation() -> None:
    ledger = clean_ledger()
    server = [ServerMail("a", "<m1@x.example>", "INBOX", frozenset({"\\Recent"}))]
    assert ledger.final(server, pool_size=4, disruptions=0) == []


def test_two_live_keys_for_one_mail_are_a_duplicate() -> None:
    ledger = clean_ledger()
    ledger.event("a/mid:m1@x.example#0badf00d", event("a", "m1@x.example"))
    assert rules(ledger.continuous()) == [("duplicate-key", "a/m1@x.example")]


def test_a_mail_on_the_server_without_a_key_is_missing() -> None:
    ledger = clean_ledger()
    ledger.appended("a", "m2@x.example")
    server = [
        ServerMail("a", "<m1@x.example>", "INBOX", frozenset()),
        ServerMail("a", "<m2@x.example>", "Work", frozenset()),
    ]
    assert rules(ledger.final(server)) == [("missing-key", "a/m2@x.example")]


def test_a_live_key_of_a_deleted_mail_misses_its_tombstone() -> None:
    ledger = clean_ledger()
    assert rules(ledger.final([])) == [("missing-tombstone", "a/mid:m1@x.example")]
    ledger.event("a/mid:m1@x.example", None)
    assert ledger.final([]) == []


def test_an_event_for_a_mail_never_appended_is_reported() -> None:
    ledger = clean_ledger()
    ledger.event("b/mid:ghost@x.example", event("b", "ghost@x.example"))
    assert ("unknown-mail", "b/mid:ghost@x.example") in rules(ledger.continuous())


def test_last_event_must_match_the_servers_folder_and_flags() -> None:
    ledger = clean_ledger()
    server = [ServerMail("a", "m1@x.example", "Work", frozenset({"\\Seen"}))]
    found = ledger.final(server)
    assert rules(found) == [("stale-state", "a/mid:m1@x.example")]
    assert "Work" in found[0].detail
    ledger.event("a/mid:m1@x.example", event("a", "m1@x.example", "Work", ("\\Seen",)))
    assert ledger.final(server) == []


def test_two_final_delivery_events_for_one_command() -> None:
    ledger = clean_ledger()
    ledger.delivery({"command_id": "c1", "status": "FAILED"})
    assert rules(ledger.continuous()) == [("two-final-deliveries", "c1")]


def test_a_dsn_after_sent_is_not_a_second_outcome() -> None:
    ledger = clean_ledger()
    ledger.delivery({"command_id": "c1", "status": "BOUNCED"})
    assert ledger.continuous() == []
    assert final_outcomes(["BOUNCED", "SENT"]) == ["BOUNCED", "SENT"]


def test_a_command_without_a_final_event_is_reported_at_the_end() -> None:
    ledger = clean_ledger()
    ledger.command(command("c2", "a/mid:m1@x.example", step="forward", in_reply_to=None))
    ledger.delivery({"command_id": "c2", "status": "UNKNOWN"})
    server = [ServerMail("a", "m1@x.example", "INBOX", frozenset())]
    assert rules(ledger.final(server)) == [("no-final-delivery", "c2")]


def test_a_resent_copy_needs_an_unknown_event() -> None:
    ledger = clean_ledger()
    ledger.relayed_mail("<mailtap.c1@example.com>", "<m1@x.example>", ["<m1@x.example>"])
    assert rules(ledger.continuous()) == [("extra-copy", "c1")]
    ledger.delivery({"command_id": "c1", "status": "UNKNOWN"})
    assert ledger.continuous(pool_size=4, disruptions=1) == []


def test_more_resent_copies_than_pool_size_per_disruption() -> None:
    ledger = clean_ledger()
    ledger.delivery({"command_id": "c1", "status": "UNKNOWN"})
    for _ in range(3):
        ledger.relayed_mail("<mailtap.c1@example.com>", "<m1@x.example>", ["<m1@x.example>"])
    assert rules(ledger.continuous(pool_size=2, disruptions=1)) == [("too-many-copies", "relay")]
    assert ledger.continuous(pool_size=2, disruptions=2) == []


def test_one_step_with_two_command_ids() -> None:
    ledger = clean_ledger()
    ledger.command(command("c9", "a/mid:m1@x.example"))
    ledger.delivery({"command_id": "c9", "status": "SENT"})
    found = ledger.continuous()
    assert rules(found) == [("step-twice", "a/mid:m1@x.example ticket_intake/ack")]
    assert "c1" in found[0].detail and "c9" in found[0].detail


def test_a_reply_that_does_not_name_its_mail_is_unthreaded() -> None:
    ledger = clean_ledger()
    ledger.command(command("c3", "a/mid:m1@x.example", step="answer"))
    ledger.delivery({"command_id": "c3", "status": "SENT"})
    ledger.relayed_mail("<mailtap.c3@example.com>", "<other@x.example>", ["<m1@x.example>"])
    assert rules(ledger.continuous()) == [("unthreaded", "c3")]


def test_each_violation_of_a_bad_history_is_reported_once() -> None:
    """The brief's example: duplicate key, missing tombstone, two final events, together."""
    ledger = clean_ledger()
    ledger.appended("a", "m2@x.example")
    ledger.event("a/mid:m2@x.example", event("a", "m2@x.example"))
    ledger.event("a/fp:abc", event("a", "m2@x.example"))
    ledger.delivery({"command_id": "c1", "status": "SUPPRESSED"})
    server = [ServerMail("a", "m1@x.example", "INBOX", frozenset())]
    assert sorted(rules(ledger.final(server))) == [
        ("duplicate-key", "a/m2@x.example"),
        ("missing-tombstone", "a/fp:abc"),
        ("missing-tombstone", "a/mid:m2@x.example"),
        ("two-final-deliveries", "c1"),
    ]


def test_message_ids_normalize_like_the_keys() -> None:
    assert normalize_mid(" <Abc@Example.COM> ") == "Abc@example.com"
    assert command_id_of("<mailtap.3f2a9c@example.com>") == "3f2a9c"
    assert command_id_of("<mailtap.b32.mexwe@example.com>") == "a/b"


def _encode(schema_name: str, value: dict[str, Any], framing: bytes) -> bytes:
    named: dict[str, Any] = {}
    fastavro.schema.load_schema(str(SCHEMAS / "io.mailtap.v1.Address.avsc"), named_schemas=named)
    parsed = fastavro.parse_schema(
        json.loads((SCHEMAS / f"{schema_name}.avsc").read_text()), named_schemas=named
    )
    out = io.BytesIO()
    fastavro.schemaless_writer(out, parsed, value)
    return framing + out.getvalue()


def test_decoder_reads_both_wire_formats_from_the_schema_files() -> None:
    value = {
        "schema_version": 1,
        "command_id": "c1",
        "message_id": None,
        "recipient": "x@y.example",
        "status": "SENT",
        "smtp_code": 250,
        "enhanced_status": None,
        "diagnostic": None,
        "bounce_type": None,
        "attempt": 1,
        "next_attempt_at": None,
        "workflow": None,
        "event_key": None,
        "occurred_at": 1,
    }
    decoder = Decoder(SCHEMAS)
    confluent = _encode("DeliveryEvent", value, b"\x00\x00\x00\x00\x07")
    single = _encode("DeliveryEvent", value, b"\xc3\x01" + bytes(8))
    assert decoder.decode("DeliveryEvent", confluent)["status"] == "SENT"
    assert decoder.decode("DeliveryEvent", single)["command_id"] == "c1"
    with pytest.raises(ValueError, match="framing"):
        decoder.decode("DeliveryEvent", b"\x01junk")
