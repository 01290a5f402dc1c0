"""The key index's changelog: a compacted topic, partitioned by account, that a source restores
its accounts' key indexes from without reading ``mail.events`` (issue 12).

Rebuilding the index from ``mail.events`` means reading every account's events: start-up grows
with the topic, and every instance reads all of it. So each event the IMAP source publishes is
accompanied, **in the same Kafka transaction**, by a record on this topic saying that its key is
in that folder (or a tombstone when the mail left the folder): the changelog is exactly as
consistent as the events. Its records go to the partition of their *account* (a stable hash,
not the key's partitioner), so an instance reads only the partitions of the accounts it owns
and keeps only their records. The record key is the pair (event key, folder), so compaction
keeps one record per folder a key is in: a mail kept in two folders is restored in both.

Wire sample (``connectors/imap/KEYS.md``)::

    partition  partition_of("alice", 32)       (sha256 of the account name, modulo the count)
    key        alice/in:Sent%20Items/mid:abc@example.com   (location_key: the key in a folder)
    value      {"fingerprint":"9f2c…","folder":"Sent Items","uid":42,"uidvalidity":17}
    key        alice/index:v2                   (the account's marker, written once)
    value      {"account":"alice","version":2}

The marker says "every key of this account is on the changelog, in this format". An account
without it that already has a cursor published events before the changelog existed, or wrote
the version 1 changelog (one record per key, under the event key itself): its index is rebuilt
once from ``mail.events``, written here, its version 1 records tombstoned, then the marker
(:func:`connectors.imap.index.load_indexes`).
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from json.encoder import encode_basestring_ascii
from urllib.parse import quote, unquote

from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition

from connectors.core.config import KafkaSettings
from connectors.core.kafka.clients import (
    cluster_metadata,
    consumer_config,
    producer_config,
)
from connectors.core.kafka.readtoend import read_batches_to_end
from connectors.core.kafka.topics import COMPACTED, TopicSpec, ensure_topic_specs
from connectors.core.kafka.transactions import SourceRecord

log = logging.getLogger(__name__)

#: Partitions of the changelog when the source creates it. An instance reads the partitions of
#: its accounts, so it reads about 1/32 of the other accounts' records; more partitions cut that
#: further at a small cost per partition on the brokers (pre-create the topic to choose).
INDEX_PARTITIONS = 32

#: The changelog's format; an account's marker says which one its records are in.
VERSION = 2

#: The key suffix of an account's marker; no event key has it (``mid:``/``fp:``, KEYS.md).
MARKER = f"index:v{VERSION}"

#: What follows ``<account>/`` in a location key (no event key has it: ``mid:``/``fp:``). A
#: version 1 record (``<account>/mid:…``, one per key) never starts so: it is never read as
#: a location of this format.
LOCATION_TAG = "in:"

#: A read to the end ends on the fetch that finds nothing more, which the broker holds for
#: ``fetch.wait.max.ms`` (500 ms by default) hoping for new records: there is no point in
#: waiting for those at start-up, so the fetch answers at once.
READ_TO_END = {"fetch_wait_max_ms": 10, "enable_partition_eof": True}

#: Waiting for the leaders of a topic created just now.
LEADERS_TIMEOUT_S = 15.0

Row = tuple[str, str, str | None, int | None, int | None, str | None]
"""``(key, account, folder, uidvalidity, uid, fingerprint)``; folder None: a tombstone (of an
event on ``mail.events``; never on the changelog, where a tombstone names its folder)."""

Entry = tuple[str, str, str, int | None, int | None, str | None, bool]
"""``(key, account, folder, uidvalidity, uid, fingerprint, present)`` of one changelog record;
``present`` False: a tombstone, the key left that folder."""

Outdated = tuple[str, str, bool]
"""``(record key, account, live)`` of a record of the version 1 format."""


def topic_spec(kafka: KafkaSettings) -> TopicSpec:
    """The changelog as the source (or ``mailtap topics ensure``) creates it."""
    return TopicSpec(kafka.topics.imap_index, INDEX_PARTITIONS, COMPACTED)


def partition_of(account: str, partitions: int) -> int:
    """The changelog partition of an account: stable across processes and versions (Python's
    ``hash`` is salted per process, so it cannot be used)."""
    digest = hashlib.sha256(account.encode("utf-8")).digest()
    return int.from_bytes(digest[:8], "big") % partitions


def marker_key(account: str) -> str:
    return f"{account}/{MARKER}"


def location_key(key: str, folder: str) -> str:
    """The changelog key of ``key`` in ``folder``: ``<account>/in:<folder>/<rest of the key>``,
    the folder percent-encoded (RFC 3986, every byte but unreserved characters, so ``/`` and
    ``%`` in a folder name are escaped and the next ``/`` ends it).

    >>> location_key("alice/mid:abc@example.com", "Archive/2026")
    'alice/in:Archive%2F2026/mid:abc@example.com'
    """
    account, sep, rest = key.partition("/")
    if not sep or not rest:
        raise ValueError(f"not an event key (no <account>/ prefix): {key!r}")
    return f"{account}/{LOCATION_TAG}{quote(folder, safe='')}/{rest}"


def parse_location_key(text: str) -> tuple[str, str] | None:
    """``(event key, folder)`` of a :func:`location_key`; None for any other changelog key (a
    marker, a version 1 record named by the event key alone)."""
    account, sep, tail = text.partition("/")
    if not sep or not tail.startswith(LOCATION_TAG):
        return None
    folder, sep, rest = tail[len(LOCATION_TAG) :].partition("/")
    if not sep or not rest or not folder:
        return None
    try:
        return f"{account}/{rest}", unquote(folder, errors="strict")
    except UnicodeDecodeError:
        return None


@dataclass(frozen=True)
class ChangelogPartition:
    """Where one account's index records go; picklable (the parse processes build records)."""

    topic: str
    partition: int

    def location(
        self,
        key: str,
        folder: str,
        uidvalidity: int | None,
        uid: int | None,
        fingerprint: str | None,
    ) -> SourceRecord:
        """The record saying ``key`` is in ``folder``, at this UID."""
        record_key = location_key(key, folder).encode()
        value = _location_json(folder, uidvalidity, uid, fingerprint)
        return SourceRecord(self.topic, record_key, value, partition=self.partition)

    def tombstone(self, key: str, folder: str) -> SourceRecord:
        """The record saying ``key`` left ``folder``."""
        record_key = location_key(key, folder).encode()
        return SourceRecord(self.topic, record_key, None, partition=self.partition)


@dataclass
class Restored:
    """What reading the changelog for some accounts found."""

    #: Records read from the partitions (those of other accounts sharing them included).
    records_read: int = 0
    #: Records of the named accounts among them (markers included).
    records_kept: int = 0
    #: The named accounts whose marker (of this format) is on the changelog.
    marked: frozenset[str] = frozenset()


class IndexChangelog:
    """The changelog topic of a cluster: its partition count, reading and writing accounts."""

    def __init__(self, kafka: KafkaSettings, partitions: int) -> None:
        self.kafka = kafka
        self.topic = kafka.topics.imap_index
        self.partitions = partitions

    @classmethod
    def open(cls, kafka: KafkaSettings, timeout: float = 30.0) -> IndexChangelog:
        """Create the topic when missing (compacted, :data:`INDEX_PARTITIONS`) and learn its
        partition count: an existing topic keeps its own."""
        topic = kafka.topics.imap_index
        consumer = Consumer(consumer_config(kafka, group_id=kafka.qualify("mailtap-imap-index")))
        try:
            meta = cluster_metadata(consumer, kafka, timeout, topic).topics.get(topic)
            if meta is None or meta.error is not None or not meta.partitions:
                ensure_topic_specs(kafka, [topic_spec(kafka)], timeout)
            deadline = time.monotonic() + LEADERS_TIMEOUT_S
            while True:
                meta = cluster_metadata(consumer, kafka, timeout, topic).topics.get(topic)
                parts = meta.partitions if meta is not None and meta.error is None else {}
                if parts and all(p.leader >= 0 for p in parts.values()):
                    return cls(kafka, len(parts))
                if time.monotonic() > deadline:
                    raise TimeoutError(f"topic {topic} has no leader for every partition yet")
                time.sleep(0.1)
        finally:
            consumer.close()

    def partition_for(self, account: str) -> ChangelogPartition:
        return ChangelogPartition(self.topic, partition_of(account, self.partitions))

    def restore(
        self,
        accounts: Iterable[str],
        sink: Callable[[list[Entry]], None],
        timeout: float,
        outdated: Callable[[list[Outdated]], None] = lambda _: None,
    ) -> Restored:
        """Read the partitions of ``accounts`` to their end (read_committed) and hand the
        entries of those accounts to ``sink`` in partition order; the rest is skipped
        undecoded. A record of the version 1 format is never taken for a location: it goes
        to ``outdated`` (to be tombstoned by a rebuild)."""
        names = set(accounts)
        found = Restored()
        if not names:
            return found
        marked: set[str] = set()
        wanted = {partition_of(a, self.partitions) for a in names}
        consumer = Consumer(
            consumer_config(
                self.kafka, group_id=self.kafka.qualify("mailtap-imap-index"), **READ_TO_END
            )
        )
        try:
            starts = [TopicPartition(self.topic, p, 0) for p in sorted(wanted)]
            for batch in read_batches_to_end(consumer, starts, timeout):
                found.records_read += len(batch)
                rows: list[Entry] = []
                stale: list[Outdated] = []
                for msg in batch:
                    key = msg.key()
                    if key is None:
                        continue
                    text = key.decode("utf-8", "replace")
                    account = text.split("/", 1)[0]
                    if account not in names:
                        continue
                    found.records_kept += 1
                    if text == marker_key(account):
                        marked.add(account)
                        continue
                    where = parse_location_key(text)
                    if where is None:  # a version 1 record (or its marker): not a location
                        stale.append((text, account, msg.value() is not None))
                        continue
                    row = _entry(*where, account, msg.value())
                    if row is not None:
                        rows.append(row)
                if rows:
                    sink(rows)
                if stale:
                    outdated(stale)
        finally:
            consumer.close()
        found.marked = frozenset(marked)
        return found

    def write_snapshots(
        self,
        accounts: Mapping[str, Iterable[Row]],
        replaced: Mapping[str, Iterable[str]] | None = None,
    ) -> dict[str, int]:
        """Write the accounts' rows, ``replaced`` tombstones, then markers; returns the rows
        written per account. One producer for all of them: a first start of a deployment
        marks every account at once.

        A plain producer is enough: an account's rows and its marker share one partition and
        the marker is produced only once every row is acknowledged, so it is never visible
        before them; a retried record written twice is the same key and value (compacted);
        and a crash before the marker makes the next start rebuild again (the same values,
        overwriting). Not idempotent: an idempotent producer asks the cluster for a producer
        id first, and created a moment ago it waits 500 ms for that in one start out of two
        (librdkafka's retry timer, rdkafka_idempotence.c): on every new account's first start.
        """
        producer = Producer(producer_config(self.kafka, enable_idempotence=False))
        failed: list[KafkaError] = []
        written: dict[str, int] = {}
        try:
            for account, rows in accounts.items():
                target = self.partition_for(account)
                written[account] = 0
                kept: set[bytes] = set()
                for key, _, folder, uidvalidity, uid, fingerprint in rows:
                    if folder is None:
                        continue
                    record = target.location(key, folder, uidvalidity, uid, fingerprint)
                    _produce(producer, record, failed)
                    kept.add(record.key)
                    written[account] += 1
                # The account's record keys these rows do not write again (version 1 records,
                # locations a rebuild did not find): tombstones, before the marker.
                for old in (replaced or {}).get(account, ()):
                    if old.encode() not in kept:
                        gone = SourceRecord(
                            self.topic, old.encode(), None, partition=target.partition
                        )
                        _produce(producer, gone, failed)
            _flush(producer, self.topic, failed)
            for account in accounts:
                marker = SourceRecord(
                    self.topic,
                    marker_key(account).encode(),
                    _json({"account": account, "version": VERSION}),
                    partition=self.partition_for(account).partition,
                )
                _produce(producer, marker, failed)
            _flush(producer, self.topic, failed)
        finally:
            producer.flush(5)
        return written


#: The encoder of the records' values (the marker; a location value of unusual types), made
#: once: ``json.dumps`` with options builds a JSONEncoder per call, a third of the 3.4 µs a
#: location value took that way before :func:`_location_json`.
_ENCODER = json.JSONEncoder(sort_keys=True, separators=(",", ":"))


def _json(value: Mapping[str, object]) -> bytes:
    return _ENCODER.encode(value).encode()


def _location_json(
    folder: str, uidvalidity: int | None, uid: int | None, fingerprint: str | None
) -> bytes:
    """``_json`` of a location record's value, written out directly: one per mail, 0.5 µs
    against 2.7 for the encoder. The keys in sorted order, each string escaped by json's own
    escaper, each int as json writes an int; a value of another type goes to the encoder."""
    if (
        folder.__class__ is str
        and (fingerprint is None or fingerprint.__class__ is str)
        and (uid is None or uid.__class__ is int)
        and (uidvalidity is None or uidvalidity.__class__ is int)
    ):
        return (
            f'{{"fingerprint":{_json_text(fingerprint)},"folder":{_json_text(folder)},'
            f'"uid":{_json_int(uid)},"uidvalidity":{_json_int(uidvalidity)}}}'
        ).encode()
    value = {"folder": folder, "uidvalidity": uidvalidity, "uid": uid, "fingerprint": fingerprint}
    return _json(value)


def _json_text(text: str | None) -> str:
    return "null" if text is None else encode_basestring_ascii(text)


def _json_int(number: int | None) -> str:
    return "null" if number is None else int.__repr__(number)


def _entry(key: str, folder: str, account: str, value: bytes | None) -> Entry | None:
    if value is None:
        return key, account, folder, None, None, None, False
    try:
        where = json.loads(value)
        return (
            key,
            account,
            folder,
            where.get("uidvalidity"),
            where.get("uid"),
            where.get("fingerprint"),
            True,
        )
    except (ValueError, TypeError, AttributeError):
        log.warning("imap index: unreadable changelog record for %s in %s skipped", key, folder)
        return None


def _produce(producer: Producer, record: SourceRecord, failed: list[KafkaError]) -> None:
    partition = -1 if record.partition is None else record.partition

    def delivered(err: KafkaError | None, _msg: object) -> None:
        if err is not None:
            failed.append(err)

    while True:
        try:
            producer.produce(
                record.topic,
                key=record.key,
                value=record.value,
                partition=partition,
                on_delivery=delivered,
            )
            return
        except BufferError:
            producer.poll(0.1)


def _flush(producer: Producer, topic: str, failed: list[KafkaError]) -> None:
    if producer.flush(60) > 0:
        raise RuntimeError(f"writing the key index to {topic} did not complete within 60s")
    if failed:
        raise RuntimeError(f"writing the key index to {topic} failed: {failed[0].str()}")
