"""The source offsets topic (``mailtap.offsets``): where every source's resume position lives.

Kafka Connect's model (KIP-618): a record's *source partition* names the stream it came from, its
*source offset* says how far that stream has been read. Both are canonical JSON so any tool can read
them, and the topic is compacted so only the newest offset per partition is kept.

Wire sample::

    key   {"account":"demo","folder":"INBOX","source":"imap"}
    value {"highestmodseq":12,"last_uid":42,"uidvalidity":1700000000}
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Mapping
from typing import Any

from confluent_kafka import Consumer, KafkaError, TopicPartition

from connectors.core.config import KafkaSettings
from connectors.core.kafka import cluster_metadata, consumer_config, raise_if_stopping

log = logging.getLogger(__name__)

SourcePartition = Mapping[str, Any]
SourceOffset = Mapping[str, Any]

#: Reading the offsets topic waits for any open transaction on it to settle (read_committed stops at
#: the last stable offset). Our own writer's init_transactions() aborts a zombie's open transaction
#: first, so a long wait here means the cluster is unwell: fail the start rather than hang.
READ_TIMEOUT_S = 60.0


def canonical_json(value: Mapping[str, Any]) -> bytes:
    """Sorted keys, no spaces: the same partition always gives the same bytes (compaction key).

    >>> canonical_json({"folder": "INBOX", "account": "demo"})
    b'{"account":"demo","folder":"INBOX"}'
    """
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


class OffsetStore:
    """Reads the newest committed offset of every source partition."""

    def __init__(self, kafka: KafkaSettings) -> None:
        self._kafka = kafka

    def read_all(self, timeout: float = READ_TIMEOUT_S) -> dict[bytes, dict[str, Any]]:
        """``{canonical partition json: offset dict}``; a tombstone removes the partition."""
        topic = self._kafka.topics.offsets
        consumer = Consumer(
            consumer_config(
                self._kafka,
                group_id="mailtap-offsets-reader",
                enable_partition_eof=True,
            )
        )
        offsets: dict[bytes, dict[str, Any]] = {}
        try:
            metadata = cluster_metadata(consumer, self._kafka, 10, topic)
            partitions = metadata.topics[topic].partitions if topic in metadata.topics else {}
            if not partitions:
                return offsets
            pending = set(partitions)
            consumer.assign([TopicPartition(topic, p, 0) for p in partitions])
            deadline = time.monotonic() + timeout
            while pending:
                raise_if_stopping()
                if time.monotonic() > deadline:
                    raise TimeoutError(
                        f"reading {topic} did not reach its end within {timeout:.0f}s "
                        f"(an open transaction on it?)"
                    )
                msg = consumer.poll(0.5)
                if msg is None:
                    continue
                err = msg.error()
                if err is not None:
                    if err.code() == KafkaError._PARTITION_EOF:
                        pending.discard(msg.partition())
                        continue
                    if err.code() == KafkaError.UNKNOWN_TOPIC_OR_PART:
                        return offsets
                    raise RuntimeError(f"reading {topic}: {err}")
                key = msg.key()
                if key is None:
                    continue
                value = msg.value()
                if value is None:
                    offsets.pop(key, None)
                else:
                    offsets[key] = json.loads(value)
        finally:
            consumer.close()
        return offsets

    def read(self, partition: SourcePartition) -> dict[str, Any] | None:
        return self.read_all().get(canonical_json(partition))
