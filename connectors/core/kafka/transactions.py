"""The source contract: records that carry their resume position, written exactly once.

After Kafka Connect's ``SourceTask``/``SourceRecord`` and its exactly-once source support (KIP-618):

1. A source builds a batch of :class:`SourceRecord` (events for ``mail.events``, DLQ records...).
2. It hands the batch and the batch's new source offsets to :meth:`TransactionalSourceWriter.write`.
3. The writer opens one Kafka transaction, produces the records *and* the offsets to the offsets
   topic, and commits. Either all of it is visible to read_committed consumers, or none of it.
   Whatever the records point at outside Kafka (claim-check blobs) is made durable by the
   ``before_commit`` callback, between the produce calls and the commit, so that wait
   overlaps the records going out to the broker.
4. Only after ``write`` returns may the source perform side effects on the mailbox.

The transactional id is derived from the source partition, so a second instance on the same
mailbox calls ``init_transactions`` with the same id and fences the first (zombie fencing): the
first one's next commit fails with a fatal ``PRODUCER_FENCED`` and it must stop.

The writer is used from one thread (the source's loop); confluent-kafka's producer is thread-safe
but transactions are a per-producer sequence.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from confluent_kafka import KafkaError, KafkaException, Producer

from connectors.core import checkpoints, tracing
from connectors.core.config import KafkaSettings
from connectors.core.errors import MailtapError
from connectors.core.kafka.clients import init_transactions, producer_config

# Re-exported (``as``) for the source workers that still import them from here; new code
# imports them from connectors.core.kafka.errors.
from connectors.core.kafka.errors import FencedError, TransactionAborted
from connectors.core.kafka.offsets import SourceOffset, SourcePartition, canonical_json
from connectors.core.kafka.permissions import denied_transactional_id

log = logging.getLogger(__name__)

#: init_transactions waits for the broker to fence and abort a previous incarnation's open
#: transaction, which can take up to the transaction timeout; give it that plus slack.
INIT_TIMEOUT_S = 90.0
COMMIT_TIMEOUT_S = 60.0


@dataclass(frozen=True)
class SourceRecord:
    """One record of a batch. ``value=None`` is a tombstone. ``partition`` None: the
    producer's partitioner decides (by key); a number: that partition (a changelog
    partitioned by something other than the key, e.g. the IMAP key index by account)."""

    topic: str
    key: bytes
    value: bytes | None
    headers: Sequence[tuple[str, bytes]] = field(default_factory=tuple)
    partition: int | None = None


def transactional_id(prefix: str, partition: SourcePartition) -> str:
    """Stable, readable, bounded: ``mailtap-imap-demo-INBOX-4847b7a7``.

    >>> transactional_id("mailtap-imap", {"account": "demo", "folder": "INBOX"})
    'mailtap-imap-demo-INBOX-4847b7a7'
    """
    digest = hashlib.sha256(canonical_json(partition)).hexdigest()[:8]
    readable = "-".join(str(v) for _, v in sorted(partition.items()) if isinstance(v, str))
    safe = "".join(c if c.isalnum() or c in "._-" else "_" for c in readable)[:120]
    return f"{prefix}-{safe}-{digest}"


class TransactionalSourceWriter:
    """Writes batches and their source offsets in one transaction each."""

    def __init__(
        self,
        kafka: KafkaSettings,
        txn_id: str,
        *,
        acl_prefix: str | None = None,
        **producer_overrides: Any,
    ) -> None:
        """``acl_prefix``: the prefix of the transactional ids the operator grants Write on
        (``mailtap-imap-``), named by the sentence when ``init_transactions`` is refused."""
        self._kafka = kafka
        self.transactional_id = txn_id
        # Each MailEvent starts a trace (connectors.core.tracing); None: tracing is off.
        self._traced_topic = kafka.topics.events if kafka.tracing.enabled else None
        # Every broker connected from the start (producer_config's transactional setting):
        # init_transactions does not wait librdkafka's 500 ms timer for the coordinator.
        self._producer = Producer(
            producer_config(kafka, transactional_id=txn_id, **producer_overrides)
        )
        try:
            init_transactions(self._producer, kafka, INIT_TIMEOUT_S)
        except KafkaException as exc:
            # A refused transactional id is the sentence naming its ACL; the worker backs off
            # with it (unhealthy, BACKOFF) and writes nothing until it is granted.
            refused = denied_transactional_id(kafka, exc, txn_id, acl_prefix)
            raise refused or _translate(exc) from None
        log.info("transactional writer ready", extra={"transactional_id": txn_id})

    def write(
        self,
        records: Sequence[SourceRecord],
        offsets: Mapping[bytes, SourceOffset] | Sequence[tuple[SourcePartition, SourceOffset]],
        before_commit: Callable[[], None] | None = None,
    ) -> None:
        """Produce ``records`` and the new ``offsets`` atomically.

        ``before_commit`` runs after the records are produced and before the commit; when it
        raises, the transaction is aborted and its exception propagates.
        Raises :class:`TransactionAborted` (nothing written; redo from the committed cursor) or
        :class:`FencedError` (stop this instance).
        """
        items = (
            list(offsets.items())
            if isinstance(offsets, Mapping)
            else [(canonical_json(p), o) for p, o in offsets]
        )
        try:
            self._producer.begin_transaction()
            for record in records:
                headers = record.headers
                if record.topic == self._traced_topic and record.value is not None:
                    headers = [*headers, *tracing.child_headers("mail.received")]
                self._produce(record.topic, record.key, record.value, headers, record.partition)
            for key, offset in items:
                self._produce(self._kafka.topics.offsets, key, canonical_json(offset), ())
            if before_commit is not None:
                try:
                    before_commit()
                except BaseException:
                    self._abort()
                    raise
            if checkpoints.watched():
                # What the in_transaction point promises its observer: the records are on the
                # broker, uncommitted (commit_transaction would flush them only now).
                self._producer.flush(30)
                checkpoints.reached("in_transaction")
            self._commit()
        except KafkaException as exc:
            error = _translate(exc)
            if not isinstance(error, FencedError):
                # The abort may be what tells: a produce() after the broker fenced this
                # producer raised only "Local: Fatal error", and its abort then _FENCED.
                refused = self._abort()
                fenced = None if refused is None else _translate(refused)
                if isinstance(fenced, FencedError):
                    error = fenced
            raise error from exc

    def _produce(
        self,
        topic: str,
        key: bytes,
        value: bytes | None,
        headers: Sequence[tuple[str, bytes]],
        partition: int | None = None,
    ) -> None:
        wire_headers: list[tuple[str, str | bytes | None]] | None = list(headers) or None
        # -1 is librdkafka's RD_KAFKA_PARTITION_UA: "let the partitioner decide".
        where = -1 if partition is None else partition
        while True:
            try:
                self._producer.produce(
                    topic, key=key, value=value, headers=wire_headers, partition=where
                )
                return
            except BufferError:
                # The local queue is full: serve delivery reports until there is room again.
                self._producer.poll(0.1)

    def _commit(self) -> None:
        for _ in range(5):
            try:
                self._producer.commit_transaction(COMMIT_TIMEOUT_S)
                return
            except KafkaException as exc:
                err: KafkaError = exc.args[0]
                if err.retriable() and not err.txn_requires_abort():
                    continue
                raise
        raise KafkaException(KafkaError(KafkaError._TIMED_OUT, "commit did not complete"))

    def _abort(self) -> KafkaException | None:
        """Abort the open transaction; the exception when that failed (logged), else None."""
        try:
            self._producer.abort_transaction(COMMIT_TIMEOUT_S)
        except KafkaException as exc:
            log.warning("abort_transaction failed: %s", exc.args[0])
            return exc
        return None

    def close(self) -> None:
        self._producer.flush(10)


#: Errors after which this producer can never write again. ``_FATAL`` is what ``produce()``
#: raises once librdkafka holds a fatal error (its ``fatal()`` flag unset): a writer fenced by a
#: second instance met it and took it for an aborted transaction, backed off, found the mailbox
#: caught up by the other, and idled on, never stopping (tests/integration/imap/test_imap_faults).
_FATAL_CODES = (KafkaError._FATAL, KafkaError._FENCED, KafkaError.PRODUCER_FENCED)


def _translate(exc: KafkaException) -> MailtapError:
    err: KafkaError = exc.args[0]
    if err.fatal() or err.code() in _FATAL_CODES:
        return FencedError(f"transactional producer fenced or fatal: {err.str()}")
    return TransactionAborted(f"transaction aborted: {err.str()}")
