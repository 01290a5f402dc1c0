"""One encoding per topic: a writer refuses to start on a topic that holds the other one.

mailtap writes Avro values in one of two framings (connectors.core.avro.serde): the Confluent wire
format with a registry (``0x00`` + 4-byte schema id) or Avro single-object encoding without one
(``0xC3 0x01`` + 8-byte fingerprint). A reader with a stock deserializer handles only one of
them, so a topic whose writers switched half way breaks every such reader at the switch. Before
a component writes, :func:`check_topic_encodings` reads the newest records of each partition of
the topics and refuses, with a sentence that says how to migrate, when they carry the other
framing than the configuration would write.

Wire sample (first bytes of a value)::

    00 00 00 00 07 02 ...        Confluent, schema id 7
    c3 01 3d 87 d5 ce 08 dc 19 95 02 ...   single-object, fingerprint 953dd...
"""

from __future__ import annotations

import io
import logging
import time
import uuid
from collections.abc import Iterable
from typing import Literal

import fastavro
from confluent_kafka import Consumer, TopicPartition

from connectors.core.avro.schemas import known_writers
from connectors.core.avro.serde import CONFLUENT_MAGIC, SINGLE_OBJECT_MAGIC
from connectors.core.config import KafkaSettings
from connectors.core.errors import ConfigError
from connectors.core.kafka.clients import cluster_metadata, consumer_config
from connectors.core.kafka.errors import KafkaTimeout
from connectors.core.kafka.readtoend import read_to_end
from connectors.core.kafka.retry import retry_retriable

log = logging.getLogger(__name__)

Encoding = Literal["confluent", "single-object"]
#: Records read back from the end of each partition. A few are enough: what matters is how the
#: current writers frame their records; transaction markers also take offsets, hence not 1.
TAIL_RECORDS = 20
#: Reading the tails of a few topics takes well under a second here; a loaded broker, more.
CHECK_TIMEOUT_S = 30.0


def configured_encoding(kafka: KafkaSettings) -> Encoding:
    return "confluent" if kafka.schema_registry_url else "single-object"


def encoding_of(value: bytes | None) -> Encoding | None:
    """The framing of one value; None for a tombstone or bytes that are neither.

    ``C3 01`` is distinctive enough. A first byte ``0x00`` is not (dead letters, foreign bytes):
    a value counts as Confluent-framed only when the rest after the schema id is one whole
    record of a mailtap schema this build knows (a newer writer's record may not be, and then
    goes uncounted: the check errs on the side of letting a writer start).
    """
    if not value:
        return None
    if value[:2] == SINGLE_OBJECT_MAGIC:
        return "single-object"
    if value[:1] == CONFLUENT_MAGIC and len(value) > 5 and _is_mailtap_record(value[5:]):
        return "confluent"
    return None


def _is_mailtap_record(body: bytes) -> bool:
    for writer in known_writers().values():
        buffer = io.BytesIO(body)
        try:
            fastavro.schemaless_reader(buffer, writer.parsed, None)
        except Exception:  # arbitrary bytes fail in arbitrary ways: "not this schema"
            continue
        if buffer.tell() == len(body):
            return True
    return False


def avro_topics(kafka: KafkaSettings, retry_tiers: Iterable[str] = ()) -> list[str]:
    """The topics whose values are mailtap's Avro records (not the DLQ nor the offsets)."""
    t = kafka.topics
    tiers = [f"{t.retry_prefix}.{tier}" for tier in retry_tiers]
    return [t.events, t.commands, t.delivery, t.workflow, t.suppressions, *tiers]


def topic_encodings(
    kafka: KafkaSettings, topics: Iterable[str], timeout: float = CHECK_TIMEOUT_S
) -> dict[str, set[Encoding]]:
    """The framings found in the newest committed records of each existing topic."""
    consumer = Consumer(
        consumer_config(
            kafka,
            kafka.qualify(f"mailtap-encoding-check-{uuid.uuid4().hex}"),
            enable_partition_eof=True,
            # Read to the end: the last fetch answered at once, not after fetch.wait.max.ms.
            fetch_wait_max_ms=10,
        )
    )
    found: dict[str, set[Encoding]] = {}
    deadline = time.monotonic() + timeout
    attempt = max(1.0, timeout / 4)  # a busy broker lets a single request time out
    try:
        metadata = cluster_metadata(consumer, kafka, timeout).topics
        starts = []
        for topic in topics:
            if topic not in metadata:
                continue
            found[topic] = set()
            for partition in metadata[topic].partitions:
                low, high = _watermarks(
                    consumer, TopicPartition(topic, partition), attempt, deadline
                )
                # Only partitions that hold records: a fetch from an empty one would ask for
                # Read on a topic this component may not be allowed to read (least privilege).
                if high > low:
                    starts.append(TopicPartition(topic, partition, max(low, high - TAIL_RECORDS)))
        try:
            for msg in read_to_end(consumer, starts, max(0.0, deadline - time.monotonic())):
                encoding = encoding_of(msg.value())
                if encoding is not None:
                    found[str(msg.topic())].add(encoding)
        except KafkaTimeout as exc:
            # Errs on the side of letting a writer start, as for records it cannot tell.
            log.warning("encoding check: %s", exc)
        return found
    finally:
        consumer.close()


def _watermarks(
    consumer: Consumer, tp: TopicPartition, timeout: float, deadline: float
) -> tuple[int, int]:
    """(low, high) of a partition, retried through what a topic created a moment ago answers."""

    def ask() -> tuple[int, int]:
        low, high = consumer.get_watermark_offsets(tp, timeout=timeout, cached=False)
        return int(low), int(high)

    return retry_retriable(ask, deadline, f"finding the offsets of {tp.topic}")


def check_topic_encodings(
    kafka: KafkaSettings, topics: Iterable[str], timeout: float = CHECK_TIMEOUT_S
) -> None:
    """Raise ConfigError when a topic's newest records are framed otherwise than this
    configuration writes."""
    wanted = configured_encoding(kafka)
    for topic, encodings in topic_encodings(kafka, topics, timeout).items():
        other = encodings - {wanted}
        if other:
            raise ConfigError(_mismatch(topic, wanted, other.pop()))


def _mismatch(topic: str, wanted: Encoding, found: Encoding) -> str:
    if found == "confluent":
        what = "Confluent wire format (a schema registry), but kafka.schema_registry_url is unset"
        keep = "set kafka.schema_registry_url to the registry its writers use"
    else:
        what = "Avro single-object encoding (no registry), but kafka.schema_registry_url is set"
        keep = "unset kafka.schema_registry_url"
    return (
        f"topic {topic} holds records in {what}: mailtap writes one encoding per topic, so "
        f"readers with a stock deserializer keep working. To keep the topic's encoding, {keep}. "
        f"To move to {wanted}, write to new topics instead (kafka.topics.*), let readers finish "
        f"the old ones, then point them at the new ones (schemas/README.md, "
        f"'One encoding per topic')"
    )
