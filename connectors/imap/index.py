"""Where each message identity of an account currently lives: the basis of the tombstone rule.

An expunged mail becomes a tombstone only when its key is gone from *every* watched folder of the
account (DESIGN.md); a move is an UPDATED event with the new folder. IMAP has no "moved" signal:
the source folder sees an EXPUNGE, the target an EXISTS, in any order. So each account keeps one
index ``key -> {folder: uid}`` shared by its folder workers, rebuilt at start from the compacted
``mail.events`` topic (the newest event per key says where the mail was last seen) and kept up to
date as mails are published.

Thread-safe: the folder workers of an account run on their own threads.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass

from confluent_kafka import Consumer, KafkaError, TopicPartition

from connectors.core.config import KafkaSettings
from connectors.core.errors import DataError
from connectors.core.kafka import consumer_config
from connectors.core.serde import AvroSerde

log = logging.getLogger(__name__)

#: Reading mail.events at start waits for open transactions to settle (read_committed); a
#: zombie's transaction is aborted by the broker within the transaction timeout (60 s).
LOAD_TIMEOUT_S = 120.0


@dataclass(frozen=True)
class Location:
    folder: str
    uidvalidity: int | None
    uid: int | None


class AccountIndex:
    """``key -> {folder: Location}`` for one account, plus the Message-ID of each key."""

    def __init__(self, account: str) -> None:
        self.account = account
        self._where: dict[str, dict[str, Location]] = {}
        self._by_uid: dict[tuple[str, int], str] = {}
        self._message_ids: dict[str, str] = {}
        #: Keys published and not tombstoned: seeing one again (in any folder) is an UPDATE.
        self._known: set[str] = set()
        self._lock = threading.Lock()

    def register(
        self,
        key: str,
        folder: str,
        uidvalidity: int | None,
        uid: int | None,
        message_id: str | None,
    ) -> bool:
        """Record that ``key`` is in ``folder``; returns True when the account knew the key before
        (published and not tombstoned): a move or copy, not a new mail."""
        with self._lock:
            places = self._where.setdefault(key, {})
            known = key in self._known
            self._known.add(key)
            old = places.get(folder)
            if old is not None and old.uid is not None:
                self._by_uid.pop((folder, old.uid), None)
            places[folder] = Location(folder, uidvalidity, uid)
            if uid is not None:
                self._by_uid[(folder, uid)] = key
            if message_id:
                self._message_ids[key] = message_id
            return known

    def uids_in(self, folder: str, uidvalidity: int) -> dict[int, str]:
        """``{uid: key}`` known in ``folder`` under this UIDVALIDITY."""
        with self._lock:
            return {
                loc.uid: key
                for key, places in self._where.items()
                for loc in places.values()
                if loc.folder == folder and loc.uidvalidity == uidvalidity and loc.uid is not None
            }

    def remove(self, folder: str, uid: int) -> tuple[str, bool] | None:
        """Forget ``(folder, uid)``; returns ``(key, still_elsewhere)`` or None if unknown."""
        with self._lock:
            key = self._by_uid.pop((folder, uid), None)
            if key is None:
                return None
            places = self._where.get(key, {})
            places.pop(folder, None)
            if not places:
                self._where.pop(key, None)
                return key, False
            return key, True

    def forget(self, key: str) -> None:
        with self._lock:
            for loc in self._where.pop(key, {}).values():
                if loc.uid is not None:
                    self._by_uid.pop((loc.folder, loc.uid), None)
            self._message_ids.pop(key, None)
            self._known.discard(key)

    def forget_folder(self, folder: str) -> None:
        """UIDVALIDITY changed: every UID we knew for ``folder`` is meaningless now."""
        with self._lock:
            for key in list(self._where):
                loc = self._where[key].pop(folder, None)
                if loc is not None and loc.uid is not None:
                    self._by_uid.pop((folder, loc.uid), None)
                if not self._where[key]:
                    del self._where[key]

    def message_id(self, key: str) -> str | None:
        with self._lock:
            return self._message_ids.get(key)

    def __len__(self) -> int:
        with self._lock:
            return len(self._where)


def load_indexes(
    kafka: KafkaSettings, serde: AvroSerde, accounts: Iterable[str], timeout: float = LOAD_TIMEOUT_S
) -> dict[str, AccountIndex]:
    """Rebuild every account's index from the compacted events topic (read_committed, to the end)."""
    indexes = {name: AccountIndex(name) for name in accounts}
    topic = kafka.topics.events
    consumer = Consumer(
        consumer_config(kafka, group_id="mailtap-imap-index", enable_partition_eof=True)
    )
    started = time.monotonic()
    records = 0
    try:
        metadata = consumer.list_topics(topic, timeout=10)
        partitions = metadata.topics[topic].partitions if topic in metadata.topics else {}
        if not partitions or metadata.topics[topic].error is not None:
            return indexes
        pending = set(partitions)
        consumer.assign([TopicPartition(topic, p, 0) for p in partitions])
        while pending:
            if time.monotonic() - started > timeout:
                raise TimeoutError(f"reading {topic} did not reach its end within {timeout:.0f}s")
            for msg in consumer.consume(1000, 0.5):
                err = msg.error()
                if err is not None:
                    if err.code() == KafkaError._PARTITION_EOF:
                        pending.discard(msg.partition())
                        continue
                    raise RuntimeError(f"reading {topic}: {err}")
                records += 1
                _apply(indexes, msg.key(), msg.value(), serde)
    finally:
        consumer.close()
    log.info(
        "imap index: %d events read from %s in %.1fs (%s)",
        records,
        topic,
        time.monotonic() - started,
        ", ".join(f"{n}={len(i)} keys" for n, i in indexes.items()),
    )
    return indexes


def _apply(
    indexes: dict[str, AccountIndex], key: bytes | None, value: bytes | None, serde: AvroSerde
) -> None:
    if key is None:
        return
    text = key.decode("utf-8", "replace")
    account = text.split("/", 1)[0]
    index = indexes.get(account)
    if index is None:
        return
    if value is None:
        index.forget(text)
        return
    try:
        event = serde.decode(value)
    except DataError:
        return
    source = event.get("source") or {}
    if source.get("kind") != "IMAP":
        return
    index.forget(text)  # the newest event says where the mail is now
    index.register(
        text,
        source["folder"],
        source.get("uidvalidity"),
        source.get("uid"),
        event.get("message_id"),
    )
