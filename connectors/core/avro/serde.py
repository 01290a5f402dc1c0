"""Avro values for every mailtap topic.

Two encodings, chosen by configuration (DESIGN.md, "Topics"):

- With ``kafka.schema_registry_url``: the Confluent wire format (``0x00`` + 4-byte schema id +
  Avro binary), subjects ``<topic>-value`` (TopicNameStrategy, set explicitly: confluent-kafka 2.16's
  default asks the registry's ``/associations`` endpoint first), so stock Java/Go deserializers read it.
  Before the first write to a topic the subjects get their compatibility rule and the key schema
  (connectors.core.avro.registry).
- Without one (the local default): Avro single-object encoding from the Avro spec
  (``0xC3 0x01`` + 8-byte little-endian CRC-64-AVRO fingerprint of the parsing canonical form +
  Avro binary). No server is needed; a reader finds the writer schema by fingerprint.

Wire sample (single-object, WorkflowEvent)::

    c3 01 | 8 bytes fingerprint | 02 0a 54 2d 31 ...   (schema_version=1, instance_id="T-1"...)

:meth:`AvroSerde.decode` accepts both encodings (a reader never chokes on either), but a topic
carries one: writers check it before they start (connectors.core.kafka.encoding).
"""

from __future__ import annotations

import io
import json
import logging
import struct
import threading
import time
from collections.abc import Iterator, Mapping
from typing import Any

import fastavro
from fastavro.schema import fingerprint, to_parsing_canonical_form

from connectors.core.avro.errors import RegistryNotAnswering, UnexpectedValue
from connectors.core.avro.registry import login_refused, prepare_subjects, registry_client
from connectors.core.avro.registry_bearer import token_unavailable
from connectors.core.avro.schemas import (
    SCHEMAS_DIR_ENV,
    TOPIC_SCHEMAS,
    LoadedSchema,
    SchemaName,
    known_writers,
    load_schema,
    schemas_dir,
)
from connectors.core.avro.writer import ValueWriter, compile_writer
from connectors.core.config import (
    DEFAULT_COMPATIBILITY,
    Compatibility,
    KafkaSettings,
    SchemaRegistryClientSettings,
)
from connectors.core.errors import DataError, RegistryUnavailable, TokenEndpointUnavailable
from connectors.core.stopping import pause_unless_stopping

__all__ = [
    "CONFLUENT_MAGIC",
    "SCHEMAS_DIR_ENV",
    "SINGLE_OBJECT_MAGIC",
    "TOPIC_SCHEMAS",
    "AnyAvroDecoder",
    "AvroSerde",
    "LoadedSchema",
    "SchemaName",
    "load_schema",
    "schemas_dir",
]

SINGLE_OBJECT_MAGIC = b"\xc3\x01"
CONFLUENT_MAGIC = b"\x00"
#: The default symbol of every enum: what a reader gets for a symbol its schema does not know.
#: Readers only; writers never write it (schemas/README.md, "Enums").
UNRECOGNIZED = "UNRECOGNIZED"

#: How long :meth:`AvroSerde.prepare` at a component's start waits for a schema registry that
#: does not answer (restarting, or starting next to it) before it gives up with the sentence
#: naming the setting: a component started during a registry outage rides it out, as it does
#: Kafka's retriable errors, instead of exiting (found by `mailtap soak`: sinks and sources
#: restarted in a registry-down fault exited 1 at start). A refusal is never waited for.
REGISTRY_START_WAIT_S = 60.0
REGISTRY_START_RETRY_MAX_S = 10.0

log = logging.getLogger(__name__)


def _enum_paths(node: dict[str, Any], path: tuple[str, ...] = ()) -> Iterator[tuple[str, ...]]:
    """Paths (through records, optional or not; not into arrays or maps) to enum fields."""
    for field in node.get("fields", []):
        branches = field["type"] if isinstance(field["type"], list) else [field["type"]]
        for branch in branches:
            if isinstance(branch, dict) and branch.get("type") == "enum":
                yield (*path, field["name"])
            elif isinstance(branch, dict) and branch.get("type") == "record":
                yield from _enum_paths(branch, (*path, field["name"]))


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


_SHARED: dict[tuple[str, str | None, str, SchemaRegistryClientSettings], AvroSerde] = {}
_SHARED_LOCK = threading.Lock()
#: Compiled writers by schema text (with its logical types and defaults, unlike the parsing
#: canonical form): compiling MailEvent's takes a few ms, and some callers make a serde per use.
_WRITERS: dict[str, ValueWriter | None] = {}


def _compiled_writer(schema_str: str, parsed: Any) -> ValueWriter | None:
    if schema_str not in _WRITERS:
        # Two threads may both compile it: the same pure function, either one kept.
        _WRITERS[schema_str] = compile_writer(parsed)
    return _WRITERS[schema_str]


class AvroSerde:
    """Encode and decode one record type.

    >>> serde = AvroSerde(load_schema("WorkflowEvent"))
    >>> import datetime as dt
    >>> value = {"instance_id": "T-1", "workflow": "ticket_intake", "status": "OPENED",
    ...          "occurred_at": dt.datetime(2026, 1, 1, tzinfo=dt.timezone.utc)}
    >>> serde.decode(serde.encode(value, "mail.workflow"))["instance_id"]
    'T-1'
    """

    def __init__(
        self,
        schema: LoadedSchema,
        registry_url: str | None = None,
        compatibility: Compatibility = DEFAULT_COMPATIBILITY,
        registry_login: SchemaRegistryClientSettings | None = None,
    ) -> None:
        self.schema = schema
        self._registry_url = registry_url
        self._registry_login = registry_login
        self._compatibility = compatibility
        self._schema_str = json.dumps(schema.raw)
        self._prepared_topics: set[str] = set()
        self._record_unions = _record_unions(schema.raw)
        self._enum_paths = tuple(_enum_paths(schema.raw))
        #: The schema's compiled writer (writer.py), None where it does not compile.
        self._writer = _compiled_writer(self._schema_str, schema.parsed)
        self._single_object_prefix = SINGLE_OBJECT_MAGIC + schema.fingerprint
        #: With a registry: the header of a topic's records, once the compiled writer's body
        #: was seen to equal the serializer's (the schema id is fixed once registered).
        self._confluent_prefixes: dict[str, bytes] = {}
        self._serializer: Any = None
        self._deserializer: Any = None
        self._client: Any = None
        #: With a registry: the writer schema of each schema id (the 4 header bytes) once the
        #: registry's text of it was seen to be one of ours, with no rules to run (_known_writer).
        self._confluent_writers: dict[bytes, LoadedSchema | None] = {}
        if registry_url:
            self._init_registry(registry_url)

    @classmethod
    def for_schema(cls, name: SchemaName, kafka: KafkaSettings | None = None) -> AvroSerde:
        if kafka is None:
            return cls(load_schema(name))
        return cls(
            load_schema(name),
            kafka.schema_registry_url,
            kafka.schema_compatibility,
            kafka.schema_registry,
        )

    @classmethod
    def shared(cls, name: SchemaName, kafka: KafkaSettings) -> AvroSerde:
        """The process's one serde of ``name`` for ``kafka``'s registry, built at the first call.

        Building one parses the schema and, with a registry, makes a registry client whose
        schema ids are cached per serde: one per folder would ask the registry again for
        every mailbox. Sharing is safe across threads: what a serde changes after
        construction (the topics it prepared, the serializer's caches) only grows, and a
        topic prepared twice by two threads is registered twice, idempotently.
        """
        key = (name, kafka.schema_registry_url, kafka.schema_compatibility, kafka.schema_registry)
        with _SHARED_LOCK:
            serde = _SHARED.get(key)
            if serde is None:
                serde = _SHARED[key] = cls.for_schema(name, kafka)
            return serde

    @property
    def encoding(self) -> str:
        """``"confluent"`` with a registry, else ``"single-object"`` (what :meth:`encode` writes)."""
        return "confluent" if self._registry_url else "single-object"

    def _init_registry(self, url: str) -> None:
        client = self._client = registry_client(url, self._registry_login)
        from confluent_kafka.schema_registry import topic_subject_name_strategy
        from confluent_kafka.schema_registry.avro import AvroDeserializer, AvroSerializer

        schema_str = self._schema_str
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

    def encode(self, value: Mapping[str, Any], topic: str) -> bytes:
        """The Avro value of ``value`` (a dict of this schema: for MailEvent, a
        :class:`connectors.core.mail.event.MailEvent`) in this serde's encoding."""
        if self._writer is not None:
            prefix = (
                self._single_object_prefix
                if self._serializer is None
                else self._confluent_prefixes.get(topic)
            )
            if prefix is not None:
                try:
                    return prefix + self._writer(value)
                except UnexpectedValue:
                    pass  # fastavro writes it below, or says what is wrong with it
        self._refuse_placeholder(value)
        plain = value
        if self._record_unions:
            value = self._with_branches(value)
        if self._serializer is not None:
            return self._serialized(value, plain, topic)
        buf = io.BytesIO()
        buf.write(SINGLE_OBJECT_MAGIC)
        buf.write(self.schema.fingerprint)
        fastavro.schemaless_writer(buf, self.schema.parsed, value)
        return buf.getvalue()

    def _serialized(self, value: Mapping[str, Any], plain: Mapping[str, Any], topic: str) -> bytes:
        """The registry serializer's record; the first one of a topic also decides whether the
        compiled writer may frame the next ones itself: only when its bytes are the
        serializer's, behind the same 5-byte header (magic byte, schema id). ``plain``: the
        value without fastavro's union branch names."""
        from confluent_kafka.serialization import MessageField, SerializationContext

        ctx = SerializationContext(topic, MessageField.VALUE)
        down: str | None = None
        try:
            if topic not in self._prepared_topics:
                self.prepare(topic, wait_s=0)  # the writer retries its batch instead
            out: bytes = self._serializer(value, ctx)
        except RegistryNotAnswering as exc:
            down = str(exc)
        except Exception as exc:
            if not registry_unreachable(exc):
                raise
            down = f"the schema registry did not answer while encoding for {topic}: {exc}"
        if down is not None:
            # Raised outside the handler, without the ConfigError as its context: a writer
            # retries a transient outage (found by `mailtap soak`: a source started during a
            # registry-down fault dead-lettered the mail it was encoding, and moved on).
            raise RegistryUnavailable(down)
        if self._writer is not None and topic not in self._confluent_prefixes:
            header, body = out[:5], out[5:]
            try:
                same = header[:1] == CONFLUENT_MAGIC and self._writer(plain) == body
            except UnexpectedValue:
                same = False  # decided by the next record
            if same:
                self._confluent_prefixes[topic] = header
        return out

    def _refuse_placeholder(self, value: Mapping[str, Any]) -> None:
        """UNRECOGNIZED stands for "a symbol this reader does not know"; written, it would mean
        nothing, and readers of the first released schema (no enum defaults) could not read it."""
        for path in self._enum_paths:
            datum: Any = value
            for name in path:
                datum = datum.get(name) if isinstance(datum, dict) else None
            if datum == UNRECOGNIZED:
                raise DataError(
                    f"{self.schema.name}.{'.'.join(path)}: {UNRECOGNIZED} is the reader's "
                    f"placeholder for an unknown symbol; a writer must name a real one"
                )

    def prepare(self, topic: str, wait_s: float = REGISTRY_START_WAIT_S) -> None:
        """With a registry: set the compatibility of ``<topic>-key``/``-value`` and register the
        key and value schemas (connectors.core.avro.registry). :meth:`encode` does it before
        the first write to a topic; a component calls it at start to fail there instead.

        A registry that does not answer is asked again, with a warning each time, for up to
        ``wait_s`` seconds; then its :class:`RegistryNotAnswering` is raised. A refusal (a
        schema, a login, a certificate) is raised at once."""
        if not self._registry_url:
            return
        deadline = time.monotonic() + wait_s
        pause = 1.0
        while True:
            try:
                prepare_subjects(
                    self._registry_url,
                    topic,
                    self._schema_str,
                    self._compatibility,
                    self._registry_login,
                )
                break
            except RegistryNotAnswering as exc:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise
                log.warning(
                    "waiting for the schema registry to register the schemas of %s "
                    "(%.0f s left before giving up): %s",
                    topic,
                    left,
                    exc,
                )
                pause_unless_stopping(min(pause, left), "the schema registry")  # SIGTERM
                pause = min(pause * 2, REGISTRY_START_RETRY_MAX_S)
        self._prepared_topics.add(topic)

    def _with_branches(self, value: Mapping[str, Any]) -> Mapping[str, Any]:
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
            writer = known_writers().get(data[2:10])
            if writer is None:
                raise DataError(
                    f"unknown schema fingerprint {data[2:10].hex()} for {self.schema.name}: "
                    f"the writer used a schema this build does not know"
                )
            return self._read(writer, data[10:])
        if data[:1] == CONFLUENT_MAGIC and len(data) > 5:
            if self._deserializer is None:
                raise DataError(
                    f"record is in Confluent wire format (schema id "
                    f"{struct.unpack('>I', data[1:5])[0]}) but kafka.schema_registry_url is unset"
                )
            schema_id = data[1:5]
            known = self._confluent_writers.get(schema_id)
            if known is not None:
                # What the deserializer does for such an id (no rules, no migrations, the
                # reader schema given), without its per-record schema walks (issue 29: they
                # were two thirds of the streams worker's decode).
                return self._read(known, data[5:])
            from confluent_kafka.serialization import MessageField, SerializationContext

            ctx = SerializationContext(topic, MessageField.VALUE)
            try:
                decoded: dict[str, Any] = self._deserializer(data, ctx)
            except Exception as exc:
                if registry_unreachable(exc):
                    raise RegistryUnavailable(
                        f"the schema registry did not answer while decoding a record of "
                        f"{topic or self.schema.name}: {exc}"
                    ) from exc
                refusal = login_refused(
                    self._registry_url or "", exc, self._registry_login, f" for {topic}"
                )
                if refusal is not None:
                    raise refusal from None
                raise
            if schema_id not in self._confluent_writers:
                self._confluent_writers[schema_id] = self._known_writer(schema_id)
            return decoded
        raise DataError(f"not an Avro record of a known encoding (first bytes {data[:4].hex()})")

    def _read(self, writer: LoadedSchema, body: bytes) -> dict[str, Any]:
        # Written with our own schema (the usual case): nothing to resolve, and fastavro's
        # resolution against an identical reader schema costs a third of the decode.
        reader = None if writer.parsed is self.schema.parsed else self.schema.parsed
        result: dict[str, Any] = fastavro.schemaless_reader(  # type: ignore[assignment]
            io.BytesIO(body), writer.parsed, reader
        )
        return result

    def _known_writer(self, schema_id: bytes) -> LoadedSchema | None:
        """Our schema the registry's ``schema_id`` is, when the deserializer needs nothing else
        to read its records: an Avro schema without references, rules or metadata (which
        confluent-kafka would act on) whose text is that of a schema this build knows. Asked
        after the deserializer read a record of the id, so the client has it cached."""
        try:
            registered = self._client.get_schema(struct.unpack(">I", schema_id)[0])
            if (
                registered.schema_type not in (None, "AVRO")
                or registered.references
                or registered.rule_set is not None
                or registered.metadata is not None
            ):
                return None
            raw = json.loads(registered.schema_str)
            canonical = to_parsing_canonical_form(fastavro.parse_schema(raw))
            writer = known_writers().get(bytes.fromhex(fingerprint(canonical, "CRC-64-AVRO")))
        except Exception as exc:  # the deserializer stays the way: slower, never wrong
            log.debug("schema id %s left to the deserializer: %r", schema_id.hex(), exc)
            return None
        # The canonical form leaves out logical types and defaults: the whole text must match.
        return writer if writer is not None and writer.raw == raw else None


def registry_unreachable(exc: BaseException) -> bool:
    """True when ``exc`` says the registry could not be reached or failed (5xx): a network
    error anywhere in its cause chain (the registry client wraps the OSError), or an HTTP 5xx."""
    seen: list[BaseException] = []
    current: BaseException | None = exc
    while current is not None and current not in seen:
        seen.append(current)
        if isinstance(current, (OSError, TimeoutError, ConnectionError)):
            return True
        status = getattr(current, "http_status_code", None)
        if isinstance(status, int) and status >= 500:
            return True
        current = current.__cause__ or current.__context__
    return False


class AnyAvroDecoder:
    """Decodes a value of any mailtap schema, with the writer's own schema (for tools and people).

    Single-object records are resolved by fingerprint; Confluent-framed ones through the registry.
    """

    def __init__(
        self,
        registry_url: str | None = None,
        registry_login: SchemaRegistryClientSettings | None = None,
    ) -> None:
        self._registry_url = registry_url
        self._registry_login = registry_login
        self._deserializer: Any = None

    def decode(self, data: bytes, topic: str = "") -> tuple[str, dict[str, Any]]:
        """Return ``(schema name, record)``."""
        if data[:2] == SINGLE_OBJECT_MAGIC:
            writer = known_writers().get(data[2:10])
            if writer is None:
                raise DataError(f"unknown schema fingerprint {data[2:10].hex()}")
            record: dict[str, Any] = fastavro.schemaless_reader(  # type: ignore[assignment]
                io.BytesIO(data[10:]), writer.parsed, None
            )
            return writer.raw["name"], record
        if data[:1] == CONFLUENT_MAGIC and len(data) > 5 and self._registry_url:
            if self._deserializer is None:
                from confluent_kafka.schema_registry.avro import AvroDeserializer

                self._deserializer = AvroDeserializer(
                    registry_client(self._registry_url, self._registry_login)
                )
            from confluent_kafka.serialization import MessageField, SerializationContext

            try:
                decoded: dict[str, Any] = self._deserializer(
                    data, SerializationContext(topic, MessageField.VALUE)
                )
            except TokenEndpointUnavailable as exc:
                # A tool has no backoff to wait in: say which setting to check, as at start.
                assert self._registry_login is not None and self._registry_login.bearer_auth
                raise token_unavailable(self._registry_login.bearer_auth, exc) from None
            except Exception as exc:
                refusal = login_refused(
                    self._registry_url, exc, self._registry_login, f" for {topic}"
                )
                if refusal is not None:
                    raise refusal from None
                raise
            return "confluent", decoded
        raise DataError(f"not an Avro record of a known encoding (first bytes {data[:4].hex()})")
