import datetime as dt
import io
import json

import fastavro
import pytest

from connectors.core.avro.serde import (
    CONFLUENT_MAGIC,
    SINGLE_OBJECT_MAGIC,
    TOPIC_SCHEMAS,
    AnyAvroDecoder,
    AvroSerde,
    load_schema,
    schemas_dir,
)
from connectors.core.config import KafkaSettings
from connectors.core.errors import DataError

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


def test_every_schema_parses_and_has_namespace_and_version() -> None:
    for name in TOPIC_SCHEMAS:
        raw = load_schema(name).raw
        assert raw["namespace"] == "io.mailtap.v1"
        assert raw["fields"][0]["name"] == "schema_version"
        fastavro.parse_schema(raw, named_schemas={})


def test_single_object_encoding_round_trip() -> None:
    serde = AvroSerde.for_schema("MailEvent")
    data = serde.encode(mail_event(), "mail.events")
    assert data[:2] == SINGLE_OBJECT_MAGIC
    assert data[2:10] == load_schema("MailEvent").fingerprint
    back = serde.decode(data)
    assert back["subject"] == "Grüße 你好"
    assert back["from"] == {"name": "Zoë", "address": "zoe@example.com"}
    assert back["date"] == NOW
    assert back["references"] == [] and back["schema_version"] == 1


def test_fingerprint_matches_the_avro_spec_rabin_for_a_known_schema() -> None:
    # From the Avro spec test vectors (Java SchemaNormalization): "int" -> 0x7275d51a3f395c8f,
    # stored little-endian in single-object encoding.
    from fastavro.schema import fingerprint

    assert fingerprint('"int"', "CRC-64-AVRO") == bytes.fromhex("7275d51a3f395c8f")[::-1].hex()


def test_confluent_wire_format_with_mock_registry() -> None:
    kafka = KafkaSettings(bootstrap_servers="a:1", schema_registry_url="mock://serde-test")
    serde = AvroSerde.for_schema("MailEvent", kafka)
    data = serde.encode(mail_event(), "mail.events")
    assert data[:1] == CONFLUENT_MAGIC
    assert serde.decode(data, "mail.events")["key"] == "demo/mid:abc@example.com"
    # A registry-less reader of the same topic gets a clear error, not garbage.
    with pytest.raises(DataError, match="schema_registry_url is unset"):
        AvroSerde.for_schema("MailEvent").decode(data)
    _name, record = AnyAvroDecoder("mock://serde-test").decode(data, "mail.events")
    assert record["subject"] == "Grüße 你好"


def test_any_decoder_names_the_schema() -> None:
    data = AvroSerde.for_schema("MailEvent").encode(mail_event(), "mail.events")
    name, record = AnyAvroDecoder().decode(data)
    assert name == "MailEvent" and record["account"] == "demo"


def test_garbage_is_a_data_error() -> None:
    with pytest.raises(DataError):
        AvroSerde.for_schema("MailEvent").decode(b"\xc3\x01" + b"\x00" * 8 + b"x")
    with pytest.raises(DataError):
        AvroSerde.for_schema("MailEvent").decode(b"hello")


def test_reader_fills_defaults_for_fields_a_writer_did_not_have(tmp_path, monkeypatch) -> None:
    """BACKWARD compatibility: a v1 reader decodes records of an older writer with fewer fields."""
    raw = json.loads((schemas_dir() / "WorkflowEvent.avsc").read_text())
    older = dict(raw, fields=[f for f in raw["fields"] if f["name"] != "attributes"])
    (tmp_path / "history").mkdir()
    for f in schemas_dir().glob("*.avsc"):
        (tmp_path / f.name).write_text(f.read_text())
    (tmp_path / "history" / "WorkflowEvent.v0.avsc").write_text(json.dumps(older))
    monkeypatch.setenv("MAILTAP_SCHEMAS_DIR", str(tmp_path))
    from connectors.core.avro import schemas as schemas_module

    schemas_module.known_writers.cache_clear()
    try:
        old_writer = schemas_module.load_schema(
            "WorkflowEvent.v0", tmp_path / "history" / "WorkflowEvent.v0.avsc"
        )
        old = AvroSerde(old_writer)
        data = old.encode(
            {"instance_id": "T-1", "workflow": "w", "status": "S", "occurred_at": NOW}, "t"
        )
        current = AvroSerde(
            schemas_module.load_schema("WorkflowEvent", tmp_path / "WorkflowEvent.avsc")
        )
        assert current.decode(data)["attributes"] == {}
    finally:
        schemas_module.known_writers.cache_clear()


@pytest.mark.parametrize("with_records", [True, False])
def test_named_union_branches_encode_the_same_bytes_as_plain_fastavro(with_records: bool) -> None:
    serde = AvroSerde(load_schema("MailEvent"))
    event = mail_event()
    blob = {"uri": "file:///b/pack/1.pack#offset=0&size=3&sha256=" + "0" * 64, "size": 3}
    event["raw_ref"] = {**blob, "sha256": "0" * 64} if with_records else None
    if not with_records:
        event["from"] = None
    plain = io.BytesIO()
    fastavro.schemaless_writer(plain, serde.schema.parsed, event)
    encoded = serde.encode(event, "mail.events")
    assert encoded[10:] == plain.getvalue()
    assert serde.decode(encoded)["from"] == event["from"]
    assert serde._record_unions == (
        ("from", "io.mailtap.v1.Address"),
        ("raw_ref", "io.mailtap.v1.BlobRef"),
    )
    assert isinstance(event["from"], dict | None)  # the caller's dict is left alone


@pytest.mark.parametrize(
    ("name", "path"),
    [("MailEvent", ("source", "kind")), ("MailEvent", ("change",)), ("DeliveryEvent", ("status",))],
)
def test_a_writer_cannot_write_the_readers_placeholder_symbol(name, path) -> None:
    from tests.unit.core.contract_samples import SAMPLES

    record = SAMPLES[name]()
    target = record
    for part in path[:-1]:
        target = target[part]
    target[path[-1]] = "UNRECOGNIZED"
    with pytest.raises(DataError, match=rf"{name}\.{'.'.join(path)}: UNRECOGNIZED"):
        AvroSerde.for_schema(name).encode(record, "t")


def test_with_a_registry_the_key_schema_is_registered_under_topic_key() -> None:
    from connectors.core.avro.registry import registry_client

    kafka = KafkaSettings(bootstrap_servers="a:1", schema_registry_url="mock://serde-key-test")
    AvroSerde.for_schema("WorkflowEvent", kafka).encode(
        {"instance_id": "T-1", "workflow": "w", "status": "S", "occurred_at": NOW}, "mail.workflow"
    )
    client = registry_client("mock://serde-key-test")
    assert client.get_latest_version("mail.workflow-key").schema.schema_str == '"string"'
    value = client.get_latest_version("mail.workflow-value").schema.schema_str
    assert json.loads(value)["name"] == "WorkflowEvent"


@pytest.mark.parametrize("name", TOPIC_SCHEMAS)
def test_records_written_with_the_first_release_decode_with_todays_serde(name) -> None:
    """What sits on the topics from before the upgrade: single-object records of v1, found by
    their fingerprint in schemas/history/."""
    from tests.unit.core.contract_samples import SAMPLES

    path = schemas_dir() / "history" / f"{name}.v1.avsc"
    v1 = load_schema(f"{name}.v1", path)
    v1_fields = {f["name"] for f in json.loads(path.read_text())["fields"]}
    written = {k: v for k, v in SAMPLES[name]().items() if k in v1_fields}
    # Fields added since v1 are all optional: today's reader fills in their null default.
    expected = {k: (v if k in v1_fields else None) for k, v in SAMPLES[name]().items()}
    data = AvroSerde(v1).encode(written, "t")
    assert AvroSerde.for_schema(name).decode(data) == expected
    assert AnyAvroDecoder().decode(data)[1] == written  # tools decode with the writer's schema


def confluent_framed(name: str) -> bytes:
    from tests.unit.core.contract_samples import SAMPLES

    body = io.BytesIO()
    fastavro.schemaless_writer(body, load_schema(name).parsed, SAMPLES[name]())
    return b"\x00\x00\x00\x00\x07" + body.getvalue()


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (b"\xc3\x01" + b"\x00" * 8 + b"\x02", "single-object"),
        (confluent_framed("MailEvent"), "confluent"),
        (confluent_framed("WorkflowEvent"), "confluent"),
        (b"\x00not avro at all", None),  # a dead letter's bytes: 0x00 alone proves nothing
        (confluent_framed("MailEvent")[:-3], None),
        (None, None),
        (b"", None),
        (b'{"json": 1}', None),
    ],
)
def test_the_framing_of_a_value(value, expected) -> None:
    from connectors.core.kafka.encoding import encoding_of

    assert encoding_of(value) == expected


def test_one_shared_serde_per_schema_and_registry_in_a_process() -> None:
    kafka = KafkaSettings(bootstrap_servers="k:9092")
    events = AvroSerde.shared("MailEvent", kafka)
    assert AvroSerde.shared("MailEvent", kafka.model_copy()) is events
    assert AvroSerde.shared("DeliveryEvent", kafka) is not events
    other = kafka.model_copy(update={"schema_registry_url": "mock://shared-serde-test"})
    assert AvroSerde.shared("MailEvent", other) is not events


def test_a_registry_that_does_not_answer_is_unavailable_not_bad_data() -> None:
    """The record is fine; the registry is down (a closed port): callers must retry it later,
    never skip it as undecodable (found by `mailtap soak`, see connectors/smtp/suppression.py)."""
    import socket

    from connectors.core.errors import RegistryUnavailable, classify

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # closed again when the block ends: connection refused
    serde = AvroSerde(load_schema("Suppression"), f"http://127.0.0.1:{port}")
    record = b"\x00" + (7).to_bytes(4, "big") + b"\x02"
    with pytest.raises(RegistryUnavailable, match="registry did not answer") as raised:
        serde.decode(record, "mail.suppressions")
    assert classify(raised.value).value == "retry"


def test_a_registry_that_does_not_answer_while_encoding_is_unavailable_not_a_config_error() -> None:
    """At run time a registry outage is transient: a writer retries (a ConfigError would make
    the IMAP source dead-letter the mail, and back off to the cap as for a bad setting)."""
    import socket

    from connectors.core.errors import ConfigError, RegistryUnavailable, classify

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # closed again when the block ends: connection refused
    serde = AvroSerde(load_schema("MailEvent"), f"http://127.0.0.1:{port}")
    with pytest.raises(RegistryUnavailable, match="cannot reach the schema registry") as raised:
        serde.encode(mail_event(), "mail.events")
    assert not isinstance(raised.value, ConfigError)
    assert classify(raised.value).value == "retry"


def test_a_stop_ends_the_start_up_wait_for_a_registry_that_does_not_answer() -> None:
    """SIGTERM during the wait (the handler calls request_stop) stops it at once, not after
    REGISTRY_START_WAIT_S; without the stop, the wait would end in RegistryNotAnswering."""
    import socket
    import threading

    from connectors.core import stopping
    from connectors.core.errors import StopRequested

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # closed again when the block ends: connection refused
    serde = AvroSerde(load_schema("DeliveryEvent"), f"http://127.0.0.1:{port}")
    timer = threading.Timer(0.5, stopping.request_stop)
    timer.start()
    try:
        with pytest.raises(StopRequested, match="schema registry"):
            serde.prepare("mail.delivery.stopping", wait_s=120)
    finally:
        timer.cancel()
        stopping.STOP.clear()


def _counting_deserializer(serde: AvroSerde) -> list[bytes]:
    calls: list[bytes] = []
    deserialize = serde._deserializer

    def counted(data: bytes, ctx: object) -> dict:
        calls.append(data)
        return deserialize(data, ctx)

    serde._deserializer = counted
    return calls


def test_confluent_records_of_our_schema_are_read_without_the_deserializer() -> None:
    """Once the registry's schema of an id was seen to be ours (no rules), its records are read
    with fastavro directly (issue 29): the same dict as the deserializer's."""
    kafka = KafkaSettings(bootstrap_servers="a:1", schema_registry_url="mock://serde-fast-test")
    serde = AvroSerde.for_schema("MailEvent", kafka)
    data = serde.encode(mail_event(), "mail.events")
    other = dict(mail_event(), subject="second")
    second = serde.encode(other, "mail.events")
    calls = _counting_deserializer(serde)
    first = serde.decode(data, "mail.events")
    assert serde.decode(data, "mail.events") == first
    assert serde.decode(second, "mail.events")["subject"] == "second"
    assert calls == [data]


def test_confluent_records_of_a_schema_text_not_ours_stay_with_the_deserializer() -> None:
    """Same parsing canonical form, other text (a doc, a logical type): the deserializer reads
    every record of that id, as before."""
    from confluent_kafka.schema_registry import Schema

    from connectors.core.avro.registry import registry_client

    url = "mock://serde-foreign-test"
    kafka = KafkaSettings(bootstrap_servers="a:1", schema_registry_url=url)
    serde = AvroSerde.for_schema("WorkflowEvent", kafka)
    raw = dict(load_schema("WorkflowEvent").raw, doc="registered by someone else")
    schema_id = registry_client(url).register_schema(
        "mail.workflow-value", Schema(json.dumps(raw), "AVRO")
    )
    body = io.BytesIO()
    value = {"instance_id": "T-1", "workflow": "w", "status": "S", "occurred_at": NOW}
    fastavro.schemaless_writer(body, fastavro.parse_schema(raw), value)
    data = CONFLUENT_MAGIC + schema_id.to_bytes(4, "big") + body.getvalue()
    calls = _counting_deserializer(serde)
    assert serde.decode(data, "mail.workflow")["instance_id"] == "T-1"
    assert serde.decode(data, "mail.workflow")["instance_id"] == "T-1"
    assert calls == [data, data]
