"""The Confluent wire-format path of the serde against a real registry (Apicurio, ccompat API).

Needs the registry built by `make registry` (mailtap/dev/registry.py); skipped otherwise. No Kafka:
what is under test is the serde's conversation with the registry, not the broker.
"""

from __future__ import annotations

import datetime as dt
import json
import struct
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka.schema_registry import SchemaRegistryClient

from connectors.core.config import KafkaSettings
from connectors.core.serde import CONFLUENT_MAGIC, AnyAvroDecoder, AvroSerde
from mailtap.dev import registry

pytestmark = pytest.mark.skipif(
    not registry.is_installed(),
    reason=f"schema registry not built ({registry.run_jar()} missing); run `make registry`",
)

NOW = dt.datetime(2026, 11, 29, 12, 0, tzinfo=dt.UTC)


def mail_event() -> dict:
    return {
        "key": "demo/mid:abc@example.com",
        "key_kind": "MESSAGE_ID",
        "change": "ADDED",
        "account": "demo",
        "source": {"kind": "IMAP", "folder": "INBOX", "uidvalidity": 7, "uid": 42, "modseq": 9},
        "message_id": "abc@example.com",
        "from": {"name": "Zoë", "address": "zoe@example.com"},
        "to": [{"name": None, "address": "demo@example.com"}],
        "subject": "Grüße 你好",
        "date": NOW,
        "guard_headers": {"authentication_results": ["mx.example.com; dkim=pass"]},
        "observed_at": NOW,
    }


@pytest.fixture(scope="module")
def registry_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    state_dir: Path = tmp_path_factory.mktemp("registry")
    running = registry.start(state_dir)
    try:
        yield running.url
    finally:
        assert registry.stop(state_dir)


def get_json(url: str) -> object:
    with urllib.request.urlopen(url, timeout=30) as response:
        return json.load(response)


def test_mail_event_round_trips_in_confluent_wire_format(registry_url: str, unique: str) -> None:
    topic = f"mail.events.{unique}"
    serde = AvroSerde.for_schema(
        "MailEvent",
        KafkaSettings(bootstrap_servers="unused:9092", schema_registry_url=registry_url),
    )

    data = serde.encode(mail_event(), topic)

    assert data[:1] == CONFLUENT_MAGIC
    schema_id = struct.unpack(">I", data[1:5])[0]
    back = serde.decode(data, topic)
    assert back["subject"] == "Grüße 你好"
    assert back["from"] == {"name": "Zoë", "address": "zoe@example.com"}
    assert back["date"] == NOW and back["observed_at"] == NOW
    assert back["references"] == [] and back["schema_version"] == 1

    # TopicNameStrategy: the schema was registered under "<topic>-value", with the id on the wire.
    assert f"{topic}-value" in get_json(f"{registry_url}/subjects")  # type: ignore[operator]
    latest = get_json(f"{registry_url}/subjects/{topic}-value/versions/latest")
    assert isinstance(latest, dict)
    assert latest["id"] == schema_id
    assert json.loads(latest["schema"])["name"] == "MailEvent"


def test_a_reader_without_the_writer_schema_fetches_it_by_id(
    registry_url: str, unique: str
) -> None:
    topic = f"mail.events.{unique}"
    kafka = KafkaSettings(bootstrap_servers="unused:9092", schema_registry_url=registry_url)
    data = AvroSerde.for_schema("MailEvent", kafka).encode(mail_event(), topic)
    schema_id = struct.unpack(">I", data[1:5])[0]

    # A fresh client has no cache: the id must resolve on the server.
    fetched = SchemaRegistryClient({"url": registry_url}).get_schema(schema_id)
    assert json.loads(fetched.schema_str)["name"] == "MailEvent"
    name, record = AnyAvroDecoder(registry_url).decode(data, topic)
    assert name == "confluent" and record["key"] == "demo/mid:abc@example.com"


def test_the_same_schema_under_two_topics_is_one_id(registry_url: str, unique: str) -> None:
    kafka = KafkaSettings(bootstrap_servers="unused:9092", schema_registry_url=registry_url)
    serde = AvroSerde.for_schema("MailEvent", kafka)
    first = serde.encode(mail_event(), f"a.{unique}")
    second = serde.encode(mail_event(), f"b.{unique}")
    other = AvroSerde.for_schema("WorkflowEvent", kafka).encode(
        {"instance_id": "T-1", "workflow": "ticket_intake", "status": "OPENED", "occurred_at": NOW},
        f"c.{unique}",
    )

    subjects = get_json(f"{registry_url}/subjects")
    assert {f"a.{unique}-value", f"b.{unique}-value", f"c.{unique}-value"} <= set(subjects)  # type: ignore[arg-type]
    assert first[1:5] == second[1:5]
    assert other[1:5] != first[1:5]
