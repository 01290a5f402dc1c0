"""Follow one demo run across the topics and the SMTP server, one printed line per step."""

from __future__ import annotations

import datetime as dt
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from confluent_kafka import Consumer, KafkaException, TopicPartition

from connectors.core.avro.serde import AnyAvroDecoder
from connectors.core.config import KafkaSettings
from connectors.core.errors import DataError
from connectors.core.kafka.clients import consumer_config
from mailtap.dev.received import ReceivedMessage, received_messages, received_names

#: How often the tracer looks for new mail in the SMTP server's folder.
SMTP_CHECK_S = 0.25


@dataclass
class RunTrace:
    """Everything seen of one run: the records of the run's account and what the SMTP server got."""

    account: str
    events: list[dict[str, Any]] = field(default_factory=list)
    workflow: list[dict[str, Any]] = field(default_factory=list)
    commands: list[dict[str, Any]] = field(default_factory=list)
    delivery: list[dict[str, Any]] = field(default_factory=list)
    received: list[ReceivedMessage] = field(default_factory=list)
    #: Message-ID -> wall-clock time the tracer first saw its MailEvent on ``mail.events``.
    event_seen_at: dict[str, float] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def ours(self, event_key: str | None) -> bool:
        return bool(event_key) and str(event_key).startswith(f"{self.account}/")

    @property
    def command_ids(self) -> set[str]:
        return {c["command_id"] for c in self.commands}


class Tracer:
    """Consumes the four topics from ``since`` and watches the SMTP folder, on one thread."""

    def __init__(
        self,
        kafka: KafkaSettings,
        trace: RunTrace,
        received_dir: Any,
        since: dt.datetime,
        emit: Callable[[str, str], None],
        run_token: str,
    ) -> None:
        self.run_token = run_token
        self.kafka = kafka
        self.trace = trace
        self.received_dir = received_dir
        self.since_ms = int(since.timestamp() * 1000)
        self.emit = emit
        self._stop = threading.Event()
        #: Set once the consumer is assigned at ``since``: from then on a record is seen as it lands.
        self.ready = threading.Event()
        self._thread = threading.Thread(target=self._run, name="demo-tracer", daemon=True)
        self._seen_files: set[str] = set()
        self._decoder = AnyAvroDecoder(kafka.schema_registry_url, kafka.schema_registry)

    def start(self) -> Tracer:
        self._seen_files = received_names(self.received_dir)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(10)

    def _run(self) -> None:
        t = self.kafka.topics
        topics = [t.events, t.workflow, t.commands, t.delivery]
        consumer = Consumer(
            consumer_config(
                self.kafka,
                group_id=self.kafka.qualify(f"mailtap-demo-trace-{uuid.uuid4().hex[:8]}"),
            )
        )
        try:
            wanted = []
            for topic in topics:
                meta = consumer.list_topics(topic, timeout=10).topics.get(topic)
                for p in meta.partitions if meta else {}:
                    wanted.append(TopicPartition(topic, p, self.since_ms))
            consumer.assign(self._start_offsets(consumer, wanted))
            self.ready.set()
            smtp_due = 0.0
            while not self._stop.is_set():
                for msg in consumer.consume(500, 0.1):
                    # When the record landed here: decoding the first one asks the schema
                    # registry for its schema (a second on a registry that just started),
                    # which is the tracer's cost, not the pipeline's.
                    landed = time.time()
                    name, value = msg.topic(), msg.value()
                    if msg.error() is None and name is not None and value is not None:
                        self._record(name, value, landed)
                if time.monotonic() >= smtp_due:
                    # Listing a folder of many thousand messages takes a while: not every loop.
                    smtp_due = time.monotonic() + SMTP_CHECK_S
                    self._check_smtp()
        finally:
            consumer.close()

    def _start_offsets(
        self, consumer: Consumer, wanted: list[TopicPartition]
    ) -> list[TopicPartition]:
        """Offsets at ``since``; topics created a moment ago may not have a leader yet: retry."""
        deadline = time.monotonic() + 60
        while True:
            try:
                return list(consumer.offsets_for_times(wanted, timeout=10))
            except KafkaException:
                if time.monotonic() > deadline or self._stop.is_set():
                    raise
                time.sleep(0.5)

    def _record(self, topic: str, raw: bytes, landed: float) -> None:
        try:
            _, value = self._decoder.decode(raw, topic)
        except DataError:
            return
        tr, t = self.trace, self.kafka.topics
        with tr.lock:
            if topic == t.events and tr.ours(value.get("key")):
                tr.events.append(value)
                if value.get("message_id"):
                    tr.event_seen_at.setdefault(value["message_id"], landed)
                self.emit("mail", f"{value['change']:<8} {value['key']}  “{value.get('subject')}”")
            elif topic == t.workflow and tr.ours(value.get("event_key")):
                tr.workflow.append(value)
                attrs = ", ".join(f"{k}={v}" for k, v in sorted(value["attributes"].items()))
                self.emit(
                    "flow",
                    f"{value['workflow']:<13} {value['status']:<17} {value['instance_id']}  {attrs}",
                )
            elif topic == t.commands and tr.ours(value.get("event_key")):
                tr.commands.append(value)
                to = ", ".join(a["address"] for a in value["to"])
                self.emit(
                    "command", f"{value['kind']:<8} → {to}  “{value['subject']}”  ({value['step']})"
                )
            elif topic == t.delivery and value.get("command_id") in tr.command_ids:
                tr.delivery.append(value)
                code = value.get("smtp_code") or ""
                self.emit("delivery", f"{value['status']:<8} {value.get('recipient')} {code}")

    def _check_smtp(self) -> None:
        for message in received_messages(self.received_dir, skip=self._seen_files):
            self._seen_files.add(message.path.name)
            parsed = message.message
            threading_ids = f"{parsed['In-Reply-To'] or ''} {parsed['References'] or ''}"
            if self.run_token not in threading_ids:
                continue  # another run's mail (or a late retry of one)
            with self.trace.lock:
                self.trace.received.append(message)
            self.emit(
                "smtp",
                f"received for {', '.join(message.rcpt_tos)}: “{parsed['Subject']}”  "
                f"In-Reply-To {parsed['In-Reply-To']}",
            )
