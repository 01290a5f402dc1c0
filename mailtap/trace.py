"""One mail's way through mailtap, found on Kafka: its ``MailEvent``s, the ``WorkflowEvent``s,
the ``ReplyCommand``s and the ``DeliveryEvent``s, in time order — "why did this mail get no
reply?" answered from the topics, without a ``consume`` from the end.

Two halves, so that another front end (the web console's timeline) uses the same lookup:

- :func:`read_records` reads the topics (read_committed, each partition to its end) into
  :class:`TopicRecord` s;
- :func:`find` is pure: records in, :class:`MailTrace` out.

A query is any one of (tried in this order)::

    3f0c9a…e1               a command id (key of mail.commands and mail.delivery)
    demo/abc@example.com    a mail key (key of mail.events)
    <abc@example.com>       a Message-ID, with or without angle brackets
    #K7QJ2M4X               a workflow instance: a ticket number, an approval id

>>> records = [
...     TopicRecord("mail.events", 0, 5, 1000, "a/m1@x", {"key": "a/m1@x", "message_id": "m1@x",
...         "change": "ADDED", "observed_at": None, "subject": "Help", "from": None}),
...     TopicRecord("mail.workflow", 0, 9, 2000, "T1", {"instance_id": "T1",
...         "workflow": "ticket_intake", "status": "SKIPPED", "event_key": "a/m1@x",
...         "attributes": {"guard": "rate_limit"}, "occurred_at": None}),
... ]
>>> trace = find(records, "<m1@x>", TopicNames())
>>> trace.matched_by, [s.kind for s in trace.steps], trace.verdict
('message-id', ['mail', 'workflow'], 'no reply: SKIPPED by rate_limit')
"""

from __future__ import annotations

import datetime as dt
import time
import uuid
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, TopicPartition

from connectors.core.avro.serde import AnyAvroDecoder
from connectors.core.config import KafkaSettings, TopicNames
from connectors.core.errors import DataError
from connectors.core.kafka.clients import cluster_metadata, consumer_config

#: A read ends when every partition reported its end, or after this long without a record.
IDLE_END_S = 10.0
#: Order of steps that share a time: cause before effect.
KIND_ORDER = {"mail": 0, "workflow": 1, "command": 2, "delivery": 3}


@dataclass(frozen=True, slots=True)
class TopicRecord:
    """One record as read: where it is, its timestamp (epoch ms), key and decoded value."""

    topic: str
    partition: int
    offset: int
    timestamp_ms: int
    key: str | None
    value: dict[str, Any] | None


@dataclass(frozen=True, slots=True)
class Step:
    """One record of the mail's way, with the time it says it happened."""

    at: dt.datetime
    kind: str  # mail | workflow | command | delivery
    record: TopicRecord

    def line(self) -> str:
        """One human line: ``<kind> <time> <what>  (<topic> <partition>:<offset>)``."""
        where = f"({self.record.topic} {self.record.partition}:{self.record.offset})"
        return f"{self.kind:<9} {self.at.isoformat(timespec='seconds')}  {self.what()}  {where}"

    def what(self) -> str:
        v = self.record.value
        if v is None:
            return f"tombstone {self.record.key} (the mail left every watched folder)"
        if self.kind == "mail":
            sender = (v.get("from") or {}).get("address")
            return f"{v.get('change')} {v.get('key')} from {sender} “{v.get('subject')}”"
        if self.kind == "workflow":
            attrs = ", ".join(
                f"{k}={val}" for k, val in sorted((v.get("attributes") or {}).items())
            )
            return f"{v.get('workflow')} {v.get('status')} {v.get('instance_id')}  {attrs}"
        if self.kind == "command":
            to = ", ".join(a["address"] for a in v.get("to") or ())
            return (
                f"{v.get('kind')} {v.get('workflow')}/{v.get('step')} → {to} "
                f"“{v.get('subject')}”  id {v.get('command_id')}"
            )
        code = v.get("smtp_code") or ""
        detail = v.get("diagnostic") or ""
        return f"{v.get('status')} {v.get('recipient')} {code} {detail}".rstrip()


@dataclass
class MailTrace:
    """What :func:`find` found for a query: how it matched, the mail keys, the steps in order."""

    query: str
    matched_by: str | None
    event_keys: list[str] = field(default_factory=list)
    steps: list[Step] = field(default_factory=list)

    @property
    def verdict(self) -> str:
        """One sentence: what became of the mail."""
        if not self.steps:
            return "nothing matches"
        deliveries = [s for s in self.steps if s.kind == "delivery" and s.record.value]
        if deliveries:
            last = deliveries[-1].record.value or {}
            return f"reply {last.get('status')} to {last.get('recipient')}"
        if any(s.kind == "command" for s in self.steps):
            return "reply commanded, no delivery event yet (is the smtp-sink running?)"
        verdicts = [s.record.value for s in self.steps if s.kind == "workflow" and s.record.value]
        for value in reversed(verdicts):
            if value.get("status") == "SKIPPED":
                return f"no reply: SKIPPED by {(value.get('attributes') or {}).get('guard')}"
            if value.get("status") in ("UNROUTED", "FAILED"):
                return f"no reply: {value.get('status')}"
        if verdicts:
            return "no reply commanded"
        return "no workflow event yet (is the streams worker running, and past this mail?)"

    def as_json(self) -> dict[str, Any]:
        return {
            "query": self.query,
            "matched_by": self.matched_by,
            "event_keys": self.event_keys,
            "verdict": self.verdict,
            "steps": [
                {
                    "at": s.at.isoformat(),
                    "kind": s.kind,
                    "topic": s.record.topic,
                    "partition": s.record.partition,
                    "offset": s.record.offset,
                    "key": s.record.key,
                    "value": s.record.value,
                }
                for s in self.steps
            ],
        }


def find(records: Sequence[TopicRecord], query: str, topics: TopicNames) -> MailTrace:
    """The steps of the mail ``query`` names (see the module docstring), in time order."""
    kinds = {
        topics.events: "mail",
        topics.workflow: "workflow",
        topics.commands: "command",
        topics.delivery: "delivery",
    }
    by_kind: dict[str, list[TopicRecord]] = {k: [] for k in KIND_ORDER}
    for record in records:
        if record.topic in kinds:
            by_kind[kinds[record.topic]].append(record)
    matched_by, keys, instance = _match(by_kind, query.strip())
    if matched_by is None:
        return MailTrace(query, None)
    steps: list[Step] = []
    for record in by_kind["mail"]:
        if record.key in keys:
            steps.append(_step("mail", record))
    for record in by_kind["workflow"]:
        value = record.value or {}
        if value.get("event_key") in keys or (instance and value.get("instance_id") == instance):
            steps.append(_step("workflow", record))
    command_ids = set()
    for record in by_kind["command"]:
        value = record.value or {}
        if value.get("event_key") in keys or record.key == query.strip():
            command_ids.add(record.key)
            steps.append(_step("command", record))
    for record in by_kind["delivery"]:
        if record.key in command_ids:
            steps.append(_step("delivery", record))
    steps.sort(key=lambda s: (s.at, KIND_ORDER[s.kind], s.record.offset))
    return MailTrace(query, matched_by, sorted(keys), steps)


def _match(
    by_kind: dict[str, list[TopicRecord]], query: str
) -> tuple[str | None, set[str], str | None]:
    """How ``query`` matches: (matched_by, mail keys, workflow instance id or None)."""
    for kind in ("command", "delivery"):
        hits = [r for r in by_kind[kind] if r.key == query]
        if hits:
            keys = {str((r.value or {}).get("event_key")) for r in hits}
            return "command id", {k for k in keys if k != "None"}, None
    if any(r.key == query for r in by_kind["mail"]):
        return "mail key", {query}, None
    message_id = query.strip("<>").strip()
    for exact in (True, False):
        keys = {
            str(r.key)
            for r in by_kind["mail"]
            if r.value
            and r.value.get("message_id")
            and (
                r.value["message_id"] == message_id
                if exact
                else r.value["message_id"].lower() == message_id.lower()
            )
        }
        if keys:
            return "message-id", keys, None
    instance = query.lstrip("#").strip()
    hits = [r for r in by_kind["workflow"] if (r.value or {}).get("instance_id") == instance]
    if hits:
        keys = {str(r.value["event_key"]) for r in hits if r.value and r.value.get("event_key")}
        return "workflow instance", keys, instance
    return None, set(), None


def _step(kind: str, record: TopicRecord) -> Step:
    value = record.value or {}
    field_name = {"mail": "observed_at", "command": "created_at"}.get(kind, "occurred_at")
    at = value.get(field_name)
    if not isinstance(at, dt.datetime):
        at = dt.datetime.fromtimestamp(record.timestamp_ms / 1000, dt.UTC)
    return Step(at, kind, record)


def trace_topics(topics: TopicNames) -> list[str]:
    """The topics a trace reads."""
    return [topics.events, topics.workflow, topics.commands, topics.delivery]


def read_records(
    kafka: KafkaSettings, topics: Iterable[str], *, since: dt.datetime | None = None
) -> list[TopicRecord]:
    """Every committed record of ``topics`` (from ``since``, else from the beginning) up to the
    end each partition has now, decoded; a value no schema decodes is skipped."""
    consumer = Consumer(
        consumer_config(
            kafka,
            group_id=kafka.qualify(f"mailtap-trace-{uuid.uuid4().hex[:8]}"),
            isolation_level="read_committed",
            enable_partition_eof=True,
        )
    )
    decoder = AnyAvroDecoder(kafka.schema_registry_url, kafka.schema_registry)
    records: list[TopicRecord] = []
    try:
        names = list(topics)
        metadata = cluster_metadata(consumer, kafka, 10)  # every topic: one request
        wanted = [
            TopicPartition(name, p, OFFSET_BEGINNING)
            for name in names
            if name in metadata.topics and metadata.topics[name].error is None
            for p in metadata.topics[name].partitions
        ]
        if since is not None:
            millis = int(since.timestamp() * 1000)
            for tp in wanted:
                tp.offset = millis
            wanted = consumer.offsets_for_times(wanted, timeout=10)
        consumer.assign(wanted)
        _read_to_end(consumer, decoder, {(tp.topic, tp.partition) for tp in wanted}, records)
    finally:
        consumer.close()
    return records


def _read_to_end(
    consumer: Consumer,
    decoder: AnyAvroDecoder,
    partitions: set[tuple[str, int]],
    records: list[TopicRecord],
) -> None:
    at_end: set[tuple[str, int]] = set()
    idle_since = time.monotonic()
    while at_end < partitions and time.monotonic() - idle_since < IDLE_END_S:
        msg = consumer.poll(0.5)
        if msg is None:
            continue
        idle_since = time.monotonic()
        where = (str(msg.topic()), int(msg.partition() or 0))
        err = msg.error()
        if err is not None:
            if err.code() == KafkaError._PARTITION_EOF:
                at_end.add(where)
            continue
        at_end.discard(where)
        raw = msg.value()
        key = msg.key()
        value: dict[str, Any] | None = None
        if raw is not None:
            try:
                _, value = decoder.decode(raw, where[0])
            except DataError:
                continue
        records.append(
            TopicRecord(
                topic=where[0],
                partition=where[1],
                offset=int(msg.offset() or 0),
                timestamp_ms=int(msg.timestamp()[1]),
                key=key.decode("utf-8", "replace") if key is not None else None,
                value=value,
            )
        )


def trace(kafka: KafkaSettings, query: str, *, since: dt.datetime | None = None) -> MailTrace:
    """Read the topics and :func:`find` the mail ``query`` names."""
    return find(read_records(kafka, trace_topics(kafka.topics), since=since), query, kafka.topics)
