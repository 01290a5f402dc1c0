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

from confluent_kafka import Consumer, KafkaError, TopicPartition

from connectors.core.config import KafkaSettings
from connectors.core.errors import DataError
from connectors.core.kafka import consumer_config
from connectors.core.serde import AvroSerde

log = logging.getLogger(__name__)

#: Reading mail.events at start waits for open transactions to settle (read_committed); a
#: zombie's transaction is aborted by the broker within the transaction timeout (60 s).
LOAD_TIMEOUT_S = 120.0


class AccountIndex:
    """Where the published keys of one account are: ``(folder, uid) -> key`` plus a count of
    locations per key. Kept compact (about 0.4 KB per mail): it is the one structure of the
    source that grows with the mailbox."""

    def __init__(self, account: str) -> None:
        self.account = account
        self._by_uid: dict[tuple[str, int], tuple[str, int | None]] = {}
        self._places: dict[str, int] = {}
        #: Keys published and not tombstoned: seeing one again (in any folder) is an UPDATE.
        self._known: set[str] = set()
        self._lock = threading.Lock()

    def register(self, key: str, folder: str, uidvalidity: int | None, uid: int | None) -> bool:
        """Record that ``key`` is in ``folder``; returns True when the account knew the key before
        (published and not tombstoned): a move or copy, not a new mail.

        ``uid=None`` records a location we cannot address by UID (a mail we moved ourselves).
        """
        with self._lock:
            known = key in self._known
            self._known.add(key)
            if uid is None:
                self._places[key] = self._places.get(key, 0) + 1
                return known
            old = self._by_uid.get((folder, uid))
            if old is not None and old[0] == key:
                self._by_uid[(folder, uid)] = (key, uidvalidity)
                return known
            if old is not None:
                self._drop_place(old[0])
            self._by_uid[(folder, uid)] = (key, uidvalidity)
            self._places[key] = self._places.get(key, 0) + 1
            return known

    def _drop_place(self, key: str) -> int:
        left = self._places.get(key, 0) - 1
        if left > 0:
            self._places[key] = left
        else:
            self._places.pop(key, None)
        return max(left, 0)

    def uids_in(self, folder: str, uidvalidity: int) -> dict[int, str]:
        """``{uid: key}`` known in ``folder`` under this UIDVALIDITY."""
        with self._lock:
            return {
                uid: key
                for (f, uid), (key, validity) in self._by_uid.items()
                if f == folder and validity == uidvalidity
            }

    def remove(self, folder: str, uid: int) -> tuple[str, bool] | None:
        """Forget ``(folder, uid)``; returns ``(key, still_elsewhere)`` or None if unknown."""
        with self._lock:
            found = self._by_uid.pop((folder, uid), None)
            if found is None:
                return None
            return found[0], self._drop_place(found[0]) > 0

    def forget(self, key: str) -> None:
        """The key was tombstoned (it has no location left)."""
        with self._lock:
            self._known.discard(key)
            self._places.pop(key, None)

    def forget_folder(self, folder: str) -> None:
        """UIDVALIDITY changed: every UID we knew for ``folder`` is meaningless now."""
        with self._lock:
            for where in [w for w in self._by_uid if w[0] == folder]:
                self._drop_place(self._by_uid.pop(where)[0])

    @staticmethod
    def message_id(key: str) -> str | None:
        """The normalized Message-ID inside a MESSAGE_ID key (``<account>/mid:<id>``)."""
        _, sep, message_id = key.partition("/mid:")
        return message_id if sep else None

    def __len__(self) -> int:
        with self._lock:
            return len(self._known)


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
    latest: dict[str, tuple[str, str, int | None, int | None] | None] = {}
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
                _collect(latest, indexes, msg.key(), msg.value(), serde)
    finally:
        consumer.close()
    for key, where in latest.items():
        if where is not None:
            account, folder, uidvalidity, uid = where
            indexes[account].register(key, folder, uidvalidity, uid)
    log.info(
        "imap index: %d events read from %s in %.1fs (%s)",
        records,
        topic,
        time.monotonic() - started,
        ", ".join(f"{n}={len(i)} keys" for n, i in indexes.items()),
    )
    return indexes


def _collect(
    latest: dict[str, tuple[str, str, int | None, int | None] | None],
    indexes: dict[str, AccountIndex],
    key: bytes | None,
    value: bytes | None,
    serde: AvroSerde,
) -> None:
    """Keep the newest location per key (the compacted topic's meaning); None = tombstone."""
    if key is None:
        return
    text = key.decode("utf-8", "replace")
    account = text.split("/", 1)[0]
    if account not in indexes:
        return
    if value is None:
        latest[text] = None
        return
    try:
        event = serde.decode(value)
    except DataError:
        return
    source = event.get("source") or {}
    if source.get("kind") != "IMAP":
        return
    latest[text] = (account, source["folder"], source.get("uidvalidity"), source.get("uid"))
