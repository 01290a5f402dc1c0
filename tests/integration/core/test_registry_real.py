"""The Confluent wire-format path of the serde against a real registry (Apicurio, ccompat API).

Needs the registry built by `make registry` (mailtap/dev/registry.py); skipped otherwise. Most
tests need no Kafka (what is under test is the serde's conversation with the registry); the end
to end one writes every topic's records through the real broker and reads them back with the
stock readers: confluent-kafka's AvroDeserializer and Java Avro.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import signal
import struct
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

import pytest
import yaml
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.schema_registry import SchemaRegistryClient
from confluent_kafka.schema_registry.avro import AvroDeserializer
from confluent_kafka.serialization import MessageField, SerializationContext

from connectors.core.avro import registry as schemaregistry
from connectors.core.avro.errors import RegistryNotAnswering
from connectors.core.avro.schemas import TOPIC_SCHEMAS, parse_order, schemas_dir
from connectors.core.avro.serde import CONFLUENT_MAGIC, AnyAvroDecoder, AvroSerde
from connectors.core.config import KafkaSettings, TopicNames, load_config
from connectors.core.errors import ConfigError
from connectors.core.kafka.clients import consumer_config, producer_config
from connectors.core.kafka.topics import ensure_topics
from connectors.imap.source import ImapSource
from connectors.smtp.config import SmtpSinkSettings
from connectors.smtp.sink import SmtpSink
from mailtap.dev import DevServices, registry
from mailtap.dev.layout import REPO_ROOT as REPO
from mailtap.dev.tcp_proxy import TcpProxy
from streams.testing import mail_record
from tests.integration.core.java_avro import AVRO_VERSIONS, run_checker
from tests.unit.core.contract_samples import SAMPLES, TOPICS

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


def test_after_a_topics_first_record_the_compiled_writer_frames_the_serializers_bytes(
    registry_url: str, unique: str
) -> None:
    """The serializer writes a topic's first record; once the compiled writer's body was seen
    to be the same, it writes the next ones behind the same header, byte for byte what the
    serializer writes (connectors/core/avro/writer.py)."""
    from connectors.core.mail import parse_mail

    topic = f"mail.events.{unique}"
    kafka = KafkaSettings(bootstrap_servers="unused:9092", schema_registry_url=registry_url)

    def event(subject: str) -> dict:
        raw = f"Message-ID: <{subject}@example.com>\r\nSubject: {subject}\r\n\r\nhi\r\n"
        source = {"kind": "IMAP", "folder": "INBOX", "uidvalidity": 7, "uid": 42}
        parsed = parse_mail(
            raw.encode(),
            account="demo",
            source=source,
            flags=[],
            internal_date=NOW,
            observed_at=NOW,
        )
        return dict(parsed.event)

    serde = AvroSerde.for_schema("MailEvent", kafka)
    first = serde.encode(event("first"), topic)

    def no_serializer(*_args: object) -> bytes:
        raise AssertionError("the serializer was asked again")

    serde._serializer = no_serializer
    second = serde.encode(event("second"), topic)
    reference = AvroSerde.for_schema("MailEvent", kafka).encode(event("second"), topic)
    assert second == reference and second[:5] == first[:5]
    assert serde.decode(second, topic)["subject"] == "second"


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


def registry_kafka(url: str, **overrides: object) -> KafkaSettings:
    return KafkaSettings.model_validate(
        {"bootstrap_servers": "unused:9092", "schema_registry_url": url, **overrides}
    )


@pytest.mark.parametrize("name", TOPIC_SCHEMAS)
def test_each_schema_registers_with_the_compatibility_rule_and_the_key_schema(
    registry_url: str, unique: str, name: str
) -> None:
    """Before: Apicurio answered 422 for ReplyCommand (its union default) and every subject
    stayed at NONE."""
    topic = f"{TOPICS[name]}.{unique}"
    AvroSerde.for_schema(name, registry_kafka(registry_url)).encode(SAMPLES[name](), topic)  # type: ignore[arg-type]

    for subject in (f"{topic}-key", f"{topic}-value"):
        config = get_json(f"{registry_url}/config/{subject}")
        assert config == {"compatibilityLevel": "FULL_TRANSITIVE"}, subject
    key = get_json(f"{registry_url}/subjects/{topic}-key/versions/latest")
    assert isinstance(key, dict) and json.loads(key["schema"]) == "string"


def register(url: str, subject: str, schema: str) -> int:
    request = urllib.request.Request(
        f"{url}/subjects/{subject}/versions",
        data=json.dumps({"schema": schema, "schemaType": "AVRO"}).encode(),
        headers={"Content-Type": "application/vnd.schemaregistry.v1+json"},
        method="POST",
    )
    with urllib.request.urlopen(request, timeout=30) as response:
        return int(json.load(response)["id"])


def forget_prepared_subjects() -> None:
    """What a restart of the component does: no subject prepared, no cached ids."""
    schemaregistry._prepared.clear()
    schemaregistry.forget_clients()


def test_a_subject_with_the_first_released_schema_needs_backward_transitive_once(
    registry_url: str, unique: str
) -> None:
    """A deployment that wrote mail.events with the registry before the enum defaults: its
    subject holds v1, which cannot read the new enum symbol, so FULL_TRANSITIVE refuses the new
    schema, with a sentence saying what to set; BACKWARD_TRANSITIVE accepts it."""
    topic = f"mail.events.{unique}"
    v1 = (schemas_dir() / "history" / "MailEvent.v1.avsc").read_text()
    register(registry_url, f"{topic}-value", json.dumps(json.loads(v1)))
    forget_prepared_subjects()

    with pytest.raises(ConfigError, match="BACKWARD_TRANSITIVE") as refused:
        AvroSerde.for_schema("MailEvent", registry_kafka(registry_url)).encode(mail_event(), topic)
    assert f"{topic}-value" in str(refused.value)

    kafka = registry_kafka(registry_url, schema_compatibility="BACKWARD_TRANSITIVE")
    data = AvroSerde.for_schema("MailEvent", kafka).encode(mail_event(), topic)
    assert get_json(f"{registry_url}/config/{topic}-value") == {
        "compatibilityLevel": "BACKWARD_TRANSITIVE"
    }
    assert AnyAvroDecoder(registry_url).decode(data, topic)[1]["subject"] == "Grüße 你好"


def test_records_of_every_topic_decode_with_the_stock_readers(
    registry_url: str, services: DevServices, unique: str, tmp_path: Path
) -> None:
    """Written with the registry through the real broker; read back read_committed by
    confluent-kafka's stock AvroDeserializer (the writer schema fetched by id from Apicurio's
    ccompat API, no reader schema) and by Java Avro with the schema the registry hands out."""
    kafka = KafkaSettings(
        bootstrap_servers=services.kafka.bootstrap_servers, schema_registry_url=registry_url
    )
    topics = {name: f"{TOPICS[name]}.{unique}" for name in TOPIC_SCHEMAS}
    producer = Producer(producer_config(kafka))
    for name, topic in topics.items():
        value = AvroSerde.for_schema(name, kafka).encode(SAMPLES[name](), topic)  # type: ignore[arg-type]
        producer.produce(topic, key=name.encode(), value=value)
    assert producer.flush(30) == 0

    consumer = Consumer(consumer_config(kafka, f"registry-e2e-{unique}"))
    consumer.subscribe(list(topics.values()))
    received: dict[str, bytes] = {}
    try:
        deadline = time.monotonic() + 60
        while len(received) < len(topics) and time.monotonic() < deadline:
            msg = consumer.poll(1.0)
            if msg is not None and msg.error() is None:
                received[msg.key().decode()] = msg.value()
    finally:
        consumer.close()
    assert set(received) == set(TOPIC_SCHEMAS)

    stock = AvroDeserializer(SchemaRegistryClient({"url": registry_url}))
    records = []
    for name, data in received.items():
        assert data[:1] == CONFLUENT_MAGIC
        value = stock(data, SerializationContext(topics[name], MessageField.VALUE))
        assert value == SAMPLES[name](), name
        schema_id = struct.unpack(">I", data[1:5])[0]
        writer = get_json(f"{registry_url}/schemas/ids/{schema_id}")
        assert isinstance(writer, dict)
        (tmp_path / f"{name}.writer.avsc").write_text(writer["schema"])
        (tmp_path / f"{name}.confluent.bin").write_bytes(data)
        records.append(
            {
                "label": name,
                "schema": name,
                "encoding": "confluent",
                "data": str(tmp_path / f"{name}.confluent.bin"),
                "writer": str(tmp_path / f"{name}.writer.avsc"),
            }
        )

    java = run_checker(
        AVRO_VERSIONS[-1],
        {
            "parse_order": [str(p) for p in parse_order()],
            "topics": list(TOPIC_SCHEMAS),
            "history": [],
            "invalid": [],
            "compat": [],
            "records": records,
        },
        tmp_path,
    )
    for name in TOPIC_SCHEMAS:
        decoded = java["records"][name]
        assert decoded["writer_fingerprint_equal"] and decoded["body_reencoded_equal"], name
    assert java["records"]["MailEvent"]["value"]["subject"] == "Grüße 你好"
    assert java["records"]["DeliveryEvent"]["value"]["status"] == "BOUNCED"


def readme_python_snippet() -> str:
    """The Python block of schemas/README.md's consumer guide, verbatim."""
    text = (schemas_dir() / "README.md").read_text()
    after = text.split("Python, with the registry", 1)[1]
    return after.split("```python\n", 1)[1].split("```", 1)[0]


def test_the_consumer_guide_python_snippet_reads_committed_events_and_tombstones(
    registry_url: str, services: DevServices, unique: str
) -> None:
    kafka = KafkaSettings(
        bootstrap_servers=services.kafka.bootstrap_servers, schema_registry_url=registry_url
    )
    topic = f"mail.events.{unique}"
    serde = AvroSerde.for_schema("MailEvent", kafka)
    kept, aborted = mail_event(), dict(mail_event(), key="demo/mid:aborted@example.com")
    producer = Producer(producer_config(kafka, transactional_id=f"guide-{unique}"))
    producer.init_transactions(30)
    producer.begin_transaction()  # a batch a crashed source never committed
    producer.produce(topic, key=aborted["key"].encode(), value=serde.encode(aborted, topic))
    producer.flush(30)
    producer.abort_transaction(30)
    producer.begin_transaction()
    producer.produce(topic, key=kept["key"].encode(), value=serde.encode(kept, topic))
    producer.produce(topic, key=b"demo/mid:gone@example.com", value=None)
    producer.commit_transaction(30)

    namespace: dict[str, object] = {}
    exec(readme_python_snippet(), namespace)
    seen: list[tuple[str, object]] = []

    def handle(key: str, event: object) -> bool:
        seen.append((key, event))
        return len(seen) < 2  # the two keys may sit on two partitions: any order

    namespace["read_mail_events"](  # type: ignore[operator]
        services.kafka.bootstrap_servers,
        registry_url,
        f"guide-{unique}",
        handle,
        topic,
        reader_schema_path=str(schemas_dir() / "MailEvent.avsc"),
    )

    got = dict(seen)
    assert sorted(got) == sorted([kept["key"], "demo/mid:gone@example.com"])  # not the aborted
    event = got[kept["key"]]
    assert isinstance(event, dict)
    assert event["subject"] == "Grüße 你好" and event["change"] == "ADDED"
    assert got["demo/mid:gone@example.com"] is None


def test_the_streams_worker_with_a_registry_answers_a_mail(
    registry_url: str, services: DevServices, unique: str, tmp_path: Path
) -> None:
    """The issue's symptom: with a registry the streams worker crashed at its first command
    (Apicurio refused ReplyCommand) and nothing reached mail.commands."""
    names = {f: f"{getattr(TopicNames(), f)}.{unique}" for f in TopicNames.model_fields}
    kafka = KafkaSettings(
        bootstrap_servers=services.kafka.bootstrap_servers,
        schema_registry_url=registry_url,
        topics=TopicNames(**names),
        partitions=1,
    )
    ensure_topics(kafka, retry_tiers=[])
    config = tmp_path / "mailtap.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "kafka": {
                    "bootstrap_servers": kafka.bootstrap_servers,
                    "schema_registry_url": registry_url,
                    "topics": kafka.topics.model_dump(),
                },
                "claim_check": {"url": (tmp_path / "claims").as_uri()},
                "streams": {
                    "app_id": f"mailtap-streams-{unique}",
                    "data_dir": str(tmp_path / "faust"),
                    "from_address": {"name": "Helpdesk", "address": "help@example.com"},
                    "auth_policy": "none",
                    "rules": [
                        {"match": {"recipient": "support@example.com"}, "workflow": "ticket_intake"}
                    ],
                },
            }
        )
    )
    # Now: older mail is not answered (streams.max_reply_age).
    mail = mail_record(message_id=f"t-{unique}@example.com", observed_at=dt.datetime.now(dt.UTC))
    producer = Producer(producer_config(kafka))
    events = kafka.topics.events
    producer.produce(
        events, key=mail["key"], value=AvroSerde.for_schema("MailEvent", kafka).encode(mail, events)
    )
    assert producer.flush(30) == 0

    log = tmp_path / "worker.log"
    with log.open("wb") as out:
        worker = subprocess.Popen(
            [
                sys.executable,
                "-c",
                "import sys; from mailtap.commands.streams import "
                "run_streams; run_streams(sys.argv[1])",
                str(config),
            ],
            cwd=REPO,
            env={**os.environ, "PYTHONPATH": str(REPO)},
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    consumer = Consumer(consumer_config(kafka, f"streams-registry-{unique}"))
    consumer.subscribe([kafka.topics.commands])
    stock = AvroDeserializer(SchemaRegistryClient({"url": registry_url}))
    command = None
    try:
        deadline = time.monotonic() + 180  # a hang guard: group join and table recovery
        while command is None:
            assert worker.poll() is None, log.read_text(errors="replace")[-3000:]
            assert time.monotonic() < deadline, log.read_text(errors="replace")[-3000:]
            msg = consumer.poll(0.5)
            if msg is not None and msg.error() is None:
                ctx = SerializationContext(kafka.topics.commands, MessageField.VALUE)
                command = stock(msg.value(), ctx)
    finally:
        consumer.close()
        os.killpg(worker.pid, signal.SIGTERM)
        try:
            worker.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(worker.pid, signal.SIGKILL)
            worker.wait(timeout=30)

    assert command["event_key"] == mail["key"] and command["workflow"] == "ticket_intake"
    assert command["auto_submitted"] == "auto-replied"
    assert command["to"] == [{"name": None, "address": "ann@example.com"}]
    compat = get_json(f"{registry_url}/config/{kafka.topics.commands}-value")
    assert compat == {"compatibilityLevel": "FULL_TRANSITIVE"}


def test_the_imap_source_and_the_smtp_sink_refuse_a_registry_at_start(
    registry_url: str, services: DevServices, unique: str, tmp_path: Path
) -> None:
    """A registry that refuses the schemas stops each component at start with the sentence,
    before it reads a mailbox or a command. Before: both started and would have failed at their
    first write (the source inside its first transaction)."""
    names = {f: f"{getattr(TopicNames(), f)}.{unique}" for f in TopicNames.model_fields}
    history = schemas_dir() / "history"
    for field, name in (("events", "MailEvent"), ("delivery", "DeliveryEvent")):
        v1 = json.loads((history / f"{name}.v1.avsc").read_text())
        register(registry_url, f"{names[field]}-value", json.dumps(v1))
    forget_prepared_subjects()
    path = tmp_path / "mailtap.yaml"
    path.write_text(
        yaml.safe_dump(
            {
                "kafka": {
                    "bootstrap_servers": services.kafka.bootstrap_servers,
                    "schema_registry_url": registry_url,
                    "topics": names,
                },
                "claim_check": {"url": (tmp_path / "claims").as_uri()},
                "imap": {
                    "accounts": [
                        {
                            "name": f"a-{unique}",
                            "host": services.imap.host,
                            "port": services.imap.port,
                            "security": "plain",
                            "username": f"nobody-{unique}@example.com",
                            "password": "unused",
                        }
                    ]
                },
                "smtp": {
                    "host": services.smtp.host,
                    "port": services.smtp.port,
                    "security": "plain",
                    "from_address": "mailtap@example.com",
                    "group_id": f"sink-{unique}",
                    "state_topic": f"mailtap.sink.state.{unique}",
                },
            }
        )
    )
    config = load_config(path)

    source = ImapSource.from_config(config)
    try:
        with pytest.raises(ConfigError, match="BACKWARD_TRANSITIVE") as refused:
            source.prepare()
        assert f"{names['events']}-value" in str(refused.value)
    finally:
        source.stop()
    # start() lets the mailboxes start while the schema registers (the first FETCH does not
    # wait for it) but returns only with the registry's answer: the refusal stops the source
    # there, closed, before any transaction; nothing reached the events topic.
    started = ImapSource.from_config(config)
    with pytest.raises(ConfigError, match="BACKWARD_TRANSITIVE"):
        started.start()
    assert not started.started.is_set() and started.health_port is None
    consumer = Consumer(consumer_config(config.kafka, f"check-{unique}"))
    try:
        events = consumer.list_topics(names["events"], timeout=30).topics[names["events"]]
        written = [
            consumer.get_watermark_offsets(TopicPartition(names["events"], p), timeout=30)[1]
            for p in events.partitions
        ]
    finally:
        consumer.close()
    assert written and sum(written) == 0

    sink = SmtpSink(config, config.section("smtp", SmtpSinkSettings))
    with pytest.raises(ConfigError, match="BACKWARD_TRANSITIVE") as refused:
        sink.start()
    assert f"{names['delivery']}-value" in str(refused.value)


def test_a_component_started_while_the_registry_does_not_answer_waits_for_it(
    registry_url: str, unique: str
) -> None:
    """A start during a registry outage waits for the registry (with a warning each try), up
    to its bound, instead of exiting with "cannot reach": found by `mailtap soak`, where sinks
    and sources restarted in a registry-down fault exited 1. Past the bound it still fails
    with the sentence naming the setting."""
    target = urlsplit(registry_url)
    with TcpProxy(target.hostname or "127.0.0.1", target.port or 80) as proxy:
        proxied = registry_url.replace(
            f"{target.hostname}:{target.port}", f"127.0.0.1:{proxy.port}"
        )
        serde = AvroSerde.for_schema("DeliveryEvent", registry_kafka(proxied))
        proxy.refuse = True  # every connection closed at once, as by a registry restarting
        with pytest.raises(RegistryNotAnswering, match="cannot reach the schema registry"):
            serde.prepare(f"mail.delivery.gone.{unique}", wait_s=1.5)

        topic = f"mail.delivery.back.{unique}"
        threading.Timer(3.0, lambda: setattr(proxy, "refuse", False)).start()
        started = time.monotonic()
        serde.prepare(topic)
        assert time.monotonic() - started >= 2.5
    latest = get_json(f"{registry_url}/subjects/{topic}-value/versions/latest")
    assert isinstance(latest, dict) and json.loads(latest["schema"])["name"] == "DeliveryEvent"
