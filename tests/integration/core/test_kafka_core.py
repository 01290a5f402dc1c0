"""The core's Kafka path against the real broker: topics, Avro through Kafka, transactions, offsets."""

from __future__ import annotations

import datetime as dt
import json
import uuid
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner
from confluent_kafka import Consumer, Producer, TopicPartition

from connectors.core.avro.serde import AvroSerde
from connectors.core.config import KafkaSettings, TopicNames
from connectors.core.kafka.clients import consumer_config, producer_config
from connectors.core.kafka.errors import FencedError
from connectors.core.kafka.offsets import OffsetStore, canonical_json
from connectors.core.kafka.topics import ensure_topics
from connectors.core.kafka.transactions import SourceRecord, TransactionalSourceWriter
from mailtap.cli import main

NOW = dt.datetime(2026, 11, 29, 12, 0, tzinfo=dt.UTC)


@pytest.fixture
def kafka(services, unique) -> KafkaSettings:
    names = {f: f"{getattr(TopicNames(), f)}.{unique}" for f in TopicNames.model_fields}
    settings = KafkaSettings(
        bootstrap_servers=services.kafka.bootstrap_servers, topics=TopicNames(**names), partitions=2
    )
    ensure_topics(settings, retry_tiers=["1m"])
    return settings


def read_all(kafka: KafkaSettings, topic: str, isolation: str = "read_committed") -> list:
    consumer = Consumer(
        consumer_config(
            kafka,
            group_id=f"t-{uuid.uuid4().hex[:6]}",
            isolation_level=isolation,
            enable_partition_eof=True,
        )
    )
    parts = consumer.list_topics(topic, timeout=10).topics[topic].partitions
    consumer.assign([TopicPartition(topic, p, 0) for p in parts])
    out, eof = [], set()
    while eof != set(parts):
        msg = consumer.poll(5)
        assert msg is not None, f"no end of partition seen on {topic}"
        if msg.error():
            eof.add(msg.partition())
            continue
        out.append(msg)
    consumer.close()
    return out


def mail_event(key: str) -> dict:
    return {
        "key": key,
        "key_kind": "MESSAGE_ID",
        "account": "demo",
        "source": {"kind": "IMAP", "folder": "INBOX", "uidvalidity": 1, "uid": 1},
        "subject": "Bestellung Nr. 5 — 你好",
        "guard_headers": {},
        "observed_at": NOW,
    }


def test_ensure_topics_is_idempotent_and_compacts_where_designed(services, unique) -> None:
    names = {f: f"{getattr(TopicNames(), f)}.x{unique}" for f in TopicNames.model_fields}
    settings = KafkaSettings(
        bootstrap_servers=services.kafka.bootstrap_servers, topics=TopicNames(**names)
    )
    first = ensure_topics(settings, retry_tiers=["5m", "1h"])
    assert set(first.values()) == {"created"} and len(first) == 11  # 9 + 2 retry tiers
    assert set(ensure_topics(settings, retry_tiers=["5m", "1h"]).values()) == {"ok"}
    from confluent_kafka.admin import AdminClient, ConfigResource

    admin = AdminClient({"bootstrap.servers": settings.bootstrap_servers})
    res = ConfigResource(ConfigResource.Type.TOPIC, settings.topics.events)
    entries = admin.describe_configs([res])[res].result()
    assert entries["cleanup.policy"].value == "compact"


def test_avro_mail_event_through_kafka(kafka: KafkaSettings) -> None:
    serde = AvroSerde.for_schema("MailEvent", kafka)
    producer = Producer(producer_config(kafka))
    producer.produce(
        kafka.topics.events,
        key=b"demo/mid:a@x",
        value=serde.encode(mail_event("demo/mid:a@x"), kafka.topics.events),
    )
    assert producer.flush(10) == 0
    [msg] = read_all(kafka, kafka.topics.events)
    decoded = serde.decode(msg.value())
    assert msg.key() == b"demo/mid:a@x"
    assert decoded["subject"] == "Bestellung Nr. 5 — 你好"
    assert decoded["source"]["folder"] == "INBOX"


def test_transaction_writes_events_and_offsets_atomically(kafka: KafkaSettings) -> None:
    serde = AvroSerde.for_schema("MailEvent", kafka)
    partition = {"source": "imap", "account": "demo", "folder": "INBOX"}
    writer = TransactionalSourceWriter(kafka, f"test-{uuid.uuid4().hex[:8]}")
    records = [
        SourceRecord(kafka.topics.events, f"k{i}".encode(), serde.encode(mail_event(f"k{i}"), ""))
        for i in range(5)
    ]
    writer.write(records, [(partition, {"uidvalidity": 1, "last_uid": 5})])
    writer.write(records[:1], [(partition, {"uidvalidity": 1, "last_uid": 6})])
    assert len(read_all(kafka, kafka.topics.events)) == 6
    assert OffsetStore(kafka).read(partition) == {"uidvalidity": 1, "last_uid": 6}
    assert canonical_json(partition) in OffsetStore(kafka).read_all()


def test_second_instance_fences_the_first_and_nothing_leaks(kafka: KafkaSettings) -> None:
    txn = f"fence-{uuid.uuid4().hex[:8]}"
    partition = {"source": "imap", "account": "demo", "folder": "INBOX"}
    first = TransactionalSourceWriter(kafka, txn)
    first.write([SourceRecord(kafka.topics.events, b"a", b"1")], [(partition, {"last_uid": 1})])
    second = TransactionalSourceWriter(kafka, txn)
    with pytest.raises(FencedError):
        first.write([SourceRecord(kafka.topics.events, b"b", b"2")], [(partition, {"last_uid": 2})])
    second.write([SourceRecord(kafka.topics.events, b"c", b"3")], [(partition, {"last_uid": 3})])
    keys = [m.key() for m in read_all(kafka, kafka.topics.events)]
    assert sorted(keys) == [b"a", b"c"]
    assert OffsetStore(kafka).read(partition) == {"last_uid": 3}


def test_open_transaction_of_a_crashed_writer_is_aborted_by_its_successor(
    kafka: KafkaSettings,
) -> None:
    """A writer that produced but never committed (kill -9) leaves nothing visible."""
    txn = f"crash-{uuid.uuid4().hex[:8]}"
    producer = Producer(producer_config(kafka, transactional_id=txn))
    producer.init_transactions(30)
    producer.begin_transaction()
    producer.produce(kafka.topics.events, key=b"lost", value=b"x")
    producer.flush(10)  # on the broker, inside an open transaction; then "crash"
    successor = TransactionalSourceWriter(kafka, txn)
    successor.write([SourceRecord(kafka.topics.events, b"kept", b"y")], [])
    assert [m.key() for m in read_all(kafka, kafka.topics.events)] == [b"kept"]
    assert sorted(m.key() for m in read_all(kafka, kafka.topics.events, "read_uncommitted")) == [
        b"kept",
        b"lost",
    ]


def test_consume_cli_prints_decoded_json(kafka: KafkaSettings, tmp_path: Path) -> None:
    serde = AvroSerde.for_schema("MailEvent", kafka)
    producer = Producer(producer_config(kafka))
    producer.produce(
        kafka.topics.events, key=b"demo/mid:c@x", value=serde.encode(mail_event("demo/mid:c@x"), "")
    )
    producer.produce(kafka.topics.events, key=b"demo/mid:c@x", value=None)
    producer.flush(10)
    config = tmp_path / "m.yaml"
    config.write_text(yaml.safe_dump({"kafka": json.loads(kafka.model_dump_json())}))
    result = CliRunner().invoke(
        main, ["consume", kafka.topics.events, "-c", str(config), "--from-beginning"]
    )
    assert result.exit_code == 0, result.output
    lines = [json.loads(line) for line in result.output.splitlines()]
    assert lines[0]["schema"] == "MailEvent"
    assert lines[0]["value"]["subject"] == "Bestellung Nr. 5 — 你好"
    assert lines[1]["tombstone"] is True


def test_topics_ensure_cli(kafka: KafkaSettings, tmp_path: Path) -> None:
    config = tmp_path / "m.yaml"
    config.write_text(yaml.safe_dump({"kafka": json.loads(kafka.model_dump_json())}))
    result = CliRunner().invoke(main, ["topics", "ensure", "-c", str(config), "--json"])
    assert result.exit_code == 0, result.output
    state = json.loads(result.stdout)
    assert state[kafka.topics.events] == "ok"
    assert state[f"{kafka.topics.retry_prefix}.4h"] == "created"


@pytest.mark.parametrize("enabled", [True, False], ids=["tracing-on", "tracing-off"])
def test_writer_starts_one_trace_per_mail_event_when_tracing_is_on(
    kafka: KafkaSettings, enabled: bool
) -> None:
    """The IMAP and the EWS source both write through this writer (issue 13 item 6)."""
    kafka = KafkaSettings.model_validate({**kafka.model_dump(), "tracing": {"enabled": enabled}})
    serde = AvroSerde.for_schema("MailEvent", kafka)
    partition = {"source": "imap", "account": "demo", "folder": "INBOX"}
    writer = TransactionalSourceWriter(kafka, f"trace-{uuid.uuid4().hex[:8]}")
    source_header = ("mailtap.source.kind", b"IMAP")
    records = [
        SourceRecord(kafka.topics.events, f"k{i}".encode(), serde.encode(mail_event(f"k{i}"), ""))
        for i in range(3)
    ]
    records.append(SourceRecord(kafka.topics.events, b"gone", None))  # a tombstone
    records.append(SourceRecord(kafka.topics.dlq, b"k0", b"raw", (source_header,)))
    writer.write(records, [(partition, {"last_uid": 3})])

    def traces(topic: str) -> dict[bytes, str | None]:
        out = {}
        for msg in read_all(kafka, topic):
            headers = dict(msg.headers() or [])
            parent = headers.get("traceparent")
            out[msg.key()] = parent.decode().split("-")[1] if parent else None
        return out

    events = traces(kafka.topics.events)
    assert events[b"gone"] is None
    assert traces(kafka.topics.dlq) == {b"k0": None}
    assert all(v is None for v in traces(kafka.topics.offsets).values())
    mail = [events[k] for k in (b"k0", b"k1", b"k2")]
    if enabled:
        assert all(t is not None and len(t) == 32 for t in mail), mail
        assert len(set(mail)) == 3  # one trace per mail
    else:
        assert mail == [None, None, None]
