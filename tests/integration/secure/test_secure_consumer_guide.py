"""The consumer guide of schemas/README.md as another team runs it (issue 27 item 7): its own
principal (``other-team-reader``, SCRAM over TLS) with Read on the events topic and on its
groups only, the registry's Confluent wire format, the guide's Python and Go code run as written.

- A record written by a *newer* mailtap (a ``ChangeKind`` symbol this reader's schema lacks)
  never reaches ``handle``: with the reader schema it decodes as ``UNRECOGNIZED``, which the
  guide skips. (Decoded with the writer's schema, it would arrive as the new symbol.)
- The replay recipes read from an offset and from a time, and need no more ACLs.

The Go program is built with the machine's Go toolchain (Go 1.24+), its modules through the Go
module proxy, pinned by go_guide/go.sum; the Java one with javac against kafka-clients (the
Kafka distribution in .cache) and Apache Avro (resolved from Maven Central like the contract
tests'). Go and Java are on every machine that runs the suite: missing, the tests fail.
"""

from __future__ import annotations

import copy
import datetime as dt
import json
import os
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import (  # type: ignore[attr-defined]
    AclBinding,
    AclOperation,
    AclPermissionType,
    AdminClient,
    ResourcePatternType,
    ResourceType,
)
from confluent_kafka.schema_registry import SchemaRegistryClient
from confluent_kafka.schema_registry.avro import AvroSerializer
from confluent_kafka.serialization import MessageField, SerializationContext
from fastavro import schema as fastavro_schema

from connectors.core.avro.schemas import schemas_dir
from connectors.core.avro.serde import AvroSerde
from connectors.core.config import KafkaSettings
from mailtap.dev import DevServices, process
from mailtap.dev.layout import REPO_ROOT
from mailtap.dev.secure import SecureKafka
from tests.integration.core import java_avro
from tests.integration.core.test_go_avro import BUILD_TIMEOUT_S, go_toolchain
from tests.integration.core.test_registry_real import mail_event
from tests.integration.secure.conftest import KafkaSettingsFor, allow, create_topic, grant

READER = "other-team-reader"
READER_SCHEMA = str(schemas_dir() / "MailEvent.avsc")
GO_MODULE = Path(__file__).parent / "go_guide"
GONE = "demo/mid:gone@example.com"
RUN_TIMEOUT_S = 120


def guide_block(heading: str, language: str = "python") -> str:
    """The first ``language`` block after ``heading`` in schemas/README.md, verbatim."""
    text = (schemas_dir() / "README.md").read_text()
    return text.split(heading, 1)[1].split(f"```{language}\n", 1)[1].split("```", 1)[0]


def newer_mail_event_schema() -> dict[str, Any]:
    """MailEvent as a later mailtap might write it: ChangeKind with a symbol added before
    UNRECOGNIZED (how schemas/README.md says enums grow)."""
    schema = copy.deepcopy(fastavro_schema.load_schema(READER_SCHEMA, _write_hint=False))
    for field in schema["fields"]:
        if field["name"] == "change":
            symbols = field["type"]["symbols"]
            symbols.insert(symbols.index("UNRECOGNIZED"), "MOVED_TO_ARCHIVE")
    return schema


@dataclass(frozen=True)
class GuideTopic:
    """A topic holding, at offsets 0, 1, 2: a current MailEvent, one by a newer writer, a
    tombstone (written ``after`` epoch ms, the first two before it)."""

    name: str
    group_prefix: str
    current: dict[str, Any]
    newer_value: bytes
    before: int
    after: int
    registry_url: str
    reader: KafkaSettings


@pytest.fixture
def guide_topic(
    services: DevServices,
    secure_kafka: SecureKafka,
    kafka_settings: KafkaSettingsFor,
    admin: AdminClient,
    unique: str,
) -> GuideTopic:
    assert services.registry is not None, "the session's services run without a registry"
    registry_url = services.registry.url
    topic = f"mail.events.guide-{unique}"
    group_prefix = f"other-team-{unique}"
    create_topic(admin, topic, partitions=1)
    grant(
        admin,
        [
            *allow(READER, ResourceType.TOPIC, topic, AclOperation.READ),
            AclBinding(
                ResourceType.GROUP,
                group_prefix,
                ResourcePatternType.PREFIXED,
                f"User:{READER}",
                "*",
                AclOperation.READ,
                AclPermissionType.ALLOW,
            ),
        ],
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
    assert newer_value is not None
    producer = Producer({"bootstrap.servers": secure_kafka.admin_bootstrap})
    before = int(time.time() * 1000)
    current_value = AvroSerde.for_schema("MailEvent", writer).encode(current, topic)
    producer.produce(topic, key=current["key"].encode(), value=current_value)
    producer.produce(topic, key=newer["key"].encode(), value=newer_value)
    assert producer.flush(30) == 0
    time.sleep(0.05)  # the tombstone a clearly later timestamp than the first two
    after = int(time.time() * 1000)
    producer.produce(topic, key=GONE.encode(), value=None)
    assert producer.flush(30) == 0
    reader = kafka_settings("other-team", "scram-sha-512")
    return GuideTopic(
        topic, group_prefix, current, newer_value, before, after, registry_url, reader
    )


def librdkafka_login(reader: KafkaSettings) -> dict[str, Any]:
    """The other team's own client settings, as they would write them (no mailtap code)."""
    assert reader.sasl_password is not None
    return {
        "security.protocol": "SASL_SSL",
        "sasl.mechanism": "SCRAM-SHA-512",
        "sasl.username": reader.sasl_username,
        "sasl.password": reader.sasl_password.get_secret_value(),
        "ssl.ca.location": reader.ssl_ca_location,
    }


def test_another_team_reads_mail_events_with_the_python_guide(guide_topic: GuideTopic) -> None:
    t = guide_topic
    security = librdkafka_login(t.reader)
    bootstrap = t.reader.bootstrap_servers
    guide: dict[str, Any] = {}
    exec(guide_block("Python, with the registry"), guide)
    seen: list[tuple[str, Any]] = []

    def handle(key: str, event: Any) -> bool:
        seen.append((key, event))
        return len(seen) < 2

    guide["read_mail_events"](
        bootstrap,
        t.registry_url,
        f"{t.group_prefix}-py",
        handle,
        t.name,
        reader_schema_path=READER_SCHEMA,
        security=security,
    )
    got = dict(seen)
    # The newer record was decoded as UNRECOGNIZED and skipped: handle saw the other two.
    assert list(got) == [t.current["key"], GONE]
    assert got[t.current["key"]]["subject"] == "Grüße 你好"
    assert got[GONE] is None
    decode = guide["mail_event_reader"](t.registry_url, READER_SCHEMA)
    newer = decode(t.newer_value, SerializationContext(t.name, MessageField.VALUE))
    assert newer["change"] == "UNRECOGNIZED"

    exec(guide_block("Replay, Python"), guide)

    def replay(**start: int) -> list[tuple[int, int, bytes, bytes | None]]:
        group = f"{t.group_prefix}-replay"
        return list(guide["replay"](bootstrap, t.name, group_id=group, security=security, **start))

    assert [(p, o) for p, o, _, _ in replay(offset=1)] == [(0, 1), (0, 2)]
    assert [k for _, _, k, _ in replay(since_ms=t.after)] == [GONE.encode()]
    assert len(replay(since_ms=t.before)) == 3


def go_guide(work: Path) -> Path:
    """The guide's Go program, built from the README's block with go_guide/go.mod and go.sum."""
    go = go_toolchain()
    assert go is not None, "no Go toolchain (go on PATH or /usr/local/go): the suite needs Go"
    for name in ("go.mod", "go.sum"):
        (work / name).write_bytes((GO_MODULE / name).read_bytes())
    (work / "main.go").write_text(guide_block("Go, with the registry", "go"))
    binary = work / "guide"
    subprocess.run(
        [go, "build", "-o", str(binary), "."],
        cwd=work,
        env={**os.environ, "GOTOOLCHAIN": "local", "GOFLAGS": "-mod=readonly"},
        check=True,
        capture_output=True,
        timeout=BUILD_TIMEOUT_S,
    )
    return binary


def run_go(binary: Path, t: GuideTopic, group: str, records: int, **env: str) -> list[dict]:
    assert t.reader.sasl_password is not None
    done = subprocess.run(
        [str(binary)],
        env={
            **os.environ,
            "BOOTSTRAP": t.reader.bootstrap_servers,
            "KAFKA_USER": str(t.reader.sasl_username),
            "KAFKA_PASSWORD": t.reader.sasl_password.get_secret_value(),
            "CA_FILE": str(t.reader.ssl_ca_location),
            "REGISTRY_URL": t.registry_url,
            "SCHEMAS": str(schemas_dir()),
            "TOPIC": t.name,
            "GROUP": f"{t.group_prefix}-{group}",
            "MAX_RECORDS": str(records),
            **env,
        },
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT_S,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return [json.loads(line) for line in done.stdout.splitlines()]


def test_another_team_reads_mail_events_with_the_go_guide(
    guide_topic: GuideTopic, tmp_path: Path
) -> None:
    t = guide_topic
    binary = go_guide(tmp_path)
    lines = run_go(binary, t, "go", 2)
    # Offset 1 (the newer writer's) decoded as UNRECOGNIZED and skipped.
    assert [(r["offset"], r["key"], r.get("change")) for r in lines] == [
        (0, t.current["key"], "ADDED"),
        (2, GONE, None),
    ]
    assert lines[0]["subject"] == "Grüße 你好"

    from_offset = run_go(binary, t, "go-offset", 1, FROM_OFFSET="1")
    assert [r["offset"] for r in from_offset] == [2]
    since = dt.datetime.fromtimestamp(t.after / 1000, dt.UTC).isoformat(timespec="milliseconds")
    from_time = run_go(binary, t, "go-time", 1, FROM_TIME=since.replace("+00:00", "Z"))
    assert [r["key"] for r in from_time] == [GONE]


def java_guide(work: Path) -> str:
    """The guide's Java class compiled from the README's block; returns its classpath."""
    avro = java_avro.resolve(java_avro.AVRO_VERSIONS[-1])
    classpath = f"{work}:{avro}/*:{REPO_ROOT / '.cache' / 'kafka' / 'libs'}/*"
    source = work / "MailEventsReader.java"
    source.write_text(guide_block("Java without Confluent's serdes", "java"))
    javac = Path(process.java("consumer guide")).with_name("javac")
    subprocess.run(
        [str(javac), "-nowarn", "-cp", classpath, "-d", str(work), str(source)],
        check=True,
        capture_output=True,
        timeout=java_avro.RUN_TIMEOUT_S,
    )
    return classpath


def run_java(classpath: str, t: GuideTopic, group: str, records: int, **env: str) -> list[dict]:
    assert t.reader.sasl_password is not None
    done = subprocess.run(
        [process.java("consumer guide"), "-Xmx256m", "-cp", classpath, "MailEventsReader"],
        env={
            **os.environ,
            "BOOTSTRAP": t.reader.bootstrap_servers,
            "KAFKA_USER": str(t.reader.sasl_username),
            "KAFKA_PASSWORD": t.reader.sasl_password.get_secret_value(),
            "CA_FILE": str(t.reader.ssl_ca_location),
            "REGISTRY_URL": t.registry_url,
            "SCHEMAS": str(schemas_dir()),
            "TOPIC": t.name,
            "GROUP": f"{t.group_prefix}-{group}",
            "MAX_RECORDS": str(records),
            **env,
        },
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT_S,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    return [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]


def test_another_team_reads_mail_events_with_the_java_guide(
    guide_topic: GuideTopic, tmp_path: Path
) -> None:
    t = guide_topic
    classpath = java_guide(tmp_path)
    lines = run_java(classpath, t, "java", 2)
    # Offset 1 (the newer writer's) decoded as UNRECOGNIZED and skipped.
    assert [(r["offset"], r["key"], r.get("change")) for r in lines] == [
        (0, t.current["key"], "ADDED"),
        (2, GONE, None),
    ]
    assert lines[0]["subject"] == "Grüße 你好"
    from_offset = run_java(classpath, t, "java-offset", 1, FROM_OFFSET="1")
    assert [r["offset"] for r in from_offset] == [2]
    since = dt.datetime.fromtimestamp(t.after / 1000, dt.UTC).isoformat(timespec="milliseconds")
    from_time = run_java(classpath, t, "java-time", 1, FROM_TIME=since.replace("+00:00", "Z"))
    assert [r["key"] for r in from_time] == [GONE]
