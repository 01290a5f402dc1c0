"""The consumer guide of schemas/README.md as another team runs it (issue 27 item 7): its own
principal (``other-team-reader``, SCRAM over TLS) with Read on the events topic and on its
groups only, the registry's Confluent wire format, the guide's Python blocks executed verbatim.

- A record written by a *newer* mailtap (a ``ChangeKind`` symbol this reader's schema lacks)
  reaches ``handle`` never: with the reader schema it decodes as ``UNRECOGNIZED``, which the
  guide skips. (Decoded with the writer's schema, it would arrive as the new symbol.)
- The replay recipe reads from an offset and from a time, and needs no more ACLs.
"""

from __future__ import annotations

import copy
import json
import time
from typing import Any

import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import AclOperation, AdminClient, ResourceType  # type: ignore[attr-defined]
from confluent_kafka.schema_registry import SchemaRegistryClient
from confluent_kafka.schema_registry.avro import AvroSerializer
from confluent_kafka.serialization import MessageField, SerializationContext
from fastavro import schema as fastavro_schema

from connectors.core.avro.schemas import schemas_dir
from connectors.core.avro.serde import AvroSerde
from connectors.core.config import KafkaSettings
from mailtap.dev import DevServices
from mailtap.dev.secure import SecureKafka
from tests.integration.core.test_registry_real import mail_event
from tests.integration.secure.conftest import KafkaSettingsFor, allow, create_topic, grant

READER = "other-team-reader"
READER_SCHEMA = str(schemas_dir() / "MailEvent.avsc")


def guide_block(heading: str) -> str:
    """The first Python block after ``heading`` in schemas/README.md, verbatim."""
    text = (schemas_dir() / "README.md").read_text()
    return text.split(heading, 1)[1].split("```python\n", 1)[1].split("```", 1)[0]


def newer_mail_event_schema() -> dict[str, Any]:
    """MailEvent as a later mailtap might write it: ChangeKind with a symbol added before
    UNRECOGNIZED (how schemas/README.md says enums grow)."""
    schema = copy.deepcopy(fastavro_schema.load_schema(READER_SCHEMA, _write_hint=False))
    for field in schema["fields"]:
        if field["name"] == "change":
            symbols = field["type"]["symbols"]
            symbols.insert(symbols.index("UNRECOGNIZED"), "MOVED_TO_ARCHIVE")
    return schema


@pytest.fixture
def registry_url(services: DevServices) -> str:
    assert services.registry is not None, "the session's services run without a registry"
    return services.registry.url


def test_another_team_reads_mail_events_with_the_guide_and_a_reader_schema(
    secure_kafka: SecureKafka,
    kafka_settings: KafkaSettingsFor,
    admin: AdminClient,
    registry_url: str,
    unique: str,
) -> None:
    topic = f"mail.events.guide-{unique}"
    group = f"other-team-{unique}"
    create_topic(admin, topic, partitions=1)
    grant(
        admin,
        allow(READER, ResourceType.TOPIC, topic, AclOperation.READ)
        + allow(READER, ResourceType.GROUP, group, AclOperation.READ)
        + allow(READER, ResourceType.GROUP, "replay", AclOperation.READ),
    )
    writer = KafkaSettings(
        bootstrap_servers=secure_kafka.admin_bootstrap, schema_registry_url=registry_url
    )
    current = mail_event()
    newer = {**mail_event(), "key": "demo/mid:newer@example.com", "change": "MOVED_TO_ARCHIVE"}
    newer_value = AvroSerializer(
        SchemaRegistryClient({"url": registry_url}),
        json.dumps(newer_mail_event_schema()),
        conf={"auto.register.schemas": True},
    )(newer, SerializationContext(topic, MessageField.VALUE))
    producer = Producer({"bootstrap.servers": secure_kafka.admin_bootstrap})
    before = int(time.time() * 1000)
    producer.produce(
        topic,
        key=current["key"].encode(),
        value=AvroSerde.for_schema("MailEvent", writer).encode(current, topic),
    )
    producer.produce(topic, key=newer["key"].encode(), value=newer_value)
    time.sleep(0.05)  # the last record a clearly later timestamp than the first two
    after = int(time.time() * 1000)
    producer.produce(topic, key=b"demo/mid:gone@example.com", value=None)
    assert producer.flush(30) == 0

    reader = kafka_settings("other-team", "scram-sha-512")
    assert reader.sasl_password is not None
    # The other team's own client settings, as they would write them (no mailtap code).
    security = {
        "security.protocol": "SASL_SSL",
        "sasl.mechanism": "SCRAM-SHA-512",
        "sasl.username": reader.sasl_username,
        "sasl.password": reader.sasl_password.get_secret_value(),
        "ssl.ca.location": reader.ssl_ca_location,
    }
    bootstrap = reader.bootstrap_servers

    guide: dict[str, Any] = {}
    exec(guide_block("Python, with the registry"), guide)
    seen: list[tuple[str, Any]] = []

    def handle(key: str, event: Any) -> bool:
        seen.append((key, event))
        return len(seen) < 2

    guide["read_mail_events"](
        bootstrap,
        registry_url,
        group,
        handle,
        topic,
        reader_schema_path=READER_SCHEMA,
        security=security,
    )
    got = dict(seen)
    # The newer record was decoded as UNRECOGNIZED and skipped: handle saw the other two.
    assert list(got) == [current["key"], "demo/mid:gone@example.com"]
    assert got[current["key"]]["subject"] == "Grüße 你好"
    assert got["demo/mid:gone@example.com"] is None
    decode = guide["mail_event_reader"](registry_url, READER_SCHEMA)
    assert decode(newer_value, SerializationContext(topic, MessageField.VALUE))["change"] == (
        "UNRECOGNIZED"
    )

    exec(guide_block("Replay, Python"), guide)
    from_offset = list(guide["replay"](bootstrap, topic, offset=1, security=security))
    assert [(p, o) for p, o, _, _ in from_offset] == [(0, 1), (0, 2)]
    from_time = list(guide["replay"](bootstrap, topic, since_ms=after, security=security))
    assert [k for _, _, k, _ in from_time] == [b"demo/mid:gone@example.com"]
    everything = list(guide["replay"](bootstrap, topic, since_ms=before, security=security))
    assert len(everything) == 3
