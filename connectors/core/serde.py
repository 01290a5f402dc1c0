"""Avro values for every mailtap topic.

Two encodings, chosen by configuration (DESIGN.md, "Topics"):

- With ``kafka.schema_registry_url``: the Confluent wire format (``0x00`` + 4-byte schema id +
  Avro binary), subjects ``<topic>-value`` (TopicNameStrategy, set explicitly: confluent-kafka 2.16's
  default asks the registry's ``/associations`` endpoint first), so stock Java/Go deserializers read it.
- Without one (the local default): Avro single-object encoding from the Avro spec
  (``0xC3 0x01`` + 8-byte little-endian CRC-64-AVRO fingerprint of the parsing canonical form +
  Avro binary). No server is needed; a reader finds the writer schema by fingerprint.

Wire sample (single-object, WorkflowEvent)::

    c3 01 | 8 bytes fingerprint | 02 0a 54 2d 31 ...   (schema_version=1, instance_id="T-1"...)

:meth:`AvroSerde.decode` accepts both encodings, so a topic can move from one to the other.
"""

from __future__ import annotations

import io
import json
import os
import struct
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any, Literal

import fastavro
from fastavro.schema import fingerprint, to_parsing_canonical_form

from connectors.core.config import KafkaSettings
from connectors.core.errors import DataError

SchemaName = Literal["MailEvent", "ReplyCommand", "DeliveryEvent", "WorkflowEvent"]

SINGLE_OBJECT_MAGIC = b"\xc3\x01"
CONFLUENT_MAGIC = b"\x00"
SCHEMAS_DIR_ENV = "MAILTAP_SCHEMAS_DIR"


def schemas_dir() -> Path:
    """The folder of ``*.avsc`` files: ``$MAILTAP_SCHEMAS_DIR`` or the repository's ``schemas/``."""
    override = os.environ.get(SCHEMAS_DIR_ENV)
    return Path(override) if override else Path(__file__).resolve().parents[2] / "schemas"


@dataclass(frozen=True)
class LoadedSchema:
    name: str
    raw: dict[str, Any]
    parsed: Any
    fingerprint: bytes


@cache
def load_schema(name: str, path: Path | None = None) -> LoadedSchema:
    """Parse a schema once (fastavro advice); separate ``named_schemas`` per schema and version."""
    file = path or schemas_dir() / f"{name}.avsc"
    raw = json.loads(file.read_text(encoding="utf-8"))
    parsed = fastavro.parse_schema(raw, named_schemas={})
    canonical = to_parsing_canonical_form(parsed)
    return LoadedSchema(name, raw, parsed, bytes.fromhex(fingerprint(canonical, "CRC-64-AVRO")))


def _record_unions(raw: dict[str, Any]) -> tuple[tuple[str, str], ...]:
    """Top-level fields typed ``["null", <a record>]``: (field, the record's full name)."""
    namespace = raw.get("namespace", "")
    found = []
    for field in raw.get("fields", []):
        branches = field["type"] if isinstance(field["type"], list) else []
        records = [b for b in branches if isinstance(b, dict) and b.get("type") == "record"]
        if len(branches) == 2 and "null" in branches and len(records) == 1:
            name = records[0]["name"]
            space = records[0].get("namespace", namespace)
            found.append((field["name"], name if "." in name or not space else f"{space}.{name}"))
    return tuple(found)


@cache
def _known_writers() -> dict[bytes, LoadedSchema]:
    """Every schema version we can read: ``schemas/*.avsc`` and ``schemas/history/*.avsc``."""
    found: dict[bytes, LoadedSchema] = {}
    root = schemas_dir()
    for file in sorted([*root.glob("*.avsc"), *root.glob("history/*.avsc")]):
        loaded = load_schema(file.stem, file)
        found[loaded.fingerprint] = loaded
    return found


@cache
def _registry_client(url: str) -> Any:
    """One client per registry URL and process: its schema-id cache is shared by every serde."""
    from confluent_kafka.schema_registry import SchemaRegistryClient

    return SchemaRegistryClient.new_client({"url": url})


class AvroSerde:
    """Encode and decode one record type.

    >>> serde = AvroSerde(load_schema("WorkflowEvent"))
    >>> import datetime as dt
    >>> value = {"instance_id": "T-1", "workflow": "ticket_intake", "status": "OPENED",
    ...          "occurred_at": dt.datetime(2026, 1, 1, tzinfo=dt.timezone.utc)}
    >>> serde.decode(serde.encode(value, "mail.workflow"))["instance_id"]
    'T-1'
    """

    def __init__(self, schema: LoadedSchema, registry_url: str | None = None) -> None:
        self.schema = schema
        self._registry_url = registry_url
        self._record_unions = _record_unions(schema.raw)
        self._serializer: Any = None
        self._deserializer: Any = None
        if registry_url:
            self._init_registry(registry_url)

    @classmethod
    def for_schema(cls, name: SchemaName, kafka: KafkaSettings | None = None) -> AvroSerde:
        return cls(load_schema(name), kafka.schema_registry_url if kafka else None)

    def _init_registry(self, url: str) -> None:
        try:
            from confluent_kafka.schema_registry import topic_subject_name_strategy
            from confluent_kafka.schema_registry.avro import AvroDeserializer, AvroSerializer
        except ImportError as exc:  # pragma: no cover - depends on the install
            raise ImportError(
                "a schema registry is configured but confluent-kafka's registry support is "
                "missing: pip install 'confluent-kafka[avro,schemaregistry]'"
            ) from exc
        client = _registry_client(url)
        schema_str = json.dumps(self.schema.raw)
        self._serializer = AvroSerializer(
            client,
            schema_str,
            conf={
                "auto.register.schemas": True,
                "subject.name.strategy": topic_subject_name_strategy,
            },
        )
        self._deserializer = AvroDeserializer(
            client, schema_str, conf={"subject.name.strategy": topic_subject_name_strategy}
        )

    def encode(self, value: dict[str, Any], topic: str) -> bytes:
        if self._record_unions:
            value = self._with_branches(value)
        if self._serializer is not None:
            from confluent_kafka.serialization import MessageField, SerializationContext

            ctx = SerializationContext(topic, MessageField.VALUE)
            out: bytes = self._serializer(value, ctx)
            return out
        buf = io.BytesIO()
        buf.write(SINGLE_OBJECT_MAGIC)
        buf.write(self.schema.fingerprint)
        fastavro.schemaless_writer(buf, self.schema.parsed, value)
        return buf.getvalue()

    def _with_branches(self, value: dict[str, Any]) -> dict[str, Any]:
        """Name the branch of each top-level ``["null", record]`` union (fastavro's tuple
        notation): the same bytes, without fastavro trying the record against each branch
        (a fifth of a MailEvent's encoding time)."""
        hinted = None
        for field, name in self._record_unions:
            datum = value.get(field)
            if isinstance(datum, dict):
                hinted = hinted if hinted is not None else dict(value)
                hinted[field] = (name, datum)
        return hinted if hinted is not None else value

    def decode(self, data: bytes, topic: str = "") -> dict[str, Any]:
        """Decode either encoding into a dict of the current (reader) schema."""
        if data[:2] == SINGLE_OBJECT_MAGIC:
            writer = _known_writers().get(data[2:10])
            if writer is None:
                raise DataError(
                    f"unknown schema fingerprint {data[2:10].hex()} for {self.schema.name}: "
                    f"the writer used a schema this build does not know"
                )
            result: dict[str, Any] = fastavro.schemaless_reader(  # type: ignore[assignment]
                io.BytesIO(data[10:]), writer.parsed, self.schema.parsed
            )
            return result
        if data[:1] == CONFLUENT_MAGIC and len(data) > 5:
            if self._deserializer is None:
                raise DataError(
                    f"record is in Confluent wire format (schema id "
                    f"{struct.unpack('>I', data[1:5])[0]}) but kafka.schema_registry_url is unset"
                )
            from confluent_kafka.serialization import MessageField, SerializationContext

            ctx = SerializationContext(topic, MessageField.VALUE)
            decoded: dict[str, Any] = self._deserializer(data, ctx)
            return decoded
        raise DataError(f"not an Avro record of a known encoding (first bytes {data[:4].hex()})")


class AnyAvroDecoder:
    """Decodes a value of any mailtap schema, with the writer's own schema (for tools and people).

    Single-object records are resolved by fingerprint; Confluent-framed ones through the registry.
    """

    def __init__(self, registry_url: str | None = None) -> None:
        self._registry_url = registry_url
        self._deserializer: Any = None

    def decode(self, data: bytes, topic: str = "") -> tuple[str, dict[str, Any]]:
        """Return ``(schema name, record)``."""
        if data[:2] == SINGLE_OBJECT_MAGIC:
            writer = _known_writers().get(data[2:10])
            if writer is None:
                raise DataError(f"unknown schema fingerprint {data[2:10].hex()}")
            record: dict[str, Any] = fastavro.schemaless_reader(  # type: ignore[assignment]
                io.BytesIO(data[10:]), writer.parsed, None
            )
            return writer.raw["name"], record
        if data[:1] == CONFLUENT_MAGIC and len(data) > 5 and self._registry_url:
            if self._deserializer is None:
                from confluent_kafka.schema_registry.avro import AvroDeserializer

                self._deserializer = AvroDeserializer(_registry_client(self._registry_url))
            from confluent_kafka.serialization import MessageField, SerializationContext

            decoded: dict[str, Any] = self._deserializer(
                data, SerializationContext(topic, MessageField.VALUE)
            )
            return "confluent", decoded
        raise DataError(f"not an Avro record of a known encoding (first bytes {data[:4].hex()})")
